"""Semantics of the tile language: operand kinds, dtypes, broadcasting, checks --
and emission of the resulting instructions through the kernel's TileBuilder.

Every builtin of :mod:`tilescope.lang` and every ``tilescope.isa`` kernel call
ends here; nothing else emits instructions, so the rules below are the
language's rules.

Rules (one row each):

=========================  ==================================================================
operands                   compute ops read tiles in SBUF/PSUM; HBM tensors only move by DMA
partition dim              axis 0 of every operand; equal across operands, except a one-partition
                           operand, broadcast first on TensorE (:func:`partition_broadcast`)
free dims                  numpy broadcasting, right-aligned (a ``(P,)`` tile is per-partition)
result memory              new tiles go to SBUF (matmul and transpose results: PSUM), or ``out``
                           (NKI's ``dst=``): any view of the same elements per partition
result dtype               ``dtype=`` if given; comparisons -> uint8; else promotion (table)
per-partition operand      a ``(P,)``/``(P, 1)`` tile against a wider one -> ``tensor_scalar``
masks                      narrow the result's axes to a box; the instruction covers only it
assignment ``t[...] = v``  a fresh ``v`` is written straight into ``t`` (its one writer is
                           retargeted); otherwise a ``tensor_copy`` (cast and broadcast)
``acc += tl.matmul(...)``  a PSUM accumulation (``tl.zeros`` before it costs nothing)
=========================  ==================================================================
"""

from __future__ import annotations

import copy as copy_module
from math import prod

import numpy as np

from ..dtypes import is_float
from ..errors import DtypeError, KernelError, ProgramError
from ..isa import (
    ALU_OPS, AP, Activation, ActivationReduce, BnAggr, BnStats, DmaCopy, Iota, Matmul,
    Memset, Select, TensorCopy, TensorReduce, TensorScalar, TensorTensor, Transpose,
)
from ._context import KernelContext, current
from ._index_expr import Check, IndexExpr, Predicate, broadcast_shapes
from ._sym import Sym
from ._types import Memory, par_dim, sbuf, to_dtype
from ._values import Tensor, Tile, View

__all__ = [
    "promote", "is_scalar", "new_tile", "new_tensor", "tile_operand", "binary", "unary_alu",
    "activation", "reduce", "mean", "var", "copy", "where", "matmul", "transpose", "load",
    "store", "assign", "inplace", "memset", "iota", "bn_stats", "bn_aggr", "select",
    "activation_reduce", "dma_copy", "tensor_scalar", "tensor_tensor", "device_print",
]

# ---- dtypes -------------------------------------------------------------------

_FLOAT_RANK = {"float8_e4m3": 0, "float8_e5m2": 0, "float16": 1, "bfloat16": 1, "float32": 2}
_INT_RANK = {"uint8": 0, "int8": 1, "uint16": 2, "int16": 2, "uint32": 3, "int32": 3, "int64": 4}
COMPARISONS = frozenset({"equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
                         "logical_and", "logical_or", "logical_xor"})


def promote(a: str, b: str) -> str:
    """Result dtype of an operation on two tiles.

    ============================  ============================
    operands                      result
    ============================  ============================
    same dtype                    that dtype
    two floats                    the wider (bf16 with fp16: fp32)
    float and integer             the float
    two integers                  the wider
    ============================  ============================
    """
    if a == b:
        return a
    fa, fb = a in _FLOAT_RANK, b in _FLOAT_RANK
    if fa and fb:
        ra, rb = _FLOAT_RANK[a], _FLOAT_RANK[b]
        return "float32" if ra == rb else (a if ra > rb else b)
    if fa != fb:
        return a if fa else b
    return a if _INT_RANK[a] >= _INT_RANK[b] else b


def is_scalar(x) -> bool:
    return (isinstance(x, (int, float, np.number, np.bool_)) or x.__class__ is Sym) and not isinstance(x, IndexExpr)


def _scalar_dtype(tile_dtype: str, s) -> str:
    if isinstance(s, (float, np.floating)) and not is_float(tile_dtype) and float(s) != int(s):
        return "float32"
    return tile_dtype


def _dtype(dtype) -> str | None:
    return None if dtype is None else to_dtype(dtype)


# ---- making values ----------------------------------------------------------------

def _shape_of(shape) -> tuple[tuple[int, ...], int]:
    """Plain sizes and the index of the partition dim (marked by par_dim, else 0)."""
    if shape.__class__ is tuple and shape and all(n.__class__ is int and n > 0 for n in shape):
        return shape, 0
    if isinstance(shape, (int, np.integer, par_dim)):
        shape = (shape,)
    sizes, pdims = [], []
    for k, n in enumerate(shape):
        if isinstance(n, par_dim):
            pdims.append(k)
        if isinstance(n, bool) or not hasattr(n, "__index__"):
            raise KernelError(f"shape {tuple(shape)!r} must hold integers (and at most one tl.par_dim)")
        sizes.append(int(n.__index__()) if not isinstance(n, par_dim) else n.size)
    if len(pdims) > 1:
        raise KernelError(f"shape {tuple(shape)!r} marks {len(pdims)} partition dims; mark one with tl.par_dim")
    if not sizes or any(n < 1 for n in sizes):
        raise KernelError(f"shape {tuple(sizes)} needs at least one dimension, each >= 1")
    return tuple(sizes), (pdims[0] if pdims else 0)


def new_tile(ctx: KernelContext, shape, dtype, memory: Memory | str = sbuf, *, label: str,
             name: str | None = None, temp: bool = True, bufs: int | None = None) -> Tile:
    """A new tile; dims before the partition dim are block dims (stored partition-major)."""
    sizes, pdim = _shape_of(shape)
    mem = memory.name if isinstance(memory, Memory) else memory
    phys = (sizes[pdim],) + sizes[:pdim] + sizes[pdim + 1:]
    site = ctx.site()
    name = name or ctx.tile_name(label)
    make = ctx.b.psum if mem == "psum" else ctx.b.sbuf
    handle = make(phys, to_dtype(dtype), site=site, bufs=bufs, name=name)
    buf = handle.buffer
    strides = [0] * len(phys)
    s = 1
    for k in range(len(phys) - 1, -1, -1):
        strides[k] = s
        s *= phys[k]
    order = list(range(1, pdim + 1)) + [0] + list(range(pdim + 1, len(phys)))
    dims = tuple((strides[k], phys[k]) for k in order)
    return Tile(buf, 0, dims, pdim=pdim, state=ctx.state(buf, temp=temp))


def new_tensor(ctx: KernelContext, shape, dtype, memory: Memory, *, label: str, name: str | None) -> Tensor:
    sizes, pdim = _shape_of(shape)
    if pdim:
        raise KernelError("tl.par_dim marks on-chip tiles; an HBM tensor has no partition dimension")
    dtype = to_dtype(dtype)
    if memory.shared and ctx.launch.grid and ctx.instance > 0:
        # every program of a launch grid sees the same shared HBM tensor
        k = ctx.hbm_cursor
        ctx.hbm_cursor += 1
        if k < len(ctx.hbm_shared):
            t = ctx.hbm_shared[k]
            if t.shape == sizes and t.dtype == dtype:
                return t
        raise KernelError(
            f"program {ctx.launch.program_id} of the launch grid creates shared HBM tensors that differ from "
            f"program 0's ({sizes} {dtype} as #{k}); every program must create the same shared tensors")
    handle = ctx.b.scratch(sizes, dtype, name=name or ctx.tile_name(label))
    t = Tensor(handle.buffer, 0, handle.ap.dims)
    if memory.shared:
        ctx.hbm_shared.append(t)
    return t


# ---- operands -----------------------------------------------------------------------

def tile_operand(x, role: str, op: str) -> Tile:
    if isinstance(x, Tile):
        if x.pdim:
            raise KernelError(
                f"operand {role!r} of {op!r} is {x.describe()} with block dimensions (shape {x.shape}, "
                f"partition dim {x.pdim}); index the block dims first, e.g. t[k]")
        return x
    if isinstance(x, Tensor):
        raise KernelError(
            f"Expected operand {role!r} of {op!r} to be in SBUF or PSUM, but got HBM tensor "
            f"{x.buffer.name!r} (view {x.shape} {x.dtype}); engines cannot read HBM: load it into a "
            f"tile with tl.load first")
    if isinstance(x, IndexExpr):
        raise KernelError(
            f"operand {role!r} of {op!r} is an index expression, which is not data; materialize index "
            f"values in a tile with tilescope.isa.iota(expr, dtype)")
    raise KernelError(f"operand {role!r} of {op!r} must be a tile, got {type(x).__name__} {x!r}")


def _sbuf_only(t: Tile, role: str, op: str, fix: str) -> None:
    if t.memory != "sbuf":
        raise KernelError(f"operand {role!r} of {op!r} must be in SBUF, got {t.describe()}; {fix}")


def _tile_shape(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    parts = {s[0] for s in shapes}
    if len(parts) > 1:
        raise KernelError(
            f"operands of {op!r} have partition dims {sorted(parts)} (shapes {', '.join(map(str, shapes))}); "
            f"the partition dim (axis 0) never broadcasts: engines read each partition from its own lane")
    free = broadcast_shapes(*(s[1:] for s in shapes), what=f"operands of {op!r} (free dims)")
    return (shapes[0][0],) + free


def _remap_axis(a: int, rank: int, new_rank: int) -> int:
    return a if a == 0 else a + (new_rank - rank)


def _expand(t: Tile, shape: tuple[int, ...], op: str) -> Tile:
    """``t`` as a view of ``shape``: missing/size-1 free dims repeat (stride 0)."""
    if t.shape == shape:
        return t
    rank, new_rank = len(t.dims), len(shape)
    dims = [t.dims[0]]
    pad = new_rank - rank
    for k in range(1, new_rank):
        src = k - pad
        if src < 1:
            dims.append((0, shape[k]))
            continue
        stride, count = t.dims[src]
        if count == shape[k]:
            dims.append((stride, count))
        elif count == 1:
            dims.append((0, shape[k]))
        else:
            raise KernelError(f"operand of shape {t.shape} of {op!r} does not broadcast to {shape}")
    checks = tuple(Check(c.dim, c.size, c.const, tuple((_remap_axis(a, rank, new_rank), k) for a, k in c.coefs))
                   for c in t.checks)
    axis_vars = tuple((v, _remap_axis(a, rank, new_rank)) for v, a in t.axis_vars)
    return Tile(t.buffer, t.offset, dims, checks, axis_vars, pdim=0, state=t.state)


def _box(mask, views) -> dict | None:
    if mask is None:
        return {}
    if not isinstance(mask, Predicate):
        raise KernelError(f"mask= takes a comparison of index expressions (e.g. i_p < n), got {type(mask).__name__}")
    var_axes: dict[int, int] = {}
    for v in views:
        if v is not None:
            for var, axis in v.axis_vars:
                var_axes.setdefault(var, axis)
    return mask.box(var_axes)


def _aps(box, views, hint: str = "") -> list | None:
    """Operand APs narrowed to the mask's box (None if the box is empty)."""
    if box is None:
        return None
    out: list[AP | None] = []
    for v in views:
        if v is None:
            out.append(None)
            continue
        ap = v.ap(box, hint)
        if ap is None:
            return None
        out.append(ap)
    return out


def _scalar_ap(t: Tile, box, role: str, op: str, partitions: int) -> AP:
    """A per-partition scalar operand ([P, 1]) of an instruction whose operands ``box`` leaves non-empty."""
    if prod(t.shape[1:]) != 1 or t.shape[0] != partitions:
        raise KernelError(f"{role!r} of {op!r} must be a per-partition scalar tile of shape ({partitions}, 1), got {t.shape}")
    sub = {0: box[0]} if box and 0 in box else {}
    ap = t.ap(sub)
    assert ap is not None  # (the box's partition range meets the operands', which span the same partitions)
    return ap


def _scalar_operand(v, box, role: str, op: str, partitions: int):
    """A scalar operand: a number or a per-partition tile."""
    if v is None:
        return None
    if is_scalar(v):
        return float(v)
    t = tile_operand(v, role, op)
    return _scalar_ap(t, box, role, op, partitions)


def same_elements(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Shapes that hold the same elements in the same order per partition: equal, or equal
    once size-1 free dims are dropped (a ``(P,)`` reduction written into a ``(P, 1)`` view)."""
    if a == b:
        return True
    return a[:1] == b[:1] and tuple(n for n in a[1:] if n != 1) == tuple(n for n in b[1:] if n != 1)


def _out(ctx, out: Tile | None, shape, dtype, label: str, op: str, memory="sbuf") -> Tile:
    if out is None:
        return new_tile(ctx, shape, dtype, memory, label=label)
    if not isinstance(out, Tile):
        raise KernelError(f"dst of {op!r} must be a tile in SBUF or PSUM, got "
                          f"{out.describe() if isinstance(out, View) else type(out).__name__}")
    out = tile_operand(out, "dst", op)
    if not same_elements(out.shape, tuple(shape)):
        raise KernelError(f"the result of {op!r} has shape {tuple(shape)} but is written into a tile view of "
                          f"shape {out.shape}")
    return out


def _emit(ctx: KernelContext, instr) -> int:
    return ctx.emit(instr)


# ---- elementwise -------------------------------------------------------------------

def _fold(op: str, x, y):
    r = ALU_OPS[op](np.float64(x), np.float64(y))
    return float(r)


def binary(op: str, x, y, *, dtype=None, mask=None, out: Tile | None = None, engine: str = "dve",
           label: str | None = None):
    """``op(x, y)`` elementwise: tiles and scalars, with broadcasting."""
    ctx = current(op)
    label = label or op
    xs, ys = is_scalar(x), is_scalar(y)
    if xs and ys:
        return _fold(op, x, y)
    dtype = _dtype(dtype)
    if xs or ys:
        t, s, reverse = (y, x, True) if xs else (x, y, False)
        t = tile_operand(t, "y" if xs else "x", op)
        rdt = dtype or ("uint8" if op in COMPARISONS else _scalar_dtype(t.dtype, s))
        dst = _out(ctx, out, t.shape, rdt, label, op)
        src = _expand(t, dst.shape, op)
        aps = _aps(_box(mask, (dst, src)), (dst, src))
        if aps is not None:
            _emit(ctx, TensorScalar(aps[0], aps[1], op, float(s), reverse0=reverse, engine=engine))
        return dst
    a, b = tile_operand(x, "x", op), tile_operand(y, "y", op)
    a, b = _partitions_match(ctx, a, b, label)
    shape = _tile_shape(op, a.shape, b.shape)
    rdt = dtype or ("uint8" if op in COMPARISONS else promote(a.dtype, b.dtype))
    dst = _out(ctx, out, shape, rdt, label, op)
    wide = prod(shape[1:]) > 1
    if wide and prod(b.shape[1:]) == 1 or wide and prod(a.shape[1:]) == 1:
        # one side is a per-partition scalar: tensor_scalar reads the wide side once
        t, s, reverse = (a, b, False) if prod(b.shape[1:]) == 1 else (b, a, True)
        src = _expand(t, shape, op)
        box = _box(mask, (dst, src, s))
        aps = _aps(box, (dst, src))
        if aps is not None:
            _emit(ctx, TensorScalar(aps[0], aps[1], op, _scalar_ap(s, box, "scalar", op, shape[0]),
                                    reverse0=reverse, engine=engine))
        return dst
    ea, eb = _expand(a, shape, op), _expand(b, shape, op)
    aps = _aps(_box(mask, (dst, ea, eb)), (dst, ea, eb))
    if aps is not None:
        _emit(ctx, TensorTensor(aps[0], aps[1], aps[2], op, engine))
    return dst


def _partitions_match(ctx, a: Tile, b: Tile, label: str) -> tuple[Tile, Tile]:
    """A one-partition operand against a wider one is broadcast across partitions first
    (a TensorE matmul with a ones row, as NKI does; see :func:`partition_broadcast`)."""
    pa, pb = a.shape[0], b.shape[0]
    if pa == pb:
        return a, b
    if pa == 1:
        return partition_broadcast(a, (pb,) + a.shape[1:], label=label), b
    if pb == 1:
        return a, partition_broadcast(b, (pa,) + b.shape[1:], label=label)
    return a, b


def unary_alu(op: str, scalar: float, x, *, dtype=None, mask=None, label: str, out: Tile | None = None):
    """A unary op as ``tensor_scalar(x, op, scalar)`` on VectorE (negate, abs)."""
    ctx = current(label)
    t = tile_operand(x, "x", label)
    dst = _out(ctx, out, t.shape, _dtype(dtype) or t.dtype, label, label)
    aps = _aps(_box(mask, (dst, t)), (dst, t))
    if aps is not None:
        _emit(ctx, TensorScalar(aps[0], aps[1], op, float(scalar)))
    return dst


def activation(func: str, x, *, dtype=None, mask=None, scale=1.0, bias=None, out: Tile | None = None,
               label: str | None = None):
    """``func(x * scale + bias)`` on ScalarE."""
    label = label or func
    ctx = current(label)
    t = tile_operand(x, "data", label)
    rdt = _dtype(dtype) or (t.dtype if is_float(t.dtype) else "float32")
    dst = _out(ctx, out, t.shape, rdt, label, label)
    box = _box(mask, (dst, t))
    aps = _aps(box, (dst, t))
    if aps is not None:
        P = t.shape[0]
        _emit(ctx, Activation(aps[0], aps[1], func, _scalar_operand(scale, box, "scale", label, P),
                              _scalar_operand(bias, box, "bias", label, P)))
    return dst


def activation_reduce(func: str, x, reduce_op: str, reduce_res, *, dtype=None, mask=None, scale=1.0,
                      bias=None, label: str, out: Tile | None = None, accumulate: bool = False):
    """``func(x * scale + bias)`` and its reduction over the free dims into ``reduce_res``
    (``accumulate``: combined with what ``reduce_res`` holds) -- one ScalarE instruction."""
    ctx = current(label)
    t = tile_operand(x, "data", label)
    r = tile_operand(reduce_res, "reduce_res", label)
    rdt = _dtype(dtype) or (t.dtype if is_float(t.dtype) else "float32")
    dst = _out(ctx, out, t.shape, rdt, label, label)
    box = _box(mask, (dst, t))
    aps = _aps(box, (dst, t))
    if aps is not None:
        P = t.shape[0]
        _emit(ctx, ActivationReduce(aps[0], aps[1], func, _scalar_ap(r, box, "reduce_res", label, P), reduce_op,
                                    _scalar_operand(scale, box, "scale", label, P),
                                    _scalar_operand(bias, box, "bias", label, P), accumulate=bool(accumulate)))
    return dst


def tensor_scalar(x, op0: str, operand0, *, reverse0=False, op1=None, operand1=None, reverse1=False,
                  dtype=None, mask=None, engine: str = "dve", label: str, out: Tile | None = None):
    ctx = current(label)
    t = tile_operand(x, "data", label)
    dst = _out(ctx, out, t.shape, _dtype(dtype) or t.dtype, label, label)
    box = _box(mask, (dst, t))
    aps = _aps(box, (dst, t))
    if aps is not None:
        P = t.shape[0]
        _emit(ctx, TensorScalar(aps[0], aps[1], op0, _scalar_operand(operand0, box, "operand0", label, P),
                                op1, _scalar_operand(operand1, box, "operand1", label, P),
                                bool(reverse0), bool(reverse1), engine))
    return dst


def tensor_tensor(x, y, op: str, *, dtype=None, mask=None, engine: str = "dve", label: str,
                  out: Tile | None = None):
    """One ``tensor_tensor`` instruction (no per-partition shortcut)."""
    ctx = current(label)
    a, b = tile_operand(x, "data1", label), tile_operand(y, "data2", label)
    shape = _tile_shape(label, a.shape, b.shape)
    dst = _out(ctx, out, shape, _dtype(dtype) or promote(a.dtype, b.dtype), label, label)
    ea, eb = _expand(a, shape, label), _expand(b, shape, label)
    aps = _aps(_box(mask, (dst, ea, eb)), (dst, ea, eb))
    if aps is not None:
        _emit(ctx, TensorTensor(aps[0], aps[1], aps[2], op, engine))
    return dst


def where(cond, x, y, *, dtype=None, mask=None, label: str = "where"):
    """``x`` where ``cond`` is non-zero, else ``y``."""
    ctx = current(label)
    c = tile_operand(cond, "condition", label)
    tiles = [v for v in (x, y) if not is_scalar(v)]
    tiles = [tile_operand(v, "x" if v is x else "y", label) for v in tiles]
    shape = _tile_shape(label, c.shape, *(t.shape for t in tiles))
    dts = [t.dtype for t in tiles]
    rdt = _dtype(dtype) or (promote(*dts) if len(dts) == 2 else dts[0] if dts else "float32")
    if not tiles:  # both scalars: cond * (x - y) + y
        dst = new_tile(ctx, shape, rdt, label=label)
        ec = _expand(c, shape, label)
        box = _box(mask, (dst, ec))
        aps = _aps(box, (dst, ec))
        if aps is not None:
            _emit(ctx, TensorScalar(aps[0], aps[1], "not_equal", 0.0, "multiply", float(x) - float(y)))
            if float(y) != 0.0:
                _emit(ctx, TensorScalar(aps[0], aps[0], "add", float(y)))
        return dst
    if is_scalar(x):  # select picks a tile on true: flip the predicate
        ec = _expand(c, shape, label)
        flipped = new_tile(ctx, shape, "uint8", label=label)
        aps = _aps(_box(mask, (flipped, ec)), (flipped, ec))
        if aps is not None:
            _emit(ctx, TensorScalar(aps[0], aps[1], "equal", 0.0))
        c, x, y = flipped, y, x
    dst = new_tile(ctx, shape, rdt, label=label)
    ec = _expand(tile_operand(c, "condition", label), shape, label)
    et = _expand(tile_operand(x, "x", label), shape, label)
    ef = float(y) if is_scalar(y) else _expand(tile_operand(y, "y", label), shape, label)
    views = (dst, ec, et) + ((ef,) if isinstance(ef, Tile) else ())
    aps = _aps(_box(mask, views), views)
    if aps is not None:
        _emit(ctx, Select(aps[0], aps[1], aps[2], aps[3] if isinstance(ef, Tile) else ef))
    return dst


def copy(x, *, dtype=None, mask=None, out: Tile | None = None, engine: str = "dve", label: str = "copy"):
    """``tensor_copy``: a new tile (or ``out``) with ``x``'s values, cast to ``dtype``."""
    ctx = current(label)
    t = tile_operand(x, "src", label)
    dst = _out(ctx, out, t.shape, _dtype(dtype) or t.dtype, label, label)
    src = _expand(t, dst.shape, label)
    aps = _aps(_box(mask, (dst, src)), (dst, src))
    if aps is not None:
        _emit(ctx, TensorCopy(aps[0], aps[1], engine))
    return dst


def memset(shape_or_tile, value, dtype=None, *, mask=None, engine: str = "dve", label: str = "memset"):
    ctx = current(label)
    if isinstance(shape_or_tile, Tile):
        dst = tile_operand(shape_or_tile, "dst", label)
    else:
        if dtype is None:
            raise KernelError("memset(shape, value, dtype) needs a dtype")
        dst = new_tile(ctx, shape_or_tile, dtype, label=label)
    aps = _aps(_box(mask, (dst,)), (dst,))
    if aps is not None:
        _emit(ctx, Memset(aps[0], float(value), engine))
    return dst


def iota(expr, dtype, *, mask=None, label: str = "iota", out: Tile | None = None):
    """Index values of ``expr`` (``const + p*step_p + sum(i_k*step_k)``) on GpSimd."""
    ctx = current(label)
    if isinstance(expr, int):
        raise KernelError("iota takes an index expression such as tl.arange(128)[:, None] * 4 + tl.arange(4)[None, :]")
    if not isinstance(expr, IndexExpr):
        raise KernelError(f"iota takes an index expression, got {type(expr).__name__}")
    shape = expr.shape if len(expr.shape) > 1 else expr.shape + (1,)
    steps = [0] * len(shape)
    for _, a, c in expr.terms:
        steps[a] += c
    dst = _out(ctx, out, shape, dtype, label, label)
    box = _box(mask, (dst,))
    aps = _aps(box, (dst,))
    if aps is not None:
        assert box is not None  # (no APs without a box)
        base = expr.const + sum(steps[a] * lo for a, (lo, _) in box.items())
        _emit(ctx, Iota(aps[0], int(base), int(steps[0]), tuple(int(s) for s in steps[1:])))
    return dst


# ---- reductions -----------------------------------------------------------------------

def _axes(axis, ndim: int, op: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(1, ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        a = int(a)
        if a < 0:
            a += ndim
        if a == 0:
            raise KernelError(
                f"{op} over axis 0 (the partition dim) is not an engine reduction; reduce free axes "
                f"(1..{ndim - 1}), or transpose first (tl.transpose) / multiply by a ones vector (tl.matmul)")
        if not 0 < a < ndim:
            raise KernelError(f"{op}: axis {a} is out of range for a tile of {ndim} dimensions")
        out.append(a)
    return tuple(sorted(set(out)))


def _reduced_shape(shape, axes, keepdims) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if k in axes else n for k, n in enumerate(shape))
    return tuple(n for k, n in enumerate(shape) if k not in axes)


def reduce(op: str, x, axis, *, keepdims=False, dtype=None, mask=None, negate=False, label: str,
           engine: str = "dve", out: Tile | None = None):
    """``tensor_reduce`` over free ``axis`` (int or tuple), into a new tile or ``out``
    (any view of the same elements: a ``(P, 1)`` column of a wider tile, for instance)."""
    ctx = current(label)
    t = tile_operand(x, "data", label)
    axes = _axes(axis, len(t.shape), label)
    dst = _out(ctx, out, _reduced_shape(t.shape, axes, keepdims), _dtype(dtype) or t.dtype, label, label)
    box = _box(mask, (t,))
    src_ap = _aps(box, (t,))
    if src_ap is not None:
        part = {0: box[0]} if box and 0 in box else {}
        dst_ap = dst.ap(part)
        assert dst_ap is not None  # (the box's partitions meet the source's, which are dst's)
        _emit(ctx, TensorReduce(dst_ap, src_ap[0], op, axes, bool(negate), engine))
    return dst


def mean(x, axis, *, keepdims=False, dtype=None, mask=None, label: str = "mean"):
    ctx = current(label)
    t = tile_operand(x, "data", label)
    axes = _axes(axis, len(t.shape), label)
    r = reduce("add", t, axes, keepdims=keepdims, dtype=dtype or (t.dtype if is_float(t.dtype) else "float32"),
               mask=mask, label=label)
    box = _box(mask, (t,)) or {}
    n = 1  # elements reduced per result: the mask's range on each reduced axis
    for a in axes:
        lo, hi = box.get(a, (0, t.shape[a]))
        n *= max(1, min(hi, t.shape[a]) - max(lo, 0))
    ap = r.ap()
    _emit(ctx, TensorScalar(ap, ap, "multiply", 1.0 / n))
    return r


def var(x, axis, *, keepdims=False, dtype=None, mask=None, label: str = "var"):
    """Population variance over free axes: ``bn_stats``/``bn_aggr`` for a 2-D tile, else two passes."""
    ctx = current(label)
    t = tile_operand(x, "data", label)
    axes = _axes(axis, len(t.shape), label)
    if len(t.shape) == 2 and axes == (1,) and mask is None and is_float(t.dtype):
        mv = _bn_mean_var(ctx, t, label)
        v = mv[:, 1:2] if keepdims else mv[:, 1]
        return copy(v, dtype=dtype, label=label) if dtype is not None and _dtype(dtype) != "float32" else v
    m = mean(t, axes, keepdims=True, mask=mask, label=label)
    d = binary("subtract", t, m, mask=mask, label=label)
    sq = binary("multiply", d, d, mask=mask, label=label)
    return mean(sq, axes, keepdims=keepdims, dtype=dtype, mask=mask, label=label)


def _bn_mean_var(ctx, t: Tile, label: str) -> Tile:
    P, F = t.shape
    chunk = 512
    n = -(-F // chunk)
    stats = new_tile(ctx, (P, 6 * n), "float32", label=label)
    for k in range(n):
        lo, hi = k * chunk, min(F, (k + 1) * chunk)
        _emit(ctx, BnStats(stats[:, 6 * k:6 * k + 6].ap(), t[:, lo:hi].ap()))
    mv = new_tile(ctx, (P, 2), "float32", label=label)
    _emit(ctx, BnAggr(mv.ap(), stats.ap()))
    return mv


def bn_stats(x, *, dtype=None, mask=None, label: str = "bn_stats", out: Tile | None = None):
    ctx = current(label)
    t = tile_operand(x, "data", label)
    dst = _out(ctx, out, (t.shape[0], 6), _dtype(dtype) or "float32", label, label)
    box = _box(mask, (t,))
    aps = _aps(box, (t,))
    if aps is not None:
        part = {0: box[0]} if box and 0 in box else {}
        dst_ap = dst.ap(part)
        assert dst_ap is not None  # (the box's partitions meet the source's, which are dst's)
        _emit(ctx, BnStats(dst_ap, aps[0]))
    return dst


def bn_aggr(x, *, dtype=None, mask=None, label: str = "bn_aggr", out: Tile | None = None):
    ctx = current(label)
    t = tile_operand(x, "data", label)
    dst = _out(ctx, out, (t.shape[0], 2), _dtype(dtype) or "float32", label, label)
    box = _box(mask, (t,))
    part = {0: box[0]} if box and 0 in box else {}
    aps = _aps(part, (dst, t))
    if aps is not None:
        _emit(ctx, BnAggr(aps[0], aps[1]))
    return dst


def select(pred, on_true, on_false, *, dtype=None, mask=None, engine: str = "dve", label: str = "select",
           out: Tile | None = None):
    """One ``select`` instruction: ``on_true`` (a tile) where ``pred`` != 0, else ``on_false``."""
    ctx = current(label)
    p = tile_operand(pred, "predicate", label)
    t = tile_operand(on_true, "on_true", label)
    f = on_false if is_scalar(on_false) else tile_operand(on_false, "on_false", label)
    shape = _tile_shape(label, p.shape, t.shape, *((f.shape,) if isinstance(f, Tile) else ()))
    dst = _out(ctx, out, shape, _dtype(dtype) or t.dtype, label, label)
    views: tuple[Tile, ...] = (dst, _expand(p, shape, label), _expand(t, shape, label))
    if isinstance(f, Tile):
        views += (_expand(f, shape, label),)
    aps = _aps(_box(mask, views), views)
    if aps is not None:
        _emit(ctx, Select(aps[0], aps[1], aps[2], aps[3] if isinstance(f, Tile) else float(f), engine))
    return dst


# ---- TensorE ----------------------------------------------------------------------------

def _pe_operands(a: Tile, b: Tile, op: str, roles=("stationary", "moving")) -> None:
    fix = "copy it to SBUF first (tl.copy)"
    _sbuf_only(a, roles[0], op, fix)
    _sbuf_only(b, roles[1], op, fix)
    if a.dtype != b.dtype:
        raise DtypeError(
            f"{op}: operand dtypes differ ({roles[0]} {a.dtype}, {roles[1]} {b.dtype}); TensorE multiplies "
            f"tiles of one dtype: cast one with tl.copy(t, dtype=...)")
    if not is_float(a.dtype):
        raise DtypeError(f"{op}: TensorE multiplies floating-point tiles, got {a.dtype}; cast with tl.copy first")


def matmul(x, y, *, transpose_x: bool = False, label: str = "matmul"):
    """``x @ y`` into a new fp32 PSUM tile (``transpose_x``: ``x`` is given as [K, M])."""
    ctx = current(label)
    a, b = tile_operand(x, "x", label), tile_operand(y, "y", label)
    _pe_operands(a, b, label, ("x", "y"))
    if not transpose_x:
        if prod(a.shape[1:]) > ctx.b.spec.matmul_stationary_fmax:
            raise KernelError(
                f"matmul(x, y) contracts over x's free dim, here {prod(a.shape[1:])} elements; a TensorE "
                f"pass contracts at most {ctx.b.spec.partitions}. Tile the contraction and accumulate: "
                f"acc += tl.matmul(x[:, k0:k1], y[k0:k1, :]) -- or pass x already transposed "
                f"([K, M]) with transpose_x=True")
        xt = new_tile(ctx, (prod(a.shape[1:]), a.shape[0]), a.dtype, "psum", label=label)
        _emit(ctx, Transpose(xt.ap(), a.ap()))
        st = new_tile(ctx, xt.shape, a.dtype, label=label)
        _emit(ctx, TensorCopy(st.ap(), xt.ap()))
    else:
        st = a
    if st.shape[0] != b.shape[0]:
        raise KernelError(
            f"matmul contracts over the partition dim: x{' (transposed)' if transpose_x else ''} has "
            f"K={st.shape[0]}, y has K={b.shape[0]}; they must match")
    dst = new_tile(ctx, (prod(st.shape[1:]), prod(b.shape[1:])), "float32", "psum", label=label)
    _emit(ctx, Matmul(dst.ap(), st.ap(), b.ap(), False))
    return dst


def nc_matmul(stationary, moving, *, label: str, out: Tile | None = None, accumulate: bool | None = None):
    """``stationary.T @ moving`` into a new PSUM tile, or into ``out``.

    Into ``out``, ``accumulate=None`` infers the flag as NKI's compiler does: a matmul
    overwrites unless the previous matmul wrote the same PSUM region and nothing has
    read it since (an open accumulation group), in which case it accumulates.
    """
    ctx = current(label)
    a, b = tile_operand(stationary, "stationary", label), tile_operand(moving, "moving", label)
    _pe_operands(a, b, label)
    shape = (prod(a.shape[1:]), prod(b.shape[1:]))
    if out is None:
        dst = new_tile(ctx, shape, "float32", "psum", label=label)
        _emit(ctx, Matmul(dst.ap(), a.ap(), b.ap(), False))
        return dst
    dst = _out(ctx, out, shape, "float32", label, label)
    if dst.memory != "psum":
        raise KernelError(f"{label} writes PSUM; dst is {dst.describe()}: give it a tl.psum tile")
    ap = dst.ap()
    st = dst.state
    region = (ap.offset, ap.dims)
    if accumulate is None:
        accumulate = st is not None and region in st.acc_open
    _emit(ctx, Matmul(ap, a.ap(), b.ap(), bool(accumulate)))
    if st is not None:
        st.acc_open.add(region)
    return dst


def transpose(x, *, dtype=None, label: str = "transpose", out: Tile | None = None):
    """``x.T`` into a new PSUM tile (or ``out``, a PSUM tile), on TensorE."""
    ctx = current(label)
    t = tile_operand(x, "x", label)
    _sbuf_only(t, "x", label, "TensorE reads SBUF: copy it there first (tl.copy)")
    dst = _out(ctx, out, (prod(t.shape[1:]), t.shape[0]), _dtype(dtype) or t.dtype, label, label, memory="psum")
    if dst.memory != "psum":
        raise KernelError(f"{label} on TensorE writes PSUM; dst is {dst.describe()}: give it a tl.psum tile")
    _emit(ctx, Transpose(dst.ap(), t.ap()))
    return dst


def _ones_row(ctx, n: int, dtype: str) -> Tile:
    """A [1, n] SBUF row of ones (one per kernel and dtype): the stationary of a partition broadcast."""
    key = ("ones_row", n, dtype)
    t = ctx.consts.get(key)
    if t is None:
        t = new_tile(ctx, (1, n), dtype, label="broadcast ones", name=f"ones_row_{dtype}_{n}", temp=False)
        _emit(ctx, Memset(t.ap(), 1.0))
        ctx.consts[key] = t
    return t


def partition_broadcast(x, shape, *, label: str = "broadcast_to"):
    """A new SBUF tile of ``shape`` with a one-partition tile's row in every partition.

    Engines read each partition from its own lane, so a partition broadcast is work: as in
    NKI ([arch] "Partition Broadcast"), a TensorE matmul of a [1, P] ones row (stationary)
    with the row (moving, at most 512 per pass) into PSUM, then a VectorE copy to SBUF.
    Integer rows go through float32 (exact below 2**24).
    """
    ctx = current(label)
    t = tile_operand(x, "x", label)
    shape = tuple(int(n) for n in shape)
    if t.shape[0] != 1:
        raise KernelError(f"only a one-partition tile broadcasts across partitions; {t.describe()} has shape "
                          f"{t.shape}")
    P = shape[0]
    if not 1 <= P <= ctx.b.spec.partitions:
        raise KernelError(f"cannot broadcast to {P} partitions (at most {ctx.b.spec.partitions})")
    free = broadcast_shapes(t.shape[1:], shape[1:], what=f"operands of {label!r}")
    if free != shape[1:]:
        raise KernelError(f"{t.describe()} of shape {t.shape} does not broadcast to {shape}")
    src = t
    if t.memory != "sbuf" or not is_float(t.dtype) or t.dtype == "float8_e4m3":
        src = copy(t, dtype="float32" if not is_float(t.dtype) or t.dtype == "float8_e4m3" else t.dtype,
                   label=label)
    row = _expand(src, (1,) + free, label) if src.shape[1:] != free else src
    n = prod(free)
    flat = row if len(row.shape) == 2 and _contiguous_free(row) else copy(row, label=label)
    flat = flat.reshape((1, n)) if len(flat.shape) != 2 else flat
    out = new_tile(ctx, (P,) + free, t.dtype, label=label)
    out_flat = out.reshape((P, n))
    ones = _ones_row(ctx, P, src.dtype)
    step = ctx.b.spec.matmul_moving_fmax
    for c0 in range(0, n, step):
        c1 = min(n, c0 + step)
        ps = new_tile(ctx, (P, c1 - c0), "float32", "psum", label=label)
        _emit(ctx, Matmul(ps.ap(), ones.ap(), flat[:, c0:c1].ap(), False))
        _emit(ctx, TensorCopy(out_flat[:, c0:c1].ap(), ps.ap()))
    return out


def _contiguous_free(t: Tile) -> bool:
    expected = 1
    for stride, count in reversed(t.dims[1:]):
        if count > 1 and stride != expected:
            return False
        expected *= count
    return True


# ---- DMA ------------------------------------------------------------------------------

def _hbm_operand(x, role: str, op: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, Tile):
        raise KernelError(
            f"Expected operand {role!r} of {op!r} to be in address space 'hbm', but got a tile in "
            f"{x.memory!r} ({x.buffer.name!r} {x.shape})")
    raise KernelError(f"operand {role!r} of {op!r} must be an HBM tensor (a kernel argument or a "
                      f"tl.ndarray(..., buffer=tl.hbm)), got {type(x).__name__}")


def load(src, *, mask=None, dtype=None, label: str = "load"):
    """DMA ``src`` (HBM) into a new SBUF tile of its shape."""
    ctx = current(label)
    s = _hbm_operand(src, "src", label)
    shape = s.shape or (1,)
    dst = new_tile(ctx, shape, _dtype(dtype) or s.dtype, label=label)  # the DMA casts [isa]
    views = (dst, s)
    aps = _aps(_box(mask, views), views, hint="mask the part outside the tensor, e.g. mask=(i + i_p < n)")
    if aps is not None:
        _emit(ctx, DmaCopy(aps[0], aps[1]))
    return dst


def store(dst, value, *, mask=None, label: str = "store"):
    """DMA ``value`` (an SBUF tile) into ``dst`` (an HBM tensor view)."""
    ctx = current(label)
    d = _hbm_operand(dst, "dst", label)
    if is_scalar(value):
        raise KernelError("store writes a tile; make one first, e.g. tl.full(shape, value, dtype)")
    v = tile_operand(value, "value", label)
    if v.memory != "sbuf":
        # DMA does not read PSUM: as NKI does, copy to SBUF first (a VectorE tensor_copy, which
        # also casts; priced and visible on the timeline)
        v = copy(v, dtype=d.dtype, label=label)
    dshape = d.shape or (1,)
    if tuple(n for n in v.shape if n != 1) != tuple(n for n in dshape if n != 1):
        if len(dshape) < 1 or v.shape[0] != dshape[0]:
            raise KernelError(f"store: value tile of shape {v.shape} does not match the destination view {dshape}")
        v = _expand(v, tuple(dshape), label)
    views = (d, v)
    aps = _aps(_box(mask, views), views, hint="mask the part outside the tensor, e.g. mask=(i + i_p < n)")
    if aps is not None:
        _emit(ctx, DmaCopy(aps[0], aps[1]))
        ctx.written_hbm.add(d.buffer.name)
    return None


def dma_copy(dst, src, *, mask=None, label: str = "dma_copy"):
    """One DMA between HBM and SBUF (either way) or SBUF to SBUF."""
    ctx = current(label)
    for role, v in (("dst", dst), ("src", src)):
        if not isinstance(v, View):
            raise KernelError(f"operand {role!r} of {label!r} must be a tensor or tile view, got {type(v).__name__}")
        if isinstance(v, Tile):
            tile_operand(v, role, label)
            if v.memory == "psum":
                raise KernelError(f"DMA does not access PSUM ({role!r} is {v.describe()}); copy through SBUF")
    if dst.size != src.size:
        raise KernelError(f"dma_copy moves {src.size} elements ({src.shape}) into {dst.size} ({dst.shape}); sizes must match")
    views = (dst, src)
    aps = _aps(_box(mask, views), views)
    if aps is not None:
        _emit(ctx, DmaCopy(aps[0], aps[1]))
        if isinstance(dst, Tensor):
            ctx.written_hbm.add(dst.buffer.name)
    return None


# ---- assignment ----------------------------------------------------------------------------

def _retarget(ctx: KernelContext, v: Tile, target: Tile, fresh, *, accumulate: bool | None = None) -> bool:
    """Write ``v``'s one producing instruction straight into ``target`` (see module docs).

    ``fresh`` is (file, first line, last line) of the assigning statement: the producer
    must be the last instruction emitted, and emitted by that statement.
    """
    st, ts = v.state, target.state
    b = ctx.b
    if (not fresh or st is None or ts is None or not st.temp or st.writes != 1 or st.read
            or st.writer != b.instruction_count - 1 or not v.is_whole() or not same_elements(v.shape, target.shape)):
        return False
    site = ctx.last_emit
    if site is None or site[0] != fresh[0] or not fresh[1] <= site[1] <= fresh[2]:
        return False
    instr = b.instruction(st.writer)
    if not hasattr(instr, "dst") or instr.dst.buffer != v.buffer.name or instr.dst.size != v.size:
        return False
    kind = type(instr)
    if accumulate is not None and kind is not Matmul:
        return False
    if kind is DmaCopy and (target.memory != "sbuf" or target.dtype != v.dtype):
        return False
    if kind in (Matmul, Transpose) and target.memory != "psum":
        return False
    covers = target.is_whole()
    changes = {"dst": target.ap()}
    if accumulate is not None:
        if ts.fill is not None:
            if ts.fill != 0 or not covers:
                return False
            changes["accumulate"] = False  # the accumulation group starts here: zeros are free
        else:
            changes["accumulate"] = True
    elif ts.fill is not None and not covers:
        return False
    new = copy_module.copy(instr)  # the same instruction with a new destination (checked by replace)
    for name, value in changes.items():
        object.__setattr__(new, name, value)
    try:
        b.replace(st.writer, new)
    except ProgramError:
        return False
    if ts.fill is not None:
        ts.fill = None
    ts.writes += 1
    ts.writer = st.writer
    st.writes = 0
    st.writer = -1
    return True


def assign(target: Tile, value, *, fresh, label: str = "assign") -> None:
    """``target[...] = value`` (``target`` is the indexed view)."""
    ctx = current(label)
    if isinstance(value, Tile) and value.inplace and value.buffer is target.buffer \
            and value.offset == target.offset and value.dims == target.dims:
        value.inplace = False  # the tail of ``t[i] += x``: already written in place
        return
    t = tile_operand(target, "target", label)
    if isinstance(value, Tensor):
        raise KernelError(
            f"cannot assign HBM tensor {value.buffer.name!r} into a tile; load it: t[...] = tl.load(x[...])")
    if is_scalar(value):
        _emit(ctx, Memset(t.ap(), float(value)))
        return
    v = tile_operand(value, "value", label)
    if _retarget(ctx, v, t, fresh):
        return
    copy(v, out=t, label=label)


def inplace(target: Tile, op: str, value, *, fresh, label: str) -> Tile:
    """``target (op)= value``: ``acc += <fresh matmul>`` accumulates in PSUM; else an in-place op."""
    ctx = current(label)
    t = tile_operand(target, "target", label)
    if not (op == "add" and fresh and isinstance(value, Tile) and t.memory == "psum"
            and _retarget(ctx, value, t, fresh, accumulate=True)):
        binary(op, t, value, out=t, dtype=t.dtype, label=label)
    t.inplace = True
    return t


# ---- printing --------------------------------------------------------------------------------

def device_print(prefix: str, x, *, label: str = "device_print") -> None:
    ctx = current(label)
    if not isinstance(x, View):
        raise KernelError(f"device_print prints a tile or tensor, got {type(x).__name__}")
    if isinstance(x, Tile):
        tile_operand(x, "x", label)
        st = x.state
        if st is not None and st.fill is not None:
            ctx.materialize(st)
    ap = x.ap()
    shape = x.shape
    ndt = x.buffer.dtype
    pid = ctx.launch.program_id if ctx.launch.grid else None

    def hook(read, ap=ap, shape=shape, prefix=prefix, pid=pid):
        from ..dtypes import to_numpy

        values = read(ap).reshape(shape).astype(to_numpy(ndt))
        where_ = f" [program {pid}]" if pid is not None else ""
        print(f"{prefix}{where_}", values, flush=True)

    ctx.add_hook(hook)


# ---- indexing tiles -----------------------------------------------------------------------

def _index_key(t: Tile, index):
    """A hashable description of ``t[index]`` (None when an index part is not a plain value)."""
    if t.offset.__class__ is Sym:
        return None
    parts = [t.buffer.name, t.offset, t.dims, t.pdim]
    for ix in index if isinstance(index, tuple) else (index,):
        c = ix.__class__
        if c is IndexExpr:
            if ix.const.__class__ is Sym:
                return None
            parts.append("ix")  # (cached by _expr_tile_index: its variables are new in each call of mgrid)
        elif c is slice:
            if ix.start.__class__ is Sym or ix.stop.__class__ is Sym or ix.step.__class__ is Sym:
                return None  # views at loop indices are not cached: a Sym is not hashed
            parts.append((c.__name__, ix.start, ix.stop, ix.step))
        elif c is int or ix is Ellipsis:
            parts.append(ix)
        else:
            return None
    return tuple(parts)


def tile_index(t: Tile, index) -> Tile:
    """A view of ``t``: block dims take integers (or slices); the partition dim stays axis 0.

    With ``tl.arange``/``tl.mgrid`` indices, the partition dim must be indexed by the
    expression on result axis 0 with step 1 (each partition stays in its lane).
    Views repeat in loop nests, so they are cached per trace by the index's structure.
    """
    ctx = current("index")
    if t.checks or t.axis_vars:
        return _tile_index(t, index)
    key = _index_key(t, index)
    if key is None or "ix" in key:
        return _expr_tile_index(ctx, t, index)
    hit = ctx.index_cache.get(key)
    if hit is not None:
        offset, dims, checks, axis_vars, pdim = hit
        return Tile(t.buffer, offset, dims, checks, axis_vars, pdim=pdim, state=t.state)
    view = _tile_index(t, index)
    ctx.index_cache[key] = (view.offset, view.dims, view.checks, view.axis_vars, view.pdim)
    return view


def _expr_tile_index(ctx, t: Tile, index) -> Tile:
    """``t[index]`` for an index with tl.arange / tl.mgrid expressions, maybe with loop
    indices (Syms: integers on block dims, the expressions' constants). The view is affine
    in those, so what the index's structure decides is cached (dims, checks, which result
    axes the index variables span, the offset's constant part) and the offset is summed
    again from the Syms -- each integer index still checked by the same comparisons (the
    loop's guards) as without the cache. Index variables are matched by order of first
    use: each ``tl.mgrid`` call makes new ones."""
    from ._index_expr import _int_position

    key, syms, variables = _expr_index_key(t, index)
    if key is None:
        return _tile_index(t, index)
    hit = ctx.index_cache.get(key)
    if hit is None:
        view = _tile_index(t, index)
        base = view.offset.value if view.offset.__class__ is Sym else view.offset
        base -= t.offset
        specs = []
        for d, v in syms:
            stride, size = t.dims[d]
            if v.__class__ is Sym:  # an integer index (a position: counted from the end when negative)
                base -= stride * (v.value + size if v.value < 0 else v.value)
            else:  # an index expression's constant
                base -= stride * v.const.value
            specs.append((d, stride, size))
        number = {v: k for k, v in enumerate(variables)}
        axes = tuple((number[v], a) for v, a in view.axis_vars)
        ctx.index_cache[key] = (base, view.dims, view.checks, axes, view.pdim, tuple(specs))
        return view
    base, dims, checks, axes, pdim, specs = hit
    offset = t.offset + base
    if specs:
        consts = {}
        for (d, stride, size), (_, v) in zip(specs, syms):
            if v.__class__ is Sym:
                offset = offset + stride * _int_position(v, d, size, t, t.shape)
            else:
                offset = offset + stride * v.const
                consts[d] = v.const
        checks = tuple(Check(c.dim, c.size, consts[c.dim], c.coefs) if c.dim in consts else c for c in checks)
    axis_vars = tuple(sorted((variables[k], a) for k, a in axes))
    return Tile(t.buffer, offset, dims, checks, axis_vars, pdim=pdim, state=t.state)


def _expr_index_key(t: Tile, index):
    """(key, syms, variables) for :func:`_expr_tile_index`: the index's structure with each
    loop-index value left out and index variables numbered by first use; those Sym parts as
    (dim, value); the variables in that order -- or (None, None, None) if the index is not of
    that form (it needs a tl.arange / tl.mgrid expression; no '...', no Sym slices)."""
    if t.offset.__class__ is Sym:
        return None, None, None
    parts = ["expr", t.offset, t.dims, t.pdim]  # (any buffer: the view keeps t's)
    syms = []
    number: dict = {}
    advanced = False
    for d, ix in enumerate(index if isinstance(index, tuple) else (index,)):
        c = ix.__class__
        if c is IndexExpr:
            advanced = True
            terms = tuple((number.setdefault(v, len(number)), a, k) for v, a, k in ix.terms)
            if ix.const.__class__ is Sym:
                parts.append(("E", ix.shape, terms))
                syms.append((d, ix))
            else:
                parts.append((ix.shape, ix.const, terms))
        elif c is Sym:
            parts.append(("S",))
            syms.append((d, ix))
        elif c is int:
            parts.append(ix)
        elif c is slice and ix.start.__class__ is not Sym and ix.stop.__class__ is not Sym \
                and ix.step.__class__ is not Sym:
            parts.append((c.__name__, ix.start, ix.stop, ix.step))
        else:
            return None, None, None
    if not advanced:
        return None, None, None
    return tuple(parts), syms, list(number)


def _tile_index(t: Tile, index) -> Tile:
    from ._index_expr import normalize_index, resolve_index

    if t.checks or t.axis_vars:
        raise KernelError(f"{t.describe()} was already indexed with tl.arange expressions; index the tile once")
    idx = normalize_index(index, len(t.dims), t)
    pd = t.pdim
    advanced = False
    for ix in idx:
        if ix.__class__ is IndexExpr:
            advanced = True
            break
    if not advanced:
        ix = idx[pd]
        if not isinstance(ix, slice):  # an integer partition index keeps a partition dim of 1
            i: int | Sym
            if ix.__class__ is Sym:
                i = ix
            else:
                i = int(ix.__index__()) if hasattr(ix, "__index__") and not isinstance(ix, bool) else ix
            if (isinstance(i, int) or i.__class__ is Sym) and i < 0:
                i += t.dims[pd][1]
            idx = idx[:pd] + (slice(i, i + 1) if isinstance(i, int) or i.__class__ is Sym else ix,) + idx[pd + 1:]
        r = resolve_index(t.dims, idx, what=t, shape=t.shape, normalized=True)
        pdim = sum(1 for d in r.kept if d < pd)
        return Tile(t.buffer, t.offset + r.offset, r.dims, pdim=pdim, state=t.state)
    for d in range(pd):
        if isinstance(idx[d], (IndexExpr, slice)):
            raise KernelError(f"block dim {d} of {t.describe()} (shape {t.shape}) must be indexed by an integer "
                              f"when the other dims use tl.arange / tl.mgrid")
    if not isinstance(idx[pd], IndexExpr):
        raise KernelError(f"the partition dim (dim {pd}) of {t.describe()} must be indexed by a tl.arange / "
                          f"tl.mgrid expression when the other dims are")
    r = resolve_index(t.dims, idx, what=t, shape=t.shape, normalized=True)
    for chk in r.checks:
        on_axis0 = 0
        for a, c in chk.coefs:
            if a == 0:
                on_axis0 = c
        if chk.dim == pd and (on_axis0 != 1 or len(chk.coefs) != 1):
            raise KernelError(
                f"the partition dim of {t.describe()} must be indexed as start + i_p, with i_p on the first "
                f"index axis and step 1 (each partition stays in its lane); got coefficients {dict(chk.coefs)}")
        if chk.dim != pd and on_axis0:
            raise KernelError(
                f"dim {chk.dim} of {t.describe()} is indexed by the partition index (first index axis); only "
                f"the partition dim may use it")
    return Tile(t.buffer, t.offset + r.offset, r.dims, r.checks, r.axis_vars, pdim=0, state=t.state)
