"""Matmul segments: the shared GEMM, then the pointwise epilogue on each output block.

``C[M, N] = A[M, K] @ B[K, N]`` (batched for ``bmm``) is emitted by the GEMM the eager
lowering uses (:mod:`tilescope.lower._gemm`), which tiles M, N and K to what fits SBUF
and PSUM. The epilogue (bias, activation, residual, cast) runs on each ``[128, 512]``
output block as it leaves PSUM, through the segment's row group, so the matmul output
never makes a round trip to HBM.
"""

from __future__ import annotations

import torch.fx as fx

from ..dtypes import itemsize
from ..lower._gemm import Gemm
from ._emit import EmitStats, _Block, _dt, _region, _RowGroup, _Unfusable, _Val
from ._fusion_table import is_reduction, packet_name
from ._plan import Segment, node_dtype, node_shape

__all__ = ["emit_matmul"]


def _operands(node: fx.Node):
    """(bias, a, b, alpha, beta) of mm / addmm / bmm / matmul."""
    name = packet_name(node.target)
    if name == "addmm":
        bias, a, b = node.args[:3]
        return bias, a, b, node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
    return None, node.args[0], node.args[1], 1, 1


def _mm_node(seg: Segment) -> fx.Node:
    return seg.nodes[0]


def matmul_operand_shapes(seg: Segment) -> dict:
    """HBM layouts of A and B as stored: A (batch*M, K) or, transposed, (K, M);
    B (batch*K, N) or, transposed, W (N, K)."""
    _, a, bmat, _, _ = _operands(_mm_node(seg))
    a_shape, b_shape = node_shape(a), node_shape(bmat)
    batch = a_shape[0] if len(a_shape) == 3 else 1
    shapes = {a: (a_shape[1], a_shape[0]) if seg.a_transposed else (batch * a_shape[-2], a_shape[-1])}
    shapes[bmat] = (b_shape[1], b_shape[0]) if seg.b_transposed else (batch * b_shape[-2], b_shape[-1])
    return shapes


def emit_matmul(b, seg: Segment, hbm: dict, stats: EmitStats, budget: int, gemm_budget: int) -> None:
    """The shared GEMM (:mod:`tilescope.lower._gemm`), each output block through the segment's
    epilogue as it leaves PSUM."""
    mm = _mm_node(seg)
    bias, a, bmat, alpha, beta = _operands(mm)
    if alpha != 1 or beta != 1:
        raise _Unfusable("addmm with alpha or beta other than 1")
    a_shape, b_shape = node_shape(a), node_shape(bmat)
    if len(a_shape) != len(b_shape):
        raise _Unfusable("matmul of a batched and an unbatched operand")
    batch = a_shape[0] if len(a_shape) == 3 else 1
    m, k = a_shape[-2:]
    n = b_shape[-1]
    dt = _dt(node_dtype(a))
    if _dt(node_dtype(bmat)) != dt:
        raise _Unfusable("matmul operands of different dtypes")
    group = _RowGroup(b, seg, hbm, budget, stats)
    for inp in group.inputs:  # column-broadcast operands (a bias): loaded whole once when small
        if group.cls[inp] == "colvec" and n * itemsize(_dt(node_dtype(inp))) <= budget // 4:
            lanes = group.lanes
            t = b.sbuf((lanes, n), _dt(node_dtype(inp)), site=f"in:{inp.name}", bufs=1)
            with b.provenance(label="load (broadcast)", fx_node=inp.name):
                b.dma_copy(t, _region(hbm[inp], "colvec", _Block(0, lanes, 1, 0, n, lanes), n))
            group.colvec_full[inp] = t
    gemm = Gemm(b, budget=gemm_budget, load=group.load)
    # element strides of A [m, k] and B [k, n] as stored: row-major, or the transpose of a
    # contiguous matrix read as it is (every nn.Linear weight, backward's saved views)
    a_rs, a_cs = (1, m) if seg.a_transposed else (k, 1)
    b_rs, b_cs = (1, k) if seg.b_transposed else (n, 1)
    op = f"aten::{packet_name(mm.target)}"
    if any(is_reduction(packet_name(n.target)) for n in seg.nodes):
        _emit_with_row_reductions(b, group, gemm, mm, (hbm[a], a_rs, a_cs, hbm[bmat], b_rs, b_cs), (batch, m, k, n), dt)
        return
    for bi in range(batch):
        def block(acc, m0, ms, n0, ns, bi=bi):
            group.products = {mm: _Val("row", "float32", acc)}
            group.emit_block(_Block(bi * m + m0, ms, 1, n0, ns, group.lanes))

        with b.provenance(op=op, fx_node=mm.name):
            gemm.emit(hbm[a], bi * m * k, a_rs, a_cs, hbm[bmat], bi * k * n, b_rs, b_cs, m, k, n, dt, dt, block)


def _emit_with_row_reductions(b, group, gemm, mm, operands, dims, dt) -> None:
    """A product whose rows are reduced in the segment (a vocabulary projection's log-softmax):
    the output blocks stream through the group's passes as column chunks do, a max and the sum
    of ``exp(x - max)`` kept online per row across the blocks, straight from PSUM. Each pass
    makes the product again (the GEMM re-run, its operands re-read) instead of a round trip of
    the ``[rows, N]`` product through HBM; per-row state is kept per block of rows."""
    A, a_rs, a_cs, B, b_rs, b_cs = operands
    batch, m, k, n = dims
    plan = group.plan_passes()
    per_pass, _, ready, _, n_passes, last_ready = plan
    lanes = group.lanes
    blocks = [(bi * m + m0, min(gemm.mcols, m - m0)) for bi in range(batch) for m0 in range(0, m, gemm.mcols)]
    persist: dict = {r0: {} for r0, _ in blocks}
    op = f"aten::{packet_name(mm.target)}"
    for s in range(last_ready + 1):
        for r0, ms in blocks:
            group.per_row_values(persist[r0], ready, s, _Block(r0, ms, 1, 0, min(n, 512), lanes))
        if s >= n_passes:
            continue
        group._set_order(per_pass[s])
        accs: dict = {r0: {} for r0, _ in blocks}
        for bi in range(batch):
            def block(acc, m0, ms, n0, ns, bi=bi, s=s, accs=accs):
                r0 = bi * m + m0
                group.products = {mm: _Val("row", "float32", acc)}
                group.stream_chunk(per_pass[s], persist[r0], _Block(r0, ms, 1, n0, ns, lanes), accs[r0], plan, s)

            with b.provenance(op=op, fx_node=mm.name, label=f"pass {s + 1}" if n_passes > 1 else None):
                gemm.emit(A, bi * m * k, a_rs, a_cs, B, bi * k * n, b_rs, b_cs, m, k, n, dt, dt, block)
        for r0, ms in blocks:
            group.finish_pass(persist[r0], accs[r0], _Block(r0, ms, 1, 0, min(n, 512), lanes))
