"""Wall-time overhead of tilescope's profiler on top of torch.profiler's own.

Both sides run the same naive-RMSNorm loop on the simulated device (virtual clock)
under torch.profiler with CPU + PrivateUse1 activities and end with an export:
  * torch:     torch.profiler alone, exporting its Chrome trace;
  * tilescope: the same plus ProfileConfig and Profiler(cfg).export_trace (device-time
               correlation, system trace, executables and instruction traces, manifest).
Prints the median wall time of each (REPEATS alternating runs in one process) and the
overhead ratio (target <= 10%).

Run: .venv/bin/python benchmarks/profiler_overhead.py
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity

import tilescope.device
from tilescope.profiler import ProfileConfig, Profiler

ITERS = 20
REPEATS = 5


def naive_rmsnorm(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def run(x, w, with_tilescope: bool, out: str) -> float:
    os.makedirs(out, exist_ok=True)
    t0 = time.perf_counter()
    if with_tilescope:
        cfg = ProfileConfig(output_dir=out)
        kwargs = dict(experimental_config=cfg, on_trace_ready=Profiler(cfg).export_trace)
    else:
        kwargs = dict(on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/trace.json"))
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], **kwargs):
        for _ in range(ITERS):
            naive_rmsnorm(x, w)
            torch.sim.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    tilescope.device.register()
    tilescope.device.configure(clock="virtual")
    x = torch.randn(512, 1024, device="sim")
    w = torch.randn(1024, device="sim")
    for _ in range(3):  # build every Program first: we measure profiling, not lowering
        naive_rmsnorm(x, w)
    torch.sim.synchronize()
    times = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(REPEATS):
            for flag in (False, True):
                times[flag].append(run(x, w, flag, f"{tmp}/{k}{flag}"))
    base = statistics.median(times[False])
    ours = statistics.median(times[True])
    print(f"loop: {ITERS} iterations of naive RMSNorm [512, 1024] fp32 on sim (virtual clock), 6 executions each")
    print(f"torch.profiler alone + export: median {base * 1e3:.1f} ms")
    print(f"with tilescope Profiler + export: median {ours * 1e3:.1f} ms")
    print(f"overhead: {(ours / base - 1) * 100:+.1f}% (target <= 10%)")


if __name__ == "__main__":
    main()
