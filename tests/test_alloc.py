"""On-chip allocation like a compiler's: live ranges per loop iteration, rotation as a
preference, spills to HBM (priced and labelled on the timeline) instead of a failure --
and a strict mode that fails as before."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tilescope
import tilescope.lang as tl
from tilescope.errors import CapacityError
from tilescope.program import TileBuilder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_live_ranges_per_iteration_fit_where_whole_loop_rings_did_not():
    """Six 32 KiB sites per iteration (192 KiB if each kept its address for the whole loop),
    but at most three tiles of them are live at once: they fit, no spill."""

    @tilescope.kernel
    def chain(x, out):
        for i in tl.affine_range(x.shape[0] // 128):
            a = tl.load(x[i * 128:(i + 1) * 128, :])
            b = a * 2.0
            c = b + 1.0
            d = tl.exp(c)
            e = d - a
            f = e * e
            tl.store(out[i * 128:(i + 1) * 128, :], f)

    x = np.random.default_rng(0).standard_normal((512, 8192)).astype(np.float32) * 0.1
    out = np.zeros_like(x)
    r = tilescope.simulate(chain, x, out)
    np.testing.assert_allclose(out, (np.exp(x * 2 + 1) - x) ** 2, rtol=1e-5)
    assert "spills" not in r.program.meta
    assert max(s.addr + s.nbytes for s in r.program.slots.values()) <= 192 * 1024


def test_layernorm_at_4096_by_8192_fits_with_live_ranges():
    sys.path.insert(0, os.path.join(ROOT, "examples", "layernorm"))
    try:
        import layernorm_kernel as L
    finally:
        sys.path.pop(0)
    args = (tl.TensorSpec((4096, 8192), "float32"), tl.TensorSpec((8192,), "float32"),
            tl.TensorSpec((8192,), "float32"))
    r = tilescope.simulate(L.layernorm_two_pass, *args, numerics=False)
    assert r.summary.total_ns > 0 and "spills" not in r.program.meta


def _keep_all(spill: bool):
    @tilescope.kernel(spill=spill)
    def keep_all(x, out):
        tiles = []
        for i in tl.affine_range(x.shape[0] // 128):
            tiles.append(tl.load(x[i * 128:(i + 1) * 128, :]))
        total = tiles[0]
        for t in tiles[1:]:
            total = total + t
        tl.store(out, total)

    return keep_all


def test_sbuf_overflow_spills_to_hbm_with_its_dmas_on_the_timeline():
    # 100 live [128, 512] fp32 tiles = 200 KiB per partition > 192 KiB
    x = np.random.default_rng(1).standard_normal((100 * 128, 512)).astype(np.float32)
    out = np.zeros((128, 512), np.float32)
    r = tilescope.simulate(_keep_all(True), x, out)
    np.testing.assert_allclose(out, x.reshape(100, 128, 512).sum(axis=0), rtol=1e-4, atol=1e-4)
    spills = r.program.meta["spills"]
    assert spills and all(s["kib_per_partition"] == 2.0 for s in spills)
    prog = r.program
    labels = [prog.prov_of(i).label or "" for i in range(len(prog))]
    stores = [i for i, lab in enumerate(labels) if lab.startswith("spill:")]
    reloads = [i for i, lab in enumerate(labels) if lab.startswith("reload:")]
    assert len(stores) == len(reloads) == len(spills)
    assert all(prog.instructions[i].KIND == "dma_copy" for i in stores + reloads)
    assert all(prog.buffers[prog.instructions[i].dst.buffer].memory == "hbm" for i in stores)
    assert all(prog.prov_of(i).file and prog.prov_of(i).file.endswith("test_alloc.py") for i in stores)
    tl_ = r.timeline  # the spill traffic is priced: it is on the DMA lanes
    on_timeline = set(tl_.index.tolist())
    assert set(stores + reloads) <= on_timeline
    # the spilled run is slower than one where everything fits (same work, smaller tiles)
    assert r.summary.dma_bytes > (100 * 128 * 512 + 128 * 512) * 4


def test_strict_mode_fails_with_the_capacity_error():
    x = np.zeros((100 * 128, 512), np.float32)
    with pytest.raises(CapacityError, match="SBUF capacity exceeded.*spill=True"):
        tilescope.simulate(_keep_all(False), x, np.zeros((128, 512), np.float32))


def test_psum_never_spills():
    @tilescope.kernel
    def nine(a, b, out):
        ta, tb = tl.load(a), tl.load(b)
        accs = [tl.matmul(ta, tb, transpose_x=True) for _ in range(9)]
        total = tl.copy(accs[0])
        for acc in accs[1:]:
            total = total + acc
        tl.store(out, total)

    with pytest.raises(CapacityError, match="PSUM capacity exceeded"):
        tilescope.simulate(nine, np.zeros((128, 128), np.float32), np.zeros((128, 512), np.float32),
                           np.zeros((128, 512), np.float32))


def test_a_site_rotates_over_its_buffers_when_memory_allows():
    b = TileBuilder("rot", bufs=3)
    x = b.input("x", (8 * 128, 512), "float32")
    y = b.output("y", (8 * 128, 512), "float32")
    for r0, n in b.tiles(8 * 128, 128):
        t = b.sbuf((n, 512), "float32", site="t")
        b.dma_copy(t, x[r0:r0 + n])
        b.dma_copy(y[r0:r0 + n], t)
    prog = b.build()
    addrs = [prog.slots[prog.placement[n]].addr for n in prog.placement]
    assert len(set(addrs)) == 3 and addrs[:3] == addrs[3:6]


def test_spill_slots_never_overlap_while_live():
    x = np.zeros((100 * 128, 512), np.float32)
    r = tilescope.simulate(_keep_all(True), x, np.zeros((128, 512), np.float32))
    r.program.validate()  # slots fit and never overlap while live
