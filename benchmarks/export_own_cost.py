"""The export's own work: what ``Profiler(cfg).export_trace`` spends besides torch's.

``profiler_overhead.py`` compares whole profiled runs, whose wall time on a shared machine swings
by more than the export costs; this script isolates the export. Each profile of a naive RMSNorm
loop (virtual clock) is exported by tilescope, and the export's time is split with timers around
torch's own steps inside it:

  * torch's parse (``torch.autograd.profiler.profile._ensure_function_events``: the work
    ``key_averages()`` would do anyway),
  * torch's Chrome trace export (``torch.profiler.profile.export_chrome_trace``: what torch's
    own ``on_trace_ready`` handler does anyway),
  * Python's garbage collections that ran during the export (a full collection before each
    profiled run, as in ``profiler_overhead.py``, keeps them rare: whoever allocates next pays
    for them),
  * the rest: tilescope's own work -- the executions' launching ops, executables and instruction
    traces, the system trace, the doctor, the manifest, waiting for the writer thread.

Prints, per loop length, the medians over the exports of each part's wall time and of the
exporting thread's CPU time less torch's parts, with the own work per device execution.

Run: .venv/bin/python benchmarks/export_own_cost.py [--exports N]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time

import torch
import torch.autograd.profiler as autograd_profiler
from torch.profiler import ProfilerActivity

import tilescope.device
from tilescope.device import _runtime
from tilescope.profiler import ProfileConfig, Profiler

LOOPS = (20, 200)  # iterations of the loop: 120 and 1200 device executions


class StepTimer:
    """Wall time spent in the wrapped methods, and in garbage collections, since the last ``reset``."""

    def __init__(self):
        self.spent: dict[str, float] = {}
        self._collecting_since = 0.0
        gc.callbacks.append(self._collection)

    def _collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._collecting_since = time.perf_counter()
        else:
            self.spent["gc"] = self.spent.get("gc", 0.0) + time.perf_counter() - self._collecting_since

    def wrap(self, owner, name: str, label: str) -> None:
        method = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.spent[label] = self.spent.get(label, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)

    def reset(self) -> None:
        self.spent.clear()


def rmsnorm_loop(iterations: int):
    x = torch.randn(512, 1024, device="sim")
    w = torch.randn(1024, device="sim")

    def run():
        for _ in range(iterations):
            x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
            torch.sim.synchronize()

    return run


def measure(iterations: int, exports: int, out: str, timer: StepTimer) -> tuple[dict[str, float], int]:
    """The medians of each part of ``exports`` exports, and how many device executions each profiled."""
    workload = rmsnorm_loop(iterations)
    for _ in range(2):  # every Program built (and its instruction trace prepared) before timing
        workload()
    exporter = Profiler(ProfileConfig(output_dir=out))
    rows = []

    def export(prof):  # on_trace_ready, as the documented loop passes exporter.export_trace
        timer.reset()
        wall, cpu = time.perf_counter(), time.thread_time()
        exporter.export_trace(prof)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        parse, trace, collect = (timer.spent.get(k, 0.0) for k in ("parse", "trace", "gc"))
        rows.append({"export": wall, "torch parse": parse, "torch trace export": trace, "garbage collection": collect,
                     "own (wall)": wall - parse - trace - collect, "own (CPU)": cpu - parse - trace - collect})

    for _ in range(exports):
        gc.collect()
        executed = sum(_runtime.counters()["executions"])
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                    experimental_config=exporter.config, on_trace_ready=export):
            workload()
        executed = sum(_runtime.counters()["executions"]) - executed
    return {part: statistics.median(r[part] for r in rows) for part in rows[0]}, executed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exports", type=int, default=40, help="profiles exported per loop length (default 40)")
    args = ap.parse_args()
    if args.exports < 1:
        ap.error(f"--exports must be at least 1, got {args.exports}")
    tilescope.device.register()
    tilescope.device.configure(clock="virtual")
    timer = StepTimer()
    timer.wrap(autograd_profiler.profile, "_ensure_function_events", "parse")
    timer.wrap(torch.profiler.profile, "export_chrome_trace", "trace")
    with tempfile.TemporaryDirectory(prefix="tilescope-export-cost-") as out:
        for iterations in LOOPS:
            med, executions = measure(iterations, args.exports, out, timer)
            print(f"naive RMSNorm x {iterations} ({executions} device executions), medians of {args.exports} exports:")
            for part, seconds in med.items():
                print(f"    {part:20s} {seconds * 1e3:8.2f} ms")
            print(f"    own work per device execution: {med['own (CPU)'] * 1e6 / executions:.1f} us of CPU "
                  f"(the export's fixed part included)")


if __name__ == "__main__":
    main()
