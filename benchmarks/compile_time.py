"""The tilescope backend's own compile time: FX graph in, callable out.

For naive RMSNorm and a GELU-MLP (forward graphs), prints medians over REPEATS runs in
one process of:
  * cold: empty on-disk Program cache (plan + Program emission + allocation);
  * cached: Programs read back from the on-disk cache (target <= 50 ms);
  * Dynamo + AOT tracing, reported separately (torch's share of torch.compile).

Run: .venv/bin/python benchmarks/compile_time.py
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import torch

from tilescope.compile import STATS
from tilescope.compile._backend import _compiler

REPEATS = 5
TARGET_CACHED_S = 0.050


def rmsnorm(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def gelu_mlp(x, w1, b1, w2):
    return torch.nn.functional.gelu(x @ w1 + b1) @ w2


CASES = {
    "naive RMSNorm (8x1024x2048)": (rmsnorm, (torch.randn(8, 1024, 2048), torch.randn(2048))),
    "GELU-MLP (512x1024 @ 1024x4096 @ 4096x1024)": (
        gelu_mlp, (torch.randn(512, 1024), torch.randn(1024, 4096), torch.randn(4096), torch.randn(4096, 1024))),
}


def measure(fn, args):
    """(dynamo+aot seconds, backend seconds) of one torch.compile, from a fresh Dynamo state."""
    from torch._dynamo.backends.common import aot_autograd
    from tilescope.compile._graph import DECOMPOSITIONS

    backend_s = []

    def timed_compiler(gm, example_inputs):
        t0 = time.perf_counter()
        out = _compiler(gm, example_inputs)
        backend_s.append(time.perf_counter() - t0)
        return out

    torch._dynamo.reset()
    t0 = time.perf_counter()
    compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=timed_compiler, decompositions=DECOMPOSITIONS))
    compiled(*args)
    total = time.perf_counter() - t0
    return total - sum(backend_s), sum(backend_s)


def main() -> None:
    cache = tempfile.mkdtemp()
    os.environ["TILESCOPE_CACHE_DIR"] = cache
    try:
        for name, (fn, args) in CASES.items():
            cold, cached, tracing = [], [], []
            for _ in range(REPEATS):
                shutil.rmtree(os.path.join(cache, "programs"), ignore_errors=True)
                t, b = measure(fn, args)
                cold.append(b)
                tracing.append(t)
                t, b = measure(fn, args)
                cached.append(b)
            c, h = statistics.median(cold), statistics.median(cached)
            print(f"{name}:")
            print(f"  backend, cold cache:   {c * 1e3:8.1f} ms")
            print(f"  backend, cached:       {h * 1e3:8.1f} ms  (target {TARGET_CACHED_S * 1e3:.0f} ms, "
                  f"ratio {h / TARGET_CACHED_S:.2f}x of target)")
            print(f"  Dynamo + AOT tracing:  {statistics.median(tracing) * 1e3:8.1f} ms (torch, not the backend)")
        print(f"Programs built {STATS['programs_built']}, read from disk {STATS['programs_from_disk']}")
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
