"""What the fuser knows about each aten op, as tables.

Each row says how an op of a post-AOT aten graph maps onto tile instructions
inside a fused row group ``[rows, D]``: a binary ALU op, a ScalarE activation, a
reduction over the last dim, a metadata-only view, a dtype cast. Anything not in
these tables is not fused; it runs as its own device execution and
``tilescope.compile.explain`` says why.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

__all__ = ["BINARY", "UNARY", "REDUCTIONS", "VIEWS", "CASTS", "MATMULS", "packet_name", "pow_scalar_rule"]


def packet_name(target) -> str:
    """``aten.add.Tensor`` -> ``"add"``."""
    packet = getattr(target, "_overloadpacket", None)
    name = getattr(packet, "__name__", None) or getattr(target, "__name__", str(target))
    return name.split(".")[-1]


# aten op -> ALU operation of tensor_tensor / tensor_scalar
BINARY = {
    "add": "add",
    "sub": "subtract",
    "rsub": "subtract",  # reversed operands
    "mul": "multiply",
    "div": "divide",
    "maximum": "maximum",
    "minimum": "minimum",
    "pow": "power",  # Tensor_Tensor; Tensor_Scalar goes through pow_scalar_rule
    "eq": "equal",
    "ne": "not_equal",
    "gt": "greater",
    "ge": "greater_equal",
    "lt": "less",
    "le": "less_equal",
    "logical_and": "logical_and",
    "logical_or": "logical_or",
    "fmod": "mod",
}

# aten op -> ScalarE activation function
UNARY = {
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "relu": "relu",
    "silu": "silu",
    "erf": "erf",
    "neg": "negative",
    "abs": "abs",
    "reciprocal": "reciprocal",
    "sin": "sin",
    "cos": "cos",
    "sign": "sign",
    "square": "square",
    "gelu": "gelu",  # approximate="tanh" -> gelu_tanh
}

# aten op -> (reduce op, divide by the reduced size)
REDUCTIONS = {
    "sum": ("add", False),
    "mean": ("add", True),
    "amax": ("max", False),
    "amin": ("min", False),
}

# metadata-only ops: no instruction when the row-group layout is kept
VIEWS = {
    "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand", "alias", "clone",
    "detach", "contiguous", "lift_fresh_copy", "broadcast_in_dim",
}

CASTS = {"_to_copy", "convert_element_type"}

MATMULS = {"mm", "addmm", "bmm", "matmul"}


def pow_scalar_rule(exponent: float) -> tuple[str, str | float]:
    """``x ** c`` as an activation where one exists, else an ALU power with a constant."""
    table = {2.0: ("act", "square"), 0.5: ("act", "sqrt"), -0.5: ("act", "rsqrt"),
             -1.0: ("act", "reciprocal"), 1.0: ("act", "copy")}
    return table.get(float(exponent), ("alu", float(exponent)))
