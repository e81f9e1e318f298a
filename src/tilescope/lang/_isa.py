"""Semantics of the ``tilescope.isa`` kernel calls: one instruction per call.

``tilescope.isa.<name>`` (module ``isa/_kernel_api.py``) forwards here at call
time. Operations are named as strings (``"add"``), as the language's builtins
(``tl.exp``, ``tl.maximum``, ``tl.sum``) or as numpy functions (``np.add``,
``np.exp``, ``np.max``), as in NKI. Engines: ``"vector"``, ``"scalar"``,
``"gpsimd"``, ``"tensor"`` (or the ISA ids ``dve``/``act``/``pool``/``pe``, or any
object whose ``name`` is one of those, such as NKI's ``nisa.engine.vector``).

Every call returns its result tile; given ``dst=`` (a tile or a view of one, NKI's
current form) it writes there instead and returns ``dst``.
"""

from __future__ import annotations

from ..errors import KernelError
from ..isa import ACTIVATIONS, ALU_OPS, REDUCE_OPS
from . import _isa_ops as O
from . import _semantic as S
from ._context import builtin

__all__ = [
    "nc_matmul", "nc_transpose", "activation", "activation_reduce", "tensor_tensor", "tensor_scalar",
    "tensor_reduce", "tensor_copy", "iota", "memset", "bn_stats", "bn_aggr", "dma_copy", "select",
    "tensor_tensor_scan", "tensor_scalar_reduce", "affine_select", "reciprocal", "scalar_tensor_tensor", "max8", "nc_find_index8", "dma_transpose",
    "nc_match_replace8", "alu_name", "activation_name", "reduce_name", "engine_id", "cmp_symbol",
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
    name = getattr(engine, "name", engine)  # an enum member (nisa.engine.vector) or a string
    if engine is None or str(name).lower() == "unknown":
        return allowed[0]
    eid = ENGINES.get(str(name).lower())
    if eid not in allowed:
        names = {"dve": "vector", "act": "scalar", "pool": "gpsimd", "pe": "tensor"}
        raise KernelError(f"{what} runs on {', '.join(names[e] for e in allowed)}; got engine={engine!r}")
    return eid


def _name(op) -> str:
    return getattr(op, "__name__", None) or str(op)


def alu_name(op, what: str) -> str | None:
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


def cmp_symbol(op, what: str) -> str:
    """The comparison an ALU op names (``nl.equal`` -> ``==``), for affine_select."""
    name = alu_name(op, what)
    sym = O._CMP_OF_ALU.get(name) if name is not None else None
    if sym is None:
        raise KernelError(f"{what}: cmp_op must be a comparison (equal, not_equal, greater, greater_equal, "
                          f"less, less_equal); got {op!r}")
    return sym


def _cmd(reduce_cmd) -> str:
    name = str(getattr(reduce_cmd, "name", reduce_cmd) or "idle")
    return name.rsplit(".", 1)[-1]


@builtin("isa.nc_matmul")
def nc_matmul(stationary, moving, *, mask=None, dst=None, accumulate=None):
    if mask is not None:
        raise KernelError("nc_matmul does not take a mask; slice the operands instead")
    return S.nc_matmul(stationary, moving, label="nc_matmul", out=dst, accumulate=accumulate)


@builtin("isa.nc_transpose")
def nc_transpose(data, *, dtype=None, engine=None, dst=None):
    engine_id(engine if engine is not None else "tensor", ("pe",), "nc_transpose (modeled on TensorE)")
    return S.transpose(data, dtype=dtype, label="nc_transpose", out=dst)


@builtin("isa.activation")
def activation(op, data, *, bias=None, scale=1.0, dtype=None, mask=None, dst=None, reduce_op=None,
               reduce_res=None, reduce_cmd=None):
    """``op(data * scale + bias)``; ``reduce_cmd`` drives ScalarE's accumulation registers."""
    cmd = _cmd(reduce_cmd)
    if reduce_cmd is None and reduce_op is not None and reduce_res is not None:
        cmd = "reset_reduce"  # a reduction asked for with nowhere else to go: this output's
    return O.activation_cmd(activation_name(op, "activation"), data, bias=bias, scale=scale,
                            reduce_op=None if reduce_op is None else reduce_name(reduce_op, "activation"),
                            reduce_res=reduce_res, reduce_cmd=cmd, dtype=dtype, mask=mask, out=dst)


@builtin("isa.activation_reduce")
def activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, dtype=None, mask=None, dst=None):
    return S.activation_reduce(activation_name(op, "activation_reduce"), data,
                               reduce_name(reduce_op, "activation_reduce"), reduce_res, dtype=dtype,
                               mask=mask, scale=scale, bias=bias, label="activation_reduce", out=dst)


@builtin("isa.tensor_tensor")
def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, engine=None, dst=None):
    return S.tensor_tensor(data1, data2, alu_name(op, "tensor_tensor"), dtype=dtype, mask=mask,
                           engine=engine_id(engine, ("dve", "pool"), "tensor_tensor"), label="tensor_tensor",
                           out=dst)


@builtin("isa.tensor_scalar")
def tensor_scalar(data, op0, operand0, *, reverse0=False, op1=None, operand1=None, reverse1=False,
                  dtype=None, mask=None, engine=None, dst=None):
    if (op1 is None) != (operand1 is None):
        raise KernelError("tensor_scalar: give op1 and operand1 together")
    return S.tensor_scalar(data, alu_name(op0, "tensor_scalar"), operand0, reverse0=reverse0,
                           op1=alu_name(op1, "tensor_scalar"), operand1=operand1, reverse1=reverse1,
                           dtype=dtype, mask=mask,
                           engine=engine_id(engine, ("dve", "act", "pool"), "tensor_scalar"),
                           label="tensor_scalar", out=dst)


@builtin("isa.tensor_reduce")
def tensor_reduce(op, data, axis, *, negate=False, keepdims=False, dtype=None, mask=None, engine=None, dst=None):
    return S.reduce(reduce_name(op, "tensor_reduce"), data, axis, keepdims=keepdims, dtype=dtype, mask=mask,
                    negate=negate, engine=engine_id(engine, ("dve", "pool"), "tensor_reduce"),
                    label="tensor_reduce", out=dst)


@builtin("isa.tensor_copy")
def tensor_copy(src, *, dtype=None, mask=None, engine=None, dst=None):
    return S.copy(src, dtype=dtype, mask=mask, engine=engine_id(engine, ("dve", "act", "pool"), "tensor_copy"),
                  label="tensor_copy", out=dst)


@builtin("isa.iota")
def iota(expr, dtype=None, *, mask=None, dst=None, pattern=None, offset=0, channel_multiplier=0):
    """Index values: of an index expression ``expr``, or (NKI's current form) ``offset +
    channel_multiplier * p + sum(step * i)`` over ``pattern`` written into ``dst``."""
    if pattern is not None:
        if dst is None:
            raise KernelError("iota(pattern=...) writes dst=; pass the tile to fill")
        return O.iota_pattern(dst, pattern, offset, channel_multiplier)
    if dtype is None and dst is None:
        raise KernelError("iota(expr, dtype) needs a dtype")
    return S.iota(expr, dtype if dtype is not None else dst.dtype, mask=mask, label="iota", out=dst)


@builtin("isa.memset")
def memset(shape, value, dtype=None, *, mask=None, engine=None, dst=None):
    return S.memset(dst if dst is not None else shape, value, dtype, mask=mask,
                    engine=engine_id(engine, ("dve", "pool", "act"), "memset"), label="memset")


@builtin("isa.bn_stats")
def bn_stats(data, *, dtype=None, mask=None, dst=None):
    return S.bn_stats(data, dtype=dtype, mask=mask, label="bn_stats", out=dst)


@builtin("isa.bn_aggr")
def bn_aggr(data, *, dtype=None, mask=None, dst=None):
    return S.bn_aggr(data, dtype=dtype, mask=mask, label="bn_aggr", out=dst)


@builtin("isa.dma_copy")
def dma_copy(*, dst, src, mask=None):
    return S.dma_copy(dst, src, mask=mask, label="dma_copy")


@builtin("isa.select")
def select(predicate, on_true, on_false, *, dtype=None, mask=None, engine=None, dst=None):
    return S.select(predicate, on_true, on_false, dtype=dtype, mask=mask,
                    engine=engine_id(engine, ("dve", "pool"), "select"), label="select", out=dst)


@builtin("isa.tensor_tensor_scan")
def tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0=False, reverse1=False, *, dtype=None, mask=None,
                       dst=None):
    return O.tensor_tensor_scan(data0, data1, initial, alu_name(op0, "tensor_tensor_scan"),
                                alu_name(op1, "tensor_tensor_scan"), reverse0=reverse0, reverse1=reverse1,
                                dtype=dtype, mask=mask, out=dst)


@builtin("isa.tensor_scalar_reduce")
def tensor_scalar_reduce(*, data, op0, operand0, reduce_op, reduce_res, reverse0=False, dtype=None, mask=None,
                         dst=None, reduce_cmd=None):
    cmd = _cmd(reduce_cmd) if reduce_cmd is not None else "reset_reduce"
    if cmd != "reset_reduce":
        raise KernelError(f"tensor_scalar_reduce: reduce_cmd={cmd} is not supported; reduce into reduce_res "
                          f"(reset_reduce) and combine partial results with tensor_tensor")
    return O.tensor_scalar_reduce(data, alu_name(op0, "tensor_scalar_reduce"), operand0,
                                  reduce_name(reduce_op, "tensor_scalar_reduce"), reduce_res, reverse0=reverse0,
                                  dtype=dtype, mask=mask, out=dst)


@builtin("isa.affine_select")
def affine_select(pred=None, on_true_tile=None, on_false_value=None, *, dtype=None, mask=None, dst=None,
                  pattern=None, channel_multiplier=0, offset=0, cmp_op=None):
    """``on_true_tile`` where an affine predicate of the indices holds, else ``on_false_value``:
    ``pred`` a comparison of index expressions, or NKI's ``pattern``/``channel_multiplier``/``offset``
    compared with 0 by ``cmp_op`` (default equal)."""
    if pattern is not None:
        return O.affine_select_pattern(on_true_tile, on_false_value, pattern, channel_multiplier, offset,
                                       cmp_symbol(cmp_op if cmp_op is not None else "equal", "affine_select"),
                                       out=dst)
    return O.affine_select(pred, on_true_tile, on_false_value, dtype=dtype, mask=mask, out=dst)


@builtin("isa.scalar_tensor_tensor")
def scalar_tensor_tensor(*, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, dtype=None,
                         mask=None, dst=None):
    return O.scalar_tensor_tensor(data, alu_name(op0, "scalar_tensor_tensor"), operand0,
                                  alu_name(op1, "scalar_tensor_tensor"), operand1, reverse0=reverse0,
                                  reverse1=reverse1, dtype=dtype, mask=mask, out=dst)


@builtin("isa.dma_transpose")
def dma_transpose(src, *, axes=None, dtype=None, mask=None, dst=None):
    """A 2-D HBM ``[F, P]`` into SBUF as ``[P, F]`` by one DMA that walks the source column by
    column (every element its own descriptor run: priced so)."""
    from ._values import Tensor

    if axes is not None and tuple(axes) != (1, 0):
        raise KernelError(f"dma_transpose: axes={tuple(axes)} is not supported by tilescope; a 2-D transpose "
                          f"(axes (1, 0)) is -- permute 3-D/4-D tiles with nl.mgrid indexing and nisa.tensor_copy")
    if not isinstance(src, Tensor):
        raise KernelError("dma_transpose of an on-chip tile is not supported by tilescope; transpose it on TensorE "
                          "with nisa.nc_transpose, or dma_transpose its HBM source")
    return O.load_transpose2d(src, mask=mask, dtype=dtype, label="dma_transpose", out=dst)


@builtin("isa.max8")
def max8(*, src, dtype=None, mask=None, dst=None):
    return O.max8(src, dtype=dtype, mask=mask, out=dst)


@builtin("isa.nc_find_index8")
def nc_find_index8(*, data, vals, dtype=None, mask=None, dst=None):
    return O.find_index8(data, vals, dtype=dtype, mask=mask, out=dst)


@builtin("isa.nc_match_replace8")
def nc_match_replace8(*, data, vals, imm, dst_idx=None, dtype=None, mask=None, dst=None):
    return O.match_replace8(data, vals, imm, dst_idx=dst_idx, dtype=dtype, mask=mask, out=dst)


@builtin("isa.reciprocal")
def reciprocal(data, *, dtype=None, mask=None, dst=None):
    return O.reciprocal(data, dtype=dtype, mask=mask, out=dst)
