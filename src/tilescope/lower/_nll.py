"""``nll_loss`` / ``nll_loss2d`` forward and backward: the target's log-probability per position by
indirect DMA, never a read of the whole ``[N, C]`` input.

Forward: the targets go to SBUF; VectorE masks ``ignore_index`` (their target becomes 0, their
weight 0); GpSimd's ``iota`` gives each position its offset with the class dim left out and
the descriptors add ``target * class_stride``; one indirect DMA per tile brings the ``N``
picked log-probabilities (and the class weights, when given). Loss ``-x * w``; ``sum`` and
``mean`` add per partition on VectorE and across partitions on TensorE (``ones.T @ partial``),
``mean`` divides by the total weight, as torch does.

Backward: the gradient is dense ``[N, C]`` (zeros, written once) with ``-w * grad`` scattered
at each position's target.
"""

from __future__ import annotations

from ..isa import AP
from ..program import TileBuilder, View
from ._call import Call, TensorMeta
from ._gather import element_offsets, element_plan
from ._indirect import INDEX_DTYPES, descriptors, fits_or_declines, sb, table_ap
from ._layout import TilePlan, hbm_input, hbm_output
from ._movement import _fill
from ._rules import Rule, add_rules

__all__ = ["lower_nll_loss", "lower_nll_loss_backward"]

_FREE = 2048  # positions per partition of one tile
_FLOATS = ("float32", "bfloat16", "float16")


def _forms(named):
    x, target, weight = named.get("self"), named.get("target"), named.get("weight")
    if not isinstance(x, TensorMeta) or not isinstance(target, TensorMeta) or x.dtype not in _FLOATS:
        return None
    if target.dtype not in INDEX_DTYPES or x.ndim not in (1, 2, 3, 4):
        return None
    if weight is not None and (not isinstance(weight, TensorMeta) or weight.ndim != 1):
        return None
    cdim = 0 if x.ndim == 1 else 1
    if tuple(target.shape) != tuple(x.shape[:cdim] + x.shape[cdim + 1:]):
        return None
    # the target as an index over x's dims (a size-1 class dim), so positions follow gather's plan
    shape = list(target.shape)
    stride = list(target.stride)
    shape.insert(cdim, 1)
    stride.insert(cdim, 0)
    return x, TensorMeta(tuple(shape), tuple(stride), target.dtype), weight, cdim


def _picked(b: TileBuilder, spec, x, xv, tgt_tile, weight, wv, plan, tile, xstr, cdim, ignore, site):
    """(safe target, weight-or-valid [p, n] fp32, picked log-prob [p, n] fp32) of one tile."""
    p, k, c = tile.partitions, tile.rows_per_partition, tile.cols
    n = k * c
    valid = b.sbuf((p, n), "float32", site=f"{site}.valid")
    b.tensor_scalar(valid, tgt_tile, "not_equal", float(ignore))
    safe = b.sbuf((p, n), tgt_tile.dtype, site=f"{site}.safe")
    b.tensor_tensor(safe, tgt_tile, valid, "multiply")  # ignored positions read class 0 (then weigh 0)
    desc = element_offsets(b, plan, tile, xstr, safe, x.shape[cdim], x.stride[cdim], wrap=False, site=site)
    picked = b.sbuf((p, n), x.device_dtype, site=f"{site}.x")
    b.dma_indirect(picked, table_ap(xv, 0, 1, max(x.extent, 1), ()), desc)
    w = valid
    if weight is not None:
        wd = descriptors(b, (p, n), [(safe, weight.shape[0], weight.stride[0])], site=f"{site}.wdge")
        wt = b.sbuf((p, n), weight.device_dtype, site=f"{site}.w")
        b.dma_indirect(wt, table_ap(wv, 0, 1, max(weight.extent, 1), ()), wd)
        w = b.sbuf((p, n), "float32", site=f"{site}.wv")
        b.tensor_tensor(w, wt, valid, "multiply")
    return w, picked


def lower_nll_loss(call: Call, spec):
    """``nll_loss_forward`` / ``nll_loss2d_forward`` -> (output, total_weight)."""
    named = call.named()
    form = _forms(named)
    if form is None or len(call.outputs) != 2:
        return None
    x, tgt, weight, cdim = form
    out, tw = call.outputs
    reduction = named.get("reduction", 1)
    ignore = named.get("ignore_index", -100)
    if reduction not in (0, 1, 2) or (reduction == 0 and out.shape != tuple(named["target"].shape)):
        return None
    out_meta = None
    if reduction == 0:
        ostr = list(out.stride)
        ostr.insert(cdim, 0)
        out_meta = TensorMeta(tgt.shape, tuple(ostr), out.dtype)
    shape, strides = element_plan(tgt, [out_meta] if out_meta else [], cdim, x)
    tstr, xstr = strides[0], strides[1]
    plan = TilePlan(shape, max_free=_FREE, partitions=spec.partitions)
    P = spec.partitions
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xv, tv = hbm_input(b, "in_self", x), hbm_input(b, "in_target", named["target"])
        wv = hbm_input(b, "in_weight", weight) if weight is not None else None
        ov, twv = hbm_output(b, "output", out), hbm_output(b, "total_weight", tw)
        if reduction:
            acc = b.sbuf((P, 2), "float32", site="nll.acc", bufs=1)  # per partition: sum(-x*w), sum(w)
            b.memset(acc, 0.0)
        for tile in plan.tiles:
            p, k, c = tile.partitions, tile.rows_per_partition, tile.cols
            n = k * c
            tt = b.sbuf((p, n), tgt.device_dtype, site="nll.tgt")
            b.dma_copy(sb(tt, (p, k, c)), plan.operand_ap(tv, tstr, tile))
            w, picked = _picked(b, spec, x, xv, tt, weight, wv, plan, tile, xstr, cdim, ignore, "nll")
            loss = b.sbuf((p, n), "float32", site="nll.loss")
            b.tensor_tensor(loss, picked, w, "multiply")
            if reduction == 0:
                res = b.sbuf((p, n), out.device_dtype, site="nll.res")
                b.tensor_scalar(res, loss, "multiply", -1.0)
                b.dma_copy(plan.operand_ap(ov, strides[2], tile), sb(res, (p, k, c)))
                continue
            part = b.sbuf((p, 2), "float32", site="nll.part")
            b.tensor_reduce(part[:, 0:1], loss, "add", negate=True)
            b.tensor_reduce(part[:, 1:2], w, "add")
            b.tensor_tensor(acc[:p, :], acc[:p, :], part, "add")
        if reduction == 0:
            z = b.sbuf((1, 1), tw.device_dtype, site="nll.tw")
            b.memset(z, 0.0)
            b.dma_copy(_scalar_ap(twv), z)
        else:
            ones = b.sbuf((P, 1), "float32", site="nll.ones", bufs=1)
            b.memset(ones, 1.0)
            tot = b.psum((1, 2), "float32", site="nll.tot")
            b.matmul(tot, ones, acc)  # across partitions: [1, 2] = ones.T @ acc
            res = b.sbuf((1, 1), out.device_dtype, site="nll.out")
            if reduction == 1:
                b.tensor_tensor(res, tot[:, 0:1], tot[:, 1:2], "divide")
            else:
                b.tensor_copy(res, tot[:, 0:1])
            twt = b.sbuf((1, 1), tw.device_dtype, site="nll.twv")
            b.tensor_copy(twt, tot[:, 1:2])
            b.dma_copy(_scalar_ap(ov), res)
            b.dma_copy(_scalar_ap(twv), twt)
    return b.build(meta={"lowering": "indirect"})


def _scalar_ap(v: View) -> View:
    return View(v.buffer, AP(v.ap.buffer, v.ap.dtype, v.ap.offset, ((1, 1), (1, 1))), (1, 1))


def lower_nll_loss_backward(call: Call, spec):
    """``nll_loss_backward`` / ``nll_loss2d_backward``: zeros, then ``-w * grad`` (``/ total_weight``
    for ``mean``) at each position's target."""
    named = call.named()
    form = _forms(named)
    go, twm = named.get("grad_output"), named.get("total_weight")
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if form is None or not isinstance(go, TensorMeta) or not isinstance(twm, TensorMeta) or out is None:
        return None
    x, tgt, weight, cdim = form
    reduction = named.get("reduction", 1)
    ignore = named.get("ignore_index", -100)
    if reduction not in (0, 1, 2) or out.shape != x.shape or out.numel == 0:
        return None
    if reduction == 0 and go.shape != tuple(named["target"].shape):
        return None
    if reduction and go.numel != 1:
        return None
    others = []
    if reduction == 0:
        gstr = list(go.stride)
        gstr.insert(cdim, 0)
        others = [TensorMeta(tgt.shape, tuple(gstr), go.dtype)]
    shape, strides = element_plan(tgt, others, cdim, out)
    tstr, ostr = strides[0], strides[1]
    plan = TilePlan(shape, max_free=_FREE, partitions=spec.partitions)
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        gv, xv = hbm_input(b, "in_grad_output", go), hbm_input(b, "in_self", x)
        tv = hbm_input(b, "in_target", named["target"])
        wv = hbm_input(b, "in_weight", weight) if weight is not None else None
        twv = hbm_input(b, "in_total_weight", twm)
        ov = hbm_output(b, "grad_input", out)
        _fill(b, spec, ov, out, 0.0, site="nll_bwd.zero")
        scale = None
        if reduction:
            P = spec.partitions
            g1 = b.sbuf((P, 1), go.device_dtype, site="nll_bwd.g", bufs=1)
            b.dma_copy(g1, View(gv.buffer, AP(gv.ap.buffer, gv.ap.dtype, gv.ap.offset, ((0, P), (1, 1))), (P, 1)))
            scale = b.sbuf((P, 1), "float32", site="nll_bwd.scale", bufs=1)
            b.tensor_scalar(scale, g1, "multiply", -1.0)
            if reduction == 1:
                t1 = b.sbuf((P, 1), twm.device_dtype, site="nll_bwd.tw", bufs=1)
                b.dma_copy(t1, View(twv.buffer, AP(twv.ap.buffer, twv.ap.dtype, twv.ap.offset, ((0, P), (1, 1))), (P, 1)))
                b.tensor_tensor(scale, scale, t1, "divide")
        table = table_ap(ov, 0, 1, max(out.extent, 1), ())
        for tile in plan.tiles:
            p, k, c = tile.partitions, tile.rows_per_partition, tile.cols
            n = k * c
            tt = b.sbuf((p, n), tgt.device_dtype, site="nll_bwd.tgt")
            b.dma_copy(sb(tt, (p, k, c)), plan.operand_ap(tv, tstr, tile))
            valid = b.sbuf((p, n), "float32", site="nll_bwd.valid")
            b.tensor_scalar(valid, tt, "not_equal", float(ignore))
            safe = b.sbuf((p, n), tt.dtype, site="nll_bwd.safe")
            b.tensor_tensor(safe, tt, valid, "multiply")
            w = valid
            if weight is not None:
                wd = descriptors(b, (p, n), [(safe, weight.shape[0], weight.stride[0])], site="nll_bwd.wdge")
                wt = b.sbuf((p, n), weight.device_dtype, site="nll_bwd.w")
                b.dma_indirect(wt, table_ap(wv, 0, 1, max(weight.extent, 1), ()), wd)
                w = b.sbuf((p, n), "float32", site="nll_bwd.wv")
                b.tensor_tensor(w, wt, valid, "multiply")
            val = b.sbuf((p, n), out.device_dtype, site="nll_bwd.val")
            if reduction == 0:
                gt = b.sbuf((p, n), go.device_dtype, site="nll_bwd.gt")
                b.dma_copy(sb(gt, (p, k, c)), plan.operand_ap(gv, strides[2], tile))
                gw = b.sbuf((p, n), "float32", site="nll_bwd.gw")
                b.tensor_tensor(gw, gt, w, "multiply")
                b.tensor_scalar(val, gw, "multiply", -1.0)
            else:
                b.tensor_scalar(val, w, "multiply", scale[:p, :])
            desc = element_offsets(b, plan, tile, ostr, safe, out.shape[cdim], out.stride[cdim], wrap=False,
                                   site="nll_bwd")
            b.dma_indirect(table, val, desc, indirect="dst")
    return b.build(meta={"lowering": "indirect"})


add_rules(["nll_loss_forward", "nll_loss2d_forward"], Rule("indirect", fits_or_declines(lower_nll_loss),
                                                           "nll_loss: picked log-probabilities by indirect DMA"))
add_rules(["nll_loss_backward", "nll_loss2d_backward"], Rule("indirect", fits_or_declines(lower_nll_loss_backward),
                                                             "nll_loss backward: zeros, -w*grad scattered"))
