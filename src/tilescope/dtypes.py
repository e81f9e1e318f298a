"""The element types the device knows, as one table.

>>> itemsize("bfloat16")
2
>>> canonical("bf16")
'bfloat16'
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["DTYPES", "canonical", "itemsize", "to_numpy", "is_float", "from_numpy"]

# name -> (numpy dtype, is floating point)
DTYPES: dict[str, tuple[np.dtype, bool]] = {
    "float32": (np.dtype(np.float32), True),
    "bfloat16": (np.dtype(ml_dtypes.bfloat16), True),
    "float16": (np.dtype(np.float16), True),
    "float8_e4m3": (np.dtype(ml_dtypes.float8_e4m3fn), True),
    "float8_e5m2": (np.dtype(ml_dtypes.float8_e5m2), True),
    "int64": (np.dtype(np.int64), False),  # index tensors (PyTorch's default integer type)
    "int32": (np.dtype(np.int32), False),
    "int16": (np.dtype(np.int16), False),
    "int8": (np.dtype(np.int8), False),
    "uint8": (np.dtype(np.uint8), False),
    "uint16": (np.dtype(np.uint16), False),
    "uint32": (np.dtype(np.uint32), False),
}

_ALIASES = {
    "fp32": "float32", "float": "float32", "f32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16", "half": "float16", "f16": "float16",
    "fp8": "float8_e4m3", "float8_e4m3fn": "float8_e4m3",
    "int": "int32", "i32": "int32", "long": "int64", "i64": "int64",
    "bool": "uint8",
}


def canonical(dtype) -> str:
    """The canonical name of a dtype given as a name, numpy dtype or torch dtype."""
    if isinstance(dtype, str):
        name = _ALIASES.get(dtype, dtype)
        if name in DTYPES:
            return str(name)  # a plain str, also for str subclasses (a tile's .dtype)
    else:
        name = str(dtype).replace("torch.", "")
        name = _ALIASES.get(name, name)
        if name in DTYPES:
            return name
        try:
            return from_numpy(np.dtype(dtype))
        except TypeError:
            pass
    raise TypeError(
        f"unsupported dtype {dtype!r}; the device supports {', '.join(DTYPES)}"
    )


def from_numpy(dt: np.dtype) -> str:
    for name, (ndt, _) in DTYPES.items():
        if ndt == dt:
            return name
    if dt == np.bool_:
        return "uint8"
    raise TypeError(f"unsupported dtype {dt}; the device supports {', '.join(DTYPES)}")


def itemsize(dtype: str) -> int:
    return DTYPES[dtype][0].itemsize


def to_numpy(dtype: str) -> np.dtype:
    return DTYPES[dtype][0]


def is_float(dtype: str) -> bool:
    return DTYPES[dtype][1]
