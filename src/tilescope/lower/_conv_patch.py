"""Convolutions whose stride equals their kernel (a ViT's patch embedding) as plain matmuls.

With stride == kernel, no padding, no dilation and one group, no two output pixels share an
input: every output pixel ``p = (n, oh, ow)`` reads its own patch of ``K = cin * kh * kw``
inputs, so the convolution is the matmul ``Y[co, P] = W[co, K] @ Xp[K, P]`` over the patches,
with nothing to slide. The patches are read with one patch per partition (``Xp.T``: a row of
``K`` inputs in runs of ``kw``), which fills the 128 contraction rows however few the input
channels are (a ViT's 3), where the sliding-window forms contract over ``cin * kh`` rows at most:

* **grad_weight** contracts over the patches, already on the partitions:
  ``GW[co, K] += dy.T[P, co].T @ Xp.T[P, K]``, accumulated in PSUM over blocks of 128 patches.
  ``dy`` with its channels innermost (the ``(n, patches, d)`` tokens a ViT makes of it) is read
  as ``[P, co]`` rows; ``dy`` as stored by a convolution (``[co, P]``) is transposed on TensorE;
* **forward**: ``Y[co, <=512 patches]`` accumulates over K chunks of ``[K, co]`` weights (read
  once, one contiguous DMA per block of output channels, transposed on TensorE) and
  ``[K, patches]`` columns, made in one of two ways: each ``[128 patches, 128 K]`` block of
  ``Xp.T`` transposed on TensorE (:func:`patch_forward`), or -- runs of ``kw`` being short for
  the DMA -- the input read in long runs, partition ``(n, ci, oh)`` holding the ``kh`` rows of
  its row of patches, and each patch column's ``[(n, ci, oh), (i, j)]`` slice transposed
  (:func:`patch_forward_rows`).

The convolution lowerings build this form beside their sliding-window forms and keep
whichever the simulator times shorter.

>>> from tilescope.lower import Call, TensorMeta, lower, contiguous_strides
>>> def t(*shape): return TensorMeta(shape, contiguous_strides(shape), "float32")
>>> x, w, dy = t(4, 3, 224, 224), t(192, 3, 16, 16), t(4, 192, 14, 14)  # ViT-tiny's patches
>>> call = Call("aten::convolution_backward_overrideable", (dy, x, w, (16, 16), (0, 0), (1, 1), False,
...             (0, 0), 1, (False, True, False)), (), (w,))
>>> lower(call).program.meta["forms"]
'grad_weight=patch-matmul'
"""

from __future__ import annotations

from ..program import TileBuilder, View

__all__ = ["patch_applies", "patch_forward", "patch_forward_rows", "patch_grad_weight"]

_FMAX = 512  # moving columns of one matmul (a PSUM bank of fp32)
_ACCS = 4  # PSUM accumulators of grad_weight at once (of 8 banks; the rest serve transposes)
_W_BYTES = 96 * 1024  # per partition: the transposed weights of the forward, kept for the whole execution
_ROWS_BYTES = 32 * 1024  # per partition: one tile of image rows (double-buffered)
_XK_BYTES = 48 * 1024  # per partition: the [K, patches] columns of a group of images (double-buffered)


def patch_applies(g) -> bool:
    """Whether ``g`` (a ConvGeom) is a patch embedding: stride == kernel > 1 tap, no padding,
    no dilation, one group."""
    return (g.groups == 1 and g.taps > 1 and (g.sh, g.sw) == (g.kh, g.kw) and g.ph == 0 and g.pw == 0
            and (g.dh == 1 or g.kh == 1) and (g.dw == 1 or g.kw == 1))


def _segments(g, P: int, images: range | None = None) -> list[list[tuple[int, int, int, int, int]]]:
    """Blocks of at most ``P`` patches, each a list of ``(n, oh0, rows, ow0, cols)`` runs: whole
    output rows of one image (``cols == ow``), or a piece of one row when a row is wider than
    ``P``. A run's patches are consecutive partitions of its block."""
    blocks, cur, used = [], [], 0
    for n in images if images is not None else range(g.n):
        if g.ow > P:
            for oh in range(g.oh):
                for ow0 in range(0, g.ow, P):
                    blocks.append([(n, oh, 1, ow0, min(P, g.ow - ow0))])
            continue
        oh = 0
        while oh < g.oh:
            rows = min(g.oh - oh, (P - used) // g.ow)
            if rows == 0:
                blocks.append(cur)
                cur, used = [], 0
                continue
            cur.append((n, oh, rows, 0, g.ow))
            used += rows * g.ow
            oh += rows
    if cur:
        blocks.append(cur)
    return blocks


def _contiguous_k(s, g) -> bool:
    """Whether a weight-shaped tensor's (ci, kh, kw) are one contiguous row of K elements."""
    return s[3] == 1 and s[2] == g.kw and s[1] == g.kh * g.kw


class _Patches:
    """Loads of ``Xp.T`` (and ``dy.T``) blocks: one transfer per run of patches, on queues in turn."""

    def __init__(self, b: TileBuilder, spec, g, X: View, xs, dtype: str):
        from ._conv import _Queues

        self.b, self.g, self.X, self.xs, self.dtype = b, g, X, xs, dtype
        self.P = spec.partitions
        self.K = g.cin * g.taps
        self.queues = _Queues(spec)

    def load(self, block) -> tuple[View, int]:
        from ._conv import _hbm, _on_chip

        b, g, xs = self.b, self.g, self.xs
        t = b.sbuf((self.P, self.K), self.X.dtype, site="conv.patch.x", bufs=3)
        p = 0
        for n, oh0, rows, ow0, cols in block:
            src = _hbm(self.X, n * xs[0] + oh0 * g.sh * xs[2] + ow0 * g.sw * xs[3],
                       ((g.sh * xs[2], rows), (g.sw * xs[3], cols), (xs[1], g.cin), (xs[2], g.kh), (xs[3], g.kw)))
            b.dma_copy(_on_chip(t, p, rows * cols, 0, ((1, self.K),)), src, queue=self.queues.next())
            p += rows * cols
        return t, p


def patch_grad_weight(b: TileBuilder, spec, g, X: View, xs, DY: View, dys, GW: View, gws, dtype: str,
                      out_dtype: str) -> str:
    """Emit ``grad_weight`` of the patch convolution ``g`` (see the module docstring)."""
    from ._conv import _Decline, _hbm, _on_chip

    if not patch_applies(g) or not _contiguous_k(gws, g):
        raise _Decline
    P, K, C = spec.partitions, g.cin * g.taps, g.cout
    channels_last = dys[1] == 1 and g.oh * g.ow > 1
    patches = _Patches(b, spec, g, X, xs, dtype)
    blocks = _segments(g, P)
    accs = [(m0, min(P, C - m0), k0, min(_FMAX, K - k0)) for m0 in range(0, C, P) for k0 in range(0, K, _FMAX)]
    for a0 in range(0, len(accs), _ACCS):  # a pass per group of accumulators (inputs re-read per pass)
        group = accs[a0:a0 + _ACCS]
        ps = {a: b.psum((a[1], a[3]), "float32", site=f"conv.patch.acc{i}", bufs=1) for i, a in enumerate(group)}
        for bi, block in enumerate(blocks):
            xt, pb = patches.load(block)
            dyt = _dy_rows(b, spec, g, DY, dys, block, pb, channels_last, patches)
            for a in group:
                m0, ms, k0, ks = a
                b.matmul(ps[a], _on_chip(dyt, 0, pb, m0, ((1, ms),)), _on_chip(xt, 0, pb, k0, ((1, ks),)),
                         accumulate=bi > 0)
        for i, a in enumerate(group):
            m0, ms, k0, ks = a
            out = b.sbuf((ms, ks), out_dtype, site="conv.patch.gw", bufs=2)
            if i % 2:
                b.tensor_copy(out, ps[a])
            else:
                b.activation(out, ps[a], "copy")
            b.dma_copy(_hbm(GW, m0 * gws[0] + k0, ((gws[0], ms), (1, ks))), out, queue=patches.queues.next())
    return "patch-matmul"


def _dy_rows(b, spec, g, DY: View, dys, block, pb: int, channels_last: bool, patches: _Patches) -> View:
    """``dy.T`` of a block of patches: ``[patches, co]`` (read as rows when the channels are
    innermost, else read ``[co, patches]`` and transposed on TensorE)."""
    from ._conv import _hbm, _on_chip

    P, C = spec.partitions, g.cout
    t = b.sbuf((P, C), DY.dtype, site="conv.patch.dy", bufs=3)
    p = 0
    if channels_last:
        for n, oh0, rows, ow0, cols in block:
            src = _hbm(DY, n * dys[0] + oh0 * dys[2] + ow0 * dys[3], ((dys[2], rows), (dys[3], cols), (dys[1], C)))
            b.dma_copy(_on_chip(t, p, rows * cols, 0, ((1, C),)), src, queue=patches.queues.next())
            p += rows * cols
        return t
    for c0 in range(0, C, P):
        cs = min(P, C - c0)
        raw = b.sbuf((cs, P), DY.dtype, site="conv.patch.dyraw", bufs=2)
        q = 0
        for n, oh0, rows, ow0, cols in block:
            src = _hbm(DY, n * dys[0] + c0 * dys[1] + oh0 * dys[2] + ow0 * dys[3],
                       ((dys[1], cs), (dys[2], rows), (dys[3], cols)))
            b.dma_copy(_on_chip(raw, 0, cs, q, ((cols, rows), (1, cols))), src, queue=patches.queues.next())
            q += rows * cols
        tp = b.psum((pb, cs), "float32", site="conv.patch.dyT", bufs=2)
        b.transpose(tp, _on_chip(raw, 0, cs, 0, ((1, pb),)))
        b.tensor_copy(_on_chip(t, 0, pb, c0, ((1, cs),)), tp)
    return t


def patch_forward(b: TileBuilder, spec, g, X: View, xs, W: View, ws, Y: View, ys, bias, bias_stride, dtype: str,
                  out_dtype: str) -> str:
    """Emit the forward patch convolution ``g`` (plus ``bias``; see the module docstring)."""
    from ._conv import _ceil_div, _Decline

    if not patch_applies(g) or not _contiguous_k(ws, g):
        raise _Decline
    nk = _ceil_div(g.cin * g.taps, spec.partitions)
    isz = 2 if dtype in ("bfloat16", "float16") else 4
    if nk * g.cout * isz > _W_BYTES or nk * _FMAX * isz > _W_BYTES:
        raise _Decline
    patches = _Patches(b, spec, g, X, xs, dtype)
    wt = _weights_t(b, spec, g, W, ws, dtype, nk, patches)
    biases = _biases(b, spec, g, bias, bias_stride)
    blocks = _segments(g, spec.partitions)
    per = max(1, _FMAX // spec.partitions)  # blocks of patches per matmul's moving columns
    for s0 in range(0, len(blocks), per):
        xk, cols, runs = _patch_columns(b, spec, g, blocks[s0:s0 + per], per, nk, dtype, patches)
        _forward_group(b, spec, g, Y, ys, wt, xk, cols, runs, biases, nk, per, out_dtype, patches)
    return "patch-matmul"


def _weights_t(b, spec, g, W: View, ws, dtype: str, nk: int, patches: _Patches, chunks=None) -> View:
    """``[K chunk, nk, co]``: the weights' ``[co, K]`` rows, one DMA per block of output channels,
    transposed on TensorE one K chunk at a time: 128 consecutive K, or ``chunks`` given as
    ``(ci, first kernel row, kernel rows)``."""
    from ._conv import _hbm, _on_chip

    P, K, C = spec.partitions, g.cin * g.taps, g.cout
    spans = ([(kc * P, min(P, K - kc * P)) for kc in range(nk)] if chunks is None
             else [(ci * g.taps + i0 * g.kw, ibn * g.kw) for ci, i0, ibn in chunks])
    wt = b.sbuf((P, nk, C), dtype, site="conv.patch.wT", bufs=1)
    for m0 in range(0, C, P):
        ms = min(P, C - m0)
        raw = b.sbuf((ms, K), W.dtype, site="conv.patch.wraw", bufs=1)
        b.dma_copy(raw, _hbm(W, m0 * ws[0], ((ws[0], ms), (1, K))), queue=patches.queues.next())
        for kc, (k0, ks) in enumerate(spans):
            tp = b.psum((ks, ms), "float32", site="conv.patch.T", bufs=2)
            b.transpose(tp, _on_chip(raw, 0, ms, k0, ((1, ks),)))
            b.tensor_copy(_on_chip(wt, 0, ks, kc * C + m0, ((1, ms),)), tp)
    return wt


def _biases(b, spec, g, bias, bias_stride) -> dict:
    """Per block of output channels (its first channel): the bias as a float32 ``[co, 1]`` column."""
    from ._conv import _hbm

    out: dict = {}
    if bias is None:
        return out
    for m0 in range(0, g.cout, spec.partitions):
        ms = min(spec.partitions, g.cout - m0)
        bt = b.sbuf((ms, 1), bias.dtype, site="conv.patch.bias", bufs=1)
        b.dma_copy(bt, _hbm(bias, m0 * bias_stride, ((bias_stride, ms), (1, 1))))
        if bt.dtype != "float32":
            f = b.sbuf((ms, 1), "float32", site="conv.patch.bias32", bufs=1)
            b.tensor_copy(f, bt)
            bt = f
        out[m0] = bt
    return out


def _patch_columns(b, spec, g, group, per: int, nk: int, dtype: str, patches: _Patches):
    """``Xp[K chunk, nk, patches]`` of a group of blocks (each loaded as ``Xp.T`` and transposed
    on TensorE), its column count and its runs as ``(first column, run)``."""
    from ._conv import _on_chip

    P, K = spec.partitions, g.cin * g.taps
    xk = b.sbuf((P, nk, per * P), dtype, site="conv.patch.xk", bufs=2)
    cols, runs = 0, []
    for block in group:
        xt, pb = patches.load(block)
        for kc in range(nk):
            ks = min(P, K - kc * P)
            tp = b.psum((ks, pb), "float32", site="conv.patch.T", bufs=2)
            b.transpose(tp, _on_chip(xt, 0, pb, kc * P, ((1, ks),)))
            dst = _on_chip(xk, 0, ks, kc * per * P + cols, ((1, pb),))
            if kc % 2:  # PSUM copies alternate between VectorE and ScalarE
                b.tensor_copy(dst, tp)
            else:
                b.activation(dst, tp, "copy")
        for run in block:
            runs.append((cols, run))
            cols += run[2] * run[4]
    return xk, cols, runs


def _forward_group(b, spec, g, Y: View, ys, wt, xk, cols: int, runs, biases, nk: int, per: int, out_dtype: str,
                   patches: _Patches) -> None:
    """``Y[co, patches] = sum over K chunks of wT.T @ Xp`` for one group's columns, stored by runs."""
    from ._conv import _on_chip

    P, K, C = spec.partitions, g.cin * g.taps, g.cout
    for m0 in range(0, C, P):
        ms = min(P, C - m0)
        acc = b.psum((ms, cols), "float32", site="conv.patch.acc", bufs=2)
        for kc in range(nk):
            ks = min(P, K - kc * P)
            b.matmul(acc, _on_chip(wt, 0, ks, kc * C + m0, ((1, ms),)),
                     _on_chip(xk, 0, ks, kc * per * P, ((1, cols),)), accumulate=kc > 0)
        out = b.sbuf((ms, per * P), out_dtype, site="conv.patch.out", bufs=2)
        _store_block(b, acc, out, m0, ms, cols, runs, biases, Y, ys, patches)


def _store_block(b, acc, out, m0: int, ms: int, cols: int, runs, biases, Y: View, ys, patches: _Patches) -> None:
    """Output channels ``m0 .. m0+ms`` of a block: PSUM ``acc`` evacuated into ``out`` by ScalarE
    (adding the bias when there is one), then stored as the runs of output rows it holds."""
    from ._conv import _hbm, _on_chip

    o = _on_chip(out, 0, ms, 0, ((1, cols),))
    if m0 in biases:
        b.activation(o, acc, "identity", bias=biases[m0])
    else:
        b.activation(o, acc, "copy")
    for q, (n, oh0, rows, ow0, rc) in runs:
        b.dma_copy(_hbm(Y, n * ys[0] + m0 * ys[1] + oh0 * ys[2] + ow0 * ys[3],
                        ((ys[1], ms), (ys[2], rows), (ys[3], rc))),
                   _on_chip(out, 0, ms, q, ((rc, rows), (1, rc))), queue=patches.queues.next())


def patch_forward_rows(b: TileBuilder, spec, g, X: View, xs, W: View, ws, Y: View, ys, bias, bias_stride,
                       dtype: str, out_dtype: str) -> str:
    """The forward patch convolution with the input read in long runs: partition ``(n, ci, oh)``
    holds the ``kh`` input rows of its row of patches (one contiguous run), and TensorE
    transposes ``[(n, ci, oh), (i, j)]`` slices of each patch column ``ow`` into the
    ``[(i, j), patches]`` operand, a K chunk being ``128 // kw`` kernel rows of one channel."""
    from ._conv import _ceil_div, _Decline

    P = spec.partitions
    isz = 2 if dtype in ("bfloat16", "float16") else 4
    if not patch_applies(g) or not _contiguous_k(ws, g) or g.cin > P or g.kw > P or xs[3] != 1:
        raise _Decline
    ib = min(g.kh, P // g.kw)  # kernel rows per K chunk
    nkc = _ceil_div(g.kh, ib)
    nk = g.cin * nkc
    wt_cols = g.ow * g.kw  # the input columns the patches read
    if g.kh * wt_cols * isz > _ROWS_BYTES or nk * g.cout * isz > _W_BYTES:
        raise _Decline
    per_image = g.oh * g.ow
    # images per group: what one tile of rows holds (so that each group's matmuls follow its own
    # transposes on TensorE while the next tile loads), within the SBUF budget
    nimg = min(g.n, _XK_BYTES // (nk * per_image * isz), max(1, P // (g.cin * g.oh)))
    if nimg < 1:
        raise _Decline
    patches = _Patches(b, spec, g, X, xs, dtype)
    chunks = [(ci, k * ib, min(ib, g.kh - k * ib)) for ci in range(g.cin) for k in range(nkc)]
    wt = _weights_t(b, spec, g, W, ws, dtype, nk, patches, chunks)
    biases = _biases(b, spec, g, bias, bias_stride)
    for n0 in range(0, g.n, nimg):
        images = range(n0, min(g.n, n0 + nimg))
        xk = b.sbuf((P, nk, len(images) * per_image), dtype, site="conv.patch.xk", bufs=2)
        for tile_groups in _row_tiles(g, P, images):
            _transpose_rows(b, spec, g, X, xs, xk, n0, tile_groups, ib, nkc, patches)
        for block in _segments(g, _FMAX, images):
            c0 = (block[0][0] - n0) * per_image + block[0][1] * g.ow
            cols = sum(r[2] * r[4] for r in block)
            runs, q = [], 0
            for run in block:
                runs.append((q, run))
                q += run[2] * run[4]
            _forward_cols(b, spec, g, Y, ys, wt, xk, c0, cols, runs, biases, chunks, out_dtype, patches)
    return "patch-matmul:rows"


def _row_tiles(g, P: int, images) -> list[list[tuple[int, int, int]]]:
    """Tiles of at most ``P`` partitions, each a list of ``(n, oh0, rows)`` groups: partitions
    ``(ci, oh)`` of image ``n``'s output rows ``[oh0, oh0 + rows)``."""
    per = max(1, P // g.cin)  # output rows of one image per group
    tiles, cur, used = [], [], 0
    for n in images:
        for oh0 in range(0, g.oh, per):
            rows = min(per, g.oh - oh0)
            if used + g.cin * rows > P:
                tiles.append(cur)
                cur, used = [], 0
            cur.append((n, oh0, rows))
            used += g.cin * rows
    if cur:
        tiles.append(cur)
    return tiles


def _transpose_rows(b, spec, g, X: View, xs, xk, n0: int, groups, ib: int, nkc: int, patches: _Patches) -> None:
    """Load one tile of row groups (a run of ``kh`` rows per partition) and transpose each patch
    column's K chunks into ``xk[(i, j), (ci, chunk), patches]``."""
    from ._conv import _hbm, _on_chip

    P = spec.partitions
    wt_cols = g.ow * g.kw
    per_image = g.oh * g.ow
    ncols = xk.shape[-1]
    t = b.sbuf((P, g.kh * wt_cols), X.dtype, site="conv.patch.rows", bufs=2)
    p = 0
    for n, oh0, rows in groups:
        src = _hbm(X, n * xs[0] + oh0 * g.sh * xs[2],
                   ((xs[1], g.cin), (g.sh * xs[2], rows), (xs[2], g.kh), (1, wt_cols)))
        b.dma_copy(_on_chip(t, p, g.cin * rows, 0, ((wt_cols, g.kh), (1, wt_cols))), src, queue=patches.queues.next())
        p += g.cin * rows
    parts = p
    k = 0
    for ow in range(g.ow):
        for c in range(nkc):
            i0, ibn = c * ib, min(ib, g.kh - c * ib)
            tp = b.psum((ibn * g.kw, parts), "float32", site="conv.patch.T", bufs=3)
            b.transpose(tp, _on_chip(t, 0, parts, i0 * wt_cols + ow * g.kw, ((wt_cols, ibn), (1, g.kw))))
            q = 0
            for n, oh0, rows, count in _runs_of_images(g, groups):
                # psum columns (image, ci, oh) -> xk (ci chunk, pixel (image, oh, ow))
                src = _on_chip(tp, 0, ibn * g.kw, q, ((g.cin * rows, count), (rows, g.cin), (1, rows)))
                dst = _on_chip(xk, 0, ibn * g.kw, c * ncols + (n - n0) * per_image + oh0 * g.ow + ow,
                               ((per_image, count), (nkc * ncols, g.cin), (g.ow, rows)))
                if k % 2:  # PSUM copies alternate between VectorE and ScalarE
                    b.tensor_copy(dst, src)
                else:
                    b.activation(dst, src, "copy")
                k += 1
                q += count * g.cin * rows


def _runs_of_images(g, groups):
    """``groups`` as ``(n, oh0, rows, count)``: consecutive whole images merged (one PSUM copy each)."""
    out: list[list[int]] = []
    for n, oh0, rows in groups:
        last = out[-1] if out else None
        if last is not None and rows == g.oh and last[2] == g.oh and last[0] + last[3] == n:
            last[3] += 1
        else:
            out.append([n, oh0, rows, 1])
    return [tuple(r) for r in out]


def _forward_cols(b, spec, g, Y: View, ys, wt, xk, c0: int, cols: int, runs, biases, chunks, out_dtype: str,
                  patches: _Patches) -> None:
    """``Y[co, patches] = sum over K chunks of wT.T @ xk`` for columns ``[c0, c0 + cols)``, stored by runs."""
    from ._conv import _on_chip

    P, C = spec.partitions, g.cout
    ncols = xk.shape[-1]
    for m0 in range(0, C, P):
        ms = min(P, C - m0)
        acc = b.psum((ms, cols), "float32", site="conv.patch.acc", bufs=2)
        for kc, (_, _, ibn) in enumerate(chunks):
            ks = ibn * g.kw
            b.matmul(acc, _on_chip(wt, 0, ks, kc * C + m0, ((1, ms),)),
                     _on_chip(xk, 0, ks, kc * ncols + c0, ((1, cols),)), accumulate=kc > 0)
        out = b.sbuf((ms, _FMAX), out_dtype, site="conv.patch.out", bufs=2)
        _store_block(b, acc, out, m0, ms, cols, runs, biases, Y, ys, patches)
