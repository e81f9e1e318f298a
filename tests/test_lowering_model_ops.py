"""Lowerings of ops the model zoo spends time in (beyond convolution, attention and the indexed
ops, which have their own tests): values against CPU torch through the Program's own numerics,
and modeled time against a roofline bound computed here from the spec alone -- never below it,
and near it at large shapes.

The bound of an op that streams its operands: max(bytes moved once at the DMA rate, its
arithmetic at one element per lane per cycle on VectorE, ScalarE and GpSimd together).
"""

from __future__ import annotations

import pytest
import torch

from tilescope.lower import Call, lower, meta_of
from tilescope.spec import preset
from test_lowering import check, rnd

SPEC = preset("trn1")


def bound_ns(nbytes: float, alu_ops: float = 0.0) -> float:
    """The roofline bound from the spec: DMA bytes at the DMA rate (HBM-capped), arithmetic at
    every elementwise engine's full rate (``lanes`` elements per cycle each)."""
    dma = nbytes / min(SPEC.dma.engines * SPEC.dma.bytes_per_ns_per_engine, SPEC.hbm_bytes_per_ns)
    lanes_per_ns = sum(e.lanes * e.clock_ghz for e in (SPEC.vector, SPEC.scalar, SPEC.gpsimd))
    return max(dma, alu_ops / lanes_per_ns)


def modeled_ns(op, args, kwargs, outputs) -> tuple[float, str]:
    call = Call(op, tuple(meta_of(a) if isinstance(a, torch.Tensor) else a for a in args),
                tuple(sorted(kwargs.items())), tuple(meta_of(t) for t in outputs))
    low = lower(call, SPEC)
    return low.modeled_ns, low.rule


# ---- GELU (tanh approximation) backward: GPT-2's MLP ---------------------------------------

def test_gelu_tanh_backward_values():
    g, x = rnd(3, 40, 50), rnd(3, 40, 50) * 3
    expected = torch.ops.aten.gelu_backward(g, x, approximate="tanh")
    check("aten::gelu_backward", (g, x), {"approximate": "tanh"}, {"out": expected},
          {"in_grad_output": g, "in_self": x}, rule="elementwise", tol=2e-5)


def test_gelu_tanh_backward_time_against_the_bound():
    n = 4 * 512 * 3072  # GPT-2's MLP activation, batch 4 x 512 tokens
    g = torch.empty(4, 512, 3072)
    ns, rule = modeled_ns("aten::gelu_backward", (g, g), {"approximate": "tanh"}, (g,))
    # 12 bytes per element (two reads, one write); ~15 arithmetic operations per element
    bound = bound_ns(12 * n, 15 * n)
    assert rule == "elementwise"
    # never cheaper than physics; within 2.5x: its six products are two-operand VectorE
    # instructions (2 cycles per fp32 element each), work only VectorE can do
    assert bound <= ns <= 2.5 * bound, (ns, bound)


# ---- tril / triu: causal masks -----------------------------------------------------------------

@pytest.mark.parametrize("op", ["tril", "triu"])
@pytest.mark.parametrize("shape, diagonal", [((37, 53), 0), ((2, 3, 20, 300), -3), ((300, 17), 5), ((4, 4), -9)])
def test_triangle_values(op, shape, diagonal):
    x = rnd(*shape)
    x[..., 0, 0] = float("inf")  # a masked element becomes 0, whatever it was (not inf * 0)
    expected = getattr(torch, op)(x, diagonal)
    check(f"aten::{op}", (x, diagonal), {}, {"out": expected}, {"in_self": x}, rule="triangle")


def test_triangle_reads_views_as_stored_and_bool_masks():
    x = rnd(64, 48).t()  # a transposed view
    check("aten::tril", (x, 1), {}, {"out": torch.tril(x, 1)}, {"in_self": x}, rule="triangle")
    m = torch.ones(70, 70, dtype=torch.bool)
    check("aten::triu", (m, 1), {}, {"out": torch.triu(m, 1)}, {"in_self": m}, rule="triangle")


def test_triangle_leaves_integer_tensors_to_the_generic_lowering():
    x = torch.arange(16, dtype=torch.int64).reshape(4, 4)
    _, rule = modeled_ns("aten::tril", (x, 0), {}, (x,))
    assert rule == "generic"  # the engines' fp32 datapath would round int64 values


def test_triangle_time_against_the_bound():
    x = torch.empty(8, 2048, 2048)
    ns, rule = modeled_ns("aten::tril", (x, 0), {}, (x,))
    bound = bound_ns(2 * x.numel() * 4)  # one read and one write per element
    assert rule == "triangle" and bound <= ns <= 2.0 * bound, (ns, bound)


# ---- layout copies: heads merged back after attention ((b, h, t, hd) -> (b, t, h, hd)) --------

def copy_bound_ns(nbytes: float) -> float:
    """A copy from HBM to HBM: the DMA engines move each byte once, HBM reads and writes it."""
    dma = nbytes / (SPEC.dma.engines * SPEC.dma.bytes_per_ns_per_engine)
    return max(dma, 2 * nbytes / SPEC.hbm_bytes_per_ns)


@pytest.mark.parametrize("src, shape", [
    (lambda: rnd(2, 12, 40, 16).transpose(1, 2), (2, 40, 12, 16)),            # a transformer's head merge
    (lambda: rnd(3, 2, 3, 17, 8).permute(1, 3, 0, 2, 4), (2, 17, 3, 3, 8)),   # ViT's qkv gradient
    (lambda: rnd(5, 1, 7).expand(5, 4, 7), (5, 4, 7)),                         # a broadcast
])
def test_layout_copy_values(src, shape):
    x = src()
    check("tilescope::copy", (x,), {}, {"dst": x.contiguous()}, {"src": x}, rule="dma")


@pytest.mark.parametrize("shape, perm", [((2, 12, 512, 64), (0, 2, 1, 3)), ((3, 4, 3, 197, 64), (1, 3, 0, 2, 4))])
def test_layout_copy_time_against_the_bound(shape, perm):
    x = torch.empty(shape).permute(perm)
    ns, rule = modeled_ns("tilescope::copy", (x,), {}, (x.contiguous(),))
    bound = copy_bound_ns(x.numel() * 4)
    # 256-byte runs (one head's 64 floats) on both sides: each run is one DMA descriptor
    assert rule == "dma" and bound <= ns <= 2.0 * bound, (ns, bound)


# ---- sums over a few leading rows: a positional embedding's gradient, summed over the batch ------

@pytest.mark.parametrize("shape, dims, keepdim, mean", [
    ((2, 30, 70), (0,), False, False), ((3, 5, 40), (0,), True, True), ((4, 197, 19), (0,), False, False),
    ((7, 2, 33), (1,), False, False),
])
def test_sum_over_few_rows_values(shape, dims, keepdim, mean):
    x = rnd(*shape)
    op = "aten::mean.dim" if mean else "aten::sum.dim_IntList"
    expected = x.mean(dims, keepdim=keepdim) if mean else x.sum(dims, keepdim=keepdim)
    check(op, (x, dims, keepdim), {}, {"out": expected}, {"in_self": x}, rule="reduction", tol=2e-5)


def test_sum_over_few_rows_time_against_the_bound():
    x = torch.empty(2, 512, 768)  # GPT-2's position-embedding gradient at batch 2 x 512 tokens
    y = x.sum(0)
    ns, rule = modeled_ns("aten::sum.dim_IntList", (x, (0,), False), {}, (y,))
    bound = bound_ns((x.numel() + y.numel()) * 4, x.numel())
    # was 1,069 us as TensorE passes over 2-row tiles, one per 512 columns
    assert rule == "reduction" and bound <= ns <= 2.0 * bound, (ns, bound)
