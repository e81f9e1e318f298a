"""Matrix products on TensorE: mm, addmm, bmm, baddbmm, mv, and 2-D convolution.

``C[M, N] = A[M, K] @ B[K, N]`` maps onto the systolic array as
``PSUM[M, N] (+)= stationary[K, M].T @ moving[K, N]``: K on the 128 partitions
(contraction), M <= 128 stationary columns, N <= 512 moving columns (one PSUM bank of
fp32), accumulating over K tiles in PSUM. Operands are loaded in whichever
orientation their memory layout allows cheaply:

* ``A`` row-major (``[M, K]`` rows contiguous): load ``[M, K]`` tiles and transpose them
  on TensorE (a matmul against identity) into ``[K, M]`` once per row block;
  ``A`` that is a transposed view (``X.T`` with ``X`` row-major): load ``[K, M]`` directly;
* ``B`` row-major: load ``[K, N]`` directly; ``B`` a transposed view (a ``Linear``
  weight, ``W.T``): load ``[N, K]`` rows and transpose on TensorE.

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
from ._layout import hbm_input, hbm_output
from ._rules import Rule, add_rules
from ..isa import RuntimeScalar

__all__ = ["lower_matmul", "lower_conv"]

_PE_DTYPES = ("float32", "bfloat16", "float16")


def _mat(view: View, offset: int, rows: int, row_stride: int, cols: int, col_stride: int) -> View:
    ap = view.ap
    return View(view.buffer, AP(ap.buffer, ap.dtype, ap.offset + offset, ((row_stride, rows), (col_stride, cols))),
                (rows, cols))


class _Gemm:
    """Emits one ``C = epilogue(A @ B)`` on TensorE (A: M x K, B: K x N, element strides)."""

    def __init__(self, b: TileBuilder, spec, dtype: str):
        self.b = b
        self.spec = spec
        self.dtype = dtype if dtype in _PE_DTYPES else "float32"
        self.P = spec.partitions
        self.ncols = spec.matmul_moving_fmax
        self.mcols = spec.matmul_stationary_fmax
        self._ident = None

    def _load(self, src: View, rows: int, cols: int, site: str, dtype: str) -> View:
        t = self.b.sbuf((rows, cols), dtype, site=site)
        self.b.dma_copy(t, src)
        if dtype not in _PE_DTYPES:
            c = self.b.sbuf((rows, cols), "float32", site=site + ".cast")
            self.b.tensor_copy(c, t)
            return c
        return t

    def _transposed(self, src: View, rows: int, cols: int, site: str, dtype: str) -> View:
        """Load ``src`` [rows, cols] (rows <= 128, cols <= 128) and return its transpose [cols, rows] in SBUF."""
        t = self._load(src, rows, cols, site + ".rows", dtype)
        ps = self.b.psum((cols, rows), "float32", site=site + ".ps")
        self.b.transpose(ps, t)
        out = self.b.sbuf((cols, rows), t.dtype, site=site + ".T")
        self.b.tensor_copy(out, ps)
        return out

    def emit(self, A: View, a_off: int, a_rs: int, a_cs: int, B: View, b_off: int, b_rs: int, b_cs: int,
             C: View, c_off: int, c_rs: int, c_cs: int, M: int, K: int, N: int, a_dtype: str, b_dtype: str,
             out_dtype: str, epilogue=None) -> None:
        b, P = self.b, self.P
        a_transposed_view = a_rs == 1 and a_cs != 1  # A = X.T with X row-major: [K, M] rows contiguous
        b_transposed_view = b_rs == 1 and b_cs != 1  # B = W.T with W row-major: [N, K] rows contiguous
        ncols = self.mcols if b_transposed_view else self.ncols
        for m0 in range(0, M, self.mcols):
            ms = min(self.mcols, M - m0)
            # stationary tiles A^T[k-block, m-block], prepared once per row block
            stat = []
            for k0 in range(0, K, P):
                ks = min(P, K - k0)
                if a_transposed_view:
                    src = _mat(A, a_off + k0 * a_cs + m0 * a_rs, ks, a_cs, ms, a_rs)
                    stat.append(self._load(src, ks, ms, "mm.a", a_dtype))
                elif a_cs == 1 and ks <= P:
                    src = _mat(A, a_off + m0 * a_rs + k0 * a_cs, ms, a_rs, ks, a_cs)
                    stat.append(self._transposed(src, ms, ks, "mm.a", a_dtype))
                else:
                    src = _mat(A, a_off + k0 * a_cs + m0 * a_rs, ks, a_cs, ms, a_rs)
                    stat.append(self._load(src, ks, ms, "mm.a", a_dtype))
            for n0 in range(0, N, ncols):
                ns = min(ncols, N - n0)
                acc = b.psum((ms, ns), "float32", site="mm.acc")
                for kt, k0 in enumerate(range(0, K, P)):
                    ks = min(P, K - k0)
                    if b_transposed_view:
                        src = _mat(B, b_off + n0 * b_cs + k0 * b_rs, ns, b_cs, ks, b_rs)
                        mv = self._transposed(src, ns, ks, "mm.b", b_dtype)
                    else:
                        src = _mat(B, b_off + k0 * b_rs + n0 * b_cs, ks, b_rs, ns, b_cs)
                        mv = self._load(src, ks, ns, "mm.b", b_dtype)
                    b.matmul(acc, stat[kt], mv, accumulate=kt > 0)
                res = b.sbuf((ms, ns), out_dtype, site="mm.out")
                if epilogue is None:
                    b.tensor_copy(res, acc)
                else:
                    epilogue(res, acc, m0, ms, n0, ns)
                b.dma_copy(_mat(C, c_off + m0 * c_rs + n0 * c_cs, ms, c_rs, ns, c_cs), res)


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
    g = _Gemm(b, spec, a.device_dtype)
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
                epi = _epilogue(b, Bias, bias_strides, batch, bi, alpha, beta, bias, out)
            g.emit(A, a_off, a_rs, a_cs, B, b_off, b_rs, b_cs, C, c_off, c_rs, c_cs, M, K, N,
                   a.device_dtype, bm.device_dtype, out.device_dtype, epi)
    return b.build(meta={"lowering": "matmul"})


def _epilogue(b, Bias, bias_strides, batch, bi, alpha, beta, bias_meta, out):
    def emit(res, acc, m0, ms, n0, ns):
        if Bias is None:
            b.activation(res, acc, "copy", scale=_scalar(alpha))
            return
        if batch:
            bs_b, rs, cs = bias_strides[0], bias_strides[1], bias_strides[2]
            off = bi * bs_b
        elif len(bias_strides) == 2:
            rs, cs = bias_strides
            off = 0
        else:  # addmv: bias over M
            rs, cs = bias_strides[0], 0
            off = 0
        t = b.sbuf((ms, ns), bias_meta.device_dtype, site="mm.bias")
        b.dma_copy(t, _mat(Bias, off + m0 * rs + n0 * cs, ms, rs, ns, cs))
        scaled = b.sbuf((ms, ns), "float32", site="mm.epi")
        b.activation(scaled, acc, "copy", scale=_scalar(alpha))
        if _is_one(beta):
            b.tensor_tensor(res, scaled, t, "add")
        else:
            tb = b.sbuf((ms, ns), "float32", site="mm.bias_scaled")
            b.tensor_scalar(tb, t, "multiply", _scalar(beta))
            b.tensor_tensor(res, scaled, tb, "add")
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
