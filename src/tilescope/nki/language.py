"""``nki.language`` (``nl``) on tilescope: NKI's language names, both API generations.

Kernels written for ``neuronxcc.nki.language`` (keyword ``mask=``/``dtype=``, tiles
returned) and for the current ``nki.language`` (positional ``dtype``) run with only
their import line changed to ``import tilescope.nki.language as nl``. Each name is the
tile language's (:mod:`tilescope.lang`), so semantics, engines and costs are those of
``docs/tile-kernels.md``; differences from hardware NKI are in ``docs/nki.md``.

A name NKI has and tilescope does not raises a ``KernelError`` at the kernel line
naming what to use instead (see :mod:`tilescope.nki._names`).

>>> import numpy as np
>>> import tilescope.nki as nki
>>> import tilescope.nki.language as nl
>>> @nki.jit
... def double(a):
...     out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
...     nl.store(out, nl.multiply(nl.load(a), 2.0))
...     return out
>>> double(np.ones((128, 64), np.float32))[0, :3]
array([2., 2., 2.], dtype=float32)
"""

from __future__ import annotations

import sys

import numpy as np

from .. import lang as _tl
from ..errors import KernelError
from ..lang.internal import binary_op, reduction_op, unary_op
from ..lang.internal import builtin as _builtin
from ..lang.internal import Memory as _Memory
from ._names import LANGUAGE_LACKS, missing as _missing

# ---- memories, dtypes, sizes -----------------------------------------------------------------

sbuf = _tl.sbuf
psum = _tl.psum
shared_hbm = _tl.shared_hbm
private_hbm = _tl.private_hbm
hbm = private_hbm  # NKI: "HBM - alias of private_hbm"
par_dim = _tl.par_dim

bool_ = "uint8"
int8, int16, int32 = "int8", "int16", "int32"
uint8, uint16, uint32 = "uint8", "uint16", "uint32"
float16, float32, bfloat16 = "float16", "float32", "bfloat16"
float8_e4m3 = float8_e4m3fn = "float8_e4m3"
float8_e5m2 = "float8_e5m2"


class fp32:  # noqa: N801 - NKI's name
    """float32 limits (``nl.fp32.min`` is the most negative finite float32, e.g. for masks)."""

    min = float(np.finfo(np.float32).min)
    max = float(np.finfo(np.float32).max)


class _TileSize:
    """NKI's ``nl.tile_size`` (NeuronCore-v2 figures; the architecture guide's limits)."""

    pmax = 128
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    psum_num_banks = 8
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    sbuf_min_align = 64  # the allocator's SBUF alignment (bytes)
    psum_min_align = 2048
    sbuf_size_bytes = sbuf_fmax_bytes = total_available_sbuf_size = 192 * 1024
    sbuf_fmax = 192 * 1024 // 4

    def __repr__(self) -> str:
        return "nl.tile_size"


tile_size = _TileSize()


def is_hbm(buffer) -> bool:
    return isinstance(buffer, _Memory) and buffer.name == "hbm"


def is_sbuf(buffer) -> bool:
    return isinstance(buffer, _Memory) and buffer.name == "sbuf"


def is_psum(buffer) -> bool:
    return isinstance(buffer, _Memory) and buffer.name == "psum"


def is_on_chip(buffer) -> bool:
    return is_sbuf(buffer) or is_psum(buffer)


def _memory(buffer):
    """``buffer=`` as a memory: NKI's allocators (``nki.compiler.sbuf.mod_alloc(...)``) allocate
    automatically here (tilescope's allocator places every tile)."""
    if buffer is None:
        return sbuf
    return getattr(buffer, "memory", buffer)


def _dt(dtype):
    return None if dtype is None else dtype


# ---- indices, loops, launch grids ------------------------------------------------------------

arange = _tl.arange
mgrid = _tl.mgrid
ds = _tl.ds
affine_range = _tl.affine_range
sequential_range = _tl.sequential_range
static_range = _tl.static_range


def program_id(axis=0):
    return _tl.program_id(axis)


def num_programs(axes=None):
    return _tl.num_programs(axes)


@_builtin("nl.program_ndim")
def program_ndim() -> int:
    from ..lang.internal import current

    return len(current("program_ndim").launch.grid)


class _GridDim(int):
    """A launch-grid size written with NKI's ``nl.nc(n)`` / ``nl.spmd_dim(...)``: its product.
    Programs run one after another on one modeled core (docs/nki.md)."""


def nc(n: int) -> _GridDim:
    """``nl.nc(n)``: n logical cores in a launch grid (here: n programs on one modeled core)."""
    return _GridDim(int(n))


def spmd_dim(*sizes) -> _GridDim:
    """``nl.spmd_dim(nl.nc(2), 2)``: a grid dimension of the product of its parts."""
    n = 1
    for s in sizes:
        n *= int(s)
    return _GridDim(n)


# ---- creation --------------------------------------------------------------------------------

def ndarray(shape, dtype, *, buffer=None, name="", address=None, **kwargs):
    return _tl.ndarray(shape, dtype, buffer=_memory(buffer), name=name or None)


def zeros(shape, dtype, *, buffer=None, name="", **kwargs):
    return _tl.zeros(shape, dtype, buffer=_memory(buffer), name=name or None)


def ones(shape, dtype, *, buffer=None, name="", **kwargs):
    return _tl.ones(shape, dtype, buffer=_memory(buffer), name=name or None)


def full(shape, fill_value, dtype, *, buffer=None, name="", **kwargs):
    return _tl.full(shape, fill_value, dtype, buffer=_memory(buffer), name=name or None)


def zeros_like(a, dtype=None, *, buffer=None, name="", **kwargs):
    return _tl.zeros_like(a, dtype=dtype, buffer=None if buffer is None else _memory(buffer))


def empty_like(a, dtype=None, *, buffer=None, name="", **kwargs):
    return _tl.empty_like(a, dtype=dtype, buffer=None if buffer is None else _memory(buffer))


def shared_constant(constant, dtype=None, **kwargs):
    return _tl.shared_constant(constant, dtype)


def shared_identity_matrix(n, dtype="uint8", dst=None, **kwargs):
    t = _tl.shared_identity_matrix(n, dtype)
    if dst is not None:
        import tilescope.isa as _isa

        return _isa.tensor_copy(t, dst=dst)
    return t


# ---- data movement ---------------------------------------------------------------------------

def load(src, dtype=None, *, mask=None, **kwargs):
    return _tl.load(src, mask=mask, dtype=dtype)


def store(dst, value, *, mask=None, **kwargs):
    return _tl.store(dst, value, mask=mask)


def load_transpose2d(src, dtype=None, *, mask=None, **kwargs):
    return _tl.load_transpose2d(src, mask=mask, dtype=dtype)


def copy(x, dtype=None, *, mask=None, **kwargs):
    return _tl.copy(x, dtype=dtype, mask=mask)


def static_cast(input_data, dtype):
    """The tile cast to ``dtype`` (a VectorE copy)."""
    return _tl.copy(input_data, dtype=dtype)


def broadcast_to(src, shape=None, dtype=None, **kwargs):
    shape = kwargs.pop("shape", shape)
    r = _tl.broadcast_to(src, tuple(shape))
    return _tl.copy(r, dtype=dtype) if dtype is not None else r


def expand_dims(data, axis):
    """A view with a new size-1 free axis (``axis`` >= 1; the partition dim stays first)."""
    shape = list(data.shape)
    axis = int(axis)
    if axis < 0:
        axis += len(shape) + 1
    if axis < 1:
        raise KernelError(f"expand_dims: axis {axis} would come before the partition dim; use axis >= 1")
    shape.insert(axis, 1)
    return data.reshape(tuple(shape))


def transpose(x, dtype=None, *, mask=None, **kwargs):
    return _tl.transpose(x, dtype=dtype)


def matmul(x, y, *, transpose_x=False, mask=None, **kwargs):
    return _tl.matmul(x, y, transpose_x=transpose_x)


def device_print(prefix, x, *, mask=None, **kwargs):
    return _tl.device_print(prefix, x)


def _no_op_scope():
    import contextlib

    return contextlib.nullcontext()


def no_reorder():
    """NKI's scheduling guard; instructions here keep program order per engine anyway."""
    return _no_op_scope()


# ---- elementwise -----------------------------------------------------------------------------

def _binary(fn):
    def op(x, y, dtype=None, *, mask=None, **kwargs):
        return fn(x, y, dtype=dtype, mask=mask)

    op.__name__ = op.__qualname__ = fn.__name__
    op.__doc__ = fn.__doc__
    op.alu_op = fn.alu_op
    return op


def _unary(fn):
    def op(x, dtype=None, *, mask=None, **kwargs):
        return fn(x, dtype=dtype, mask=mask)

    op.__name__ = op.__qualname__ = fn.__name__
    op.__doc__ = fn.__doc__
    for attr in ("act_func", "alu_op"):
        if hasattr(fn, attr):
            setattr(op, attr, getattr(fn, attr))
    return op


add = _binary(_tl.add)
subtract = _binary(_tl.subtract)
multiply = _binary(_tl.multiply)
divide = _binary(_tl.divide)
power = _binary(_tl.power)
maximum = _binary(_tl.maximum)
minimum = _binary(_tl.minimum)
equal = _binary(_tl.equal)
not_equal = _binary(_tl.not_equal)
greater = _binary(_tl.greater)
greater_equal = _binary(_tl.greater_equal)
less = _binary(_tl.less)
less_equal = _binary(_tl.less_equal)
logical_and = _binary(_tl.logical_and)
logical_or = _binary(_tl.logical_or)
logical_xor = _binary(_tl.logical_xor)
fmod = mod = _binary(binary_op("mod", "mod", "x mod y (C fmod)"))
abs_max = _binary(binary_op("abs_max", "abs_max", "max(|x|, |y|)"))
bitwise_and = _binary(binary_op("bitwise_and", "bitwise_and", "x & y (integers)"))
bitwise_or = _binary(binary_op("bitwise_or", "bitwise_or", "x | y (integers)"))
bitwise_xor = _binary(binary_op("bitwise_xor", "bitwise_xor", "x ^ y (integers)"))
left_shift = _binary(binary_op("left_shift", "left_shift", "x << y (integers)"))
right_shift = _binary(binary_op("right_shift", "right_shift", "x >> y (integers)"))

abs = _unary(_tl.abs)  # noqa: A001 - NKI's names
negative = _unary(_tl.negative)
reciprocal = _unary(_tl.reciprocal)
exp = _unary(_tl.exp)
log = _unary(_tl.log)
sqrt = _unary(_tl.sqrt)
rsqrt = _unary(_tl.rsqrt)
tanh = _unary(_tl.tanh)
sigmoid = _unary(_tl.sigmoid)
relu = _unary(_tl.relu)
gelu = _unary(_tl.gelu)
gelu_apprx_tanh = _unary(_tl.gelu_tanh)
silu = _unary(_tl.silu)
softplus = _unary(_tl.softplus)
erf = _unary(_tl.erf)
square = _unary(_tl.square)
sin = _unary(_tl.sin)
cos = _unary(_tl.cos)
sign = _unary(_tl.sign)
gelu_apprx_sigmoid = _unary(unary_op("gelu_apprx_sigmoid", "gelu_apprx_sigmoid", "x * sigmoid(1.702 x)"))
gelu_dx = _unary(unary_op("gelu_dx", "gelu_dx", "d/dx of gelu (erf form)"))
gelu_apprx_sigmoid_dx = _unary(unary_op("gelu_apprx_sigmoid_dx", "gelu_apprx_sigmoid_dx",
                                         "d/dx of x * sigmoid(1.702 x)"))
silu_dx = _unary(unary_op("silu_dx", "silu_dx", "d/dx of silu"))
erf_dx = _unary(unary_op("erf_dx", "erf_dx", "2/sqrt(pi) * exp(-x^2)"))
mish = _unary(unary_op("mish", "mish", "x * tanh(softplus(x))"))
tan = _unary(unary_op("tan", "tan", "tangent"))
arctan = _unary(unary_op("arctan", "arctan", "arc tangent"))
floor = _unary(unary_op("floor", "floor", "round down"))
ceil = _unary(unary_op("ceil", "ceil", "round up"))
trunc = _unary(unary_op("trunc", "trunc", "round toward zero"))


def logical_not(x, dtype=None, *, mask=None, **kwargs):
    """1 where ``x`` is 0, else 0 (VectorE ``tensor_scalar`` equal 0)."""
    return _tl.equal(x, 0.0, dtype=dtype, mask=mask)


def invert(x, dtype=None, *, mask=None, **kwargs):
    """Bitwise not of an integer tile (``x ^ -1`` on VectorE)."""
    return bitwise_xor(x, -1, dtype=dtype, mask=mask)


def where(condition, x, y, dtype=None, *, mask=None, **kwargs):
    return _tl.where(condition, x, y, dtype=dtype, mask=mask)


# ---- reductions ------------------------------------------------------------------------------

def _reduction(fn):
    def op(x, axis, dtype=None, *, mask=None, keepdims=False, **kwargs):
        return fn(x, axis, dtype=dtype, mask=mask, keepdims=keepdims)

    op.__name__ = op.__qualname__ = fn.__name__
    op.__doc__ = fn.__doc__
    if hasattr(fn, "reduce_op"):
        op.reduce_op = fn.reduce_op
    return op


sum = _reduction(_tl.sum)  # noqa: A001
max = _reduction(_tl.max)  # noqa: A001
min = _reduction(_tl.min)  # noqa: A001
mean = _reduction(_tl.mean)
var = _reduction(_tl.var)
prod = _reduction(reduction_op("prod", "multiply", "Product"))


def all(x, axis, dtype=None, *, mask=None, **kwargs):  # noqa: A001
    """1 where every element along ``axis`` is non-zero (a min-reduction of ``x != 0``)."""
    return _tl.min(_tl.not_equal(x, 0.0, mask=mask), axis, dtype=dtype or "uint8", mask=mask)


def softmax(x, axis=-1, dtype=None, *, compute_dtype=None, mask=None, **kwargs):
    """``exp(x - max) / sum(exp(x - max))`` over free ``axis``: a VectorE max, a ScalarE exp
    that also sums (activation_reduce), and a VectorE scale."""
    import tilescope.isa as _isa

    if mask is not None:
        raise KernelError("softmax(mask=...) is not supported; slice the tile instead")
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    ndim = len(x.shape)
    axes = tuple(a + ndim if a < 0 else a for a in axes)
    if ndim != 2 or axes != (1,):
        m = _tl.max(x, axes, keepdims=True)
        e = _tl.exp(_tl.subtract(x, m))
        return _tl.divide(e, _tl.sum(e, axes, keepdims=True), dtype=dtype)
    neg_max = _isa.tensor_reduce(np.max, x, 1, negate=True, keepdims=True, dtype="float32")
    total = _tl.ndarray((x.shape[0], 1), "float32")
    e = _isa.activation_reduce(_tl.exp, x, bias=neg_max, reduce_op=np.add, reduce_res=total)
    return _tl.multiply(e, _tl.reciprocal(total), dtype=dtype or x.dtype)


def rms_norm(x, w, axis, n, epsilon=1e-6, dtype=None, *, compute_dtype=None, mask=None, **kwargs):
    """``x / sqrt(sum(x^2, axis) / n + epsilon) * w`` (``w`` broadcast along the partitions)."""
    ss = _tl.sum(_tl.square(x, dtype="float32"), axis, keepdims=True)
    r = _tl.rsqrt(_tl.add(_tl.multiply(ss, 1.0 / float(n)), float(epsilon)))
    return _tl.multiply(_tl.multiply(x, r), w, dtype=dtype or x.dtype)


# ---- names NKI has and tilescope lacks -------------------------------------------------------

def __getattr__(name):
    _missing(sys.modules[__name__], "nl", name, LANGUAGE_LACKS)


