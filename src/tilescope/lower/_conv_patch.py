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
* **forward**: each ``[128 patches, 128 K]`` block of ``Xp.T`` is transposed on TensorE into
  ``[K, patches]`` columns, the weights (read once, one contiguous DMA per block of output
  channels) likewise into ``[K, co]``; then ``Y[co, <=512 patches]`` accumulates over K.

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

__all__ = ["patch_applies", "patch_forward", "patch_grad_weight"]

_FMAX = 512  # moving columns of one matmul (a PSUM bank of fp32)
_ACCS = 4  # PSUM accumulators of grad_weight at once (of 8 banks; the rest serve transposes)
_W_BYTES = 96 * 1024  # per partition: the transposed weights of the forward, kept for the whole execution


def patch_applies(g) -> bool:
    """Whether ``g`` (a ConvGeom) is a patch embedding: stride == kernel > 1 tap, no padding,
    no dilation, one group."""
    return (g.groups == 1 and g.taps > 1 and (g.sh, g.sw) == (g.kh, g.kw) and g.ph == 0 and g.pw == 0
            and (g.dh == 1 or g.kh == 1) and (g.dw == 1 or g.kw == 1))


def _segments(g, P: int) -> list[list[tuple[int, int, int, int, int]]]:
    """Blocks of at most ``P`` patches, each a list of ``(n, oh0, rows, ow0, cols)`` runs: whole
    output rows of one image (``cols == ow``), or a piece of one row when a row is wider than
    ``P``. A run's patches are consecutive partitions of its block."""
    blocks, cur, used = [], [], 0
    for n in range(g.n):
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


def _weights_t(b, spec, g, W: View, ws, dtype: str, nk: int, patches: _Patches) -> View:
    """``[K chunk, nk, co]``: the weights' ``[co, K]`` rows, one DMA per block of output channels,
    transposed on TensorE 128 K at a time."""
    from ._conv import _hbm, _on_chip

    P, K, C = spec.partitions, g.cin * g.taps, g.cout
    wt = b.sbuf((P, nk, C), dtype, site="conv.patch.wT", bufs=1)
    for m0 in range(0, C, P):
        ms = min(P, C - m0)
        raw = b.sbuf((ms, K), W.dtype, site="conv.patch.wraw", bufs=1)
        b.dma_copy(raw, _hbm(W, m0 * ws[0], ((ws[0], ms), (1, K))), queue=patches.queues.next())
        for kc in range(nk):
            ks = min(P, K - kc * P)
            tp = b.psum((ks, ms), "float32", site="conv.patch.T", bufs=2)
            b.transpose(tp, _on_chip(raw, 0, ms, kc * P, ((1, ks),)))
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
    from ._conv import _hbm, _on_chip

    P, K, C = spec.partitions, g.cin * g.taps, g.cout
    for m0 in range(0, C, P):
        ms = min(P, C - m0)
        acc = b.psum((ms, cols), "float32", site="conv.patch.acc", bufs=2)
        for kc in range(nk):
            ks = min(P, K - kc * P)
            b.matmul(acc, _on_chip(wt, 0, ks, kc * C + m0, ((1, ms),)),
                     _on_chip(xk, 0, ks, kc * per * P, ((1, cols),)), accumulate=kc > 0)
        out = b.sbuf((ms, per * P), out_dtype, site="conv.patch.out", bufs=2)
        o = _on_chip(out, 0, ms, 0, ((1, cols),))
        if m0 in biases:
            b.activation(o, acc, "identity", bias=biases[m0])
        else:
            b.activation(o, acc, "copy")
        for q, (n, oh0, rows, ow0, rc) in runs:
            b.dma_copy(_hbm(Y, n * ys[0] + m0 * ys[1] + oh0 * ys[2] + ow0 * ys[3],
                            ((ys[1], ms), (ys[2], rows), (ys[3], rc))),
                       _on_chip(out, 0, ms, q, ((rc, rows), (1, rc))), queue=patches.queues.next())
