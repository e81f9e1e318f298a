"""The numerics interpreter: runs a Program on numpy arrays.

What a value *is* is computed here; how long it takes is the scheduler's job.
On-chip buffers (and HBM outputs or scratch not given by the caller) start filled
with NaN -- or the most negative integer -- so reads of never-written memory show.
Floating-point math is done in float32 (matmul accumulates in float32, as PSUM
does) and rounded to the destination's dtype on write.
"""

from __future__ import annotations

import weakref
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..dtypes import is_float, to_numpy
from ..errors import ProgramError
from ..isa import (
    ACTIVATIONS, ALU_OPS, AP, REDUCE_OPS, Activation, ActivationReduce, AffineSelect, BnAggr,
    BnStats, DmaCopy, DmaIndirect, Dropout, GpsimdCall, FindIndex8, Iota, MatchReplace8, Matmul, Max8, Memset,
    Reciprocal, ScalarTensorTensor,
    RuntimeScalar, Select,
    TensorCopy, TensorReduce, TensorScalar, TensorScalarReduce, TensorTensor, TensorTensorScan,
    Transpose,
)

__all__ = ["run_numerics", "register_gpsimd_impl", "GPSIMD_IMPLS", "poison_value"]

# name -> fn(inputs: list[np.ndarray], outputs: list[np.ndarray], attrs: dict) writing outputs in place
GPSIMD_IMPLS: dict[str, Callable] = {}


def register_gpsimd_impl(name: str, fn: Callable) -> Callable:
    """Register the numerics of a ``gpsimd_call`` implementation under ``name``."""
    GPSIMD_IMPLS[name] = fn
    return fn


def poison_value(dtype: str):
    return np.nan if is_float(dtype) else np.iinfo(to_numpy(dtype)).min


class _Memory:
    __slots__ = ("arrays", "buffers", "overwritten", "backing", "rng")

    def __init__(self, buffers, overwritten: frozenset = frozenset(), backing: dict | None = None):
        self.buffers = buffers
        self.arrays: dict[str, np.ndarray] = {}
        self.overwritten = overwritten  # first access writes every element: no poison needed
        self.backing = backing or {}  # such on-chip buffers -> memory of their physical slot
        self.rng: np.random.Generator | None = None  # the random stream of dropout instructions, made on first use

    def flat(self, name: str) -> np.ndarray:
        arr = self.arrays.get(name)
        if arr is None:
            arr = self.backing.get(name)
            if arr is None:
                b = self.buffers[name]
                if name in self.overwritten:
                    arr = np.empty(b.size, dtype=to_numpy(b.dtype))
                else:
                    arr = np.full(b.size, poison_value(b.dtype), dtype=to_numpy(b.dtype))
            self.arrays[name] = arr
        return arr

    def view(self, ap: AP) -> np.ndarray:
        arr = self.flat(ap.buffer)
        isz = arr.itemsize
        dims = ap.dims
        if all(s >= 0 for s, _ in dims):  # an ndarray over the buffer (bounds-checked by numpy)
            return np.ndarray(tuple([c for _, c in dims]), arr.dtype, arr, ap.offset * isz,
                              tuple([s * isz for s, _ in dims]))
        return as_strided(arr[ap.offset:], shape=ap.shape, strides=tuple(s * isz for s, _ in dims))

    def read(self, ap: AP) -> np.ndarray:
        """Operand values as a (P, N) float32 (or int64) array."""
        v = self.view(ap)
        v = v.astype(np.float32) if is_float(ap.dtype) else v.astype(np.int64)
        return v.reshape(ap.partitions, -1)

    def write(self, ap: AP, values: np.ndarray) -> None:
        dst = self.view(ap)
        if not is_float(ap.dtype):
            values = np.rint(values) if np.issubdtype(np.asarray(values).dtype, np.floating) else values
        dst[...] = np.asarray(values).reshape(dst.shape)


def _scalar(mem: _Memory, v, scalars: dict):
    if v is None:
        return None
    if isinstance(v, AP):
        return mem.read(v)  # (P, 1) broadcasts along the free dim
    if isinstance(v, RuntimeScalar):
        try:
            return np.float32(scalars[v.name])
        except KeyError:
            raise ProgramError(
                f"runtime scalar {v.name!r} has no value; pass scalars={{{v.name!r}: ...}}"
            ) from None
    return np.float32(v)


def _scalar_nd(mem: _Memory, v, scalars: dict, ndim: int):
    """A scalar operand shaped to broadcast against an ``ndim``-dimensional operand view."""
    if isinstance(v, AP):
        return mem.read(v).reshape((v.partitions,) + (1,) * (ndim - 1))
    return _scalar(mem, v, scalars)


def _same_f32(*aps) -> bool:
    """Zero-copy path: float32 operands of one logical shape are used as strided views
    (numpy works on them in place of (P, N) copies; same values, fewer passes)."""
    shape = aps[0].shape
    for ap in aps:
        if ap.dtype != "float32" or ap.shape != shape:
            return False
    return True


def _split_axes(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Short free axes to loop over in Python for an elementwise op on views of ``shape``.

    numpy runs its inner loop along the axis of smallest stride; on a view such as
    ``[P, n, 2]`` (x/y pairs) that axis has 2 elements and the op crawls. Slicing the
    short axes off leaves calls whose inner loops are long. Values do not change.
    """
    if len(shape) < 3:
        return ()
    short = tuple(k for k in range(1, len(shape)) if shape[k] <= 8)
    rest = [shape[k] for k in range(1, len(shape)) if k not in short]
    n = 1
    for k in short:
        n *= shape[k]
    return short if short and rest and max(rest) >= 32 and n <= 32 else ()


def _each(views: list, shape: tuple[int, ...]):
    """Tuples of sub-views of ``views`` (all of ``shape`` or broadcastable to it), split as above."""
    split = _split_axes(shape)
    if not split:
        yield views
        return
    for idx in np.ndindex(*(shape[k] for k in split)):
        out = []
        for v in views:
            if not isinstance(v, np.ndarray) or v.ndim != len(shape):
                out.append(v)
                continue
            key: list[slice | int] = [slice(None)] * v.ndim
            for k, j in zip(split, idx):
                key[k] = j if v.shape[k] > 1 else 0
            out.append(v[tuple(key)])
        yield out


def _views(mem: _Memory, *aps) -> list:
    return [mem.view(ap) for ap in aps]


def _put(dst: np.ndarray, ap: AP, r) -> None:
    if not is_float(ap.dtype):
        r = np.rint(r)
    dst[...] = r


_OVERWRITTEN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _overwritten_first(program) -> frozenset:
    """Buffers whose first access writes every element (cached per Program)."""
    hit = _OVERWRITTEN.get(program)
    if hit is None:
        seen = set(program.inputs)
        out = set()
        buffers = program.buffers
        for instr in program.instructions:
            for ap in instr.reads():
                seen.add(ap.buffer)
            for ap in instr.writes():
                if ap.buffer not in seen:
                    seen.add(ap.buffer)
                    if instr.__class__ is DmaIndirect:  # a scatter writes only the rows it names
                        continue
                    b = buffers[ap.buffer]
                    if ap.offset == 0 and ap.size == b.size and ap.contiguous_bytes() == b.nbytes:
                        out.add(ap.buffer)
        hit = _OVERWRITTEN[program] = frozenset(out)
    return hit


_POOLS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _slot_backing(program, overwritten: frozenset) -> dict:
    """Memory for on-chip buffers that are overwritten before any read: one array per
    physical slot, shared by the slot's tiles (whose lifetimes never overlap, as on the
    device). Reusing it across runs spares numpy fresh allocations; tiles that may be
    read before they are written still get fresh NaN-filled memory."""
    pool = _POOLS.get(program)
    if pool:
        try:
            return pool.pop()
        except IndexError:
            pass
    buffers = program.buffers
    backing = {}
    for slot in program.slots.values():
        members = [buffers[m] for m in slot.members if m in overwritten and m in buffers]
        if not members:
            continue
        raw = np.empty(max(b.nbytes for b in members), dtype=np.uint8)
        for b in members:
            backing[b.name] = raw[:b.nbytes].view(to_numpy(b.dtype))
    return backing


def _release(program, backing: dict) -> None:
    _POOLS.setdefault(program, []).append(backing)


def _resolve_runtime(v, scalars: dict):
    """``attrs`` of a gpsimd_call with every nested RuntimeScalar replaced by its value."""
    if isinstance(v, RuntimeScalar):
        try:
            return scalars[v.name]
        except KeyError:
            raise ProgramError(
                f"runtime scalar {v.name!r} has no value; pass scalars={{{v.name!r}: ...}}"
            ) from None
    if isinstance(v, tuple):
        return tuple(_resolve_runtime(x, scalars) for x in v)
    return v


# ALU ops that are numpy ufuncs (they can write straight into the destination view)
_UFUNCS = {name: fn for name, fn in ALU_OPS.items() if isinstance(fn, np.ufunc)}
_UFUNCS.update(divide=np.divide, power=np.power)


def _apply(op: str, a, b, reverse: bool):
    fn = ALU_OPS[op]
    return fn(b, a) if reverse else fn(a, b)


_CMP = {"<": np.less, "<=": np.less_equal, "==": np.equal, ">": np.greater, ">=": np.greater_equal,
        "!=": np.not_equal}


def _combine(op: str, acc: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``op`` of an accumulated reduction and a new one (the reduction's identity is its start)."""
    fn, _ = REDUCE_OPS[op]
    return fn(np.stack([acc, new]), axis=0)


def _scan(mem: _Memory, instr, scalars: dict) -> None:
    """tensor_tensor_scan: a running ``op1(op0(a_i, prev), b_i)`` along each partition."""
    a, b = mem.read(instr.a), mem.read(instr.b)
    prev = _scalar(mem, instr.initial, scalars)
    prev = np.broadcast_to(np.asarray(prev, dtype=np.float32).reshape(-1), (a.shape[0],)).astype(np.float32)
    out = np.empty(a.shape, dtype=np.float32)
    f0, f1 = ALU_OPS[instr.op0], ALU_OPS[instr.op1]
    with np.errstate(all="ignore"):
        if (instr.op0, instr.op1, instr.reverse0, instr.reverse1) == ("multiply", "add", False, False):
            # the linear recurrence h_i = a_i * h_{i-1} + b_i (a selective scan), column by column
            for i in range(a.shape[1]):
                prev = a[:, i] * prev + b[:, i]
                out[:, i] = prev
        else:
            for i in range(a.shape[1]):
                x = f0(prev, a[:, i]) if instr.reverse0 else f0(a[:, i], prev)
                prev = (f1(b[:, i], x) if instr.reverse1 else f1(x, b[:, i])).astype(np.float32)
                out[:, i] = prev
    mem.write(instr.dst, out)


def _exec_dma_copy(mem: _Memory, instr, scalars: dict) -> None:
    if instr.src.dtype == instr.dst.dtype:
        src = mem.view(instr.src)
        dst = mem.view(instr.dst)
        dst[...] = src.reshape(dst.shape)
    else:  # a casting DMA: through float32 (integers rounded to nearest) [isa]
        mem.write(instr.dst, mem.read(instr.src))


def _exec_dma_indirect(mem: _Memory, instr, scalars: dict) -> None:
    _indirect(mem, instr)


def _exec_max8(mem: _Memory, instr, scalars: dict) -> None:
    x = mem.read(instr.src).astype(np.float32)
    order = np.argsort(x, axis=1, kind="stable")  # NaN sorts last: the largest, as torch has it
    mem.write(instr.dst, np.take_along_axis(x, order[:, :-9:-1], axis=1))


def _exec_match_replace8(mem: _Memory, instr, scalars: dict) -> None:
    _match_replace8(mem, instr)


def _exec_find_index8(mem: _Memory, instr, scalars: dict) -> None:
    _find_index8(mem, instr)


def _exec_scalar_tensor_tensor(mem: _Memory, instr, scalars: dict) -> None:
    with np.errstate(all="ignore"):
        r = _apply(instr.op0, mem.read(instr.src), _scalar(mem, instr.scalar0, scalars), instr.reverse0)
        mem.write(instr.dst, _apply(instr.op1, np.asarray(r, np.float32), mem.read(instr.b), instr.reverse1))


def _exec_tensor_tensor(mem: _Memory, instr, scalars: dict) -> None:
    with np.errstate(all="ignore"):
        fn = ALU_OPS[instr.op]
        if _same_f32(instr.a, instr.b) and instr.a.shape == instr.dst.shape:
            uf = _UFUNCS.get(instr.op) if instr.dst.dtype == "float32" else None
            for a, b, d in _each(_views(mem, instr.a, instr.b, instr.dst), instr.dst.shape):
                if uf is not None:
                    uf(a, b, out=d)
                else:
                    _put(d, instr.dst, fn(a, b))
        else:
            mem.write(instr.dst, fn(mem.read(instr.a), mem.read(instr.b)))


def _exec_tensor_scalar(mem: _Memory, instr, scalars: dict) -> None:
    with np.errstate(all="ignore"):
        if _same_f32(instr.src) and instr.src.shape == instr.dst.shape:
            nd = len(instr.dst.dims)
            s0 = _scalar_nd(mem, instr.scalar0, scalars, nd)
            s1 = _scalar_nd(mem, instr.scalar1, scalars, nd) if instr.op1 is not None else None
            u0 = _UFUNCS.get(instr.op0) if instr.dst.dtype == "float32" else None
            u1 = _UFUNCS.get(instr.op1) if instr.op1 is not None else None
            for x, d, a, b in _each(_views(mem, instr.src, instr.dst) + [s0, s1], instr.dst.shape):
                if u0 is not None and (instr.op1 is None or u1 is not None):
                    u0(*((a, x) if instr.reverse0 else (x, a)), out=d)
                    if u1 is not None:
                        u1(*((b, d) if instr.reverse1 else (d, b)), out=d)
                    continue
                r = _apply(instr.op0, x, a, instr.reverse0)
                if instr.op1 is not None:
                    r = _apply(instr.op1, r, b, instr.reverse1)
                _put(d, instr.dst, r)
        else:
            r = _apply(instr.op0, mem.read(instr.src), _scalar(mem, instr.scalar0, scalars), instr.reverse0)
            if instr.op1 is not None:
                r = _apply(instr.op1, r, _scalar(mem, instr.scalar1, scalars), instr.reverse1)
            mem.write(instr.dst, r)


def _exec_activation(mem: _Memory, instr, scalars: dict) -> None:
    t = type(instr)
    with np.errstate(all="ignore"):
        if _same_f32(instr.src) and instr.src.shape == instr.dst.shape:
            x, nd = mem.view(instr.src), len(instr.src.dims)
        else:
            x, nd = mem.read(instr.src), 2
        scale = _scalar_nd(mem, instr.scale, scalars, nd)
        if not (isinstance(scale, np.float32) and scale == 1.0):
            x = x * scale
        bias = _scalar_nd(mem, instr.bias, scalars, nd)
        if bias is not None:
            x = x + bias
        r = ACTIVATIONS[instr.func](x).astype(np.float32, copy=False)
        if t is Activation and instr.accumulate:
            r = r + mem.read(instr.dst).reshape(r.shape)
    mem.write(instr.dst, r)
    if t is ActivationReduce:
        flat = r.reshape(instr.src.partitions, -1)
        red = REDUCE_OPS[instr.reduce_op][0](flat, axis=1, keepdims=True)
        if instr.accumulate:
            red = _combine(instr.reduce_op, mem.read(instr.reduce_dst), red)
        mem.write(instr.reduce_dst, red)


def _exec_tensor_reduce(mem: _Memory, instr, scalars: dict) -> None:
    src = mem.view(instr.src)
    src = src.astype(np.float32) if is_float(instr.src.dtype) else src.astype(np.int64)
    axes = instr.axes if instr.axes is not None else tuple(range(1, src.ndim))
    r = REDUCE_OPS[instr.op][0](src, axis=axes)
    if instr.negate:
        r = -r
    mem.write(instr.dst, r)


def _exec_tensor_copy(mem: _Memory, instr, scalars: dict) -> None:
    if instr.src.shape == instr.dst.shape and (is_float(instr.dst.dtype) or not is_float(instr.src.dtype)):
        for d, x in _each(_views(mem, instr.dst, instr.src), instr.dst.shape):
            d[...] = x
    else:
        mem.write(instr.dst, mem.view(instr.src).reshape(instr.dst.partitions, -1))


def _exec_select(mem: _Memory, instr, scalars: dict) -> None:
    if _same_f32(instr.on_true) and instr.pred.shape == instr.on_true.shape == instr.dst.shape and (
            not isinstance(instr.on_false, AP) or _same_f32(instr.on_true, instr.on_false)):
        on_false = (mem.view(instr.on_false) if isinstance(instr.on_false, AP)
                    else _scalar_nd(mem, instr.on_false, scalars, len(instr.dst.dims)))
        views = _views(mem, instr.dst, instr.pred, instr.on_true) + [on_false]
        for d, p, yes, no in _each(views, instr.dst.shape):
            _put(d, instr.dst, np.where(p != 0, yes, no))
    else:
        mem.write(instr.dst, np.where(mem.read(instr.pred) != 0, mem.read(instr.on_true),
                                      _scalar(mem, instr.on_false, scalars)))


def _exec_iota(mem: _Memory, instr, scalars: dict) -> None:
    shape = instr.dst.shape
    p = np.arange(shape[0]).reshape((-1,) + (1,) * (len(shape) - 1))
    r = instr.base + instr.partition_step * p
    steps = instr.steps or (0,) * (len(shape) - 1)
    if len(steps) != len(shape) - 1:
        raise ProgramError(f"iota steps {steps} must give one step per free dim of dst {shape}")
    for k, step in enumerate(steps, start=1):
        ix = np.arange(shape[k]).reshape((1,) * k + (-1,) + (1,) * (len(shape) - k - 1))
        r = r + step * ix
    mem.write(instr.dst, np.broadcast_to(r, shape))


def _exec_memset(mem: _Memory, instr, scalars: dict) -> None:
    mem.view(instr.dst)[...] = instr.value


def _exec_dropout(mem: _Memory, instr, scalars: dict) -> None:
    # one seeded stream per run: a Program's numerics are reproducible, draws follow program order
    if mem.rng is None:
        mem.rng = np.random.default_rng(0)
    x = mem.read(instr.src)
    mem.write(instr.dst, np.where(mem.rng.random(x.shape) < instr.prob, np.float32(0), x))


def _exec_matmul(mem: _Memory, instr, scalars: dict) -> None:
    st = mem.read(instr.stationary)
    mv = mem.read(instr.moving)
    r = st.T.astype(np.float32) @ mv.astype(np.float32)
    if instr.accumulate:
        r = r + mem.read(instr.dst)
    mem.write(instr.dst, r)


def _exec_transpose(mem: _Memory, instr, scalars: dict) -> None:
    mem.write(instr.dst, mem.read(instr.src).T)


def _exec_bn_stats(mem: _Memory, instr, scalars: dict) -> None:
    x = mem.read(instr.src).astype(np.float64)
    half = max(1, x.shape[1] // 2)
    out = []
    for part in (x[:, :half], x[:, half:]):
        n = part.shape[1]
        mean = part.mean(axis=1) if n else np.zeros(x.shape[0])
        m2 = ((part - mean[:, None]) ** 2).sum(axis=1) if n else np.zeros(x.shape[0])
        out += [np.full(x.shape[0], float(n)), mean, m2]
    mem.write(instr.dst, np.stack(out, axis=1))


def _exec_bn_aggr(mem: _Memory, instr, scalars: dict) -> None:
    s = mem.read(instr.src).astype(np.float64).reshape(instr.src.partitions, -1, 3)
    n, mean, m2 = s[..., 0], s[..., 1], s[..., 2]
    total = n.sum(axis=1)
    safe = np.where(total > 0, total, 1)
    gmean = (n * mean).sum(axis=1) / safe
    # Chan et al.: combined M2 = sum(M2_k + n_k * (mean_k - mean)^2)
    gm2 = (m2 + n * (mean - gmean[:, None]) ** 2).sum(axis=1)
    mem.write(instr.dst, np.stack([gmean, gm2 / safe], axis=1))


def _exec_tensor_tensor_scan(mem: _Memory, instr, scalars: dict) -> None:
    _scan(mem, instr, scalars)


def _exec_tensor_scalar_reduce(mem: _Memory, instr, scalars: dict) -> None:
    with np.errstate(all="ignore"):
        r = _apply(instr.op0, mem.read(instr.src), _scalar(mem, instr.scalar0, scalars), instr.reverse0)
    mem.write(instr.dst, r)
    mem.write(instr.reduce_dst, REDUCE_OPS[instr.reduce_op][0](mem.read(instr.dst), axis=1, keepdims=True))


def _exec_affine_select(mem: _Memory, instr, scalars: dict) -> None:
    shape = (instr.dst.partitions,) + tuple(num for _, num in instr.pattern)
    v = instr.base + instr.partition_step * np.arange(shape[0]).reshape((-1,) + (1,) * (len(shape) - 1))
    for k, (step, num) in enumerate(instr.pattern, start=1):
        v = v + step * np.arange(num).reshape((1,) * k + (-1,) + (1,) * (len(shape) - k - 1))
    pred = np.broadcast_to(_CMP[instr.cmp](v, 0), shape).reshape(shape[0], -1)
    mem.write(instr.dst, np.where(pred, mem.read(instr.on_true), _scalar(mem, instr.on_false, scalars)))


def _exec_reciprocal(mem: _Memory, instr, scalars: dict) -> None:
    with np.errstate(all="ignore"):
        mem.write(instr.dst, np.float32(1.0) / mem.read(instr.src))


def _exec_gpsimd_call(mem: _Memory, instr, scalars: dict) -> None:
    impl = GPSIMD_IMPLS.get(instr.impl)
    if impl is None:
        raise ProgramError(
            f"gpsimd_call {instr.name!r} uses implementation {instr.impl!r}, which is not "
            f"registered; register it with tilescope.sim.register_gpsimd_impl"
        )
    impl([mem.view(a) for a in instr.inputs], [mem.view(a) for a in instr.outputs],
         dict(_resolve_runtime(instr.attrs, scalars)))


# instruction class -> its numerics (exact class: each kind is its own row)
_EXEC: dict[type, Callable[[_Memory, object, dict], None]] = {
    DmaCopy: _exec_dma_copy,
    DmaIndirect: _exec_dma_indirect,
    Max8: _exec_max8,
    MatchReplace8: _exec_match_replace8,
    FindIndex8: _exec_find_index8,
    ScalarTensorTensor: _exec_scalar_tensor_tensor,
    TensorTensor: _exec_tensor_tensor,
    TensorScalar: _exec_tensor_scalar,
    Activation: _exec_activation,
    ActivationReduce: _exec_activation,
    TensorReduce: _exec_tensor_reduce,
    TensorCopy: _exec_tensor_copy,
    Select: _exec_select,
    Iota: _exec_iota,
    Memset: _exec_memset,
    Dropout: _exec_dropout,
    Matmul: _exec_matmul,
    Transpose: _exec_transpose,
    BnStats: _exec_bn_stats,
    BnAggr: _exec_bn_aggr,
    TensorTensorScan: _exec_tensor_tensor_scan,
    TensorScalarReduce: _exec_tensor_scalar_reduce,
    AffineSelect: _exec_affine_select,
    Reciprocal: _exec_reciprocal,
    GpsimdCall: _exec_gpsimd_call,
}


def _exec(mem: _Memory, instr, scalars: dict) -> None:
    run = _EXEC.get(type(instr))
    if run is None:  # pragma: no cover - every kind has a row in _EXEC
        raise ProgramError(f"no numerics for instruction kind {instr.KIND!r}")
    run(mem, instr, scalars)


def _match_replace8(mem: _Memory, instr) -> None:
    """Replace the first occurrence of each value (taken from the last to the first) by ``imm``."""
    data = mem.read(instr.data).astype(np.float32).copy()
    vals = mem.read(instr.vals).astype(np.float32)
    idx = np.full(vals.shape, np.iinfo(np.int32).max, dtype=np.int64)
    for p in range(data.shape[0]):
        row = data[p]
        for i in range(7, -1, -1):
            v = vals[p, i]
            hit = np.flatnonzero(np.isnan(row) if np.isnan(v) else row == v)
            if hit.size:
                idx[p, i] = hit[0]
                row[hit[0]] = instr.imm
    mem.write(instr.dst, data)
    if instr.dst_idx is not None:
        mem.write(instr.dst_idx, idx)


def _find_index8(mem: _Memory, instr) -> None:
    """The first position of each value in its partition (NaN finds NaN); absent: all ones."""
    data = mem.read(instr.data).astype(np.float32).reshape(instr.data.partitions, -1)
    vals = mem.read(instr.vals).astype(np.float32).reshape(instr.vals.partitions, 8)
    hit = (data[:, None, :] == vals[:, :, None]) | (np.isnan(data[:, None, :]) & np.isnan(vals[:, :, None]))
    found = hit.any(axis=2)
    sentinel = np.iinfo(np.dtype(to_numpy(instr.dst.dtype))).max if instr.dst.dtype.startswith("uint") else -1
    mem.write(instr.dst, np.where(found, hit.argmax(axis=2), sentinel))


def _indirect(mem: _Memory, instr: DmaIndirect) -> None:
    """Gather or scatter whole rows of the indirect operand by the index tile's values."""
    table, direct = instr.table, instr.direct
    idx = mem.read(instr.index).reshape(-1)
    row_stride, rows = table.dims[0]
    bad = (idx < 0) | (idx >= rows)
    if bad.any():
        raise ProgramError(
            f"{instr.KIND}: index {int(idx[bad][0])} is out of range for the {rows} rows of {table.buffer!r} "
            f"(valid indices are 0..{rows - 1})"
        )
    inner = np.zeros(1, dtype=np.int64)
    for stride, count in table.dims[1:]:
        inner = (inner[:, None] + stride * np.arange(count, dtype=np.int64)[None, :]).reshape(-1)
    offsets = (table.offset + idx[:, None] * row_stride + inner[None, :]).reshape(-1)
    flat = mem.flat(table.buffer)
    rows_view = mem.view(direct)
    if instr.indirect == "src":
        rows_view[...] = flat[offsets].reshape(rows_view.shape)
    else:
        flat[offsets] = np.ascontiguousarray(rows_view).reshape(-1)  # rows in order: the later of two equal indices lands


def _bind_inputs(program, inputs: dict[str, np.ndarray], mem: "_Memory", copy_inputs: bool) -> None:
    """Each input buffer's array in ``mem``: checked against the buffer's size, in its dtype,
    flat and contiguous (copied unless ``copy_inputs`` is False and no conversion is needed)."""
    for name in program.inputs:
        if name not in inputs:
            raise ProgramError(f"program {program.name!r} needs input {name!r}; got {sorted(inputs)}")
        b = program.buffers[name]
        arr = np.asarray(inputs[name])
        if arr.size != b.size:
            raise ProgramError(
                f"input {name!r} has {arr.size} elements (shape {arr.shape}); the program expects "
                f"shape {b.shape}"
            )
        want = to_numpy(b.dtype)
        if copy_inputs or arr.dtype != want or not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr, dtype=want).copy() if copy_inputs else np.ascontiguousarray(arr, dtype=want)
        mem.arrays[name] = arr.reshape(-1)


def run_numerics(program, inputs: dict[str, np.ndarray], scalars: dict | None = None, *,
                 hooks: dict[int, Callable] | None = None, copy_inputs: bool = True) -> dict[str, np.ndarray]:
    """Execute ``program`` on ``inputs`` (name -> array); return every output array.

    ``hooks`` maps an instruction index to ``fn(read)`` called after it runs, where
    ``read(ap)`` returns an operand's current values (used by ``device_print``).
    With ``copy_inputs=False`` inputs are used in place (stores into an input
    buffer land in the caller's array, if its dtype and layout allow).
    """
    overwritten = _overwritten_first(program)
    backing = _slot_backing(program, overwritten)
    mem = _Memory(program.buffers, overwritten, backing)
    scalars = scalars or {}
    _bind_inputs(program, inputs, mem, copy_inputs)
    for name in program.runtime_scalars:
        if name not in scalars:
            raise ProgramError(f"program {program.name!r} needs runtime scalar {name!r}; pass scalars={{...}}")
    hooks = hooks or {}
    with np.errstate(all="ignore"):  # NaN/inf propagate as on the device
        for i, instr in enumerate(program.instructions):
            try:
                _exec(mem, instr, scalars)
            except ProgramError:
                raise
            except Exception as e:
                raise ProgramError(
                    f"numerics of instruction #{i} ({instr.KIND}, from {program.prov_of(i).describe()}) "
                    f"failed: {type(e).__name__}: {e}"
                ) from e
            hook = hooks.get(i)
            if hook is not None:
                hook(mem.read)
    outputs = {name: mem.flat(name).reshape(program.buffers[name].shape) for name in program.outputs}
    _release(program, backing)
    return outputs
