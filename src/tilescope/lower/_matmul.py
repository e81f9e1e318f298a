"""Matrix products on TensorE: mm, addmm, bmm, baddbmm, mv, dot.

``C[M, N] = A[M, K] @ B[K, N]`` maps onto the systolic array as
``PSUM[M, N] (+)= stationary[K, M].T @ moving[K, N]``: K on the 128 partitions
(contraction), M <= 128 stationary columns, N <= 512 moving columns (one PSUM bank of
fp32), accumulating over K tiles in PSUM -- the GEMM of :mod:`._gemm`, shared with the
compiler, which loads operands in whichever orientation their layout allows cheaply and
keeps on chip what fits.

The epilogue (``beta * bias + alpha * product``, cast to the output dtype) runs while
copying PSUM out to SBUF. Convolutions are in :mod:`._conv`.
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

__all__ = ["lower_matmul"]


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


add_rules(["mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "vdot", "addmm_", "baddbmm_", "addmv_"],
          Rule("matmul", lower_matmul, "matrix products on TensorE"))
