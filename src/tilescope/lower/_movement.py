"""Data movement as DMA: copies (device-device, host-device), layout changes, cat, padding.

A same-dtype copy is DMA from HBM to HBM, one transfer per tile of the destination;
the source's strides (a transpose, a broadcast, a slice) are the transfer's access
pattern, so a layout change costs what its memory access pattern costs (small
contiguous chunks are charged at the DMA's per-chunk floor). A copy that changes
dtype goes through SBUF: load, ``tensor_copy`` (the engines convert), store.
Host-device copies (``memcpy HtoD`` / ``DtoH``) are modeled as DMA of the tensor's bytes.
"""

from __future__ import annotations

from ..isa import AP
from ..program import TileBuilder, View
from ._call import Call, TensorMeta
from ._elementwise import broadcast_strides
from ._layout import TilePlan, coalesce, hbm_input, hbm_output
from ._rules import Rule, add_rules

__all__ = ["lower_copy", "lower_cat", "lower_pad"]

_MAX_FREE = 4096


def _copy_into(b: TileBuilder, spec, src: TensorMeta, src_view: View, dst: TensorMeta, dst_view: View,
               shape, src_strides, dst_strides, site: str) -> None:
    """Copy ``src`` (broadcast over ``shape``) into ``dst``; both given as views with their strides."""
    cshape, (cd, cs) = coalesce(tuple(shape) or (1,), [tuple(dst_strides) or (0,), tuple(src_strides) or (0,)])
    plan = TilePlan(cshape, max_free=_MAX_FREE, partitions=spec.partitions)
    convert = src.device_dtype != dst.device_dtype
    for tile in plan.tiles:
        s_ap = plan.operand_ap(src_view, cs, tile)
        d_ap = plan.operand_ap(dst_view, cd, tile)
        if not convert:
            b.dma_copy(d_ap, s_ap)
            continue
        t = b.sbuf((tile.partitions, tile.free), src.device_dtype, site=f"{site}.in")
        b.dma_copy(t, s_ap)
        o = b.sbuf((tile.partitions, tile.free), dst.device_dtype, site=f"{site}.out")
        b.tensor_copy(o, t)
        b.dma_copy(d_ap, o)


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
        cshape, (cst,) = coalesce(tuple(out.shape), [tuple(out.stride)])
        plan = TilePlan(cshape, max_free=_MAX_FREE, partitions=spec.partitions)
        for tile in plan.tiles:
            t = b.sbuf((tile.partitions, tile.free), out.device_dtype, site="pad.fill")
            b.memset(t, 0.0)
            if not (isinstance(value, (int, float)) and value == 0):
                b.tensor_scalar(t, t, "add", value)
            b.dma_copy(plan.operand_ap(ov, cst, tile), t)
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


def _fill(b, spec, view: View, meta: TensorMeta, value) -> None:
    cshape, (cst,) = coalesce(tuple(meta.shape) or (1,), [tuple(meta.stride) or (1,)])
    plan = TilePlan(cshape, max_free=_MAX_FREE, partitions=spec.partitions)
    for tile in plan.tiles:
        t = b.sbuf((tile.partitions, tile.free), meta.device_dtype, site="fill")
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


add_rules(["select_backward", "slice_backward"], Rule("dma", lower_scatter_grad,
                                                      "view backward: zeros, then the gradient into its region"))
add_rules(["tilescope::copy", "tilescope::memcpy_htod", "tilescope::memcpy_dtoh"],
          Rule("dma", lower_copy, "copies as DMA"))
add_rules(["cat"], Rule("dma", lower_cat, "concatenation as DMA into output slices"))
add_rules(["constant_pad_nd"], Rule("dma", lower_pad, "constant padding: fill, then DMA the interior"))
