"""Kernel-callable ISA functions: inside a tile kernel, each call emits exactly one
engine instruction (for experts who pick instructions and engines themselves).

The language is looked up when a function is called, not when this module is
imported (``tilescope.isa`` sits below ``tilescope.lang``). Outside a kernel
each call raises an error saying so. A call that reads a ``tl.zeros`` tile
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
=================  ==========================  ==================================================
"""

from __future__ import annotations

__all__ = [
    "nc_matmul", "nc_transpose", "activation", "activation_reduce", "tensor_tensor", "tensor_scalar",
    "tensor_reduce", "tensor_copy", "iota", "memset", "bn_stats", "bn_aggr", "dma_copy", "select",
    "engine",
]


def _lang():
    from ..lang import _isa

    return _isa


class engine:  # noqa: N801 - the name kernels use (nisa.engine.vector)
    """Engine names for ``engine=`` arguments."""

    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"


def nc_matmul(stationary, moving, *, mask=None):
    """``stationary[K, M].T @ moving[K, N]`` into a new fp32 PSUM tile [M, N] (TensorE).

    K <= 128 (partitions), M <= 128, N <= 512. Accumulate with ``acc += nc_matmul(...)``.
    """
    return _lang().nc_matmul(stationary, moving, mask=mask)


def nc_transpose(data, *, dtype=None, engine=None):
    """``data[P, F].T`` into a new PSUM tile [F, P] (TensorE, F <= 128)."""
    return _lang().nc_transpose(data, dtype=dtype, engine=engine)


def activation(op, data, *, bias=None, scale=1.0, dtype=None, mask=None):
    """``op(data * scale + bias)`` on ScalarE; ``scale``/``bias``: numbers or per-partition [P, 1] tiles."""
    return _lang().activation(op, data, bias=bias, scale=scale, dtype=dtype, mask=mask)


def activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, dtype=None, mask=None):
    """An activation that also reduces its result along the free dims into ``reduce_res`` [P, 1]."""
    return _lang().activation_reduce(op, data, reduce_op=reduce_op, reduce_res=reduce_res, bias=bias,
                                     scale=scale, dtype=dtype, mask=mask)


def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, engine=None):
    """``op(data1, data2)`` elementwise (VectorE by default)."""
    return _lang().tensor_tensor(data1, data2, op, dtype=dtype, mask=mask, engine=engine)


def tensor_scalar(data, op0, operand0, *, reverse0=False, op1=None, operand1=None, reverse1=False,
                  dtype=None, mask=None, engine=None):
    """``op1(op0(data, operand0), operand1)``; operands are numbers or per-partition [P, 1] tiles."""
    return _lang().tensor_scalar(data, op0, operand0, reverse0=reverse0, op1=op1, operand1=operand1,
                                 reverse1=reverse1, dtype=dtype, mask=mask, engine=engine)


def tensor_reduce(op, data, axis, *, negate=False, keepdims=False, dtype=None, mask=None, engine=None):
    """Reduce ``data`` over free ``axis`` with ``op`` (add, max, min, multiply); ``negate`` flips the sign."""
    return _lang().tensor_reduce(op, data, axis, negate=negate, keepdims=keepdims, dtype=dtype, mask=mask,
                                 engine=engine)


def tensor_copy(src, *, dtype=None, mask=None, engine=None):
    """A copy of ``src`` (cast to ``dtype``) in a new SBUF tile."""
    return _lang().tensor_copy(src, dtype=dtype, mask=mask, engine=engine)


def iota(expr, dtype, *, mask=None):
    """A tile holding the values of an index expression, e.g. ``tl.arange(128)[:, None] * 4`` (GpSimd)."""
    return _lang().iota(expr, dtype, mask=mask)


def memset(shape, value, dtype, *, mask=None, engine=None):
    """A new tile of ``shape`` filled with ``value``."""
    return _lang().memset(shape, value, dtype, mask=mask, engine=engine)


def bn_stats(data, *, dtype=None, mask=None):
    """Mean/variance statistics of ``data`` [P, N <= 512] per partition, as a [P, 6] tile (VectorE)."""
    return _lang().bn_stats(data, dtype=dtype, mask=mask)


def bn_aggr(data, *, dtype=None, mask=None):
    """Combine ``bn_stats`` results [P, 6k] into [P, 2] = (mean, variance) (VectorE)."""
    return _lang().bn_aggr(data, dtype=dtype, mask=mask)


def dma_copy(*, dst, src, mask=None):
    """One DMA from ``src`` to ``dst`` (HBM <-> SBUF, or SBUF -> SBUF); dtypes must match."""
    return _lang().dma_copy(dst=dst, src=src, mask=mask)


def select(predicate, on_true, on_false, *, dtype=None, mask=None, engine=None):
    """``on_true`` where ``predicate`` != 0, else ``on_false`` (a tile or a number)."""
    return _lang().select(predicate, on_true, on_false, dtype=dtype, mask=mask, engine=engine)
