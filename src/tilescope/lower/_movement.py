"""Data movement as DMA: copies (device-device, host-device), layout changes, cat, padding.

A same-dtype copy is DMA from HBM to HBM, one transfer per tile of the destination;
the source's strides (a transpose, a broadcast, a slice) are the transfer's access
pattern, so a layout change costs what its memory access pattern costs (each contiguous
run is a DMA descriptor with its own cost). A copy whose source is transposed against its
destination (a ``.contiguous()`` of a permuted view) would pay one descriptor per element that
way: it goes through SBUF and TensorE instead (``_transposed``) when the cost table says that
is faster. A copy that changes dtype goes through SBUF: load, ``tensor_copy`` (the engines
convert), store.
Host-device copies (``memcpy HtoD`` / ``DtoH``) are modeled as DMA of the tensor's bytes.
"""

from __future__ import annotations

from ..isa import AP
from ..program import TileBuilder, View
from ._call import Call, TensorMeta
from ._elementwise import broadcast_strides
from ._layout import TilePlan, coalesce, hbm_input, hbm_output, memory_order, plan_ns, spread
from ._transposed import out_shape, queues, row_ap, subtiles, transpose_in, transposed_ns, transposed_plan, transposed_tiles
from ._rules import Rule, add_rules

__all__ = ["lower_copy", "lower_cat", "lower_pad"]

_MAX_FREE = 4096


def _copy_into(b: TileBuilder, spec, src: TensorMeta, src_view: View, dst: TensorMeta, dst_view: View,
               shape, src_strides, dst_strides, site: str) -> None:
    """Copy ``src`` (broadcast over ``shape``) into ``dst``; both given as views with their strides."""
    cshape, (cd, cs) = coalesce(*memory_order(tuple(shape) or (1,), [tuple(dst_strides) or (0,), tuple(src_strides) or (0,)]))
    convert = src.device_dtype != dst.device_dtype
    dtypes = [dst.device_dtype, src.device_dtype]
    layout = spread(cshape, [cd, cs], dtypes, spec, max_free=_MAX_FREE) if convert else None
    tplan = transposed_plan(cshape, [cd, cs], dtypes, spec)
    if tplan is not None:
        other = plan_ns(layout, dtypes, spec, max_free=_MAX_FREE) if convert else _hbm_to_hbm_ns(
            cshape, cs, cd, src.device_dtype, spec)
        if transposed_ns(tplan, [cd, cs], dtypes, spec) < other:
            _transposed_copy(b, tplan, src_view, cs, dst, dst_view, cd, site)
            return
    if not convert:
        _hbm_to_hbm(b, src_view, dst_view, cshape, cs, cd)
        return
    cd, cs = layout.strides
    plan = layout.plan(max_free=_MAX_FREE, partitions=spec.partitions)
    for tile in plan.tiles:
        s_ap = plan.operand_ap(src_view, cs, tile)
        d_ap = plan.operand_ap(dst_view, cd, tile)
        t = b.sbuf((tile.partitions, tile.free), src.device_dtype, site=f"{site}.in")
        b.dma_copy(t, s_ap)
        o = b.sbuf((tile.partitions, tile.free), dst.device_dtype, site=f"{site}.out")
        b.tensor_copy(o, t)
        b.dma_copy(d_ap, o)


def _transposed_copy(b: TileBuilder, plan, src_view: View, cs, dst: TensorMeta, dst_view: View, cd, site: str) -> None:
    """A copy whose source is transposed against its destination: the source's contiguous runs
    into SBUF, TensorE transposes into PSUM (see ``_transposed``), the engines' copy out of PSUM
    (converting the dtype), DMA of the destination's rows."""
    from ._elementwise import EngineLoad, balanced_copy

    load, queue = EngineLoad(b), queues(b.spec)
    for tile in transposed_tiles(plan):
        ps = transpose_in(b, src_view, cs, src_view.dtype, plan, tile, f"{site}.T", queue)
        for p, (q0, rq) in zip(ps, subtiles(plan, tile)):
            o = b.sbuf(out_shape(plan, tile, rq), dst.device_dtype, site=f"{site}.T.out")
            balanced_copy(b, load, o, p)
            b.dma_copy(row_ap(dst_view, cd, plan, tile, q0, rq), o, queue=next(queue))


# elements per HBM-to-HBM transfer, at least (the whole copy when smaller): each transfer pays
# the DMA's fixed cost once and spreads over every DMA engine, so a copy is a few large
# transfers whatever its layout -- not one per [rows, cols] tile of its last two dims (a
# (b, t, h, hd) <- (b, h, t, hd) head merge was 2 x 512 transfers of h x hd elements)
_DMA_ELEMS = 1 << 20


def _hbm_transfers(shape, cs, cd):
    """``(outer index, inner shape, split)`` of the transfers of :func:`_hbm_to_hbm`."""
    from itertools import product

    split, elems = len(shape), 1
    while split > 0 and elems < _DMA_ELEMS:
        split -= 1
        elems *= shape[split]
    return list(product(*(range(n) for n in shape[:split]))), tuple(shape[split:]), split


def _hbm_to_hbm_ns(shape, cs, cd, dtype: str, spec) -> float:
    """Modeled time of :func:`_hbm_to_hbm`'s transfers from the cost table (each DRAM-to-DRAM
    transfer spread over every DMA engine; its issue cost spread over the queues)."""
    from ..isa import DmaCopy, dma_cost

    outer, inner, split = _hbm_transfers(shape, cs, cd)
    c = dma_cost(DmaCopy(AP("d", dtype, 0, tuple(zip(cd[split:], inner))), AP("s", dtype, 0, tuple(zip(cs[split:], inner)))),
                 spec, "hbm", "hbm")
    return len(outer) * (c.engine_ns(spec) + c.fixed_ns / spec.dma.queues)


def _hbm_to_hbm(b: TileBuilder, src_view: View, dst_view: View, shape, cs, cd) -> None:
    """A same-dtype copy as DMA from HBM to HBM: each transfer the innermost dims holding at
    least ``_DMA_ELEMS`` elements, through both operands' strides; the outer dims looped."""
    outers, inner, split = _hbm_transfers(shape, cs, cd)
    for outer in outers:
        s0 = src_view.ap.offset + sum(i * st for i, st in zip(outer, cs[:split]))
        d0 = dst_view.ap.offset + sum(i * st for i, st in zip(outer, cd[:split]))
        s_ap = AP(src_view.ap.buffer, src_view.ap.dtype, s0, tuple(zip(cs[split:], inner)))
        d_ap = AP(dst_view.ap.buffer, dst_view.ap.dtype, d0, tuple(zip(cd[split:], inner)))
        b.dma_copy(View(dst_view.buffer, d_ap, inner), View(src_view.buffer, s_ap, inner))


def lower_copy(call: Call, spec):
    """``tilescope::copy`` / ``memcpy_htod`` / ``memcpy_dtoh``: (src,) -> (dst,)."""
    src = call.args[0] if call.args else None
    if not isinstance(src, TensorMeta) or len(call.outputs) != 1:
        return None
    dst = call.outputs[0]
    if dst.numel == 0 or src.is_complex != dst.is_complex:
        return None
    if src.shape != dst.shape and len(src.shape) > len(dst.shape):
        return None
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        sv = hbm_input(b, "src", src)
        dv = hbm_output(b, "dst", dst)
        _copy_into(b, spec, src, sv, dst, dv, dst.shape, broadcast_strides(src, dst.shape), dst.stride, "copy")
    return b.build(meta={"lowering": "dma"})


def lower_cat(call: Call, spec):
    named = call.named()
    tensors = named.get("tensors")
    dim = named.get("dim", 0)
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if out is None or out.numel == 0 or not isinstance(tensors, tuple) or out.is_complex:
        return None
    dim = dim % out.ndim if out.ndim else 0
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        ov = hbm_output(b, "out", out)
        offset = 0
        for i, t in enumerate(tensors):
            if not isinstance(t, TensorMeta):
                return None
            if t.numel == 0:  # legacy empty inputs are skipped by cat
                continue
            if t.ndim != out.ndim:
                return None
            tv = hbm_input(b, f"in{i}", t)
            dst = View(ov.buffer, AP(ov.ap.buffer, ov.ap.dtype, ov.ap.offset + offset * out.stride[dim], ov.ap.dims),
                       ov.shape)
            _copy_into(b, spec, t, tv, out, dst, t.shape, t.stride, out.stride, f"cat{i}")
            offset += t.shape[dim]
    if b.instruction_count == 0:
        return None
    return b.build(meta={"lowering": "dma"})


def lower_pad(call: Call, spec):
    """``constant_pad_nd``: fill the output with the value, then DMA the input into its interior."""
    named = call.named()
    x, pad = named.get("self"), tuple(named.get("pad") or ())
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if not isinstance(x, TensorMeta) or out is None or out.numel == 0 or any(p < 0 for p in pad) or x.is_complex:
        return None
    from ..isa import RuntimeScalar
    from ._call import ScalarArg

    value = named.get("value", 0)
    if isinstance(value, ScalarArg):
        value = RuntimeScalar(value.name)
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        ov = hbm_output(b, "out", out)
        _fill(b, spec, ov, out, value, site="pad.fill")
        if x.numel:
            xv = hbm_input(b, "in", x)
            # pad lists (last dim first) pairs of (before, after)
            offset = 0
            for k in range(len(pad) // 2):
                d = out.ndim - 1 - k
                offset += pad[2 * k] * out.stride[d]
            inner = View(ov.buffer, AP(ov.ap.buffer, ov.ap.dtype, ov.ap.offset + offset, ov.ap.dims), ov.shape)
            _copy_into(b, spec, x, xv, out, inner, x.shape, x.stride, out.stride, "pad.copy")
    return b.build(meta={"lowering": "dma"})


def _fill(b, spec, view: View, meta: TensorMeta, value, site: str = "fill") -> None:
    cshape, (cst,) = coalesce(tuple(meta.shape) or (1,), [tuple(meta.stride) or (1,)])
    plan = TilePlan(cshape, max_free=_MAX_FREE, partitions=spec.partitions)
    for tile in plan.tiles:
        t = b.sbuf((tile.partitions, tile.free), meta.device_dtype, site=site)
        b.memset(t, 0.0)
        if not (isinstance(value, (int, float)) and value == 0):
            b.tensor_scalar(t, t, "add", value)
        b.dma_copy(plan.operand_ap(view, cst, tile), t)


def lower_scatter_grad(call: Call, spec):
    """``select_backward`` / ``slice_backward``: zeros, then the gradient DMA'd into its region."""
    named = call.named()
    g = named.get("grad_output")
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if not isinstance(g, TensorMeta) or out is None or out.numel == 0 or g.is_complex:
        return None
    dim = named.get("dim", 0) % out.ndim
    st = list(out.stride)
    if call.packet == "select_backward":
        index = named.get("index", 0) % out.shape[dim]
        offset = index * st[dim]
        region = TensorMeta(g.shape, tuple(st[:dim] + st[dim + 1:]), out.dtype)
    else:
        start, step = named.get("start", 0), named.get("step", 1)
        if start is None or step is None or start < 0 or step < 1:
            return None
        offset = start * st[dim]
        st[dim] *= step
        region = TensorMeta(g.shape, tuple(st), out.dtype)
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        ov = hbm_output(b, "out", out)
        _fill(b, spec, ov, out, 0.0)
        if g.numel:
            gv = hbm_input(b, "grad", g)
            dst = View(ov.buffer, AP(ov.ap.buffer, ov.ap.dtype, ov.ap.offset + offset, ov.ap.dims), ov.shape)
            _copy_into(b, spec, g, gv, region, dst, g.shape, g.stride, region.stride, "grad")
    return b.build(meta={"lowering": "dma"})


def lower_flip(call: Call, spec):
    """``flip``: a DMA reading the input with negated strides along the flipped dims."""
    named = call.named()
    x, out = named.get("self"), call.outputs[0] if len(call.outputs) == 1 else None
    if not isinstance(x, TensorMeta) or out is None or out.numel == 0 or x.is_complex or x.ndim == 0:
        return None
    dims = {d % x.ndim for d in (named.get("dims") or ())}
    strides = tuple(-s if d in dims else s for d, s in enumerate(x.stride))
    start = sum((n - 1) * s for d, (n, s) in enumerate(zip(x.shape, x.stride)) if d in dims)
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xv, ov = hbm_input(b, "in_self", x), hbm_output(b, "out", out)
        src = View(xv.buffer, AP(xv.ap.buffer, xv.ap.dtype, xv.ap.offset + start, xv.ap.dims), xv.shape)
        _copy_into(b, spec, x, src, out, ov, x.shape, strides, out.stride, "flip")
    return b.build(meta={"lowering": "dma"})


def lower_roll(call: Call, spec):
    """``roll`` along one dim (or of the flattened tensor): two DMAs, one per wrapped part."""
    named = call.named()
    x, out = named.get("self"), call.outputs[0] if len(call.outputs) == 1 else None
    shifts, dims = tuple(named.get("shifts") or ()), tuple(named.get("dims") or ())
    if not isinstance(x, TensorMeta) or out is None or out.numel == 0 or x.is_complex or len(shifts) != 1:
        return None
    if not dims:
        if not (x.is_contiguous and out.is_contiguous):
            return None
        x, out, dim = TensorMeta((x.numel,), (1,), x.dtype), TensorMeta((out.numel,), (1,), out.dtype), 0
    elif len(dims) == 1:
        dim = dims[0] % x.ndim
    else:
        return None
    n = x.shape[dim]
    s = shifts[0] % n if n else 0
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xv, ov = hbm_input(b, "in_self", x), hbm_output(b, "out", out)
        for length, src0, dst0 in ((n - s, 0, s), (s, n - s, 0)):
            if length == 0:
                continue
            shape = tuple(length if d == dim else m for d, m in enumerate(x.shape))
            src = View(xv.buffer, AP(xv.ap.buffer, xv.ap.dtype, xv.ap.offset + src0 * x.stride[dim], xv.ap.dims),
                       xv.shape)
            dst = View(ov.buffer, AP(ov.ap.buffer, ov.ap.dtype, ov.ap.offset + dst0 * out.stride[dim], ov.ap.dims),
                       ov.shape)
            _copy_into(b, spec, x, src, out, dst, shape, x.stride, out.stride, "roll")
    return b.build(meta={"lowering": "dma"})


def lower_range(call: Call, spec):
    """``linspace.out`` / ``arange.start_out``: GpSimd ``iota`` gives each element its index,
    VectorE scales and offsets it."""
    named = call.named()
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if out is None or out.numel == 0 or out.ndim != 1 or out.is_complex:
        return None
    n = out.numel
    start = named.get("start")
    if call.packet == "linspace":
        end = named.get("end")
        if not all(isinstance(v, (int, float)) for v in (start, end)):
            return None
        step = (end - start) / (n - 1) if n > 1 else 0.0
    else:
        step = named.get("step", 1)
        if not all(isinstance(v, (int, float)) for v in (start, step)):
            return None
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        ov = hbm_output(b, "out", out)
        plan = TilePlan((n,), max_free=_MAX_FREE, partitions=spec.partitions)
        for tile in plan.tiles:
            k = tile.rows_per_partition
            idx = b.sbuf((tile.partitions, k), "float32", site="iota")
            b.iota(idx, base=tile.row0, partition_step=k, steps=(1,))
            t = b.sbuf((tile.partitions, k), out.device_dtype, site="iota.out")
            b.tensor_scalar(t, idx, "multiply", float(step), "add", float(start))
            b.dma_copy(plan.operand_ap(ov, (out.stride[0],), tile), t)
    return b.build(meta={"lowering": "iota"})


add_rules(["flip"], Rule("dma", lower_flip, "flip: DMA with negated strides"))
add_rules(["roll"], Rule("dma", lower_roll, "roll: two DMAs"))
add_rules(["linspace", "arange"], Rule("iota", lower_range, "ranges: GpSimd iota, scaled on VectorE"))
add_rules(["select_backward", "slice_backward"], Rule("dma", lower_scatter_grad,
                                                      "view backward: zeros, then the gradient into its region"))
add_rules(["tilescope::copy", "tilescope::memcpy_htod", "tilescope::memcpy_dtoh"],
          Rule("dma", lower_copy, "copies as DMA"))
add_rules(["cat"], Rule("dma", lower_cat, "concatenation as DMA into output slices"))
add_rules(["constant_pad_nd"], Rule("dma", lower_pad, "constant padding: fill, then DMA the interior"))
