"""The native hot loops of building a Program (tilescope.program._native) against their Python
references: the allocation sweep and the dependency sweep give identical results on real
Programs and on random inputs, and Programs built either way are the same."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tilescope.lang as tl
from tilescope.lang import TensorSpec as S
from tilescope.program import _alloc, _deps
from tilescope.program._fastalloc import native

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(native is None, reason="tilescope.program._native is not built")


def _programs():
    sys.path.insert(0, os.path.join(ROOT, "examples", "matmul"))
    sys.path.insert(0, os.path.join(ROOT, "examples", "layernorm"))
    try:
        import layernorm_kernel as ln
        import matmul_kernels as mk
    finally:
        del sys.path[:2]
    yield mk.matmul_naive.program_for(*mk.inputs(1024, 1024, 2048, data=False)).program
    yield mk.matmul_optimized.program_for(*mk.inputs(2048, 4096, 2048, data=False)).program
    yield ln.layernorm_bn_stats.program_for(S((1000, 2000), "float32"), S((2000,), "float32"),
                                            S((2000,), "float32")).program

    @tl.kernel  # spills: the object path's slots and aliases
    def keep_all(x, out):
        tiles = [tl.load(x[i * 128:(i + 1) * 128, :]) for i in range(x.shape[0] // 128)]
        total = tiles[0]
        for t in tiles[1:]:
            total = total + t
        tl.store(out, total)

    yield keep_all.program_for(S((100 * 128, 512), "float32"), S((128, 512), "float32")).program


PROGRAMS = list(_programs())


@pytest.mark.parametrize("k", range(len(PROGRAMS)))
def test_dependency_sweep_native_equals_reference(k):
    boxes = _deps.access_boxes(PROGRAMS[k])
    a = native.dependencies(*boxes)
    b = _deps.sweep_reference(*boxes)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_dependency_sweep_on_random_boxes():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n, width, nkeys = 300, 3, 6
        key = rng.integers(-1, nkeys, size=(n, width))
        r0 = rng.integers(0, 8, size=(n, width))
        r1 = r0 + rng.integers(1, 4, size=(n, width))
        c0 = rng.integers(0, 64, size=(n, width))
        c1 = c0 + rng.integers(1, 40, size=(n, width))
        rd = rng.random((n, width)) < 0.6
        wr = rng.random((n, width)) < 0.4
        aliases = [[int(a) for a in rng.integers(0, nkeys, size=rng.integers(0, 3))] for _ in range(nkeys)]
        a = native.dependencies(key, r0, r1, c0, c1, rd, wr, aliases)
        b = _deps.sweep_reference(key, r0, r1, c0, c1, rd, wr, aliases)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_allocation_sweep_native_equals_reference_on_random_tiles():
    rng = np.random.default_rng(4)
    for trial in range(60):
        T = 400
        first = np.sort(rng.integers(0, 2000, size=T))
        last = first + rng.integers(0, 200, size=T)
        nbytes = rng.integers(1, 40, size=T) * 64
        site = rng.integers(0, 12, size=T)
        bufs = rng.integers(0, 4, size=12)[site]  # 0: no site ring (the mode places the tile)
        cap = int(rng.integers(20, 200)) * 64
        policy = trial % len(_alloc.MODES)
        a = native.place(first, last, nbytes, site, bufs, cap, 64, policy)
        b = _alloc.place_reference(first, last, nbytes, site, bufs, cap, 64, policy)
        if b[1] is None:
            assert a[1] is None
            np.testing.assert_array_equal(a[0], b[0])
        else:
            assert a[0] is None and a[1][0] == b[1][0] and list(a[1][1]) == list(b[1][1])


def test_programs_built_with_and_without_native_are_the_same(monkeypatch):
    from tilescope.program import _fastalloc

    sys.path.insert(0, os.path.join(ROOT, "examples", "matmul"))
    try:
        import matmul_kernels as mk
    finally:
        del sys.path[0]
    args = mk.inputs(2048, 4096, 2048, data=False)
    out = []
    for nat in (native, None):
        monkeypatch.setattr(_fastalloc, "native", nat)
        mk.matmul_optimized.cache_clear()
        p = mk.matmul_optimized.program_for(*args).program
        out.append((p.hash, p.dependencies[1].tobytes()))
    mk.matmul_optimized.cache_clear()
    assert out[0] == out[1]


def test_slot_grouping_native_equals_reference_on_random_placements(monkeypatch):
    from tilescope.program import _fastalloc

    rng = np.random.default_rng(5)
    for _ in range(30):
        T = 300
        first = np.sort(rng.integers(0, 1500, size=T))
        last = first + rng.integers(0, 150, size=T)
        nbytes = rng.integers(1, 8, size=T) * 64
        addr = rng.integers(0, 16, size=T) * 64
        site = rng.integers(0, 6, size=T)
        parts = rng.integers(1, 129, size=T)
        a = _alloc.slot_arrays(first, last, addr, nbytes, site, parts)
        monkeypatch.setattr(_fastalloc, "native", None)
        b = _alloc.slot_arrays(first, last, addr, nbytes, site, parts)
        monkeypatch.setattr(_fastalloc, "native", native)
        np.testing.assert_array_equal(a[0], b[0])
        for x, y in zip(a[1], b[1]):
            np.testing.assert_array_equal(x, y)
        assert a[2] == b[2]


def test_rows_share_templates_only_when_nothing_but_buffers_and_offsets_differ():
    """A builder keeps one template per instruction shape: 10k tiled DMAs share a few, while
    a different scalar (even -0.0 for 0.0) or a buffer of another shape gets its own -- and
    every instruction reads back as emitted."""
    from tilescope.program import TileBuilder

    b = TileBuilder("shared")
    x = b.input("x", (128 * 64, 512), "float32")
    emitted = []
    for k in range(64):
        t = b.sbuf((128, 512), "float32", site=f"t{k % 4}")
        emitted.append(b.instruction(b.dma_copy(t, x[128 * k:128 * (k + 1)])))
        emitted.append(b.instruction(b.memset(t, -0.0 if k % 2 else 0.0)))
        emitted.append(b.instruction(b.tensor_scalar(t, t, "add", 1 if k % 3 else 1.0)))
    wide = b.sbuf((128, 1024), "float32", site="w")
    emitted.append(b.instruction(b.memset(wide[:, 0:512], 0.0)))
    p = b.build()
    assert len(p.columns.templates) == 1 + 2 + 1 + 1  # dma, memset 0.0 / -0.0, add, the wide memset
    assert list(p.instructions) == emitted
    assert [str(i.value) for i in p.instructions[1:7:3]] == ["0.0", "-0.0"]
