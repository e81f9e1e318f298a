"""The values a kernel holds: HBM tensors and on-chip tiles.

Both are *views*: a buffer of the Program, an offset and a ``(stride, count)``
pair per dimension -- the same form as the ISA's access patterns, so turning a
view into an instruction operand is free. Indexing makes new views (slices,
integers, ``tl.arange``/``tl.mgrid`` expressions); nothing is copied.

* :class:`Tensor` -- in HBM: kernel arguments and ``tl.ndarray(..., buffer=tl.hbm)``.
  Engines cannot read it; move data with ``tl.load`` / ``tl.store``.
* :class:`Tile` -- in SBUF or PSUM, with the partition dimension first. A tile
  made with ``tl.par_dim`` has *block* dimensions before the partition
  dimension; index them (``t[k]``) to get a tile an engine can use.

Operators (``+ - * / ** < <= > >= == != & | ^``, unary ``-``, ``abs``, ``@``)
are the language's builtins (``tl.add``, ...); in-place forms (``t += x``,
``t[...] = v``) write into the tile.
"""

from __future__ import annotations

from math import prod
from typing import overload

from ..errors import KernelError
from ..isa import AP
from ._frames import surface
from ._index_expr import Check, apply_box, resolve_index
from ._sym import Sym
from ._types import dtype_name as _dtype_name

__all__ = ["Tensor", "Tile", "View", "TENSOR_METHODS_LACK"]

# NKI tensor methods (current NKI's NkiTensor) that tiles and tensors here lack -> what to use
TENSOR_METHODS_LACK = {
    "permute": "index with nl.mgrid expressions in the order you want (an access pattern), or "
               "nisa.nc_transpose for the partition dim",
    "rearrange": "index with nl.mgrid expressions (an access pattern)",
    "reshape_dim": "use .reshape(shape) on a contiguous view", "flatten_dims": "use .reshape(shape)",
    "expand_dim": "use nl.expand_dims(x, axis) or .reshape", "squeeze_dim": "use .reshape(shape)",
    "slice": "index with slices: t[:, a:b]", "select": "index with an integer: t[:, k]",
    "vector_select": "indirect access is not modeled", "indirect": "indirect access is not modeled",
    "view": "reinterpreting a tile's dtype is not modeled; copy with a cast (nisa.tensor_copy(dtype=...))",
    "ap": "index with slices or nl.mgrid expressions (tilescope builds the access pattern)",
    "get_pattern": "views expose .offset and .dims (stride, count) per dimension",
    "is_indirect": "indirect access is not modeled",
    "broadcast": "use nl.broadcast_to(t, shape)",
}


_CORE = None


def _core():
    global _CORE
    if _CORE is None:  # the builtins import this module: bind them on first use
        from . import _core as core

        _CORE = core
    return _CORE


class View:
    """A region of a buffer: ``offset`` and ``(stride, count)`` per dimension."""

    __slots__ = ("buffer", "offset", "dims", "checks", "axis_vars", "shape")
    __array_priority__ = 1000  # numpy scalars on the left defer to our operators

    def __init__(self, buffer, offset: int, dims, checks: tuple[Check, ...] = (), axis_vars=()):
        self.buffer = buffer
        self.offset = offset
        self.dims = dims = tuple(dims)
        self.checks = checks
        self.axis_vars = axis_vars
        self.shape = tuple([c for _, c in dims])

    @property
    def dtype(self) -> str:
        return _dtype_name(self.buffer.dtype)

    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def name(self) -> str:
        return self.buffer.name

    def __len__(self) -> int:
        return self.dims[0][1] if self.dims else 1

    def describe(self) -> str:
        return f"{self.buffer.memory.upper()} {'tensor' if self.buffer.memory == 'hbm' else 'tile'} {self.buffer.name!r}"

    def region(self, box=None, hint: str = ""):
        """``(offset, dims)`` narrowed to ``box`` with deferred bounds checked (None: empty)."""
        if not box and not self.checks:
            return self.offset, self.dims
        return apply_box(self.offset, self.dims, self.checks, box if box is not None else {},
                         what=self, shape=self.buffer.shape, hint=hint)

    @overload
    def ap(self, box: None = None, hint: str = "") -> AP: ...  # (every dim counts >= 1: never empty)

    @overload
    def ap(self, box: dict, hint: str = "") -> AP | None: ...

    def ap(self, box=None, hint: str = "") -> AP | None:
        """The access pattern of this view narrowed to ``box`` (None when the box is empty)."""
        r = self.region(box, hint)
        if r is None:
            return None
        offset, dims = r
        if offset.__class__ is Sym:  # instructions hold integers; the loop compares iterations' offsets
            offset = offset.value
        return AP(self.buffer.name, self.buffer.dtype, offset, dims or ((1, 1),))

    def is_whole(self) -> bool:
        """True when the view is its whole buffer, in the buffer's own layout."""
        # (the offset last: a loop index in it is a guard, worth recording only when it decides)
        if self.checks or prod(self.shape) != self.buffer.size or self.offset:
            return False
        expected = 1
        for stride, count in reversed(self.dims):
            if count > 1 and stride != expected:
                return False
            expected *= count
        return True

    # ---- operators: the language's builtins ----------------------------------
    def __add__(self, other):
        return _core().add(self, other)

    def __radd__(self, other):
        return _core().add(other, self)

    def __sub__(self, other):
        return _core().subtract(self, other)

    def __rsub__(self, other):
        return _core().subtract(other, self)

    def __mul__(self, other):
        return _core().multiply(self, other)

    def __rmul__(self, other):
        return _core().multiply(other, self)

    def __truediv__(self, other):
        return _core().divide(self, other)

    def __rtruediv__(self, other):
        return _core().divide(other, self)

    def __pow__(self, other):
        return _core().power(self, other)

    def __rpow__(self, other):
        return _core().power(other, self)

    def __neg__(self):
        return _core().negative(self)

    def __abs__(self):
        return _core().abs(self)

    def __lt__(self, other):
        return _core().less(self, other)

    def __le__(self, other):
        return _core().less_equal(self, other)

    def __gt__(self, other):
        return _core().greater(self, other)

    def __ge__(self, other):
        return _core().greater_equal(self, other)

    def __eq__(self, other):  # elementwise, as in numpy
        return _core().equal(self, other)

    def __ne__(self, other):
        return _core().not_equal(self, other)

    def __and__(self, other):
        return _core().logical_and(self, other)

    __rand__ = __and__

    def __or__(self, other):
        return _core().logical_or(self, other)

    __ror__ = __or__

    def __xor__(self, other):
        return _core().logical_xor(self, other)

    __rxor__ = __xor__

    def __matmul__(self, other):
        return _core().matmul(self, other)

    __hash__ = object.__hash__

    def __getattr__(self, name):
        why = TENSOR_METHODS_LACK.get(name)
        if why is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        from ..errors import UnsupportedError
        from ._frames import locate, user_frame

        raise locate(UnsupportedError(f"tensor method .{name}() is not supported by tilescope: {why}"),
                     user_frame(2))

    @surface
    def __bool__(self):
        raise KernelError(
            f"the value of {self.describe()} is not known while the kernel is traced, so it cannot "
            f"steer Python control flow; select values with tl.where(cond, a, b) or masks instead")

    @surface
    def __iter__(self):
        raise KernelError(f"{self.describe()} is not iterable; loop with tl.affine_range over its indices")


class Tensor(View):
    """A tensor in HBM (or a view of one). Move data with ``tl.load`` / ``tl.store``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<HBM tensor {self.buffer.name!r} view shape={self.shape} {self.dtype}>"

    @surface
    def __getitem__(self, index) -> "Tensor":
        if self.checks or self.axis_vars:
            raise KernelError(f"{self.describe()} was already indexed with tl.arange expressions; "
                              f"index the tensor once with every dimension")
        r = resolve_index(self.dims, index, what=self, shape=self.shape)
        return Tensor(self.buffer, self.offset + r.offset, r.dims, r.checks, r.axis_vars)

    def __setitem__(self, index, value) -> None:
        _core().store(self[index], value)

    @surface
    def reshape(self, *shape) -> "Tensor":
        """A view with another shape (the view must be contiguous); one size may be -1."""
        shape = _shape_arg(shape)
        if self.checks or not _contiguous(self.dims):
            raise KernelError(f"reshape needs a contiguous view; {self.describe()} view {self.shape} is strided")
        shape = _infer(shape, self.size, self.shape)
        dims, stride = [], 1
        for n in reversed(shape):
            dims.append((stride, n))
            stride *= n
        return Tensor(self.buffer, self.offset, tuple(reversed(dims)))

    @surface
    def broadcast_to(self, *shape) -> "Tensor":
        """A view repeating size-1 dimensions (numpy rules): reads the same elements again."""
        shape = _shape_arg(shape)
        return Tensor(self.buffer, self.offset, _broadcast_dims(self.dims, shape, self.describe()),
                      self.checks, self.axis_vars)


class Tile(View):
    """A tile in SBUF or PSUM (partition dimension first, unless block dims precede it)."""

    __slots__ = ("pdim", "state", "inplace")

    def __init__(self, buffer, offset, dims, checks=(), axis_vars=(), *, pdim: int = 0, state=None):
        super().__init__(buffer, offset, dims, checks, axis_vars)
        self.pdim = pdim
        self.state = state
        self.inplace = False

    @property
    def memory(self) -> str:
        """``"sbuf"`` or ``"psum"``."""
        return self.buffer.memory

    @property
    def partitions(self) -> int:
        return self.dims[self.pdim][1]

    def __repr__(self) -> str:
        return f"<{self.buffer.memory.upper()} tile {self.buffer.name!r} view shape={self.shape} {self.dtype}>"

    def __getitem__(self, index) -> "Tile":
        return _core().tile_view(self, index)

    def __setitem__(self, index, value) -> None:
        _core()._assign(self, index, value)

    def __iadd__(self, other):
        return _core()._inplace(self, "add", other)

    def __isub__(self, other):
        return _core()._inplace(self, "subtract", other)

    def __imul__(self, other):
        return _core()._inplace(self, "multiply", other)

    def __itruediv__(self, other):
        return _core()._inplace(self, "divide", other)

    @surface
    def reshape(self, *shape) -> "Tile":
        """Another shape for the free dimensions (partition size unchanged, view contiguous)."""
        shape = _shape_arg(shape)
        if self.pdim or self.checks or not _contiguous(self.dims[1:]):
            raise KernelError(f"reshape needs a contiguous tile view with the partition dim first; got {self.describe()} {self.shape}")
        free = _infer(shape[1:], prod(self.shape[1:]), self.shape) if len(shape) > 1 else ()
        if not shape or shape[0] != self.shape[0]:
            raise KernelError(f"reshape of a tile keeps the partition dim ({self.shape[0]}); got {tuple(shape)}")
        dims, stride = [], 1
        for n in reversed(free):
            dims.append((stride, n))
            stride *= n
        return Tile(self.buffer, self.offset, (self.dims[0],) + tuple(reversed(dims)), pdim=0, state=self.state)

    @surface
    def broadcast_to(self, *shape) -> "Tile":
        """A view repeating size-1 free dimensions; a one-partition tile broadcast across
        partitions is a new tile (see ``tl.broadcast_to``)."""
        shape = _shape_arg(shape)
        if self.pdim:
            raise KernelError("index the block dimensions of a tile before broadcasting it")
        if shape and self.shape[0] == 1 and shape[0] != 1:  # across partitions: work on TensorE
            return _core().broadcast_to(self, shape)
        if not shape or shape[0] != self.shape[0]:
            raise KernelError(
                f"a tile of {self.shape[0]} partitions cannot broadcast to {shape[0] if shape else '?'}; only "
                f"a one-partition tile broadcasts across partitions")
        free = _broadcast_dims(self.dims[1:], tuple(shape[1:]), self.describe())
        return Tile(self.buffer, self.offset, (self.dims[0],) + free, self.checks, self.axis_vars,
                    pdim=0, state=self.state)


def _shape_arg(shape) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(int(n) for n in shape)


def _contiguous(dims) -> bool:
    expected = 1
    for stride, count in reversed(tuple(dims)):
        if count > 1 and stride != expected:
            return False
        expected *= count
    return True


def _infer(shape, size: int, old) -> tuple[int, ...]:
    shape = list(shape)
    if shape.count(-1) > 1:
        raise KernelError(f"reshape to {tuple(shape)}: only one size may be -1")
    if -1 in shape:
        rest = prod(n for n in shape if n != -1)
        if rest == 0 or size % rest:
            raise KernelError(f"cannot reshape {old} ({size} elements) to {tuple(shape)}")
        shape[shape.index(-1)] = size // rest
    if prod(shape) != size:
        raise KernelError(f"cannot reshape {old} ({size} elements) to {tuple(shape)} ({prod(shape)} elements)")
    return tuple(shape)


def _broadcast_dims(dims, shape, what) -> tuple[tuple[int, int], ...]:
    dims = tuple(dims)
    if len(shape) < len(dims):
        raise KernelError(f"cannot broadcast {what} of shape {tuple(c for _, c in dims)} to fewer dimensions {shape}")
    pad = len(shape) - len(dims)
    out = []
    for k, n in enumerate(shape):
        if k < pad:
            out.append((0, n))
            continue
        stride, count = dims[k - pad]
        if count == n:
            out.append((stride, count))
        elif count == 1:
            out.append((0, n))
        else:
            raise KernelError(f"cannot broadcast {what} of shape {tuple(c for _, c in dims)} to {tuple(shape)}")
    return tuple(out)
