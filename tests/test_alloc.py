"""On-chip allocation like a compiler's: live ranges per loop iteration, addresses chosen as
NKI's allocation modes choose them (ring by default, max_reuse), a site's own rotation when
asked for, spills to HBM (priced and labelled on the timeline) instead of a failure -- and a
strict mode that fails as before."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tilescope
import tilescope.lang as tl
from tilescope.errors import CapacityError
from tilescope.program import TileBuilder
from tilescope.spec import preset

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


# ---- how a tile's address is chosen: NKI's allocation modes --------------------------------

def _stream(allocation: str):
    @tilescope.kernel(allocation=allocation)
    def stream(x, out):
        for i in tl.affine_range(x.shape[0] // 128):
            a = tl.load(x[i * 128:(i + 1) * 128, :])
            tl.store(out[i * 128:(i + 1) * 128, :], a * 2.0)

    return stream


def _addresses_per_site(program) -> dict[str, set]:
    out: dict[str, set] = {}
    for slot in program.slots.values():
        if slot.memory == "sbuf":
            out.setdefault(slot.site, set()).add(slot.addr)
    return out


@pytest.mark.parametrize("cols", [2048, 4096])
def test_ring_reuses_an_address_only_after_the_allocation_wraps_around(cols):
    """Two [128, cols] fp32 tiles per iteration: a site's address comes back after
    SBUF / (bytes per iteration) iterations -- the memory decides the overlap, not a constant."""
    x = np.random.default_rng(2).standard_normal((24 * 128, cols)).astype(np.float32)
    out = np.zeros_like(x)
    r = tilescope.simulate(_stream("ring"), x, out)
    np.testing.assert_array_equal(out, x * 2.0)
    per_iteration = 2 * cols * 4
    sbuf = preset(r.program.spec_name).sbuf_bytes_per_partition
    depths = {len(a) for a in _addresses_per_site(r.program).values()}
    assert depths == {sbuf // per_iteration}  # 12 at 2048 columns, 6 at 4096


def test_ring_keeps_a_streaming_loop_at_its_dma_bound_where_max_reuse_serialises():
    x = tl.TensorSpec((24 * 128, 2048), "float32")
    ring = tilescope.simulate(_stream("ring"), x, x, numerics=False)
    reuse = tilescope.simulate(_stream("max_reuse"), x, x, numerics=False)
    # max_reuse: one address per site, so each load waits for the store of the tile before
    assert {len(a) for a in _addresses_per_site(reuse.program).values()} == {1}
    assert max(s.addr + s.nbytes for s in reuse.program.slots.values()) < \
        max(s.addr + s.nbytes for s in ring.program.slots.values())
    dma = ring.summary.engine_busy_ns["DMA"]
    assert ring.summary.total_ns < 1.05 * dma
    assert reuse.summary.total_ns > 1.25 * ring.summary.total_ns


def test_fused_rmsnorm_streams_at_its_dma_bound():
    """The built-in RMSNorm kernel (three [128, d] tiles an iteration): tiles in flight are
    bounded by SBUF, so the loads and stores keep the DMA engines busy end to end."""
    from tilescope.lower import kernels

    r = tilescope.simulate(kernels.rms_norm_kernel, tl.TensorSpec((2048, 2048), "float32"),
                           tl.TensorSpec((2048,), "float32"), 1e-6, numerics=False)
    assert r.summary.total_ns < 1.05 * r.summary.engine_busy_ns["DMA"]


def test_unknown_allocation_mode_is_refused():
    from tilescope.errors import KernelError

    with pytest.raises(KernelError, match="allocation='fastest'.*ring, max_reuse"):
        tilescope.kernel(lambda x: None, allocation="fastest")
