"""Scatters as indirect DMA: ``index_add``, ``embedding_dense_backward``, ``index_put``,
``scatter`` / ``scatter_add`` / ``scatter_reduce``.

Two addressing forms, as for gathers (:mod:`._gather`):

* **rows** (``index_add``, ``index_put`` / ``x[idx] += v``, embedding backward): one index
  per partition; a combining scatter merges the rows of equal indices on TensorE
  (``E.T @ values``), gathers the rows it touches, adds on VectorE and scatters them back
  (:mod:`._indirect`);
* **elements** (``scatter*``): the positions of ``index`` with the scattered dim last, so
  that equal targets can only meet within one row of a tile; VectorE merges them
  (a masked reduction over the row's group of at most 16 positions), then the same
  gather / combine / scatter.

A functional form (``index_add``, ``scatter``) first copies ``self`` into the output (a
DMA of the whole tensor: the result is a new tensor); the in-place forms (``index_add_``,
``index_put_``) touch only the rows they name. Embedding backward writes its dense
``[num_weights, dim]`` gradient: zeros, then the rows the indices touch.
Tiles of a combining scatter run one after another: any of them may touch the rows the
next one reads.
"""

from __future__ import annotations

from itertools import product

from ..isa import AP, RuntimeScalar
from ..program import TileBuilder, View
from ._call import Call, ScalarArg, TensorMeta
from ._gather import RowGather, _broadcast, _bstrides, _flat_stride, _index_layout, _index_ok
from ._indirect import (
    ELEMENT_OPS, as_vectors, build_eq, descriptors, fits_or_declines, merge_chunks, merge_elements, row_blocks, sb,
    table_ap, wrap_negative,
)
from ._layout import coalesce, hbm_input, hbm_output
from ._movement import _copy_into, _fill
from ._rules import Rule, add_rules

__all__ = ["lower_index_add", "lower_embedding_backward", "lower_index_put", "lower_scatter"]

_TILE_BYTES = 16 * 1024  # bytes per partition of one row chunk
_GROUP = 16  # positions of one row merged together (element scatters)
_ELEM_FREE = 512  # positions per partition of one element tile


def _scalar(v):
    if isinstance(v, ScalarArg):
        return RuntimeScalar(v.name)
    return v


def _target(b: TileBuilder, call: Call, x: TensorMeta, xv_name: str = "in_self"):
    """The view scatters write: ``self`` itself for in-place forms, else a fresh output that
    starts as a copy of ``self`` (returned with the input view)."""
    xv = hbm_input(b, xv_name, x)
    if call.packet.endswith("_"):
        b.mark_output(xv)
        return xv
    out = call.outputs[0]
    ov = hbm_output(b, "out", out)
    _copy_into(b, b.spec, x, xv, out, ov, out.shape, x.stride, out.stride, "scatter.copy")
    return ov


def scatter_rows(b: TileBuilder, spec, g: RowGather, tv: View, vv: View, index_views, n: int, sizes, *,
                 combine: bool, wrap: bool, alpha=None, skip_index=None, site: str = "scatter") -> bool:
    """Scatter the ``n`` rows of ``vv`` (laid out as ``g.out``) into ``tv`` (``g.x``) at the rows the
    indices name: overwrite, or (``combine``) add -- equal indices merged first, one tile after
    another. ``alpha`` scales the rows; rows whose index equals ``skip_index`` are dropped."""
    isz = max(g.x.itemsize, 4)
    chunks = list(g.column_chunks(max(1, _TILE_BYTES // isz)))
    if not chunks:
        return False
    P = spec.partitions
    dt = g.x.device_dtype
    for x_off, v_off in g.outers():
        for r0, p, _ in row_blocks(n, 1, P):
            cols, rows_b = [], []
            for j, (iv, istride) in enumerate(index_views):
                t = b.sbuf((p, 1), iv.dtype, site=f"{site}.idx{j}")
                b.dma_copy(t, View(iv.buffer, AP(iv.ap.buffer, iv.ap.dtype, iv.ap.offset + r0 * istride,
                                                 ((istride, p), (1, 1))), (p, 1)))
                cols.append((t, sizes[j], g.mults[j]))
            desc = descriptors(b, (p, 1), cols, wrap=wrap, site=f"{site}.dge")
            eq = None
            if combine:
                pairs = []
                for j, (iv, istride) in enumerate(index_views):
                    row = b.sbuf((p, p), iv.dtype, site=f"{site}.row{j}")
                    b.dma_copy(row, View(iv.buffer, AP(iv.ap.buffer, iv.ap.dtype, iv.ap.offset + r0 * istride,
                                                       ((0, p), (istride, p))), (p, p)))
                    col = cols[j][0]
                    if wrap:  # -1 and size-1 name the same row
                        row, col = wrap_negative(b, row, sizes[j], f"{site}.row{j}"), wrap_negative(b, col, sizes[j], f"{site}.col{j}")
                    pairs.append((col, row))
                keep = None
                if skip_index is not None:
                    keep = b.sbuf((p, 1), "float32", site=f"{site}.keep")
                    b.tensor_scalar(keep, cols[0][0], "not_equal", float(skip_index))
                eq = build_eq(b, pairs, p, keep, site=f"{site}.merge")
            for cx, cv, cw, xdims, vdims in chunks:
                vals = b.sbuf((p, cw), vv.dtype, site=f"{site}.vals")
                src = AP(vv.ap.buffer, vv.ap.dtype, vv.ap.offset + v_off + cv + r0 * g.out_pos_stride,
                         ((g.out_pos_stride, p),) + tuple(vdims))
                b.dma_copy(sb(vals, (p,) + tuple(c for _, c in vdims)), View(vv.buffer, src, (p,) + tuple(c for _, c in vdims)))
                table = table_ap(tv, x_off + cx, g.row_stride, g.rows, xdims)
                if not combine:
                    b.dma_indirect(table, vals, desc, indirect="dst")
                    continue
                if alpha is not None:
                    b.tensor_scalar(vals, vals, "multiply", alpha)
                old = b.sbuf((p, cw), dt, site=f"{site}.old")
                b.dma_indirect(old, table, desc)
                new = b.sbuf((p, cw), dt, site=f"{site}.new")
                for c0, w, ps in merge_chunks(b, spec, eq, vals, p, cw, site=f"{site}.merge"):
                    b.tensor_tensor(new[:, c0:c0 + w], old[:, c0:c0 + w], ps, "add")
                b.dma_indirect(table, new, desc, indirect="dst")
    return True


def lower_index_add(call: Call, spec):
    """``index_add(self, dim, index, source, alpha)``: ``self[.., index[i], ..] += alpha * source[.., i, ..]``."""
    call = as_vectors(call)
    named = call.named()
    x, idx, src = named.get("self"), named.get("index"), named.get("source")
    if not all(isinstance(t, TensorMeta) for t in (x, src)) or not _index_ok(idx) or x.is_complex:
        return None
    if x.ndim == 0 or src.ndim != x.ndim or src.dtype != x.dtype or call.outputs[0].numel == 0:
        return None
    dim = named.get("dim", 0) % x.ndim
    istride = _flat_stride(idx.shape, idx.stride)
    if istride is None or idx.numel != src.shape[dim]:
        return None
    alpha = _scalar(named.get("alpha", 1))
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        tv = _target(b, call, x)
        target = call.outputs[0]
        vv, iv = hbm_input(b, "in_source", src), hbm_input(b, "in_index", idx)
        g = RowGather(target, dim, dim, (1,), target.shape[dim], target.stride[dim], src, dim, dim, src.stride[dim])
        if idx.numel and not scatter_rows(b, spec, g, tv, vv, [(iv, istride)], idx.numel, (target.shape[dim],),
                                          combine=True, wrap=False, alpha=None if alpha == 1 else alpha):
            return None
    if b.instruction_count == 0:
        return None  # nothing to move (an empty index written in place): the generic form
    return b.build(meta={"lowering": "indirect"})


def lower_embedding_backward(call: Call, spec):
    """``embedding_dense_backward``: the ``[num_weights, dim]`` gradient -- zeros, then every
    gradient row added into the row its index names (``padding_idx`` rows dropped)."""
    named = call.named()
    grad, idx = named.get("grad_output"), named.get("indices")
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if not isinstance(grad, TensorMeta) or not _index_ok(idx) or out is None or out.ndim != 2 or grad.is_complex:
        return None
    if named.get("scale_grad_by_freq"):
        return None  # needs every index's count over the whole batch first: generic
    n, d = idx.numel, out.shape[1]
    if grad.numel != n * d or out.numel == 0:
        return None
    istride = _flat_stride(idx.shape, idx.stride)
    if istride is None or grad.ndim < 1 or grad.shape[-1] != d:
        return None
    g_pos = _flat_stride(grad.shape[:-1], grad.stride[:-1]) if grad.ndim > 1 else 0
    g_col = grad.stride[-1]
    if g_pos is None:
        return None
    rows = TensorMeta((n, d), (g_pos, g_col), grad.dtype)
    pad = named.get("padding_idx", -1)
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        gv, iv, ov = hbm_input(b, "in_grad_output", grad), hbm_input(b, "in_indices", idx), hbm_output(b, "out", out)
        _fill(b, spec, ov, out, 0.0, site="emb_bwd.zero")
        g = RowGather(out, 0, 0, (1,), out.shape[0], out.stride[0], rows, 0, 0, g_pos)
        if n and not scatter_rows(b, spec, g, ov, gv, [(iv, istride)], n, (out.shape[0],), combine=True, wrap=False,
                                  skip_index=pad if pad is not None and pad >= 0 else None, site="emb_bwd"):
            return None
    if b.instruction_count == 0:
        return None  # nothing to move (an empty index written in place): the generic form
    return b.build(meta={"lowering": "indirect"})


def lower_index_put(call: Call, spec):
    """``index_put(self, indices, values, accumulate)`` (and ``x[idx] = v`` / ``x[idx] += v`` in place):
    rows named by integer index tensors on adjacent dims, overwritten or (``accumulate``) added."""
    named = call.named()
    x, indices, vals = named.get("self"), named.get("indices"), named.get("values")
    if not isinstance(x, TensorMeta) or not isinstance(vals, TensorMeta) or not isinstance(indices, tuple):
        return None
    if x.is_complex or x.ndim == 0 or vals.dtype != x.dtype or call.outputs[0].numel == 0:
        return None
    lay = _index_layout(x, indices)
    if lay is None:
        return None
    first, last, tensors = lay
    bshape = _broadcast([t.shape for t in tensors])
    if bshape is None:
        return None
    inner = tuple(x.shape[last + 1:])
    full = tuple(x.shape[:first]) + bshape + inner
    if _broadcast([vals.shape, full]) != full:
        return None
    nb = len(bshape)
    vstr = _bstrides(vals, full)
    cshape, cstr = coalesce(bshape or (1,), [vstr[first:first + nb] or (0,)] + [_bstrides(t, bshape) or (0,) for t in tensors])
    if len(cshape) != 1:
        return None
    n = cshape[0]
    vmeta = TensorMeta(full, vstr, vals.dtype)
    if len(tensors) == 1:
        mults, rows, row_stride = (1,), x.shape[first], x.stride[first]
    else:
        mults = tuple(x.stride[d] for d in range(first, last + 1))
        rows = 1 + sum((x.shape[d] - 1) * x.stride[d] for d in range(first, last + 1))
        row_stride = 1
    accumulate = bool(named.get("accumulate", False))
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        tv = _target(b, call, x)
        target = call.outputs[0]
        vv = hbm_input(b, "in_values", vals)
        views = [(hbm_input(b, f"in_indices{j}", t), cstr[j + 1][0] if n > 1 else 0) for j, t in enumerate(tensors)]
        g = RowGather(target, first, last, mults, rows, row_stride, vmeta, first, first + nb - 1,
                      cstr[0][0] if n > 1 else 0)
        sizes = tuple(x.shape[d] for d in range(first, last + 1))
        if not scatter_rows(b, spec, g, tv, vv, views, n, sizes, combine=accumulate, wrap=True):
            return None
    if b.instruction_count == 0:
        return None  # nothing to move (an empty index written in place): the generic form
    return b.build(meta={"lowering": "indirect"})


# legacy ``scatter(..., reduce=)`` names -> scatter_reduce's
_LEGACY = {"add": "sum", "multiply": "prod"}


def _scatter_form(call: Call, named):
    """(reduce op or None, include_self, value-or-src) of a scatter-family call, or None."""
    p = call.packet.rstrip("_")
    if p == "scatter_add":
        return "sum", True
    if p == "scatter_reduce":
        return named.get("reduce"), bool(named.get("include_self", True))
    reduce = named.get("reduce")
    if reduce is None:
        return None, True
    return _LEGACY.get(reduce), True


def lower_scatter(call: Call, spec):
    """``scatter`` / ``scatter_add`` / ``scatter_reduce`` (sum, prod, amax, amin, mean): elements of
    ``src`` (or one value) into ``self`` at ``index`` along ``dim``."""
    call = as_vectors(call)
    named = call.named()
    x, idx = named.get("self"), named.get("index")
    src = named.get("src", named.get("value"))
    if not isinstance(x, TensorMeta) or not _index_ok(idx) or x.is_complex or x.ndim == 0:
        return None
    if idx.ndim != x.ndim or call.outputs[0].numel == 0:
        return None
    op, include_self = _scatter_form(call, named)
    if op is not None and op not in ELEMENT_OPS and op != "mean":
        return None
    floats = ("float32", "bfloat16", "float16")
    if op in ("amax", "amin", "prod", "mean") and not include_self and x.dtype not in floats:
        return None
    if op == "mean" and x.dtype not in floats:
        return None  # an integer mean divides with floor: not modeled
    if isinstance(src, TensorMeta):
        if src.dtype != x.dtype or src.ndim != x.ndim or any(s < i for s, i in zip(src.shape, idx.shape)):
            return None
    dim = named.get("dim", 0) % x.ndim
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        tv = _target(b, call, x)
        target = call.outputs[0]
        iv = hbm_input(b, "in_index", idx)
        sv = hbm_input(b, "in_src", src) if isinstance(src, TensorMeta) else None
        if idx.numel:
            _scatter_elements(b, spec, target, tv, idx, iv, src, sv, dim, op, include_self)
    if b.instruction_count == 0:
        return None  # nothing to move (an empty index written in place): the generic form
    return b.build(meta={"lowering": "indirect"})


def _scatter_elements(b, spec, x: TensorMeta, tv: View, idx: TensorMeta, iv: View, src, sv, dim: int, op,
                      include_self: bool) -> None:
    others = [d for d in range(x.ndim) if d != dim]
    metas = [idx] + ([src] if sv is not None else [])
    oshape, ostr = coalesce(tuple(idx.shape[d] for d in others) or (1,),
                            [tuple(m.stride[d] for d in others) or (0,) for m in metas] + [tuple(x.stride[d] for d in others) or (0,)])
    rows = 1
    for n in oshape:
        rows *= n
    if len(oshape) > 1:  # loop over the outer dims, the innermost goes on the partitions
        outer_shape, outer_str = oshape[:-1], [s[:-1] for s in ostr]
        oshape, ostr = oshape[-1:], [s[-1:] for s in ostr]
    else:
        outer_shape, outer_str = (), [() for _ in ostr]
    nrow = oshape[0]
    cols = idx.shape[dim]
    cstr = [m.stride[dim] for m in metas] + [0]
    g = min(cols, _GROUP) if op is not None else min(cols, _ELEM_FREE)
    k_max = max(1, _ELEM_FREE // g)
    table = table_ap(tv, 0, 1, max(x.extent, 1), ())
    dt = x.device_dtype
    value = _scalar(src) if sv is None else None
    passes = ["fill", "main"] if (op is not None and not include_self) else ["main"]
    sums = counts = None
    if op == "mean":
        # a mean needs each target's count over all tiles: sums and counts gather in scratch tensors
        # laid out as the target (touched at the targets only), then every target gets sum / count
        passes = ["start", "main", "finish"]
        sums = table_ap(b.scratch((max(x.extent, 1),), "float32", name="mean_sums"), 0, 1, max(x.extent, 1), ())
        counts = table_ap(b.scratch((max(x.extent, 1),), "float32", name="mean_counts"), 0, 1, max(x.extent, 1), ())
    for stage in passes:
        for opos in product(*(range(n) for n in outer_shape)):
            offs = [sum(i * s for i, s in zip(opos, st)) for st in outer_str]
            for c0 in range(0, cols, g):
                cw = min(g, cols - c0)
                for r0, p, k in row_blocks(nrow, k_max, spec.partitions):
                    def ap_of(j, view):
                        base = offs[j] + r0 * ostr[j][0] + c0 * cstr[j]
                        return View(view.buffer, AP(view.ap.buffer, view.ap.dtype, view.ap.offset + base,
                                                    ((k * ostr[j][0], p), (ostr[j][0], k), (cstr[j], cw))), (p, k, cw))
                    it = b.sbuf((p, k * cw), idx.device_dtype, site="scatter.idx")
                    b.dma_copy(sb(it, (p, k, cw)), ap_of(0, iv))
                    base = b.sbuf((p, k * cw), "int64", site="scatter.iota")
                    xs = ostr[-1][0]
                    start = offs[-1] + r0 * xs
                    b.iota(sb(base, (p, k, cw)), base=start, partition_step=k * xs, steps=(xs, 0))
                    desc = descriptors(b, (p, k * cw), [(it, x.shape[dim], x.stride[dim])], base=base,
                                       site="scatter.dge")
                    vals = b.sbuf((p, k * cw), dt, site="scatter.vals")
                    if stage == "fill":
                        b.memset(vals, ELEMENT_OPS[op][0])
                        b.dma_indirect(table, vals, desc, indirect="dst")
                        continue
                    if stage == "start":  # sums start at self (or 0), counts at 1 (or 0)
                        s0 = b.sbuf((p, k * cw), "float32", site="scatter.s0")
                        if include_self:
                            b.dma_indirect(vals, table, desc)
                            b.tensor_copy(s0, vals)
                        else:
                            b.memset(s0, 0.0)
                        b.dma_indirect(sums, s0, desc, indirect="dst")
                        c0t = b.sbuf((p, k * cw), "float32", site="scatter.c0")
                        b.memset(c0t, 1.0 if include_self else 0.0)
                        b.dma_indirect(counts, c0t, desc, indirect="dst")
                        continue
                    if stage == "finish":  # each target: sum / count (the same value however often named)
                        s1 = b.sbuf((p, k * cw), "float32", site="scatter.s1")
                        c1 = b.sbuf((p, k * cw), "float32", site="scatter.c1")
                        b.dma_indirect(s1, sums, desc)
                        b.dma_indirect(c1, counts, desc)
                        b.tensor_tensor(vals, s1, c1, "divide")
                        b.dma_indirect(table, vals, desc, indirect="dst")
                        continue
                    if sv is not None:
                        b.dma_copy(sb(vals, (p, k, cw)), ap_of(1, sv))
                    else:
                        b.memset(vals, 0.0)
                        b.tensor_scalar(vals, vals, "add", value)
                    if op is None:
                        b.dma_indirect(table, vals, desc, indirect="dst")
                        continue
                    if op == "mean":
                        for acc, v in ((sums, vals), (counts, None)):
                            if v is None:
                                v = b.sbuf((p, k * cw), "float32", site="scatter.one")
                                b.memset(v, 1.0)
                            merged = merge_elements(b, desc, v, (p, k, cw), "sum", site="scatter.merge") if cw > 1 else v
                            old = b.sbuf((p, k * cw), "float32", site="scatter.old")
                            b.dma_indirect(old, acc, desc)
                            new = b.sbuf((p, k * cw), "float32", site="scatter.new")
                            b.tensor_tensor(new, old, merged, "add")
                            b.dma_indirect(acc, new, desc, indirect="dst")
                        continue
                    merged = merge_elements(b, desc, vals, (p, k, cw), op, site="scatter.merge") if cw > 1 else vals
                    old = b.sbuf((p, k * cw), dt, site="scatter.old")
                    b.dma_indirect(old, table, desc)
                    new = b.sbuf((p, k * cw), dt, site="scatter.new")
                    b.tensor_tensor(new, old, merged, ELEMENT_OPS[op][2])
                    b.dma_indirect(table, new, desc, indirect="dst")


add_rules(["index_add", "index_add_"], Rule("indirect", fits_or_declines(lower_index_add), "index_add: merge, gather, add, scatter"))
add_rules(["embedding_dense_backward"], Rule("indirect", fits_or_declines(lower_embedding_backward),
                                             "embedding backward: zeros, then rows added by index"))
add_rules(["index_put", "index_put_", "_index_put_impl_"], Rule("indirect", fits_or_declines(lower_index_put),
                                                                 "index_put: rows scattered (or added) by index"))
add_rules(["scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_"],
          Rule("indirect", fits_or_declines(lower_scatter), "scatter family: elements scattered by index, duplicates merged"))
