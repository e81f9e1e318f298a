"""Softmax and log-softmax over long rows (a vocabulary of 50257 or 128256), forward and backward,
tiled along the row with an online (streaming) max and log-sum-exp.

A row of 128256 float32 is 501 KiB, more than one SBUF partition holds (192 KiB), so the fused
kernels (:mod:`.kernels`, a whole row per partition) decline it. Here each row is split into
``f`` pieces on ``f`` neighbouring partitions (``f`` a power of two: enough pieces that a piece
stays on chip, and more when there are few rows, so that a decode step's single row still
uses all 128 lanes), and each partition walks its piece in chunks of 2048 elements:

* pass 1 keeps a running max ``m`` and a running sum ``s`` of ``exp(x - m)`` per partition:
  VectorE takes the chunk's max, ScalarE rescales the sum by ``exp(m_old - m_new)`` and adds
  the chunk's ``exp(x - m_new)`` (one ``activation_reduce``);
* the pieces of a row combine on TensorE: the partitions' maxima are transposed onto one
  partition, VectorE takes each row's max, and a transpose back gives every partition its
  row's max; the rescaled sums add up per row in one matmul with a same-row ones matrix;
* pass 2 writes ``x - m - log(s)`` (or ``exp`` of it for softmax) chunk by chunk on ScalarE.

A piece that fits in 96 KiB stays on chip between the passes (read once); otherwise it is read
again in pass 2. The backward passes are alike: a streamed row sum (``sum(grad)``, or
``sum(grad * y)`` for softmax) combined across the pieces, then the elementwise formula.
"""

from __future__ import annotations

from ..isa import AP
from ..program import TileBuilder, View
from ._call import Call, TensorMeta
from ._layout import coalesce, hbm_input, hbm_output
from ._indirect import fits_or_declines
from ._rules import Rule, add_rules

__all__ = ["lower_vocab_softmax", "lower_vocab_softmax_backward", "rows_form", "RowSplit"]

_CHUNK = 2048  # elements of a piece per chunk (8 KiB of float32 per partition: >= 2 KiB per DMA row)
# bytes per partition of row data kept on chip between the passes (forward, backward): what is
# left of a 192 KiB partition beside the chunk temporaries
_RESIDENT = (96 * 1024, 64 * 1024)
_MIN_PIECE = 64  # elements per partition below which splitting a row further does not pay
_FLOATS = ("float32", "bfloat16", "float16")


def rows_form(t: TensorMeta, dim: int):
    """(rows, row length, row stride) when ``dim`` is ``t``'s last, unit-stride dim and the other dims
    flatten to one; else None."""
    if t.ndim == 0 or dim % t.ndim != t.ndim - 1 or (t.shape[-1] > 1 and t.stride[-1] != 1):
        return None
    lead, lstr = t.shape[:-1], t.stride[:-1]
    if not lead:
        return 1, t.shape[-1], t.shape[-1]
    cshape, (cs,) = coalesce(tuple(lead), [tuple(lstr)])
    if len(cshape) != 1:
        return None
    return cshape[0], t.shape[-1], (cs[0] if cshape[0] > 1 else t.shape[-1])


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


class RowSplit:
    """Rows of length ``v`` split into ``f`` pieces of ``w`` elements on ``f`` neighbouring partitions
    (the last piece ``wl`` long): ``rows_per_tile`` rows per tile of ``rows_per_tile * f`` partitions.

    >>> s = RowSplit(rows=1, v=50257, bytes_per_elem=4, budget=96 * 1024, partitions=128)
    >>> s.f, s.w, s.wl, s.rows_per_tile
    (128, 393, 346, 1)
    >>> s = RowSplit(rows=1024, v=50257, bytes_per_elem=4, budget=96 * 1024, partitions=128)
    >>> s.f, s.w, s.resident
    (4, 12565, True)
    """

    def __init__(self, rows: int, v: int, bytes_per_elem: int, budget: int, partitions: int,
                 pieces: int | None = None):
        f = _pow2_floor(partitions // rows) if rows < partitions else 1
        while f < partitions and -(-v // f) * bytes_per_elem > budget:
            f *= 2
        while f > 1 and (-(-v // f) < _MIN_PIECE or v - (f - 1) * -(-v // f) < 1):
            f //= 2
        if pieces is not None:
            f = pieces
        self.f = f
        self.w = -(-v // f)
        self.wl = v - (f - 1) * self.w
        self.v = v
        self.rows_per_tile = max(1, partitions // f)
        self.resident = self.w * bytes_per_elem <= budget

    def tiles(self, rows: int):
        """``(r0, nr, p)``: first row, rows and partitions of each tile."""
        for r0 in range(0, rows, self.rows_per_tile):
            nr = min(self.rows_per_tile, rows - r0)
            yield r0, nr, nr * self.f

    def chunks(self):
        return [(c0, min(_CHUNK, self.w - c0)) for c0 in range(0, self.w, _CHUNK)]

    def _pieces(self, hv: View, rs: int, r0: int, nr: int, c0: int, cw: int):
        """``(HBM AP, first partition, partitions)`` of one chunk. Piece ``j`` of row ``r`` sits on
        partition ``j * nr + r``, so each group of pieces is a contiguous partition range: the first
        ``f - 1`` pieces of every row (one DMA), then the last pieces (narrower)."""
        ap = hv.ap
        f, w = self.f, self.w
        out = []
        lw = min(cw, self.wl - c0)
        if lw == cw:  # the last pieces hold this chunk whole too: one transfer over every partition
            return [(AP(ap.buffer, ap.dtype, ap.offset + r0 * rs + c0, ((w, f), (rs, nr), (1, cw))), 0, f * nr)]
        if f > 1:
            out.append((AP(ap.buffer, ap.dtype, ap.offset + r0 * rs + c0, ((w, f - 1), (rs, nr), (1, cw))),
                        0, (f - 1) * nr))
        if lw > 0:
            out.append((AP(ap.buffer, ap.dtype, ap.offset + r0 * rs + (f - 1) * w + c0, ((rs, nr), (1, lw))),
                        (f - 1) * nr, nr))
        return out

    @staticmethod
    def _on_chip(tile: View, col0: int, q0: int, n: int, width: int) -> AP:
        """Partitions ``q0 .. q0 + n`` of a ``[p, row]`` tile, columns ``col0 .. col0 + width``."""
        t, row = tile.ap, tile.shape[1]
        return AP(t.buffer, t.dtype, t.offset + q0 * row + col0, ((row, n), (1, width)))

    def load(self, b: TileBuilder, tile: View, col0: int, hv: View, rs: int, r0: int, nr: int, c0: int, cw: int,
             pad_tile: View | None) -> None:
        """DMA one chunk of every piece into columns ``col0 ...`` of ``tile`` (``[p, row]``); the last
        pieces' columns past the row's end come from ``pad_tile`` (a ``[P, >= cw]`` constant)."""
        for src, q0, n in self._pieces(hv, rs, r0, nr, c0, cw):
            dst = self._on_chip(tile, col0, q0, n, src.dims[-1][1])
            b.dma_copy(View(tile.buffer, dst, dst.shape), View(hv.buffer, src, src.shape))
        lw = max(0, min(cw, self.wl - c0))
        if pad_tile is not None and lw < cw:
            dst = self._on_chip(tile, col0 + lw, (self.f - 1) * nr, nr, cw - lw)
            src = self._on_chip(pad_tile, 0, (self.f - 1) * nr, nr, cw - lw)
            b.dma_copy(View(tile.buffer, dst, dst.shape), View(pad_tile.buffer, src, src.shape))

    def store(self, b: TileBuilder, hv: View, rs: int, tile: View, r0: int, nr: int, c0: int, cw: int) -> None:
        """DMA a ``[p, cw]`` chunk tile back to HBM (the last pieces' padding is not written)."""
        for dst, q0, n in self._pieces(hv, rs, r0, nr, c0, cw):
            src = self._on_chip(tile, 0, q0, n, dst.dims[-1][1])
            b.dma_copy(View(hv.buffer, dst, dst.shape), View(tile.buffer, src, src.shape))


def _same_row(b: TileBuilder, P: int, nr: int) -> View:
    """``B[i, j] = 1`` when partitions ``i`` and ``j`` hold pieces of one row (``i % nr == j % nr``),
    for row sums over pieces on TensorE (GpSimd iota, VectorE compare)."""
    cols = b.sbuf((P, P), "float32", site="vs.blk.j", bufs=1)
    b.iota(cols, steps=(1,))
    rows = b.sbuf((P, P), "float32", site="vs.blk.i", bufs=1)
    b.iota(rows, partition_step=1, steps=(0,))
    b.tensor_scalar(cols, cols, "mod", float(nr))
    b.tensor_scalar(rows, rows, "mod", float(nr))
    blk = b.sbuf((P, P), "float32", site=f"vs.blk{nr}", bufs=1)
    b.tensor_tensor(blk, cols, rows, "equal")
    return blk


def _row_sums(b: TileBuilder, blk: View | None, part: View, p: int, site: str) -> View:
    """Per partition, the sum of ``part`` [p, 1] over the partitions of its row (TensorE with the
    same-row ones matrix); ``part`` itself when rows are not split."""
    if blk is None:
        return part
    ps = b.psum((p, 1), "float32", site=f"{site}.ps")
    b.matmul(ps, blk[:p, :p], part)
    return ps


def _row_max(b: TileBuilder, m: View, p: int, f: int, site: str) -> View:
    """``-max`` over the partitions of each row, on every one of them: the ``[p, 1]`` maxima
    transposed onto one partition (TensorE), reduced per row (VectorE), broadcast over the pieces
    and transposed back."""
    nr = p // f
    mt = b.psum((1, p), "float32", site=f"{site}.t")
    b.transpose(mt, m)
    g = b.sbuf((1, nr), "float32", site=f"{site}.g")
    b.tensor_reduce(g, View(mt.buffer, AP(mt.ap.buffer, "float32", mt.ap.offset, ((p, 1), (1, nr), (nr, f))),
                            (1, nr, f)), "max", axes=(2,))
    gb = b.sbuf((1, p), "float32", site=f"{site}.gb")
    b.tensor_copy(View(gb.buffer, AP(gb.ap.buffer, "float32", gb.ap.offset, ((p, 1), (nr, f), (1, nr))), (1, f, nr)),
                  View(g.buffer, AP(g.ap.buffer, "float32", g.ap.offset, ((nr, 1), (0, f), (1, nr))), (1, f, nr)))
    back = b.psum((p, 1), "float32", site=f"{site}.back")
    b.transpose(back, gb)
    neg = b.sbuf((p, 1), "float32", site=f"{site}.neg")
    b.tensor_scalar(neg, back, "multiply", -1.0)
    return neg


def _pad_tile(b: TileBuilder, dtype: str, value: float, site: str, partitions: int) -> View:
    t = b.sbuf((partitions, _CHUNK), dtype, site=site, bufs=1)
    b.memset(t, value)
    return t


class _Loader:
    """Chunks of a tensor's pieces on chip: loaded once into a resident tile when the pieces fit,
    else loaded again for every pass."""

    def __init__(self, b, split: RowSplit, view, rs, dtype, p, pad_tile, resident, site):
        self.b, self.split, self.view, self.rs, self.dtype, self.p = b, split, view, rs, dtype, p
        self.pad_tile, self.site = pad_tile, site
        self.tile = b.sbuf((p, split.w), dtype, site=f"{site}.row", bufs=1) if resident else None
        self.loaded: set[int] = set()

    def get(self, r0: int, nr: int, c0: int, cw: int) -> View:
        if self.tile is not None:
            if c0 not in self.loaded:
                self.loaded.add(c0)
                self.split.load(self.b, self.tile, c0, self.view, self.rs, r0, nr, c0, cw, self.pad_tile)
            return self.tile[:, c0:c0 + cw]
        t = self.b.sbuf((self.p, cw), self.dtype, site=f"{self.site}.chunk")
        self.split.load(self.b, t, 0, self.view, self.rs, r0, nr, c0, cw, self.pad_tile)
        return t


def lower_vocab_softmax(call: Call, spec):
    """``_softmax`` / ``_log_softmax`` over the last dim of rows of any length (online max and
    log-sum-exp, chunked along the row, rows split over partitions)."""
    named = call.named()
    x = named.get("self")
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if not isinstance(x, TensorMeta) or out is None or x.dtype not in _FLOATS or out.numel == 0:
        return None
    dim = named.get("dim", -1)
    fx, fo = rows_form(x, dim), rows_form(out, dim)
    if fx is None or fo is None:
        return None
    R, V, xrs = fx
    log = call.packet == "_log_softmax"
    P = spec.partitions
    split = RowSplit(R, V, x.itemsize, _RESIDENT[0], P)
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xv, ov = hbm_input(b, "in_self", x), hbm_output(b, "out", out)
        pad = _pad_tile(b, x.device_dtype, float("-inf"), "sm.pad", P) if split.wl < split.w else None
        blks: dict = {}
        for r0, nr, p in split.tiles(R):
            blk = (blks.get(nr) or blks.setdefault(nr, _same_row(b, P, nr))) if split.f > 1 else None
            src = _Loader(b, split, xv, xrs, x.device_dtype, p, pad, split.resident, "sm")
            m = neg = s = None
            for i, (c0, cw) in enumerate(split.chunks()):
                t = src.get(r0, nr, c0, cw)
                cm = b.sbuf((p, 1), "float32", site="sm.cmax")
                b.tensor_reduce(cm, t, "max")
                e = b.sbuf((p, cw), "float32", site="sm.exp")
                if i == 0:
                    m = cm
                    neg = b.sbuf((p, 1), "float32", site="sm.neg")
                    b.tensor_scalar(neg, m, "multiply", -1.0)
                    s = b.sbuf((p, 1), "float32", site="sm.sum")
                    b.activation_reduce(e, t, "exp", s, bias=neg)
                    continue
                mn = b.sbuf((p, 1), "float32", site="sm.max")
                b.tensor_tensor(mn, m, cm, "maximum")
                neg = b.sbuf((p, 1), "float32", site="sm.neg")
                b.tensor_scalar(neg, mn, "multiply", -1.0)
                corr = b.sbuf((p, 1), "float32", site="sm.corr")
                b.activation(corr, m, "exp", bias=neg)  # exp(m_old - m_new) rescales the running sum
                cs = b.sbuf((p, 1), "float32", site="sm.csum")
                b.activation_reduce(e, t, "exp", cs, bias=neg)
                s2 = b.sbuf((p, 1), "float32", site="sm.sum")
                # s * corr + cs in one instruction, on ScalarE: VectorE goes on to the next chunk's max
                b.tensor_scalar(s2, s, "multiply", corr, "add", cs, engine="act")
                m, s = mn, s2
            if blk is not None:  # the row's max and sum over its pieces
                rneg = _row_max(b, m, p, split.f, "sm.row")
                corr = b.sbuf((p, 1), "float32", site="sm.rcorr")
                b.activation(corr, m, "exp", bias=rneg)
                sc = b.sbuf((p, 1), "float32", site="sm.rsc")
                b.tensor_tensor(sc, s, corr, "multiply")
                s, neg = _row_sums(b, blk, sc, p, "sm.rsum"), rneg
            shift = b.sbuf((p, 1), "float32", site="sm.shift")
            b.activation(shift, s, "log")
            b.tensor_tensor(shift, neg, shift, "subtract")  # -(m + log s)
            for c0, cw in split.chunks():
                t = src.get(r0, nr, c0, cw)
                o = b.sbuf((p, cw), out.device_dtype, site="sm.out")
                b.activation(o, t, "identity" if log else "exp", bias=shift)
                split.store(b, ov, fo[2], o, r0, nr, c0, cw)
    return b.build(meta={"lowering": "vocab_tiled"})


def lower_vocab_softmax_backward(call: Call, spec):
    """``_log_softmax_backward_data``: ``g - exp(y) * sum(g)``; ``_softmax_backward_data``:
    ``y * (g - sum(g * y))`` -- the row sum streamed and combined over the pieces, then the formula
    chunk by chunk."""
    named = call.named()
    g, y = named.get("grad_output"), named.get("output")
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if not isinstance(g, TensorMeta) or not isinstance(y, TensorMeta) or out is None or out.numel == 0:
        return None
    if g.shape != y.shape or g.dtype not in _FLOATS or y.dtype not in _FLOATS:
        return None
    dim = named.get("dim", -1)
    fg, fy, fo = rows_form(g, dim), rows_form(y, dim), rows_form(out, dim)
    if fg is None or fy is None or fo is None:
        return None
    R, V, _ = fg
    log = call.packet == "_log_softmax_backward_data"
    P = spec.partitions
    per_elem = g.itemsize + (0 if log else y.itemsize)
    split = RowSplit(R, V, per_elem, _RESIDENT[1], P)
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        gv, yv = hbm_input(b, "in_grad_output", g), hbm_input(b, "in_output", y)
        ov = hbm_output(b, "out", out)
        gpad = _pad_tile(b, g.device_dtype, 0.0, "smb.gpad", P) if split.wl < split.w else None
        ypad = _pad_tile(b, y.device_dtype, 0.0, "smb.ypad", P) if split.wl < split.w and not log else None
        blks: dict = {}
        for r0, nr, p in split.tiles(R):
            blk = (blks.get(nr) or blks.setdefault(nr, _same_row(b, P, nr))) if split.f > 1 else None
            gl = _Loader(b, split, gv, fg[2], g.device_dtype, p, gpad, split.resident, "smb.g")
            yl = _Loader(b, split, yv, fy[2], y.device_dtype, p, ypad, split.resident and not log, "smb.y")
            total = None
            for c0, cw in split.chunks():
                gt = gl.get(r0, nr, c0, cw)
                src = gt
                if not log:
                    prod = b.sbuf((p, cw), "float32", site="smb.prod")
                    b.tensor_tensor(prod, gt, yl.get(r0, nr, c0, cw), "multiply")
                    src = prod
                scratch = b.sbuf((p, cw), "float32", site="smb.scratch")
                cs = b.sbuf((p, 1), "float32", site="smb.csum")
                b.activation_reduce(scratch, src, "copy", cs)
                if total is None:
                    total = cs
                else:
                    t2 = b.sbuf((p, 1), "float32", site="smb.sum")
                    b.tensor_tensor(t2, total, cs, "add")
                    total = t2
            if blk is not None:
                rs = b.sbuf((p, 1), "float32", site="smb.rsum")
                b.tensor_copy(rs, _row_sums(b, blk, total, p, "smb.rsum"))
                total = rs
            for c0, cw in split.chunks():
                gt = gl.get(r0, nr, c0, cw)
                yt = yl.get(r0, nr, c0, cw)
                o = b.sbuf((p, cw), out.device_dtype, site="smb.out")
                tmp = b.sbuf((p, cw), "float32", site="smb.tmp")
                if log:
                    b.activation(tmp, yt, "exp")
                    b.tensor_scalar(tmp, tmp, "multiply", total, engine="act")
                    b.tensor_tensor(o, gt, tmp, "subtract")
                else:
                    b.tensor_scalar(tmp, gt, "subtract", total, engine="act")
                    b.tensor_tensor(o, tmp, yt, "multiply")
                split.store(b, ov, fo[2], o, r0, nr, c0, cw)
    return b.build(meta={"lowering": "vocab_tiled"})


add_rules(["_softmax", "_log_softmax"], Rule("vocab_tiled", fits_or_declines(lower_vocab_softmax),
                                            "softmax over long rows: online max / log-sum-exp, chunked"))
add_rules(["_softmax_backward_data", "_log_softmax_backward_data"],
          Rule("vocab_tiled", fits_or_declines(lower_vocab_softmax_backward), "softmax backward over long rows, chunked"))
