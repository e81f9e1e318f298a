"""Gathers as indirect DMA: ``index_select`` (so ``embedding``), advanced indexing, ``gather``, ``take``.

* **Rows** (``index_select``, ``x[idx]``, ``x[:, idx]``, ``x[rows, cols]``): the indices go to
  SBUF, GpSimd writes one descriptor per index, one indirect DMA per tile brings the rows
  touched into SBUF and a plain DMA stores them. Bytes moved are the rows touched, not
  the table: two rows of a 50257 x 128 table cost two rows.
* **Elements** (``gather(dim, index)``, ``take``): every output element has its own
  address -- GpSimd's ``iota`` gives each position its offset in the source with the
  gathered dim left out, the descriptors add ``index * stride`` -- and each element is
  one descriptor (so its cost is the DMA's per-descriptor floor, not its 4 bytes).

Calls outside these forms (boolean masks, index tensors that are not next to each other,
layouts that do not flatten) are declined and take the labelled generic lowering.
"""

from __future__ import annotations

from itertools import product
from math import prod

from ..isa import AP
from ..program import TileBuilder, View
from ._call import Call, TensorMeta
from ._indirect import INDEX_DTYPES, as_vectors, descriptors, fits_or_declines, row_blocks, sb, table_ap
from ._layout import TilePlan, coalesce, hbm_input, hbm_output
from ._rules import Rule, add_rules

__all__ = ["lower_index_select", "lower_index", "lower_gather", "lower_take", "RowGather", "gather_rows"]

_TILE_BYTES = 32 * 1024  # bytes per partition of one gathered tile
_ELEM_FREE = 2048  # positions per partition of one element-gather tile


class RowGather:
    """Where the rows of one gather come from and go to.

    The source is ``x`` viewed as ``[outer, table rows, inner]``; each index position
    names one row (``sum_j index_j * mult_j`` in units of ``row_stride``); the output is
    ``[outer, positions, inner]``.
    """

    def __init__(self, x: TensorMeta, first: int, last: int, mults, rows: int, row_stride: int,
                 out: TensorMeta, out_first: int, out_last: int, out_pos_stride: int):
        self.x, self.out, self.out_pos_stride = x, out, out_pos_stride
        self.mults, self.rows, self.row_stride = tuple(mults), rows, row_stride
        outer = tuple(range(first))
        self.outer_shape = tuple(x.shape[d] for d in outer)
        self.outer_x = tuple(x.stride[d] for d in outer)
        self.outer_out = tuple(out.stride[d] for d in range(out_first))
        inner_x = tuple(range(last + 1, x.ndim))
        inner_out = tuple(range(out_last + 1, out.ndim))
        shape = tuple(x.shape[d] for d in inner_x)
        self.inner_shape, (self.inner_x, self.inner_out) = coalesce(
            shape or (1,), [tuple(x.stride[d] for d in inner_x) or (1,), tuple(out.stride[d] for d in inner_out) or (1,)])

    @property
    def width(self) -> int:
        return prod(self.inner_shape)

    def outers(self):
        for pos in product(*(range(n) for n in self.outer_shape)):
            yield (sum(i * s for i, s in zip(pos, self.outer_x)), sum(i * s for i, s in zip(pos, self.outer_out)))

    def column_chunks(self, max_cols: int):
        """``(c0, cw, x row dims, out row dims)``: the row split into chunks of at most ``max_cols``."""
        if len(self.inner_shape) == 1:
            n, sx, so = self.inner_shape[0], self.inner_x[0], self.inner_out[0]
            for c0 in range(0, n, max_cols):
                cw = min(max_cols, n - c0)
                yield c0 * sx, c0 * so, cw, ((sx, cw),), ((so, cw),)
            return
        if self.width > max_cols:
            return  # a multi-dim row longer than one tile: not split (declined by the caller)
        yield 0, 0, self.width, tuple(zip(self.inner_x, self.inner_shape)), tuple(zip(self.inner_out, self.inner_shape))


def gather_rows(b: TileBuilder, spec, g: RowGather, xv: View, ov: View, index_views, n: int, sizes,
                *, wrap: bool, site: str = "gather") -> bool:
    """Emit the gather; ``index_views``: per index tensor, ``(view, flat stride)`` over the ``n``
    positions. Returns False when the row shape cannot be tiled."""
    isz = g.x.itemsize
    max_cols = max(1, _TILE_BYTES // isz)
    chunks = list(g.column_chunks(max_cols))
    if not chunks:
        return False
    cw_max = max(c[2] for c in chunks)
    k_max = max(1, max_cols // cw_max)
    pos_out_stride = g.out_pos_stride
    for x_off, o_off in g.outers():
        for r0, p, k in row_blocks(n, k_max, spec.partitions):
            tiles = []
            for j, (iv, istride) in enumerate(index_views):
                t = b.sbuf((p, k), iv.dtype, site=f"{site}.idx{j}")
                src = AP(iv.ap.buffer, iv.ap.dtype, iv.ap.offset + r0 * istride, ((k * istride, p), (istride, k)))
                b.dma_copy(t, View(iv.buffer, src, (p, k)))
                tiles.append((t, sizes[j], g.mults[j]))
            desc = descriptors(b, (p, k), tiles, wrap=wrap, site=f"{site}.dge")
            for cx, co, cw, xdims, odims in chunks:
                t = b.sbuf((p, k * cw), g.x.device_dtype, site=f"{site}.rows")
                b.dma_indirect(sb(t, (p, k, cw)), table_ap(xv, x_off + cx, g.row_stride, g.rows, xdims), desc)
                dst = AP(ov.ap.buffer, ov.ap.dtype, ov.ap.offset + o_off + co + r0 * pos_out_stride,
                         ((k * pos_out_stride, p), (pos_out_stride, k)) + tuple(odims))
                b.dma_copy(View(ov.buffer, dst, (p, k, cw)), sb(t, (p, k, cw)))
    return True


def _index_ok(t) -> bool:
    return isinstance(t, TensorMeta) and t.dtype in INDEX_DTYPES


def _flat_stride(shape, strides) -> int | None:
    """The one stride of a layout that flattens to a single dim (None if it does not)."""
    cshape, (cs,) = coalesce(tuple(shape) or (1,), [tuple(strides) or (1,)])
    if len(cshape) != 1:
        return None
    return cs[0] if cshape[0] > 1 else 1


def lower_index_select(call: Call, spec):
    """``index_select(self, dim, index)``: rows of ``self`` along ``dim``."""
    call = as_vectors(call)
    named = call.named()
    x, idx = named.get("self"), named.get("index")
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if not isinstance(x, TensorMeta) or not _index_ok(idx) or out is None or out.numel == 0 or x.is_complex:
        return None
    if x.ndim == 0:
        return None
    dim = named.get("dim", 0) % x.ndim
    n = idx.numel
    istride = _flat_stride(idx.shape, idx.stride)
    if istride is None:
        return None
    g = RowGather(x, dim, dim, (1,), x.shape[dim], x.stride[dim], out, dim, dim, out.stride[dim])
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xv, iv, ov = hbm_input(b, "in_self", x), hbm_input(b, "in_index", idx), hbm_output(b, "out", out)
        if not gather_rows(b, spec, g, xv, ov, [(iv, istride)], n, (x.shape[dim],), wrap=False):
            return None
    if b.instruction_count == 0:
        return None  # nothing to move (an empty index written in place): the generic form
    return b.build(meta={"lowering": "indirect"})


def _index_layout(x: TensorMeta, indices):
    """(first indexed dim, last indexed dim, the index tensors) of an advanced-indexing call
    whose index tensors sit next to each other, or None."""
    pos = [i for i, t in enumerate(indices) if t is not None]
    if not pos or pos != list(range(pos[0], pos[-1] + 1)) or pos[-1] >= x.ndim:
        return None
    tensors = [indices[i] for i in pos]
    if not all(_index_ok(t) for t in tensors):
        return None  # boolean masks (data-dependent shapes) and the like
    return pos[0], pos[-1], tensors


def _broadcast(shapes):
    nd = max(len(s) for s in shapes)
    out = []
    for k in range(nd):
        sizes = {s[k - nd + len(s)] for s in shapes if k - nd + len(s) >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _bstrides(t: TensorMeta, shape) -> tuple[int, ...]:
    pad = len(shape) - t.ndim
    return tuple(0 if k < pad or t.shape[k - pad] == 1 else t.stride[k - pad] for k in range(len(shape)))


def lower_index(call: Call, spec):
    """``x[i0, i1, ...]`` with integer index tensors on adjacent dims (``logits[rows, labels]``,
    ``table[ids]``): one gather of rows (the dims after the indexed ones), negative indices
    counting from the end."""
    named = call.named()
    x, indices = named.get("self"), named.get("indices")
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if not isinstance(x, TensorMeta) or not isinstance(indices, tuple) or out is None or out.numel == 0:
        return None
    if x.is_complex or x.ndim == 0:
        return None
    lay = _index_layout(x, indices)
    if lay is None:
        return None
    first, last, tensors = lay
    bshape = _broadcast([t.shape for t in tensors])
    if bshape is None:
        return None
    nb = len(bshape)
    if out.ndim != first + nb + (x.ndim - last - 1):
        return None
    # the index positions flatten to one dim in the output and in every index tensor
    cshape, cstrides = coalesce(bshape or (1,), [tuple(out.stride[first:first + nb]) or (1,)]
                                + [_bstrides(t, bshape) or (0,) for t in tensors])
    if len(cshape) != 1:
        return None
    n = cshape[0]
    if len(tensors) == 1:
        mults, rows, row_stride = (1,), x.shape[first], x.stride[first]
    else:
        mults = tuple(x.stride[d] for d in range(first, last + 1))
        rows = 1 + sum((x.shape[d] - 1) * x.stride[d] for d in range(first, last + 1))
        row_stride = 1
    g = RowGather(x, first, last, mults, rows, row_stride, out, first, first + nb - 1,
                  cstrides[0][0] if n > 1 else 1)
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xv, ov = hbm_input(b, "in_self", x), hbm_output(b, "out", out)
        views = [(hbm_input(b, f"in_indices{j}", t), cstrides[j + 1][0] if n > 1 else 1) for j, t in enumerate(tensors)]
        sizes = tuple(x.shape[d] for d in range(first, last + 1))
        if not gather_rows(b, spec, g, xv, ov, views, n, sizes, wrap=True):
            return None
    if b.instruction_count == 0:
        return None  # nothing to move (an empty index written in place): the generic form
    return b.build(meta={"lowering": "indirect"})


def element_plan(index: TensorMeta, others, dim: int, x: TensorMeta):
    """Coalesced iteration space over ``index``'s positions: (shape, [index strides, x strides with
    ``dim`` left out, other operands' strides...])."""
    xs = tuple(0 if d == dim else s for d, s in enumerate(x.stride))
    return coalesce(tuple(index.shape) or (1,), [tuple(index.stride) or (0,), xs or (0,)]
                    + [tuple(o.stride) or (0,) for o in others])


def element_offsets(b: TileBuilder, plan: TilePlan, tile, x_strides, iv_tile: View, size: int, mult: int,
                    *, wrap: bool, site: str) -> View:
    """Descriptors of one element tile: iota gives each position its source offset (the indexed
    dim left out), GpSimd adds ``index * mult``."""
    p, k, c = tile.partitions, tile.rows_per_partition, tile.cols
    base = b.sbuf((p, k * c), "int64", site=f"{site}.iota")
    if len(plan.shape) == 1:
        row_s = col_s = x_strides[0]
        outer_s: tuple[int, ...] = ()
    else:
        row_s, col_s = x_strides[-2], x_strides[-1]
        outer_s = x_strides[:-2]
    start = sum(i * s for i, s in zip(tile.outer, outer_s)) + tile.row0 * row_s + tile.col0 * col_s
    b.iota(sb(base, (p, k, c)), base=start, partition_step=k * row_s, steps=(row_s, col_s))
    return descriptors(b, (p, k * c), [(iv_tile, size, mult)], base=base, wrap=wrap, site=f"{site}.dge")


def lower_gather(call: Call, spec):
    """``gather(self, dim, index)``: ``out[p] = self[p with p[dim] = index[p]]``, one descriptor
    per element."""
    call = as_vectors(call)
    named = call.named()
    x, idx = named.get("self"), named.get("index")
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if not isinstance(x, TensorMeta) or not _index_ok(idx) or out is None or out.numel == 0 or x.is_complex:
        return None
    if x.ndim == 0 or idx.ndim != x.ndim or out.shape != idx.shape:
        return None
    dim = named.get("dim", 0) % x.ndim
    shape, (istr, xstr, ostr) = element_plan(idx, [out], dim, x)
    plan = TilePlan(shape, max_free=_ELEM_FREE, partitions=spec.partitions)
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xv, iv, ov = hbm_input(b, "in_self", x), hbm_input(b, "in_index", idx), hbm_output(b, "out", out)
        table = table_ap(xv, 0, 1, max(x.extent, 1), ())
        for tile in plan.tiles:
            p, k, c = tile.partitions, tile.rows_per_partition, tile.cols
            it = b.sbuf((p, k * c), idx.device_dtype, site="gather.idx")
            b.dma_copy(sb(it, (p, k, c)), plan.operand_ap(iv, istr, tile))
            desc = element_offsets(b, plan, tile, xstr, it, x.shape[dim], x.stride[dim], wrap=False, site="gather")
            t = b.sbuf((p, k * c), x.device_dtype, site="gather.vals")
            b.dma_indirect(t, table, desc)
            b.dma_copy(plan.operand_ap(ov, ostr, tile), sb(t, (p, k, c)))
    if b.instruction_count == 0:
        return None  # nothing to move (an empty index written in place): the generic form
    return b.build(meta={"lowering": "indirect"})


def lower_take(call: Call, spec):
    """``take(self, index)``: elements of the flattened (contiguous) ``self``, negatives from the end."""
    named = call.named()
    x, idx = named.get("self"), named.get("index")
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if not isinstance(x, TensorMeta) or not _index_ok(idx) or out is None or out.numel == 0 or x.is_complex:
        return None
    if not x.is_contiguous or x.numel == 0:
        return None
    istride = _flat_stride(idx.shape, idx.stride)
    ostride = _flat_stride(out.shape, out.stride)
    if istride is None or ostride is None:
        return None
    flat = TensorMeta((x.numel,), (1,), x.dtype)
    fout = TensorMeta((out.numel,), (ostride,), out.dtype)
    g = RowGather(flat, 0, 0, (1,), x.numel, 1, fout, 0, 0, ostride)
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xv, iv, ov = hbm_input(b, "in_self", x), hbm_input(b, "in_index", idx), hbm_output(b, "out", out)
        gather_rows(b, spec, g, xv, ov, [(iv, istride)], idx.numel, (x.numel,), wrap=True)
    if b.instruction_count == 0:
        return None  # nothing to move (an empty index written in place): the generic form
    return b.build(meta={"lowering": "indirect"})


add_rules(["index_select"], Rule("indirect", fits_or_declines(lower_index_select), "rows by index: indirect DMA"))
add_rules(["aten::index.Tensor"], Rule("indirect", fits_or_declines(lower_index), "advanced indexing: indirect DMA of rows"))
add_rules(["gather"], Rule("indirect", fits_or_declines(lower_gather), "gather: one descriptor per element"))
add_rules(["take"], Rule("indirect", fits_or_declines(lower_take), "take: elements of the flattened tensor"))
