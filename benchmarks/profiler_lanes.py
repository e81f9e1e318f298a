"""The ``_lanes`` extension against the Python loops it stands in for, on real profiles.

For one transformer training step and a loop of 200 naive RMSNorms on the simulated device
(virtual clock), profiled once with tilescope's capture listening: the framework lanes (one
event per torch CPU event), the placement of the device executions on the runtime and hardware
lanes, and the device lanes (five events per device execution) are made REPEATS times by each
implementation, alternating; the script checks that both make the same text (or rows) and
prints the median time of each and their ratio.

Run: .venv/bin/python benchmarks/profiler_lanes.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

import tilescope.device
from tilescope.profiler import ProfileConfig, Profiler, _events
from tilescope.profiler._capture import capture
from tilescope.profiler._correlate import Correlation

sys.path.insert(0, str(Path(__file__).parent))
from profiler_overhead import make_rmsnorm_loop, make_transformer_step  # noqa: E402

REPEATS = 25


def profiled(workload):
    """torch's profile of one run of ``workload`` and its executions placed as the export places them."""
    for _ in range(2):
        workload()  # every Program built first
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        workload()
    matched, _ = Correlation(prof, capture, float("inf")).complete(into_tables=True)
    return prof, matched


def timed(fn) -> tuple[dict, dict]:
    """Median seconds of ``fn()`` with the extension and with the Python loops, and their outputs."""
    lanes, times, out = _events._lanes, {"C": [], "Python": []}, {}
    try:
        for _ in range(REPEATS):
            for impl, module in (("C", lanes), ("Python", None)):
                _events._lanes = module
                t = time.perf_counter()
                out[impl] = fn()
                times[impl].append(time.perf_counter() - t)
    finally:
        _events._lanes = lanes
    return {k: statistics.median(v) for k, v in times.items()}, out


def main() -> None:
    if _events._lanes is None:
        raise SystemExit("tilescope.profiler._lanes is not built: run `make setup` (needs a C compiler)")
    tilescope.device.register()
    tilescope.device.configure(clock="virtual")
    Profiler(ProfileConfig())  # the capture listens to the device
    for name, make in (("2-layer transformer training step", make_transformer_step),
                       ("naive RMSNorm x 200 iterations", lambda: make_rmsnorm_loop(200))):
        prof, matched = profiled(make())
        rows = _events.placement(matched).rows
        n_events = len(prof.profiler.function_events)
        cases = {  # each returns what it makes: text (chunks to join with ","), or the placement
            f"framework lanes ({n_events} torch events)": lambda: ",".join(
                _events.framework_events(prof, "host/pid:1")[0]),
            f"placement ({len(rows)} executions)": lambda: _events.placement(matched),
            f"device lanes ({len(rows)} executions)": lambda: ",".join(
                _events.device_events(rows, "host/pid:1", lambda m: m.native_tid, shift=1.5, fw_pid=1)),
        }
        print(f"{name}: medians of {REPEATS}")
        for case, fn in cases.items():
            med, out = timed(fn)
            same = out["C"] == out["Python"]
            print(f"  {case}: Python {med['Python'] * 1e3:.2f} ms, C {med['C'] * 1e3:.2f} ms, "
                  f"{med['Python'] / med['C']:.2f}x faster, same result: {same}")


if __name__ == "__main__":
    main()
