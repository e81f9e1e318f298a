"""End-to-end tracing speed of tile kernels: trace + build + schedule, one core.

For the NKI tutorial's matmuls at the tutorial's size (bf16 lhsT [8192, 4096], rhs [8192,
8192]): the fully optimised kernel (the target) and the naive tiled one (99k instructions).
Each run starts cold (the kernel's trace cache and the simulator's result cache cleared)
and calls ``tilescope.simulate(kernel, ..., numerics=False)``: tracing (loops traced from
samples and replicated), building the Program (allocation, checks), its arrays
(signatures, dependencies, hash) and the scheduler. Then one more run split into those
stages.

Prints per kernel: instructions, the mean over REPEATS runs of CPU time (this process's
``time.process_time``: the machine may be shared) and of wall time, instructions per CPU
second and its ratio to the 100k/s target, and the stages' CPU times.

``--reference`` also traces once with ``TILESCOPE_TRACE_REPLICATE=0`` (every iteration run
as Python; minutes) and prints the speed-up.

Run: .venv/bin/python benchmarks/trace_speed.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples", "matmul"))

import matmul_kernels as mk  # noqa: E402

import tilescope  # noqa: E402
from tilescope.sim import clear_cache, simulate  # noqa: E402

TARGET_PER_S = 100_000
REPEATS = 3
SIZE = (8192, 4096, 8192)  # K, M, N: the tutorial's
KERNELS = ("matmul_optimized", "matmul_naive")


def _cold(kernel, args):
    kernel.cache_clear()
    clear_cache()
    c0, w0 = time.process_time(), time.perf_counter()
    r = tilescope.simulate(kernel, *args, numerics=False)
    return time.process_time() - c0, time.perf_counter() - w0, r


def _stages(kernel, args) -> dict[str, float]:
    kernel.cache_clear()
    clear_cache()
    out = {}
    t = time.process_time()
    program = kernel.program_for(*args).program
    out["trace + build"] = time.process_time() - t
    t = time.process_time()
    program.static, program.dependencies, program.hash
    out["arrays (signatures, dependencies, hash)"] = time.process_time() - t
    t = time.process_time()
    simulate(program)
    out["schedule"] = time.process_time() - t
    kernel.cache_clear()
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = mk.inputs(*SIZE, data=False)
    K, M, N = SIZE
    print(f"bf16 matmul [{M}, {K}] @ [{K}, {N}], trn1; mean of {REPEATS} cold runs, one process\n")
    for name in KERNELS:
        kernel = getattr(mk, name)
        _cold(kernel, args)  # (imports and first-use caches)
        runs = [_cold(kernel, args) for _ in range(REPEATS)]
        cpu = statistics.fmean(r[0] for r in runs)
        wall = statistics.fmean(r[1] for r in runs)
        result = runs[-1][2]
        n = result.summary.instructions
        loops = result.program.meta.get("traced_loops", [])
        written = sum(lp["replicated"] for lp in loops)
        total = sum(lp["iterations"] for lp in loops)
        rate = n / cpu
        print(f"{name}: {n:,} instructions, modeled {result.summary.total_us:,.1f} us (modeled)")
        print(f"  end to end: {cpu:.3f} s CPU ({wall:.3f} s wall) -> {rate:,.0f} instructions/s; "
              f"target {TARGET_PER_S:,}/s, ratio {rate / TARGET_PER_S:.2f}x")
        print(f"  loop iterations written from samples: {written:,} of {total:,}")
        for stage, s in _stages(kernel, args).items():
            print(f"    {stage}: {s:.3f} s CPU")
        if "--reference" in argv:
            os.environ["TILESCOPE_TRACE_REPLICATE"] = "0"
            try:
                ref = _cold(kernel, args)
            finally:
                del os.environ["TILESCOPE_TRACE_REPLICATE"]
            same = (ref[2].summary.instructions, ref[2].summary.total_ns) == (n, result.summary.total_ns)
            print(f"  every iteration traced (TILESCOPE_TRACE_REPLICATE=0): {ref[0]:.1f} s CPU -> "
                  f"{n / ref[0]:,.0f} instructions/s; replication {ref[0] / cpu:.0f}x faster, "
                  f"same instructions and modeled time: {same}")
        kernel.cache_clear()
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
