"""What tilescope's capture costs the profiled region itself (not the export).

Once a tilescope ``Profiler`` exists, the device's profiler keeps the runtime's record of every
execution that torch's profiler records (``_runtime.keep_recorded``), so that the export knows each
execution's Program, times and launching thread. That work happens inside the user's ops, once per
device execution, while the profiled code runs. ``profiler_overhead.py`` prints it as the
"region" part of its split, next to the export; this script isolates it: the same profiled naive
RMSNorm loop (virtual clock, CPU + PrivateUse1 activities, the trace discarded, nothing exported)
runs alternately with the capture installed and without it (torch's profiler alone records the
device activities either way), in one process, each run after a full garbage collection.

Prints, per loop length, the median wall time of the profiled region on each side, the median
CPU time of the launching thread (the capture's own work; the region's wall time also waits for
the device's numerics thread), the differences per device execution, and the median difference
of adjacent pairs (less sensitive to the machine's load drifting).

Run: .venv/bin/python benchmarks/capture_region_cost.py [--pairs N]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

import tilescope.device
from tilescope.device import _runtime
from tilescope.profiler import ProfileConfig, Profiler
from tilescope.profiler._capture import capture

sys.path.insert(0, str(Path(__file__).parent))
from profiler_overhead import make_rmsnorm_loop  # noqa: E402

LOOPS = {20: 1.0, 200: 0.25}  # iterations of the loop -> share of --pairs run (the long loop is 10x longer)


def profiled_region(workload, with_capture: bool) -> tuple[float, float, int]:
    """One profiled run of ``workload``: wall and launching-thread CPU seconds, device executions."""
    if not with_capture:
        capture.uninstall()
    gc.collect()
    executed = sum(_runtime.counters()["executions"])
    try:
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            wall, cpu = time.perf_counter(), time.thread_time()
            workload()
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    finally:
        if not with_capture:
            capture.install()
    # nothing is exported: what the device's profiler kept is taken, as an export takes it, and let go
    _runtime.take_device_activities(prof.profiler.kineto_results.trace_start_ns())
    return wall, cpu, sum(_runtime.counters()["executions"]) - executed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=200, help="pairs of runs for the 20-iteration loop (default 200)")
    args = ap.parse_args()
    if args.pairs < 2:
        ap.error(f"--pairs must be at least 2, got {args.pairs}")
    tilescope.device.register()
    tilescope.device.configure(clock="virtual")
    Profiler(ProfileConfig(output_dir="unused"))  # installs the capture, as the documented loop does
    for iterations, share in LOOPS.items():
        workload = make_rmsnorm_loop(iterations)  # the loops profiler_overhead.py measures
        for _ in range(2):  # every Program built before timing
            workload()
        pairs = max(2, round(args.pairs * share))
        runs: dict[bool, list] = {True: [], False: []}
        for k in range(pairs):
            for side in ((True, False) if k % 2 else (False, True)):  # each order half the time
                runs[side].append(profiled_region(workload, side))
        executions = runs[True][0][2]
        print(f"naive RMSNorm x {iterations} ({executions} device executions), profiled region, medians of {pairs} pairs:")
        for i, what in ((0, "wall"), (1, "CPU of the launching thread")):
            without = statistics.median(r[i] for r in runs[False])
            with_ = statistics.median(r[i] for r in runs[True])
            pair = statistics.median(a[i] - b[i] for a, b in zip(runs[True], runs[False]))
            print(f"    {what:28s} torch alone {without * 1e3:8.2f} ms, with the capture {with_ * 1e3:8.2f} ms: "
                  f"{(with_ - without) * 1e6 / executions:+.1f} us per execution "
                  f"({(with_ / without - 1) * 100:+.1f}%; adjacent pairs {pair * 1e6 / executions:+.1f} us)")


if __name__ == "__main__":
    main()
