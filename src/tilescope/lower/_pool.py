"""Pooling and upsampling, forward and backward, on VectorE (GpSimd for index patterns).

Every op here works plane by plane: one (image, channel) plane per partition, 128 at a
time, its rows along the free dimension (read in contiguous runs). Large planes are cut
into blocks of output rows with their input halo.

* **max pooling** (``max_pool2d_with_indices``): the plane is padded with ``-inf`` on
  chip; one VectorE ``tensor_reduce`` over the (kh, kw) axes of a window access pattern
  gives every output. The indices are found tap by tap (last tap first): where the tap
  equals the max, the tap's offset replaces the kept one (``not_equal`` + ``select``),
  then the window origins (an ``iota``) are added -- the first maximum wins, as on CPU.
  The backward scatters ``grad`` tap by tap through ``indices == origin + offset`` masks,
  writing the padded positions no earlier tap reached and adding into the others.
* **average pooling** sums windows the same way (zero padding) and scales by the
  reciprocal window count (a per-position tile when padding or ``ceil_mode`` make it
  vary); its backward adds each tap's share into a zero-padded plane. Adaptive average
  pooling with uneven windows is separable: row sums, then column sums, each scaled.
* **upsampling** (nearest, bilinear) is separable too: output rows first, then columns.
  Output indices that share their source offsets and weights and advance together form
  one instruction over a strided access pattern (an integer scale factor is a handful of
  instructions per plane). The backward ops run the same maps transposed, accumulating.

Source indices and weights are computed in float32 exactly as PyTorch's CPU kernels do.

>>> from tilescope.lower import Call, TensorMeta, lower, contiguous_strides
>>> def t(*s, dt="float32"): return TensorMeta(s, contiguous_strides(s), dt)
>>> call = Call("aten::max_pool2d_with_indices", (t(8, 64, 112, 112), (3, 3), (2, 2), (1, 1)), (),
...             (t(8, 64, 56, 56), t(8, 64, 56, 56, dt="int64")))
>>> lower(call).rule
'pool'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..isa import ScalarTensorTensor
from ..program import TileBuilder, View, as_ap
from ._call import Call, TensorMeta
from ._conv import _ceil_div, _hbm, _on_chip, _short_run
from ._layout import hbm_input, hbm_output
from ._rules import Rule, add_rules

__all__ = ["lower_pool", "lower_pool_backward", "lower_upsample", "lower_upsample_backward"]

_FLOATS = ("float32", "bfloat16", "float16")
_PLANE_BUDGET = 24 * 1024  # bytes per partition of one block's largest tile
_NEG = float("-inf")


# ---- planes ----------------------------------------------------------------------------------

def _as4(m: TensorMeta, unbatched: bool = False) -> TensorMeta:
    """(N, C, L) as (N, C, 1, L); with ``unbatched``, a 2-D op's (C, H, W) as (1, C, H, W)."""
    if m.ndim == 4:
        return m
    a, c, length = m.shape
    s0, s1, s2 = m.stride
    if unbatched:
        return TensorMeta((1, a, c, length), (a * s0, s0, s1, s2), m.dtype)
    return TensorMeta((a, c, 1, length), (s0, s1, s2 * length, s2), m.dtype)


def _view4(view: View, m: TensorMeta, unbatched: bool = False) -> View:
    m4 = _as4(m, unbatched)
    return _hbm(View(view.buffer, view.ap.__class__(view.ap.buffer, view.ap.dtype, 0, view.ap.dims), view.shape),
                view.ap.offset, tuple(zip(m4.stride, m4.shape)))


def _plane_tiles(metas, P: int, plane_bytes: int) -> list[tuple]:
    """Tiles of planes: (first plane offset index (image, channel), partitions, planes per
    partition). Small planes are packed ``k`` to a partition (consecutive planes, so each
    partition's DMA run is ``k`` whole planes) when every tensor's planes are evenly spaced."""
    n, c = metas[0].shape[:2]
    total = n * c
    if all(m.stride[0] == c * m.stride[1] for m in metas):
        # several tiles in flight (loads overlap compute), each as large as the budget allows
        k = max(1, min(_PLANE_BUDGET // max(plane_bytes, 1), -(-total // (4 * P))))
        tiles, p = [], 0
        while p < total:
            rem = total - p
            kk = k if rem >= k else 1
            parts = min(P, rem // kk)
            tiles.append((p // c, p % c, parts, kk))
            p += parts * kk
        return tiles
    return [(i, c0, min(P, c - c0), 1) for i in range(n) for c0 in range(0, c, P)]


def _plane_dims(m: TensorMeta, tile) -> tuple[int, tuple]:
    """(offset, (partition dim, plane dim)) of a plane tile in tensor ``m`` (4-D)."""
    i, c0, parts, k = tile
    s1 = m.stride[1]
    return i * m.stride[0] + c0 * s1, ((k * s1, parts), (s1, k))


def _pc(t: View, tile, pe: int, offset: int, dims) -> View:
    """A region of a plane tile ``[parts, k, ...]`` (``pe`` elements per plane): every plane."""
    return _on_chip(t, 0, tile[2], offset, ((pe, tile[3]),) + tuple(dims))


def _load_rows(b: TileBuilder, view: View, m: TensorMeta, tile, t: View, row0: int, rows: int) -> None:
    """DMA rows [row0, row0 + rows) of the planes of ``tile`` into the [parts, k, rows, W] tile ``t``."""
    off, pd = _plane_dims(m, tile)
    W = m.shape[3]
    src = _hbm(view, off + row0 * m.stride[2], pd + ((m.stride[2], rows), (m.stride[3], W)))
    b.dma_copy(_pc(t, tile, rows * W, 0, ((W, rows), (1, W))), src)


def _store_rows(b: TileBuilder, view: View, m: TensorMeta, tile, t: View, row0: int, rows: int, cols: int,
                t_rows: int, t_width: int, t_row: int = 0, col0: int = 0) -> None:
    off, pd = _plane_dims(m, tile)
    dst = _hbm(view, off + row0 * m.stride[2], pd + ((m.stride[2], rows), (m.stride[3], cols)))
    b.dma_copy(dst, _pc(t, tile, t_rows * t_width, t_row * t_width + col0, ((t_width, rows), (1, cols))))


def _tile(b: TileBuilder, tile, free, dtype: str, site: str) -> View:
    return b.sbuf((tile[2], tile[3]) + tuple(free), dtype, site=site, bufs=2)


# ---- pooling geometry ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Pool:
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int = 1
    dw: int = 1

    @property
    def taps(self) -> int:
        return self.kh * self.kw

    def rows_in(self, nr: int) -> int:
        return (nr - 1) * self.sh + (self.kh - 1) * self.dh + 1

    @property
    def wp(self) -> int:
        """Padded width the windows read."""
        return (self.ow - 1) * self.sw + (self.kw - 1) * self.dw + 1

    def plane_bytes(self, isz: int) -> int:
        return self.rows_in(self.oh) * self.wp * max(isz, 4)

    def block_rows(self, isz: int, k: int) -> int:
        """Output rows per block: the padded input rows within the plane budget (whole planes
        when several share a partition)."""
        nr = self.oh
        while k == 1 and nr > 1 and self.rows_in(nr) * self.wp * max(isz, 4) > _PLANE_BUDGET:
            nr = max(1, nr // 2)
        return nr

    def window(self, t: View, tile, nr: int, kh=None, kw=None) -> View:
        """The windows of ``nr`` output rows over a padded tile (all taps, or tap (kh, kw))."""
        wp = self.wp
        pe = self.rows_in(nr) * wp
        dims = ((self.sh * wp, nr), (self.sw, self.ow))
        if kh is None:
            return _pc(t, tile, pe, 0, dims + ((self.dh * wp, self.kh), (self.dw, self.kw)))
        return _pc(t, tile, pe, kh * self.dh * wp + kw * self.dw, dims)


def _out_size(size, k, s, p, d, ceil_mode) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= size + p:
        o -= 1
    return o


def _pool_geometry(x: TensorMeta, ks, stride, padding, dilation, ceil_mode, out: TensorMeta):
    if x.ndim not in (3, 4) or out.ndim != x.ndim:
        return None
    nd = x.ndim - 2

    def norm(v, default):
        v = default if v is None else v
        v = (v,) if isinstance(v, int) else tuple(v)
        return v * nd if len(v) == 1 else v

    ks = norm(ks, None)
    stride = norm(stride, None) if stride else ks
    padding, dilation = norm(padding, 0), norm(dilation, 1)
    if not len(ks) == len(stride) == len(padding) == len(dilation) == nd:
        return None
    if nd == 1:
        ks, stride, padding, dilation = (1,) + ks, (1,) + stride, (0,) + padding, (1,) + dilation
    x4, o4 = _as4(x), _as4(out)
    h, w = x4.shape[2:]
    oh = _out_size(h, ks[0], stride[0], padding[0], dilation[0], ceil_mode)
    ow = _out_size(w, ks[1], stride[1], padding[1], dilation[1], ceil_mode)
    if (oh, ow) != o4.shape[2:] or o4.shape[:2] != x4.shape[:2]:
        return None
    return _Pool(h, w, oh, ow, ks[0], ks[1], stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1])


def _padded(b: TileBuilder, spec, g: _Pool, view: View, m: TensorMeta, tile, r0: int, nr: int, fill: float,
            site: str):
    """Input rows of output rows [r0, r0 + nr), padded with ``fill``: [parts, k, rows_in, wp].
    Rows shorter than a DMA chunk are loaded contiguously and widened on GpSimd."""
    rows, wp = g.rows_in(nr), g.wp
    pe = rows * wp
    t = _tile(b, tile, (rows, wp), m.device_dtype, site)
    top = r0 * g.sh - g.ph  # input row of tile row 0
    lo, hi = max(0, -top), min(rows, g.h - top)
    cols = min(g.w, wp - g.pw)
    regions = []
    if lo > 0:
        regions.append((0, lo, 0, wp))
    if hi < rows:
        regions.append((max(hi, 0), rows, 0, wp))
    if g.pw > 0:
        regions.append((lo, hi, 0, g.pw))
    if g.pw + cols < wp:
        regions.append((lo, hi, g.pw + cols, wp))
    for a, e, c0, c1 in regions:
        if e > a and c1 > c0:
            b.memset(_pc(t, tile, pe, a * wp + c0, ((wp, e - a), (1, c1 - c0))), fill, engine="act")
    if hi > lo and cols > 0:
        off, pd = _plane_dims(m, tile)
        src = _hbm(view, off + (top + lo) * m.stride[2], pd + ((m.stride[2], hi - lo), (m.stride[3], cols)))
        dst = _pc(t, tile, pe, lo * wp + g.pw, ((wp, hi - lo), (1, cols)))
        run = min(src.ap.contiguous_bytes(), dst.ap.contiguous_bytes())
        if _short_run(run, spec) and src.ap.contiguous_bytes() > run and cols == g.w:
            stage = _tile(b, tile, (hi - lo, cols), m.device_dtype, site + ".stage")
            b.dma_copy(stage, src)
            b.tensor_copy(dst, stage, engine="pool")
        else:
            b.dma_copy(dst, src)
    return t


def _blocks(g: _Pool, isz: int, k: int):
    nr = g.block_rows(isz, k)
    return [(r0, min(nr, g.oh - r0)) for r0 in range(0, g.oh, nr)]


# ---- max pooling ------------------------------------------------------------------------------------

def _tap_offset(g: _Pool, kh: int, kw: int) -> float:
    """Flat input offset of tap (kh, kw) from its window's origin."""
    return float(kh * g.dh * g.w + kw * g.dw)


class _Origins:
    """Flat input index of each window's origin (may be negative in the padding), for a block
    of ``nr`` output rows starting at row 0: one GpSimd iota per tile shape, kept for the
    whole kernel; block ``r0``'s origins are these plus :meth:`shift`."""

    def __init__(self, b: TileBuilder, g: _Pool):
        self.b, self.g, self.tiles = b, g, {}

    def __call__(self, tile, nr: int) -> View:
        g, key = self.g, (tile[2], tile[3], nr)
        t = self.tiles.get(key)
        if t is None:
            t = self.b.sbuf((tile[2], tile[3], nr, g.ow), "float32", site=f"pool.origin{key}", bufs=1)
            self.b.iota(t, base=-g.ph * g.w - g.pw, partition_step=0, steps=(0, g.sh * g.w, g.sw))
            self.tiles[key] = t
        return t

    def shift(self, r0: int) -> float:
        return float(r0 * self.g.sh * self.g.w)


def _tiles_windows(g: _Pool) -> bool:
    """Windows tile the input exactly: every input position is in exactly one window."""
    return (g.sh == g.kh and g.sw == g.kw and g.dh == 1 and g.dw == 1 and g.ph == 0 and g.pw == 0
            and g.oh * g.kh == g.h and g.ow * g.kw == g.w)


def _max_pool(b, spec, g: _Pool, X, x, Y, y, I, idx_meta, P):
    isz = x.itemsize
    origins = _Origins(b, g)
    for tile in _plane_tiles([x, y] + ([idx_meta] if idx_meta is not None else []), P, g.plane_bytes(isz)):
        for r0, nr in _blocks(g, isz, tile[3]):
            t = _padded(b, spec, g, X, x, tile, r0, nr, _NEG, "pool.x")
            out = _tile(b, tile, (nr, g.ow), y.device_dtype, "pool.y")
            b.tensor_reduce(out, g.window(t, tile, nr), "max", axes=(4, 5))
            _store_rows(b, Y, y, tile, out, r0, nr, g.ow, nr, g.ow)
            if I is None:
                continue
            off = _tile(b, tile, (nr, g.ow), "float32", "pool.off")
            ne = _tile(b, tile, (nr, g.ow), "float32", "pool.ne")
            first = True
            for kh in reversed(range(g.kh)):
                for kw in reversed(range(g.kw)):
                    o = _tap_offset(g, kh, kw)
                    if first:  # the last tap: every window has a tap at least as late as its max
                        b.memset(off, o, engine="act")
                        first = False
                        continue
                    b.tensor_tensor(ne, g.window(t, tile, nr, kh, kw), out, "not_equal")
                    b.select(off, ne, off, o)
            idx = _tile(b, tile, (nr, g.ow), idx_meta.device_dtype, "pool.idx")
            # off + the block's shift + origins: exact integers, cast on write
            b.emit(ScalarTensorTensor(as_ap(idx), as_ap(off), "add", origins.shift(r0), "add",
                                      as_ap(origins(tile, nr))))
            _store_rows(b, I, idx_meta, tile, idx, r0, nr, g.ow, nr, g.ow)


def _rects(cov: np.ndarray) -> list[tuple[int, int, int, int, bool]]:
    """``cov`` (rows x columns of booleans) as rectangles (i0, i1, j0, j1, value) of one value:
    runs of equal rows, each cut into runs of equal columns."""
    out, n, m = [], cov.shape[0], cov.shape[1]
    i = 0
    while i < n:
        i1 = i + 1
        while i1 < n and (cov[i1] == cov[i]).all():
            i1 += 1
        j = 0
        while j < m:
            j1 = j + 1
            while j1 < m and cov[i, j1] == cov[i, j]:
                j1 += 1
            out.append((i, i1, j, j1, bool(cov[i, j])))
            j = j1
        i = i1
    return out


def _tap_plan(g: _Pool, nr: int, top: int):
    """Per tap (kh, kw): the rectangles of its (output row, column) grid whose padded positions
    an earlier tap already wrote (True: add into them) or not (False: write them), and whether
    every in-image position gets written (else the accumulator starts from zeros)."""
    rows, wp = g.rows_in(nr), g.wp
    cover = np.zeros((rows, wp), dtype=bool)
    plan = []
    for kh in range(g.kh):
        for kw in range(g.kw):
            r = np.arange(nr) * g.sh + kh * g.dh
            c = np.arange(g.ow) * g.sw + kw * g.dw
            plan.append((kh, kw, _rects(cover[np.ix_(r, c)])))
            cover[np.ix_(r, c)] = True
    lo, hi = max(0, -top), min(rows, g.h - top)
    whole = bool(cover[lo:hi, g.pw:g.pw + min(g.w, wp - g.pw)].all())
    return plan, whole


def _max_pool_backward(b, g: _Pool, DY, dy, I, idx_meta, DX, dx, P):
    """dx[idx] += dy, tap by tap: ``mask = (idx - origin == offset)`` times dy in one VectorE
    pass, written straight into the padded plane where no earlier tap reached, added into it
    where one did (a per-tap mask tile, then an add)."""
    origins = _Origins(b, g)
    for tile in _plane_tiles([dy, idx_meta, dx], P, g.plane_bytes(4)):
        blocks = _blocks(g, 4, tile[3])
        carry = None
        for r0, nr in blocks:
            rows, wp = g.rows_in(nr), g.wp
            plan, whole = _tap_plan(g, nr, r0 * g.sh - g.ph)
            acc = _tile(b, tile, (rows, wp), "float32", "pool.acc")
            if not whole:
                b.memset(acc, 0.0)
            dyt = _tile(b, tile, (nr, g.ow), dy.device_dtype, "pool.dy")
            _load_rows(b, DY, dy, tile, dyt, r0, nr)
            it = _tile(b, tile, (nr, g.ow), idx_meta.device_dtype, "pool.i")
            _load_rows(b, I, idx_meta, tile, it, r0, nr)
            rel = _tile(b, tile, (nr, g.ow), "float32", "pool.rel")
            b.tensor_copy(rel, it, engine="act")  # the cast on ScalarE, off VectorE's path
            b.emit(ScalarTensorTensor(as_ap(rel), as_ap(rel), "subtract", origins.shift(r0), "subtract",
                                      as_ap(origins(tile, nr))))
            eq = None
            pe, po = rows * wp, nr * g.ow
            for kh, kw, rects in plan:
                o = _tap_offset(g, kh, kw)
                for i0, i1, j0, j1, covered in rects:
                    dims = ((g.ow, i1 - i0), (1, j1 - j0))
                    at = i0 * g.ow + j0
                    win = _pc(acc, tile, pe, (i0 * g.sh + kh * g.dh) * wp + j0 * g.sw + kw * g.dw,
                              ((g.sh * wp, i1 - i0), (g.sw, j1 - j0)))
                    if covered and eq is None:
                        eq = _tile(b, tile, (nr, g.ow), "float32", "pool.eq")
                    dst = _pc(eq, tile, po, at, dims) if covered else win
                    b.emit(ScalarTensorTensor(as_ap(dst), as_ap(_pc(rel, tile, po, at, dims)), "equal", o,
                                              "multiply", as_ap(_pc(dyt, tile, po, at, dims))))
                    if covered:
                        b.tensor_tensor(win, win, dst, "add")
            carry = _store_plane_rows(b, g, DX, dx, tile, acc, r0, nr, blocks, carry)


def _store_plane_rows(b, g: _Pool, DX, dx, tile, acc, r0, nr, blocks, carry):
    """Store the input rows block ``r0`` owns -- from its first input row up to the next
    block's (or the end) -- from its padded accumulator; rows no window reaches are 0.
    Blocks' halos overlap: ``carry`` (the previous accumulator, its row of this block's
    first row, the rows shared) is added in first. Returns the carry for the next block."""
    wp, rows = g.wp, g.rows_in(nr)
    pe = rows * wp
    top = r0 * g.sh - g.ph
    nxt = [a for a, _ in blocks if a > r0]
    end_row = (nxt[0] * g.sh - g.ph) if nxt else g.h
    first = max(0, top)  # first input row this block owns
    if carry is not None:
        prev, p_row, shared, p_pe = carry
        region = _pc(acc, tile, pe, g.pw, ((wp, shared), (1, wp - g.pw)))
        b.tensor_tensor(region, region, _pc(prev, tile, p_pe, p_row * wp + g.pw, ((wp, shared), (1, wp - g.pw))),
                        "add")
    owned = min(end_row, g.h) - first
    if owned > 0:
        out = _tile(b, tile, (owned, g.w), dx.device_dtype, "pool.dx")
        lo = first - top  # its row in the accumulator
        have = max(0, min(owned, rows - lo))
        cols = min(g.w, wp - g.pw)
        if have < owned or cols < g.w:  # rows or columns beyond every window
            b.memset(out, 0.0)
        if have > 0 and cols > 0:  # on ScalarE, beside VectorE's next block
            b.tensor_copy(_pc(out, tile, owned * g.w, 0, ((g.w, have), (1, cols))),
                          _pc(acc, tile, pe, lo * wp + g.pw, ((wp, have), (1, cols))), engine="act")
        _store_rows(b, DX, dx, tile, out, first, owned, g.w, owned, g.w)
    if nxt:
        shared = top + rows - end_row
        return (acc, end_row - top, shared, pe) if shared > 0 else None
    return None


# ---- average pooling ------------------------------------------------------------------------------

def _counts(b, g: _Pool, tile, r0, nr, include_pad: bool, divisor) -> View:
    """1 / (window count) per output position: constant, or summed from a ones plane."""
    rc = _tile(b, tile, (nr, g.ow), "float32", "pool.rcount")
    if divisor:
        b.memset(rc, 1.0 / divisor)
        return rc
    rows, wp = g.rows_in(nr), g.wp
    ones = _tile(b, tile, (rows, wp), "float32", "pool.ones")
    b.memset(ones, 0.0)
    top = r0 * g.sh - g.ph
    # counted region: the image, or the image and its padding (not the ceil_mode overhang)
    r_lo, r_hi = (-g.ph, g.h + g.ph) if include_pad else (0, g.h)
    c_lo, c_hi = (-g.pw, g.w + g.pw) if include_pad else (0, g.w)
    a, e = max(0, r_lo - top), min(rows, r_hi - top)
    ca, ce = max(0, c_lo + g.pw), min(wp, c_hi + g.pw)
    if e > a and ce > ca:
        b.memset(_pc(ones, tile, rows * wp, a * wp + ca, ((wp, e - a), (1, ce - ca))), 1.0)
    b.tensor_reduce(rc, g.window(ones, tile, nr), "add", axes=(4, 5))
    b.activation(rc, rc, "reciprocal")
    return rc


def _uniform_count(g: _Pool, include_pad, divisor) -> float | None:
    if divisor:
        return 1.0 / divisor
    overhang = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1 > g.h + 2 * g.ph or \
        (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1 > g.w + 2 * g.pw
    if overhang or (not include_pad and (g.ph or g.pw)):
        return None
    return 1.0 / g.taps


def _avg_pool(b, spec, g: _Pool, X, x, Y, y, include_pad, divisor, P):
    uniform = _uniform_count(g, include_pad, divisor)
    for tile in _plane_tiles([x, y], P, g.plane_bytes(x.itemsize)):
        for r0, nr in _blocks(g, x.itemsize, tile[3]):
            t = _padded(b, spec, g, X, x, tile, r0, nr, 0.0, "pool.x")
            s = _tile(b, tile, (nr, g.ow), "float32", "pool.sum")
            b.tensor_reduce(s, g.window(t, tile, nr), "add", axes=(4, 5))
            out = _tile(b, tile, (nr, g.ow), y.device_dtype, "pool.y")
            if uniform is not None:
                b.activation(out, s, "copy", scale=uniform)
            else:
                b.tensor_tensor(out, s, _counts(b, g, tile, r0, nr, include_pad, divisor), "multiply")
            _store_rows(b, Y, y, tile, out, r0, nr, g.ow, nr, g.ow)


def _avg_pool_backward(b, g: _Pool, DY, dy, DX, dx, include_pad, divisor, P):
    uniform = _uniform_count(g, include_pad, divisor)
    for tile in _plane_tiles([dy, dx], P, g.plane_bytes(4)):
        blocks = _blocks(g, 4, tile[3])
        carry = None
        for r0, nr in blocks:
            rows, wp = g.rows_in(nr), g.wp
            dyt = _tile(b, tile, (nr, g.ow), dy.device_dtype, "pool.dy")
            _load_rows(b, DY, dy, tile, dyt, r0, nr)
            share = _tile(b, tile, (nr, g.ow), "float32", "pool.share")
            if uniform is not None:
                b.activation(share, dyt, "copy", scale=uniform)
            else:
                b.tensor_tensor(share, dyt, _counts(b, g, tile, r0, nr, include_pad, divisor), "multiply")
            acc = _tile(b, tile, (rows, wp), "float32", "pool.acc")
            if g.sh == g.kh and g.sw == g.kw and g.dh == 1 and g.dw == 1 and rows == nr * g.kh and wp == g.ow * g.kw:
                # windows tile the plane: each input position gets one share (one broadcast copy)
                b.tensor_copy(_pc(acc, tile, rows * wp, 0, ((g.kh * wp, nr), (wp, g.kh), (g.kw, g.ow), (1, g.kw))),
                              _pc(share, tile, nr * g.ow, 0, ((g.ow, nr), (0, g.kh), (1, g.ow), (0, g.kw))))
            else:
                b.memset(acc, 0.0)
                for kh in range(g.kh):
                    for kw in range(g.kw):
                        win = g.window(acc, tile, nr, kh, kw)
                        b.tensor_tensor(win, win, share, "add")
            carry = _store_plane_rows(b, g, DX, dx, tile, acc, r0, nr, blocks, carry)


# ---- adaptive average pooling (uneven windows): separable ------------------------------------------

def _adaptive_windows(size: int, out: int) -> list[tuple[int, int]]:
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


def _adaptive_avg(b, X, x, Y, y, P):
    H, W = x.shape[2], x.shape[3]
    OH, OW = y.shape[2], y.shape[3]
    rows_w, cols_w = _adaptive_windows(H, OH), _adaptive_windows(W, OW)
    for tile in _plane_tiles([x, y], P, H * W * 4):
        t = _tile(b, tile, (H, W), x.device_dtype, "pool.x")
        _load_rows(b, X, x, tile, t, 0, H)
        tmp = _tile(b, tile, (OH, W), "float32", "pool.rows")
        for i, (a, e) in enumerate(rows_w):
            row = _pc(tmp, tile, OH * W, i * W, ((1, W),))
            b.tensor_reduce(row, _pc(t, tile, H * W, a * W, ((1, W), (W, e - a))), "add", axes=(3,))
            b.tensor_scalar(row, row, "multiply", 1.0 / (e - a))
        out = _tile(b, tile, (OH, OW), "float32", "pool.cols")
        for j, (a, e) in enumerate(cols_w):
            col = _pc(out, tile, OH * OW, j, ((OW, OH),))
            b.tensor_reduce(col, _pc(tmp, tile, OH * W, a, ((W, OH), (1, e - a))), "add", axes=(3,))
            b.tensor_scalar(col, col, "multiply", 1.0 / (e - a))
        res = _tile(b, tile, (OH, OW), y.device_dtype, "pool.y")
        b.tensor_copy(res, out)
        _store_rows(b, Y, y, tile, res, 0, OH, OW, OH, OW)


def _adaptive_avg_backward(b, DY, dy, DX, dx, P):
    OH, OW = dy.shape[2], dy.shape[3]
    H, W = dx.shape[2], dx.shape[3]
    rows_w, cols_w = _adaptive_windows(H, OH), _adaptive_windows(W, OW)
    for tile in _plane_tiles([dy, dx], P, H * W * 4):
        dyt = _tile(b, tile, (OH, OW), dy.device_dtype, "pool.dy")
        _load_rows(b, DY, dy, tile, dyt, 0, OH)
        tmp = _tile(b, tile, (OH, W), "float32", "pool.rows")
        b.memset(tmp, 0.0)
        share = _tile(b, tile, (OH, 1), "float32", "pool.share")
        for j, (a, e) in enumerate(cols_w):
            b.tensor_scalar(share, _pc(dyt, tile, OH * OW, j, ((OW, OH), (1, 1))), "multiply", 1.0 / (e - a))
            region = _pc(tmp, tile, OH * W, a, ((W, OH), (1, e - a)))
            b.tensor_tensor(region, region, _pc(share, tile, OH, 0, ((1, OH), (0, e - a))), "add")
        acc = _tile(b, tile, (H, W), "float32", "pool.acc")
        b.memset(acc, 0.0)
        rowv = _tile(b, tile, (W,), "float32", "pool.rowv")
        for i, (a, e) in enumerate(rows_w):
            b.tensor_scalar(rowv, _pc(tmp, tile, OH * W, i * W, ((1, W),)), "multiply", 1.0 / (e - a))
            region = _pc(acc, tile, H * W, a * W, ((W, e - a), (1, W)))
            b.tensor_tensor(region, region, _pc(rowv, tile, W, 0, ((0, e - a), (1, W))), "add")
        res = _tile(b, tile, (H, W), dx.device_dtype, "pool.dx")
        b.tensor_copy(res, acc)
        _store_rows(b, DX, dx, tile, res, 0, H, W, H, W)


# ---- rules: pooling ------------------------------------------------------------------------------

def _fits_whole(*metas) -> bool:
    """A plane of each tensor fits the plane budget (adaptive and upsampling ops keep whole planes)."""
    return all(m.shape[-1] * (m.shape[-2] if m.ndim == 4 else 1) * 4 <= 2 * _PLANE_BUDGET for m in metas)


def lower_pool(call: Call, spec):
    """max_pool2d_with_indices, avg_pool2d and _adaptive_avg_pool2d (and 1-D forms)."""
    nm = call.named()
    x = nm.get("self")
    if not isinstance(x, TensorMeta) or x.dtype not in _FLOATS or x.numel == 0 or not call.outputs:
        return None
    op = call.packet
    y = call.outputs[0]
    b = TileBuilder(call.op, spec)
    P = spec.partitions
    with b.provenance(op=call.op):
        X = _view4(hbm_input(b, "in_self", x), x, op == "_adaptive_avg_pool2d")
        Y = _view4(hbm_output(b, "out", y), y, op == "_adaptive_avg_pool2d")
        x4, y4 = _as4(x, op == "_adaptive_avg_pool2d"), _as4(y, op == "_adaptive_avg_pool2d")
        if op == "_adaptive_avg_pool2d":
            if not _fits_whole(x4, y4):
                return None
            H, W = x4.shape[2:]
            OH, OW = y4.shape[2:]
            if H % OH == 0 and W % OW == 0:
                g = _Pool(H, W, OH, OW, H // OH, W // OW, H // OH, W // OW, 0, 0)
                _avg_pool(b, spec, g, X, x4, Y, y4, True, None, P)
            else:
                _adaptive_avg(b, X, x4, Y, y4, P)
            return b.build(meta={"lowering": "pool"}, shrink_rotation=True)
        g = _pool_geometry(x, nm.get("kernel_size"), nm.get("stride") or (), nm.get("padding"),
                           nm.get("dilation", (1,)), bool(nm.get("ceil_mode", False)), y)
        if g is None:
            return None
        if op == "max_pool2d_with_indices":
            if len(call.outputs) != 2:
                return None
            idx = _as4(call.outputs[1])
            I = _view4(hbm_output(b, "indices", call.outputs[1]), call.outputs[1])
            _max_pool(b, spec, g, X, x4, Y, y4, I, idx, P)
        elif op in ("max_pool2d", "max_pool1d"):
            _max_pool(b, spec, g, X, x4, Y, y4, None, None, P)
        elif op in ("avg_pool2d", "avg_pool1d"):
            _avg_pool(b, spec, g, X, x4, Y, y4, bool(nm.get("count_include_pad", True)), nm.get("divisor_override"),
                      P)
        else:
            return None
    return b.build(meta={"lowering": "pool"}, shrink_rotation=True)


def lower_pool_backward(call: Call, spec):
    nm = call.named()
    dy, x = nm.get("grad_output"), nm.get("self")
    if not isinstance(dy, TensorMeta) or dy.dtype not in _FLOATS or len(call.outputs) != 1 or dy.numel == 0:
        return None
    dx = call.outputs[0]
    op = call.packet
    b = TileBuilder(call.op, spec)
    P = spec.partitions
    with b.provenance(op=call.op):
        planes = op == "_adaptive_avg_pool2d_backward"
        DY = _view4(hbm_input(b, "in_grad_output", dy), dy, planes)
        DX = _view4(hbm_output(b, "grad_input", dx), dx, planes)
        dy4, dx4 = _as4(dy, planes), _as4(dx, planes)
        if op == "_adaptive_avg_pool2d_backward":
            if not _fits_whole(dy4, dx4):
                return None
            H, W = dx4.shape[2:]
            OH, OW = dy4.shape[2:]
            if H % OH == 0 and W % OW == 0:
                g = _Pool(H, W, OH, OW, H // OH, W // OW, H // OH, W // OW, 0, 0)
                _avg_pool_backward(b, g, DY, dy4, DX, dx4, True, None, P)
            else:
                _adaptive_avg_backward(b, DY, dy4, DX, dx4, P)
            return b.build(meta={"lowering": "pool_backward"}, shrink_rotation=True)
        if not isinstance(x, TensorMeta):
            return None
        g = _pool_geometry(x, nm.get("kernel_size"), nm.get("stride") or (), nm.get("padding"),
                           nm.get("dilation", (1,)), bool(nm.get("ceil_mode", False)), dy)
        if g is None:
            return None
        if op == "max_pool2d_with_indices_backward":
            idx = nm.get("indices")
            if not isinstance(idx, TensorMeta) or idx.shape != dy.shape:
                return None
            I = _view4(hbm_input(b, "in_indices", idx), idx)
            _max_pool_backward(b, g, DY, dy4, I, _as4(idx), DX, dx4, P)
        elif op == "avg_pool2d_backward":
            _avg_pool_backward(b, g, DY, dy4, DX, dx4, bool(nm.get("count_include_pad", True)),
                               nm.get("divisor_override"), P)
        else:
            return None
    return b.build(meta={"lowering": "pool_backward"}, shrink_rotation=True)


# ---- upsampling: separable index maps --------------------------------------------------------------

def _nearest_map(in_size: int, out_size: int, scale) -> list[int]:
    """PyTorch's nearest source index (float32 arithmetic)."""
    if out_size == in_size:
        return list(range(out_size))
    if out_size == 2 * in_size:
        return [i >> 1 for i in range(out_size)]
    s = np.float32(1.0 / scale) if scale else np.float32(in_size) / np.float32(out_size)
    return [min(int(np.floor(np.float32(i) * s)), in_size - 1) for i in range(out_size)]


def _linear_map(in_size: int, out_size: int, align_corners: bool, scale) -> list[tuple[int, int, float, float]]:
    """(i0, i1, w0, w1) per output index, as PyTorch's linear upsampling computes them."""
    if align_corners:
        s = np.float32(in_size - 1) / np.float32(out_size - 1) if out_size > 1 else np.float32(0)
    else:
        s = np.float32(1.0 / scale) if scale else np.float32(in_size) / np.float32(out_size)
    out = []
    for i in range(out_size):
        if align_corners:
            src = np.float32(s * np.float32(i))
        else:
            src = np.float32(max(np.float32(s * (np.float32(i) + np.float32(0.5))) - np.float32(0.5), np.float32(0)))
        i0 = min(int(src), in_size - 1)
        i1 = i0 + (1 if i0 < in_size - 1 else 0)
        w1 = float(np.float32(src - np.float32(i0)))
        w0 = float(np.float32(1) - np.float32(w1))
        out.append((i0, i1, w0, w1))
    return out


def _runs(entries: list[tuple], key=lambda e: e[2:], distinct=()) -> list[tuple[int, int, tuple]]:
    """Group output indices into arithmetic runs: (first output, count, steps) where every
    field of ``entries`` (source indices first) advances by a constant step and the rest
    (``key``) is equal; fields in ``distinct`` must advance (no two outputs share them)."""
    groups: list[tuple[int, int, tuple]] = []
    used = [False] * len(entries)
    for start in range(len(entries)):
        if used[start]:
            continue
        used[start] = True
        members = [start]
        steps = None
        for j in range(start + 1, len(entries)):
            if used[j] or key(entries[j]) != key(entries[start]):
                continue
            cand = (j - members[-1],) + tuple(a - b_ for a, b_ in zip(entries[j][:2], entries[members[-1]][:2]))
            if steps is None:
                if any(cand[1 + k] == 0 for k in distinct):
                    continue
                steps = cand
            elif cand != steps:
                continue
            members.append(j)
            used[j] = True
        if steps is None:
            steps = (1, 0, 0)
        groups.append((start, len(members), steps))
    return groups


def _axis_views(t: View, parts: int, outer: int, size: int, inner: int, axis_index: int, step: int, count: int):
    """Along one axis of a [parts, outer, size, inner] tile: the ``count`` slices starting at
    ``axis_index`` every ``step``, as [parts, outer, count, inner]."""
    return _on_chip(t, 0, parts, axis_index * inner, ((size * inner, outer), (step * inner, count), (1, inner)))


def _nearest_pass(b, src, dst, parts, outer, in_size, out_size, inner, mapping, backward: bool):
    """One axis of nearest upsampling: dst[..., i, ...] = src[..., map(i), ...] (forward), or
    dst[..., r, ...] = sum of src[..., i, ...] over map(i) == r (backward)."""
    entries = [(m, 0) for m in mapping]
    # runs of equal source index: output [i0, i0 + L) read source r
    runs, i = [], 0
    while i < out_size:
        j = i
        while j + 1 < out_size and mapping[j + 1] == mapping[i]:
            j += 1
        runs.append((mapping[i], 0, j - i + 1, i))
        i = j + 1
    del entries
    groups = _runs([(r[0], r[3], r[2]) for r in runs], key=lambda e: e[2:], distinct=(0,))
    if backward:
        b.memset(dst, 0.0)
    for g0, count, steps in groups:
        r0, o0, L = runs[g0][0], runs[g0][3], runs[g0][2]
        rstep, ostep = steps[1], steps[2]
        # dst/src regions over [parts, outer, count, L, inner] (L: the run's outputs)
        if not backward:
            d = _on_chip(dst, 0, parts, o0 * inner, ((out_size * inner, outer), (ostep * inner, count), (inner, L),
                                                     (1, inner)))
            s = _on_chip(src, 0, parts, r0 * inner, ((in_size * inner, outer), (rstep * inner, count), (0, L),
                                                     (1, inner)))
            b.tensor_copy(d, s)
        else:
            part = b.sbuf((parts, outer, count, inner), "float32", site="up.part", bufs=2)
            s = _on_chip(src, 0, parts, o0 * inner, ((out_size * inner, outer), (ostep * inner, count), (1, inner),
                                                     (inner, L)))
            b.tensor_reduce(part, s, "add", axes=(4,))
            d = _on_chip(dst, 0, parts, r0 * inner, ((in_size * inner, outer), (rstep * inner, count), (1, inner)))
            b.tensor_tensor(d, d, part, "add")


def _linear_pass(b, src, dst, parts, outer, in_size, out_size, inner, mapping, backward: bool):
    """One axis of linear interpolation: dst[i] = w0*src[i0] + w1*src[i1] (forward) or
    dst[i0] += w0*src[i], dst[i1] += w1*src[i] (backward), grouped into arithmetic runs."""
    if backward:
        _linear_pass_backward(b, src, dst, parts, outer, in_size, out_size, inner, mapping)
        return
    entries = [(m[0], m[1], m[2], m[3]) for m in mapping]
    groups = _runs(entries, key=lambda e: e[2:])
    for o0, count, steps in groups:
        i0, i1, w0, w1 = entries[o0]
        ostep = steps[0] if count > 1 else 1
        s0 = steps[1] if count > 1 else 0
        s1 = steps[2] if count > 1 else 0
        if not backward:
            d = _axis_views(dst, parts, outer, out_size, inner, o0, ostep, count)
            a = _axis_views(src, parts, outer, in_size, inner, i0, s0, count)
            if w1 == 0.0 or i0 == i1:
                b.activation(d, a, "copy", scale=w0 + (w1 if i0 == i1 else 0.0))
                continue
            t = b.sbuf((parts, outer, count, inner), "float32", site="up.t", bufs=2)
            b.activation(t, a, "copy", scale=w0)  # ScalarE: w0 * src[i0]
            c = _axis_views(src, parts, outer, in_size, inner, i1, s1, count)
            u = b.sbuf((parts, outer, count, inner), "float32", site="up.u", bufs=2)
            b.activation(u, c, "copy", scale=w1)  # ScalarE both products, VectorE the sum
            b.tensor_tensor(d, t, u, "add")


def _linear_pass_backward(b, src, dst, parts, outer, in_size, out_size, inner, mapping):
    """dst[r] = sum of w * src[i] over the outputs i that read r, gathered per destination:
    slot j holds each r's j-th contribution. Slot 0 writes (ScalarE: w * src), later slots
    add theirs in one VectorE pass each (``(src * w) + dst``) -- no zeroing, no separate
    product, and one add per contribution past the first instead of one per contribution."""
    contrib: list[list[tuple[int, float]]] = [[] for _ in range(in_size)]
    for i, (i0, i1, w0, w1) in enumerate(mapping):
        for r, w in ((i0, w0), (i1, w1)):
            if w != 0.0:
                contrib[r].append((i, w))
    if any(not c for c in contrib):  # a source no output reads: its gradient is 0
        b.memset(dst, 0.0)
    for j in range(max((len(c) for c in contrib), default=0)):
        entries = [(r, c[j][0], c[j][1]) for r, c in enumerate(contrib) if len(c) > j]
        for k0, count, steps in _runs(entries, key=lambda e: e[2:], distinct=(0, 1)):
            r0, i0, w = entries[k0]
            rstep, istep = (steps[1], steps[2]) if count > 1 else (1, 1)
            d = _axis_views(dst, parts, outer, in_size, inner, r0, rstep, count)
            g_ = _axis_views(src, parts, outer, out_size, inner, i0, istep, count)
            if j == 0:  # every read source has a first contribution
                b.activation(d, g_, "copy", scale=w)
            else:
                b.emit(ScalarTensorTensor(as_ap(d), as_ap(g_), "multiply", w, "add", as_ap(d)))


def _upsample(b, kind, X, x, Y, y, scales, align, P, backward=False):
    """Forward: rows then columns; backward: columns then rows (the transpose)."""
    H, W = (y if backward else x).shape[2:]
    OH, OW = (x if backward else y).shape[2:]
    if kind == "nearest":
        rmap, cmap = _nearest_map(H, OH, scales[0]), _nearest_map(W, OW, scales[1])
        run = _nearest_pass
    else:
        rmap, cmap = _linear_map(H, OH, align, scales[0]), _linear_map(W, OW, align, scales[1])
        run = _linear_pass
    for tile in _plane_tiles([x, y], P, (H * W + OH * W + OH * OW) * 4):
        parts, k = tile[2], tile[3]
        src = _tile(b, tile, tuple(x.shape[2:]), x.device_dtype, "up.x")
        _load_rows(b, X, x, tile, src, 0, x.shape[2])
        if not backward:
            mid = _tile(b, tile, (OH, W), "float32", "up.mid")
            run(b, src, mid, parts, k, H, OH, W, rmap, False)  # rows: [k, H, W] -> [k, OH, W]
            out = _tile(b, tile, (OH, OW), "float32", "up.out")
            run(b, mid, out, parts, k * OH, W, OW, 1, cmap, False)  # columns
        else:
            mid = _tile(b, tile, (OH, W), "float32", "up.mid")
            run(b, src, mid, parts, k * OH, W, OW, 1, cmap, True)  # grad [OH, OW] -> [OH, W]
            out = _tile(b, tile, (H, W), "float32", "up.out")
            run(b, mid, out, parts, k, H, OH, W, rmap, True)  # -> [H, W]
        res = out  # float32 results are stored as computed; other dtypes need a VectorE cast
        if y.device_dtype != "float32":
            res = _tile(b, tile, tuple(y.shape[2:]), y.device_dtype, "up.res")
            b.tensor_copy(res, out)
        _store_rows(b, Y, y, tile, res, 0, y.shape[2], y.shape[3], y.shape[2], y.shape[3])


def _up_kind(op: str):
    if op.startswith("upsample_nearest"):
        return "nearest"
    if op.startswith("upsample_bilinear") or op.startswith("upsample_linear"):
        return "linear"
    return None


def _scales(nm, ndim):
    if ndim == 3:
        return (None, nm.get("scales"))
    return (nm.get("scales_h"), nm.get("scales_w"))


def lower_upsample(call: Call, spec):
    return _upsample_program(call, spec, "self", "in_self", "out", backward=False)


def lower_upsample_backward(call: Call, spec):
    return _upsample_program(call, spec, "grad_output", "in_grad_output", "grad_input", backward=True)


def _upsample_program(call: Call, spec, arg: str, in_name: str, out_name: str, backward: bool):
    """The forward (``backward=False``: ``arg`` is the input) or backward (``arg`` is the
    output's gradient) of an upsampling call as one Program, or None outside its forms."""
    nm = call.named()
    src = nm.get(arg)
    kind = _up_kind(call.packet)
    if kind is None or call.overload == "vec" or not isinstance(src, TensorMeta) or src.dtype not in _FLOATS:
        return None
    if len(call.outputs) != 1 or src.ndim not in (3, 4) or src.numel == 0:
        return None
    dst = call.outputs[0]
    src4, dst4 = _as4(src), _as4(dst)
    if not _fits_whole(src4, dst4) or src4.shape[:2] != dst4.shape[:2]:
        return None
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        S = _view4(hbm_input(b, in_name, src), src)
        D = _view4(hbm_output(b, out_name, dst), dst)
        _upsample(b, kind, S, src4, D, dst4, _scales(nm, src.ndim), bool(nm.get("align_corners", False)),
                  spec.partitions, backward=backward)
    return b.build(meta={"lowering": "upsample_backward" if backward else "upsample"}, shrink_rotation=True)


add_rules(["max_pool2d_with_indices", "avg_pool2d", "_adaptive_avg_pool2d", "max_pool2d", "avg_pool1d"],
          Rule("pool", lower_pool, "pooling on VectorE"))
add_rules(["max_pool2d_with_indices_backward", "avg_pool2d_backward", "_adaptive_avg_pool2d_backward"],
          Rule("pool_backward", lower_pool_backward, "pooling backward on VectorE"))
add_rules(["upsample_nearest1d", "upsample_nearest2d", "upsample_linear1d", "upsample_bilinear2d"],
          Rule("upsample", lower_upsample, "upsampling on VectorE/ScalarE"))
add_rules(["upsample_nearest1d_backward", "upsample_nearest2d_backward", "upsample_linear1d_backward",
           "upsample_bilinear2d_backward"], Rule("upsample_backward", lower_upsample_backward,
                                                 "upsampling backward on VectorE/ScalarE"))
