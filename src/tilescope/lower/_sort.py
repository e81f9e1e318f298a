"""``sort`` / ``argsort`` along the last dim as a bitonic sorting network on VectorE and TensorE.

NKI's ISA has no sort instruction; a sorting network is what its engines can run: each of the
``log2(N) * (log2(N) + 1) / 2`` stages compares ``N / 2`` pairs at once. A row (padded to a
power of two ``N``) is split into ``f`` pieces of ``S`` elements on ``f`` partitions -- enough
pieces that a piece fits SBUF, and more when rows are few, so a decode step's one row of 50257
logits uses the lanes -- with piece ``j`` of row ``r`` on partition ``j * rows + r``:

* a stage whose pairs lie in one piece is four VectorE instructions for the swap mask and four
  selects (keys and tie-break ranks), over access patterns of the piece: pairs in descending
  blocks swap roles through the patterns' strides, or through a per-partition flag once the
  blocks span pieces;
* a stage whose pairs lie in two pieces brings each partition its partner's piece with a
  permutation matrix on TensorE (``Perm.T @ keys`` into PSUM), then the same mask and selects.

Pairs compare (key, rank) lexicographically, the rank being the position plus a class offset, so
the sort is stable and exact about the values floats order badly: keys are finite (``+-inf``
clamp to the largest float, NaN to the largest in its direction) and the class (infinities,
NaN, padding) goes in the rank -- NaN after ``+inf`` (first when descending), padding last.
The sorted values come back from the keys and classes; no value is gathered.
"""

from __future__ import annotations

import numpy as np

from ..isa import AP
from ..program import TileBuilder, View
from ._call import Call, TensorMeta
from ._indirect import fits_or_declines, sb
from ._layout import hbm_input, hbm_output
from ._rules import Rule, add_rules
from ._vocab import rows_form

__all__ = ["lower_sort", "bitonic_stages"]

_MAX_S = 2048  # elements of a piece (per partition): its ping-pong tiles and temporaries fit SBUF
_MIN_S = 256  # pieces shorter than this do not pay for their cross-partition stages
_COLS = 512  # columns of one cross-partition permutation (one PSUM bank of fp32)
_FLOATS = ("float32", "bfloat16", "float16")
_BIG = float(np.finfo(np.float32).max)


def bitonic_stages(n: int):
    """``(k, j)`` per stage of the bitonic network on ``n`` (a power of two) elements.

    >>> list(bitonic_stages(8))
    [(2, 1), (4, 2), (4, 1), (8, 4), (8, 2), (8, 1)]
    """
    k = 2
    while k <= n:
        j = k // 2
        while j >= 1:
            yield k, j
            j //= 2
        k *= 2


def _view(t: View, p: int, offset: int, free) -> View:
    ap = t.ap
    row = t.shape[1]
    return View(t.buffer, AP(ap.buffer, ap.dtype, ap.offset + offset, ((row, p),) + tuple(free)),
                (p,) + tuple(c for _, c in free))


def _pairs(t: View, p: int, s: int, k: int, j: int):
    """(first, second) slots of the pairs of stage ``(k, j)`` within each ``s``-element piece. While
    blocks lie inside a piece (``2k <= s``), pairs of descending blocks swap roles by stride."""
    if 2 * k <= s:
        fa = ((2 * k, s // (2 * k)), (k + j, 2), (2 * j, k // (2 * j)), (1, j))
        fb = ((2 * k, s // (2 * k)), (k - j, 2), (2 * j, k // (2 * j)), (1, j))
    else:
        fa = fb = ((2 * j, s // (2 * j)), (1, j))
    return _view(t, p, 0, fa), _view(t, p, j, fb)


def _flat_as(t: View, shape) -> View:
    """A contiguous [p, m] tile seen with ``shape`` (row-major)."""
    dims, step = [], 1
    for c in reversed(shape[1:]):
        dims.append((step, c))
        step *= c
    ap = t.ap
    return View(t.buffer, AP(ap.buffer, ap.dtype, ap.offset, ((step, shape[0]),) + tuple(reversed(dims))), tuple(shape))


class _Pieces:
    """Per-partition constants of a tile of ``nr`` rows split into ``f`` pieces of ``s`` elements."""

    def __init__(self, b: TileBuilder, nr: int, f: int, s: int):
        self.b, self.nr, self.f, self.s, self.p = b, nr, f, s, nr * f
        p = self.p
        q = b.sbuf((p, 1), "float32", site="sort.q", bufs=1)
        b.iota(q, partition_step=1, steps=(0,))
        self.piece = self._div(q, nr, "sort.piece")  # j = q // nr
        self._flags: dict = {}
        self._perms: dict = {}

    def _div(self, t: View, d: int, site: str) -> View:
        """``floor(t / d)`` of a [p, 1] tile of non-negative integers."""
        b = self.b
        m = b.sbuf((self.p, 1), "float32", site=f"{site}.m", bufs=1)
        b.tensor_scalar(m, t, "mod", float(d))
        out = b.sbuf((self.p, 1), "float32", site=site, bufs=1)
        b.tensor_tensor(out, t, m, "subtract")
        b.tensor_scalar(out, out, "divide", float(d))
        return out

    def bit(self, unit: int) -> View:
        """[p, 1]: bit ``unit`` (a power of two, in pieces) of each partition's piece number."""
        hit = self._flags.get(unit)
        if hit is None:
            b = self.b
            hit = b.sbuf((self.p, 1), "float32", site=f"sort.bit{unit}", bufs=1)
            b.tensor_scalar(hit, self._div(self.piece, unit, f"sort.bitd{unit}"), "mod", 2.0)
            self._flags[unit] = hit
        return hit

    def perm(self, unit: int) -> View:
        """``Perm[k, m] = 1`` where partition ``m`` holds the partner piece (``j ^ unit``) of partition
        ``k``: ``Perm.T @ x`` brings each partition its partner's data."""
        hit = self._perms.get(unit)
        if hit is None:
            b, p = self.b, self.p
            partner = b.sbuf((p, 1), "float32", site=f"sort.partner{unit}", bufs=1)
            b.iota(partner, partition_step=1, steps=(0,))
            step = unit * self.nr
            # q + step on the lower side of a pair, q - step on the upper side
            b.tensor_scalar(partner, partner, "add", float(step))
            shift = b.sbuf((p, 1), "float32", site=f"sort.shift{unit}", bufs=1)
            b.tensor_scalar(shift, self.bit(unit), "multiply", float(2 * step))
            b.tensor_tensor(partner, partner, shift, "subtract")
            cols = b.sbuf((p, p), "float32", site=f"sort.cols{unit}", bufs=1)
            b.iota(cols, steps=(1,))
            hit = b.sbuf((p, p), "float32", site=f"sort.perm{unit}", bufs=1)
            b.tensor_scalar(hit, cols, "equal", partner)
            self._perms[unit] = hit
        return hit


def _swap_mask(b, m, a, bb, ta, tb, shape, site: str):
    """``m = 1`` where the first of a pair sorts after the second: (key, rank) compared."""
    half = int(np.prod(shape[1:]))
    e = _flat_as(b.sbuf((shape[0], half), "float32", site=f"{site}.eq", bufs=1), shape)
    t = _flat_as(b.sbuf((shape[0], half), "float32", site=f"{site}.tie", bufs=1), shape)
    b.tensor_tensor(m, a, bb, "greater")
    b.tensor_tensor(e, a, bb, "equal")
    b.tensor_tensor(t, ta, tb, "greater")
    b.select(m, e, t, m)  # equal keys: the ranks decide


def lower_sort(call: Call, spec):
    """``sort(self, dim=-1, descending)`` / ``sort.stable`` (and ``argsort``) over the last dim."""
    named = call.named()
    x = named.get("self")
    if not isinstance(x, TensorMeta) or x.dtype not in _FLOATS or not call.outputs:
        return None
    outs = call.outputs
    if call.packet == "argsort":
        vout, iout = None, outs[0]
    elif len(outs) == 2:
        vout, iout = outs
    else:
        return None
    dim = named.get("dim", -1)
    fx, fi = rows_form(x, dim), rows_form(iout, dim)
    fv = rows_form(vout, dim) if vout is not None else None
    if fx is None or fi is None or (vout is not None and fv is None) or iout.numel == 0:
        return None
    R, n, xrs = fx
    P = spec.partitions
    N = 1 << max(1, (n - 1).bit_length())
    f = 1
    while N // f > _MAX_S:
        f *= 2
    rows_p2 = 1 << (min(R, P) - 1).bit_length()
    while f * 2 * rows_p2 <= P and N // (2 * f) >= _MIN_S:
        f *= 2  # few rows: spread each over more partitions
    if f > P:
        return None
    S = N // f
    desc = bool(named.get("descending", False))
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xv = hbm_input(b, "in_self", x)
        vo = hbm_output(b, "values", vout) if vout is not None else None
        io = hbm_output(b, "indices" if vout is not None else "out", iout)
        consts: dict = {}
        nr_max = max(1, P // f)
        for r0 in range(0, R, nr_max):
            nr = min(nr_max, R - r0)
            pc = consts.get(nr) or consts.setdefault(nr, _Pieces(b, nr, f, S))
            _sort_tile(b, pc, x, xv, xrs, vout, vo, fv, iout, io, fi, r0, nr, n, N, S, f, desc)
    return b.build(meta={"lowering": "bitonic"})


def _rows_io(hv: View, rs: int, r0: int, nr: int, n: int, S: int, f: int):
    """(HBM AP, first partition, partitions, width) of the real (unpadded) part of each group of
    pieces: full pieces (one transfer), then the one partly filled."""
    ap = hv.ap
    full = min(f, n // S)
    out = []
    if full:
        out.append((AP(ap.buffer, ap.dtype, ap.offset + r0 * rs, ((S, full), (rs, nr), (1, S))), 0, full * nr, S))
    rest = n - full * S
    if rest > 0:
        out.append((AP(ap.buffer, ap.dtype, ap.offset + r0 * rs + full * S, ((rs, nr), (1, rest))), full * nr, nr, rest))
    return out


def _sort_tile(b, pc: _Pieces, x, xv, xrs, vout, vo, fv, iout, io, fi, r0, nr, n, N, S, f, desc) -> None:
    p = nr * f
    raw = b.sbuf((p, S), x.device_dtype, site="sort.raw", bufs=1)
    b.memset(raw, 0.0)
    for src, q0, cnt, w in _rows_io(xv, xrs, r0, nr, n, S, f):
        b.dma_copy(_view(raw, cnt, q0 * S, ((1, w),)), View(xv.buffer, src, src.shape))
    # rank = position + N * class: classes order what equal keys cannot (stable, infinities, NaN, padding)
    rank = b.sbuf((p, S), "float32", site="sort.rank", bufs=2)
    b.iota(rank, steps=(1,))
    base = b.sbuf((p, 1), "float32", site="sort.base", bufs=1)
    b.tensor_scalar(base, pc.piece, "multiply", float(S))
    b.tensor_scalar(rank, rank, "add", base)  # j * S + c
    key = b.sbuf((p, S), "float32", site="sort.key", bufs=2)
    cls = b.sbuf((p, S), "float32", site="sort.cls", bufs=1)
    tmp = b.sbuf((p, S), "float32", site="sort.tmp", bufs=1)
    sign = -1.0 if desc else 1.0
    # class: +inf and NaN after the largest float ascending (before it descending), -inf first
    b.tensor_scalar(cls, raw, "equal", float("inf"))
    b.tensor_scalar(tmp, raw, "equal", float("-inf"))
    b.tensor_tensor(cls, cls, tmp, "subtract")
    b.tensor_tensor(tmp, raw, raw, "not_equal")  # NaN
    b.tensor_scalar(tmp, tmp, "multiply", 2.0)
    b.tensor_tensor(cls, cls, tmp, "add")
    b.tensor_scalar(cls, cls, "multiply", sign)
    b.tensor_scalar(tmp, rank, "greater_equal", float(n))  # padding: last
    b.tensor_scalar(tmp, tmp, "multiply", 3.0)
    b.tensor_tensor(cls, cls, tmp, "add")
    b.tensor_scalar(tmp, cls, "multiply", float(N))
    b.tensor_tensor(rank, rank, tmp, "add")
    # key: the value (negated descending), finite: infinities clamp, NaN and padding sit at the top
    b.tensor_scalar(key, raw, "multiply", sign, "maximum", -_BIG)
    b.tensor_scalar(key, key, "minimum", _BIG)
    b.tensor_scalar(tmp, cls, "greater_equal", 2.0)
    b.select(key, _notb(b, tmp, p, S), key, _BIG)  # NaN (asc) and padding: the largest key
    b.tensor_scalar(tmp, cls, "equal", -2.0)
    b.select(key, _notb(b, tmp, p, S), key, -_BIG)  # NaN descending: the smallest key
    for k, j in bitonic_stages(N):
        nkey = b.sbuf((p, S), "float32", site="sort.key", bufs=2)
        nrank = b.sbuf((p, S), "float32", site="sort.rank", bufs=2)
        if j >= S:
            _cross_stage(b, pc, key, rank, nkey, nrank, p, S, k, j, N)
        else:
            a, bb = _pairs(key, p, S, k, j)
            ta, tb = _pairs(rank, p, S, k, j)
            m = _flat_as(b.sbuf((p, S // 2), "float32", site="sort.gt", bufs=1), a.shape)
            _swap_mask(b, m, a, bb, ta, tb, a.shape, "sort")
            if k >= S and k < N:  # descending blocks span pieces: a flag per partition
                b.tensor_scalar(m, m, "not_equal", pc.bit(k // S))
            na, nb = _pairs(nkey, p, S, k, j)
            nta, ntb = _pairs(nrank, p, S, k, j)
            b.select(na, m, bb, a)
            b.select(nb, m, a, bb)
            b.select(nta, m, tb, ta)
            b.select(ntb, m, ta, tb)
        key, rank = nkey, nrank
    # indices: the rank without its class; values: the key, or the class's infinity / NaN
    b.tensor_scalar(tmp, rank, "add", float(2 * N))
    idx = b.sbuf((p, S), "float32", site="sort.idx", bufs=1)
    b.tensor_scalar(idx, tmp, "mod", float(N))
    b.tensor_tensor(cls, tmp, idx, "subtract")
    b.tensor_scalar(cls, cls, "divide", float(N), "subtract", 2.0)
    ii = b.sbuf((p, S), "int64", site="sort.out_idx", bufs=1)
    b.tensor_copy(ii, idx)
    for dst, q0, cnt, w in _rows_io(io, fi[2], r0, nr, n, S, f):
        b.dma_copy(View(io.buffer, dst, dst.shape), _view(ii, cnt, q0 * S, ((1, w),)))
    if vo is None:
        return
    v = b.sbuf((p, S), "float32", site="sort.v", bufs=1)
    b.tensor_scalar(v, key, "multiply", sign)
    for c, value in ((1.0, float("inf")), (2.0, float("nan")), (-1.0, float("-inf"))):
        b.tensor_scalar(tmp, cls, "not_equal", c * sign)
        b.select(v, tmp, v, value)
    vals = b.sbuf((p, S), vout.device_dtype, site="sort.vals", bufs=1)
    b.tensor_copy(vals, v)
    for dst, q0, cnt, w in _rows_io(vo, fv[2], r0, nr, n, S, f):
        b.dma_copy(View(vo.buffer, dst, dst.shape), _view(vals, cnt, q0 * S, ((1, w),)))


def _notb(b: TileBuilder, t: View, p: int, s: int) -> View:
    out = b.sbuf((p, s), "float32", site="sort.not", bufs=1)
    b.tensor_scalar(out, t, "equal", 0.0)
    return out


def _cross_stage(b, pc: _Pieces, key, rank, nkey, nrank, p, S, k, j, N) -> None:
    """Pairs in two pieces: each partition gets its partner piece (``Perm.T @ x`` on TensorE), keeps
    the smaller or the larger by its side of the pair and its block's direction."""
    unit = j // S
    perm = pc.perm(unit)
    side = pc.bit(unit)  # 1 on the upper piece of a pair
    if k < N:
        keep_max = b.sbuf((p, 1), "float32", site=f"sort.keepmax{unit}.{k}", bufs=1)
        b.tensor_tensor(keep_max, side, pc.bit(k // S), "not_equal")
    else:
        keep_max = side
    for c0 in range(0, S, _COLS):
        cw = min(_COLS, S - c0)
        pk = b.psum((p, cw), "float32", site="sort.pk")
        b.matmul(pk, perm, key[:, c0:c0 + cw])
        pt = b.psum((p, cw), "float32", site="sort.pt")
        b.matmul(pt, perm, rank[:, c0:c0 + cw])
        m = b.sbuf((p, cw), "float32", site="sort.xgt", bufs=1)
        _swap_mask(b, m, key[:, c0:c0 + cw], pk, rank[:, c0:c0 + cw], pt, (p, cw), "sort.x")
        # mine sorts after my partner's: the lower side takes the partner's; the upper keeps its own
        b.tensor_scalar(m, m, "not_equal", keep_max)
        b.select(nkey[:, c0:c0 + cw], m, pk, key[:, c0:c0 + cw])
        b.select(nrank[:, c0:c0 + cw], m, pt, rank[:, c0:c0 + cw])


add_rules(["sort", "argsort"], Rule("bitonic", fits_or_declines(lower_sort), "sort: a bitonic network on VectorE"))
