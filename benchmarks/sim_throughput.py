"""Simulator throughput on a cold 100k-instruction Program, and the cached lookup time.

Prints (medians of REPEATS runs in this one process):
  * build: emission + on-chip allocation by the tile builder
  * finalize: the Program's precomputed arrays (signatures, dependency CSR, hash)
  * schedule: simulate() with a cold result cache, on a finalized Program
    -> instructions per second, and its ratio to the 200k/s target
  * cached: simulate() again (cache hit)

Run: .venv/bin/python benchmarks/sim_throughput.py
"""

from __future__ import annotations

import statistics
import time

from tilescope.program import TileBuilder
from tilescope.sim import clear_cache, simulate

TARGET_PER_S = 200_000
REPEATS = 3


def build(n_instructions: int = 100_000):
    """A tiled load -> exp -> scale -> store loop, 4 instructions per tile."""
    tiles = n_instructions // 4
    b = TileBuilder("throughput")
    x = b.input("x", (tiles * 128, 512), "float32")
    y = b.output("y", (tiles * 128, 512), "float32")
    for r0, n in b.tiles(tiles * 128, 128):
        t = b.sbuf((n, 512), "float32", site="t")
        u = b.sbuf((n, 512), "float32", site="u")
        b.dma_copy(t, x[r0:r0 + n])
        b.activation(u, t, "exp")
        b.tensor_scalar(t, u, "multiply", 2.0)
        b.dma_copy(y[r0:r0 + n], t)
    return b


def main() -> None:
    rows = {"build": [], "finalize": [], "schedule": [], "cached": []}
    n = 0
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        b = build()
        prog = b.build()
        t1 = time.perf_counter()
        prog.static, prog.dependencies, prog.hash
        t2 = time.perf_counter()
        clear_cache()
        result = simulate(prog)
        t3 = time.perf_counter()
        simulate(prog)
        t4 = time.perf_counter()
        n = len(prog)
        rows["build"].append(t1 - t0)
        rows["finalize"].append(t2 - t1)
        rows["schedule"].append(t3 - t2)
        rows["cached"].append(t4 - t3)
    med = {k: statistics.median(v) for k, v in rows.items()}
    rate = n / med["schedule"]
    print(f"program: {n:,} instructions; modeled total {result.summary.total_us:,.1f} us (modeled)")
    print(f"build (emission + allocation): {med['build']:.2f} s  ({n / med['build']:,.0f} instr/s)")
    print(f"finalize (signatures, dependency arrays, hash): {med['finalize']:.2f} s  ({n / med['finalize']:,.0f} instr/s)")
    print(f"schedule, cold cache: {med['schedule']:.3f} s -> {rate:,.0f} instructions/s "
          f"(target {TARGET_PER_S:,}/s, ratio {rate / TARGET_PER_S:.2f}x)")
    cold_all = med["finalize"] + med["schedule"]
    print(f"finalize + schedule together: {n / cold_all:,.0f} instructions/s")
    print(f"cached lookup: {med['cached'] * 1e6:.1f} us")


if __name__ == "__main__":
    main()
