"""A convolution's ``grad_weight`` and ``grad_bias``.

``grad_weight[co, ci, kh, kw] = sum over images and output pixels of
dy[n, co, oh, ow] * x[n, ci, oh*sh + kh*dh - ph, ow*sw + kw*dw - pw]``: a GEMM whose
contraction runs over pixels. TensorE contracts over partitions, so pixels must lie on
them -- without transposing the activations, the partitions hold **(row block, image)**
pairs: partition ``(b, n)`` holds, for every channel, the rows of ``x`` (zero-padded) and
of ``dy`` that output rows ``[b*R, b*R + R)`` of image ``n`` use. For one local pixel
``(r, ow)`` of every row block at once, the taps are a window of the ``x`` tile
(an access pattern over (ci, kh, kw): no copy), and TensorE accumulates

    ``acc[(ci, kh, kw), co] += x[(b, n), (ci, kh, kw)].T @ dy[(b, n), co]``

in PSUM over all local pixels (128 contraction rows when batch x row blocks >= 128).
The ``[(ci, kh, kw), co]`` result is transposed once at the end. Consecutive row
sub-blocks share their kernel-row halo: it is copied on chip, not loaded again.

Groups are packed: several groups' channels go in one matmul and the blocks that pair
a group with another are masked out at the end (depthwise layers would otherwise
issue one tiny matmul per channel).

``grad_bias`` sums ``dy`` over images and pixels on VectorE, channels on partitions.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..program import TileBuilder, View
from ._conv import ConvGeom, _ceil_div, _Decline, _diag_mask, _hbm, _on_chip

__all__ = ["grad_weight_program", "grad_bias_program"]

_X_BUDGET = 40 * 1024  # bytes per partition of one x sub-tile
_DY_BUDGET = 16 * 1024
_ACC_BUDGET = 32 * 1024  # SBUF accumulators of one output group
_PSUM_ACCS = 6  # PSUM accumulators live at once (of 8 banks; the rest for transposes)


@dataclass(frozen=True)
class _Pack:
    """Groups [g0, g0 + gn) whose grad_weight is computed together; ``chunks`` are the
    (first group-local channel index, channels) row blocks of the contraction output."""

    g0: int
    gn: int
    n0: int  # first output channel (of the pack) of this N block
    nn: int  # output channels in the N block
    chunks: tuple[tuple[int, int], ...]  # (first channel of the pack's inputs, channel count)


def _packs(g: ConvGeom, P: int, nmax: int) -> list[_Pack]:
    taps = g.taps
    per_chunk = max(1, P // taps)  # input channels per 128-row chunk
    if taps > P:
        raise _Decline  # kernels over 128 taps: not handled
    rows_g = g.cin * taps
    if g.groups > 1 and rows_g <= P and g.cout <= P:
        gp = min(g.groups, P // g.cout)  # the transposed result must fit on the partitions
        packs = []
        for g0 in range(0, g.groups, gp):
            gn = min(gp, g.groups - g0)
            per = max(1, P // rows_g)  # whole groups per chunk
            chunks = tuple((c * g.cin, min(per, gn - c) * g.cin) for c in range(0, gn, per))
            packs.append(_Pack(g0, gn, 0, gn * g.cout, chunks))
        return packs
    chunks = tuple((c, min(per_chunk, g.cin - c)) for c in range(0, g.cin, per_chunk))
    return [_Pack(grp, 1, o, min(nmax, g.cout - o), chunks) for grp in range(g.groups) for o in range(0, g.cout, nmax)]


class _GradWeight:
    def __init__(self, b: TileBuilder, spec, g: ConvGeom, X: View, xs, DY: View, dys, GW: View, gws, dtype, out_dtype):
        self.b, self.spec, self.g = b, spec, g
        self.X, self.xs, self.DY, self.dys, self.GW, self.gws = X, xs, DY, dys, GW, gws
        self.dtype, self.out_dtype = dtype, out_dtype
        self.P = spec.partitions
        self.isz = 2 if dtype in ("bfloat16", "float16") else 4
        nb_img = min(g.n, self.P)
        nb = max(1, min(g.oh, self.P // nb_img))
        self.R = _ceil_div(g.oh, nb)
        self.nb = _ceil_div(g.oh, self.R)
        self.nimg = nb_img
        self.wp = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1  # padded width the taps read

    def emit(self) -> str:
        g = self.g
        row_bytes = self.wp * self.isz  # one padded x row of one channel
        max_channels = _X_BUDGET // (self._rows_in(1) * row_bytes)
        nmax = min(self.spec.matmul_moving_fmax, _DY_BUDGET // (g.ow * self.isz))
        if max_channels < 1 or nmax < 1:
            raise _Decline  # rows too wide for SBUF
        # output groups: chunks of one pack whose accumulators and x rows fit SBUF together
        groups, cur = [], []
        for p in _packs(g, self.P, nmax):
            for c0, cs in p.chunks:
                if cur:
                    lo = min(c for _, (c, _) in cur)
                    span = max(c0 + cs, max(c + n for _, (c, n) in cur)) - min(lo, c0)
                    if (cur[0][0] != p or (len(cur) + 1) * p.nn * 4 > _ACC_BUDGET or span > max_channels):
                        groups.append(cur)
                        cur = []
                if cs > max_channels:
                    raise _Decline
                cur.append((p, (c0, cs)))
        groups.append(cur)
        for work in groups:
            self._group(work)
        return f"row-blocks(K={self.nb * self.nimg})"

    def _sub_rows(self, channels: int, nn: int) -> int:
        g = self.g
        rs = self.R
        while rs > 1:
            if (channels * self._rows_in(rs) * self.wp * self.isz <= _X_BUDGET
                    and nn * rs * g.ow * self.isz <= _DY_BUDGET):
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
        accs = {c0: b.sbuf((cs * g.taps, nn), "float32", site="conv.wacc", bufs=1) for _, (c0, cs) in work}
        filled = set()
        for n0 in range(0, g.n, self.nimg):
            ni = min(self.nimg, g.n - n0)
            prev = None
            for r0 in range(0, self.R, rs):
                nr = min(rs, self.R - r0)
                rows_in = self._rows_in(nr)
                xt = self._load_x(n0, ni, r0, nr, pack.g0 * g.cin + ch_lo, channels, prev)
                prev = (xt, r0, nr)
                dyt = self._load_dy(n0, ni, r0, nr, pack.g0 * g.cout + pack.n0, nn)
                for k in range(0, len(work), _PSUM_ACCS):
                    part = work[k:k + _PSUM_ACCS]
                    ps = {c0: b.psum((cs * g.taps, nn), "float32", site="conv.wps") for _, (c0, cs) in part}
                    started = set()
                    for r in range(nr):
                        K = self._k(r0 + r, ni)
                        if K == 0:
                            continue
                        for ow in range(g.ow):
                            mv = _on_chip(dyt, 0, K, r * g.ow + ow, ((nr * g.ow, nn),))
                            for _, (c0, cs) in part:
                                off = ((c0 - ch_lo) * rows_in + r * g.sh) * self.wp + ow * g.sw
                                st = _on_chip(xt, 0, K, off, ((rows_in * self.wp, cs), (g.dh * self.wp, g.kh),
                                                              (g.dw, g.kw)))
                                b.matmul(ps[c0], st, mv, accumulate=c0 in started)
                                started.add(c0)
                    for c0 in started:
                        if c0 in filled:
                            b.tensor_tensor(accs[c0], accs[c0], ps[c0], "add")
                        else:
                            b.tensor_copy(accs[c0], ps[c0])
                            filled.add(c0)
        for p, (c0, cs) in work:
            if c0 not in filled:
                b.memset(accs[c0], 0.0)
            self._finish(p, c0, cs, accs[c0])

    def _valid_blocks(self, r: int) -> int:
        """Row blocks whose local row ``r`` is an output row."""
        return max(0, min(self.nb, _ceil_div(self.g.oh - r, self.R)))

    def _k(self, r: int, ni: int) -> int:
        """Contraction rows of local row ``r``: partitions (b, n) are b-major, so the valid
        (row block, image) pairs are a prefix."""
        return self._valid_blocks(r) * self.nimg if ni == self.nimg else self._partial_k(r, ni)

    def _partial_k(self, r: int, ni: int) -> int:
        # a last, smaller image block: only when there is one row block (more images than partitions)
        return ni if self._valid_blocks(r) else 0

    def _rows_in(self, nr: int) -> int:
        g = self.g
        return (nr - 1) * g.sh + (g.kh - 1) * g.dh + 1

    def _load_x(self, n0, ni, r0, nr, c0, channels, prev) -> View:
        """x rows of local output rows [r0, r0 + nr) for every (row block, image) partition:
        ``[(b, n), channels, rows_in, wp]``, zero-padded; the rows shared with the previous
        sub-block are copied from its tile."""
        b, g, xs = self.b, self.g, self.xs
        rows_in = self._rows_in(nr)
        wp = self.wp
        parts = self.nb * self.nimg
        t = b.sbuf((parts, channels, rows_in, wp), self.X.dtype, site="conv.wx")
        j_new = 0
        if prev is not None:
            pt, pr0, pnr = prev
            shift = (r0 - pr0) * g.sh
            overlap = self._rows_in(pnr) - shift
            if 0 < overlap <= rows_in:
                prow = self._rows_in(pnr)
                b.tensor_copy(_on_chip(t, 0, parts, 0, ((rows_in * wp, channels), (1, overlap * wp))),
                              _on_chip(pt, 0, parts, shift * wp, ((prow * wp, channels), (1, overlap * wp))),
                              engine="pool")
                j_new = overlap
        if j_new >= rows_in:
            return t
        # rows j in [j_new, rows_in) of block b: input row (b*R + r0)*sh - ph + j
        zero_lo, zero_hi = rows_in, j_new
        spans = []
        for blk in range(self.nb):
            top = (blk * self.R + r0) * g.sh - g.ph
            lo = max(j_new, -top)
            hi = min(rows_in, g.h - top)
            spans.append((top, lo, hi))
            if lo > j_new:
                zero_lo = min(zero_lo, j_new)
                zero_hi = max(zero_hi, lo)
            if hi < rows_in:
                zero_lo = min(zero_lo, max(hi, j_new))
                zero_hi = rows_in
        if zero_hi > zero_lo:
            b.memset(_on_chip(t, 0, parts, zero_lo * wp, ((rows_in * wp, channels), (1, (zero_hi - zero_lo) * wp))),
                     0.0, engine="pool")
        cols = min(g.w, wp - g.pw)
        if g.pw:
            b.memset(_on_chip(t, 0, parts, j_new * wp, ((rows_in * wp, channels), (wp, rows_in - j_new), (1, g.pw))),
                     0.0, engine="pool")
        if g.pw + cols < wp:
            right = wp - g.pw - cols
            b.memset(_on_chip(t, 0, parts, j_new * wp + g.pw + cols,
                              ((rows_in * wp, channels), (wp, rows_in - j_new), (1, right))), 0.0, engine="pool")
        for blk, (top, lo, hi) in enumerate(spans):
            if hi <= lo or blk * self.R + r0 >= g.oh:
                continue
            src = _hbm(self.X, n0 * xs[0] + c0 * xs[1] + (top + lo) * xs[2],
                       ((xs[0], ni), (xs[1], channels), (xs[2], hi - lo), (xs[3], cols)))
            dst = _on_chip(t, blk * self.nimg, ni, lo * wp + g.pw,
                           ((rows_in * wp, channels), (wp, hi - lo), (1, cols)))
            b.dma_copy(dst, src)
        return t

    def _load_dy(self, n0, ni, r0, nr, c0, nn) -> View:
        b, g, dys = self.b, self.g, self.dys
        parts = self.nb * self.nimg
        t = b.sbuf((parts, nn, nr, g.ow), self.DY.dtype, site="conv.wdy")
        for blk in range(self.nb):
            row0 = blk * self.R + r0
            rows = min(nr, g.oh - row0)
            if rows <= 0:
                continue
            src = _hbm(self.DY, n0 * dys[0] + c0 * dys[1] + row0 * dys[2],
                       ((dys[0], ni), (dys[1], nn), (dys[2], rows), (dys[3], g.ow)))
            b.dma_copy(_on_chip(t, blk * self.nimg, ni, 0, ((nr * g.ow, nn), (1, rows * g.ow))), src)
        return t

    def _finish(self, pack: _Pack, c0: int, cs: int, acc: View) -> None:
        """acc [(ci, kh, kw) of channels c0.., co] -> grad_weight rows (transposed on TensorE)."""
        b, g, gws = self.b, self.g, self.gws
        M = cs * g.taps
        nn = pack.nn
        for o in range(0, nn, self.P):
            os_ = min(self.P, nn - o)
            src = acc
            ps = b.psum((os_, M), "float32", site="conv.wT")
            b.transpose(ps, _on_chip(src, 0, M, o, ((1, os_),)))
            res = b.sbuf((os_, M), self.out_dtype, site="conv.wres")
            if pack.gn == 1:
                b.activation(res, ps, "copy")
                co = pack.g0 * g.cout + pack.n0 + o
                ci = c0
                b.dma_copy(_hbm(self.GW, co * gws[0] + ci * gws[1],
                                ((gws[0], os_), (gws[1], cs), (gws[2], g.kh), (gws[3], g.kw))), res)
            else:
                # rows (g', co) of the pack, columns (g, ci, tap) of this chunk's groups: keep g == g'
                gq = cs // g.cin  # groups in this chunk
                mask = _diag_mask(b, os_, gq, g.cin * g.taps, g.cout, base=-(c0 // g.cin) * g.cout)
                masked = b.sbuf((os_, M), "float32", site="conv.wmask")
                b.tensor_tensor(masked, ps, mask, "multiply")
                red = b.sbuf((os_, g.cin * g.taps), self.out_dtype, site="conv.wred")
                b.tensor_reduce(red, _on_chip(masked, 0, os_, 0, ((1, g.cin * g.taps), (g.cin * g.taps, gq))), "add",
                                axes=(2,))
                # only the chunk's groups' rows hold their weights
                g_first = pack.g0 + c0 // g.cin
                b.dma_copy(_hbm(self.GW, g_first * g.cout * gws[0],
                                ((gws[0], gq * g.cout), (gws[1], g.cin), (gws[2], g.kh), (gws[3], g.kw))),
                           _on_chip(red, (c0 // g.cin) * g.cout, gq * g.cout, 0, ((1, g.cin * g.taps),)))


def grad_weight_program(b: TileBuilder, spec, g: ConvGeom, X: View, xs, DY: View, dys, GW: View, gws, dtype: str,
                        out_dtype: str) -> str:
    """Emit ``grad_weight`` of convolution ``g`` into ``b``; returns the form used."""
    if g.h == 1 and g.kh == 1 and g.oh == 1 and g.w > 1:
        # a 1-D convolution: let the length run down the rows, so row blocks split it
        g = ConvGeom(g.n, g.cin, g.cout, g.groups, g.w, 1, g.ow, 1, g.kw, 1, g.sw, 1, g.pw, 0, g.dw, 1)
        X, DY, GW = _tall(X), _tall(DY), _tall(GW)
        xs, dys, gws = _tall_strides(xs), _tall_strides(dys), _tall_strides(gws)
    return _GradWeight(b, spec, g, X, xs, DY, dys, GW, gws, dtype, out_dtype).emit()


def _tall_strides(s):
    return (s[0], s[1], s[3], s[2])


def _tall(view: View) -> View:
    ap = view.ap
    d = ap.dims
    dims = (d[0], d[1], d[3], d[2])
    return _hbm(View(view.buffer, ap.__class__(ap.buffer, ap.dtype, 0, ap.dims), view.shape), ap.offset, dims)


def grad_bias_program(b: TileBuilder, spec, g: ConvGeom, DY: View, dys, GB: View, gbs: int, out_dtype: str) -> None:
    """``grad_bias[c] = sum of dy[:, c]``: channels on partitions, VectorE sums each image's pixels."""
    P = spec.partitions
    C = g.groups * g.cout
    px = g.oh * g.ow
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
