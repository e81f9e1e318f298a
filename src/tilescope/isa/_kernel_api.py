"""Kernel-callable ISA functions: inside a tile kernel, each call emits exactly one
engine instruction (for experts who pick instructions and engines themselves).

The language binds its implementation here when it is imported (:func:`bind`:
``tilescope.isa`` sits below ``tilescope.lang`` and never imports it); each call
forwards to it. Outside a kernel each call raises an error saying so. A call that reads a ``tl.zeros`` tile
whose fill was still pending also emits that fill (one ``memset``) first.

=================  ==========================  ==================================================
call               engine                      instruction
=================  ==========================  ==================================================
nc_matmul          TensorE                     matmul into a new fp32 PSUM tile
nc_transpose       TensorE                     transpose into a new PSUM tile
activation         ScalarE                     activation: op(data * scale + bias)
activation_reduce  ScalarE                     activation_reduce (result + reduction into [P, 1])
tensor_tensor      VectorE / GpSimd            tensor_tensor
tensor_scalar      VectorE / ScalarE / GpSimd  tensor_scalar: op1(op0(data, a), b)
tensor_reduce      VectorE / GpSimd            tensor_reduce over free axes
tensor_copy        VectorE / ScalarE / GpSimd  tensor_copy (cast)
iota               GpSimd                      iota of an index expression
memset             VectorE / GpSimd / ScalarE  memset
bn_stats, bn_aggr  VectorE                     mean/variance statistics, and their combination
dma_copy           DMA queue                   dma_copy
select             VectorE / GpSimd            select
tensor_tensor_scan VectorE                     tensor_tensor_scan (a running op along each partition)
tensor_scalar_     VectorE                     tensor_scalar_reduce (result + reduction into [P, 1])
reduce
affine_select      GpSimd                      affine_select (an index predicate, e.g. a causal mask)
reciprocal         VectorE                     reciprocal
scalar_tensor_     VectorE                     scalar_tensor_tensor: op1(op0(data, s), tile)
tensor
dma_transpose      DMA queue                   dma_copy walking a 2-D HBM source column by column
max8               VectorE                     max8 (the 8 largest of each partition)
nc_find_index8     VectorE                     find_index8 (first positions of 8 values)
nc_match_replace8  VectorE                     match_replace8 (those positions overwritten)
=================  ==========================  ==================================================

Each call returns its result; given ``dst=`` (NKI's current form) it writes there.
"""

from __future__ import annotations

__all__ = [
    "nc_matmul", "nc_transpose", "activation", "activation_reduce", "tensor_tensor", "tensor_scalar",
    "tensor_reduce", "tensor_copy", "iota", "memset", "bn_stats", "bn_aggr", "dma_copy", "select",
    "tensor_tensor_scan", "tensor_scalar_reduce", "affine_select", "reciprocal", "scalar_tensor_tensor", "max8", "dma_transpose",
    "nc_find_index8", "nc_match_replace8", "engine",
]


_IMPL = None  # the tile language's implementation (tilescope.lang._isa), bound on its import


def bind(impl) -> None:
    """Called by :mod:`tilescope.lang` on import: the module these calls forward to."""
    global _IMPL
    _IMPL = impl


def _lang():
    if _IMPL is None:  # the tile language is not even imported: no kernel can be running
        from ..errors import KernelError

        raise KernelError("tilescope.isa calls work only inside a tile kernel (a @tilescope.kernel function "
                          "traced by tilescope.simulate); none is running: no kernel was ever defined")
    return _IMPL


class engine:  # noqa: N801 - the name kernels use (nisa.engine.vector)
    """Engine names for ``engine=`` arguments."""

    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"


def nc_matmul(stationary, moving, *, mask=None, dst=None, accumulate=None):
    """``stationary[K, M].T @ moving[K, N]`` into a new fp32 PSUM tile [M, N] (TensorE).

    K <= 128 (partitions), M <= 128, N <= 512. Accumulate with ``acc += nc_matmul(...)``,
    or write into ``dst`` (a PSUM tile): ``accumulate=None`` then accumulates onto an open
    accumulation group there (see :func:`tilescope.lang._semantic.nc_matmul`).
    """
    return _lang().nc_matmul(stationary, moving, mask=mask, dst=dst, accumulate=accumulate)


def nc_transpose(data, *, dtype=None, engine=None, dst=None):
    """``data[P, F].T`` into a new PSUM tile [F, P] (TensorE, F <= 128)."""
    return _lang().nc_transpose(data, dtype=dtype, engine=engine, dst=dst)


def activation(op, data, *, bias=None, scale=1.0, dtype=None, mask=None, dst=None, reduce_op=None,
               reduce_res=None, reduce_cmd=None):
    """``op(data * scale + bias)`` on ScalarE; ``scale``/``bias``: numbers or per-partition [P, 1] tiles.

    ``reduce_op``/``reduce_cmd`` reduce the output into ScalarE's accumulation registers
    (``"reset"``, ``"reset_reduce"``, ``"reduce"``, ``"idle"``); ``reduce_res`` reads them out.
    """
    return _lang().activation(op, data, bias=bias, scale=scale, dtype=dtype, mask=mask, dst=dst,
                              reduce_op=reduce_op, reduce_res=reduce_res, reduce_cmd=reduce_cmd)


def activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, dtype=None, mask=None, dst=None):
    """An activation that also reduces its result along the free dims into ``reduce_res`` [P, 1]."""
    return _lang().activation_reduce(op, data, reduce_op=reduce_op, reduce_res=reduce_res, bias=bias,
                                     scale=scale, dtype=dtype, mask=mask, dst=dst)


def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, engine=None, dst=None):
    """``op(data1, data2)`` elementwise (VectorE by default)."""
    return _lang().tensor_tensor(data1, data2, op, dtype=dtype, mask=mask, engine=engine, dst=dst)


def tensor_scalar(data, op0, operand0, *, reverse0=False, op1=None, operand1=None, reverse1=False,
                  dtype=None, mask=None, engine=None, dst=None):
    """``op1(op0(data, operand0), operand1)``; operands are numbers or per-partition [P, 1] tiles."""
    return _lang().tensor_scalar(data, op0, operand0, reverse0=reverse0, op1=op1, operand1=operand1,
                                 reverse1=reverse1, dtype=dtype, mask=mask, engine=engine, dst=dst)


def tensor_reduce(op, data, axis, *, negate=False, keepdims=False, dtype=None, mask=None, engine=None, dst=None):
    """Reduce ``data`` over free ``axis`` with ``op`` (add, max, min, multiply); ``negate`` flips the sign.
    ``dst`` may be any view of the result's elements, e.g. a ``(P, 1)`` column of a wider tile."""
    return _lang().tensor_reduce(op, data, axis, negate=negate, keepdims=keepdims, dtype=dtype, mask=mask,
                                 engine=engine, dst=dst)


def tensor_copy(src, *, dtype=None, mask=None, engine=None, dst=None):
    """A copy of ``src`` (cast to ``dtype``) in a new SBUF tile (or ``dst``)."""
    return _lang().tensor_copy(src, dtype=dtype, mask=mask, engine=engine, dst=dst)


def iota(expr=None, dtype=None, *, mask=None, dst=None, pattern=None, offset=0, channel_multiplier=0):
    """A tile holding the values of an index expression, e.g. ``tl.arange(128)[:, None] * 4`` (GpSimd);
    or ``dst`` filled with ``offset + channel_multiplier * p + sum(step * i)`` over ``pattern``."""
    return _lang().iota(expr, dtype, mask=mask, dst=dst, pattern=pattern, offset=offset,
                        channel_multiplier=channel_multiplier)


def memset(shape, value, dtype=None, *, mask=None, engine=None, dst=None):
    """A new tile of ``shape`` filled with ``value`` (or ``dst`` filled)."""
    return _lang().memset(shape, value, dtype, mask=mask, engine=engine, dst=dst)


def bn_stats(data, *, dtype=None, mask=None, dst=None):
    """Mean/variance statistics of ``data`` [P, N <= 512] per partition, as a [P, 6] tile (VectorE)."""
    return _lang().bn_stats(data, dtype=dtype, mask=mask, dst=dst)


def bn_aggr(data, *, dtype=None, mask=None, dst=None):
    """Combine ``bn_stats`` results [P, 6k] into [P, 2] = (mean, variance) (VectorE)."""
    return _lang().bn_aggr(data, dtype=dtype, mask=mask, dst=dst)


def dma_copy(*, dst, src, mask=None):
    """One DMA from ``src`` to ``dst`` (HBM <-> SBUF, or SBUF -> SBUF); dtypes must match."""
    return _lang().dma_copy(dst=dst, src=src, mask=mask)


def select(predicate, on_true, on_false, *, dtype=None, mask=None, engine=None, dst=None):
    """``on_true`` where ``predicate`` != 0, else ``on_false`` (a tile or a number)."""
    return _lang().select(predicate, on_true, on_false, dtype=dtype, mask=mask, engine=engine, dst=dst)


def tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0=False, reverse1=False, *, dtype=None, mask=None,
                       dst=None):
    """A scan along each partition: ``out[:, i] = op1(op0(data0[:, i], out[:, i-1]), data1[:, i])``, starting
    from ``initial`` (a number or a [P, 1] tile) -- e.g. ``multiply``/``add`` for a linear recurrence (VectorE)."""
    return _lang().tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0, reverse1, dtype=dtype, mask=mask,
                                      dst=dst)


def tensor_scalar_reduce(*, data, op0, operand0, reduce_op, reduce_res, reverse0=False, dtype=None, mask=None,
                         dst=None, reduce_cmd=None):
    """``op0(data, operand0)``, also reduced over the free dims into ``reduce_res`` [P, 1] (VectorE)."""
    return _lang().tensor_scalar_reduce(data=data, op0=op0, operand0=operand0, reduce_op=reduce_op,
                                        reduce_res=reduce_res, reverse0=reverse0, dtype=dtype, mask=mask, dst=dst,
                                        reduce_cmd=reduce_cmd)


def affine_select(pred=None, on_true_tile=None, on_false_value=None, *, dtype=None, mask=None, dst=None,
                  pattern=None, channel_multiplier=0, offset=0, cmp_op=None):
    """``on_true_tile`` where an affine predicate of the indices holds, else ``on_false_value`` (GpSimd):
    ``pred`` such as ``i_p >= i_f`` (a causal mask), or ``pattern``/``channel_multiplier``/``offset``."""
    return _lang().affine_select(pred, on_true_tile, on_false_value, dtype=dtype, mask=mask, dst=dst,
                                 pattern=pattern, channel_multiplier=channel_multiplier, offset=offset,
                                 cmp_op=cmp_op)


def reciprocal(data, *, dtype=None, mask=None, dst=None):
    """``1 / data`` on VectorE (8N cycles)."""
    return _lang().reciprocal(data, dtype=dtype, mask=mask, dst=dst)


def scalar_tensor_tensor(*, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, dtype=None,
                         mask=None, dst=None):
    """``op1(op0(data, operand0), operand1)`` on VectorE: ``operand0`` per partition, ``operand1`` a tile."""
    return _lang().scalar_tensor_tensor(data=data, op0=op0, operand0=operand0, op1=op1, operand1=operand1,
                                        reverse0=reverse0, reverse1=reverse1, dtype=dtype, mask=mask, dst=dst)


def dma_transpose(src, *, axes=None, dtype=None, mask=None, dst=None):
    """A 2-D HBM ``[F, P]`` into SBUF as ``[P, F]`` in one DMA."""
    return _lang().dma_transpose(src, axes=axes, dtype=dtype, mask=mask, dst=dst)


def max8(*, src, dtype=None, mask=None, dst=None):
    """The 8 largest values of each partition of ``src``, descending, into ``[P, 8]`` (VectorE)."""
    return _lang().max8(src=src, dtype=dtype, mask=mask, dst=dst)


def nc_find_index8(*, data, vals, dtype=None, mask=None, dst=None):
    """The first position of each of the 8 ``vals`` in its partition of ``data`` (uint32 [P, 8])."""
    return _lang().nc_find_index8(data=data, vals=vals, dtype=dtype, mask=mask, dst=dst)


def nc_match_replace8(*, data, vals, imm, dst_idx=None, dtype=None, mask=None, dst=None):
    """``data`` with the first occurrence of each of the 8 ``vals`` replaced by ``imm``."""
    return _lang().nc_match_replace8(data=data, vals=vals, imm=imm, dst_idx=dst_idx, dtype=dtype, mask=mask,
                                     dst=dst)
