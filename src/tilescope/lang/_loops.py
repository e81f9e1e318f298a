"""Loops traced once and replicated: how a 100k-instruction kernel traces in about a second.

``tl.affine_range`` / ``sequential_range`` / ``static_range`` loops of four or more
iterations are traced like this:

1. Iterations 0 and 1 run as Python normally would, their index a
   :class:`~tilescope.lang._sym.Sym`, so every use of the index is known: affine
   arithmetic, comparisons (recorded as *guards*), or anything else (the loop is
   *tainted*).
2. If the loop is not tainted and iteration 1 is iteration 0 shifted -- the same
   instructions with the same operands except for the loop's buffers (those made in the
   iteration) and offsets; the kernel's local variables and the tracer's state of every
   buffer alike up to that shift -- then every later iteration whose guards all keep their
   outcomes is iteration 1 shifted again: its buffers and instructions are written by
   arithmetic on iteration 1's, with no Python run, and the local variables are set to
   what they would be after them.
3. Else (iteration 0 is special: it starts an accumulation, or iteration 1 reads what
   iteration 0 made) iteration 2 runs too, and the same test is made of iterations 1 and
   2, where an iteration may also use the buffers the one before it made.
4. From the first iteration whose guards change (a ragged last tile, ``if i == n - 1``),
   or for the whole loop if it is tainted, iterations run one by one.

Nested loops replicate inside out: an outer iteration holds its inner loops' replicas
(so a nest of depth d traces about 2**d bodies), and the inner loops' guards, over the
inner ranges they were checked on, must keep their outcomes over the outer range too.
Guards are kept without repeats, and a finished loop hands its parent the guards of its
iterations merged where their ranges meet.

A replica is written only where it passes the tile limits its offsets decide (bounds,
start partitions, PSUM banks); from the first that would not, iterations run as Python
runs them (where the tile language may take another route, e.g. not retarget a result).

What is compared is what the body can observe: its local variables (values,
containers, tiles and tensors by buffer and view, Syms by their affine form), the
tracer's state of each buffer it touched, and the instructions. Objects of other types
are compared by identity: a body that mutates such an object (or a global) in a way that
changes what later iterations emit is outside this scheme. ``TILESCOPE_TRACE_REPLICATE=0``
traces every iteration: the reference path, which gives the same Program (the tests
check that on many kernels).
"""

from __future__ import annotations

import dataclasses
import sys
from bisect import bisect_left
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from ..isa import AP
from ..isa import field_access
from ..program import operands_of as _operands
from ._context import BufStates, maybe_current
from ._index_expr import Check, IndexExpr, MGrid, Predicate
from ._sym import Sym
from ._values import Tensor, Tile

__all__ = ["Loop", "Guard", "record_guard", "loop_range", "replication_enabled"]

_MIN_ITERATIONS = 4  # shorter loops run as Python runs them (samples would be most of them)


def replication_enabled() -> bool:
    from .._env import flag

    return flag("TILESCOPE_TRACE_REPLICATE", True)


def record_guard(coefs: dict, diff: int, op: str, outcome: bool) -> None:
    """A comparison ``sum(coef_L * x_L) + base  op  0`` gave ``outcome`` (``diff`` is the
    compared difference's value now): keep it with the innermost loop tracing samples."""
    ctx = maybe_current()
    if ctx is None or not ctx.loops:
        return
    if any(not lp.active for lp in coefs):
        for lp in coefs:
            lp.taint("a value computed from a finished loop's index is compared")
        return
    base = diff - sum(c * lp.x for lp, c in coefs.items())
    ctx.loops[-1].guards.append(Guard(tuple(coefs.items()), base, op, outcome, ()))


class Guard:
    """``outcome == (sum(coef * x) + base  op  0)``, asserted over ``boxes`` ((loop, lo, hi):
    ranges of inner loops' indices); other loops' indices take their current values.
    (Not changed once made; a plain class: loops make thousands.)"""

    __slots__ = ("coefs", "base", "op", "outcome", "boxes", "_key")

    def __init__(self, coefs: tuple, base: int, op: str, outcome: bool, boxes: tuple):
        self.coefs, self.base, self.op, self.outcome, self.boxes = coefs, base, op, outcome, boxes
        self._key: tuple | None = None

    def __repr__(self) -> str:
        return f"Guard({self.key()!r})"

    def key(self) -> tuple:
        k = self._key
        if k is None:
            k = self._key = (tuple((lp.key, c) for lp, c in self.coefs), self.base, self.op, self.outcome,
                             tuple((lp.key, lo, hi) for lp, lo, hi in self.boxes))
        return k

    def holds(self, loop: "Loop", xs: np.ndarray) -> np.ndarray:
        """Per value in ``xs`` of ``loop``'s index: is the outcome the same over the boxes?"""
        box = {lp: (lo, hi) for lp, lo, hi in self.boxes}
        lo = np.full(len(xs), self.base, dtype=np.int64)
        hi = lo.copy()
        for lp, c in self.coefs:
            if lp is loop:
                lo += c * xs
                hi += c * xs
            elif lp in box:
                a, b = box[lp]
                lo += min(c * a, c * b)
                hi += max(c * a, c * b)
            else:
                lo += c * lp.x
                hi += c * lp.x
        op = self.op
        if op == "<":
            t, f = hi < 0, lo >= 0
        elif op == "<=":
            t, f = hi <= 0, lo > 0
        elif op == ">":
            t, f = lo > 0, hi <= 0
        elif op == ">=":
            t, f = lo >= 0, hi < 0
        elif op == "==":
            t, f = (lo == 0) & (hi == 0), (lo > 0) | (hi < 0)
        else:  # !=
            t, f = (lo > 0) | (hi < 0), (lo == 0) & (hi == 0)
        return t if self.outcome else f


_OUTCOMES = {  # op -> (lowest, highest value of the compared difference) -> (surely true, surely false)
    "<": lambda lo, hi: (hi < 0, lo >= 0),
    "<=": lambda lo, hi: (hi <= 0, lo > 0),
    ">": lambda lo, hi: (lo > 0, hi <= 0),
    ">=": lambda lo, hi: (lo >= 0, hi < 0),
    "==": lambda lo, hi: (lo == 0 and hi == 0, lo > 0 or hi < 0),
    "!=": lambda lo, hi: (lo > 0 or hi < 0, lo == 0 and hi == 0),
}


def _guards_hold(guards: list, loop: "Loop", k0: int) -> int:
    """How many iterations of ``loop`` from iteration ``k0`` on keep every guard's outcome
    (integer arithmetic on short loops; :meth:`Guard.holds` on arrays for long ones)."""
    n = loop.n - k0
    if n > 64:
        xs = loop.start + np.arange(k0, loop.n, dtype=np.int64) * loop.step
        ok = np.ones(n, dtype=bool)
        for g in guards:
            ok &= g.holds(loop, xs)
        bad = np.flatnonzero(~ok)
        return int(bad[0]) if len(bad) else n
    for g in guards:
        box = {lp: (lo, hi) for lp, lo, hi in g.boxes}
        lo0 = hi0 = g.base
        c0 = 0
        for lp, c in g.coefs:
            if lp is loop:
                c0 += c
            elif lp in box:
                a, b = box[lp]
                lo0 += min(c * a, c * b)
                hi0 += max(c * a, c * b)
            else:
                lo0 += c * lp.x
                hi0 += c * lp.x
        test, want = _OUTCOMES[g.op], 0 if g.outcome else 1
        x, step = loop.start + k0 * loop.step, loop.step
        for k in range(n):
            if not test(lo0 + c0 * x, hi0 + c0 * x)[want]:
                n = k
                break
            x += step
    return n


def _unique(guards: list) -> list:
    """``guards`` without repeats (a guard asserts the same thing each time it is recorded)."""
    seen = set()
    out = []
    for g in guards:
        k = g.key()
        if k not in seen:
            seen.add(k)
            out.append(g)
    return out


def _merged(guards: list, loop: "Loop") -> list:
    """What a finished ``loop`` hands its parent: its guards without repeats, those that
    differ only in their range of ``loop``'s index merged where the ranges meet (so a loop
    replicated from iteration 1 and one replicated from iteration 2 hand up the same)."""
    step = abs(loop.step)
    groups: dict = {}
    for g in guards:
        box = None
        for b in g.boxes:
            if b[0] is loop:
                box = b
        if box is None:
            groups.setdefault(("=", g.key()), [g, None])
            continue
        rest = tuple(b for b in g.boxes if b is not box)
        k = (tuple((lp.key, c) for lp, c in g.coefs), g.base, g.op, g.outcome,
             tuple((lp.key, lo, hi) for lp, lo, hi in rest))
        hit = groups.get(k)
        if hit is None:
            groups[k] = [Guard(g.coefs, g.base, g.op, g.outcome, rest), [(box[1], box[2])]]
        else:
            hit[1].append((box[1], box[2]))
    out = []
    for g, ranges in groups.values():
        if ranges is None:
            out.append(g)
            continue
        ranges.sort()
        lo, hi = ranges[0]
        for a, b in ranges[1:]:
            if a <= hi + step:
                hi = max(hi, b)
            else:
                out.append(Guard(g.coefs, g.base, g.op, g.outcome, g.boxes + ((loop, lo, hi),)))
                lo, hi = a, b
        out.append(Guard(g.coefs, g.base, g.op, g.outcome, g.boxes + ((loop, lo, hi),)))
    return out


def _boxed(guards, loop: "Loop", lo: int, hi: int) -> list:
    """Guards of ``loop``'s iterations over index values [lo, hi], for its parent."""
    out = []
    for g in guards:
        if any(lp is loop for lp, _ in g.coefs):
            out.append(Guard(g.coefs, g.base, g.op, g.outcome, g.boxes + ((loop, min(lo, hi), max(lo, hi)),)))
        else:
            out.append(g)
    return out


@dataclass
class _Iteration:
    k: int
    x: int
    instr0: int
    buf0: int
    log0: int
    instr1: int = -1
    buf1: int = -1
    log1: int = -1
    guards: list = field(default_factory=list)
    serial: int = 0
    locals_raw: dict | None = None
    states: tuple | None = None  # (see _states)
    skip: tuple = ()  # iteration 0's fills of earlier buffers (instructions) -- see _first_fills


def loop_range(ctx, label: str, start: int, stop: int, step: int, frame):
    """The iterable of a language loop: a :class:`Loop` when it may be replicated, else a range."""
    n = len(range(start, stop, step))
    if n < _MIN_ITERATIONS or ctx is None or ctx.fail_at is not None or not replication_enabled():
        return range(start, stop, step)
    return Loop(ctx, label, start, step, n, frame)


class Loop:
    """One traced language loop (see the module docs)."""

    def __init__(self, ctx, label: str, start: int, step: int, n: int, frame):
        self.ctx = ctx
        self.label = label
        self.start, self.step, self.n = start, step, n
        self.frame = frame  # the frame running the `for` statement
        # the same loop of every iteration of enclosing loops has the same key
        self.key = (id(frame.f_code), frame.f_lasti, len(ctx.loops))
        self.k = -1
        self.x = start
        self.serial = 0
        self.active = False
        self.finished = False
        self.tainted: str | None = None
        self.concrete = False
        self.iters: list[_Iteration | None] = []  # (None: an iteration no longer needed)
        self.guards: list = []  # of the iteration running
        self.done_guards: list = []  # of finished iterations, boxed: handed to the parent
        self.replicated = 0
        self.why_not: str | None = None

    def __repr__(self) -> str:
        return f"<loop {self.label} at {self.x}>"

    def taint(self, why: str) -> None:
        if self.tainted is None:
            self.tainted = why

    def __iter__(self):
        return self

    # ---- the iteration protocol --------------------------------------------------------------
    def __next__(self):
        if self.k >= 0:
            self._end_iteration()
        else:
            self.active = True
            self.ctx.loops.append(self)
        loops = self.ctx.loops
        while loops and loops[-1] is not self:  # an inner loop left by `break`: done
            loops[-1]._finish()
        self.k += 1
        if self.k == 2 and not self.concrete:
            self.k = self._replicate(1)
        if self.k == 3 and not self.concrete:
            self.k = self._replicate(2)
        if self.k >= self.n:
            self._finish()
            raise StopIteration
        self.x = self.start + self.k * self.step
        self.serial += 1
        b = self.ctx.b
        self.iters.append(_Iteration(self.k, self.x, b.instruction_count, b.buffer_count,
                                     len(self.ctx.touch_log), serial=self.serial))
        self.guards = []
        if self.concrete:
            return self.x
        return Sym(self.x, {self: 1}, ((self, self.serial),))

    def _end_iteration(self) -> None:
        it = self.iters[-1]
        assert it is not None  # (only older iterations are dropped)
        ctx = self.ctx
        it.instr1, it.buf1, it.log1 = ctx.b.instruction_count, ctx.b.buffer_count, len(ctx.touch_log)
        it.guards = _unique(self.guards)
        self.done_guards.extend(_boxed(it.guards, self, it.x, it.x))
        self.guards = []
        if it.k <= 2 and not self.concrete and self.tainted is None:
            if it.k == 0:
                it.skip = _first_fills(ctx, it)
            it.locals_raw = dict(self.frame.f_locals)
            it.states = _states(ctx, _Canon(self, it), it)
        if len(self.iters) > 3:  # keep what replication and the locals need
            self.iters[-4] = None

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.active = False
        f = self.frame
        key = (f.f_code.co_filename, f.f_lineno if f is not None else 0)
        stat = self.ctx.loop_stats.setdefault(key, [self.label, 0, 0, None])
        stat[1] += self.n
        stat[2] += self.replicated
        if self.why_not and stat[3] is None:
            stat[3] = self.why_not
        loops = self.ctx.loops
        if self in loops:
            while loops and loops[-1] is not self:  # inner loops left by a break
                loops[-1]._finish()
            loops.pop()
        if loops:  # (guards of an iteration left by `break` too)
            loops[-1].guards.extend(_merged(self.done_guards + _boxed(self.guards, self, self.x, self.x), self))
        self.iters = []
        self.frame = None  # (the frame holds Syms that hold this loop)

    # ---- replication ------------------------------------------------------------------------
    def _replicate(self, t: int) -> int:
        """Write iterations t+1.. as iteration ``t`` (1 or 2) shifted while that is sound;
        returns the first iteration still to run (the loop's end if all were written). A
        first try (t=1) that fails runs iteration 2 for a second (t=2)."""
        it0, it1, it2 = (None,) + tuple(self.iters[:2]) if t == 1 else tuple(self.iters[:3])
        assert it1 is not None and it2 is not None  # (iterations 1 and 2 are kept)
        plan = None
        if t == 1 and self.tainted is None and not _cheap_match(self.ctx, it1, it2):
            return 2  # (iteration 0 is special: a first try that cannot pass, without its costly tests)
        differ = _locals_differ(self, it1, it2) if it1.locals_raw is not None and it2.locals_raw is not None else None
        if self.tainted is not None or it1.locals_raw is None or it2.locals_raw is None:
            self.why_not = self.tainted or "not sampled"
        elif differ:
            self.why_not = "the local variables differ between iterations: " + ", ".join(differ)[:200]
        elif it1.states != it2.states:
            self.why_not = "the tracer's buffer states differ between iterations"
            import os
            if os.environ.get("TILESCOPE_DEBUG_LOOPS"):
                a, b = it1.states, it2.states
                assert a is not None and b is not None  # (sampled, as the locals were)
                print("STATES", self, a[1:], b[1:])
                for x, y in zip(a[0], b[0]):
                    if x != y:
                        print("  ", x, "\n  ", y)
                        break
                print(len(a[0]), len(b[0]))
        elif not _same_guards(it1.guards, it2.guards):
            self.why_not = "the iterations compared different values"
        else:
            plan = _plan(self.ctx, it0, it1, it2, skip=it1.skip if it0 is None else ())
            if plan is None:
                self.why_not = "the iterations' instructions differ beyond a shift"
        if plan is None:
            if t == 1:
                self.why_not = None
                return 2
            self.concrete = True
            return 3
        plan.t = t
        end = t + 1 + _guards_hold(it2.guards, self, t + 1)
        self.concrete = True
        off = _replica_offsets(plan, end - t - 1)
        bad = self.ctx.b.first_bad_replica(plan.tmpl, plan.buf, off, fixed=plan.delta == 0)
        if bad is not None:  # (that iteration runs: a retarget there takes another route)
            end, off = t + 1 + bad, off[:bad]
        if end == t + 1:
            return end
        count = end - t - 1
        _emit_replicas(self.ctx, plan, it2, count, off)
        self.replicated = count
        last = end - 1
        # iterations 1 .. last keep the template's guards (iterations 1 and 2 had the same ones)
        self.done_guards = [g for g in self.done_guards if not _about(g, self, it1.x, it2.x)]
        self.done_guards.extend(_boxed(it2.guards, self, it1.x, self.start + last * self.step))
        _patch_states(self.ctx, plan, it2, last)
        _patch_locals(self, plan, it1, it2, last)
        return end


def _about(g: Guard, loop: Loop, lo: int, hi: int) -> bool:
    """Is ``g`` a guard of ``loop`` boxed to one of its iterations in [lo, hi]?"""
    for lp, a, b in g.boxes:
        if lp is loop:
            return lo <= a and b <= hi and a == b
    return False


def _first_fills(ctx, it: _Iteration) -> tuple:
    """The memsets iteration ``it`` emitted to fill buffers made before it (``tl.zeros``
    first read in a loop's first iteration): they happen once, before every later iteration,
    so comparing iteration 0 with iteration 1 leaves them out."""
    out = []
    for idx, buf in reversed(ctx.materialized):
        if idx < it.instr0:
            break
        if idx < it.instr1 and buf < it.buf0:
            out.append(idx)
    return tuple(sorted(out))


def _cheap_match(ctx, it1: _Iteration, it2: _Iteration) -> bool:
    """Could ``it2`` be ``it1`` shifted, by what is cheapest to compare: the counts of
    instructions and buffers, the guards and the instructions' templates and provenance?
    (False only where :func:`_plan` or the guard test would fail.)"""
    m = it2.instr1 - it2.instr0
    if m == 0 or it1.instr1 - it1.instr0 - len(it1.skip) != m or it1.buf1 - it1.buf0 != it2.buf1 - it2.buf0:
        return False
    if not _same_guards(it1.guards, it2.guards):
        return False
    if it1.skip:
        return True
    t1, p1, _, _ = ctx.b.rows(it1.instr0, it1.instr1)
    t2, p2, _, _ = ctx.b.rows(it2.instr0, it2.instr1)
    if not _same(p1, p2):
        return False
    if _same(t1, t2):
        return True
    tk = _template_keys(ctx)
    return _same(tk[t1], tk[t2])


def _same_guards(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.key() == y.key() for x, y in zip(a, b))


# ---- what an iteration leaves: locals and buffer states, canonical ------------------------------

class _Canon:
    """Canonical forms relative to one iteration: buffers it made are ``new``, buffers the
    iteration before made are ``prev``; Syms by their affine form; index variables by order."""

    def __init__(self, loop: Loop, it: _Iteration):
        self.b = loop.ctx.b
        self.loop, self.serial, self.x = loop, it.serial, it.x  # Syms of the loop as of this iteration
        self.new = (it.buf0, it.buf1)
        prev = loop.iters[it.k - 1] if it.k >= 1 and len(loop.iters) >= 2 else None
        self.prev = (prev.buf0, prev.buf1) if prev is not None else (0, 0)
        self.vars: dict[int, int] = {}

    def buf(self, name: str):
        i = self.b.buffer_id(name)
        if self.new[0] <= i < self.new[1]:
            return ("new", i - self.new[0])
        if self.prev[0] <= i < self.prev[1]:
            return ("prev", i - self.prev[0])
        return ("old", name)

    def int_(self, v):
        if v.__class__ is Sym:
            loop = self.loop
            for lp, serial in v.stamp:
                if (serial != self.serial) if lp is loop else (lp.serial != serial or not lp.active):
                    return ("stale", id(v))
            return ("sym", v.value - sum(c * (self.x if lp is loop else lp.x) for lp, c in v.coefs.items()),
                    tuple(sorted((id(lp), c) for lp, c in v.coefs.items())))
        return v

    def var(self, v: int) -> int:
        return self.vars.setdefault(v, len(self.vars))

    def __call__(self, v, depth: int = 0):
        c = v.__class__
        if v is None or c in (bool, int, float, str, bytes, complex):
            return v
        if c is Sym:
            return self.int_(v)
        if depth > 6:
            return ("deep", id(v))
        if c is Tile or c is Tensor:
            return (c.__name__, self.buf(v.buffer.name), self.int_(v.offset), v.dims,
                    tuple((ch.dim, ch.size, self.int_(ch.const), ch.coefs) for ch in v.checks),
                    tuple((self.var(var), a) for var, a in v.axis_vars), getattr(v, "pdim", 0),
                    getattr(v, "inplace", False))
        if c is IndexExpr:
            return ("ix", v.shape, self.int_(v.const), tuple((self.var(var), a, k) for var, a, k in v.terms))
        if c is MGrid:
            return ("mgrid", tuple(self(e, depth + 1) for e in v.exprs))
        if c is Predicate:
            return ("pred", tuple((self(e, depth + 1), op) for e, op in v.conditions))
        if c is slice:
            return ("slice", self(v.start, depth + 1), self(v.stop, depth + 1), self(v.step, depth + 1))
        if c is tuple or c is list:
            return (c.__name__, tuple(self(x, depth + 1) for x in v))
        if c is dict:
            return ("dict", tuple((self(k, depth + 1), self(x, depth + 1)) for k, x in v.items()))
        if isinstance(v, np.generic):
            return ("np", v.dtype.str, v.item())
        return ("obj", id(v))


_MUTABLE = (list, dict, set, tuple, Tile)


def _locals_differ(loop: Loop, it1: _Iteration, it2: _Iteration) -> list[str]:
    """Local variables that are not the same up to the shift from iteration 1 to 2 (an object
    left untouched is the same; containers and tiles are compared by their canonical form)."""
    l1, l2 = it1.locals_raw, it2.locals_raw
    assert l1 is not None and l2 is not None  # (both iterations sampled)
    if l1.keys() != l2.keys():
        return sorted(set(l1) ^ set(l2))
    c1, c2 = _Canon(loop, it1), _Canon(loop, it2)
    out = []
    for name, a in l1.items():
        b = l2[name]
        if a is b and not isinstance(a, _MUTABLE):
            continue
        if c1(a) != c2(b):
            out.append(name)
    return out


def _states(ctx, canon: _Canon, it: _Iteration):
    """The tracer's state of every buffer the iteration touched (writers relative to it)."""
    out = []
    for name in set(ctx.touch_log[it.log0:it.log1]):
        st = ctx.states.get(name)
        if st is None:
            continue
        key = canon.buf(name)
        writer = st.writer - it.instr0 if st.writer >= it.instr0 else ("before",)
        if it.skip and st.writer >= it.instr0:  # (iteration 0's first fills count as before it)
            writer = ("before",) if st.writer in it.skip else st.writer - it.instr0 - bisect_left(it.skip, st.writer)
        writes = st.writes if key[0] != "old" else st.writes > 0
        out.append((key, st.fill, st.temp, st.read, writes, writer, tuple(sorted(st.acc_open))))
    out.sort(key=itemgetter(0))  # (the keys are distinct: one per buffer)
    return (tuple(out), len(ctx.consts), len(ctx.constants), len(ctx.hooks), len(ctx.hbm_shared))


# ---- iteration 2 as a template -----------------------------------------------------------------

@dataclass
class _Plan:
    """How iteration k is iteration 2 shifted, as columns: iteration 2's rows (templates,
    provenance, buffer ids, offsets), each operand's offset step, and which operands are
    the iteration's own buffers (``new``) or the previous iteration's (``prev``)."""

    tmpl: np.ndarray
    prov: np.ndarray
    buf: np.ndarray
    off: np.ndarray
    delta: np.ndarray
    new: np.ndarray  # bool [m, K]
    prev: np.ndarray
    c1: int  # first buffer id of iteration t-1
    c2: int  # ... of iteration t (the template)
    nb: int  # buffers per iteration
    touched_old: set
    t: int = 2  # the template iteration
    first_replica: int = -1  # buffer id of iteration t+1's first buffer

    @property
    def n_instr(self) -> int:
        return len(self.tmpl)

    def buffer_id(self, k: int, q: int) -> int:
        """Buffer ``q`` of iteration ``k`` (>= t-1)."""
        if k == self.t - 1:
            return self.c1 + q
        if k == self.t:
            return self.c2 + q
        return self.first_replica + (k - self.t - 1) * self.nb + q


_BUFFER_FIELDS = ("memory", "shape", "dtype", "role", "site", "bufs")
_KEYS: dict = {}  # shape of a template or a buffer record -> a small integer


def _template_keys(ctx) -> np.ndarray:
    """Per template of the builder, an id of its shape (kind, plain fields, operands' dtypes
    and dims): rows whose templates have one id differ only in buffers and offsets."""
    b = ctx.b
    have = ctx.template_keys.get("arr")
    n = len(b._templates)
    if have is None or len(have) != n:
        start = 0 if have is None else len(have)
        add = []
        for t in range(start, n):
            instr = b.template(t)
            key = (instr.__class__, _plain_fields(instr), tuple((ap.dtype, ap.dims) for ap in _operands(instr)))
            add.append(_KEYS.setdefault(key, len(_KEYS)))
        new = np.asarray(add, dtype=np.int64)
        have = ctx.template_keys["arr"] = new if have is None else np.concatenate([have, new])
    return have


def _kind_keys(ctx) -> list:
    """Per buffer record of the builder, an id of its fields but the name."""
    b = ctx.b
    have = ctx.template_keys.setdefault("kinds", [])
    for k in b._kinds[len(have):]:
        have.append(_KEYS.setdefault(("buffer",) + tuple(getattr(k, f) for f in _BUFFER_FIELDS), len(_KEYS)))
    return have


def _plain_fields(instr) -> tuple:
    names, values = field_access(type(instr))
    out = []
    for name, v in zip(names, values(instr)):
        if v.__class__ is AP:
            continue
        if v.__class__ is tuple and any(x.__class__ is AP for x in v):
            v = tuple(None if x.__class__ is AP else x for x in v)
        if isinstance(v, float) and v != v:
            v = "nan"
        out.append((name, v))
    return tuple(out)


def _plan(ctx, it0: _Iteration | None, it1: _Iteration, it2: _Iteration, skip: tuple = ()) -> _Plan | None:
    """Iteration ``it2`` as ``it1`` shifted (a template for later ones), or None. Without
    ``it0`` (``it1`` is the loop's first iteration), ``it2`` may not use ``it1``'s buffers;
    ``skip``: instructions of ``it1`` left out (its first fills)."""
    b = ctx.b
    m = it2.instr1 - it2.instr0
    if it1.instr1 - it1.instr0 - len(skip) != m or m == 0:
        return None
    nb = it2.buf1 - it2.buf0
    if it1.buf1 - it1.buf0 != nb:
        return None
    kk = np.asarray(_kind_keys(ctx), dtype=np.int64)
    kind = b.kind_array()
    if not _same(kk[kind[it1.buf0:it1.buf1]], kk[kind[it2.buf0:it2.buf1]]):
        return None
    t1, p1, b1, o1 = b.rows(it1.instr0, it1.instr1)
    if skip:
        keep = np.ones(it1.instr1 - it1.instr0, dtype=bool)
        keep[np.asarray(skip) - it1.instr0] = False
        t1, p1, b1, o1 = t1[keep], p1[keep], b1[keep], o1[keep]
    t2, p2, b2, o2 = b.rows(it2.instr0, it2.instr1)
    if not _same(p1, p2):
        return None
    tk = _template_keys(ctx)
    if not _same(tk[t1], tk[t2]):
        return None
    valid = b2 >= 0
    if not _same(valid, b1 >= 0):
        return None
    c1, c2 = it1.buf0, it2.buf0
    new = valid & (b2 >= c2) & (b2 < c2 + nb)
    prev = valid & (b2 >= c1) & (b2 < c1 + nb)
    if np.count_nonzero(prev) and (it0 is None or it0.buf1 - it0.buf0 != nb):
        return None  # (it1 uses it0's buffers as it2 uses it1's, checked below)
    c0 = it0.buf0 if it0 is not None else c1
    old = valid & ~new & ~prev
    if not (_same(b1[new], b2[new] - c2 + c1) and _same(b1[prev], b2[prev] - c1 + c0) and _same(b1[old], b2[old])):
        return None
    touched_old = {b.buffer_name(int(x)) for x in np.unique(b2[old])}
    return _Plan(t2.copy(), p2.copy(), b2.copy(), o2.copy(), o2 - o1, new, prev, c1, c2, nb, touched_old)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal arrays of one dtype (np.array_equal without its overhead: bodies are small)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _replica_offsets(plan: _Plan, count: int) -> np.ndarray:
    """Operand offsets [count, m, width] of iterations t+1 .. t+count."""
    steps = np.arange(1, count + 1, dtype=np.int64)[:, None, None]
    return plan.off[None, :, :] + steps * plan.delta[None, :, :]


def _emit_replicas(ctx, plan: _Plan, it2: _Iteration, count: int, off: np.ndarray) -> None:
    """Append iterations t+1 .. t+count: their buffers and instructions (iteration t's, shifted,
    at offsets ``off``, checked)."""
    b = ctx.b
    plan.first_replica = b.add_replica_buffers(list(range(plan.c2, plan.c2 + plan.nb)), count)
    m, width = plan.buf.shape
    t = plan.t
    ks = np.arange(t + 1, t + 1 + count, dtype=np.int64)
    base_new = (plan.first_replica + (ks - t - 1) * plan.nb)[:, None, None]  # buffer q of iteration k
    base_prev = np.where(ks == t + 1, plan.c2, plan.first_replica + (ks - t - 2) * plan.nb)[:, None, None]
    buf = np.broadcast_to(plan.buf[None, :, :], (count, m, width)).astype(np.int64)
    buf = np.where(plan.new[None], base_new + (plan.buf[None] - plan.c2), buf)
    buf = np.where(plan.prev[None], base_prev + (plan.buf[None] - plan.c1), buf)
    b.extend_rows(np.tile(plan.tmpl, count), np.tile(plan.prov, count), buf.reshape(count * m, width).astype(np.int32),
                  off.reshape(count * m, width))


def _patch_states(ctx, plan: _Plan, it2: _Iteration, last: int) -> None:
    """The tracer's state of the buffers after iteration ``last``: iteration t's, shifted."""
    shift = (last - plan.t) * plan.n_instr
    for name in plan.touched_old:
        st = ctx.states.get(name)
        if st is not None and st.writer >= it2.instr0:
            st.writer += shift
    # the replicas' states are records, made into states when something asks for them (BufStates)
    have = _template_states(ctx, plan)
    stated = ctx.replica_states
    record, pending, t, n_instr, start = BufStates.record, ctx.states.pending, plan.t, plan.n_instr, it2.instr0
    for k in (last - 1, last):
        if k <= t:
            continue
        base = plan.buffer_id(k, 0)
        for q, st in have:
            i = base + q
            stated.add(i)
            if st.__class__ is tuple:
                w = st[7]
                pending[i] = st if w < start else st[:7] + (w + (k - t) * n_instr,) + st[8:]
            else:
                w = st.writer
                pending[i] = record(st, w + (k - t) * n_instr if w >= start else w)


def _template_states(ctx, plan: _Plan) -> list:
    """(q, state or record) of the template's buffers with a state: those it made by tracing
    (named) and the replicas that were given one (the last iterations of its own inner loops)."""
    names, stated, states = ctx.b._names, ctx.replica_states, ctx.states
    c2 = plan.c2
    have = []
    for q, name in enumerate(names[c2:c2 + plan.nb]):
        if name is not None:
            st = dict.get(states, name)
        elif c2 + q in stated:
            st = states.of_id(c2 + q)
        else:
            continue
        if st is not None:
            have.append((q, st))
    return have


# ---- the kernel's local variables after the written iterations ----------------------------------

def _patch_locals(loop: Loop, plan: _Plan, it1: _Iteration, it2: _Iteration, last: int) -> None:
    """Set the loop frame's locals to what iteration ``last`` leaves (iteration t's, shifted);
    the loop index becomes its value there."""
    ctx = loop.ctx
    b = ctx.b
    steps = last - plan.t
    x_last = loop.start + last * loop.step

    def int_(v2, v1):
        if v2.__class__ is Sym:
            c = v2.coefs.get(loop, 0)
            value = v2.value + c * (x_last - it2.x)
            coefs = {lp: cc for lp, cc in v2.coefs.items() if lp is not loop}
            return Sym._make(value, coefs) if coefs else value
        if v1.__class__ is Sym:
            v1 = v1.value
        if v2.__class__ is int and v1.__class__ is int:
            return v2 + steps * (v2 - v1)
        return v2

    def name_of(name: str) -> str:
        i = b.buffer_id(name)
        if plan.c2 <= i < plan.c2 + plan.nb:
            return b.buffer_name(plan.buffer_id(last, i - plan.c2))
        if plan.c1 <= i < plan.c1 + plan.nb:
            return b.buffer_name(plan.buffer_id(last - 1, i - plan.c1))
        return name

    def shift(v2, v1, depth=0):
        if v2 is v1:  # (left as it was by iteration t: the same after every later one -- _locals_differ)
            return v2
        c = v2.__class__
        if c is Sym:
            return int_(v2, v1)
        if c is Tile or c is Tensor:
            name = name_of(v2.buffer.name)
            buf = b.buffer(name) if name != v2.buffer.name else v2.buffer
            off = int_(v2.offset, v1.offset)
            checks = tuple(Check(ch.dim, ch.size, int_(ch.const, c1.const), ch.coefs)
                           for ch, c1 in zip(v2.checks, v1.checks))
            if c is Tile:
                t = Tile(buf, off, v2.dims, checks, v2.axis_vars, pdim=v2.pdim,
                         state=ctx.states.get(buf.name, v2.state))
                t.inplace = v2.inplace
                return t
            return Tensor(buf, off, v2.dims, checks, v2.axis_vars)
        if c is IndexExpr:
            return IndexExpr(v2.shape, int_(v2.const, v1.const), v2.terms)
        if depth < 6 and (c is tuple or c is list) and len(v1) == len(v2):
            return c(shift(a, a1, depth + 1) for a, a1 in zip(v2, v1))
        if depth < 6 and c is dict:
            return {key: shift(a, v1[key], depth + 1) for key, a in v2.items()}
        return v2

    updates = {}
    assert it1.locals_raw is not None and it2.locals_raw is not None  # (both iterations sampled)
    for name, v2 in it2.locals_raw.items():
        nv = shift(v2, it1.locals_raw.get(name, v2))
        if nv is not v2:
            updates[name] = nv
    if updates:
        _write_locals(loop.frame, updates)


def _write_locals(frame, updates: dict) -> None:
    if sys.version_info >= (3, 13):  # pragma: no cover - PEP 667: frame locals write through
        for k, v in updates.items():
            frame.f_locals[k] = v
        return
    import ctypes

    local = frame.f_locals
    local.update(updates)
    ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))
