"""Semantics of the ``tilescope.isa`` kernel calls: one instruction per call.

``tilescope.isa.<name>`` (module ``isa/_kernel_api.py``) forwards here at call
time. Operations are named as strings (``"add"``), as the language's builtins
(``tl.exp``, ``tl.maximum``, ``tl.sum``) or as numpy functions (``np.add``,
``np.exp``, ``np.max``), as in NKI. Engines: ``"vector"``, ``"scalar"``,
``"gpsimd"``, ``"tensor"`` (or the ISA ids ``dve``/``act``/``pool``/``pe``).
"""

from __future__ import annotations

from ..errors import KernelError
from ..isa import ACTIVATIONS, ALU_OPS, REDUCE_OPS
from . import _semantic as S
from ._context import builtin

__all__ = [
    "nc_matmul", "nc_transpose", "activation", "activation_reduce", "tensor_tensor", "tensor_scalar",
    "tensor_reduce", "tensor_copy", "iota", "memset", "bn_stats", "bn_aggr", "dma_copy", "select",
    "alu_name", "activation_name", "reduce_name", "engine_id",
]

ENGINES = {"vector": "dve", "dve": "dve", "scalar": "act", "act": "act", "activation": "act",
           "gpsimd": "pool", "pool": "pool", "tensor": "pe", "pe": "pe"}
# numpy function names -> ISA names (when they differ)
_NUMPY_ALU = {"true_divide": "divide", "fmod": "mod"}
_NUMPY_ACT = {"absolute": "abs", "exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh",
              "square": "square", "sin": "sin", "cos": "cos", "sign": "sign", "negative": "negative",
              "reciprocal": "reciprocal"}
_NUMPY_REDUCE = {"add": "add", "sum": "add", "max": "max", "amax": "max", "maximum": "max", "min": "min",
                 "amin": "min", "minimum": "min", "multiply": "multiply", "prod": "multiply"}


def engine_id(engine, allowed: tuple[str, ...], what: str) -> str:
    eid = ENGINES.get(str(engine).lower()) if engine is not None else allowed[0]
    if eid not in allowed:
        names = {"dve": "vector", "act": "scalar", "pool": "gpsimd", "pe": "tensor"}
        raise KernelError(f"{what} runs on {', '.join(names[e] for e in allowed)}; got engine={engine!r}")
    return eid


def _name(op) -> str:
    return getattr(op, "__name__", None) or str(op)


def alu_name(op, what: str) -> str:
    if op is None:
        return None
    name = getattr(op, "alu_op", None)
    if name is None:
        name = op if isinstance(op, str) else _NUMPY_ALU.get(_name(op), _name(op))
    if name not in ALU_OPS:
        raise KernelError(f"{what}: {op!r} is not an ALU operation; use one of {', '.join(sorted(ALU_OPS))}")
    return name


def activation_name(op, what: str) -> str:
    name = getattr(op, "act_func", None)
    if name is None:
        name = op if isinstance(op, str) else _NUMPY_ACT.get(_name(op), _name(op))
    if name not in ACTIVATIONS:
        raise KernelError(f"{what}: {op!r} is not an activation function; use one of "
                          f"{', '.join(sorted(ACTIVATIONS))}")
    return name


def reduce_name(op, what: str) -> str:
    name = getattr(op, "reduce_op", None)
    if name is None:
        alu = getattr(op, "alu_op", None)
        name = {"add": "add", "maximum": "max", "minimum": "min", "multiply": "multiply"}.get(alu) if alu else None
    if name is None:
        name = op if isinstance(op, str) else _NUMPY_REDUCE.get(_name(op))
    if name not in REDUCE_OPS:
        raise KernelError(f"{what}: {op!r} is not a reduction; use one of {', '.join(sorted(REDUCE_OPS))}")
    return name


@builtin("isa.nc_matmul")
def nc_matmul(stationary, moving, *, mask=None):
    if mask is not None:
        raise KernelError("nc_matmul does not take a mask; slice the operands instead")
    return S.nc_matmul(stationary, moving, label="nc_matmul")


@builtin("isa.nc_transpose")
def nc_transpose(data, *, dtype=None, engine=None):
    engine_id(engine if engine is not None else "tensor", ("pe",), "nc_transpose (modeled on TensorE)")
    return S.transpose(data, dtype=dtype, label="nc_transpose")


@builtin("isa.activation")
def activation(op, data, *, bias=None, scale=1.0, dtype=None, mask=None):
    return S.activation(activation_name(op, "activation"), data, dtype=dtype, mask=mask, scale=scale,
                        bias=bias, label="activation")


@builtin("isa.activation_reduce")
def activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, dtype=None, mask=None):
    return S.activation_reduce(activation_name(op, "activation_reduce"), data,
                               reduce_name(reduce_op, "activation_reduce"), reduce_res, dtype=dtype,
                               mask=mask, scale=scale, bias=bias, label="activation_reduce")


@builtin("isa.tensor_tensor")
def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, engine=None):
    return S.tensor_tensor(data1, data2, alu_name(op, "tensor_tensor"), dtype=dtype, mask=mask,
                           engine=engine_id(engine, ("dve", "pool"), "tensor_tensor"), label="tensor_tensor")


@builtin("isa.tensor_scalar")
def tensor_scalar(data, op0, operand0, *, reverse0=False, op1=None, operand1=None, reverse1=False,
                  dtype=None, mask=None, engine=None):
    if (op1 is None) != (operand1 is None):
        raise KernelError("tensor_scalar: give op1 and operand1 together")
    return S.tensor_scalar(data, alu_name(op0, "tensor_scalar"), operand0, reverse0=reverse0,
                           op1=alu_name(op1, "tensor_scalar"), operand1=operand1, reverse1=reverse1,
                           dtype=dtype, mask=mask,
                           engine=engine_id(engine, ("dve", "act", "pool"), "tensor_scalar"),
                           label="tensor_scalar")


@builtin("isa.tensor_reduce")
def tensor_reduce(op, data, axis, *, negate=False, keepdims=False, dtype=None, mask=None, engine=None):
    return S.reduce(reduce_name(op, "tensor_reduce"), data, axis, keepdims=keepdims, dtype=dtype, mask=mask,
                    negate=negate, engine=engine_id(engine, ("dve", "pool"), "tensor_reduce"),
                    label="tensor_reduce")


@builtin("isa.tensor_copy")
def tensor_copy(src, *, dtype=None, mask=None, engine=None):
    return S.copy(src, dtype=dtype, mask=mask, engine=engine_id(engine, ("dve", "act", "pool"), "tensor_copy"),
                  label="tensor_copy")


@builtin("isa.iota")
def iota(expr, dtype, *, mask=None):
    return S.iota(expr, dtype, mask=mask, label="iota")


@builtin("isa.memset")
def memset(shape, value, dtype, *, mask=None, engine=None):
    return S.memset(shape, value, dtype, mask=mask, engine=engine_id(engine, ("dve", "pool", "act"), "memset"),
                    label="memset")


@builtin("isa.bn_stats")
def bn_stats(data, *, dtype=None, mask=None):
    return S.bn_stats(data, dtype=dtype, mask=mask, label="bn_stats")


@builtin("isa.bn_aggr")
def bn_aggr(data, *, dtype=None, mask=None):
    return S.bn_aggr(data, dtype=dtype, mask=mask, label="bn_aggr")


@builtin("isa.dma_copy")
def dma_copy(*, dst, src, mask=None):
    return S.dma_copy(dst, src, mask=mask, label="dma_copy")


@builtin("isa.select")
def select(predicate, on_true, on_false, *, dtype=None, mask=None, engine=None):
    return S.select(predicate, on_true, on_false, dtype=dtype, mask=mask,
                    engine=engine_id(engine, ("dve", "pool"), "select"), label="select")
