"""Self CPU of a device op stays at dispatch cost while its numerics take far longer.

Profiles ``y = x.exp()`` on a 4096 x 4096 fp32 tensor on the simulated device with
``torch.profiler`` (CPU activity): the op's Self CPU in ``key_averages()`` is what the
host spent dispatching it. The numerics (64 MiB in, 64 MiB out, with CPU torch) run on
the device worker; the script also times them (``torch.sim.synchronize()`` after the
calls) and the same computation on CPU for reference. The first call of the signature
(synchronous, builds the Program) happens before profiling.

    .venv/bin/python benchmarks/numerics_offload.py [--calls 5]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import tilescope.device as dev


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=10)
    args = p.parse_args(argv)
    dev.register()
    x = torch.randn(4096, 4096).to("sim")
    y = x.exp()  # first call of the signature: synchronous, builds and caches the Program
    torch.sim.synchronize()

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(args.calls):
            y = x.exp()
        t_dispatch = time.perf_counter() - t0
    torch.sim.synchronize()
    t_done = time.perf_counter() - t0
    row = next(e for e in prof.key_averages() if e.key == "aten::exp")
    self_cpu_us = row.self_cpu_time_total / row.count
    per_call = sorted(e.self_cpu_time_total for e in prof.events() if e.name == "aten::exp")
    median_us = per_call[len(per_call) // 2]

    xc = x.cpu()
    t1 = time.perf_counter()
    for _ in range(args.calls):
        xc.exp()
    t_cpu = (time.perf_counter() - t1) / args.calls
    torch.testing.assert_close(y.cpu(), xc.exp())

    dev.configure(numerics=False)  # the same dispatch with an idle worker (no CPU or memory contention)
    quiet = []
    for _ in range(args.calls):
        t2 = time.perf_counter_ns()
        x.exp()
        quiet.append((time.perf_counter_ns() - t2) / 1e3)
    dev.configure(numerics=True)
    quiet_us = sorted(quiet)[len(quiet) // 2]
    numerics_ms = t_done / args.calls * 1e3
    print(f"x.exp() on a 4096 x 4096 fp32 sim tensor, {args.calls} calls:")
    print(f"  Self CPU of aten::exp (torch.profiler key_averages): {self_cpu_us:8.1f} us per call on average, "
          f"median {median_us:.1f} us")
    print(f"  host time to dispatch all calls:                      {t_dispatch * 1e3:8.2f} ms")
    print(f"  dispatch of the same op with an idle worker (median):  {quiet_us:8.1f} us (the rest of Self CPU "
          f"is contention with the worker for this machine's cores and memory bandwidth)")
    print(f"  until torch.sim.synchronize() returned:               {t_done * 1e3:8.2f} ms "
          f"({numerics_ms:.1f} ms per call: numerics on the worker)")
    print(f"  the same exp on CPU, for reference:                   {t_cpu * 1e3:8.2f} ms per call")
    print(f"  numerics / Self CPU (median): {numerics_ms * 1e3 / median_us:,.0f}x -- the host's profiled time is "
          f"dispatch only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
