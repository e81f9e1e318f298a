"""The ALU operations, activation functions and reductions of the engines, as tables.

Each row is the reference semantics (numpy, float32 math) of one named operation;
the numerics interpreter uses these tables and nothing else.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["ALU_OPS", "ACTIVATIONS", "REDUCE_OPS", "erf"]


def erf(x: np.ndarray) -> np.ndarray:
    """Error function, Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7)."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))


def _gelu(x):
    return 0.5 * x * (1.0 + erf(x * np.float32(0.7071067811865476)))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x)))


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _softplus(x):
    # log(1 + exp(x)) computed without overflow
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _rsqrt(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 / np.sqrt(x)


def _reciprocal(x):
    with np.errstate(divide="ignore"):
        return 1.0 / x


def _gelu_dx(x):
    phi = np.exp(-0.5 * x * x) * np.float32(0.3989422804014327)
    return 0.5 * (1.0 + erf(x * np.float32(0.7071067811865476))) + x * phi


def _gelu_sigmoid(x):
    return x * _sigmoid(np.float32(1.702) * x)


def _gelu_sigmoid_dx(x):
    s = _sigmoid(np.float32(1.702) * x)
    return s + np.float32(1.702) * x * s * (1.0 - s)


def _silu_dx(x):
    s = _sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def _ints(fn):
    """A bitwise op on integer operands (values as int64)."""
    return lambda a, b: fn(np.asarray(a).astype(np.int64), np.asarray(b).astype(np.int64))


def _as01(fn):
    return lambda a, b: fn(a, b).astype(np.float32)


# name -> binary function on float32 arrays (comparisons give 1.0 / 0.0)
ALU_OPS: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": lambda a, b: np.divide(a, b),
    "maximum": np.maximum,
    "minimum": np.minimum,
    "power": lambda a, b: np.power(a, b),
    "mod": lambda a, b: np.fmod(a, b),
    "abs_max": lambda a, b: np.maximum(np.abs(a), np.abs(b)),
    "equal": _as01(np.equal),
    "not_equal": _as01(np.not_equal),
    "greater": _as01(np.greater),
    "greater_equal": _as01(np.greater_equal),
    "less": _as01(np.less),
    "less_equal": _as01(np.less_equal),
    "logical_and": _as01(lambda a, b: np.logical_and(a != 0, b != 0)),
    "logical_or": _as01(lambda a, b: np.logical_or(a != 0, b != 0)),
    "logical_xor": _as01(lambda a, b: np.logical_xor(a != 0, b != 0)),
    "bypass": lambda a, b: a,
    "bitwise_and": _ints(np.bitwise_and),
    "bitwise_or": _ints(np.bitwise_or),
    "bitwise_xor": _ints(np.bitwise_xor),
    "left_shift": _ints(np.left_shift),
    "right_shift": _ints(np.right_shift),
}

# name -> unary function on float32 arrays (ScalarE activation table)
ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "identity": lambda x: x,
    "copy": lambda x: x,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": _rsqrt,
    "reciprocal": _reciprocal,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, 0),
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "silu": lambda x: x * _sigmoid(x),
    "softplus": _softplus,
    "erf": erf,
    "square": np.square,
    "abs": np.abs,
    "negative": np.negative,
    "sign": np.sign,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "arctan": np.arctan,
    "floor": np.floor,
    "ceil": np.ceil,
    "trunc": np.trunc,
    "gelu_dx": _gelu_dx,
    "gelu_apprx_sigmoid": _gelu_sigmoid,
    "gelu_apprx_sigmoid_dx": _gelu_sigmoid_dx,
    "silu_dx": _silu_dx,
    "erf_dx": lambda x: np.float32(1.1283791670955126) * np.exp(-x * x),
    "mish": lambda x: x * np.tanh(_softplus(x)),
}

# name -> (numpy reduction, identity element)
REDUCE_OPS: dict[str, tuple[Callable[..., np.ndarray], float]] = {
    "add": (np.sum, 0.0),
    "max": (np.max, -np.inf),
    "min": (np.min, np.inf),
    "multiply": (np.prod, 1.0),
}
