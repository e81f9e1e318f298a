"""Batch norm and group norm, forward and backward, on VectorE / ScalarE (TensorE for the
few cross-partition sums).

**Batch norm** normalizes each channel over (images, pixels). Channels go on the
partitions, their elements along the free dimension, read in contiguous runs (whole
planes). When there are fewer than 128 channels, each channel is spread over ``j``
partitions (images or pixel ranges), and the partial statistics are combined with a
TensorE matmul against a selection matrix (the standard cross-partition reduction).

* forward (training): VectorE ``bn_stats`` / ``bn_aggr`` give each partition's mean and
  variance in one pass; ScalarE applies ``x * scale + shift`` (``scale = w * rstd``,
  ``shift = b - mean * scale``) in a second pass; running statistics are updated in place.
  Evaluation: one ScalarE pass with the running statistics;
* backward: ScalarE sums ``dy`` and ``dy * x`` (the product on VectorE) per partition;
  then ``dx = A * dy + B * x + C`` with per-channel ``A, B, C`` (ScalarE ``B * x + C``,
  VectorE ``A * dy +`` that).

Between its two passes a block keeps on chip the chunks SBUF holds (all of them for
ResNet's layers up to 64x56x56 at batch 8) and reads only the others again; each
block's second pass is emitted after the next block's first, so with several channel
blocks the loads run ahead, and per-channel vectors are read once for all blocks.

**Group norm** normalizes each (image, group) over (channels of the group, pixels): one
(image, group) per partition, its channels contiguous in memory; statistics as above,
the per-channel affine as per-partition scalars on ScalarE. Its backward follows
PyTorch's formula ``dx = c1 * dy + c2 * x + c3``; ``grad_weight``/``grad_bias`` sum
over images with a TensorE matmul.

Numerics match CPU torch: statistics in float32, the same formulas.

>>> from tilescope.lower import Call, TensorMeta, lower, contiguous_strides
>>> def t(*s): return TensorMeta(s, contiguous_strides(s), "float32")
>>> call = Call("aten::native_batch_norm", (t(8, 64, 28, 28), t(64), t(64), t(64), t(64), True, 0.1, 1e-5),
...             (), (t(8, 64, 28, 28), t(64), t(64)))
>>> lower(call).rule
'batch_norm'
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..isa import ScalarTensorTensor
from ..program import TileBuilder, View, as_ap
from ._call import Call, TensorMeta
from ._conv import _hbm, _on_chip
from ._layout import hbm_input, hbm_output
from ._rules import Rule, add_rules

__all__ = ["lower_batch_norm", "lower_batch_norm_backward", "lower_group_norm", "lower_group_norm_backward"]

_F = 4096  # elements per partition of one streamed tile
_RESIDENT = 48 * 1024  # bytes per partition of a group-norm tensor kept in SBUF between two passes
# Batch norm's chunks kept on chip between its two passes share SBUF with its scratch tiles
# (forward: two outputs in flight; backward: two of each discarded product, bfloat16 and
# float32), and, when some chunks are read again, with two loads in flight per tensor.
_BN_SCRATCH_BYTES = {"forward": 2 * _F * 4, "backward": 2 * _F * (2 + 4)}
_BN_LOADS_IN_FLIGHT = 2
_BN_FMAX = 512
_FLOATS = ("float32", "bfloat16", "float16")


def _spatial(m: TensorMeta) -> tuple[int, int] | None:
    """Dims 2.. of ``m`` as one (stride, count) run, or None when they do not merge."""
    dims = [(s, n) for s, n in zip(m.stride[2:], m.shape[2:]) if n != 1]
    if not dims:
        return (1, 1)
    stride, count = dims[-1]
    for s, n in reversed(dims[:-1]):
        if s != stride * count:
            return None
        count *= n
    return stride, count


def _ok(*metas) -> bool:
    return all(m is None or (isinstance(m, TensorMeta) and m.dtype in _FLOATS) for m in metas)


def _vec(m) -> TensorMeta | None:
    return m if isinstance(m, TensorMeta) and m.numel else None


# ---- batch norm: channels (spread over j partitions) x elements --------------------------------

@dataclass(frozen=True)
class _Lanes:
    """Channel c of a block, part q of its elements, on partition ``c * j + q``.

    The elements of a channel are (image, pixel) pairs; parts split the images
    (``by_n``) or the pixels. Per partition: ``nn`` images x ``sn`` pixels.
    """

    n: int
    c: int
    s: int
    j: int
    by_n: bool
    xs0: int
    xs1: int
    ss: int
    # bytes per partition a streamed chunk carries at least (see plan)
    min_chunk_bytes: int = 0

    @classmethod
    def plan(cls, x: TensorMeta, P: int, spec=None) -> "_Lanes | None":
        """With ``spec``, chunks of whole images are made small enough that several stream
        through both passes (a load, its statistics and the next load overlap), but each still
        carries a transfer whose DMA fixed cost is no more than its transfer time."""
        sp = _spatial(x)
        if sp is None or x.ndim < 2:
            return None
        n, c = x.shape[0], x.shape[1]
        ss, s = sp
        j, by_n = 1, True
        if c < P:
            room = P // c
            for cand in range(min(room, n), 0, -1):  # split images evenly
                if n % cand == 0:
                    j = cand
                    break
            if j == 1 and n == 1:
                for cand in range(min(room, s), 0, -1):
                    if s % cand == 0:
                        j, by_n = cand, False
                        break
        floor = 0
        if spec is not None:
            parts = min(P, c * j)
            floor = -(-int(spec.dma.fixed_ns * spec.dma_bytes_per_ns) // parts)
        return cls(n, c, s, j, by_n, x.stride[0], x.stride[1], ss, floor)

    @property
    def nn(self) -> int:
        return self.n // self.j if self.by_n else self.n

    @property
    def sn(self) -> int:
        return self.s if self.by_n else self.s // self.j

    @property
    def per_partition(self) -> int:
        return self.nn * self.sn

    def blocks(self, P: int) -> list[tuple[int, int]]:
        """(first channel, channels) of each tile of partitions."""
        per = max(1, P // self.j)
        return [(c0, min(per, self.c - c0)) for c0 in range(0, self.c, per)]

    def chunks(self) -> list[tuple[int, int, int, int]]:
        """(first image, images, first pixel, pixels) per partition of each streamed tile."""
        if self.sn <= _F:
            k = max(1, _F // self.sn)
            if self.min_chunk_bytes:  # four or more chunks, none under the floor (4-byte elements)
                k = min(k, max(self.nn // 4, -(-self.min_chunk_bytes // (4 * self.sn)), 1))
            return [(i, min(k, self.nn - i), 0, self.sn) for i in range(0, self.nn, k)]
        return [(i, 1, p, min(_F, self.sn - p)) for i in range(self.nn) for p in range(0, self.sn, _F)]

    def hbm(self, view: View, c0: int, cb: int, chunk) -> View:
        """Chunk (first local image, images, first pixel, pixels) of channels [c0, c0 + cb).
        Split by images, part q's local image i is image ``i * j + q``: a chunk is a run of
        whole images, so chunks never overlap in memory (nor do their stores' dependencies)."""
        i, ni, p, pn = chunk
        if self.by_n:
            return _hbm(view, c0 * self.xs1 + i * self.j * self.xs0 + p * self.ss,
                        ((self.xs1, cb), (self.xs0, self.j), (self.j * self.xs0, ni), (self.ss, pn)))
        return _hbm(view, c0 * self.xs1 + i * self.xs0 + p * self.ss,
                    ((self.xs1, cb), (self.sn * self.ss, self.j), (self.xs0, ni), (self.ss, pn)))


def _group_sum_matrices(b: TileBuilder, P: int, cb: int, j: int, scale: float):
    """sel [cb*j, cb] (``scale`` where the partition's channel is the column) and its
    transpose pattern selT [cb, cb*j] (1 there): TensorE sums/broadcasts across the j parts."""
    parts = cb * j
    v = b.sbuf((parts, cb), "float32", site="bn.sel.v", bufs=1)
    b.iota(v, base=0, partition_step=1, steps=(-j,))  # p - c*j
    sel = b.sbuf((parts, cb), "float32", site="bn.sel", bufs=1)
    lo = b.sbuf((parts, cb), "float32", site="bn.sel.lo", bufs=1)
    b.tensor_scalar(lo, v, "greater_equal", 0.0, "multiply", scale)
    b.tensor_scalar(sel, v, "less", float(j))
    b.tensor_tensor(sel, sel, lo, "multiply")
    vt = b.sbuf((cb, parts), "float32", site="bn.selT.v", bufs=1)
    b.iota(vt, base=0, partition_step=-j, steps=(1,))  # p' - c*j
    selT = b.sbuf((cb, parts), "float32", site="bn.selT", bufs=1)
    lo_t = b.sbuf((cb, parts), "float32", site="bn.selT.lo", bufs=1)
    b.tensor_scalar(lo_t, vt, "greater_equal", 0.0)
    b.tensor_scalar(selT, vt, "less", float(j))
    b.tensor_tensor(selT, selT, lo_t, "multiply")
    return sel, selT


def _mean_var(b: TileBuilder, chunks: list, parts: int, load, keep, prefix: str) -> tuple[View, dict]:
    """The statistics pass over ``chunks`` (each ``(_, a, _, b)``: ``a * b`` elements per
    partition, ``load(chunk)`` its tile): VectorE ``bn_stats`` on every piece of up to
    512 elements, ``bn_aggr`` of them into [parts, 2] = (mean, variance) per partition.
    Returns that tile and the loaded tiles of the chunks for which ``keep(chunk)``."""
    pieces = sum(-(-ni * pn // _BN_FMAX) for _, ni, _, pn in chunks)
    stats = b.sbuf((parts, 6 * pieces), "float32", site=f"{prefix}.stats", bufs=1)
    kept, k = {}, 0
    for chunk in chunks:
        t = load(chunk)
        free = chunk[1] * chunk[3]
        for f0 in range(0, free, _BN_FMAX):
            b.bn_stats(_on_chip(stats, 0, parts, 6 * k, ((1, 6),)),
                       _on_chip(t, 0, parts, f0, ((1, min(_BN_FMAX, free - f0)),)))
            k += 1
        if keep(chunk):
            kept[chunk] = t
    mv = b.sbuf((parts, 2), "float32", site=f"{prefix}.mv", bufs=1)
    b.bn_aggr(mv, stats)
    return mv, kept


def _constant(value, *_):
    return value


def _pipelined(pending, second_pass):
    """Emit the previous block's second pass (now that this block's first pass is emitted) and
    return this block's, to emit after the next block's first pass."""
    if pending is not None:
        pending()
    return second_pass


def _kept_first(chunks: list, kept: dict) -> list:
    """The second pass's order: chunks still on chip first, so the reloads of the others
    stream in while those are finished."""
    return [c for c in chunks if c in kept] + [c for c in chunks if c not in kept]


class _BatchNorm:
    """``keep_bytes``: SBUF bytes per partition for the chunks kept on chip between the two
    passes (the rest are read again)."""

    def __init__(self, b: TileBuilder, spec, lanes: _Lanes, dtype: str, keep_bytes: int = 0):
        self.b, self.spec, self.L, self.dtype = b, spec, lanes, dtype
        self.P = spec.partitions
        self.isz = 2 if dtype in ("bfloat16", "float16") else 4
        self.keep_bytes = keep_bytes
        self._vecs: dict[str, View] = {}  # per-channel vectors read for every block at once
        self.homes = 1  # channel blocks whose kept chunks are on chip at once (see _kept)

    def _kept(self, chunks: list, tensors: int) -> set:
        """The leading chunks whose ``tensors`` tiles fit in ``keep_bytes`` together, less the
        loads in flight of the chunks read again when not all fit. With several channel blocks,
        the next blocks load while one finishes: their kept chunks rotate over ``homes`` homes
        (as many blocks as fit whole, at least two), each with its share of the bytes."""
        sizes = [tensors * ni * pn * self.isz for _, ni, _, pn in chunks]
        blocks = len(self.L.blocks(self.P))
        if blocks > 1:  # as many blocks in flight as fit whole, at least two
            self.homes = min(blocks, max(2, self.keep_bytes // max(1, sum(sizes))))
        budget = self.keep_bytes // self.homes
        if sum(sizes) > budget:
            budget -= _BN_LOADS_IN_FLIGHT * max(sizes)
        keep, used = set(), 0
        for chunk, size in zip(chunks, sizes):
            used += size
            if used > budget:
                break
            keep.add(chunk)
        return keep

    def _channel_vec(self, view: View | None, stride: int, c0: int, cb: int, site: str, fill: float) -> View:
        """A per-channel vector as [cb, 1] float32 (``fill`` when absent). With several channel
        blocks, the vector is read for all of them at the first block's call (block k in
        column k: one DMA, not one per block on the next block's path) and sliced after."""
        blocks = self.L.blocks(self.P)
        if len(blocks) == 1:
            return self._vec_tile(view, stride, ((stride, cb), (1, 1)), (cb, 1), site, fill)
        per = blocks[0][1]
        t = self._vecs.get(site)
        if t is None:
            t = self._vecs[site] = self._vec_tile(view, stride, ((stride, per), (per * stride, len(blocks))),
                                                  (per, len(blocks)), site, fill, tail=self.L.c % per)
        return _on_chip(t, 0, cb, c0 // per, ((1, 1),))

    def _vec_tile(self, view, stride, dims, shape, site, fill, tail: int = 0) -> View:
        """``view``'s channels as a float32 [partitions, columns] tile: partition p of column k is
        channel ``k * partitions + p`` (the last column's first ``tail`` partitions when ragged)."""
        b = self.b
        t = b.sbuf(shape, "float32", site=site, bufs=1)
        if view is None:
            b.memset(t, fill)
            return t
        raw = t if view.dtype == "float32" else b.sbuf(shape, view.dtype, site=site + ".raw", bufs=1)
        if tail:
            (sp, per), (sk, nb) = dims
            b.memset(raw, fill)  # the ragged column's missing channels
            b.dma_copy(_on_chip(raw, 0, per, 0, ((1, nb - 1),)), _hbm(view, 0, ((sp, per), (sk, nb - 1))))
            b.dma_copy(_on_chip(raw, 0, tail, nb - 1, ((1, 1),)), _hbm(view, (nb - 1) * sk, ((sp, tail), (1, 1))))
        else:
            b.dma_copy(raw, _hbm(view, 0, dims))
        if raw is not t:
            b.tensor_copy(t, raw)
        return t

    def _to_parts(self, vals: View, cb: int, k: int, selT) -> View:
        """Per-channel [cb, k] values onto the [cb*j, k] partitions (a TensorE broadcast)."""
        j = self.L.j
        if j == 1:
            return vals
        ps = self.b.psum((cb * j, k), "float32", site="bn.bcast")
        self.b.matmul(ps, selT, vals)
        out = self.b.sbuf((cb * j, k), "float32", site="bn.parts", bufs=1)
        self.b.tensor_copy(out, ps)
        return out

    def _to_channels(self, vals: View, cb: int, k: int, sel) -> View:
        """Per-partition [cb*j, k] values summed (times sel's scale) per channel: [cb, k]."""
        if self.L.j == 1:
            return vals
        ps = self.b.psum((cb, k), "float32", site="bn.comb")
        self.b.matmul(ps, sel, vals)
        out = self.b.sbuf((cb, k), "float32", site="bn.chan", bufs=1)
        self.b.tensor_copy(out, ps)
        return out

    def _load_x(self, view: View, c0, cb, keep, chunk) -> View:
        """``view``'s chunk for the statistics pass, in a home of its own when it is kept."""
        return self._load(view, c0, cb, chunk, f"bn.xk{chunk}" if chunk in keep else "bn.x", chunk in keep)

    def _load(self, view: View, c0, cb, chunk, site, kept: bool = False) -> View:
        """One chunk of ``view``'s block; a kept chunk's site rotates over ``homes`` addresses."""
        L = self.L
        _, ni, _, pn = chunk
        t = self.b.sbuf((cb * L.j, ni * pn), view.dtype, site=site, bufs=self.homes if kept else None)
        self.b.dma_copy(t, L.hbm(view, c0, cb, chunk))
        return t

    def forward(self, X, Y, W, Bv, wb_strides, rm, rv, stat_strides, save_mean, save_invstd, training, momentum, eps,
                running_out=None):
        b, L = self.b, self.L
        count = L.n * L.s
        pending = None
        for c0, cb in L.blocks(self.P):
            parts = cb * L.j
            sel = selT = None
            if L.j > 1:
                sel, selT = _group_sum_matrices(b, self.P, cb, L.j, 1.0 / L.j)
            w = self._channel_vec(W, wb_strides[0], c0, cb, "bn.w", 1.0)
            bias = self._channel_vec(Bv, wb_strides[1], c0, cb, "bn.b", 0.0)
            kept = {}
            if training:
                chunks = L.chunks()
                keep = self._kept(chunks, 1)
                mv, kept = _mean_var(b, chunks, parts, functools.partial(self._load_x, X, c0, cb, keep),
                                     keep.__contains__, "bn")
                if L.j > 1:  # (mean, E[x^2]) per partition, averaged over a channel's parts
                    m2 = b.sbuf((parts, 2), "float32", site="bn.m2", bufs=1)
                    b.tensor_copy(_on_chip(m2, 0, parts, 0, ((1, 1),)), _on_chip(mv, 0, parts, 0, ((1, 1),)))
                    sq = b.sbuf((parts, 1), "float32", site="bn.sq", bufs=1)
                    b.tensor_tensor(sq, _on_chip(mv, 0, parts, 0, ((1, 1),)), _on_chip(mv, 0, parts, 0, ((1, 1),)),
                                    "multiply")
                    b.tensor_tensor(_on_chip(m2, 0, parts, 1, ((1, 1),)), _on_chip(mv, 0, parts, 1, ((1, 1),)), sq,
                                    "add")
                    ch = self._to_channels(m2, cb, 2, sel)
                    mean = _on_chip(ch, 0, cb, 0, ((1, 1),))
                    msq = b.sbuf((cb, 1), "float32", site="bn.msq", bufs=1)
                    b.tensor_tensor(msq, mean, mean, "multiply")
                    var = b.sbuf((cb, 1), "float32", site="bn.var", bufs=1)
                    b.tensor_tensor(var, _on_chip(ch, 0, cb, 1, ((1, 1),)), msq, "subtract")
                else:
                    mean = _on_chip(mv, 0, cb, 0, ((1, 1),))
                    var = _on_chip(mv, 0, cb, 1, ((1, 1),))
            else:
                mean = self._channel_vec(rm, stat_strides[0], c0, cb, "bn.rm", 0.0)
                var = self._channel_vec(rv, stat_strides[1], c0, cb, "bn.rv", 1.0)
            rstd = b.sbuf((cb, 1), "float32", site="bn.rstd", bufs=1)
            b.activation(rstd, var, "rsqrt", bias=float(eps))
            # scale = w * rstd, shift = b - mean * scale, per channel, then onto the partitions
            ss = b.sbuf((cb, 2), "float32", site="bn.ss", bufs=1)
            scale = _on_chip(ss, 0, cb, 0, ((1, 1),))
            shift = _on_chip(ss, 0, cb, 1, ((1, 1),))
            b.tensor_tensor(scale, w, rstd, "multiply")
            ms = b.sbuf((cb, 1), "float32", site="bn.ms", bufs=1)
            b.tensor_tensor(ms, mean, scale, "multiply")
            b.tensor_tensor(shift, bias, ms, "subtract")
            pss = self._to_parts(ss, cb, 2, selT)
            if training:
                if save_mean is not None:
                    b.dma_copy(_hbm(save_mean, c0, ((1, cb), (1, 1))), mean)
                if save_invstd is not None:
                    b.dma_copy(_hbm(save_invstd, c0, ((1, cb), (1, 1))), rstd)
                if running_out is not None:
                    self._update_running(rm, rv, stat_strides, running_out, c0, cb, mean, var, momentum, count)
            # the second pass after the next block's first: its loads go ahead meanwhile
            pending = _pipelined(pending, functools.partial(self._normalize, X, Y, c0, cb, kept, pss))
        if pending is not None:
            pending()

    def _normalize(self, X, Y, c0: int, cb: int, kept: dict, pss: View) -> None:
        """The forward's second pass over one block: ``y = x * scale + shift`` on ScalarE."""
        b, L = self.b, self.L
        parts = cb * L.j
        for chunk in _kept_first(L.chunks(), kept):
            t = kept.get(chunk) or self._load(X, c0, cb, chunk, "bn.x")
            # in place over x (its last use) when y has its dtype: no output tile to wait for
            # (with several channel blocks, x's home is freed for the next block's load instead)
            if t.dtype == Y.dtype and self.homes == 1:
                o = t
            else:
                o = b.sbuf((parts, chunk[1] * chunk[3]), Y.dtype, site="bn.y", bufs=2)
            b.activation(o, t, "identity", scale=_on_chip(pss, 0, parts, 0, ((1, 1),)),
                         bias=_on_chip(pss, 0, parts, 1, ((1, 1),)))
            b.dma_copy(L.hbm(Y, c0, cb, chunk), o)

    def _update_running(self, rm, rv, strides, out, c0, cb, mean, var, momentum, count) -> None:
        """running = (1 - m) * running + m * batch (the variance unbiased), written to ``out``."""
        b = self.b
        unbias = count / max(1, count - 1)
        (out_m, out_v), (os_m, os_v) = out
        for view, stride, batch, factor, site, dst, dstride in (
                (rm, strides[0], mean, 1.0, "bn.urm", out_m, os_m), (rv, strides[1], var, unbias, "bn.urv", out_v, os_v)):
            old = self._channel_vec(view, stride, c0, cb, site, 0.0)
            new = b.sbuf((cb, 1), "float32", site=site + ".new", bufs=1)
            b.tensor_scalar(new, batch, "multiply", float(momentum * factor))
            b.tensor_scalar(old, old, "multiply", float(1.0 - momentum))
            b.tensor_tensor(new, new, old, "add")
            if dst.dtype != "float32":
                cast = b.sbuf((cb, 1), dst.dtype, site=site + ".cast", bufs=1)
                b.tensor_copy(cast, new)
                new = cast
            b.dma_copy(_hbm(dst, c0 * dstride, ((dstride, cb), (1, 1))), new)

    def backward(self, DY, X, DX, GW, GB, W, w_stride, mean_v, rstd_v, stat_strides, train, eps, rm, rv):
        """``dx = A*dy + B*x + C`` per channel; ``grad_weight = rstd * (sum(dy*x) - mean*sum(dy))``,
        ``grad_bias = sum(dy)``."""
        b, L = self.b, self.L
        count = L.n * L.s
        need_sums = train or GW is not None or GB is not None
        pending = None
        for c0, cb in L.blocks(self.P):
            parts = cb * L.j
            sel = selT = None
            if L.j > 1:
                sel, selT = _group_sum_matrices(b, self.P, cb, L.j, 1.0)
            w = self._channel_vec(W, w_stride, c0, cb, "bn.w", 1.0)
            if train:
                mean = self._channel_vec(mean_v, stat_strides[0], c0, cb, "bn.mean", 0.0)
                rstd = self._channel_vec(rstd_v, stat_strides[1], c0, cb, "bn.rstd", 1.0)
            else:
                mean = self._channel_vec(rm, stat_strides[0], c0, cb, "bn.mean", 0.0)
                var = self._channel_vec(rv, stat_strides[1], c0, cb, "bn.rv", 1.0)
                rstd = b.sbuf((cb, 1), "float32", site="bn.rstd", bufs=1)
                b.activation(rstd, var, "rsqrt", bias=float(eps))
            kept = {}
            sums = None
            if need_sums:
                chunks = L.chunks()
                part_sums = b.sbuf((parts, 2, len(chunks)), "float32", site="bn.psums", bufs=1)
                keep = self._kept(chunks, 2 if train else 1)
                for i, chunk in enumerate(chunks):
                    dy = self._load(DY, c0, cb, chunk, f"bn.dyk{chunk}" if chunk in keep else "bn.dy", chunk in keep)
                    x = self._load(X, c0, cb, chunk, f"bn.xk{chunk}" if chunk in keep and train else "bn.x",
                                   chunk in keep and train)
                    free = chunk[1] * chunk[3]
                    # sum(dy) and sum(dy * x) on ScalarE (copies reduced on the way; the copy of
                    # dy is discarded, so it lands in bfloat16), the product on VectorE
                    junk = b.sbuf((parts, free), "bfloat16", site="bn.junk", bufs=2)
                    b.activation_reduce(junk, dy, "copy", _on_chip(part_sums, 0, parts, i, ((1, 1),)))
                    prod_ = b.sbuf((parts, free), "float32", site="bn.prod", bufs=2)
                    b.tensor_tensor(prod_, dy, x, "multiply")
                    b.activation_reduce(prod_, prod_, "copy",
                                        _on_chip(part_sums, 0, parts, len(chunks) + i, ((1, 1),)))
                    if chunk in keep:
                        kept[chunk] = (dy, x if train else None)
                psums = b.sbuf((parts, 2), "float32", site="bn.sums", bufs=1)
                b.tensor_reduce(psums, part_sums, "add", axes=(2,))
                sums = self._to_channels(psums, cb, 2, sel)  # [cb, 2]: sum(dy), sum(dy * x)
            sdy = _on_chip(sums, 0, cb, 0, ((1, 1),)) if sums is not None else None
            sdyx = _on_chip(sums, 0, cb, 1, ((1, 1),)) if sums is not None else None
            if GW is not None or train:
                # sum(dy * xhat) = rstd * (sum(dy*x) - mean * sum(dy))
                dyxhat = b.sbuf((cb, 1), "float32", site="bn.dyxhat", bufs=1)
                b.tensor_tensor(dyxhat, mean, sdy, "multiply")
                b.tensor_tensor(dyxhat, sdyx, dyxhat, "subtract")
                b.tensor_tensor(dyxhat, dyxhat, rstd, "multiply")
                if GW is not None:
                    self._store_vec(GW, c0, cb, dyxhat)
            if GB is not None:
                self._store_vec(GB, c0, cb, sdy)
            if DX is None:
                continue
            abc = b.sbuf((cb, 3), "float32", site="bn.abc", bufs=1)
            A = _on_chip(abc, 0, cb, 0, ((1, 1),))
            Bc = _on_chip(abc, 0, cb, 1, ((1, 1),))
            Cc = _on_chip(abc, 0, cb, 2, ((1, 1),))
            b.tensor_tensor(A, w, rstd, "multiply")
            if train:
                # k = sum(dy*xhat)/M; B = -A*rstd*k; C = A*(mean*rstd*k - sum(dy)/M)
                k = b.sbuf((cb, 1), "float32", site="bn.k", bufs=1)
                b.tensor_scalar(k, dyxhat, "multiply", 1.0 / count)
                b.tensor_tensor(k, k, rstd, "multiply")  # rstd * k
                b.tensor_tensor(Bc, A, k, "multiply")
                b.tensor_scalar(Bc, Bc, "multiply", -1.0)
                t = b.sbuf((cb, 1), "float32", site="bn.t", bufs=1)
                b.tensor_tensor(t, mean, k, "multiply")
                mdy = b.sbuf((cb, 1), "float32", site="bn.mdy", bufs=1)
                b.tensor_scalar(mdy, sdy, "multiply", 1.0 / count)
                b.tensor_tensor(t, t, mdy, "subtract")
                b.tensor_tensor(Cc, A, t, "multiply")
            else:
                b.memset(Bc, 0.0)
                b.memset(Cc, 0.0)
            pabc = self._to_parts(abc, cb, 3, selT)
            # the second pass after the next block's first: its loads go ahead meanwhile
            pending = _pipelined(pending, functools.partial(self._grad_input, DY, X, DX, c0, cb, kept, pabc, train))
        if pending is not None:
            pending()

    def _grad_input(self, DY, X, DX, c0: int, cb: int, kept: dict, pabc: View, train: bool) -> None:
        """The backward's second pass over one block: ``dx = A*dy + B*x + C``."""
        b, L = self.b, self.L
        parts = cb * L.j
        for chunk in _kept_first(L.chunks(), kept):
            dy, x = kept.get(chunk) or (self._load(DY, c0, cb, chunk, "bn.dy"), None)
            free = chunk[1] * chunk[3]
            a = _on_chip(pabc, 0, parts, 0, ((1, 1),))
            if not train:
                o = b.sbuf((parts, free), DX.dtype, site="bn.dx", bufs=2)
                b.activation(o, dy, "copy", scale=a)
                b.dma_copy(L.hbm(DX, c0, cb, chunk), o)
                continue
            if x is None:
                x = self._load(X, c0, cb, chunk, "bn.x")
            # B*x + C on ScalarE, then A*dy + that on VectorE; in place over x (its last use)
            # when it is float32, as dx is
            bx = x if x.dtype == DX.dtype == "float32" else b.sbuf((parts, free), "float32", site="bn.bx", bufs=2)
            b.activation(bx, x, "identity", scale=_on_chip(pabc, 0, parts, 1, ((1, 1),)),
                         bias=_on_chip(pabc, 0, parts, 2, ((1, 1),)))
            o = bx if bx.dtype == DX.dtype else b.sbuf((parts, free), DX.dtype, site="bn.dx", bufs=2)
            b.emit(ScalarTensorTensor(as_ap(o), as_ap(dy), "multiply", as_ap(a), "add", as_ap(bx)))
            b.dma_copy(L.hbm(DX, c0, cb, chunk), o)

    def _store_vec(self, view: View, c0: int, cb: int, vals: View) -> None:
        b = self.b
        if view.dtype != "float32":
            t = b.sbuf((cb, 1), view.dtype, site="bn.store", bufs=1)
            b.tensor_copy(t, vals)
            vals = t
        b.dma_copy(_hbm(view, c0, ((1, cb), (1, 1))), vals)


def _stride0(m) -> int:
    return m.stride[0] if isinstance(m, TensorMeta) and m.ndim else 1


def _bn_args(call: Call):
    """(input, weight, bias, running_mean, running_var, training, momentum, eps) of any forward form."""
    n = call.named()
    x = n.get("input")
    training = n.get("training", False if "no_training" in call.op else True)
    return (x, _vec(n.get("weight")), _vec(n.get("bias")), _vec(n.get("running_mean")),
            _vec(n.get("running_var")), bool(training), float(n.get("momentum", 0.1)), float(n.get("eps", 1e-5)))


def lower_batch_norm(call: Call, spec):
    x, w, bias, rm, rv, training, momentum, eps = _bn_args(call)
    if not isinstance(x, TensorMeta) or x.numel == 0 or not _ok(x, w, bias, rm, rv) or len(call.outputs) < 1:
        return None
    if not training and (rm is None or rv is None):
        return None
    lanes = _Lanes.plan(x, spec.partitions, spec)
    out = call.outputs[0]
    if lanes is None or out.shape != x.shape or _Lanes.plan(out, spec.partitions) is None:
        return None
    if _spatial(out) != _spatial(x) or out.stride[:2] != x.stride[:2]:
        return None
    return _with_keep_budget(spec, "forward", lambda keep: _forward_program(
        call, spec, lanes, x, w, bias, rm, rv, out, training, momentum, eps, keep))


def _with_keep_budget(spec, direction: str, build):
    """``build(keep_bytes)``, keeping on chip what SBUF holds beside the streamed tiles; when the
    tiles do not fit after all, with half as much kept, then nothing."""
    from ..errors import CapacityError

    keep = spec.sbuf_bytes_per_partition - _BN_SCRATCH_BYTES[direction]
    while True:
        try:
            return build(max(0, keep))
        except CapacityError:
            if keep <= 0:
                raise
            keep = keep // 2 if keep > _F * 4 else 0


def _forward_program(call, spec, lanes, x, w, bias, rm, rv, out, training, momentum, eps, keep_bytes):
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        X = hbm_input(b, "in_input", x)
        Y = hbm_output(b, "out", out)
        W = hbm_input(b, "in_weight", w) if w is not None else None
        Bv = hbm_input(b, "in_bias", bias) if bias is not None else None
        RM = hbm_input(b, "in_running_mean", rm) if rm is not None else None
        RV = hbm_input(b, "in_running_var", rv) if rv is not None else None
        saves = [m for m in call.outputs[1:3]]
        sm = hbm_output(b, "save_mean", saves[0]) if len(saves) > 0 and saves[0].numel else None
        si = hbm_output(b, "save_invstd", saves[1]) if len(saves) > 1 and saves[1].numel else None
        dst = None
        if training and RM is not None and RV is not None:
            if len(call.outputs) == 5:  # the functional form returns the new statistics
                dst = tuple(hbm_output(b, name, m) for name, m in zip(("running_mean_out", "running_var_out"),
                                                                       call.outputs[3:]))
                dst_strides = (_stride0(call.outputs[3]), _stride0(call.outputs[4]))
            else:  # the others update them in place
                b.mark_output(RM)
                b.mark_output(RV)
                dst, dst_strides = (RM, RV), (_stride0(rm), _stride0(rv))
            dst = (dst, dst_strides)
        bn = _BatchNorm(b, spec, lanes, x.device_dtype, keep_bytes)
        bn.forward(X, Y, W, Bv, (_stride0(w), _stride0(bias)), RM, RV, (_stride0(rm), _stride0(rv)), sm, si,
                   training, momentum, eps, dst)
    return b.build(meta={"lowering": "batch_norm", "parts_per_channel": lanes.j}, shrink_rotation=True)


def lower_batch_norm_backward(call: Call, spec):
    n = call.named()
    dy, x = n.get("grad_out"), n.get("input")
    w, rm, rv = _vec(n.get("weight")), _vec(n.get("running_mean")), _vec(n.get("running_var"))
    # batch_norm_backward's ``save_var`` holds what the forward saved: on this device (CPU kernels)
    # the inverse standard deviation, as native_batch_norm's ``save_invstd``
    smean, sinv = _vec(n.get("save_mean")), _vec(n.get("save_invstd", n.get("save_var")))
    train = bool(n.get("train", n.get("update", True)))
    eps = float(n.get("eps", 1e-5))
    mask = tuple(bool(v) for v in (n.get("output_mask") or (True, True, True)))
    if not all(isinstance(t, TensorMeta) and t.numel for t in (dy, x)) or dy.shape != x.shape:
        return None
    if not _ok(dy, x, w, rm, rv, smean, sinv) or len(call.outputs) != 3:
        return None
    if train and (smean is None or sinv is None) or not train and (rm is None or rv is None):
        return None
    lanes = _Lanes.plan(x, spec.partitions, spec)
    if lanes is None or _spatial(dy) != _spatial(x) or dy.stride[:2] != x.stride[:2]:
        return None
    gi, gw, gb = call.outputs
    if mask[0] and (gi.shape != x.shape or gi.stride[:2] != x.stride[:2] or _spatial(gi) != _spatial(x)):
        return None
    return _with_keep_budget(spec, "backward", lambda keep: _backward_program(
        call, spec, lanes, n, dy, x, w, rm, rv, smean, sinv, train, eps, mask, keep))


def _backward_program(call, spec, lanes, n, dy, x, w, rm, rv, smean, sinv, train, eps, mask, keep_bytes):
    gi, gw, gb = call.outputs
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        DY = hbm_input(b, "in_grad_out", dy)
        X = hbm_input(b, "in_input", x)
        W = hbm_input(b, "in_weight", w) if w is not None else None
        if train:
            M = hbm_input(b, "in_save_mean", smean)
            R = hbm_input(b, "in_save_invstd" if "save_invstd" in n else "in_save_var", sinv)
            strides = (_stride0(smean), _stride0(sinv))
            RM = RV = None
        else:
            M = R = None
            RM = hbm_input(b, "in_running_mean", rm)
            RV = hbm_input(b, "in_running_var", rv)
            strides = (_stride0(rm), _stride0(rv))
        DX = hbm_output(b, "grad_input", gi) if mask[0] and gi.numel else None
        GW = hbm_output(b, "grad_weight", gw) if mask[1] and gw.numel else None
        GB = hbm_output(b, "grad_bias", gb) if mask[2] and gb.numel else None
        if GW is not None and gw.stride[0] != 1 or GB is not None and gb.stride[0] != 1:
            return None
        _BatchNorm(b, spec, lanes, x.device_dtype, keep_bytes).backward(DY, X, DX, GW, GB, W, _stride0(w), M, R,
                                                                        strides, train, eps, RM, RV)
    return b.build(meta={"lowering": "batch_norm_backward", "parts_per_channel": lanes.j}, shrink_rotation=True)


# ---- group norm: (image, group) rows x (channels of the group, pixels) -------------------------------

class _GroupNorm:
    def __init__(self, b: TileBuilder, spec, n: int, c: int, s: int, groups: int):
        self.b, self.spec = b, spec
        self.n, self.c, self.s, self.g = n, c, s, groups
        self.cg = c // groups
        self.P = spec.partitions
        self.per_tile = max(1, self.P // groups)  # whole images per tile of rows

    def rows(self):
        """(first image, images) of each tile; partition = (image, group)."""
        return [(i, min(self.per_tile, self.n - i)) for i in range(0, self.n, self.per_tile)]

    def chunks(self):
        """(first channel, channels, first pixel, pixels) of the group's elements per tile."""
        if self.s <= _F:
            k = max(1, _F // self.s)
            return [(c, min(k, self.cg - c), 0, self.s) for c in range(0, self.cg, k)]
        return [(c, 1, p, min(_F, self.s - p)) for c in range(self.cg) for p in range(0, self.s, _F)]

    def hbm(self, view: View, xs, n0, ni, chunk) -> View:
        c, nc, p, pn = chunk
        xs0, xs1, ss = xs
        if self.g == 1:
            dims = ((xs0, ni),)
        else:
            dims = ((xs0, ni), (self.cg * xs1, self.g))
        return _hbm(view, n0 * xs0 + c * xs1 + p * ss, dims + ((xs1, nc), (ss, pn)))

    def affine(self, view: View | None, stride: int, ni: int, site: str, fill: float) -> View:
        """Per-channel vector as [(image, group), cg]: partition (n, g) holds channels g*cg.."""
        b = self.b
        t = b.sbuf((ni * self.g, self.cg), "float32", site=site, bufs=1)
        if view is None:
            b.memset(t, fill)
            return t
        src = _hbm(view, 0, ((0, ni), (self.cg * stride, self.g), (stride, self.cg)))
        if view.dtype == "float32":
            b.dma_copy(t, src)
            return t
        raw = b.sbuf((ni * self.g, self.cg), view.dtype, site=site + ".raw", bufs=1)
        b.dma_copy(raw, src)
        b.tensor_copy(t, raw)
        return t

    def _load(self, view, xs, n0, ni, chunk, site):
        t = self.b.sbuf((ni * self.g, chunk[1] * chunk[3]), view.dtype, site=site)
        self.b.dma_copy(t, self.hbm(view, xs, n0, ni, chunk))
        return t

    def _load_x(self, view, xs, n0, ni, resident: bool, chunk) -> View:
        """``view``'s chunk for the statistics pass, in a home of its own when kept."""
        return self._load(view, xs, n0, ni, chunk, "gn.x" if not resident else f"gn.xk{chunk}")

    def forward(self, X, xs, Y, ys, W, Bv, wb_strides, MEAN, RSTD, eps, isz):
        b = self.b
        resident = self.cg * self.s * isz <= _RESIDENT
        for n0, ni in self.rows():
            rows = ni * self.g
            chunks = self.chunks()
            mv, kept = _mean_var(b, chunks, rows, functools.partial(self._load_x, X, xs, n0, ni, resident),
                                 functools.partial(_constant, resident), "gn")
            mean = _on_chip(mv, 0, rows, 0, ((1, 1),))
            rstd = b.sbuf((rows, 1), "float32", site="gn.rstd", bufs=1)
            b.activation(rstd, _on_chip(mv, 0, rows, 1, ((1, 1),)), "rsqrt", bias=float(eps))
            # per (row, channel): scale = w * rstd, shift = b - mean * scale
            w = self.affine(W, wb_strides[0], ni, "gn.w", 1.0)
            bias = self.affine(Bv, wb_strides[1], ni, "gn.b", 0.0)
            scale = b.sbuf((rows, self.cg), "float32", site="gn.scale", bufs=1)
            b.tensor_scalar(scale, w, "multiply", rstd)
            shift = b.sbuf((rows, self.cg), "float32", site="gn.shift", bufs=1)
            b.tensor_scalar(shift, scale, "multiply", mean)
            b.tensor_tensor(shift, bias, shift, "subtract")
            for chunk in chunks:
                t = kept.get(chunk) or self._load(X, xs, n0, ni, chunk, "gn.x")
                c, nc, _, pn = chunk
                o = b.sbuf((rows, nc * pn), Y.dtype, site="gn.y", bufs=2)
                self._per_channel(o, t, scale, shift, rows, c, nc, pn)
                b.dma_copy(self.hbm(Y, ys, n0, ni, chunk), o)
            if MEAN is not None:
                b.dma_copy(_hbm(MEAN, n0 * self.g, ((1, rows), (1, 1))), mean)
            if RSTD is not None:
                b.dma_copy(_hbm(RSTD, n0 * self.g, ((1, rows), (1, 1))), rstd)

    def _per_channel(self, o, t, scale, shift, rows, c, nc, pn) -> None:
        """``o = t * scale[:, c] (+ shift[:, c])`` per channel: ScalarE per-partition scalars when
        the pixels are many, else VectorE with the factors broadcast along the pixels."""
        b = self.b
        if pn >= 256 or nc == 1:
            for k in range(nc):
                b.activation(_on_chip(o, 0, rows, k * pn, ((1, pn),)), _on_chip(t, 0, rows, k * pn, ((1, pn),)),
                             "identity", scale=_on_chip(scale, 0, rows, c + k, ((1, 1),)),
                             bias=None if shift is None else _on_chip(shift, 0, rows, c + k, ((1, 1),)))
            return
        if shift is None:
            b.tensor_tensor(o, t, _on_chip(scale, 0, rows, c, ((1, nc), (0, pn))), "multiply")
            return
        tmp = b.sbuf((rows, nc * pn), "float32", site="gn.tmp", bufs=2)
        b.tensor_tensor(tmp, t, _on_chip(scale, 0, rows, c, ((1, nc), (0, pn))), "multiply")
        b.tensor_tensor(o, tmp, _on_chip(shift, 0, rows, c, ((1, nc), (0, pn))), "add")

    def backward(self, DY, dys, X, xs, MEAN, RSTD, W, w_stride, DX, dxs, GW, GB, isz):
        """PyTorch's formula: per (image, group) ``ds = sum_c w_c sum(dy*x)``, ``db = sum_c w_c sum(dy)``,
        ``dx = c1*dy + c2*x + c3`` with ``c1 = rstd*w_c``, ``c2 = (db*mean - ds)*rstd^3/(cg*s)``,
        ``c3 = -c2*mean - db*rstd/(cg*s)``; ``grad_weight[c] = sum_n rstd*(sum(dy*x) - mean*sum(dy))``,
        ``grad_bias[c] = sum_n sum(dy)`` (across partitions: a TensorE matmul)."""
        b, G, cg = self.b, self.g, self.cg
        resident = 2 * cg * self.s * isz <= _RESIDENT
        inv = 1.0 / (cg * self.s)
        gw_acc = gb_acc = None
        if GW is not None or GB is not None:
            gw_acc = b.psum((G, cg), "float32", site="gn.gw", bufs=1) if GW is not None else None
            gb_acc = b.psum((G, cg), "float32", site="gn.gb", bufs=1) if GB is not None else None
        rows_list = self.rows()
        for ti, (n0, ni) in enumerate(rows_list):
            rows = ni * G
            mean = b.sbuf((rows, 1), "float32", site="gn.mean", bufs=1)
            b.dma_copy(mean, _hbm(MEAN, n0 * G, ((1, rows), (1, 1))))
            rstd = b.sbuf((rows, 1), "float32", site="gn.rstd", bufs=1)
            b.dma_copy(rstd, _hbm(RSTD, n0 * G, ((1, rows), (1, 1))))
            w = self.affine(W, w_stride, ni, "gn.w", 1.0)
            chunks = self.chunks()
            s0 = b.sbuf((rows, cg), "float32", site="gn.s0", bufs=1)  # per channel: sum(dy)
            s1 = b.sbuf((rows, cg), "float32", site="gn.s1", bufs=1)  # sum(dy * x)
            kept = {}
            for chunk in chunks:
                c, nc, p, pn = chunk
                dy = self._load(DY, dys, n0, ni, chunk, "gn.dy" if not resident else f"gn.dyk{chunk}")
                x = self._load(X, xs, n0, ni, chunk, "gn.x" if not resident else f"gn.xk{chunk}")
                prod_ = b.sbuf((rows, nc * pn), "float32", site="gn.prod", bufs=2)
                b.tensor_tensor(prod_, dy, x, "multiply")
                part0 = b.sbuf((rows, nc), "float32", site="gn.p0")
                part1 = b.sbuf((rows, nc), "float32", site="gn.p1")
                b.tensor_reduce(part0, _on_chip(dy, 0, rows, 0, ((pn, nc), (1, pn))), "add", axes=(2,))
                b.tensor_reduce(part1, _on_chip(prod_, 0, rows, 0, ((pn, nc), (1, pn))), "add", axes=(2,))
                for acc, part in ((s0, part0), (s1, part1)):
                    dst = _on_chip(acc, 0, rows, c, ((1, nc),))
                    if p == 0:
                        b.tensor_copy(dst, part)
                    else:
                        b.tensor_tensor(dst, dst, part, "add")
                if resident:
                    kept[chunk] = (dy, x)
            if gw_acc is not None or gb_acc is not None:
                # per (row, c): rstd * (s1 - mean * s0) and s0, summed over images on TensorE
                v = b.sbuf((rows, G), "float32", site="gn.sel.v", bufs=1)
                b.iota(v, base=0, partition_step=1, steps=(-1,))  # p - g
                sel = b.sbuf((rows, G), "float32", site="gn.sel", bufs=1)
                b.tensor_scalar(sel, v, "mod", float(G), "equal", 0.0)  # (p - g) mod G == 0
                if gw_acc is not None:
                    d = b.sbuf((rows, cg), "float32", site="gn.dw")
                    b.tensor_scalar(d, s0, "multiply", mean)
                    b.tensor_tensor(d, s1, d, "subtract")
                    b.tensor_scalar(d, d, "multiply", rstd)
                    b.matmul(gw_acc, sel, d, accumulate=ti > 0)
                if gb_acc is not None:
                    b.matmul(gb_acc, sel, s0, accumulate=ti > 0)
            if DX is None:
                continue
            ws0 = b.sbuf((rows, cg), "float32", site="gn.ws0")
            b.tensor_tensor(ws0, s0, w, "multiply")
            ws1 = b.sbuf((rows, cg), "float32", site="gn.ws1")
            b.tensor_tensor(ws1, s1, w, "multiply")
            dsb = b.sbuf((rows, 2), "float32", site="gn.dsb", bufs=1)
            ds = _on_chip(dsb, 0, rows, 0, ((1, 1),))
            db = _on_chip(dsb, 0, rows, 1, ((1, 1),))
            b.tensor_reduce(ds, ws1, "add")
            b.tensor_reduce(db, ws0, "add")
            cc = b.sbuf((rows, 3), "float32", site="gn.cc", bufs=1)
            c2 = _on_chip(cc, 0, rows, 0, ((1, 1),))
            c3 = _on_chip(cc, 0, rows, 1, ((1, 1),))
            tmp = _on_chip(cc, 0, rows, 2, ((1, 1),))
            b.tensor_tensor(c2, db, mean, "multiply")
            b.tensor_tensor(c2, c2, ds, "subtract")
            b.tensor_tensor(tmp, rstd, rstd, "multiply")
            b.tensor_tensor(tmp, tmp, rstd, "multiply")
            b.tensor_tensor(c2, c2, tmp, "multiply")
            b.tensor_scalar(c2, c2, "multiply", inv)  # (db*mean - ds) * rstd^3 / (cg*s)
            b.tensor_tensor(c3, c2, mean, "multiply")
            b.tensor_tensor(tmp, db, rstd, "multiply")
            b.tensor_scalar(tmp, tmp, "multiply", inv)
            b.tensor_tensor(c3, c3, tmp, "add")
            b.tensor_scalar(c3, c3, "multiply", -1.0)  # -c2*mean - db*rstd/(cg*s)
            c1 = b.sbuf((rows, cg), "float32", site="gn.c1", bufs=1)
            b.tensor_scalar(c1, w, "multiply", rstd)
            for chunk in chunks:
                c, nc, p, pn = chunk
                dy, x = kept.get(chunk) or (self._load(DY, dys, n0, ni, chunk, "gn.dy"),
                                            self._load(X, xs, n0, ni, chunk, "gn.x"))
                free = nc * pn
                t = b.sbuf((rows, free), "float32", site="gn.t", bufs=2)
                b.activation(t, x, "identity", scale=c2, bias=c3)  # ScalarE: c2*x + c3
                a = b.sbuf((rows, free), "float32", site="gn.a", bufs=2)
                self._per_channel(a, dy, c1, None, rows, c, nc, pn)
                o = b.sbuf((rows, free), DX.dtype, site="gn.dx", bufs=2)
                b.tensor_tensor(o, a, t, "add")
                b.dma_copy(self.hbm(DX, dxs, n0, ni, chunk), o)
        for acc, view in ((gw_acc, GW), (gb_acc, GB)):
            if acc is None:
                continue
            res = b.sbuf((G, cg), view.dtype, site="gn.res", bufs=1)
            b.tensor_copy(res, acc)
            b.dma_copy(_hbm(view, 0, ((cg, G), (1, cg))), res)


def _gn_layout(m: TensorMeta, n: int, c: int, s: int):
    """(xs0, xs1, ss) of an (N, C, *) tensor whose pixels merge into one run, else None."""
    if not isinstance(m, TensorMeta) or m.numel != n * c * s or m.ndim < 2 or m.shape[:2] != (n, c):
        return None
    sp = _spatial(m)
    return None if sp is None else (m.stride[0], m.stride[1], sp[0])


def lower_group_norm(call: Call, spec):
    nm = call.named()
    x, w, bias = nm.get("input"), _vec(nm.get("weight")), _vec(nm.get("bias"))
    n, c, s, groups, eps = nm.get("N"), nm.get("C"), nm.get("HxW"), nm.get("group"), float(nm.get("eps", 1e-5))
    if not all(isinstance(v, int) for v in (n, c, s, groups)) or not groups or c % groups or len(call.outputs) != 3:
        return None
    if not _ok(x, w, bias) or x is None or x.numel == 0 or groups > spec.partitions:
        return None
    out, mean, rstd = call.outputs
    xs, ys = _gn_layout(x, n, c, s), _gn_layout(out, n, c, s)
    if xs is None or ys is None or (w is not None and w.stride[0] != 1) or (bias is not None and bias.stride[0] != 1):
        return None
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        X = hbm_input(b, "in_input", x)
        Y = hbm_output(b, "out", out)
        W = hbm_input(b, "in_weight", w) if w is not None else None
        Bv = hbm_input(b, "in_bias", bias) if bias is not None else None
        M = hbm_output(b, "mean", mean) if mean.numel else None
        R = hbm_output(b, "rstd", rstd) if rstd.numel else None
        _GroupNorm(b, spec, n, c, s, groups).forward(X, xs, Y, ys, W, Bv, (1, 1), M, R, eps, x.itemsize)
    return b.build(meta={"lowering": "group_norm"}, shrink_rotation=True)


def lower_group_norm_backward(call: Call, spec):
    nm = call.named()
    dy, x, mean, rstd, w = nm.get("grad_out"), nm.get("input"), nm.get("mean"), nm.get("rstd"), _vec(nm.get("weight"))
    n, c, s, groups = nm.get("N"), nm.get("C"), nm.get("HxW"), nm.get("group")
    mask = tuple(bool(v) for v in (nm.get("output_mask") or (True, True, True)))
    if not all(isinstance(v, int) for v in (n, c, s, groups)) or not groups or c % groups or len(call.outputs) != 3:
        return None
    if not _ok(dy, x, w) or groups > spec.partitions or c // groups > spec.matmul_moving_fmax:
        return None
    if not all(isinstance(t, TensorMeta) and t.is_contiguous and t.numel == n * groups for t in (mean, rstd)):
        return None
    xs, dys = _gn_layout(x, n, c, s), _gn_layout(dy, n, c, s)
    gi, gw, gb = call.outputs
    dxs = _gn_layout(gi, n, c, s) if mask[0] and gi.numel else None
    if xs is None or dys is None or (mask[0] and gi.numel and dxs is None) or (w is not None and w.stride[0] != 1):
        return None
    for want, m in ((mask[1], gw), (mask[2], gb)):
        if want and m.numel and not m.is_contiguous:
            return None
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        DY = hbm_input(b, "in_grad_out", dy)
        X = hbm_input(b, "in_input", x)
        M = hbm_input(b, "in_mean", mean)
        R = hbm_input(b, "in_rstd", rstd)
        W = hbm_input(b, "in_weight", w) if w is not None else None
        DX = hbm_output(b, "grad_input", gi) if dxs is not None else None
        GW = hbm_output(b, "grad_weight", gw) if mask[1] and gw.numel else None
        GB = hbm_output(b, "grad_bias", gb) if mask[2] and gb.numel else None
        _GroupNorm(b, spec, n, c, s, groups).backward(DY, dys, X, xs, M, R, W, 1, DX, dxs, GW, GB, x.itemsize)
    return b.build(meta={"lowering": "group_norm_backward"}, shrink_rotation=True)


add_rules(["native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
           "_native_batch_norm_legit_functional", "_batch_norm_with_update"],
          Rule("batch_norm", lower_batch_norm, "batch norm forward"))
add_rules(["native_batch_norm_backward", "batch_norm_backward"],
          Rule("batch_norm_backward", lower_batch_norm_backward, "batch norm backward"))
add_rules(["native_group_norm"], Rule("group_norm", lower_group_norm, "group norm forward"))
add_rules(["native_group_norm_backward"], Rule("group_norm_backward", lower_group_norm_backward, "group norm backward"))

