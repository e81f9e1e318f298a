"""The builtins of the tile language: what a kernel calls.

Each builtin checks it runs inside a kernel, records the caller's source line as
the provenance of what it emits, and leaves the rules to
:mod:`tilescope.lang._semantic`. Which engine runs what:

==================================================  ==========  ==========================
builtins                                            engine      instruction
==================================================  ==========  ==========================
load, store                                         DMA queues  dma_copy
add ... logical_xor, maximum, minimum, negative,    VectorE     tensor_tensor /
abs, where, copy, sum/max/min/mean (free axes)                  tensor_scalar / select /
                                                                tensor_copy / tensor_reduce
var (2-D tile, last axis)                           VectorE     bn_stats + bn_aggr
exp, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu,   ScalarE     activation
silu, softplus, erf, square, sin, cos, sign, ...
matmul, transpose                                   TensorE     matmul / transpose (PSUM)
zeros, ones, full (when first read)                 VectorE     memset
==================================================  ==========  ==========================
"""

from __future__ import annotations

from ..errors import KernelError
from . import _isa_ops as O
from . import _semantic as S
from ._analysis import fresh_lines
from ._context import builtin, current
from ._loops import loop_range
from ._types import Memory, sbuf
from ._values import Tensor, Tile, View

__all__ = [
    "load", "store", "ndarray", "zeros", "ones", "full", "zeros_like", "empty_like", "copy",
    "broadcast_to", "add", "subtract", "multiply", "divide", "power", "maximum", "minimum",
    "equal", "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and",
    "logical_or", "logical_xor", "negative", "abs", "reciprocal", "exp", "log", "sqrt", "rsqrt",
    "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "softplus", "erf", "square", "sin",
    "cos", "sign", "sum", "max", "min", "mean", "var", "matmul", "transpose", "where",
    "affine_range", "sequential_range", "static_range", "program_id", "num_programs",
    "device_print", "tile_view", "ds", "load_transpose2d", "shared_constant", "shared_identity_matrix",
]


# ---- moving data --------------------------------------------------------------------

@builtin("tl.load")
def load(src, *, mask=None, dtype=None) -> Tile:
    """Copy ``src`` (an HBM tensor view) into a new SBUF tile of its shape, by DMA.

    The first dimension of the view becomes the partition dimension (at most 128).
    ``mask`` narrows the copy to an index box (``mask=(i * 128 + i_p < n)`` for a
    ragged last tile); ``dtype`` makes a tile of that dtype, the DMA casting on the way.

    Example (inside a kernel)::

        i_p, i_f = tl.mgrid[0:128, 0:512]
        t = tl.load(x[i * 128 + i_p, i_f], mask=(i * 128 + i_p < x.shape[0]))
    """
    return S.load(src, mask=mask, dtype=dtype)


@builtin("tl.store")
def store(dst, value, *, mask=None) -> None:
    """Copy ``value`` (an SBUF tile) into ``dst`` (an HBM tensor view), by DMA.

    The DMA casts when the dtypes differ (through float32, as NKI's ``dma_copy``); a PSUM
    tile is first copied to SBUF on VectorE (DMA does not read PSUM), as NKI does.
    A store into a kernel argument is written back into the caller's array.
    """
    return S.store(dst, value, mask=mask)


def _alloc(shape, dtype, buffer, name, label, fill=None):
    ctx = current(label)
    if not isinstance(buffer, Memory):
        raise KernelError(f"buffer= takes tl.sbuf, tl.psum, tl.hbm, tl.shared_hbm or tl.private_hbm; got {buffer!r}")
    if buffer.name == "hbm":
        if fill is not None:
            raise KernelError(
                f"{label}() cannot fill an HBM tensor: engines do not write HBM. Create it with tl.ndarray and "
                f"store filled tiles into it")
        return S.new_tensor(ctx, shape, dtype, buffer, label=label, name=name)
    t = S.new_tile(ctx, shape, dtype, buffer, label=label, name=name, temp=False)
    if fill is not None:
        t.state.fill = float(fill)
        t.state.fill_prov = ctx.b.current_provenance
    return t


@builtin("tl.ndarray")
def ndarray(shape, dtype, *, buffer=sbuf, name: str | None = None):
    """A new uninitialised buffer: an SBUF/PSUM tile, or an HBM tensor (``buffer=tl.hbm``).

    Unwritten on-chip memory reads as NaN in the simulator. ``tl.par_dim`` marks the
    partition dimension when block dimensions come first.
    """
    return _alloc(shape, dtype, buffer, name, "ndarray")


@builtin("tl.zeros")
def zeros(shape, dtype, *, buffer=sbuf, name: str | None = None):
    """A new tile filled with 0 (a ``memset``, emitted only if the zeros are read:
    ``acc += tl.matmul(...)`` into fresh zeros starts a PSUM accumulation instead)."""
    return _alloc(shape, dtype, buffer, name, "zeros", fill=0.0)


@builtin("tl.ones")
def ones(shape, dtype, *, buffer=sbuf, name: str | None = None):
    """A new tile filled with 1."""
    return _alloc(shape, dtype, buffer, name, "ones", fill=1.0)


@builtin("tl.full")
def full(shape, fill_value, dtype, *, buffer=sbuf, name: str | None = None):
    """A new tile filled with ``fill_value``."""
    return _alloc(shape, dtype, buffer, name, "full", fill=float(fill_value))


@builtin("tl.zeros_like")
def zeros_like(x, *, dtype=None, buffer=None):
    """Zeros with ``x``'s shape (and dtype, memory unless given)."""
    return _alloc(x.shape, dtype or x.dtype, buffer or _memory_of(x), None, "zeros_like", fill=0.0)


@builtin("tl.empty_like")
def empty_like(x, *, dtype=None, buffer=None):
    """An uninitialised buffer with ``x``'s shape (and dtype, memory unless given)."""
    return _alloc(x.shape, dtype or x.dtype, buffer or _memory_of(x), None, "empty_like")


def _memory_of(x) -> Memory:
    from . import _types

    if not isinstance(x, View):
        raise KernelError(f"expected a tile or tensor, got {type(x).__name__}")
    return {"sbuf": _types.sbuf, "psum": _types.psum}.get(x.buffer.memory, _types.hbm)


@builtin("tl.copy")
def copy(x, *, dtype=None, mask=None) -> Tile:
    """A new SBUF tile with ``x``'s values, cast to ``dtype`` (VectorE ``tensor_copy``).

    The way out of PSUM: ``res = tl.copy(psum_tile, dtype=tl.bfloat16)``.
    """
    return S.copy(x, dtype=dtype, mask=mask)


@builtin("tl.broadcast_to")
def broadcast_to(x, shape):
    """``x`` repeating its size-1 dims. Free dims of a tile (and any dim of an HBM tensor)
    broadcast as a view, no copy; a one-partition tile broadcast across partitions is a new
    SBUF tile made on TensorE (a matmul with a ones row, as NKI does: priced and visible)."""
    if isinstance(x, Tile) and x.shape[0] == 1 and tuple(shape)[:1] != (1,):
        return S.partition_broadcast(x, tuple(shape), label="broadcast_to")
    if isinstance(x, (Tensor, Tile)):
        return x.broadcast_to(shape)
    raise KernelError(f"broadcast_to takes a tile or tensor, got {type(x).__name__}")


def ds(start, size) -> slice:
    """``slice(start, start + size)``: NKI's dynamic-slice helper (``x[tl.ds(i * 128, 128), :]``)."""
    return slice(start, start + size)


@builtin("tl.load_transpose2d")
def load_transpose2d(src, *, mask=None, dtype=None) -> Tile:
    """HBM ``[F, P]`` into a new SBUF tile ``[P, F]``, transposed by the DMA (each element its
    own chunk: slow for large tiles, as on hardware; ``nc_transpose`` on TensorE is the fast way)."""
    return O.load_transpose2d(src, mask=mask, dtype=dtype)


@builtin("tl.shared_constant")
def shared_constant(constant, dtype=None) -> Tensor:
    """An HBM tensor holding ``constant`` (a numpy array or ``.npy`` path), fed on every run."""
    return O.shared_constant(constant, dtype)


@builtin("tl.shared_identity_matrix")
def shared_identity_matrix(n: int, dtype="uint8") -> Tile:
    """An ``n x n`` identity matrix in a new SBUF tile (loaded by DMA from a constant in HBM)."""
    import numpy as np

    return S.load(O.shared_constant(np.eye(int(n)), dtype), label="shared_identity_matrix")


# ---- elementwise: VectorE ALU ops --------------------------------------------------------

def _binary(name: str, op: str, what: str):
    def fn(x, y, *, dtype=None, mask=None):
        return S.binary(op, x, y, dtype=dtype, mask=mask, label=name)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"{what}, elementwise, on VectorE (``tensor_tensor``; ``tensor_scalar`` when one side is a "
                  f"number or a per-partition ``(P,)``/``(P, 1)`` tile). Free dims broadcast as in numpy; "
                  f"{'the result is uint8 0/1 unless dtype= says otherwise' if op in S.COMPARISONS else 'the result dtype promotes (fp32 wins)'}.")
    fn.__dict__["alu_op"] = op  # read back by _isa (a function attribute mypy cannot see)
    return builtin(f"tl.{name}")(fn)


# name -> (ALU op, what it computes)
_BINARY = {
    "add": ("add", "x + y"), "subtract": ("subtract", "x - y"), "multiply": ("multiply", "x * y"),
    "divide": ("divide", "x / y"), "power": ("power", "x ** y"), "maximum": ("maximum", "max(x, y)"),
    "minimum": ("minimum", "min(x, y)"), "equal": ("equal", "x == y"), "not_equal": ("not_equal", "x != y"),
    "greater": ("greater", "x > y"), "greater_equal": ("greater_equal", "x >= y"), "less": ("less", "x < y"),
    "less_equal": ("less_equal", "x <= y"), "logical_and": ("logical_and", "x and y (non-zero is true)"),
    "logical_or": ("logical_or", "x or y"), "logical_xor": ("logical_xor", "x xor y"),
}
add = _binary("add", *_BINARY["add"])
subtract = _binary("subtract", *_BINARY["subtract"])
multiply = _binary("multiply", *_BINARY["multiply"])
divide = _binary("divide", *_BINARY["divide"])
power = _binary("power", *_BINARY["power"])
maximum = _binary("maximum", *_BINARY["maximum"])
minimum = _binary("minimum", *_BINARY["minimum"])
equal = _binary("equal", *_BINARY["equal"])
not_equal = _binary("not_equal", *_BINARY["not_equal"])
greater = _binary("greater", *_BINARY["greater"])
greater_equal = _binary("greater_equal", *_BINARY["greater_equal"])
less = _binary("less", *_BINARY["less"])
less_equal = _binary("less_equal", *_BINARY["less_equal"])
logical_and = _binary("logical_and", *_BINARY["logical_and"])
logical_or = _binary("logical_or", *_BINARY["logical_or"])
logical_xor = _binary("logical_xor", *_BINARY["logical_xor"])


@builtin("tl.negative")
def negative(x, *, dtype=None, mask=None) -> Tile:
    """``-x`` (VectorE ``tensor_scalar`` multiply by -1)."""
    return S.unary_alu("multiply", -1.0, x, dtype=dtype, mask=mask, label="negative")


@builtin("tl.abs")
def abs(x, *, dtype=None, mask=None) -> Tile:  # noqa: A001 - the language's name
    """``|x|`` (VectorE ``tensor_scalar`` abs_max with 0)."""
    return S.unary_alu("abs_max", 0.0, x, dtype=dtype, mask=mask, label="abs")


@builtin("tl.reciprocal")
def reciprocal(x, *, dtype=None, mask=None) -> Tile:
    """``1 / x`` (VectorE ``tensor_scalar`` divide, reversed: cheaper than ScalarE's 8N-cycle reciprocal)."""
    ctx = current("reciprocal")
    t = S.tile_operand(x, "x", "reciprocal")
    dst = S.new_tile(ctx, t.shape, S._dtype(dtype) or t.dtype, label="reciprocal")
    from ..isa import TensorScalar

    aps = S._aps(S._box(mask, (dst, t)), (dst, t))
    if aps is not None:
        ctx.emit(TensorScalar(aps[0], aps[1], "divide", 1.0, reverse0=True))
    return dst


# ---- elementwise: ScalarE activation functions ---------------------------------------------

def _unary(name: str, func: str, what: str):
    def fn(x, *, dtype=None, mask=None):
        return S.activation(func, x, dtype=dtype, mask=mask, label=name)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"{what}, elementwise, on ScalarE (one ``activation`` instruction, function {func!r})."
    fn.__dict__["act_func"] = func  # read back by _isa (a function attribute mypy cannot see)
    return builtin(f"tl.{name}")(fn)


exp = _unary("exp", "exp", "e ** x")
log = _unary("log", "log", "natural logarithm")
sqrt = _unary("sqrt", "sqrt", "square root")
rsqrt = _unary("rsqrt", "rsqrt", "1 / sqrt(x)")
tanh = _unary("tanh", "tanh", "hyperbolic tangent")
sigmoid = _unary("sigmoid", "sigmoid", "1 / (1 + exp(-x))")
relu = _unary("relu", "relu", "max(x, 0)")
gelu = _unary("gelu", "gelu", "x * Phi(x) (exact, erf form)")
gelu_tanh = _unary("gelu_tanh", "gelu_tanh", "GELU, tanh approximation")
silu = _unary("silu", "silu", "x * sigmoid(x)")
softplus = _unary("softplus", "softplus", "log(1 + exp(x))")
erf = _unary("erf", "erf", "the error function")
square = _unary("square", "square", "x * x")
sin = _unary("sin", "sin", "sine")
cos = _unary("cos", "cos", "cosine")
sign = _unary("sign", "sign", "-1, 0 or 1")


# ---- reductions ---------------------------------------------------------------------------

def _reduction(name: str, op: str, what: str):
    def fn(x, axis, *, dtype=None, mask=None, keepdims=False):
        return S.reduce(op, x, axis, keepdims=keepdims, dtype=dtype, mask=mask, label=name)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"{what} over free ``axis`` (an int or tuple; never 0, the partition dim), on VectorE "
                  f"(``tensor_reduce``). Reduced dims are dropped unless ``keepdims``; a result with only the "
                  f"partition dim left, shape ``(P,)``, broadcasts as a per-partition scalar.")
    fn.__dict__["reduce_op"] = op  # read back by _isa (a function attribute mypy cannot see)
    return builtin(f"tl.{name}")(fn)


sum = _reduction("sum", "add", "Sum")  # noqa: A001 - the language's names
max = _reduction("max", "max", "Maximum")  # noqa: A001
min = _reduction("min", "min", "Minimum")  # noqa: A001


@builtin("tl.mean")
def mean(x, axis, *, dtype=None, mask=None, keepdims=False) -> Tile:
    """Mean over free ``axis`` (``tensor_reduce`` then a scale on VectorE)."""
    return S.mean(x, axis, keepdims=keepdims, dtype=dtype, mask=mask)


@builtin("tl.var")
def var(x, axis, *, dtype=None, mask=None, keepdims=False) -> Tile:
    """Population variance over free ``axis``. On a 2-D tile over axis 1 it is VectorE's
    ``bn_stats`` (per 512 elements) + ``bn_aggr``; otherwise two passes."""
    return S.var(x, axis, keepdims=keepdims, dtype=dtype, mask=mask)


# ---- TensorE --------------------------------------------------------------------------------

@builtin("tl.matmul")
def matmul(x, y, *, transpose_x: bool = False) -> Tile:
    """``x @ y`` into a new fp32 PSUM tile, on TensorE.

    With ``transpose_x=True``, ``x`` is given as ``[K, M]`` (the stationary operand) and
    ``y`` is ``[K, N]`` (moving): ``K <= 128`` partitions, ``M <= 128``, ``N <= 512``.
    Without it, ``x`` is ``[M, K]`` and is first transposed on TensorE (two more
    instructions). Accumulate over K tiles with ``acc += tl.matmul(...)`` into a
    ``tl.zeros(..., buffer=tl.psum)`` tile; copy out with ``tl.copy``.
    """
    return S.matmul(x, y, transpose_x=transpose_x)


@builtin("tl.transpose")
def transpose(x, *, dtype=None) -> Tile:
    """``x.T`` ([P, F] -> [F, P], F <= 128) into a new PSUM tile, on TensorE."""
    return S.transpose(x, dtype=dtype)


@builtin("tl.where")
def where(condition, x, y, *, dtype=None, mask=None) -> Tile:
    """``x`` where ``condition`` is non-zero, else ``y`` (tiles or numbers), on VectorE ``select``."""
    return S.where(condition, x, y, dtype=dtype, mask=mask)


# ---- loops and launch grids -------------------------------------------------------------------

def _range(label: str, doc: str):
    def fn(start, stop=None, step=1):
        if stop is None:
            start, stop = 0, start
        for v in (start, stop, step):
            if isinstance(v, bool) or not hasattr(v, "__index__"):
                raise KernelError(f"{label}() takes integers (loop bounds are known when the kernel is traced), "
                                  f"got {type(v).__name__} {v!r}")
        start, stop, step = int(start), int(stop), int(step)
        if step == 0:
            raise KernelError(f"{label}() step must not be zero")
        ctx = current(label)
        return loop_range(ctx, label, start, stop, step, ctx.frame)

    fn.__name__ = fn.__qualname__ = label.rsplit(".", 1)[-1]
    fn.__doc__ = doc
    return builtin(label)(fn)


affine_range = _range("tl.affine_range", """Loop over iterations that do not depend on each other.

The loop is unrolled when the kernel is traced. Tiles made in the body rotate over a
few buffers per allocation site, so the modeled timeline overlaps iteration i+1's
loads with iteration i's compute wherever data dependencies allow.""")
sequential_range = _range("tl.sequential_range", """Loop whose iterations depend on each other (a carried value).

Traced like ``affine_range``; the dependencies between iterations are honoured by the
scheduler either way, so the difference is documentation of intent.""")
static_range = _range("tl.static_range", "Loop unrolled at trace time (all loops are).")


@builtin("tl.program_id")
def program_id(axis: int = 0) -> int:
    """This program's index along ``axis`` of the launch grid (``tilescope.simulate(..., grid=(8,))``)."""
    ctx = current("program_id")
    grid = ctx.launch.grid
    if not grid:
        if axis == 0:
            return 0
        raise KernelError(f"program_id({axis}): the kernel was launched without a grid (grid=None)")
    if not 0 <= axis < len(grid):
        raise KernelError(f"program_id({axis}): the launch grid {grid} has {len(grid)} axes")
    return ctx.launch.program_id[axis]


@builtin("tl.num_programs")
def num_programs(axis: int | None = None, *, axes: int | None = None) -> int:
    """Programs in the launch grid along ``axis`` (all of them when ``axis`` is None; NKI's
    ``axes=`` is accepted too)."""
    axis = axes if axis is None else axis
    grid = current("num_programs").launch.grid or (1,)
    if axis is None:
        n = 1
        for g in grid:
            n *= g
        return n
    if not 0 <= axis < len(grid):
        raise KernelError(f"num_programs({axis}): the launch grid {grid} has {len(grid)} axes")
    return grid[axis]


@builtin("tl.device_print")
def device_print(prefix: str, x) -> None:
    """Print a tile's (or tensor's) values when the simulator reaches this point.

    Printed during the numerics run of every ``tilescope.simulate`` call (values as
    the kernel sees them at that point of the program), not at trace time.
    """
    S.device_print(prefix, x)


# ---- indexing and assignment (Tile.__getitem__ / __setitem__ / __iadd__) ------------------------

@builtin("index")
def tile_view(tile: Tile, index) -> Tile:
    """``tile[index]``: a view (no data moves)."""
    return S.tile_index(tile, index)


def _fresh():
    """The (file, first, last line) of the current statement if it assigns a fresh value, else None."""
    frame = current().frame
    if frame is None:
        return None
    span = fresh_lines(frame.f_code.co_filename).get(frame.f_lineno)
    return None if span is None else (frame.f_code.co_filename,) + span


@builtin("assign")
def _assign(tile: Tile, index, value) -> None:
    view = S.tile_index(tile, index)
    S.assign(view, value, fresh=_fresh())


@builtin("inplace")
def _inplace(tile: Tile, op: str, value) -> Tile:
    return S.inplace(tile, op, value, fresh=_fresh(), label=op)

