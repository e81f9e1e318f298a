"""``tril`` / ``triu``: each tile of the last two dims keeps the elements on its side of the
diagonal, the others become zero.

Rows of a matrix go to partitions (``k`` consecutive rows per partition when rows are short),
columns to the free dim. GpSimd's ``iota`` writes each element's signed distance from the kept
side -- ``(column - row) - diagonal`` for ``tril``, negated for ``triu`` -- VectorE compares it
with zero and selects the input or zero: one load and one store per element, whatever the
batch dims (looped over).

>>> from tilescope.lower import Call, TensorMeta, lower
>>> x = TensorMeta((4, 256, 256), (65536, 256, 1), "float32")
>>> low = lower(Call("aten::tril", (x, 1), (), (TensorMeta((4, 256, 256), (65536, 256, 1), "float32"),)))
>>> low.rule, low.program.summary_counts()["iota"]
('triangle', 4)
"""

from __future__ import annotations

from ..isa import AP
from ..program import TileBuilder, View
from ._call import Call, TensorMeta
from ._layout import TilePlan, hbm_input, hbm_output
from ._rules import Rule, add_rules

__all__ = ["lower_triangle"]

_MAX_FREE = 2048
# dtypes the engines carry exactly through a select (their fp32 datapath): no int32 / int64
_DTYPES = {"float32", "bfloat16", "float16", "bool", "uint8", "int8", "int16"}


def lower_triangle(call: Call, spec):
    """The Program of ``tril`` / ``triu`` (None for what it does not cover: fewer than two dims,
    integer dtypes the fp32 datapath would round, a non-integer diagonal)."""
    named = call.named()
    x, diagonal = named.get("self"), named.get("diagonal", 0)
    if not isinstance(x, TensorMeta) or x.ndim < 2 or x.numel == 0 or len(call.outputs) != 1:
        return None
    if x.dtype not in _DTYPES or not isinstance(diagonal, int) or isinstance(diagonal, bool):
        return None
    out = call.outputs[0]
    lower_side = call.packet == "tril"
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        src = hbm_input(b, "in_self", x)
        dst = hbm_output(b, "out", out)
        plan = TilePlan(tuple(x.shape), max_free=_MAX_FREE, partitions=spec.partitions)
        for tile in plan.tiles:
            p, k, cols = tile.partitions, tile.rows_per_partition, tile.cols
            shape = (p, k, cols)
            t = b.sbuf(shape, x.device_dtype, site="tri.in")
            b.dma_copy(t, plan.operand_ap(src, tuple(x.stride), tile))
            # distance of element (row r0 + k p + i, column c0 + j) from the kept side
            dist = b.sbuf(shape, "float32", site="tri.dist")
            sign = 1 if lower_side else -1
            b.iota(dist, base=sign * (tile.col0 - tile.row0 - diagonal), partition_step=-sign * k,
                   steps=(-sign, sign))
            keep = b.sbuf(shape, "uint8", site="tri.keep")
            b.tensor_scalar(keep, dist, "less_equal", 0.0)
            o = b.sbuf(shape, out.device_dtype, site="tri.out")
            b.select(o, keep, t, 0.0)
            b.dma_copy(plan.operand_ap(dst, tuple(out.stride), tile), o)
    return b.build(meta={"lowering": "triangle"})


add_rules(["tril", "triu"], Rule("triangle", lower_triangle, "tril / triu: iota distance, compare, select"))
