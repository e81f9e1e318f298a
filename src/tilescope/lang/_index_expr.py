"""Index expressions (``tl.arange``, ``tl.mgrid``), masks, and turning an index
into an access pattern.

An :class:`IndexExpr` is an affine function of *index variables*:
``const + sum(coef * v)``, laid out on the axes of a numpy-style shape
(``tl.arange(128)[:, None]`` puts one variable on axis 0 of a ``(128, 1)``
shape). Indexing a tensor with such expressions picks, for each point of their
broadcast shape, one element -- so an affine index is exactly an access pattern:
for tensor dims with strides ``s_d`` indexed by ``e_d``, the result has offset
``sum(s_d * const_d)`` and, on each result axis ``a``, stride
``sum(s_d * coef_{d,a})``. A strided ``4 * i + k`` pattern is a stride of 4.

A *mask* is a conjunction of comparisons of one variable against a constant
(``i_p < n``, ``i * 128 + i_p < rows``); it narrows a result axis to a range,
which is again an access pattern (a box). Bounds of advanced indices are checked
when the access is used, after its mask is applied.

>>> from tilescope import lang as tl
>>> i_p = tl.arange(128)[:, None]
>>> i_f = tl.arange(256)[None, :]
>>> e = 4 * i_f + 1
>>> e.shape, e.const
((1, 256), 1)
>>> box = (i_p + 3968 < 4000).box({})
>>> box
{0: (0, 32)}
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

from ..errors import IndexRangeError, KernelError
from ._frames import surface
from ._sym import Sym, count as _count

__all__ = [
    "IndexExpr", "Predicate", "MGrid", "arange", "mgrid", "Check", "resolve_index",
    "broadcast_shapes", "apply_box", "Indexed", "normalize_index",
]

_var_ids = itertools.count()


def _ceildiv(a: int, b: int) -> int:
    return -((-a) // b)


def broadcast_shapes(*shapes: tuple[int, ...], what: str = "operands") -> tuple[int, ...]:
    """numpy broadcasting of shapes (right-aligned; 1 stretches)."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        sizes = {s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise KernelError(f"shapes {' and '.join(map(str, shapes))} of the {_w(what)} do not broadcast "
                              f"(dimension {k}: sizes {sorted(sizes)})")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


class IndexExpr:
    """``const + sum(coef * var)`` over the axes of ``shape`` (see module docs).

    Supports ``+``, ``-`` and ``*`` by integers, ``+``/``-`` with other index
    expressions (broadcasting), ``[:, None]``-style reshaping, and comparisons
    with integers or expressions, which make masks.
    """

    __slots__ = ("shape", "const", "terms")
    __array_priority__ = 1000  # numpy scalars defer to our operators

    def __init__(self, shape: tuple[int, ...], const: int, terms: tuple[tuple[int, int, int], ...]):
        self.shape = shape
        self.const = const
        self.terms = terms  # (var id, axis in shape, coef), coef != 0

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        parts = [f"{c}*v{v}@{a}" for v, a, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return f"IndexExpr({' + '.join(parts)}, shape={self.shape})"

    # ---- arithmetic -------------------------------------------------------
    def _aligned(self, rank: int):
        shift = rank - len(self.shape)
        return tuple((v, a + shift, c) for v, a, c in self.terms)

    @surface
    def __add__(self, other):
        if isinstance(other, IndexExpr):
            shape = broadcast_shapes(self.shape, other.shape, what="index expressions")
            merged: dict[tuple[int, int], int] = {}
            for v, a, c in self._aligned(len(shape)) + other._aligned(len(shape)):
                merged[(v, a)] = merged.get((v, a), 0) + c
            terms = tuple((v, a, c) for (v, a), c in merged.items() if c)
            return IndexExpr(shape, self.const + other.const, terms)
        n = other if other.__class__ is Sym else _as_int(other, "+")  # a loop index shifts the constant
        return IndexExpr(self.shape, self.const + n, self.terms)

    __radd__ = __add__

    @surface
    def __neg__(self):
        return IndexExpr(self.shape, -self.const, tuple((v, a, -c) for v, a, c in self.terms))

    @surface
    def __sub__(self, other):
        return self + (-other)

    @surface
    def __rsub__(self, other):
        return (-self) + other

    @surface
    def __mul__(self, other):
        if isinstance(other, IndexExpr):
            raise KernelError("the product of two index expressions is not affine; multiply by an integer")
        n = _as_int(other, "*")
        if n == 0:
            return IndexExpr(self.shape, 0, ())
        return IndexExpr(self.shape, self.const * n, tuple((v, a, c * n) for v, a, c in self.terms))

    __rmul__ = __mul__

    @surface
    def __floordiv__(self, other):
        raise KernelError("index expressions must stay affine (const + coef * index); '//' and '%' are not")

    __mod__ = __truediv__ = __floordiv__

    @surface
    def __getitem__(self, index):
        """``[:, None]`` / ``[None, :]`` reshaping (only full slices and None)."""
        if not isinstance(index, tuple):
            index = (index,)
        k = next((j for j, ix in enumerate(index) if ix is Ellipsis), None)
        if k is not None:
            fill = len(self.shape) - (len(index) - 1 - sum(1 for ix in index if ix is None))
            index = index[:k] + (slice(None),) * fill + index[k + 1:]
        axis_map, shape, src = {}, [], 0
        for ix in index:
            if ix is None:
                shape.append(1)
            elif isinstance(ix, slice) and ix == slice(None):
                if src >= len(self.shape):
                    raise KernelError(f"too many indices for an index expression of shape {self.shape}")
                axis_map[src] = len(shape)
                shape.append(self.shape[src])
                src += 1
            else:
                raise KernelError(
                    f"an index expression can only be reshaped with ':' and None (as in "
                    f"tl.arange(n)[:, None]); got {ix!r}")
        while src < len(self.shape):
            axis_map[src] = len(shape)
            shape.append(self.shape[src])
            src += 1
        return IndexExpr(tuple(shape), self.const, tuple((v, axis_map[a], c) for v, a, c in self.terms))

    # ---- comparisons make masks --------------------------------------------
    def _cmp(self, other, op: str) -> "Predicate":
        lhs = self - other  # condition: lhs (op) 0
        return Predicate(((lhs, op),))

    @surface
    def __lt__(self, other):
        return self._cmp(other, "<")

    @surface
    def __le__(self, other):
        return self._cmp(other, "<=")

    @surface
    def __gt__(self, other):
        return (-self)._cmp(-other, "<")

    @surface
    def __ge__(self, other):
        return (-self)._cmp(-other, "<=")

    @surface
    def __eq__(self, other):  # noqa: D105 - a mask, like numpy's elementwise ==
        return self._cmp(other, "==")

    @surface
    def __ne__(self, other):
        raise KernelError("'!=' does not describe a range of indices; masks use <, <=, >, >=, == and &")

    __hash__ = None  # type: ignore[assignment]

    @surface
    def __bool__(self):
        raise KernelError("an index expression has no truth value; use it to index a tensor or in a mask=")


def _as_int(x, op: str) -> int:
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise KernelError(f"index expressions combine with integers and other index expressions; "
                          f"got {type(x).__name__} {x!r} in '{op}'")
    return int(x.__index__())


class Predicate:
    """A mask: a conjunction (``&``) of affine conditions on index variables."""

    __slots__ = ("conditions",)

    def __init__(self, conditions: tuple[tuple[IndexExpr, str], ...]):
        self.conditions = conditions

    @surface
    def __and__(self, other):
        if not isinstance(other, Predicate):
            raise KernelError(f"masks combine with other masks (&); got {type(other).__name__}")
        return Predicate(self.conditions + other.conditions)

    @surface
    def __or__(self, other):
        raise KernelError("a mask must describe a box of indices; '|' of conditions does not. "
                          "Split the operation in two, or use tl.where on the data")

    __ror__ = __or__

    @surface
    def __invert__(self):
        raise KernelError("'~' of a mask is not a box of indices; write the opposite comparison instead")

    @surface
    def __bool__(self):
        raise KernelError("a mask has no truth value in Python; pass it as mask=... to a tile operation")

    def __repr__(self) -> str:
        return " & ".join(f"({e!r} {op} 0)" for e, op in self.conditions)

    def variables(self) -> set[int]:
        return {v for e, _ in self.conditions for v, _, _ in e.terms}

    def box(self, var_axes: dict[int, int]) -> dict[int, tuple[int, int]] | None:
        """``{axis: (lo, hi)}`` the mask allows (``None`` when it allows nothing).

        ``var_axes`` maps variables to the result axes of the access the mask is
        applied to; a variable it lacks restricts the axis at its own position.
        """
        box: dict[int, tuple[int, int]] = {}
        for expr, op in self.conditions:
            by_axis: dict[int, int] = {}
            for v, a, c in expr.terms:
                axis = var_axes.get(v, a)
                by_axis[axis] = by_axis.get(axis, 0) + c
            by_axis = {a: c for a, c in by_axis.items() if c}
            k = expr.const
            if not by_axis:
                holds = {"<": k < 0, "<=": k <= 0, "==": k == 0}[op]
                if not holds:
                    return None
                continue
            if len(by_axis) > 1:
                raise KernelError(
                    f"mask condition {expr!r} {op} 0 involves index axes {sorted(by_axis)}; a mask must "
                    f"restrict one axis per condition (combine conditions with &). For a triangular or "
                    f"other data-shaped selection use tl.where")
            (axis, c), = by_axis.items()
            lo, hi = 0, 1 << 62  # index values are >= 0
            if op == "<":  # k + c*v < 0
                if c > 0:
                    hi = _ceildiv(-k, c)
                else:
                    lo = k // (-c) + 1
            elif op == "<=":
                if c > 0:
                    hi = (-k) // c + 1
                else:
                    lo = _ceildiv(k, -c)
            else:  # ==
                if (-k) % c:
                    return None
                lo = (-k) // c
                hi = lo + 1
            old = box.get(axis, (0, 1 << 62))
            box[axis] = (max(old[0], lo), min(old[1], hi))
        return box


class MGrid:
    """The result of ``tl.mgrid[0:128, 0:512]``: one index expression per axis,
    as ``.p`` (partition), ``.x``, ``.y``, ``.z``, by position, or unpacked."""

    __slots__ = ("exprs",)

    def __init__(self, exprs: tuple[IndexExpr, ...]):
        self.exprs = exprs

    def __iter__(self):
        return iter(self.exprs)

    def __len__(self) -> int:
        return len(self.exprs)

    def __getitem__(self, k: int) -> IndexExpr:
        return self.exprs[k]

    @surface
    def _axis(self, k: int, name: str) -> IndexExpr:
        if k >= len(self.exprs):
            raise KernelError(f"this mgrid has {len(self.exprs)} axes; it has no '.{name}'")
        return self.exprs[k]

    p = property(lambda self: self._axis(0, "p"))
    x = property(lambda self: self._axis(1, "x"))
    y = property(lambda self: self._axis(2, "y"))
    z = property(lambda self: self._axis(3, "z"))


@surface
def arange(start: int, stop: int | None = None, step: int = 1) -> IndexExpr:
    """A 1-D index expression over ``range(start, stop, step)`` (``arange(n)``: 0..n-1)."""
    if stop is None:
        start, stop = 0, start
    start, stop, step = (_as_int(v, "arange") for v in (start, stop, step))
    if step <= 0:
        raise KernelError(f"arange step must be positive, got {step}")
    n = max(0, _ceildiv(stop - start, step))
    if n == 0:
        raise KernelError(f"arange({start}, {stop}, {step}) is empty")
    return IndexExpr((n,), start, ((next(_var_ids), 0, step),))


class _MGridMaker:
    """``tl.mgrid[0:128, 0:512]``: broadcastable index expressions, one per axis."""

    @surface
    def __getitem__(self, index) -> MGrid:
        if not isinstance(index, tuple):
            index = (index,)
        rank = len(index)
        exprs = []
        for k, s in enumerate(index):
            if not isinstance(s, slice) or s.stop is None:
                raise KernelError(f"mgrid takes slices with a stop, like mgrid[0:128, 0:512]; got {s!r}")
            e = arange(s.start or 0, s.stop, s.step or 1)
            shape = tuple(e.shape[0] if j == k else 1 for j in range(rank))
            exprs.append(IndexExpr(shape, e.const, tuple((v, k, c) for v, _, c in e.terms)))
        return MGrid(tuple(exprs))

    def __repr__(self) -> str:
        return "tl.mgrid"


mgrid = _MGridMaker()


# ---- index -> access ---------------------------------------------------------

class Check(NamedTuple):
    """A bound to check once the access's mask is known: dimension ``dim`` (of
    size ``size``) is indexed by ``const + sum(coef * axis value)``."""

    dim: int
    size: int
    const: int
    coefs: tuple[tuple[int, int], ...]  # (result axis, coef)


class Indexed(NamedTuple):
    """An index resolved against a buffer layout."""

    offset: int
    dims: tuple[tuple[int, int], ...]  # (stride, count) per result axis
    checks: tuple[Check, ...]
    axis_vars: tuple[tuple[int, int], ...]  # (var id, result axis)
    kept: tuple[int, ...]  # source dim of each result axis (-1 for advanced axes)
    advanced: bool


def _w(what) -> str:
    """A description for error messages (``what`` is a string or a view)."""
    return what if isinstance(what, str) else what.describe()


def normalize_index(index, ndim: int, what) -> tuple:
    """``index`` as a tuple of one entry per dimension (``...`` expanded, ``:`` appended)."""
    if not isinstance(index, tuple):
        index = (index,)
    if any(ix is None for ix in index):
        raise KernelError(f"None (new axis) is not an index of {_w(what)}; reshape it instead")
    n_ell = sum(1 for ix in index if ix is Ellipsis)
    if n_ell > 1:
        raise KernelError("an index can have only one '...'")
    if n_ell:  # (identity tests: an IndexExpr's == makes a mask)
        k = next(j for j, ix in enumerate(index) if ix is Ellipsis)
        index = index[:k] + (slice(None),) * (ndim - len(index) + 1) + index[k + 1:]
    if len(index) > ndim:
        raise IndexRangeError(f"too many indices ({len(index)}) for {_w(what)} of {ndim} dimensions")
    return index + (slice(None),) * (ndim - len(index))


def resolve_index(dims, index, *, what, shape: tuple[int, ...], normalized: bool = False) -> Indexed:
    """Resolve ``index`` against a layout (``dims``: (stride, size) per dimension)."""
    if not normalized:
        index = normalize_index(index, len(dims), what)
    if any(isinstance(ix, IndexExpr) for ix in index):
        return _advanced(dims, index, what, shape)
    offset = 0
    out, kept = [], []
    for d, (ix, (stride, size)) in enumerate(zip(index, dims)):
        if isinstance(ix, slice) and (ix.start.__class__ is Sym or ix.stop.__class__ is Sym):
            start, stop, step = _sym_slice(ix, size, d, what, shape)
            n = _count(max(0, _ceildiv(stop - start, step)))
            if n == 0:
                raise IndexRangeError(f"empty slice {ix} on dim {d} of {_w(what)} (size {size})")
            offset += start * stride
            out.append((stride * step, n))
            kept.append(d)
        elif isinstance(ix, slice):
            start, stop, step = ix.indices(size)
            if step <= 0:
                raise IndexRangeError(f"negative slice steps are not supported (dim {d} of {_w(what)})")
            if ix.stop is not None and ix.stop > size or ix.start is not None and ix.start >= size:
                hi = (ix.stop if ix.stop is not None else size) - 1
                raise IndexRangeError(
                    f"index range [{ix.start or 0}, {hi}] exceeds dimension size {size} "
                    f"(dim {d} of {_w(what)}, shape {shape})")
            count = max(0, _ceildiv(stop - start, step))
            if count == 0:
                raise IndexRangeError(f"empty slice {ix} on dim {d} of {_w(what)} (size {size})")
            offset += start * stride
            out.append((stride * step, count))
            kept.append(d)
        elif isinstance(ix, Predicate):
            raise KernelError("a mask is not an index; pass it as mask=... to the operation")
        else:
            offset += _int_position(ix, d, size, what, shape) * stride
    return Indexed(offset, tuple(out), (), (), tuple(kept), False)


def _sym_slice(ix: slice, size: int, d: int, what, shape):
    """``slice.indices`` for bounds that are loop indices (every decision is a guard)."""
    step = 1 if ix.step is None else _as_int(ix.step, "slice")
    if step <= 0:
        raise IndexRangeError(f"negative slice steps are not supported (dim {d} of {_w(what)})")
    start = 0 if ix.start is None else ix.start
    stop = size if ix.stop is None else ix.stop
    for v in (start, stop):
        if v.__class__ is not Sym:
            _as_int(v, "slice")
    if start < 0:
        start = start + size
    if stop < 0:
        stop = stop + size
    if stop > size or start >= size or start < 0:
        hi = stop - 1
        raise IndexRangeError(
            f"index range [{start}, {hi}] exceeds dimension size {size} (dim {d} of {_w(what)}, shape {shape})")
    return start, stop, step


def _int_index(ix, d: int, what) -> int | Sym:
    if ix.__class__ is Sym:
        return ix
    if isinstance(ix, bool) or not hasattr(ix, "__index__"):
        raise KernelError(
            f"dim {d} of {_w(what)} is indexed by {type(ix).__name__} {ix!r}; indices are integers, "
            f"slices, or tl.arange / tl.mgrid expressions")
    return int(ix.__index__())


def _int_position(ix, d: int, size: int, what, shape) -> int | Sym:
    """An integer index on dim ``d`` as a position in ``[0, size)`` (negative counts from the end)."""
    i = _int_index(ix, d, what)
    if i < 0:
        i += size
    if not 0 <= i < size:
        raise IndexRangeError(
            f"index {ix} is out of range for dimension size {size} (dim {d} of {_w(what)}, shape {shape})")
    return i


def _advanced(dims, index, what, shape) -> Indexed:
    last_expr = -1
    exprs = []
    for d, ix in enumerate(index):
        if ix.__class__ is IndexExpr:
            exprs.append(ix)
            last_expr = d
    for d, ix in enumerate(index):
        if ix.__class__ is slice and not (d > last_expr and ix == slice(None)):
            raise KernelError(
                f"dim {d} of {_w(what)} mixes a slice with tl.arange / tl.mgrid indices on other dims; "
                f"index it with an arange too (e.g. start + tl.arange(n)[None, :])")
    rshape = exprs[0].shape if len(exprs) == 1 else broadcast_shapes(*(e.shape for e in exprs),
                                                                       what="index expressions")
    rank = len(rshape)
    res = [0] * rank  # stride of each result axis
    trailing = []
    offset = 0
    checks = []
    axis_vars = []
    for d, ix in enumerate(index):
        stride, size = dims[d]
        if ix.__class__ is IndexExpr:
            shift = rank - len(ix.shape)
            coefs: dict[int, int] = {}
            for v, a, c in ix.terms:
                a += shift
                coefs[a] = coefs.get(a, 0) + c
                axis_vars.append((v, a))
            offset += stride * ix.const
            cl = []
            for a, c in coefs.items():
                if c:
                    res[a] += stride * c
                    cl.append((a, c))
            cl.sort()
            checks.append(Check(d, size, ix.const, tuple(cl)))
        elif ix.__class__ is slice:
            trailing.append(d)
        else:
            offset += _int_position(ix, d, size, what, shape) * stride
    out = [(res[a], rshape[a]) for a in range(rank)] + [dims[d] for d in trailing]
    kept = (-1,) * rank + tuple(trailing)
    axis_vars.sort()
    return Indexed(offset, tuple(out), tuple(checks), tuple(axis_vars), kept, True)


def apply_box(offset: int, dims, checks, box: dict[int, tuple[int, int]] | None, *, what,
              shape: tuple[int, ...], hint: str = "") -> tuple[int, tuple[tuple[int, int], ...]] | None:
    """Narrow an access to ``box`` and check its deferred bounds.

    Returns the new ``(offset, dims)``, or ``None`` when the box is empty.
    """
    if box is None:
        return None
    ranges = []
    for a, (stride, count) in enumerate(dims):
        lo, hi = box.get(a, (0, count))
        lo, hi = max(lo, 0), min(hi, count)
        if hi <= lo:
            return None
        ranges.append((lo, hi))
        offset += stride * lo
    new_dims = tuple((stride, _count(hi - lo)) for (stride, _), (lo, hi) in zip(dims, ranges))
    for chk in checks:
        lo_v = hi_v = chk.const
        for a, c in chk.coefs:
            lo_a, hi_a = ranges[a]
            if c > 0:
                lo_v += c * lo_a
                hi_v += c * (hi_a - 1)
            else:
                lo_v += c * (hi_a - 1)
                hi_v += c * lo_a
        if lo_v < 0 or hi_v >= chk.size:
            raise IndexRangeError(
                f"index range [{lo_v}, {hi_v}] exceeds dimension size {chk.size} (dim {chk.dim} of "
                f"{_w(what)}, shape {shape}); {hint or 'mask the out-of-range part, e.g. mask=(i < n)'}")
    return offset, new_dims
