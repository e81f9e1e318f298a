"""Matmul segments: TensorE over K tiles into PSUM, then the pointwise epilogue.

``C[M, N] = A[M, K] @ B[K, N]`` (batched for ``bmm``). TensorE contracts over the
partition dim, so each 128x128 block of A is transposed on TensorE (a matmul
against identity) into PSUM and copied to SBUF as the stationary operand; B's
``[128, N]`` row blocks are the moving operand, 512 columns (one PSUM bank of fp32)
at a time. The epilogue (bias, activation, residual, cast) runs on each output
block as it leaves PSUM, so the matmul output never makes a round trip to HBM.
"""

from __future__ import annotations

import torch.fx as fx

from ..dtypes import itemsize
from ._emit import P, EmitStats, _dt, _RowGroupEmitter, _Unfusable, _Val, _broadcast_rows
from ._ops import packet_name
from ._plan import Segment, node_dtype, node_shape, value_class

__all__ = ["emit_matmul"]

N_BLOCK = 512  # moving free size: one PSUM bank of fp32
K_BLOCK = 128


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


def emit_matmul(b, seg: Segment, hbm: dict, stats: EmitStats) -> None:
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
    out_dt = _dt(node_dtype(mm))
    a_full = hbm[a]  # (batch*m, k) in HBM, or A.T (k, m) when a_transposed
    w_full = hbm[bmat] if seg.b_transposed else None  # W (n, k): B = W.T
    b_full = None if seg.b_transposed else hbm[bmat]  # (batch*k, n)

    spec = b.spec
    kt_count = -(-k // K_BLOCK)
    b_resident_bytes = kt_count * n * itemsize(dt)
    keep_b = b_resident_bytes <= spec.sbuf_bytes_per_partition // 4
    epilogue = seg.nodes[seg.nodes.index(mm) + 1:]
    space_rows = batch * m

    for bi in range(batch):
        b_tiles: dict[int, object] = {}

        def b_tile(j):
            if j in b_tiles:
                return b_tiles[j]
            k0, kn = j * K_BLOCK, min(K_BLOCK, k - j * K_BLOCK)
            t = b.sbuf((kn, n), dt, site=f"mm:B{j}" if keep_b else "mm:B", bufs=1 if keep_b else 2)
            if w_full is None:
                with b.provenance(op=f"aten::{packet_name(mm.target)}", fx_node=mm.name, label="load B"):
                    b.dma_copy(t, b_full[bi * k + k0: bi * k + k0 + kn])
            else:
                # B[k-block, :] = W[:, k-block].T, 128 rows of W at a time through TensorE
                with b.provenance(op=f"aten::{packet_name(mm.target)}", fx_node=mm.name, label="W transpose"):
                    for r0, rn in b.tiles(n, P):
                        wt = b.sbuf((rn, kn), dt, site="mm:W")
                        b.dma_copy(wt, w_full[r0:r0 + rn, k0:k0 + kn])
                        tp = b.psum((kn, rn), "float32", site="mm:WT_psum")
                        b.transpose(tp, wt)
                        b.tensor_copy(t[:, r0:r0 + rn], tp, engine="act" if (r0 // P) % 2 else "dve")
            if keep_b:
                b_tiles[j] = t
            return t

        for m0, mn in b.tiles(m, P):
            # stationary operands: A^T blocks [kn, mn], transposed on TensorE
            at_tiles = []
            for j in range(kt_count):
                k0, kn = j * K_BLOCK, min(K_BLOCK, k - j * K_BLOCK)
                if seg.a_transposed:  # A.T is stored contiguously: load the stationary block as is
                    with b.provenance(op=f"aten::{packet_name(mm.target)}", fx_node=mm.name, label="load A.T"):
                        at = b.sbuf((kn, mn), dt, site=f"mm:AT{j}", bufs=2)
                        b.dma_copy(at, a_full[k0:k0 + kn, m0:m0 + mn])
                    at_tiles.append(at)
                    continue
                with b.provenance(op=f"aten::{packet_name(mm.target)}", fx_node=mm.name, label="A transpose"):
                    a_t = b.sbuf((mn, kn), dt, site="mm:A")
                    b.dma_copy(a_t, a_full[bi * m + m0: bi * m + m0 + mn, k0:k0 + kn])
                    tp = b.psum((kn, mn), "float32", site="mm:AT_psum")
                    b.transpose(tp, a_t)
                    at = b.sbuf((kn, mn), dt, site=f"mm:AT{j}", bufs=2)
                    b.tensor_copy(at, tp, engine="act" if j % 2 else "dve")
                at_tiles.append(at)
            for n0, nn in b.tiles(n, N_BLOCK):
                acc = b.psum((mn, nn), "float32", site="mm:acc")
                with b.provenance(op=f"aten::{packet_name(mm.target)}", fx_node=mm.name):
                    for j in range(kt_count):
                        b.matmul(acc, at_tiles[j], b_tile(j)[:, n0:n0 + nn], accumulate=j > 0)
                _epilogue(b, seg, mm, bias, acc, hbm, stats, rows=bi * m + m0, mn=mn, n0=n0, nn=nn,
                          out_dt=out_dt, space_rows=space_rows, n_total=n, epilogue=epilogue)


def _epilogue(b, seg, mm, bias, acc, hbm, stats, *, rows, mn, n0, nn, out_dt, space_rows, n_total,
              epilogue) -> None:
    """Apply the epilogue to one [mn, nn] output block and store every segment output."""
    block = Segment("rowgroup", seg.nodes, space=(space_rows, nn))
    block.outputs = seg.outputs
    em = _RowGroupEmitter(b, block, budget=b.spec.sbuf_bytes_per_partition // 4, stats=stats)
    em._r0 = rows
    em.cd = n_total
    env: dict = {}
    first = _Val("row", "float32", acc, width=nn)
    if bias is not None:
        bcls = value_class(node_shape(bias), space_rows, n_total)
        bdt = _dt(node_dtype(bias))
        t = b.sbuf((P if bcls != "row" else mn, nn), bdt, site="mm:bias")
        with b.provenance(fx_node=bias.name, label="load bias"):
            if bcls == "colvec":
                b.dma_copy(t, _broadcast_rows(hbm[bias][0:1, n0:n0 + nn], nn))
                bval = _Val("colvec", bdt, t, once=True, width=nn)
            elif bcls == "row":
                b.dma_copy(t, hbm[bias][rows:rows + mn, n0:n0 + nn])
                bval = _Val("row", bdt, t, width=nn)
            else:
                raise _Unfusable("addmm bias that is neither [N] nor [M, N]")
        out = b.sbuf((mn, nn), out_dt, site="mm:out")
        with b.provenance(op="aten::addmm", fx_node=mm.name, label="bias"):
            b.tensor_tensor(out, acc, bval.tile[:mn], "add")
        first = _Val("row", out_dt, out, width=nn)
    elif not epilogue:
        out = b.sbuf((mn, nn), out_dt, site="mm:out")
        with b.provenance(op=f"aten::{packet_name(mm.target)}", fx_node=mm.name, label="evacuate PSUM"):
            b.tensor_copy(out, acc)
        first = _Val("row", out_dt, out, width=nn)
    env[mm] = first
    em.pos = 1
    for k, node in enumerate(epilogue, start=1):
        em.pos = k
        for inp in [x for x in node.args if isinstance(x, fx.Node)]:
            if inp in env:
                continue
            cls = value_class(node_shape(inp), space_rows, n_total)
            dt = _dt(node_dtype(inp))
            with b.provenance(label="load", fx_node=inp.name):
                if cls == "row":
                    t = b.sbuf((mn, nn), dt, site=f"in:{inp.name}")
                    b.dma_copy(t, hbm[inp][rows:rows + mn, n0:n0 + nn])
                    env[inp] = _Val("row", dt, t, width=nn)
                elif cls == "colvec":
                    t = b.sbuf((P, nn), dt, site=f"in:{inp.name}")
                    b.dma_copy(t, _broadcast_rows(hbm[inp][0:1, n0:n0 + nn], nn))
                    env[inp] = _Val("colvec", dt, t, once=True, width=nn)
                elif cls in ("rowvec", "scalar"):
                    t = b.sbuf((mn, 1), dt, site=f"in:{inp.name}")
                    src = hbm[inp][rows:rows + mn] if cls == "rowvec" else _broadcast_rows(hbm[inp][0:1, 0:1], 1)[:mn]
                    b.dma_copy(t, src)
                    env[inp] = _Val("rowvec", dt, t, width=1)
                else:
                    raise _Unfusable(f"epilogue operand {inp.name} does not fit the output block")
        with b.provenance(op=f"aten::{packet_name(node.target)}", fx_node=node.name):
            try:
                env[node] = em._emit_node(env, node, rows, mn)
            except _Unfusable as e:
                e.node = getattr(e, "node", None) or node
                raise
    for out in seg.outputs:
        v = env[out]
        tile = v.tile
        if tile.buffer.memory == "psum":
            t = b.sbuf((mn, nn), v.dtype if v.dtype != "float32" else _dt(node_dtype(out)), site="mm:evac")
            b.tensor_copy(t, tile)
            tile = t
        with b.provenance(label="store", fx_node=out.name):
            b.dma_copy(hbm[out][rows:rows + mn, n0:n0 + nn], tile[:mn])
