"""A loop index whose uses are watched: :class:`Sym`.

While a kernel is traced, the first iterations of a loop see its index as a ``Sym``:
an integer that also knows how it depends on the loop indices in scope,
``value = base + sum(coef_L * x_L)``. It behaves as its integer value everywhere, and
it reports how it is used to the loops it depends on (:mod:`tilescope.lang._loops`):

========================================  ===============================================
use                                       effect
========================================  ===============================================
``+ - *`` by integers or other Syms,      a new Sym (affine in the loop indices)
``//`` and ``%`` that stay affine
a comparison, ``bool()``                  its result, recorded as a *guard*: a loop may be
                                          replicated only over iterations where every
                                          guard has the same outcome
anything else (``int()``, ``[]`` on a     the integer value; the loops involved are
list, ``hash``, ``float``, non-affine     *tainted*: traced iteration by iteration
arithmetic, a Sym from an earlier         (correct, only slower)
iteration)
========================================  ===============================================

So a loop body either behaves identically, up to affine shifts, for every iteration
(and is traced once and replicated) or is traced iteration by iteration.

>>> from tilescope.lang._sym import Sym
>>> s = Sym(5, {})          # no loop in scope: a plain integer
>>> (s * 2 + 1, s < 6, int(s))
(11, True, 5)
"""

from __future__ import annotations

__all__ = ["Sym", "concrete", "is_sym", "count"]


def is_sym(x) -> bool:
    return x.__class__ is Sym


def concrete(x):
    """The integer value of ``x`` (a Sym or anything else, returned as is), without taint:
    for tilescope's own code that records what it does with the value elsewhere."""
    return x.value if x.__class__ is Sym else x


def count(x) -> int:
    """A size (a count of elements), which must be the same in every iteration: the integer
    value of ``x`` (a Sym that varies with a loop index taints that loop)."""
    if x.__class__ is Sym:
        if x._live():
            x._taint("a size depends on it")
        return x.value
    return x


_RECORD: list = []  # [record_guard] once bound


def _record_guard():
    if not _RECORD:  # (bound on first use: tilescope.lang._loops imports this module)
        from ._loops import record_guard

        _RECORD.append(record_guard)
    return _RECORD[0]


def _int(x) -> bool:
    return x.__class__ is int or (isinstance(x, int) and not isinstance(x, bool))


_OUTCOME = {"<": (0).__gt__, "<=": (0).__ge__, "==": (0).__eq__, "!=": (0).__ne__, ">": (0).__lt__,
            ">=": (0).__le__}  # op -> (difference -> outcome of ``difference op 0``)


class Sym:
    """An integer that depends affinely on loop indices (see the module docs).

    ``coefs`` maps a loop (:class:`tilescope.lang._loops.Loop`) to the coefficient of its
    index; ``stamp`` holds each such loop's iteration serial when the Sym was made (a Sym
    used in a later iteration of its loop is stale: a loop-carried value).
    """

    __slots__ = ("value", "coefs", "stamp")
    __array_priority__ = 1000

    def __init__(self, value: int, coefs: dict, stamp: tuple = ()):
        self.value = value
        self.coefs = coefs
        self.stamp = stamp

    # ---- bookkeeping ----------------------------------------------------------------
    def _live(self) -> dict:
        """The coefficients, or {} (after tainting its loops) if any of them moved on."""
        for loop, serial in self.stamp:
            if loop.serial != serial or not loop.active:
                for lp in self.coefs:
                    lp.taint("a value computed from its index in an earlier iteration is used")
                return {}
        return self.coefs

    def _taint(self, why: str):
        for loop in self.coefs:
            loop.taint(why)
        return self.value

    @staticmethod
    def _make(value: int, coefs: dict):
        coefs = {lp: c for lp, c in coefs.items() if c}
        if not coefs:
            return value
        return Sym(value, coefs, tuple((lp, lp.serial) for lp in coefs))

    @staticmethod
    def _merge(a: dict, b: dict, sign: int = 1) -> dict:
        out = dict(a)
        for lp, c in b.items():
            out[lp] = out.get(lp, 0) + sign * c
        return out

    def _other(self, other):
        """(value, coefs) of an integer operand; None for a float (the caller taints and
        computes); NotImplemented for anything else (the other operand's method decides:
        an index expression takes a Sym as its constant)."""
        if other.__class__ is Sym:
            return other.value, other._live()
        if _int(other) or (hasattr(other, "dtype") and getattr(other.dtype, "kind", "") in "iu"
                           and getattr(other, "shape", None) == ()):
            return int(other), {}
        if isinstance(other, (float, complex)) or (hasattr(other, "dtype") and getattr(other, "shape", None) == ()):
            return None
        return NotImplemented

    # ---- affine arithmetic -----------------------------------------------------------
    # (each operation has a fast path for a plain int operand, the common case: the same
    # coefficients, so the same stamp while the Sym is live)
    def __add__(self, other):
        if other.__class__ is int:
            coefs = self._live()
            return Sym(self.value + other, coefs, self.stamp) if coefs else self.value + other
        o = self._other(other)
        if o is NotImplemented:
            return o
        if o is None:
            return self._taint("it is combined with a non-integer") + other
        return Sym._make(self.value + o[0], Sym._merge(self._live(), o[1]))

    __radd__ = __add__

    def __sub__(self, other):
        if other.__class__ is int:
            coefs = self._live()
            return Sym(self.value - other, coefs, self.stamp) if coefs else self.value - other
        o = self._other(other)
        if o is NotImplemented:
            return o
        if o is None:
            return self._taint("it is combined with a non-integer") - other
        return Sym._make(self.value - o[0], Sym._merge(self._live(), o[1], -1))

    def __rsub__(self, other):
        o = self._other(other)
        if o is NotImplemented:
            return o
        if o is None:
            return other - self._taint("it is combined with a non-integer")
        return Sym._make(o[0] - self.value, Sym._merge(o[1], self._live(), -1))

    def __mul__(self, other):
        if other.__class__ is int:
            coefs = self._live()
            if coefs and other:
                return Sym(self.value * other, {lp: c * other for lp, c in coefs.items()}, self.stamp)
            return self.value * other
        o = self._other(other)
        if o is NotImplemented:
            return o
        if o is None:
            return self._taint("it is multiplied by a non-integer") * other
        mine = self._live()
        if o[1] and mine:  # the product of two loop indices is not affine
            for lp in o[1]:
                lp.taint("a product of loop indices is not affine")
            return self._taint("a product of loop indices is not affine") * o[0]
        if o[1]:
            return Sym._make(self.value * o[0], {lp: c * self.value for lp, c in o[1].items()})
        return Sym._make(self.value * o[0], {lp: c * o[0] for lp, c in mine.items()})

    __rmul__ = __mul__

    def __neg__(self):
        return Sym._make(-self.value, {lp: -c for lp, c in self._live().items()})

    def __pos__(self):
        return self

    def __floordiv__(self, other):
        o = self._other(other)
        if o is NotImplemented:
            return o
        mine = self._live()
        if o is not None and not o[1] and o[0] < 0:  # floor(v / -d) == floor(-v / d)
            return (-self) // -o[0]
        if o is not None and not o[1] and o[0] > 0 and all(c % o[0] == 0 for c in mine.values()):
            return Sym._make(self.value // o[0], {lp: c // o[0] for lp, c in mine.items()})
        v = self._taint("'//' of it is not affine")
        return v // (o[0] if o is not None else other)

    def __mod__(self, other):
        o = self._other(other)
        if o is NotImplemented:
            return o
        mine = self._live()
        if o is not None and not o[1] and o[0] > 0 and all(c % o[0] == 0 for c in mine.values()):
            return self.value % o[0]  # the same for every iteration
        v = self._taint("'%' of it is not affine")
        return v % (o[0] if o is not None else other)

    def __rfloordiv__(self, other):
        return other // self._taint("it divides")

    def __rmod__(self, other):
        return other % self._taint("it divides")

    def __truediv__(self, other):
        return self._taint("'/' makes a float of it") / other

    def __rtruediv__(self, other):
        return other / self._taint("'/' makes a float of it")

    def __pow__(self, other):
        return self._taint("'**' of it is not affine") ** other

    def __rpow__(self, other):
        return other ** self._taint("'**' of it is not affine")

    def __abs__(self):
        return self if self >= 0 else -self

    # ---- comparisons: guards ---------------------------------------------------------
    def _compare(self, other, op: str):
        if other.__class__ is int:
            diff = self.value - other
            outcome = _OUTCOME[op](diff)
            coefs = self._live()
            if coefs:
                _record_guard()(coefs, diff, op, outcome)
            return outcome
        o = self._other(other)
        if o is NotImplemented:
            return o
        if o is None:
            v = self._taint("it is compared with a non-integer")
            return {"<": v < other, "<=": v <= other, "==": v == other, "!=": v != other,
                    ">": v > other, ">=": v >= other}[op] if other is not None else op == "!="
        coefs = Sym._merge(self._live(), o[1], -1)
        diff = self.value - o[0]
        outcome = {"<": diff < 0, "<=": diff <= 0, "==": diff == 0, "!=": diff != 0, ">": diff > 0,
                   ">=": diff >= 0}[op]
        coefs = {lp: c for lp, c in coefs.items() if c}
        if coefs:
            _record_guard()(coefs, diff, op, outcome)
        return outcome

    def __lt__(self, other):
        return self._compare(other, "<")

    def __le__(self, other):
        return self._compare(other, "<=")

    def __gt__(self, other):
        return self._compare(other, ">")

    def __ge__(self, other):
        return self._compare(other, ">=")

    def __eq__(self, other):
        return self._compare(other, "==")

    def __ne__(self, other):
        return self._compare(other, "!=")

    def __bool__(self):
        return self._compare(0, "!=")

    # ---- uses that need the integer ---------------------------------------------------
    def __index__(self):
        return self._taint("it is used as a Python integer (an index, a size, a range bound)")

    def __int__(self):
        return self._taint("it is converted with int()")

    def __float__(self):
        return float(self._taint("it is converted to a float"))

    def __hash__(self):
        return hash(self._taint("it is hashed (a dict key, a set member)"))

    def __round__(self, ndigits=None):
        return self.value if ndigits is None else round(self.value, ndigits)

    def __trunc__(self):
        return self.value

    def __floor__(self):
        return self.value

    def __ceil__(self):
        return self.value

    def __and__(self, other):
        return self._taint("bitwise operations are not affine") & other

    __rand__ = __and__

    def __or__(self, other):
        return self._taint("bitwise operations are not affine") | other

    __ror__ = __or__

    def __xor__(self, other):
        return self._taint("bitwise operations are not affine") ^ other

    __rxor__ = __xor__

    def __lshift__(self, other):
        return self._taint("shifts are not affine") << other

    def __rshift__(self, other):
        return self._taint("shifts are not affine") >> other

    def __invert__(self):
        return ~self._taint("bitwise operations are not affine")

    # ---- display (no effect on the loop) ----------------------------------------------
    def __repr__(self) -> str:
        return repr(self.value)

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)
