"""The tutorial matmuls' modeled timelines, pinned: tracing speed work (loop replication,
builder columns, dependency arrays) must leave every instruction, its engine and its
modeled start and end exactly as they were."""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np
import pytest

import tilescope

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _kernels():
    sys.path.insert(0, os.path.join(ROOT, "examples", "matmul"))
    try:
        import matmul_kernels

        return matmul_kernels
    finally:
        sys.path.pop(0)


def timeline_digest(result) -> str:
    """sha256 (16 hex) of every timeline row: instruction, lane, kind, start, end, bytes, flops."""
    t = result.timeline
    h = hashlib.sha256()
    for col in (t.index, t.lane, t.kind, t.nbytes, t.prov):
        h.update(np.ascontiguousarray(col, dtype=np.int64).tobytes())
    for col in (t.start_ns, t.end_ns, t.flops):
        h.update(np.ascontiguousarray(col, dtype=np.float64).tobytes())
    h.update(repr((t.lanes, t.kinds)).encode())
    return h.hexdigest()[:16]


PINS = {
    # kernel, (K, M, N): instructions, DMA transfers, modeled total ns, timeline digest
    ("matmul_optimized", (8192, 4096, 8192)): (39176, 1792, 6801196.957985744, "31f2b9e73e100519"),
    ("matmul_naive", (2048, 1024, 2048)): (1600, 1056, 668977.2352941177, "a7f9403bee2c98c2"),
}


@pytest.mark.parametrize("name,size", list(PINS))
def test_matmul_timeline_pinned(name, size):
    mk = _kernels()
    kernel = getattr(mk, name)
    kernel.cache_clear()
    r = tilescope.simulate(kernel, *mk.inputs(*size, data=False), numerics=False)
    kernel.cache_clear()
    got = (r.summary.instructions, r.summary.dma_transfers, r.summary.total_ns, timeline_digest(r))
    assert got == PINS[(name, size)]
