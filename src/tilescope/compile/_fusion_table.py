"""What the fuser knows about each aten op: which shared definition computes it.

The tile-level semantics of an op live once, in the eager lowering's tables: pointwise ops in
:data:`tilescope.lower._elementwise.OPS`, reductions in :data:`tilescope.lower._reduce.REDUCTIONS`
(and the per-tile functions beside it). The fuser only adds what is structural: metadata-only
views, constants the graph makes, matmuls, and the names post-AOT graphs give some ops. Anything
not found here is not fused; it runs as its own device execution and
``tilescope.compile.explain`` says why.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..lower.internal import OPS
from ..lower.internal import REDUCTIONS as _REDUCTIONS

aten = torch.ops.aten

__all__ = ["OPS", "ROW_ALIASES", "REDUCTIONS", "VIEWS", "CONSTANTS", "MATMULS", "packet_name", "row_of",
           "named_args", "is_reduction"]


def packet_name(target) -> str:
    """``aten.add.Tensor`` -> ``"add"``."""
    packet = getattr(target, "_overloadpacket", None)
    name = getattr(packet, "__name__", None) or getattr(target, "__name__", str(target))
    return name.split(".")[-1]


# graph op name -> the OPS row computing it, where the two spell it differently
ROW_ALIASES = {"convert_element_type": "_to_copy"}

# reductions fused over the last dim: the eager lowering's rows (max/min return indices too)
REDUCTIONS = {k: v for k, v in _REDUCTIONS.items() if k not in ("max", "min", "norm")}

# metadata-only ops: no instruction when the row-group layout is kept (post-AOT graphs are
# functional, so a clone or a detach is the same value)
VIEWS = {
    "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand", "alias", "clone",
    "detach", "contiguous", "lift_fresh_copy", "broadcast_in_dim",
}

# ops that make a constant-filled tensor: (index of the fill value in args, or the value itself)
CONSTANTS = {"full": -1, "scalar_tensor": 0, "full_like": 1, "zeros_like": 0.0, "ones_like": 1.0}

MATMULS = {"mm", "addmm", "bmm", "matmul"}


def row_of(name: str):
    """The OPS row of graph op ``name``, or None."""
    return OPS.get(ROW_ALIASES.get(name, name))


def is_reduction(name: str) -> bool:
    return name in REDUCTIONS


def named_args(node: fx.Node) -> dict:
    """Every argument of ``node`` by its schema name (defaults filled in), as the eager rows
    receive them."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return {f"arg{i}": a for i, a in enumerate(node.args)} | dict(node.kwargs)
    out = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            out[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
    return out
