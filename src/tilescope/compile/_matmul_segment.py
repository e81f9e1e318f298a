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
from ..lower.internal import Gemm
from ._emit import EmitStats, _Block, _dt, _region, _RowGroup, _Unfusable, _Val
from ._fusion_table import is_reduction, packet_name
from ._plan import Segment, _tensor_args, node_dtype, node_shape

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
    # column-broadcast operands (a bias): loaded whole once where they fit the group's budget,
    # not into every partition again per output block (and pass)
    for inp in group.inputs:
        if group.cls[inp] == "colvec" and n * itemsize(_dt(node_dtype(inp))) <= budget:
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
        _emit_with_row_reductions(b, group, gemm, mm, (hbm[a], a_rs, a_cs, hbm[bmat], b_rs, b_cs), (batch, m, k, n), dt,
                                  seg.keep_product)
        return
    for bi in range(batch):
        def block(acc, m0, ms, n0, ns, bi=bi):
            group.products = {mm: _Val("row", "float32", acc)}
            group.emit_block(_Block(bi * m + m0, ms, 1, n0, ns, group.lanes))

        with b.provenance(op=op, fx_node=mm.name):
            gemm.emit(hbm[a], bi * m * k, a_rs, a_cs, hbm[bmat], bi * k * n, b_rs, b_cs, m, k, n, dt, dt, block)


def _emit_with_row_reductions(b, group, gemm, mm, operands, dims, dt, keep: bool) -> None:
    """A product whose rows are reduced in the segment (a vocabulary projection's log-softmax):
    the output blocks stream through the group's passes as column chunks do, a max and the sum
    of ``exp(x - max)`` kept online per row across the blocks, straight from PSUM. Later passes
    need the product again: ``keep`` stores the values they read (the logits) in the first pass
    and reads them back, the product made once; otherwise each pass makes it again (the GEMM
    re-run, its operands re-read) -- no ``[rows, N]`` round trip through HBM at all. Per-row
    state is kept per block of rows."""
    A, a_rs, a_cs, B, b_rs, b_cs = operands
    batch, m, k, n = dims
    plan = group.plan_passes()
    per_pass, _, ready, _, n_passes, last_ready = plan
    lanes = group.lanes
    blocks = [(bi * m + m0, min(gemm.mcols, m - m0)) for bi in range(batch) for m0 in range(0, m, gemm.mcols)]
    persist: dict = {r0: {} for r0, _ in blocks}
    kept = _kept_values(group, plan) if keep else []
    _keep_in_hbm(b, group, kept)
    op = f"aten::{packet_name(mm.target)}"
    for s in range(last_ready + 1):
        for r0, ms in blocks:
            group.per_row_values(persist[r0], ready, s, _Block(r0, ms, 1, 0, min(n, 512), lanes))
        if s >= n_passes:
            continue
        accs: dict = {r0: {} for r0, _ in blocks}
        if s and kept:
            _pass_over_kept(group, _after_kept(group, plan, s, kept), kept, blocks, persist, accs, plan, s)
        else:
            group._set_order(per_pass[s])
            outputs = group.outputs
            if s == 0:  # the kept values are stored as outputs of the first pass
                group.outputs = outputs + [v for v in kept if v not in outputs]
                group._set_order(per_pass[s])
            for bi in range(batch):
                def block(acc, m0, ms, n0, ns, bi=bi, s=s, accs=accs):
                    r0 = bi * m + m0
                    group.products = {mm: _Val("row", "float32", acc)}
                    group.stream_chunk(per_pass[s], persist[r0], _Block(r0, ms, 1, n0, ns, lanes), accs[r0], plan, s)

                with b.provenance(op=op, fx_node=mm.name, label=f"pass {s + 1}" if n_passes > 1 else None):
                    gemm.emit(A, bi * m * k, a_rs, a_cs, B, bi * k * n, b_rs, b_cs, m, k, n, dt, dt, block)
            group.outputs = outputs
        for r0, ms in blocks:
            group.finish_pass(persist[r0], accs[r0], _Block(r0, ms, 1, 0, min(n, 512), lanes))


def _kept_values(group, plan) -> list:
    """The first pass's row values a later pass reads (the logits; the product itself without
    an epilogue before the reductions)."""
    per_pass, pass_of, _, _, n_passes, _ = plan
    later = [u for s in range(1, n_passes) for u in per_pass[s] if pass_of[u] >= 1]
    return [v for v in group.nodes if pass_of.get(v) == 0 and group.cls[v] == "row"
            and not is_reduction(packet_name(v.target)) and any(v in _tensor_args(u) for u in later)]


def _keep_in_hbm(b, group, kept) -> None:
    """Where each kept value is written: its output, when it is one, else an HBM scratch."""
    for v in kept:
        if v not in group.hbm:
            group.hbm[v] = b.scratch((group.rows, group.d), _dt(node_dtype(v)), name=f"kept_{v.name}")
        group.stats.kept_values.append(v.name)
        group.stats.kept_bytes += group.rows * group.d * itemsize(_dt(node_dtype(v)))


def _after_kept(group, plan, s: int, kept) -> list:
    """Pass ``s``'s nodes, from the kept values on (what only made them is not run again)."""
    per_pass, pass_of = plan[0], plan[1]
    need = {u for u in per_pass[s] if pass_of[u] >= 1}
    for u in reversed(per_pass[s]):
        if u in need:
            need |= {a for a in _tensor_args(u) if a not in kept}
    return [u for u in per_pass[s] if u in need and u not in kept]


def _pass_over_kept(group, nodes, kept, blocks, persist, accs, plan, s: int) -> None:
    """A later pass over the values the first stored: each block of rows in column chunks as
    wide as the group's budget allows (no PSUM bank to fit)."""
    _, cw = group._tiling()
    group._set_order(nodes)
    for r0, ms in blocks:
        for c0 in range(0, group.d, cw):
            blk = _Block(r0, ms, 1, c0, min(cw, group.d - c0), group.lanes)
            group.stream_chunk(nodes, persist[r0], blk, accs[r0], plan, s, loads=kept)
