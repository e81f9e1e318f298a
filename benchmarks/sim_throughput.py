"""Simulator throughput: the scheduler's rate on cold 100k-instruction Programs.

Two Programs: a 100k-instruction tiled load -> exp -> scale -> store loop emitted with the
TileBuilder (every instruction emitted, checked and allocated one by one), and the NKI
tutorial's naive tiled matmul at the tutorial's size (99k instructions, traced by the tile
language). Prints, as means of REPEATS runs in this one process (CPU time of this process,
``time.process_time``: the machine may be shared):

  * build: emission + on-chip allocation (for the builder loop)
  * arrays: the Program's signatures, dependency arrays and hash
  * schedule: the scheduler, cold result cache -> instructions per second and its ratio to
    the 1M/s target; and the Python loop the C one mirrors (``tilescope.sim._loop``; the
    same times), for comparison
  * cached: simulate() again (cache hit)

Run: .venv/bin/python benchmarks/sim_throughput.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from tilescope.program import TileBuilder
from tilescope.sim import _schedule, clear_cache, simulate
from tilescope.spec import preset

TARGET_PER_S = 1_000_000
REPEATS = 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def tutorial_matmul():
    sys.path.insert(0, os.path.join(ROOT, "examples", "matmul"))
    try:
        import matmul_kernels as mk
    finally:
        sys.path.pop(0)
    mk.matmul_naive.cache_clear()
    return mk.matmul_naive.program_for(*mk.inputs(8192, 4096, 8192, data=False)).program


def _cpu(fn):
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def _report(label: str, make) -> None:
    rows = {"build": [], "arrays": [], "schedule": [], "python loop": [], "cached": []}
    result = prog = None
    spec = preset("trn1")
    for _ in range(REPEATS):
        dt, prog = _cpu(make)
        rows["build"].append(dt)
        rows["arrays"].append(_cpu(lambda: (prog.static, prog.dependencies, prog.hash))[0])
        clear_cache()
        dt, result = _cpu(lambda: simulate(prog, spec))
        rows["schedule"].append(dt)
        rows["cached"].append(_cpu(lambda: simulate(prog, spec))[0])
    native, _schedule._native = _schedule._native, None
    try:
        rows["python loop"].append(_cpu(lambda: _schedule.schedule(prog, spec))[0])
    finally:
        _schedule._native = native
    mean = {k: statistics.fmean(v) for k, v in rows.items() if v}
    n = len(prog)
    rate = n / mean["schedule"]
    print(f"{label}: {n:,} instructions; modeled total {result.summary.total_us:,.1f} us (modeled)")
    print(f"  build: {mean['build']:.2f} s CPU ({n / mean['build']:,.0f} instr/s)")
    print(f"  arrays (signatures, dependencies, hash): {mean['arrays']:.3f} s CPU "
          f"({n / mean['arrays']:,.0f} instr/s)")
    loop = "C loop" if native is not None else "Python loop (tilescope.sim._loop not built)"
    print(f"  schedule, cold cache ({loop}): {mean['schedule']:.3f} s CPU -> {rate:,.0f} instructions/s "
          f"(target {TARGET_PER_S:,}/s, ratio {rate / TARGET_PER_S:.2f}x)")
    print(f"  schedule with the Python loop: {mean['python loop']:.3f} s CPU -> "
          f"{n / mean['python loop']:,.0f} instructions/s")
    print(f"  cached lookup: {mean['cached'] * 1e6:.1f} us")


def main() -> None:
    print(f"means of {REPEATS} runs, CPU time of this process\n")
    _report("builder loop (load, exp, scale, store)", lambda: build().build())
    _report("tutorial naive matmul (bf16 [4096, 8192] @ [8192, 8192])", tutorial_matmul)


if __name__ == "__main__":
    main()
