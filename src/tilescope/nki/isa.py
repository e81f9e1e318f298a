"""``nki.isa`` (``nisa``) on tilescope: one engine instruction per call, both API generations.

Every call accepts the ``neuronxcc.nki.isa`` form, which returns a new tile
(``t = nisa.tensor_tensor(a, b, np.add)``), and the current ``nki.isa`` form, which
writes its first argument (``nisa.tensor_tensor(dst=t, data1=a, data2=b, op=nl.add)``).
The current form is recognised by a ``dst=`` keyword or by one more leading tile
argument than the old form takes. Either way the instruction, its engine and its cost
are those of :mod:`tilescope.isa` (``docs/tile-kernels.md``).

>>> import numpy as np
>>> import tilescope.nki as nki, tilescope.nki.isa as nisa, tilescope.nki.language as nl
>>> @nki.jit
... def add(a, b):
...     out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
...     x = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
...     y = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
...     nisa.dma_copy(dst=x, src=a)
...     nisa.dma_copy(dst=y, src=b)
...     nisa.tensor_tensor(dst=x, data1=x, data2=y, op=nl.add)      # current form
...     nisa.dma_copy(dst=out, src=nisa.tensor_scalar(x, np.multiply, 0.5))   # neuronxcc form
...     return out
>>> add(np.ones((128, 8), np.float32), np.ones((128, 8), np.float32))[0, 0]
np.float32(1.0)
"""

from __future__ import annotations

import enum
import functools
import inspect
import sys

import numpy as np

import tilescope.isa as _isa

from ..errors import KernelError
from ..lang.internal import View
from ._names import ISA_LACKS, missing as _missing

# ---- configuration enums ---------------------------------------------------------------------


class engine(enum.Enum):  # noqa: N801 - NKI's names
    """Engines for ``engine=`` (``unknown``: the instruction's default engine)."""

    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


tensor_engine, vector_engine, scalar_engine = engine.tensor, engine.vector, engine.scalar
gpsimd_engine, unknown_engine = engine.gpsimd, engine.unknown


class reduce_cmd(enum.Enum):  # noqa: N801
    """ScalarE/VectorE accumulation-register commands (see ``nisa.activation``)."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):  # noqa: N801
    """Descriptor generation modes (accepted; DMA cost comes from the transfer's structure)."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):  # noqa: N801
    """Out-of-bounds DMA handling (accepted; out-of-range accesses are errors here)."""

    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):  # noqa: N801
    none = "none"
    double_row = "double_row"


class nc_version(enum.IntEnum):  # noqa: N801
    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version() -> nc_version:
    """The NeuronCore generation of the preset being traced (``TILESCOPE_PRESET``, default trn1)."""
    from ..lang.internal import maybe_current
    from ..spec import preset

    ctx = maybe_current()
    spec = ctx.b.spec if ctx is not None else preset(None)
    return nc_version(int(str(spec.generation).lstrip("v")) if str(spec.generation).lstrip("v").isdigit() else 2)


class fp32:  # noqa: N801
    """float32 limits (as ``nl.fp32``)."""

    min = -3.4028234663852886e38
    max = 3.4028234663852886e38


# ---- the two call forms ------------------------------------------------------------------------

def _leading_tiles(args) -> int:
    n = 0
    for a in args:
        if not isinstance(a, View):
            break
        n += 1
    return n


_SIGNATURES: dict = {}


def _bind(fn, args, kwargs, qualname: str):
    sig = _SIGNATURES.get(fn)
    if sig is None:
        sig = _SIGNATURES[fn] = inspect.signature(fn)
    try:
        return sig.bind(*args, **kwargs)
    except TypeError as e:
        raise KernelError(f"{qualname}: {e}; the signature here is {qualname}{sig}") from None


def _two_forms(old_lead: int, new_if=None):
    """Decorate ``new(dst, ...)``; ``old`` (given via ``.old``) is the neuronxcc signature.

    A call is the current form when it passes ``dst=``, or one more leading tile than the
    old form has (``new_if(args)`` decides instead where a later argument may be a tile too).
    """

    def deco(new_fn):
        name = new_fn.__name__
        holder = {}

        @functools.wraps(new_fn)
        def call(*args, **kwargs):
            kwargs.pop("name", None)
            is_new = new_if(args) if new_if is not None else _leading_tiles(args) > old_lead
            fn = new_fn if "dst" in kwargs or is_new else holder["old"]
            ba = _bind(fn, args, kwargs, f"nisa.{name}")
            return fn(*ba.args, **ba.kwargs)

        def old(fn):
            holder["old"] = fn
            return call

        call.old = old
        return call

    return deco


def _engine(e):
    return None if e is None or getattr(e, "name", e) == "unknown" else e


def _no_extra(qualname: str, extra: dict) -> None:
    extra = {k: v for k, v in extra.items() if v is not None}
    if extra:
        raise KernelError(f"{qualname}: argument(s) {', '.join(sorted(extra))} are not supported by tilescope")


# ---- TensorE ------------------------------------------------------------------------------------

@_two_forms(old_lead=2)
def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=None):
    """``dst (+)= stationary.T @ moving`` (accumulate inferred when None: docs/nki.md)."""
    return _isa.nc_matmul(stationary, moving, dst=dst, accumulate=accumulate)


@nc_matmul.old
def nc_matmul(stationary, moving, *, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              tile_position=(), tile_size=(), mask=None, **kwargs):
    return _isa.nc_matmul(stationary, moving, mask=mask)


@_two_forms(old_lead=1)
def nc_transpose(dst, data, engine=None):
    return _isa.nc_transpose(data, engine=_engine(engine), dst=dst)


@nc_transpose.old
def nc_transpose(data, *, mask=None, dtype=None, engine=None, **kwargs):
    return _isa.nc_transpose(data, dtype=dtype, engine=_engine(engine))


# ---- ScalarE ------------------------------------------------------------------------------------

def _cmd(c):
    return None if c is None else getattr(c, "name", c)


@_two_forms(old_lead=0)
def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=None):
    return _isa.activation(op, data, bias=bias, scale=scale, dst=dst, reduce_op=reduce_op, reduce_res=reduce_res,
                           reduce_cmd=_cmd(reduce_cmd) or "idle")


@activation.old
def activation(op, data, *, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=None, mask=None,
               dtype=None, **kwargs):
    return _isa.activation(op, data, bias=bias, scale=scale, dtype=dtype, mask=mask, reduce_op=reduce_op,
                           reduce_res=reduce_res, reduce_cmd=_cmd(reduce_cmd))


@_two_forms(old_lead=0)
def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0):
    return _isa.activation_reduce(op, data, reduce_op=reduce_op, reduce_res=reduce_res, bias=bias, scale=scale,
                                  dst=dst)


@activation_reduce.old
def activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, mask=None, dtype=None, **kwargs):
    return _isa.activation_reduce(op, data, reduce_op=reduce_op, reduce_res=reduce_res, bias=bias, scale=scale,
                                  dtype=dtype, mask=mask)


# ---- VectorE / GpSimd ---------------------------------------------------------------------------

@_two_forms(old_lead=2)
def tensor_tensor(dst, data1, data2, op, engine=None):
    return _isa.tensor_tensor(data1, data2, op, engine=_engine(engine), dst=dst)


@tensor_tensor.old
def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, engine=None, **kwargs):
    return _isa.tensor_tensor(data1, data2, op, dtype=dtype, mask=mask, engine=_engine(engine))


@_two_forms(old_lead=1)
def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, engine=None):
    return _isa.tensor_scalar(data, op0, operand0, reverse0=reverse0, op1=op1, operand1=operand1, reverse1=reverse1,
                              engine=_engine(engine), dst=dst)


@tensor_scalar.old
def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, *, dtype=None,
                  mask=None, engine=None, **kwargs):
    return _isa.tensor_scalar(data, op0, operand0, reverse0=reverse0, op1=op1, operand1=operand1, reverse1=reverse1,
                              dtype=dtype, mask=mask, engine=_engine(engine))


@_two_forms(old_lead=0)
def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False):
    return _isa.tensor_reduce(op, data, axis, negate=negate, keepdims=keepdims, dst=dst)


@tensor_reduce.old
def tensor_reduce(op, data, axis, *, mask=None, dtype=None, negate=False, keepdims=False, engine=None, **kwargs):
    return _isa.tensor_reduce(op, data, axis, negate=negate, keepdims=keepdims, dtype=dtype, mask=mask,
                              engine=_engine(engine))


@_two_forms(old_lead=1)
def tensor_copy(dst, src, engine=None):
    return _isa.tensor_copy(src, engine=_engine(engine), dst=dst)


@tensor_copy.old
def tensor_copy(src, *, mask=None, dtype=None, engine=None, **kwargs):
    return _isa.tensor_copy(src, dtype=dtype, mask=mask, engine=_engine(engine))


@_two_forms(old_lead=0)
def memset(dst, value, engine=None):
    return _isa.memset(None, value, engine=_engine(engine), dst=dst)


@memset.old
def memset(shape, value, dtype, *, mask=None, engine=None, **kwargs):
    return _isa.memset(shape, value, dtype, mask=mask, engine=_engine(engine))


@_two_forms(old_lead=0)
def iota(dst, pattern, offset=0, channel_multiplier=0):
    return _isa.iota(dst=dst, pattern=pattern, offset=offset, channel_multiplier=channel_multiplier)


@iota.old
def iota(expr, dtype, *, mask=None, **kwargs):
    return _isa.iota(expr, dtype, mask=mask)


@_two_forms(old_lead=1)
def bn_stats(dst, data):
    return _isa.bn_stats(data, dst=dst)


@bn_stats.old
def bn_stats(data, *, mask=None, dtype=None, **kwargs):
    return _isa.bn_stats(data, dtype=dtype, mask=mask)


@_two_forms(old_lead=1)
def bn_aggr(dst, data):
    return _isa.bn_aggr(data, dst=dst)


@bn_aggr.old
def bn_aggr(data, *, mask=None, dtype=None, **kwargs):
    return _isa.bn_aggr(data, dtype=dtype, mask=mask)


def _scan_is_new(args) -> bool:
    """(dst, data0, data1, initial, op0, ...) vs (data0, data1, initial, op0, ...): the fourth
    argument is ``initial`` (a tile or a number) in the current form, ``op0`` in the old one."""
    return len(args) >= 4 and isinstance(args[3], (View, int, float, np.number))


@_two_forms(old_lead=2, new_if=_scan_is_new)
def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False):
    return _isa.tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0, reverse1, dst=dst)


@tensor_tensor_scan.old
def tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0=False, reverse1=False, *, dtype=None, mask=None,
                       **kwargs):
    return _isa.tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0, reverse1, dtype=dtype, mask=mask)


@_two_forms(old_lead=1)
def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False, reduce_cmd=None,
                         reduce_init=None, reduce_res_negate=False):
    _no_extra("nisa.tensor_scalar_reduce", {"reduce_init": reduce_init, "reduce_res_negate": reduce_res_negate or None})
    if reduce_res is None:
        raise KernelError("nisa.tensor_scalar_reduce: pass reduce_res (a [P, 1] tile); VectorE's accumulation "
                          "registers are not modeled on their own")
    return _isa.tensor_scalar_reduce(data=data, op0=op0, operand0=operand0, reduce_op=reduce_op,
                                     reduce_res=reduce_res, reverse0=reverse0, dst=dst, reduce_cmd=_cmd(reduce_cmd))


@tensor_scalar_reduce.old
def tensor_scalar_reduce(*, data, op0, operand0, reduce_op, reduce_res, reverse0=False, dtype=None, mask=None,
                         **kwargs):
    return _isa.tensor_scalar_reduce(data=data, op0=op0, operand0=operand0, reduce_op=reduce_op,
                                     reduce_res=reduce_res, reverse0=reverse0, dtype=dtype, mask=mask)


@_two_forms(old_lead=0)
def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=None, offset=0):
    return _isa.affine_select(None, on_true_tile, on_false_value, dst=dst, pattern=pattern,
                              channel_multiplier=channel_multiplier, offset=offset, cmp_op=cmp_op)


@affine_select.old
def affine_select(pred, on_true_tile, on_false_value, *, mask=None, dtype=None, **kwargs):
    return _isa.affine_select(pred, on_true_tile, on_false_value, dtype=dtype, mask=mask)


@_two_forms(old_lead=1)
def reciprocal(dst, data):
    return _isa.reciprocal(data, dst=dst)


@reciprocal.old
def reciprocal(data, *, dtype=None, mask=None, **kwargs):
    return _isa.reciprocal(data, dtype=dtype, mask=mask)


@_two_forms(old_lead=0)
def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, reduce_cmd=None,
                         reduce_op=None, reduce_res=None):
    _no_extra("nisa.scalar_tensor_tensor", {"reduce_res": reduce_res})
    return _isa.scalar_tensor_tensor(data=data, op0=op0, operand0=operand0, op1=op1, operand1=operand1,
                                     reverse0=reverse0, reverse1=reverse1, dst=dst)


@scalar_tensor_tensor.old
def scalar_tensor_tensor(*, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, dtype=None,
                         mask=None, **kwargs):
    return _isa.scalar_tensor_tensor(data=data, op0=op0, operand0=operand0, op1=op1, operand1=operand1,
                                     reverse0=reverse0, reverse1=reverse1, dtype=dtype, mask=mask)


@_two_forms(old_lead=1)
def dma_transpose(dst, src, axes=None, dge_mode=None, oob_mode=None, priority=None):
    return _isa.dma_transpose(src, axes=axes, dst=dst)


@dma_transpose.old
def dma_transpose(src, *, axes=None, mask=None, dtype=None, dge_mode=None, **kwargs):
    return _isa.dma_transpose(src, axes=axes, mask=mask, dtype=dtype)


@_two_forms(old_lead=0)
def max8(dst, src):
    return _isa.max8(src=src, dst=dst)


@max8.old
def max8(*, src, dtype=None, mask=None, **kwargs):
    return _isa.max8(src=src, dtype=dtype, mask=mask)


@_two_forms(old_lead=0)
def nc_find_index8(dst, data, vals):
    return _isa.nc_find_index8(data=data, vals=vals, dst=dst)


@nc_find_index8.old
def nc_find_index8(*, data, vals, dtype=None, mask=None, **kwargs):
    return _isa.nc_find_index8(data=data, vals=vals, dtype=dtype, mask=mask)


@_two_forms(old_lead=0)
def nc_match_replace8(dst, data, vals, imm, dst_idx=None):
    return _isa.nc_match_replace8(data=data, vals=vals, imm=imm, dst_idx=dst_idx, dst=dst)


@nc_match_replace8.old
def nc_match_replace8(*, data, vals, imm, dst_idx=None, dtype=None, mask=None, **kwargs):
    return _isa.nc_match_replace8(data=data, vals=vals, imm=imm, dst_idx=dst_idx, dtype=dtype, mask=mask)


def select(predicate, on_true, on_false, *, dtype=None, mask=None, engine=None, dst=None, **kwargs):
    """tilescope's ``select`` (not an NKI name): ``on_true`` where ``predicate`` != 0."""
    return _isa.select(predicate, on_true, on_false, dtype=dtype, mask=mask, engine=_engine(engine), dst=dst)


# ---- DMA ------------------------------------------------------------------------------------------

def dma_copy(*args, dst=None, src=None, mask=None, dst_rmw_op=None, oob_mode=None, dge_mode=None, priority=None,
             engine=None, name=None):
    """One DMA ``src -> dst`` (HBM <-> SBUF or SBUF -> SBUF), either form. ``dst_rmw_op``
    (read-modify-write into HBM) is not modeled."""
    if args:
        if len(args) > 2 or (len(args) == 2 and (dst is not None or src is not None)):
            raise KernelError("nisa.dma_copy takes (dst, src)")
        dst, src = (args + (src,))[:2] if len(args) == 1 else args
    if dst_rmw_op is not None:
        raise KernelError("nisa.dma_copy(dst_rmw_op=...) is not supported by tilescope: load dst, combine with "
                          "nisa.tensor_tensor and store")
    return _isa.dma_copy(dst=dst, src=src, mask=mask)


def __getattr__(name):
    _missing(sys.modules[__name__], "nisa", name, ISA_LACKS)
