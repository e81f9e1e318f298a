"""Elementwise ops fill the partitions whatever their shape: the iteration space is ordered so
that 128 lanes (and the DMA engines of 128 partitions) work, broadcast operands are loaded once
per partition and widened on chip. Values against CPU torch through the Program's own
numerics; modeled time against the bandwidth bound computed here from the spec alone.

The bound: every operand's bytes moved once at the DMA rate (HBM-capped). A broadcast operand
re-read for each plane (a mask under every head) costs its bytes again, so the stated factors
leave room for that and for the per-tile fixed costs.
"""

from __future__ import annotations

import pytest
import torch

from tilescope.lower import Call, ScalarArg, lower, meta_of
from tilescope.lower._layout import spread
from tilescope.spec import preset
from test_lowering import check, rnd

SPEC = preset("trn1")


def bandwidth_bound_ns(*tensors: torch.Tensor) -> float:
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    return nbytes / min(SPEC.dma.engines * SPEC.dma.bytes_per_ns_per_engine, SPEC.hbm_bytes_per_ns)


def lane_use(program) -> float:
    """Elements the elementwise engines' instructions process over what 128 lanes could in the
    same passes (each instruction's free size x its partitions over free size x 128)."""
    work = full = 0
    for ins in program.instructions:
        if ins.engine in ("dve", "act", "pool"):
            work += ins.dst.partitions * ins.dst.free_size
            full += SPEC.partitions * ins.dst.free_size
    return work / full


def lowered(op, args, out, kwargs=()):
    call = Call(op, tuple(meta_of(a) if isinstance(a, torch.Tensor) else a for a in args), tuple(kwargs),
                (meta_of(out),))
    return lower(call, SPEC)


# ---- values: the reordered layouts compute the op -------------------------------------------

def test_where_and_masked_fill_over_heads_under_one_mask():
    s, m = rnd(2, 3, 48, 48), torch.rand(1, 1, 48, 48, generator=torch.Generator().manual_seed(1)) > 0.5
    fill = torch.tensor(-1e4)
    check("aten::where.self", (m, s, fill), {}, {"out": torch.where(m, s, fill)},
          {"in_condition": m, "in_self": s, "in_other": fill}, rule="elementwise")
    check("aten::masked_fill.Scalar", (s, m, ScalarArg("s0", float)), {}, {"out": s.masked_fill(m, -3.5)},
          {"in_self": s, "in_mask": m}, {"s0": -3.5}, rule="elementwise")


def test_per_channel_and_padding_mask_broadcasts():
    x, bias = rnd(4, 3, 40, 40), rnd(3, 1, 1)
    check("aten::add.Tensor", (x, bias), {}, {"out": x + bias}, {"in_self": x, "in_other": bias}, rule="elementwise")
    s, pad = rnd(2, 4, 32, 32), rnd(2, 1, 1, 32)
    check("aten::add.Tensor", (s, pad), {}, {"out": s + pad}, {"in_self": s, "in_other": pad}, rule="elementwise")
    col = rnd(6, 1, 50)  # a row shared by every row of its plane, planes of its own
    y = rnd(6, 7, 50)
    check("aten::mul.Tensor", (y, col), {}, {"out": y * col}, {"in_self": y, "in_other": col}, rule="elementwise")


def test_a_factor_of_the_pixels_joins_few_channels_on_the_partitions():
    # 64 channels x 2 halves of each channel's pixels: 128 partitions, the bias of a channel on both
    x, bias = rnd(2, 64, 24, 24), rnd(64, 1, 1)
    low = check("aten::add.Tensor", (x, bias), {}, {"out": x + bias}, {"in_self": x, "in_other": bias},
                rule="elementwise")
    assert lane_use(low.program) >= 0.95, lane_use(low.program)
    g = rnd(2, 40, 30, 30).permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # channels-last storage
    s = rnd(40, 1, 1)
    out = torch.empty_strided(g.shape, g.stride())
    out.copy_(g * s)
    check("aten::mul.Tensor", (g, s), {}, {"out": out}, {"in_self": g, "in_other": s}, rule="elementwise")


def test_strided_operands_and_a_strided_output():
    q = rnd(300, 5, 3).transpose(1, 2)  # (300, 3, 5): no two dims coalesce
    check("aten::neg", (q,), {}, {"out": -q}, {"in_self": q}, rule="elementwise")
    x = rnd(40, 6, 64).permute(2, 1, 0)  # (64, 6, 40), the output through the same strides
    r = rnd(64, 1, 1)
    out = torch.empty_strided(x.shape, x.stride())
    out.copy_(x * r)
    check("aten::mul.Tensor", (x, r), {}, {"out": out}, {"in_self": x, "in_other": r}, rule="elementwise")


# ---- time: lanes used, modeled time within a stated factor of the bandwidth bound -----------

S = 512
SCORES = torch.empty(2, 12, S, S)
CASES = {
    # name: (op, args, output, kwargs, factor over the bound)
    "where scores under a causal mask": (
        "aten::where.self", (torch.ones(1, 1, S, S, dtype=torch.bool), SCORES, torch.tensor(-1e9)), SCORES, (), 1.35),
    "masked_fill scores": (
        "aten::masked_fill.Scalar", (SCORES, torch.ones(1, 1, S, S, dtype=torch.bool), ScalarArg("s0", float)),
        SCORES, (), 1.35),
    "scores + padding mask": ("aten::add.Tensor", (SCORES, torch.empty(2, 1, 1, S)), SCORES, (), 1.35),
    "image + per-channel bias": (
        "aten::add.Tensor", (torch.empty(16, 3, 224, 224), torch.empty(3, 1, 1)), torch.empty(16, 3, 224, 224), (), 1.5),
    "64 channels + per-channel bias": (
        "aten::add.Tensor", (torch.empty(8, 64, 56, 56), torch.empty(64, 1, 1)), torch.empty(8, 64, 56, 56), (), 1.35),
    "feature map + per-channel bias": (
        "aten::add.Tensor", (torch.empty(32, 512, 7, 7), torch.empty(512, 1, 1)), torch.empty(32, 512, 7, 7), (), 1.6),
}


@pytest.mark.parametrize("name", list(CASES))
def test_elementwise_fills_the_lanes_near_the_bandwidth_bound(name):
    op, args, out, kwargs, factor = CASES[name]
    low = lowered(op, args, out, kwargs)
    bound = bandwidth_bound_ns(*[a for a in args if isinstance(a, torch.Tensor)], out)
    assert low.rule == "elementwise"
    assert lane_use(low.program) >= 0.95, (name, lane_use(low.program))
    assert bound <= low.modeled_ns <= factor * bound, (name, low.modeled_ns, bound)


def test_the_order_is_priced_not_fixed():
    # rows enough for every partition: the given order stays
    lay = spread((1024, 512), [(512, 1), (512, 1)], ["float32", "float32"], SPEC, max_free=2048)
    assert lay.shape == (1024, 512) and lay.strides == [(512, 1), (512, 1)] and lay.part_dims == 1
    # 6 planes under a shared [4096] row: each plane's elements over the partitions
    lay = spread((6, 4096), [(4096, 1), (0, 1)], ["float32", "float32"], SPEC, max_free=2048)
    assert lay.shape == (6, 4096, 1) and lay.strides == [(4096, 1, 0), (0, 1, 0)]
    # 64 channels under a per-channel value: 2 partitions a channel, each half of its pixels
    lay = spread((8, 64, 3136), [(200704, 3136, 1), (0, 1, 0)], ["float32", "float32"], SPEC, max_free=2048)
    assert lay.part_dims == 2 and lay.shape[-3:] == (64, 2, 1568), lay
    assert lay.strides[1][-3:] == (1, 0, 0), lay  # the channel's value on both of its partitions
