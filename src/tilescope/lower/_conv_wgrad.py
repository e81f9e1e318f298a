"""A convolution's ``grad_weight`` and ``grad_bias``.

``grad_weight[co, ci, kh, kw] = sum over images and output pixels of
dy[n, co, oh, ow] * x[n, ci, oh*sh + kh*dh - ph, ow*sw + kw*dw - pw]``: a GEMM whose
contraction runs over pixels. TensorE contracts over partitions, so pixels must lie on
them -- without transposing the activations, the partitions hold **(row block, column
block, image)** triples: partition ``(b, c, n)`` holds, for every channel, the rows of
``x`` and ``dy`` that output rows ``[b*R, b*R + R)`` (and columns ``[c*C, c*C + C)``) of
image ``n`` use. For one local pixel of every block at once, the taps are a window of
the ``x`` tile (an access pattern over (ci, kh, kw): no copy), and TensorE accumulates

    ``acc[(ci, kh, kw), co] += x[(b, c, n), (ci, kh, kw)].T @ dy[(b, c, n), co]``

in PSUM over all local pixels (128 contraction rows when batch x blocks >= 128). The
``[(ci, kh, kw), co]`` result is transposed once at the end.

Row blocks hold whole rows, read in contiguous runs. Pixels near the left and right
edges, whose taps partly fall in the padding, accumulate separately over the taps that
are inside the image (so the tiles need no zero columns) and are added in at the end.
Small images are also split into column blocks (zero-padded tiles) to fill the 128
contraction rows. Consecutive row sub-blocks share their kernel-row halo: it is copied on
chip, not loaded again.

Groups are packed: several groups' channels go in one matmul and the blocks that pair
a group with another are masked out at the end (depthwise layers would otherwise
issue one tiny matmul per channel).

``grad_bias`` sums ``dy`` over images and pixels on VectorE, channels on partitions.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..program import TileBuilder, View
from ._conv import ConvGeom, _ceil_div, _Decline, _diag_mask, _hbm, _on_chip, _Queues

__all__ = ["grad_weight_program", "grad_bias_program"]

_ONE_SHOT = 150 * 1024  # bytes per partition: x and dy of a whole image block in one go
_X_BUDGET = 40 * 1024  # otherwise, per sub-block (double-buffered)
_DY_BUDGET = 16 * 1024
_ACC_BUDGET = 32 * 1024  # SBUF accumulators of one output group
_PSUM_ACCS = 3  # PSUM accumulators per pass: two passes in flight (6 of 8 banks)


class _LoadQueues(_Queues):
    """Round-robin DMA queues, the input loads on the odd ones and the results on the even
    ones: a queue issues in order, so a load behind a store would wait for the output group
    that store finishes instead of starting while that group computes, and the stores, each
    with its fixed issue cost, spread over queues of their own."""

    def next(self) -> int:
        q = super().next()
        return q if q % 2 else super().next()

    def store(self) -> int:
        q = super().next()
        return q if q % 2 == 0 else super().next()


@dataclass(frozen=True)
class _Pack:
    """Groups [g0, g0 + gn) whose grad_weight is computed together: output channels
    [n0, n0 + nn) of the pack, input channels in ``chunks`` of (first pack channel, count)."""

    g0: int
    gn: int
    n0: int
    nn: int
    chunks: tuple[tuple[int, int], ...]


def _packs(g: ConvGeom, P: int, nmax: int) -> list[_Pack]:
    taps = g.taps
    if taps > P:
        raise _Decline  # kernels over 128 taps: not handled
    rows_g = g.cin * taps
    if g.groups > 1 and rows_g <= P and g.cout <= P:
        gp = min(g.groups, P // g.cout, max(1, nmax // g.cout))  # the transposed result fits the partitions
        per = max(1, P // rows_g)  # whole groups per chunk
        return [_Pack(g0, min(gp, g.groups - g0), 0, min(gp, g.groups - g0) * g.cout,
                      tuple((c * g.cin, min(per, min(gp, g.groups - g0) - c) * g.cin)
                            for c in range(0, min(gp, g.groups - g0), per)))
                for g0 in range(0, g.groups, gp)]
    per_chunk = max(1, P // taps)  # input channels per 128-row chunk
    chunks = tuple((c, min(per_chunk, g.cin - c)) for c in range(0, g.cin, per_chunk))
    return [_Pack(grp, 1, o, min(nmax, g.cout - o), chunks) for grp in range(g.groups) for o in range(0, g.cout, nmax)]


class _GradWeight:
    def __init__(self, b: TileBuilder, spec, g: ConvGeom, X: View, xs, DY: View, dys, GW: View, gws, dtype, out_dtype):
        self.b, self.spec, self.g = b, spec, g
        self.X, self.xs, self.DY, self.dys, self.GW, self.gws = X, xs, DY, dys, GW, gws
        self.dtype, self.out_dtype = dtype, out_dtype
        P = self.P = spec.partitions
        self.isz = 2 if dtype in ("bfloat16", "float16") else 4
        self.nimg = min(g.n, P)
        nb = max(1, min(g.oh, P // self.nimg))
        self.R = _ceil_div(g.oh, nb)
        self.nb = _ceil_div(g.oh, self.R)
        # column blocks when rows alone leave most partitions idle
        cb = 1
        if 2 * self.nb * self.nimg <= P and g.ow > 1:
            cb = min(g.ow, P // (self.nb * self.nimg))
        self.C = _ceil_div(g.ow, cb)
        self.cb = _ceil_div(g.ow, self.C)
        self.padded = self.cb > 1
        self.parts = self.nb * self.cb * self.nimg
        # tile columns: padded windows of C output columns, or whole input rows
        self.wt = (self.C - 1) * g.sw + (g.kw - 1) * g.dw + 1 if self.padded else g.w
        self.classes = self._classes()
        self._dy_cache: dict = {}
        self._queues = _LoadQueues(spec)

    def _classes(self) -> dict:
        """Local output columns grouped by the kernel columns [lo, hi) whose input column is
        inside the image (all of them in padded tiles)."""
        g = self.g
        if self.padded:
            return {(0, g.kw): list(range(self.C))}
        out: dict = {}
        for ow in range(g.ow):
            lo = max(0, _ceil_div(g.pw - ow * g.sw, g.dw))
            hi = min(g.kw, (g.w - 1 + g.pw - ow * g.sw) // g.dw + 1)
            if lo < hi:
                out.setdefault((lo, hi), []).append(ow)
        return out

    def _rows_in(self, nr: int) -> int:
        g = self.g
        return (nr - 1) * g.sh + (g.kh - 1) * g.dh + 1

    def emit(self) -> str:
        g = self.g
        row_bytes = self.wt * self.isz
        dy_row = self.C * self.isz
        one_shot = self.nimg == g.n  # one image block: nothing to double-buffer
        nmax = self.spec.matmul_moving_fmax
        # one shot: two x tiles in flight, so the next output group's channels load while this
        # group's matmuls run
        x_room = (_ONE_SHOT - min(nmax, g.cout) * self.R * dy_row) // 2 if one_shot else _X_BUDGET
        max_channels = x_room // (self._rows_in(self.R if one_shot else 1) * row_bytes)
        if not one_shot or max_channels < min(g.cin, max(1, self.P // g.taps)):
            one_shot = False
            max_channels = _X_BUDGET // (self._rows_in(1) * row_bytes)
            nmax = min(nmax, _DY_BUDGET // dy_row)
        self.one_shot = one_shot
        if max_channels < 1 or nmax < 1:
            raise _Decline  # rows too wide for SBUF
        ncls = len(self.classes)
        # output groups: chunks of one pack whose accumulators and x rows fit SBUF together
        groups, cur = [], []
        for p in _packs(g, self.P, nmax):
            for c0, cs in p.chunks:
                if cs > max_channels:
                    raise _Decline
                if cur:
                    span = max(c0 + cs, max(c + n for _, (c, n) in cur)) - min(c0, min(c for _, (c, _) in cur))
                    if cur[0][0] != p or (len(cur) + 1) * ncls * p.nn * 4 > _ACC_BUDGET or span > max_channels:
                        groups.append(cur)
                        cur = []
                cur.append((p, (c0, cs)))
        groups.append(cur)
        for work in groups:
            self._group(work)
        return f"pixel-blocks(K={self.parts})"

    def _sub_rows(self, channels: int, nn: int) -> int:
        if self.one_shot:
            return self.R
        g = self.g
        rs = self.R
        while rs > 1:
            if (channels * self._rows_in(rs) * self.wt * self.isz <= _X_BUDGET
                    and nn * rs * self.C * self.isz <= _DY_BUDGET):
                break
            rs -= 1
        return rs

    def _group(self, work) -> None:
        """Accumulate the chunks of ``work`` (one pack) over every image and pixel, then store."""
        b, g = self.b, self.g
        pack = work[0][0]
        ch_lo = min(c0 for _, (c0, _) in work)
        channels = max(c0 + cs for _, (c0, cs) in work) - ch_lo  # pack-relative x channels read
        nn = pack.nn
        rs = self._sub_rows(channels, nn)
        items = [(cls, c0, cs) for _, (c0, cs) in work for cls in self.classes]
        accs = {it: b.sbuf((it[2] * g.kh * (it[0][1] - it[0][0]), nn), "float32", site="conv.wacc", bufs=1)
                for it in items}
        filled = set()
        for n0 in range(0, g.n, self.nimg):
            ni = min(self.nimg, g.n - n0)
            prev = None
            for r0 in range(0, self.R, rs):
                nr = min(rs, self.R - r0)
                rows_in = self._rows_in(nr)
                # dy first: every matmul needs all of it; x per chunk of channels, so the first
                # chunk's matmuls start once its channels are in
                key = (pack.g0, pack.n0)
                dyt = self._dy_cache.get(key) if self.one_shot else None
                if dyt is None:  # one image block in one go: every output group of the pack shares dy
                    dyt = self._load_dy(n0, ni, r0, nr, pack.g0 * g.cout + pack.n0, nn)
                    if self.one_shot:
                        self._dy_cache = {key: dyt}
                pieces = [(c0 - ch_lo, cs) for _, (c0, cs) in work]
                xt = self._load_x(n0, ni, r0, nr, pack.g0 * g.cin + ch_lo, channels, prev, pieces)
                prev = (xt, r0, nr)
                for k in range(0, len(items), _PSUM_ACCS):
                    part = items[k:k + _PSUM_ACCS]
                    ps = {it: b.psum(accs[it].shape, "float32", site="conv.wps") for it in part}
                    started = set()
                    for r in range(nr):
                        K = self._k(r0 + r, ni)
                        if K == 0:
                            continue
                        for it in part:
                            (lo, hi), c0, cs = it
                            for c in self.classes[(lo, hi)]:
                                col = c * g.sw + lo * g.dw - (0 if self.padded else g.pw)
                                off = ((c0 - ch_lo) * rows_in + r * g.sh) * self.wt + col
                                st = _on_chip(xt, 0, K, off, ((rows_in * self.wt, cs), (g.dh * self.wt, g.kh),
                                                              (g.dw, hi - lo)))
                                mv = _on_chip(dyt, 0, K, r * self.C + c, ((nr * self.C, nn),))
                                b.matmul(ps[it], st, mv, accumulate=it in started)
                                started.add(it)
                    for it in part:
                        if it not in started:
                            continue
                        if it in filled:
                            b.tensor_tensor(accs[it], accs[it], ps[it], "add")
                        else:
                            b.tensor_copy(accs[it], ps[it])
                            filled.add(it)
        for p, (c0, cs) in work:
            self._finish(p, c0, cs, {cls: accs[(cls, c0, cs)] for cls in self.classes
                                     if (cls, c0, cs) in filled})

    def _valid_blocks(self, r: int) -> int:
        """Row blocks whose local row ``r`` is an output row."""
        return max(0, min(self.nb, _ceil_div(self.g.oh - r, self.R)))

    def _k(self, r: int, ni: int) -> int:
        """Contraction rows of local row ``r``: partitions (b, c, n) are b-major, so the valid
        (row block, ...) triples are a prefix."""
        if ni < self.nimg:  # a last, smaller image block: one row block, one column block
            return ni if self._valid_blocks(r) else 0
        return self._valid_blocks(r) * self.cb * self.nimg

    def _part(self, blk: int, cblk: int) -> int:
        return (blk * self.cb + cblk) * self.nimg

    def _load_x(self, n0, ni, r0, nr, c0, channels, prev, pieces) -> View:
        """x rows of local output rows [r0, r0 + nr) for every block partition:
        ``[(b, c, n), channels, rows_in, wt]``; rows (and, in padded tiles, columns) outside
        the image are 0. The rows shared with the previous sub-block are copied from its tile."""
        b, g = self.b, self.g
        rows_in = self._rows_in(nr)
        wt, parts = self.wt, self.parts
        t = b.sbuf((parts, channels, rows_in, wt), self.X.dtype, site="conv.wx", bufs=2)
        j_new = 0
        if prev is not None:
            pt, pr0, pnr = prev
            shift = (r0 - pr0) * g.sh
            prow = self._rows_in(pnr)
            overlap = prow - shift
            if 0 < overlap <= rows_in:
                b.tensor_copy(_on_chip(t, 0, parts, 0, ((rows_in * wt, channels), (1, overlap * wt))),
                              _on_chip(pt, 0, parts, shift * wt, ((prow * wt, channels), (1, overlap * wt))),
                              engine="pool")
                j_new = overlap
        if j_new >= rows_in:
            return t
        # rows j in [j_new, rows_in) of row block b: input row (b*R + r0)*sh - ph + j
        spans, zero = [], [rows_in, j_new]
        for blk in range(self.nb):
            top = (blk * self.R + r0) * g.sh - g.ph
            lo, hi = max(j_new, -top), min(rows_in, g.h - top)
            spans.append((top, lo, hi))
            if lo > j_new:
                zero = [min(zero[0], j_new), max(zero[1], lo)]
            if hi < rows_in:
                zero = [min(zero[0], max(hi, j_new)), rows_in]
        if zero[1] > zero[0]:
            b.memset(_on_chip(t, 0, parts, zero[0] * wt, ((rows_in * wt, channels), (1, (zero[1] - zero[0]) * wt))),
                     0.0, engine="pool")
        cols = []  # per column block: (tile col, input col, count) inside the image
        for cblk in range(self.cb):
            if self.padded:
                left = cblk * self.C * g.sw - g.pw
                c_lo, c_hi = max(0, -left), min(wt, g.w - left)
                cols.append((c_lo, left + c_lo, c_hi - c_lo))
            else:
                cols.append((0, 0, g.w))
        if self.padded:
            lo_all = max(c[0] for c in cols)
            hi_all = min(c[0] + c[2] for c in cols)
            for a, e in ((0, lo_all), (hi_all, wt)):
                if e > a:
                    b.memset(_on_chip(t, 0, parts, j_new * wt + a, ((rows_in * wt, channels), (wt, rows_in - j_new),
                                                                      (1, e - a))), 0.0, engine="pool")
        xs = self.xs
        # one transfer per run of blocks that read alike (a queue issues its transfers one by one)
        blocks = [((lo, hi), top, blk) for blk, (top, lo, hi) in enumerate(spans)
                  if hi > lo and blk * self.R + r0 < g.oh]
        cblocks = [((tc, cnt), ic, k) for k, (tc, ic, cnt) in enumerate(cols) if cnt > 0]
        for (lo, hi), top, b0, nblk, (tc, cnt), ic, k0, ncb in self._runs(blocks, cblocks, ni, self.R * g.sh,
                                                                          self.C * g.sw):
            for p0, pc in pieces:
                src = _hbm(self.X, n0 * xs[0] + (c0 + p0) * xs[1] + (top + lo) * xs[2] + ic * xs[3],
                           ((self.R * g.sh * xs[2], nblk), (self.C * g.sw * xs[3], ncb), (xs[0], ni), (xs[1], pc),
                            (xs[2], hi - lo), (xs[3], cnt)))
                dst = _on_chip(t, self._part(b0, k0), nblk * ncb * ni, (p0 * rows_in + lo) * wt + tc,
                               ((rows_in * wt, pc), (wt, hi - lo), (1, cnt)))
                b.dma_copy(dst, src, queue=self._queues.next())
        return t

    def _runs(self, blocks, cblocks, ni, row_step, col_step):
        """Runs of (row block, column block) partitions loaded by one transfer: consecutive row
        blocks whose rows (``key``) agree, over column blocks whose columns agree; the
        partitions of a run must be contiguous."""
        def group(items):
            out = []
            for key, base, idx in items:
                if out and out[-1][0] == key and out[-1][2] + out[-1][3] == idx:
                    out[-1][3] += 1
                else:
                    out.append([key, base, idx, 1])
            return out
        rows, cols = group(blocks), group(cblocks)
        whole = ni == self.nimg
        runs = []
        for rkey, rbase, b0, nb in rows:
            if whole and len(cols) == 1 and cols[0][3] == self.cb:
                (ckey, cbase, k0, nk), = cols
                runs.append((rkey, rbase, b0, nb, ckey, cbase, k0, nk))
                continue
            for blk in range(b0, b0 + nb):
                for ckey, cbase, k0, nk in cols:
                    if whole:
                        runs.append((rkey, rbase + (blk - b0) * row_step, blk, 1, ckey, cbase, k0, nk))
                    else:
                        for k in range(k0, k0 + nk):
                            runs.append((rkey, rbase + (blk - b0) * row_step, blk, 1, ckey,
                                         cbase + (k - k0) * col_step, k, 1))
        return runs

    def _load_dy(self, n0, ni, r0, nr, c0, nn) -> View:
        b, g, dys = self.b, self.g, self.dys
        C = self.C
        t = b.sbuf((self.parts, nn, nr, C), self.DY.dtype, site="conv.wdy", bufs=1 if self.one_shot else 2)
        last = g.ow - (self.cb - 1) * C  # columns of the last column block
        if last < C:  # its missing columns contribute nothing: zero them (every partition; data overwrites)
            b.memset(_on_chip(t, 0, self.parts, last, ((C, nn * nr), (1, C - last))), 0.0, engine="pool")
        blocks = [(min(nr, g.oh - (blk * self.R + r0)), (blk * self.R + r0), blk) for blk in range(self.nb)
                  if blk * self.R + r0 < g.oh]
        cblocks = [(min(C, g.ow - k * C), k * C, k) for k in range(self.cb)]
        for rows, row0, b0, nblk, cnt, col0, k0, ncb in self._runs(blocks, cblocks, ni, self.R, C):
            src = _hbm(self.DY, n0 * dys[0] + c0 * dys[1] + row0 * dys[2] + col0 * dys[3],
                       ((self.R * dys[2], nblk), (C * dys[3], ncb), (dys[0], ni), (dys[1], nn), (dys[2], rows),
                        (dys[3], cnt)))
            dst = _on_chip(t, self._part(b0, k0), nblk * ncb * ni, 0, ((nr * C, nn), (C, rows), (1, cnt)))
            b.dma_copy(dst, src, queue=self._queues.next())
        return t

    def _finish(self, pack: _Pack, c0: int, cs: int, accs: dict) -> None:
        """Class accumulators [(ci, kh, kw in [lo, hi)), co] -> grad_weight rows [co, ci, kh, kw]
        (transposed on TensorE; the edge classes are added into their kernel columns)."""
        b, g, gws = self.b, self.g, self.gws
        nn, P = pack.nn, self.P
        full = (0, g.kw)
        for o in range(0, nn, P):
            os_ = min(P, nn - o)
            res = b.sbuf((os_, cs, g.kh, g.kw), "float32", site="conv.wres")
            if full not in accs:
                b.memset(res, 0.0)
            order = sorted(accs, key=lambda cls: cls != full)
            for cls in order:
                lo, hi = cls
                M = cs * g.kh * (hi - lo)
                ps = b.psum((os_, M), "float32", site="conv.wT")
                b.transpose(ps, _on_chip(accs[cls], 0, M, o, ((1, os_),)))
                region = _on_chip(res, 0, os_, lo, ((g.taps, cs), (g.kw, g.kh), (1, hi - lo)))
                if cls == full:
                    b.activation(region, ps, "copy")
                else:
                    b.tensor_tensor(region, region, ps, "add")
            if pack.gn == 1:
                out = res
                if self.out_dtype != "float32":
                    out = b.sbuf((os_, cs * g.taps), self.out_dtype, site="conv.wout")
                    b.tensor_copy(out, res)
                co = pack.g0 * g.cout + pack.n0 + o
                b.dma_copy(_hbm(self.GW, co * gws[0] + c0 * gws[1],
                                ((gws[0], os_), (gws[1], cs), (gws[2], g.kh), (gws[3], g.kw))), out,
                           queue=self._queues.store())
                continue
            # rows (g', co) of the pack, columns (g, ci, tap) of this chunk's groups: keep g == g'
            gq = cs // g.cin  # groups in this chunk
            rg = g.cin * g.taps
            mask = _diag_mask(b, os_, gq, rg, g.cout, base=-(c0 // g.cin) * g.cout)
            masked = b.sbuf((os_, cs * g.taps), "float32", site="conv.wmask")
            b.tensor_tensor(masked, res, mask, "multiply")
            red = b.sbuf((os_, rg), self.out_dtype, site="conv.wred")
            b.tensor_reduce(red, _on_chip(masked, 0, os_, 0, ((1, rg), (rg, gq))), "add", axes=(2,))
            g_first = pack.g0 + c0 // g.cin  # only the chunk's groups' rows hold their weights
            b.dma_copy(_hbm(self.GW, g_first * g.cout * gws[0],
                            ((gws[0], gq * g.cout), (gws[1], g.cin), (gws[2], g.kh), (gws[3], g.kw))),
                       _on_chip(red, (c0 // g.cin) * g.cout, gq * g.cout, 0, ((1, rg),)), queue=self._queues.store())


class _GradWeightTransposed:
    """grad_weight with pixels put on the partitions by TensorE transposes, for images small
    enough that ``x`` and ``dy`` stay in SBUF: per block of <= 128 output pixels, ``dy`` is
    transposed once to ``[pixels, co]`` and each tap's window of ``x`` to ``[pixels, ci]``
    (several taps side by side, up to 512 columns), and TensorE accumulates
    ``dy.T @ x_taps`` -> ``[co, (tap, ci)]`` in PSUM over all blocks. Loads are whole
    images, contiguous; the zero padding is made on chip."""

    RESIDENT = 140 * 1024

    def __init__(self, b: TileBuilder, spec, g: ConvGeom, X: View, xs, DY: View, dys, GW: View, gws, dtype, out_dtype):
        self.b, self.spec, self.g = b, spec, g
        self.X, self.xs, self.DY, self.dys, self.GW, self.gws = X, xs, DY, dys, GW, gws
        self.dtype, self.out_dtype = dtype, out_dtype
        P = self.P = spec.partitions
        self.isz = 2 if dtype in ("bfloat16", "float16") else 4
        self.hp = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1
        self.wp = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1
        per_image = g.oh * g.ow
        if per_image <= P:
            ipb = P // per_image
            self.blocks = [(n, min(ipb, g.n - n), 0, g.oh) for n in range(0, g.n, ipb)]
        else:
            rows = max(1, P // g.ow)
            self.blocks = [(n, 1, r, min(rows, g.oh - r)) for n in range(g.n) for r in range(0, g.oh, rows)]
        self.ci_chunks = [(c, min(P, g.cin - c)) for c in range(0, g.cin, P)]
        self.co_chunks = [(c, min(P, g.cout - c)) for c in range(0, g.cout, P)]
        # channel-chunk major: a chunk's columns of grad_weight are complete (and stored) early
        pairs = [(t, c) for c in self.ci_chunks for t in range(g.taps)]
        nmax = spec.matmul_moving_fmax
        self.ngroups, cur, width = [], [], 0
        for t, c in pairs:  # (tap, ci chunk) pairs side by side, up to one PSUM bank of columns
            if cur and width + c[1] > nmax:
                self.ngroups.append(cur)
                cur, width = [], 0
            cur.append((t, c))
            width += c[1]
        self.ngroups.append(cur)

    def feasible(self) -> bool:
        g = self.g
        if g.groups != 1:
            return False
        x = len(self.ci_chunks) * g.n * self.hp * self.wp * self.isz * 2  # padded tile + its staging
        dy = len(self.co_chunks) * g.n * g.oh * g.ow * self.isz
        dyt = len(self.blocks) * g.cout * self.isz
        return x + dy + dyt + len(self.co_chunks) * g.cin * g.taps * 4 <= self.RESIDENT

    def emit(self) -> str:
        b, g, P = self.b, self.g, self.P
        xs, dys = self.xs, self.dys
        hp, wp = self.hp, self.wp
        # x, zero-padded on chip: [ci, n, hp, wp]
        xt = {}
        for c0, cs in self.ci_chunks:
            t = b.sbuf((cs, g.n, hp, wp), self.X.dtype, site="conv.tx", bufs=1)
            stage = b.sbuf((cs, g.n, g.h, g.w), self.X.dtype, site="conv.txs", bufs=1)
            b.dma_copy(stage, _hbm(self.X, c0 * xs[1], ((xs[1], cs), (xs[0], g.n), (xs[2], g.h), (xs[3], g.w))))
            b.memset(t, 0.0, engine="pool")
            rows, cols = min(g.h, hp - g.ph), min(g.w, wp - g.pw)
            b.tensor_copy(_on_chip(t, 0, cs, g.ph * wp + g.pw, ((hp * wp, g.n), (wp, rows), (1, cols))),
                          _on_chip(stage, 0, cs, 0, ((g.h * g.w, g.n), (g.w, rows), (1, cols))), engine="pool")
            xt[c0] = t
        dyt = {}
        for c0, cs in self.co_chunks:
            t = b.sbuf((cs, g.n, g.oh * g.ow), self.DY.dtype, site="conv.tdy", bufs=1)
            b.dma_copy(t, _hbm(self.DY, c0 * dys[1], ((dys[1], cs), (dys[0], g.n), (dys[2], g.oh), (dys[3], g.ow))))
            dyt[c0] = t
        # dy.T per pixel block: [pixels, co]
        dyT = []
        for n0, ni, r0, nr in self.blocks:
            px = ni * nr * g.ow
            t = b.sbuf((px, g.cout), self.dtype, site="conv.tdyT", bufs=1)
            for c0, cs in self.co_chunks:
                ps = b.psum((px, cs), "float32", site="conv.tT")
                b.transpose(ps, _on_chip(dyt[c0], 0, cs, (n0 * g.oh + r0) * g.ow, ((g.oh * g.ow, ni), (1, nr * g.ow))))
                b.activation(_on_chip(t, 0, px, c0, ((1, cs),)), ps, "copy")
            dyT.append(t)
        res = {c0: b.sbuf((cs, g.cin, g.taps), "float32", site="conv.tres", bufs=1) for c0, cs in self.co_chunks}
        per_pass = max(1, 6 // len(self.co_chunks))
        for k in range(0, len(self.ngroups), per_pass):
            ngs = self.ngroups[k:k + per_pass]
            accs = {(c0, i): b.psum((cs, sum(c[1] for _, c in ng)), "float32", site="conv.tacc")
                    for i, ng in enumerate(ngs) for c0, cs in self.co_chunks}
            for bi, (n0, ni, r0, nr) in enumerate(self.blocks):
                px = ni * nr * g.ow
                for i, ng in enumerate(ngs):
                    width = sum(c[1] for _, c in ng)
                    ps = b.psum((px, width), "float32", site="conv.tT")
                    for base, (c0, cs), taps in _segments_of(ng):
                        for j, tap in enumerate(taps):  # columns (ci, tap): whole runs of taps per channel
                            kh, kw = divmod(tap, g.kw)
                            win = _on_chip(xt[c0], 0, cs, n0 * hp * wp + (r0 * g.sh + kh * g.dh) * wp + kw * g.dw,
                                           ((hp * wp, ni), (g.sh * wp, nr), (g.sw, g.ow)))
                            b.transpose(_on_chip(ps, 0, px, base + j, ((len(taps), cs),)), win)
                    xT = b.sbuf((px, width), self.dtype, site="conv.txT")
                    if (bi + i) % 2:  # PSUM copies alternate between VectorE and ScalarE
                        b.tensor_copy(xT, ps)
                    else:
                        b.activation(xT, ps, "copy")
                    for c0, cs in self.co_chunks:
                        b.matmul(accs[c0, i], _on_chip(dyT[bi], 0, px, c0, ((1, cs),)), xT, accumulate=bi > 0)
            k_copy = 0
            for i, ng in enumerate(ngs):
                for c0, cs in self.co_chunks:
                    for base, (ci0, ccs), taps in _segments_of(ng):
                        dst = _on_chip(res[c0], 0, cs, ci0 * g.taps + taps[0], ((g.taps, ccs), (1, len(taps))))
                        src = _on_chip(accs[c0, i], 0, cs, base, ((len(taps), ccs), (1, len(taps))))
                        if k_copy % 2:  # PSUM copies alternate between VectorE and ScalarE
                            b.tensor_copy(dst, src)
                        else:
                            b.activation(dst, src, "copy")
                        k_copy += 1
                        if taps[-1] == g.taps - 1:  # every tap of this channel chunk is in: store it
                            self._store(res[c0], c0, cs, ci0, ccs)
        return f"pixels-transposed({len(self.blocks)} blocks)"

    def _store(self, res, c0, cs, ci0, ccs) -> None:
        b, g, gws = self.b, self.g, self.gws
        out = _on_chip(res, 0, cs, ci0 * g.taps, ((1, ccs * g.taps),))
        if self.out_dtype != "float32":
            t = b.sbuf((cs, ccs * g.taps), self.out_dtype, site="conv.tout")
            b.tensor_copy(t, out)
            out = t
        b.dma_copy(_hbm(self.GW, c0 * gws[0] + ci0 * gws[1], ((gws[0], cs), (gws[1], ccs), (gws[2], g.kh),
                                                              (gws[3], g.kw))), out)


def _segments_of(group):
    """A group's (tap, channel chunk) pairs as ``(first column, chunk, taps)`` runs of one chunk
    (the pairs are chunk-major, taps ascending); a run's columns are ``(ci, tap)``."""
    out: list = []
    col = 0
    for tap, chunk in group:
        if out and out[-1][1] == chunk:
            out[-1][2].append(tap)
        else:
            if out:
                col += out[-1][1][1] * len(out[-1][2])
            out.append((col, chunk, [tap]))
    return out


def grad_weight_program(b: TileBuilder, spec, g: ConvGeom, X: View, xs, DY: View, dys, GW: View, gws, dtype: str,
                        out_dtype: str, form: str = "blocks") -> str:
    """Emit ``grad_weight`` of convolution ``g`` into ``b`` in ``form`` (``"blocks"``: pixel
    blocks on the partitions; ``"transposed"``: pixels transposed onto them); returns the form."""
    if g.h == 1 and g.kh == 1 and g.oh == 1 and g.w > 1:
        # a 1-D convolution: let the length run down the rows, so row blocks split it
        g = ConvGeom(g.n, g.cin, g.cout, g.groups, g.w, 1, g.ow, 1, g.kw, 1, g.sw, 1, g.pw, 0, g.dw, 1)
        X, DY, GW = _tall(X), _tall(DY), _tall(GW)
        xs, dys, gws = _tall_strides(xs), _tall_strides(dys), _tall_strides(gws)
    if form == "transposed":
        tr = _GradWeightTransposed(b, spec, g, X, xs, DY, dys, GW, gws, dtype, out_dtype)
        if not tr.feasible():
            raise _Decline
        return tr.emit()
    return _GradWeight(b, spec, g, X, xs, DY, dys, GW, gws, dtype, out_dtype).emit()


def transposed_form_feasible(spec, g: ConvGeom, dtype: str) -> bool:
    """Whether the pixels-transposed form applies (x and dy of every image fit in SBUF)."""
    if g.h == 1 and g.kh == 1 and g.oh == 1 and g.w > 1:
        return False
    probe = _GradWeightTransposed.__new__(_GradWeightTransposed)
    _GradWeightTransposed.__init__(probe, None, spec, g, None, None, None, None, None, None, dtype, dtype)
    return probe.feasible()


def _tall_strides(s):
    return (s[0], s[1], s[3], s[2])


def _tall(view: View) -> View:
    ap = view.ap
    d = ap.dims
    return _hbm(View(view.buffer, ap.__class__(ap.buffer, ap.dtype, 0, ap.dims), view.shape), ap.offset,
                (d[0], d[1], d[3], d[2]))


def grad_bias_program(b: TileBuilder, spec, g: ConvGeom, DY: View, dys, GB: View, gbs: int, out_dtype: str) -> None:
    """``grad_bias[c] = sum of dy[:, c]``: channels on partitions, VectorE sums each image's pixels."""
    P = spec.partitions
    C = g.groups * g.cout
    px = g.oh * g.ow
    if C > 1 and px > 1 and dys[1] == 1 and dys[3] == C and (g.oh == 1 or dys[2] == g.ow * C):
        # whole images of pixels in one run each (or all of them, when the images follow each other)
        images = [(0, g.n * px)] if g.n == 1 or dys[0] == px * C else [(n * dys[0], px) for n in range(g.n)]
        _grad_bias_channels_last(b, spec, images, C, DY, dys, GB, gbs, out_dtype)
        return
    contiguous = g.oh == 1 or dys[2] == g.ow * dys[3]
    free_max = 8192
    for c0 in range(0, C, P):
        cs = min(P, C - c0)
        if contiguous:
            per = max(1, min(g.n, free_max // px)) if px <= free_max else 1
            steps = [(n0, min(per, g.n - n0), p0, min(free_max, px - p0))
                     for n0 in range(0, g.n, per) for p0 in range(0, px, free_max if px > free_max else px)]
        else:
            steps = [(n, 1, 0, px) for n in range(g.n)]
        parts = b.sbuf((cs, len(steps)), "float32", site="conv.gb.parts", bufs=1)
        for i, (n0, ni, p0, pn) in enumerate(steps):
            t = b.sbuf((cs, ni, pn), DY.dtype, site="conv.gb.dy")
            if contiguous:
                src = _hbm(DY, n0 * dys[0] + c0 * dys[1] + p0 * dys[3], ((dys[1], cs), (dys[0], ni), (dys[3], pn)))
            else:
                src = _hbm(DY, n0 * dys[0] + c0 * dys[1], ((dys[1], cs), (dys[0], ni), (dys[2], g.oh), (dys[3], g.ow)))
            b.dma_copy(t, src)
            b.tensor_reduce(_on_chip(parts, 0, cs, i, ((1, 1),)), t, "add")
        total = b.sbuf((cs, 1), out_dtype, site="conv.gb.sum")
        b.tensor_reduce(total, parts, "add")
        b.dma_copy(_hbm(GB, c0 * gbs, ((gbs, cs), (1, 1))), total)


def _grad_bias_channels_last(b: TileBuilder, spec, images, C: int, DY: View, dys, GB: View, gbs: int,
                             out_dtype: str) -> None:
    """``grad_bias`` of a ``dy`` whose channels are innermost (``(n, h, w, c)`` memory, as a ViT's
    tokens leave a patch embedding's): blocks of 128 pixels of each run in ``images`` (first
    element, pixels) read as ``[pixels, c]`` rows, summed over the partitions on TensorE
    (``ones.T @ rows``, accumulated in PSUM)."""
    P, fmax = spec.partitions, 512
    ones = b.sbuf((P, 1), DY.dtype, site="conv.gb.ones", bufs=1)
    b.memset(ones, 1.0)
    accs = [(c0, min(fmax, C - c0)) for c0 in range(0, C, fmax)]
    ps = {c0: b.psum((1, cs), "float32", site=f"conv.gb.acc{i % 4}", bufs=1) for i, (c0, cs) in enumerate(accs)}
    blocks = [(off + p0 * dys[3], min(P, px - p0)) for off, px in images for p0 in range(0, px, P)]
    queues = _Queues(spec)
    for i, (off, pn) in enumerate(blocks):
        t = b.sbuf((P, C), DY.dtype, site="conv.gb.rows", bufs=3)
        b.dma_copy(_on_chip(t, 0, pn, 0, ((1, C),)), _hbm(DY, off, ((dys[3], pn), (1, C))), queue=queues.next())
        for c0, cs in accs:
            b.matmul(ps[c0], _on_chip(ones, 0, pn, 0, ((1, 1),)), _on_chip(t, 0, pn, c0, ((1, cs),)),
                     accumulate=i > 0)
    for c0, cs in accs:
        out = b.sbuf((1, cs), out_dtype, site="conv.gb.out", bufs=2)
        b.activation(out, ps[c0], "copy")
        b.dma_copy(_hbm(GB, c0 * gbs, ((0, 1), (gbs, cs))), out)
