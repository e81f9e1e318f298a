"""Matrix products on TensorE: mm, addmm, bmm, baddbmm, mv, and 2-D convolution.

``C[M, N] = A[M, K] @ B[K, N]`` maps onto the systolic array as
``PSUM[M, N] (+)= stationary[K, M].T @ moving[K, N]``: K on the 128 partitions
(contraction), M <= 128 stationary columns, N <= 512 moving columns (one PSUM bank of
fp32), accumulating over K tiles in PSUM -- the GEMM of :mod:`._gemm`, shared with the
compiler, which loads operands in whichever orientation their layout allows cheaply and
keeps on chip what fits.

The epilogue (``beta * bias + alpha * product``, cast to the output dtype) runs while
copying PSUM out to SBUF. Convolution (``convolution_overrideable``, 2-D, groups 1)
is the same product per kernel tap: ``out[Cout, pixels] += W[:, :, kh, kw].T @
x_shifted[Cin, pixels]``, with padding handled by accumulating each tap into the
output region it reaches.
"""

from __future__ import annotations

from ..isa import AP
from ..program import TileBuilder, View
from ._call import Call, ScalarArg, TensorMeta
from ._elementwise import broadcast_strides
from ._gemm import PE_DTYPES as _PE_DTYPES
from ._gemm import Gemm, _mat
from ._layout import hbm_input, hbm_output
from ._rules import Rule, add_rules
from ..isa import RuntimeScalar

__all__ = ["lower_matmul", "lower_conv"]


def _is_one(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 1


def _scalar(v):
    return RuntimeScalar(v.name) if isinstance(v, ScalarArg) else v


def lower_matmul(call: Call, spec):
    op = call.packet.rstrip("_")
    named = call.named()
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if out is None or out.numel == 0 or out.is_complex:
        return None
    if op in ("mm", "addmm"):
        a, bm = named.get("self" if op == "mm" else "mat1"), named.get("mat2")
        batch = None
    elif op in ("bmm", "baddbmm"):
        a, bm = named.get("self" if op == "bmm" else "batch1"), named.get("mat2" if op == "bmm" else "batch2")
        batch = True
    elif op in ("mv", "addmv"):
        a, bm = named.get("self" if op == "mv" else "mat"), named.get("vec")
        batch = None
    elif op in ("dot", "vdot"):
        a, bm = named.get("self"), named.get("tensor" if op == "dot" else "other")
        batch = None
    else:
        return None
    if not isinstance(a, TensorMeta) or not isinstance(bm, TensorMeta) or a.numel == 0 or bm.numel == 0:
        return None
    if a.is_complex or bm.is_complex:
        return None
    bias = named.get("self") if op in ("addmm", "baddbmm", "addmv") else None
    alpha, beta = named.get("alpha", 1), named.get("beta", 1)
    b = TileBuilder(call.op, spec)
    g = Gemm(b)
    with b.provenance(op=call.op):
        A = hbm_input(b, "in_a", a)
        B = hbm_input(b, "in_b", bm)
        C = hbm_output(b, "out", out)
        Bias = hbm_input(b, "in_bias", bias) if isinstance(bias, TensorMeta) and bias.numel else None
        if op in ("mv", "addmv"):
            # a vector is an N = 1 matrix
            M, K = a.shape
            dims = [(a.stride[0], a.stride[1], bm.stride[0], 1, out.stride[0], 1, M, K, 1, 0, 0, 0)]
        elif op in ("dot", "vdot"):
            # [1, K] @ [K, 1]
            K = a.shape[0]
            dims = [(K * a.stride[0], a.stride[0], bm.stride[0], 1, 1, 1, 1, K, 1, 0, 0, 0)]
        elif batch:
            Bn, M, K = a.shape
            N = bm.shape[2]
            dims = [(a.stride[1], a.stride[2], bm.stride[1], bm.stride[2], out.stride[1], out.stride[2], M, K, N,
                     i * a.stride[0], i * bm.stride[0], i * out.stride[0]) for i in range(Bn)]
        else:
            M, K = a.shape
            N = bm.shape[1]
            dims = [(a.stride[0], a.stride[1], bm.stride[0], bm.stride[1], out.stride[0], out.stride[1], M, K, N, 0, 0, 0)]
        bias_strides = None
        if Bias is not None:
            bshape = out.shape
            bias_strides = broadcast_strides(bias, bshape)
        for bi, (a_rs, a_cs, b_rs, b_cs, c_rs, c_cs, M, K, N, a_off, b_off, c_off) in enumerate(dims):
            epi = None
            if Bias is not None or not _is_one(alpha):
                epi = _epilogue(b, g, Bias, bias_strides, batch, bi, alpha, beta, bias, out, N)
            g.emit(A, a_off, a_rs, a_cs, B, b_off, b_rs, b_cs, M, K, N, a.device_dtype, bm.device_dtype,
                   _store_block(b, g, C, c_off, c_rs, c_cs, out.device_dtype, epi))
    return b.build(meta={"lowering": "matmul"})


def _store_block(b, g, C, c_off, c_rs, c_cs, out_dtype, epilogue):
    """Each finished PSUM block: the epilogue (or a plain evacuation) into SBUF, then to ``C``."""
    def block(acc, m0, ms, n0, ns):
        res = b.sbuf((ms, ns), out_dtype, site="mm.out")
        if epilogue is None:
            g._evacuate(res, acc)
        else:
            epilogue(res, acc, m0, ms, n0, ns)
        b.dma_copy(_mat(C, c_off + m0 * c_rs + n0 * c_cs, ms, c_rs, ns, c_cs), res)
    return block


def _epilogue(b, g, Bias, bias_strides, batch, bi, alpha, beta, bias_meta, out, N):
    """``alpha * product + beta * bias`` as each block leaves PSUM. A bias broadcast over the
    rows (a Linear's [N]) is read once into every partition -- as the compiler's fused epilogue
    reads it -- instead of once per block."""
    held = None
    if Bias is not None:
        if batch:
            bs_b, rs, cs = bias_strides[0], bias_strides[1], bias_strides[2]
            off = bi * bs_b
        elif len(bias_strides) == 2:
            rs, cs = bias_strides
            off = 0
        else:  # addmv: bias over M
            rs, cs = bias_strides[0], 0
            off = 0
        if rs == 0 and N * bias_meta.itemsize <= g.budget // 4:
            held = b.sbuf((g.P, N), bias_meta.device_dtype, site="mm.bias", bufs=1)
            b.dma_copy(held, _mat(Bias, off, g.P, 0, N, cs))

    def emit(res, acc, m0, ms, n0, ns):
        if Bias is None:
            b.activation(res, acc, "copy", scale=_scalar(alpha))
            return
        if held is not None:
            t = held[:ms, n0:n0 + ns]
        else:
            t = b.sbuf((ms, ns), bias_meta.device_dtype, site="mm.bias")
            b.dma_copy(t, _mat(Bias, off + m0 * rs + n0 * cs, ms, rs, ns, cs))
        product = acc
        if not _is_one(alpha):
            product = b.sbuf((ms, ns), "float32", site="mm.epi")
            b.activation(product, acc, "copy", scale=_scalar(alpha))
        if not _is_one(beta):
            tb = b.sbuf((ms, ns), "float32", site="mm.bias_scaled")
            b.tensor_scalar(tb, t, "multiply", _scalar(beta))
            t = tb
        b.tensor_tensor(res, product, t, "add")
    return emit


# ---- 2-D convolution -----------------------------------------------------------------------

def _as_2d(m: TensorMeta) -> TensorMeta:
    """A 1-D convolution's (N, C, L) operand as (N, C, 1, L)."""
    n, c, length = m.shape
    sn, sc, sl = m.stride
    return TensorMeta((n, c, 1, length), (sn, sc, sl * length, sl), m.dtype)


def _conv_args(call: Call):
    n = call.named()
    x, w, bias = n.get("input"), n.get("weight"), n.get("bias")
    if not isinstance(x, TensorMeta) or not isinstance(w, TensorMeta) or len(call.outputs) != 1:
        return None
    out = call.outputs[0]
    if n.get("transposed") or x.ndim not in (3, 4) or w.ndim != x.ndim or x.is_complex or w.is_complex:
        return None
    stride, padding, dilation = (tuple(n.get(k)) for k in ("stride", "padding", "dilation"))
    if x.ndim == 3:
        if len(stride) != 1 or len(padding) != 1 or len(dilation) != 1:
            return None
        x, w, out = _as_2d(x), _as_2d(w), _as_2d(out)
        stride, padding, dilation = (1,) + stride, (0,) + padding, (1,) + dilation
    if len(stride) != 2 or len(padding) != 2 or len(dilation) != 2:
        return None
    groups = n.get("groups", 1)
    return x, w, bias if isinstance(bias, TensorMeta) else None, out, stride, padding, dilation, groups


def lower_conv(call: Call, spec):
    parsed = _conv_args(call)
    if parsed is None:
        return None
    x, w, bias, out, (sh, sw), (ph, pw), (dh, dw), groups = parsed
    N, Cin_all, H, W = x.shape
    Cout_all, Cin, KH, KW = w.shape  # Cin: input channels per group
    _, _, OH, OW = out.shape
    if groups < 1 or Cin * groups != Cin_all or Cout_all % groups:
        return None
    Cout = Cout_all // groups
    if out.numel == 0 or x.numel == 0:
        return None
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        X = hbm_input(b, "in_input", x)
        Wt = hbm_input(b, "in_weight", w)
        Y = hbm_output(b, "out", out)
        Bv = hbm_input(b, "in_bias", bias) if bias is not None and bias.numel else None
        try:
            for g in range(groups):
                _conv_group(b, spec, x, w, out, bias, X, Wt, Y, Bv, g * Cin, g * Cout, Cin, Cout,
                            (sh, sw), (ph, pw), (dh, dw))
        except _NoConv:
            return None
    return b.build(meta={"lowering": "conv"})


def _conv_group(b, spec, x, w, out, bias, X, Wt, Y, Bv, ci_base, co_base, Cin, Cout, strides, pads, dils):
    """One group's convolution: output channels [co_base, co_base + Cout) from input channels
    [ci_base, ci_base + Cin)."""
    (sh, sw), (ph, pw), (dh, dw) = strides, pads, dils
    N, _, H, W = x.shape
    _, _, KH, KW = w.shape
    _, _, OH, OW = out.shape
    P = spec.partitions
    xs, ws, ys = x.stride, w.stride, out.stride
    rows_per_tile = max(1, min(OH, spec.matmul_moving_fmax // OW)) if OW <= spec.matmul_moving_fmax else 0
    if rows_per_tile == 0:
        raise _NoConv  # an output row wider than one PSUM bank: generic
    ci_tiles = [(c0, min(P, Cin - c0)) for c0 in range(0, Cin, P)]
    for co0 in range(0, Cout, spec.matmul_stationary_fmax):
        cos = min(spec.matmul_stationary_fmax, Cout - co0)
        # weights per tap and input-channel block: W[co, ci, kh, kw] as stationary [ci, co]
        wt = {}
        for kh in range(KH):
            for kw in range(KW):
                for ci0, cis in ci_tiles:
                    t = b.sbuf((cis, cos), w.device_dtype, site=f"conv.w{kh}.{kw}.{ci0}", bufs=1)
                    off = (co_base + co0) * ws[0] + ci0 * ws[1] + kh * ws[2] + kw * ws[3]
                    b.dma_copy(t, View(Wt.buffer, AP(Wt.ap.buffer, Wt.ap.dtype, Wt.ap.offset + off,
                                                     ((ws[1], cis), (ws[0], cos))), (cis, cos)))
                    wt[kh, kw, ci0] = t
        bias_t = None
        if Bv is not None:
            bias_t = b.sbuf((cos, 1), bias.device_dtype, site="conv.bias", bufs=1)
            b.dma_copy(bias_t, View(Bv.buffer, AP(Bv.ap.buffer, Bv.ap.dtype,
                                                  Bv.ap.offset + (co_base + co0) * bias.stride[0],
                                                  ((bias.stride[0], cos), (1, 1))), (cos, 1)))
        for n in range(N):
            for oh0 in range(0, OH, rows_per_tile):
                nr = min(rows_per_tile, OH - oh0)
                acc = b.psum((cos, nr * OW), "float32", site="conv.acc")
                b.memset(acc, 0.0)
                for kh in range(KH):
                    # output rows of this tile whose input row is inside the image
                    r_lo = max(oh0, _ceil_div(ph - kh * dh, sh))
                    r_hi = min(oh0 + nr, _floor_div(H - 1 + ph - kh * dh, sh) + 1)
                    if r_lo >= r_hi:
                        continue
                    for kw in range(KW):
                        c_lo = max(0, _ceil_div(pw - kw * dw, sw))
                        c_hi = min(OW, _floor_div(W - 1 + pw - kw * dw, sw) + 1)
                        if c_lo >= c_hi:
                            continue
                        nrr, ncc = r_hi - r_lo, c_hi - c_lo
                        for ci0, cis in ci_tiles:
                            ih0 = r_lo * sh - ph + kh * dh
                            iw0 = c_lo * sw - pw + kw * dw
                            off = n * xs[0] + (ci_base + ci0) * xs[1] + ih0 * xs[2] + iw0 * xs[3]
                            t = b.sbuf((cis, nrr * ncc), x.device_dtype, site="conv.x")
                            src = AP(X.ap.buffer, X.ap.dtype, X.ap.offset + off,
                                     ((xs[1], cis), (sh * xs[2], nrr), (sw * xs[3], ncc)))
                            b.dma_copy(t, View(X.buffer, src, (cis, nrr, ncc)))
                            mv = t
                            if x.device_dtype not in _PE_DTYPES:
                                mv = b.sbuf((cis, nrr * ncc), "float32", site="conv.xc")
                                b.tensor_copy(mv, t)
                            dst = AP(acc.ap.buffer, acc.ap.dtype, acc.ap.offset + (r_lo - oh0) * OW + c_lo,
                                     ((nr * OW, cos), (OW, nrr), (1, ncc)))
                            b.matmul(View(acc.buffer, dst, (cos, nrr, ncc)), wt[kh, kw, ci0], mv, accumulate=True)
                res = b.sbuf((cos, nr * OW), out.device_dtype, site="conv.out")
                if bias_t is not None:
                    b.activation(res, acc, "identity", bias=bias_t)
                else:
                    b.tensor_copy(res, acc)
                off = n * ys[0] + (co_base + co0) * ys[1] + oh0 * ys[2]
                b.dma_copy(View(Y.buffer, AP(Y.ap.buffer, Y.ap.dtype, Y.ap.offset + off,
                                             ((ys[1], cos), (ys[2], nr), (ys[3], OW))), (cos, nr, OW)), res)


class _NoConv(Exception):
    """The convolution is outside what the TensorE form handles."""


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _floor_div(a: int, b: int) -> int:
    return a // b


add_rules(["mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "vdot", "addmm_", "baddbmm_", "addmv_"],
          Rule("matmul", lower_matmul, "matrix products on TensorE"))
add_rules(["convolution_overrideable", "convolution"], Rule("conv", lower_conv, "2-D convolution on TensorE"))
