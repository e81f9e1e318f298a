"""The scheduler's loop in C (tilescope.sim._loop) against the Python loop it mirrors
(tilescope.sim._schedule._loop_reference): the same start, end, lane and LoadStationary
times, bit for bit, on the examples and on random Programs that reach every rule (partial
DMA transfers that split the engines, named queues, the shared ports, LoadStationary)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from tilescope.program import TileBuilder
from tilescope.sim import _schedule
from tilescope.spec import preset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(_schedule._native is None, reason="tilescope.sim._loop is not built")

SPECS = [preset("trn1"), preset("trn2"), preset("trn1").replace(name="trn1-free", dma={"queue_policy": "free"})]


def _examples():
    sys.path.insert(0, os.path.join(ROOT, "examples", "matmul"))
    sys.path.insert(0, os.path.join(ROOT, "examples", "layernorm"))
    try:
        import layernorm_kernel as ln
        import matmul_kernels as mk
    finally:
        del sys.path[:2]
    from tilescope.lang import TensorSpec as S

    yield mk.matmul_naive.program_for(*mk.inputs(1024, 1024, 1024, data=False)).program
    yield mk.matmul_optimized.program_for(*mk.inputs(2048, 4096, 2048, data=False)).program
    yield ln.layernorm_bn_stats.program_for(S((1000, 2000), "float32"), S((2000,), "float32"),
                                            S((2000,), "float32")).program


def _random(seed: int):
    """A random mix of partial and named-queue DMAs, ScalarE/VectorE/GpSimd work on SBUF and
    PSUM, and matmuls with changing stationaries."""
    rng = np.random.default_rng(seed)
    b = TileBuilder(f"random{seed}")
    x = b.input("x", (128 * 8, 256), "float32")
    y = b.output("y", (128 * 8, 256), "float32")
    sb = [b.sbuf((128, 256), "float32", site=f"s{k}") for k in range(6)]
    ps = [b.psum((128, 256), "float32", site=f"p{k}") for k in range(2)]
    w = b.sbuf((128, 128), "float32", site="w")
    b.dma_copy(w, x[0:128, 0:128])
    for _ in range(300):
        r = rng.integers(0, 9)
        s = sb[rng.integers(0, len(sb))]
        t = sb[rng.integers(0, len(sb))]
        if r <= 2:  # a DMA of some partitions, from some partition on
            lo = int(rng.integers(0, 128))
            n = int(rng.integers(1, 129 - lo))
            row = int(rng.integers(0, 8)) * 128
            q = None if rng.random() < 0.7 else int(rng.integers(0, 4))
            if rng.random() < 0.5:
                b.dma_copy(s[lo:lo + n], x[row:row + n], queue=q)
            else:
                b.dma_copy(y[row:row + n], s[lo:lo + n], queue=q)
        elif r == 3:
            b.activation(t, ps[rng.integers(0, 2)], "exp")  # ScalarE reading PSUM
        elif r == 4:
            b.tensor_scalar(t, s, "add", 1.0)  # VectorE on SBUF
        elif r == 5:
            b.tensor_tensor(t, s, ps[rng.integers(0, 2)], "add")  # VectorE on SBUF and PSUM
        elif r == 6:
            b.tensor_copy(t, s, engine="pool")  # GpSimd on SBUF
        else:
            st = w if rng.random() < 0.5 else s[:, 0:128]
            b.matmul(ps[rng.integers(0, 2)], st, t, accumulate=bool(rng.random() < 0.5))
    return b.build()


PROGRAMS = list(_examples()) + [_random(seed) for seed in range(4)]


def _both(program, spec):
    cols, _ = _schedule._precompute(program, spec)
    first, count, piece, hbm = _schedule._dma_engine_work(spec, cols)
    indptr, indices = program.dependencies
    work = (indptr, indices, cols["lane"], cols["dur"], cols["ls"], cols["queue"], cols["fixed"], first, count,
            piece, hbm, cols["sbuf"], cols["psum"])
    return (_schedule._loop_native(work, spec.dma.engines, spec.dma.queues),
            _schedule._loop_reference(work, spec.dma.engines, spec.dma.queues))


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
@pytest.mark.parametrize("k", range(len(PROGRAMS)))
def test_native_loop_equals_the_reference(k, spec):
    a, b = _both(PROGRAMS[k], spec)
    for x, y in zip(a[:3], b[:3]):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(a[3], b[3]):
        np.testing.assert_array_equal(x, y)


def test_random_programs_reach_every_rule():
    """(so the comparison above covers them)"""
    spec = SPECS[0]
    lanes, split, named, ls = set(), False, False, 0
    for p in PROGRAMS[3:]:
        cols, _ = _schedule._precompute(p, spec)
        first, count, _, _ = _schedule._dma_engine_work(spec, cols)
        dma = cols["lane"] == _schedule._DMA
        lanes |= set(cols["lane"].tolist())
        split |= bool((count[dma] < spec.dma.engines).any())
        named |= bool((cols["queue"][dma] >= 0).any())
        ls += int((cols["ls"] > 0).sum())
        assert cols["sbuf"].any() and cols["psum"].any()
    assert {-1, 0, 2, 3, 4} <= lanes and split and named and ls > 0


def test_simulate_gives_the_same_result_either_way(monkeypatch):
    p = PROGRAMS[1]
    spec = SPECS[0]
    a = _schedule.schedule(p, spec)
    monkeypatch.setattr(_schedule, "_native", None)
    b = _schedule.schedule(p, spec)
    assert a.summary == b.summary
    np.testing.assert_array_equal(a.timeline.start_ns, b.timeline.start_ns)
    np.testing.assert_array_equal(a.timeline.end_ns, b.timeline.end_ns)
    np.testing.assert_array_equal(a.timeline.lane, b.timeline.lane)


def _placement_from_objects(program, spec, parts):
    """Queue and first partition of each DMA, read off the instruction objects."""
    from tilescope.isa import DmaCopy

    n = len(program)
    queue = np.full(n, -1, dtype=np.int64)
    first = np.zeros(n, dtype=np.int64)
    buffers = program.buffers
    sites: dict = {}
    for i, ins in enumerate(program.instructions):
        if not isinstance(ins, DmaCopy):
            continue
        src_hbm = buffers[ins.src.buffer].memory == "hbm"
        dst_hbm = buffers[ins.dst.buffer].memory == "hbm"
        if parts[i] > 0:
            ap = ins.src if dst_hbm else ins.dst
            stride = ap.dims[0][0] if ap.dims else 0
            first[i] = ap.offset // stride if stride > 0 else 0
        site = sites.setdefault((ins.src.buffer if src_hbm else ins.dst.buffer, src_hbm, dst_hbm), len(sites))
        if spec.dma.queue_policy == "site":
            queue[i] = site % spec.dma.queues
        if ins.queue is not None:
            queue[i] = ins.queue
    return queue, first


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
@pytest.mark.parametrize("k", range(len(PROGRAMS)))
def test_dma_queues_and_partitions_from_columns_equal_those_of_the_objects(k, spec):
    cols, _ = _schedule._precompute(PROGRAMS[k], spec)
    q, f = _placement_from_objects(PROGRAMS[k], spec, cols["parts"])
    np.testing.assert_array_equal(cols["queue"], q)
    np.testing.assert_array_equal(cols["first_part"], f)
