"""Elementwise ops and copies over transposed views: the operand is read in its own layout
(contiguous runs into SBUF) and transposed on TensorE into PSUM, instead of one DMA descriptor
per element. Values against CPU torch through the Program's own numerics, for any permutation
and dtype; modeled time against the byte bound computed here from the spec alone."""

from __future__ import annotations

import pytest
import torch

from tilescope.lower import Call, lower, meta_of
from tilescope.lower._layout import coalesce
from tilescope.lower._transposed import transposed_plan
from tilescope.spec import preset
from test_lowering import check, rnd

SPEC = preset("trn1")


def transposes(low) -> int:
    return low.program.summary_counts().get("transpose", 0)


def stored(storage_shape, perm, dtype=torch.float32):
    """A view of a contiguous tensor of ``storage_shape`` permuted by ``perm`` (values random)."""
    x = rnd(*storage_shape)
    if dtype.is_floating_point:
        x = x.to(dtype)
    else:
        x = (x * 50).to(dtype) if dtype != torch.bool else x > 0
    return x.permute(*perm)


# ---- values: any permutation, any dtype ----------------------------------------------------------

PERMS = {
    "last two dims": ((3, 200, 130), (0, 2, 1)),
    "[B,S,H,D] read as [B,H,D,S]": ((2, 150, 3, 20), (0, 2, 3, 1)),
    "NHWC read as NCHW": ((5, 9, 11, 40), (0, 3, 1, 2)),
    "NCHW read as NHWC": ((2, 40, 9, 11), (0, 2, 3, 1)),
    "a full reversal": ((30, 7, 140), (2, 1, 0)),
    # pixels x channels one contiguous block: each partition reads several pixels as one run
    "NHWC as NCHW, runs of 4 pixels": ((2, 16, 32, 40), (0, 3, 1, 2)),
    "last two dims, 160 rows in runs of 2": ((2, 512, 160), (0, 2, 1)),
    # a pixel's 40 channels are the output's rows: each output partition writes 4 pixels as one run
    "NCHW as NHWC, 4 pixels a partition": ((2, 40, 16, 32), (0, 2, 3, 1)),
}
RUNS = {"NHWC as NCHW, runs of 4 pixels": (4, 1), "last two dims, 160 rows in runs of 2": (2, 1),
        "NCHW as NHWC, 4 pixels a partition": (1, 4)}  # (m, mo)


@pytest.mark.parametrize("name", list(PERMS))
def test_binary_op_with_a_permuted_operand_matches_cpu(name):
    storage, perm = PERMS[name]
    xt = stored(storage, perm)
    y = rnd(*xt.shape)
    low = check("aten::add.Tensor", (xt, y), {}, {"out": xt + y}, {"in_self": xt, "in_other": y}, rule="elementwise")
    assert transposes(low) > 0, name
    if name in RUNS:
        shape, st = coalesce(tuple(xt.shape), [tuple(y.stride()), tuple(xt.stride())])
        plan = transposed_plan(shape, st, ["float32"] * 2, SPEC)
        assert (plan.m, plan.mo) == RUNS[name], plan


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32, torch.uint8, torch.bool, torch.int64])
def test_unary_op_over_a_transposed_view_keeps_every_dtype(dtype):
    xt = stored((4, 96, 150), (0, 2, 1), dtype)
    # (torch gives a unary op's result its input's strides: a contiguous one, as out= would ask)
    op, want = ("aten::abs", xt.abs()) if dtype != torch.bool else ("aten::logical_not", ~xt)
    want = want.contiguous()
    low = check(op, (xt,), {}, {"out": want}, {"in_self": xt}, rule="elementwise", tol=0)
    # TensorE transposes up to 4-byte data, in its own dtype (nothing rounds); int64 keeps the strided read
    assert (transposes(low) > 0) == (dtype != torch.int64), dtype


def test_broadcast_and_transposed_operands_together():
    x = stored((3, 12, 10, 64), (0, 3, 1, 2))  # NHWC storage as NCHW
    bias = rnd(64, 1, 1)
    mask = rnd(1, 1, 12, 10) > 0
    check("aten::add.Tensor", (x, bias), {}, {"out": x + bias}, {"in_self": x, "in_other": bias}, rule="elementwise")
    low = check("aten::where.self", (mask, x, bias), {}, {"out": torch.where(mask, x, bias).contiguous()},
                {"in_condition": mask, "in_self": x, "in_other": bias}, rule="elementwise")
    assert transposes(low) > 0


def test_many_transposed_operands_and_long_runs_fit_psum():
    # three transposed operands, each holding a PSUM tile per output tile of a load; bytes in a
    # run are many rows of a 1-byte dtype: the runs shorten so that the live tiles fit the banks
    m, a, b = (stored((1, 512, 512), (0, 2, 1), dt) for dt in (torch.bool, torch.float32, torch.float32))
    low = check("aten::where.self", (m, a, b), {}, {"out": torch.where(m, a, b).contiguous()},
                {"in_condition": m, "in_self": a, "in_other": b}, rule="elementwise", tol=0)
    assert transposes(low) > 0
    x = stored((1, 2048, 130), (0, 2, 1), torch.uint8)
    low = check("tilescope::copy", (x,), {}, {"dst": x.contiguous()}, {"src": x}, rule="dma", tol=0)
    assert transposes(low) > 0


@pytest.mark.parametrize("name", list(PERMS))
def test_contiguous_of_a_permuted_view_matches_cpu(name):
    storage, perm = PERMS[name]
    xt = stored(storage, perm)
    low = check("tilescope::copy", (xt,), {}, {"dst": xt.contiguous()}, {"src": xt}, rule="dma", tol=0)
    assert transposes(low) > 0, name
    check("tilescope::copy", (xt,), {}, {"dst": xt.to(torch.bfloat16)}, {"src": xt}, rule="dma", tol=1e-2)
    xi = stored(storage, perm, torch.int32)
    check("tilescope::copy", (xi,), {}, {"dst": xi.contiguous()}, {"src": xi}, rule="dma", tol=0)


def test_an_op_whose_result_keeps_its_inputs_permuted_layout_runs_as_its_memory_does():
    # torch lays a unary op's result out as its input (a channels-last map, a transposed view):
    # the same permutation on both sides is contiguous memory, not a transpose
    x = stored((2, 9, 11, 40), (0, 3, 1, 2))
    low = check("aten::relu", (x,), {}, {"out": torch.relu(x)}, {"in_self": x}, rule="elementwise")
    assert transposes(low) == 0
    x, o = _t((8, 56, 56, 64), (0, 3, 1, 2), torch.float32), _t((8, 56, 56, 64), (0, 3, 1, 2), torch.float32)
    low = lowered("aten::relu", (x,), o)
    assert bound_ns(x, o) <= low.modeled_ns <= 1.3 * bound_ns(x, o), low.modeled_ns / bound_ns(x, o)
    y = _t((8, 1024, 512), (0, 2, 1), torch.float32)
    low = lowered("tilescope::copy", (y,), _t((8, 1024, 512), (0, 2, 1), torch.float32))
    assert low.modeled_ns <= 1.5 * bound_ns(y, y, copy=True), low.modeled_ns / bound_ns(y, y, copy=True)


def test_no_transposed_operand_no_plan():
    # the innermost dim contiguous in both: runs of a row, no transpose needed
    assert transposed_plan((2, 12, 512, 64), [(393216, 32768, 64, 1), (393216, 64, 768, 1)],
                           ["float32", "float32"], SPEC) is None
    # a short contiguous dim joins the next looped dim on the partitions
    plan = transposed_plan((16, 64, 3136), [(200704, 3136, 1), (200704, 1, 64)], ["float32", "float32"], SPEC)
    assert (plan.r, plan.c, plan.g, plan.fold) == (1, 2, 0, 2)


# ---- time: within a stated multiple of the byte bound --------------------------------------------

def bound_ns(*tensors: torch.Tensor, copy: bool = False) -> float:
    """Every byte read and written (the output's last) once over HBM at its peak, and once over
    the DMA engines at their aggregate peak -- a copy's bytes once, as a DRAM-to-DRAM transfer
    moves them (a transposing copy goes on chip and back, twice: its factor leaves room)."""
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    moved = tensors[-1].numel() * tensors[-1].element_size() if copy else nbytes
    return max(moved / (SPEC.dma.engines * SPEC.dma.bytes_per_ns_per_engine), nbytes / SPEC.hbm_bytes_per_ns)


def lowered(op, args, out):
    call = Call(op, tuple(meta_of(a) if isinstance(a, torch.Tensor) else a for a in args), (), (meta_of(out),))
    return lower(call, SPEC)


def _t(shape, perm, dtype):
    return torch.empty(*shape, dtype=dtype).permute(*perm)


TIMED = {
    # name: (op, args, output, factor over the bound)
    "add, last two dims transposed, fp32": (
        "aten::add.Tensor", lambda dt: (_t((16, 1024, 1024), (0, 2, 1), dt), torch.empty(16, 1024, 1024, dtype=dt)),
        lambda dt: torch.empty(16, 1024, 1024, dtype=dt), 1.3),
    "contiguous() of a transposed matrix": (
        "tilescope::copy", lambda dt: (_t((16, 1024, 1024), (0, 2, 1), dt),),
        lambda dt: torch.empty(16, 1024, 1024, dtype=dt), 1.8),
    "contiguous() of [B,S,H,D] as [B,H,D,S]": (
        "tilescope::copy", lambda dt: (_t((8, 512, 12, 64), (0, 2, 3, 1), dt),),
        lambda dt: torch.empty(8, 12, 64, 512, dtype=dt), 1.9),
    "mul over NCHW storage read as NHWC": (
        "aten::mul.Tensor", lambda dt: (_t((16, 64, 56, 56), (0, 2, 3, 1), dt), torch.empty(16, 56, 56, 64, dtype=dt)),
        lambda dt: torch.empty(16, 56, 56, 64, dtype=dt), 2.0),
    "relu over NHWC storage read as NCHW": (
        "aten::relu", lambda dt: (_t((16, 56, 56, 64), (0, 3, 1, 2), dt),),
        lambda dt: torch.empty(16, 64, 56, 56, dtype=dt), 1.7),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(TIMED))
def test_transposed_operands_run_near_the_byte_bound(name, dtype):
    op, args, out, factor = TIMED[name]
    a, o = args(dtype), out(dtype)
    low = lowered(op, a, o)
    bound = bound_ns(*a, o, copy=op == "tilescope::copy")
    assert transposes(low) > 0
    assert bound <= low.modeled_ns <= factor * bound, (name, dtype, low.modeled_ns / bound)
