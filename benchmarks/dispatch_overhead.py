"""Host time added per small eager op on the simulated device, compared with CPU.

For each op, the same call on small tensors (64 x 64 fp32) is timed one call at a time
(``perf_counter_ns`` around the call, after warm-up, so every signature's first,
synchronous call and Program build are excluded) on CPU and on ``sim``; the figure is
the median sim time minus the median CPU time. Two runs: with numerics (the device
worker computes every op concurrently, sharing the interpreter lock with the host) and
with ``numerics=False`` (dispatch alone). Wall clock, the default.

Target: a median added host time of at most 25 us per op.

    .venv/bin/python benchmarks/dispatch_overhead.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import tilescope.device as dev

TARGET_US = 25.0


def _median_us(fn, calls: int) -> float:
    for _ in range(200):
        fn()
    samples = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return statistics.median(samples) / 1000.0


def _ops(x, y, w):
    return {
        "add (tensor + tensor)": lambda: x + y,
        "mul (tensor * python scalar)": lambda: x * 1.5,
        "relu": lambda: torch.relu(x),
        "add_ (in place)": lambda: y.add_(x, alpha=0.0),
        "sum over a dim": lambda: x.sum(1),
        "matmul 64x64": lambda: x @ w,
        "softmax (fused)": lambda: torch.softmax(x, -1),
        "view (metadata only)": lambda: x.view(-1),
    }


def run(calls: int) -> dict:
    dev.register()
    cpu = [torch.randn(64, 64) for _ in range(3)]
    sim = [t.to("sim") for t in cpu]
    cpu_ops, sim_ops = _ops(*cpu), _ops(*sim)
    rows = {}
    for numerics in (True, False):
        dev.configure(numerics=numerics)
        for name in cpu_ops:
            c = _median_us(cpu_ops[name], calls)
            s = _median_us(sim_ops[name], calls)
            torch.sim.synchronize()
            rows.setdefault(name, {})["cpu"] = c
            rows[name]["numerics" if numerics else "dispatch_only"] = s
    dev.configure(numerics=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=3000, help="timed calls per op and setting (default 3000)")
    args = p.parse_args(argv)
    rows = run(args.calls)
    print(f"{'op':32s} {'CPU us':>8s} {'sim us':>8s} {'added us':>9s} {'sim, no numerics':>17s} {'added':>7s}")
    added, added_dispatch = [], []
    for name, r in rows.items():
        a, b = r["numerics"] - r["cpu"], r["dispatch_only"] - r["cpu"]
        if "metadata" not in name:
            added.append(a)
            added_dispatch.append(b)
        print(f"{name:32s} {r['cpu']:8.1f} {r['numerics']:8.1f} {a:9.1f} {r['dispatch_only']:17.1f} {b:7.1f}")
    med, med_d = statistics.median(added), statistics.median(added_dispatch)
    print(f"\nmedian added host time per op (ops that launch an execution): {med:.1f} us with numerics on the "
          f"worker, {med_d:.1f} us dispatch alone; target <= {TARGET_US:.0f} us "
          f"({'met' if med <= TARGET_US else 'NOT met'}). Host CPU: {torch.get_num_threads()} intra-op threads.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
