"""What the first eager op on a large tensor costs on the simulated device, against CPU.

A signature's first call runs synchronously: the worker computes it with CPU torch, the
call is lowered to a Program, and the result becomes device memory. For a large tensor that
call is dominated by passes over fresh memory, so this prints, per size, the process CPU
time (all threads: the host and the numerics worker) of ``y = x * 2`` followed by a
synchronize:

- ``cpu``: the same op on CPU tensors (the reference: one pass writing fresh pages);
- ``sim first``: the first call of the signature (lowering included, printed apart);
- ``sim again``: a later call of the same signature (the cached Program).

and the ratios of each sim figure to ``cpu``. CPU time rather than wall time: on a loaded
machine wall time mostly measures the other processes. Each size runs in a fresh process
(a first call is first only once), ``--runs`` times; the mean is printed.

    .venv/bin/python benchmarks/first_call_latency.py [--mib 64 256 1024] [--runs 3]

Last figures (the shared 2-core machine at a load average of ~3-5, --runs 2): before results
were adopted as device memory, the first call cost 2.12-2.16x CPU's op (256 MiB: 0.74 s; 1024
MiB: 2.50 s, lowering 0.47 s of it); after, 1.14-1.16x (0.37 s; 1.30 s, lowering 0.41 s). A
later call of the signature: 0.15-0.19x (its output reuses a cached, already mapped block).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_CHILD = r"""
import json, sys, time
import torch
import tilescope.device as dev
from tilescope.device import _dispatch
dev.register()
torch.set_num_threads(1)
n = int(sys.argv[1]) * (1 << 20) // 4
lowering = []
lower = _dispatch._lower.lower
def timed_lower(*a, **k):
    t = time.process_time()
    try:
        return lower(*a, **k)
    finally:
        lowering.append(time.process_time() - t)
_dispatch._lower.lower = timed_lower
def cpu_time(f):
    t = time.process_time(); f(); return time.process_time() - t
x = torch.randn(n)
ref = cpu_time(lambda: x * 2)
xs = x.to("sim"); torch.sim.synchronize(); del x
first = cpu_time(lambda: (xs * 2, torch.sim.synchronize()))
again = cpu_time(lambda: (xs * 2, torch.sim.synchronize()))
print(json.dumps({"cpu": ref, "first": first, "again": again, "lowering": sum(lowering)}))
"""


def _one(mib: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(mib)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, nargs="+", default=[64, 256, 1024], help="tensor sizes (fp32, MiB)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    print("y = x * 2, fp32; process CPU time in seconds, mean of", args.runs, "runs (each in a fresh process)")
    print(f"{'MiB':>6} {'cpu':>7} {'sim first':>10} {'(lowering)':>11} {'sim again':>10} {'first/cpu':>10} "
          f"{'again/cpu':>10}")
    for mib in args.mib:
        runs = [_one(mib) for _ in range(args.runs)]
        m = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}
        print(f"{mib:>6} {m['cpu']:>7.3f} {m['first']:>10.3f} {m['lowering']:>11.3f} {m['again']:>10.3f} "
              f"{m['first'] / m['cpu']:>9.2f}x {m['again'] / m['cpu']:>9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
