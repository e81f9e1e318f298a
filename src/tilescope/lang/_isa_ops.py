"""Semantics of the engine instructions NKI's ISA adds to the tile language's basics.

Each function checks its operands, picks the destination (a new tile, or ``out`` for
NKI's ``dst=`` forms) and emits exactly the instruction(s) its NKI reference page
describes:

=======================  ==========  =============================================================
call                     engine      instruction(s)
=======================  ==========  =============================================================
load_transpose2d         DMA         one ``dma_copy`` whose source walks HBM column by column
tensor_tensor_scan       VectorE     ``tensor_tensor_scan``: a running op1(op0(a_i, prev), b_i)
tensor_scalar_reduce     VectorE     ``tensor_scalar_reduce``: op0(data, s) and its free-dim reduction
affine_select            GpSimd      ``affine_select``: on_true where cmp(affine(p, i), 0)
reciprocal               VectorE     ``reciprocal`` (8N cycles)
scalar_tensor_tensor     VectorE     ``scalar_tensor_tensor``: op1(op0(data, s), operand1) (a tensor_tensor's time)
max8                     VectorE     ``max8``: the 8 largest values of each partition, descending
nc_find_index8           VectorE     ``find_index8``: the first position of each of 8 values
nc_match_replace8        VectorE     ``match_replace8``: those positions overwritten with ``imm``
activation + reduce_cmd  ScalarE     ``activation`` / ``activation_reduce`` into the engine's
                                     accumulation registers, ``tensor_copy`` to read them out
shared_constant          (none)      a constant HBM input of the Program, fed on every run
=======================  ==========  =============================================================

ScalarE's accumulation registers (one fp32 value per partition, kept between
instructions) are modeled as a [128, 1] SBUF tile the kernel owns: reading them out is
the extra instruction the NKI documentation mentions.
"""

from __future__ import annotations

import hashlib
from math import prod

import numpy as np

from ..dtypes import canonical, to_numpy
from ..errors import KernelError
from ..isa import (
    AP, AffineSelect, DmaCopy, FindIndex8, Iota, MatchReplace8, Max8, Memset, Reciprocal, ScalarTensorTensor,
    TensorCopy, TensorScalarReduce, TensorTensorScan,
)
from . import _semantic as S
from ._context import current
from ._index_expr import Check, Predicate
from ._values import Tensor, Tile

__all__ = [
    "load_transpose2d", "tensor_tensor_scan", "tensor_scalar_reduce", "affine_select",
    "affine_select_pattern", "reciprocal", "scalar_tensor_tensor", "max8", "find_index8", "match_replace8", "activation_cmd", "shared_constant", "iota_pattern", "REDUCE_CMDS",
]

REDUCE_CMDS = ("idle", "reset", "reduce", "reset_reduce")


def _transposed(v: Tensor) -> Tensor:
    """The 2-D view ``v`` with its two axes swapped (index bounds and variables follow)."""
    swap = {0: 1, 1: 0}
    checks = tuple(Check(c.dim, c.size, c.const, tuple(sorted((swap[a], k) for a, k in c.coefs)))
                   for c in v.checks)
    axis_vars = tuple(sorted((var, swap[a]) for var, a in v.axis_vars))
    return Tensor(v.buffer, v.offset, (v.dims[1], v.dims[0]), checks, axis_vars)


def load_transpose2d(src, *, mask=None, dtype=None, label: str = "load_transpose2d", out: Tile | None = None):
    """HBM ``[F, P]`` -> a new SBUF tile ``[P, F]`` (or ``out``, cast by the DMA) in one DMA
    (element by element: each element is its own contiguous chunk, and the DMA cost prices that)."""
    ctx = current(label)
    s = S._hbm_operand(src, "src", label)
    if len(s.shape) != 2:
        raise KernelError(f"{label} takes a 2-D HBM view [F, P]; got shape {s.shape}")
    t = _transposed(s)
    if out is not None:
        dst = S._out(ctx, out, t.shape, out.dtype if isinstance(out, Tile) else s.dtype, label, label)
        aps = S._aps(S._box(mask, (dst, t)), (dst, t), hint="mask the part outside the tensor")
        if aps is not None:
            ctx.emit(DmaCopy(aps[0], aps[1]))
        return dst
    dst = S.new_tile(ctx, t.shape, s.dtype, label=label)
    views = (dst, t)
    aps = S._aps(S._box(mask, views), views, hint="mask the part outside the tensor")
    if aps is not None:
        ctx.emit(DmaCopy(aps[0], aps[1]))
    dtype = S._dtype(dtype)
    if dtype is not None and dtype != s.dtype:
        return S.copy(dst, dtype=dtype, label=label)
    return dst


def _initial(v, partitions: int, label: str):
    if S.is_scalar(v):
        return float(v)
    t = S.tile_operand(v, "initial", label)
    return S._scalar_ap(t, {}, "initial", label, partitions)


def tensor_tensor_scan(data0, data1, initial, op0: str, op1: str, *, reverse0=False, reverse1=False,
                       dtype=None, mask=None, label: str = "tensor_tensor_scan", out: Tile | None = None):
    """One VectorE scan along each partition (free dims flattened, see the ISA row)."""
    ctx = current(label)
    a, b = S.tile_operand(data0, "data0", label), S.tile_operand(data1, "data1", label)
    if a.shape[0] != b.shape[0] or a.size != b.size:
        raise KernelError(f"{label}: data0 {a.shape} and data1 {b.shape} need the same partitions and elements")
    if a.memory == "psum" and b.memory == "psum":
        raise KernelError(f"{label}: data0 and data1 cannot both be in PSUM; copy one to SBUF (tl.copy)")
    rdt = S._dtype(dtype) or S.promote(a.dtype, b.dtype)
    dst = S._out(ctx, out, a.shape, rdt, label, label)
    box = S._box(mask, (dst, a))
    aps = S._aps(box, (dst, a, b))
    if aps is not None:
        ctx.emit(TensorTensorScan(aps[0], aps[1], aps[2], _initial(initial, a.shape[0], label), op0, op1,
                                  bool(reverse0), bool(reverse1)))
    return dst


def tensor_scalar_reduce(data, op0: str, operand0, reduce_op: str, reduce_res, *, reverse0=False, dtype=None,
                         mask=None, label: str = "tensor_scalar_reduce", out: Tile | None = None):
    """``op0(data, operand0)`` and its reduction over the free dims into ``reduce_res`` [P, 1]."""
    ctx = current(label)
    t = S.tile_operand(data, "data", label)
    r = S.tile_operand(reduce_res, "reduce_res", label)
    dst = S._out(ctx, out, t.shape, S._dtype(dtype) or t.dtype, label, label)
    box = S._box(mask, (dst, t))
    aps = S._aps(box, (dst, t))
    if aps is not None:
        P = t.shape[0]
        ctx.emit(TensorScalarReduce(aps[0], aps[1], op0, S._scalar_operand(operand0, box, "operand0", label, P),
                                    reduce_op, S._scalar_ap(r, box, "reduce_res", label, P), bool(reverse0)))
    return dst


# cmp symbols of the instruction, by ALU comparison name (NKI's cmp_op) and mask operator
_CMP_OF_ALU = {"equal": "==", "not_equal": "!=", "greater": ">", "greater_equal": ">=", "less": "<",
               "less_equal": "<="}


def affine_select(pred, on_true, on_false, *, dtype=None, mask=None, label: str = "affine_select",
                  out: Tile | None = None):
    """``on_true`` where the affine predicate ``pred`` holds, else ``on_false`` (GpSimd).

    ``pred`` is one comparison of index expressions, e.g. ``i_p >= i_f`` for a causal
    mask; the engine evaluates it per element, so it may mix the partition and free axes.
    """
    label_ = label
    if not isinstance(pred, Predicate):
        raise KernelError(f"{label_}: pred must be a comparison of index expressions (e.g. i_p >= i_f from "
                          f"tl.mgrid), got {type(pred).__name__}")
    if len(pred.conditions) != 1:
        raise KernelError(f"{label_}: pred must be one comparison, not {len(pred.conditions)} combined with &; "
                          f"for compound conditions use tl.where on an iota, or two affine_selects")
    expr, op = pred.conditions[0]
    t = S.tile_operand(on_true, "on_true_tile", label_)
    var_axes = dict(t.axis_vars)
    steps = [0] * len(t.shape)
    for var, axis, coef in expr.terms:
        a = var_axes.get(var, axis)
        if a >= len(steps):
            raise KernelError(f"{label_}: pred indexes axis {a}, but on_true_tile has shape {t.shape}")
        steps[a] += coef
    pattern = tuple((steps[k], t.shape[k]) for k in range(1, len(t.shape)))
    return _affine_select(t, on_false, expr.const, steps[0], pattern, op, dtype=dtype, mask=mask, label=label_,
                          out=out)


def affine_select_pattern(on_true, on_false, pattern, channel_multiplier, offset, cmp: str, *,
                          label: str = "affine_select", out: Tile | None = None):
    """NKI's current form: the predicate ``cmp(offset + channel_multiplier * p + sum(step * i), 0)``
    over ``pattern`` ``[[step, num], ...]`` (outermost first) of each partition's elements."""
    t = S.tile_operand(on_true, "on_true_tile", label)
    pattern = _pattern(pattern, label)
    if prod(n for _, n in pattern) != prod(t.shape[1:]):
        raise KernelError(f"{label}: pattern {[list(p) for p in pattern]} covers {prod(n for _, n in pattern)} "
                          f"elements per partition; on_true_tile has {prod(t.shape[1:])}")
    return _affine_select(t, on_false, int(offset), int(channel_multiplier), pattern, cmp, label=label, out=out)


def _affine_select(t: Tile, on_false, base: int, pstep: int, pattern, cmp: str, *, dtype=None, mask=None,
                   label: str, out: Tile | None):
    ctx = current(label)
    if not S.is_scalar(on_false):
        raise KernelError(f"{label}: on_false_value must be a number (a float32 scalar), got "
                          f"{type(on_false).__name__}")
    dst = S._out(ctx, out, t.shape, S._dtype(dtype) or t.dtype, label, label)
    box = S._box(mask, (dst, t))
    aps = S._aps(box, (dst, t))
    if aps is None:
        return dst
    if box:  # a masked box starts the pattern further in
        base += pstep * box.get(0, (0, 0))[0]
        lo = [box.get(k, (0, 0))[0] for k in range(1, len(t.shape))]
        if len(pattern) == len(lo):
            base += sum(step * l0 for (step, _), l0 in zip(pattern, lo))
            pattern = tuple((step, c) for (step, _), (_, c) in zip(pattern, aps[0].dims[1:]))
    ctx.emit(AffineSelect(aps[0], aps[1], float(on_false), int(base), int(pstep), pattern, cmp))
    return dst


def _pattern(pattern, label: str) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((int(step), int(num)) for step, num in pattern)
    except (TypeError, ValueError):
        raise KernelError(f"{label}: pattern must be a list of [step, num] pairs, got {pattern!r}") from None


def _as_pattern_ap(t: Tile, nums: tuple[int, ...], label: str) -> AP:
    """``t``'s access pattern with its free dims shaped as ``nums`` (views whose free dims
    already have those sizes, or contiguous ones)."""
    ap = t.ap()
    if tuple(c for _, c in ap.dims[1:]) == nums:
        return ap
    if not S._contiguous_free(t):
        raise KernelError(f"{label}: the pattern's sizes {nums} do not match dst {t.shape}, which is strided; "
                          f"give dst the pattern's shape")
    dims, stride = [], 1
    for n in reversed(nums):
        dims.append((stride, n))
        stride *= n
    return AP(ap.buffer, ap.dtype, ap.offset, (ap.dims[0],) + tuple(reversed(dims)))


def iota_pattern(dst, pattern, offset=0, channel_multiplier=0, *, label: str = "iota"):
    """NKI's current iota: ``dst = offset + channel_multiplier * p + sum(step * i)`` over
    ``pattern`` ``[[step, num], ...]`` (GpSimd)."""
    ctx = current(label)
    t = S.tile_operand(dst, "dst", label)
    pat = _pattern(pattern, label)
    if prod(n for _, n in pat) != prod(t.shape[1:]):
        raise KernelError(f"{label}: pattern covers {prod(n for _, n in pat)} elements per partition; dst "
                          f"{t.shape} has {prod(t.shape[1:])}")
    ap = _as_pattern_ap(t, tuple(n for _, n in pat), label)
    ctx.emit(Iota(ap, int(offset), int(channel_multiplier), tuple(step for step, _ in pat)))
    return t


def reciprocal(data, *, dtype=None, mask=None, label: str = "reciprocal", out: Tile | None = None):
    """``1 / data`` on VectorE (one ``reciprocal`` instruction, 8N cycles)."""
    ctx = current(label)
    t = S.tile_operand(data, "data", label)
    dst = S._out(ctx, out, t.shape, S._dtype(dtype) or t.dtype, label, label)
    aps = S._aps(S._box(mask, (dst, t)), (dst, t))
    if aps is not None:
        ctx.emit(Reciprocal(aps[0], aps[1]))
    return dst


def scalar_tensor_tensor(data, op0: str, operand0, op1: str, operand1, *, reverse0=False, reverse1=False,
                         dtype=None, mask=None, label: str = "scalar_tensor_tensor", out: Tile | None = None):
    """``op1(op0(data, operand0), operand1)`` in one VectorE instruction: ``operand0`` a number or
    a ``[P, 1]`` tile, ``operand1`` a tile of ``data``'s shape."""
    ctx = current(label)
    t = S.tile_operand(data, "data", label)
    b = S.tile_operand(operand1, "operand1", label)
    if not S.same_elements(b.shape, t.shape):
        raise KernelError(f"{label}: operand1 {b.shape} must have data's shape {t.shape} (operand0 is the "
                          f"per-partition one)")
    if t.memory == "psum" and b.memory == "psum":
        raise KernelError(f"{label}: data and operand1 cannot both be in PSUM; copy one to SBUF first")
    dst = S._out(ctx, out, t.shape, S._dtype(dtype) or t.dtype, label, label)
    box = S._box(mask, (dst, t, b))
    aps = S._aps(box, (dst, t, b))
    if aps is not None:
        P = t.shape[0]
        ctx.emit(ScalarTensorTensor(aps[0], aps[1], op0, S._scalar_operand(operand0, box, "operand0", label, P),
                                    op1, aps[2], bool(reverse0), bool(reverse1)))
    return dst


def _partitions_only(mask, views, label: str):
    """The mask's box when it bounds the partition dim only (the top-8 instructions read a
    whole row: a free-dim mask has no meaning there); None when it selects nothing."""
    box = S._box(mask, views)
    if box is None:
        return None
    if any(axis != 0 for axis in box):
        raise KernelError(f"{label}: mask= may bound the partition dim only (the instruction reads each "
                          f"partition's whole row); slice the free dims of the tile instead")
    return box


def max8(src, *, dtype=None, mask=None, label: str = "max8", out: Tile | None = None):
    """The 8 largest values of each partition of ``src`` (8..16384 elements), descending, into
    ``[P, 8]`` (VectorE, N cycles)."""
    ctx = current(label)
    t = S.tile_operand(src, "src", label)
    dst = S._out(ctx, out, (t.shape[0], 8), S._dtype(dtype) or t.dtype, label, label)
    box = _partitions_only(mask, (dst, t), label)
    aps = S._aps(box, (dst, t))
    if aps is not None:
        ctx.emit(Max8(aps[0], aps[1]))
    return dst


def find_index8(data, vals, *, dtype=None, mask=None, label: str = "nc_find_index8", out: Tile | None = None):
    """The position (from 0) of the first occurrence of each of the 8 ``vals`` [P, 8] in its
    partition of ``data``, as ``uint32`` (or ``uint16``) ``[P, 8]`` (VectorE, N cycles)."""
    ctx = current(label)
    t = S.tile_operand(data, "data", label)
    v = S.tile_operand(vals, "vals", label)
    dtype = S._dtype(dtype) or "uint32"
    if dtype not in ("uint16", "uint32"):
        raise KernelError(f"{label}: dtype={dtype} -- positions are uint16 or uint32")
    dst = S._out(ctx, out, (t.shape[0], 8), dtype, label, label)
    box = _partitions_only(mask, (dst, t, v), label)
    aps = S._aps(box, (dst, t, v))
    if aps is not None:
        ctx.emit(FindIndex8(aps[0], aps[1], aps[2]))
    return dst


def match_replace8(data, vals, imm, *, dst_idx=None, dtype=None, mask=None, label: str = "nc_match_replace8",
                   out: Tile | None = None):
    """``data`` with the first occurrence of each of the 8 ``vals`` per partition replaced by
    ``imm`` (VectorE); ``dst_idx`` ``[P, 8]`` gets the positions."""
    ctx = current(label)
    t = S.tile_operand(data, "data", label)
    v = S.tile_operand(vals, "vals", label)
    idx = S.tile_operand(dst_idx, "dst_idx", label) if dst_idx is not None else None
    dst = S._out(ctx, out, t.shape, S._dtype(dtype) or t.dtype, label, label)
    box = _partitions_only(mask, (dst, t, v, idx), label)
    aps = S._aps(box, (dst, t, v, idx))
    if aps is not None:
        ctx.emit(MatchReplace8(aps[0], aps[1], aps[2], float(imm), aps[3]))
    return dst


def _act_registers(ctx) -> Tile:
    """ScalarE's accumulation registers: a [128, 1] fp32 tile owned by the kernel (zero at start)."""
    key = ("act_reduce_regs",)
    regs = ctx.consts.get(key)
    if regs is None:
        P = ctx.b.spec.partitions
        regs = S.new_tile(ctx, (P, 1), "float32", label="ScalarE reduce registers", name="act_reduce_regs",
                          temp=False)
        ctx.emit(Memset(regs.ap(), 0.0, "act"))
        ctx.consts[key] = regs
    return regs


def activation_cmd(func: str, data, *, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
                   reduce_cmd: str = "idle", dtype=None, mask=None, label: str = "activation",
                   out: Tile | None = None):
    """``func(data * scale + bias)`` on ScalarE, with NKI's accumulation-register commands:

    ============  ====================================================================
    reduce_cmd    registers
    ============  ====================================================================
    idle          unchanged (``reduce_op`` unused)
    reset         set to 0
    reset_reduce  set to ``reduce_op`` of this output over the free dims
    reduce        combined (``reduce_op``) with this output's reduction
    ============  ====================================================================

    ``reduce_res`` (a [P, 1] tile) then receives the registers (one more ScalarE instruction).
    """
    ctx = current(label)
    if reduce_cmd not in REDUCE_CMDS:
        raise KernelError(f"{label}: reduce_cmd {reduce_cmd!r} is not supported here; use one of "
                          f"{', '.join(REDUCE_CMDS)}")
    if reduce_cmd in ("reduce", "reset_reduce") and reduce_op is None:
        raise KernelError(f"{label}: reduce_cmd={reduce_cmd} needs reduce_op (nl.add)")
    t = S.tile_operand(data, "data", label)
    P = t.shape[0]
    if reduce_cmd == "idle" and reduce_res is None:
        return S.activation(func, t, dtype=dtype, mask=mask, scale=scale, bias=bias, out=out, label=label)
    regs = _act_registers(ctx)[0:P, :] if P != ctx.b.spec.partitions else _act_registers(ctx)
    if reduce_cmd in ("reduce", "reset_reduce"):
        dst = S.activation_reduce(func, t, reduce_op, regs, dtype=dtype, mask=mask, scale=scale, bias=bias,
                                  out=out, label=label, accumulate=reduce_cmd == "reduce")
    else:
        dst = S.activation(func, t, dtype=dtype, mask=mask, scale=scale, bias=bias, out=out, label=label)
        if reduce_cmd == "reset":
            ctx.emit(Memset(regs.ap(), 0.0, "act"))
    if reduce_res is not None:
        r = S.tile_operand(reduce_res, "reduce_res", label)
        if r.shape[0] != P or r.size != P:
            raise KernelError(f"{label}: reduce_res must be a [{P}, 1] tile, got {r.shape}")
        ctx.emit(TensorCopy(r.ap(), regs.ap(), "act"))
    return dst


def shared_constant(constant, dtype=None, *, label: str = "shared_constant") -> Tensor:
    """An HBM tensor holding ``constant`` (a numpy array, or a path to a ``.npy`` file).

    It becomes an input of the Program whose values the kernel supplies on every run.
    """
    ctx = current(label)
    if isinstance(constant, str):
        constant = np.load(constant)
    arr = np.asarray(constant)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    try:
        dt = canonical(dtype if dtype is not None else arr.dtype)
    except TypeError as e:
        raise KernelError(f"{label}: {e}") from None
    arr = np.ascontiguousarray(arr.astype(to_numpy(dt)))
    key = ("shared_constant", dt, arr.shape, hashlib.sha256(arr.tobytes()).hexdigest())
    hit = ctx.consts.get(key)  # the same data twice (every program of a grid) is one tensor
    if hit is not None:
        return hit
    name = f"const{len(ctx.constants)}_{ctx.tile_name(label).replace('@', '_')}"
    h = ctx.b.input(name, arr.shape, dt)
    ctx.constants[name] = arr
    t = ctx.consts[key] = Tensor(h.buffer, 0, h.ap.dims)
    return t
