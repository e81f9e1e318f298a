"""``native_dropout``: what ``nn.Dropout`` and ``F.dropout`` reach on the device (training).

One tiled pass over the input: VectorE's ``dropout`` instruction (its random number
generator, ``nki.isa.dropout``) zeroes elements of a constant tile holding ``1 / (1 - p)``,
which is both the output's factor (``out = x * keep``) and, compared with zero, the ``mask``
output that the backward (``native_dropout_backward``) multiplies by. The Program draws its
own random numbers; the device's values come from CPU torch with the device generator's state.

>>> from tilescope.lower import Call, TensorMeta, lower
>>> x = TensorMeta((64, 256), (256, 1), "float32")
>>> m = TensorMeta((64, 256), (256, 1), "bool")
>>> low = lower(Call("aten::native_dropout", (x, 0.1, True), (), (x, m)))
>>> low.rule, low.program.summary_counts()["dropout"]
('dropout', 1)
"""

from __future__ import annotations

from ..program import TileBuilder
from ._call import Call, TensorMeta
from ._layout import coalesce, hbm_input, hbm_output, spread
from ._rules import Rule, add_rules

__all__ = ["lower_native_dropout"]

_MAX_FREE = 2048
_FLOATS = ("float32", "bfloat16", "float16", "float64")


def lower_native_dropout(call: Call, spec):
    named = call.named()
    x, p, train = named.get("input"), named.get("p"), named.get("train")
    if len(call.outputs) != 2 or not isinstance(x, TensorMeta) or x.numel == 0 or x.dtype not in _FLOATS:
        return None
    if train is False or not isinstance(p, (int, float)) or not 0.0 < float(p) < 1.0:
        return None  # evaluation, or nothing (p = 0) / everything (p = 1) dropped: the generic path
    out, mask = call.outputs
    if out.shape != x.shape or mask.shape != x.shape:
        return None
    p = float(p)
    shape, (xs, os_, ms) = coalesce(tuple(x.shape) or (1,), [tuple(x.stride) or (0,), tuple(out.stride) or (0,),
                                                            tuple(mask.stride) or (0,)])
    layout = spread(shape, [xs, os_, ms], [x.device_dtype, out.device_dtype, mask.device_dtype], spec,
                    max_free=_MAX_FREE)
    xs, os_, ms = layout.strides
    plan = layout.plan(max_free=_MAX_FREE, partitions=spec.partitions)
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        X = hbm_input(b, "in_input", x)
        O = hbm_output(b, "out0", out)
        M = hbm_output(b, "out1", mask)
        dt = out.device_dtype
        width = max(t.free for t in plan.tiles)
        scale = b.sbuf((spec.partitions, width), dt, site="drop.scale", bufs=1)
        b.memset(scale, 1.0 / (1.0 - p), engine="pool")  # once: every tile draws from it
        for tile in plan.tiles:
            tshape = (tile.partitions, tile.free)
            t = b.sbuf(tshape, x.device_dtype, site="drop.in")
            b.dma_copy(t, plan.operand_ap(X, xs, tile))
            keep = b.sbuf(tshape, dt, site="drop.keep")
            b.dropout(keep, scale[:tile.partitions, :tile.free], p)  # 0 or 1 / (1 - p)
            o = b.sbuf(tshape, dt, site="drop.out")
            b.tensor_tensor(o, t, keep, "multiply")
            b.dma_copy(plan.operand_ap(O, os_, tile), o)
            m = b.sbuf(tshape, mask.device_dtype, site="drop.mask")
            b.tensor_scalar(m, keep, "not_equal", 0.0, engine="act")
            b.dma_copy(plan.operand_ap(M, ms, tile), m)
    return b.build(meta={"lowering": "dropout"})


add_rules(["native_dropout"], Rule("dropout", lower_native_dropout, "native_dropout on VectorE's dropout"))
