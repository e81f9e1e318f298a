"""The explorer's packed columnar format: named typed arrays in one binary body.

Layout (all little-endian)::

    b"TSB1"                      magic
    uint32 H                     length of the JSON header in bytes
    H bytes                      JSON header: {"arrays": [{"name", "dtype", "length", "offset"}], ...}
    zero padding to a multiple of 8
    array bytes                  each array starts at ``offset`` (relative to the end of the
                                 padding) and at a multiple of 8, so the browser wraps it in a
                                 typed array (Float64Array, Uint32Array, ...) without copying

``pack`` and ``unpack`` are inverses; the front end's ``static/binary.js`` reads the same layout.
"""

from __future__ import annotations

import json
import struct

import numpy as np

__all__ = ["MAGIC", "DTYPES", "pack", "unpack"]

MAGIC = b"TSB1"

# header dtype name -> numpy dtype (the typed arrays JavaScript has)
DTYPES = {
    "f64": np.dtype("<f8"), "f32": np.dtype("<f4"), "i32": np.dtype("<i4"), "u32": np.dtype("<u4"),
    "i16": np.dtype("<i2"), "u16": np.dtype("<u2"), "u8": np.dtype("u1"), "i8": np.dtype("i1"),
}


def _pad8(n: int) -> int:
    return (-n) % 8


def pack(arrays: dict[str, tuple[str, np.ndarray]], header: dict | None = None) -> bytes:
    """Pack ``{name: (dtype, array)}`` (dtype a key of :data:`DTYPES`) plus a JSON-able header."""
    meta = dict(header or {})
    specs, chunks, off = [], [], 0
    for name, (dt, arr) in arrays.items():
        if dt not in DTYPES:
            raise ValueError(f"array {name!r}: dtype {dt!r} is not one of {', '.join(DTYPES)}")
        a = np.ascontiguousarray(np.asarray(arr), dtype=DTYPES[dt])
        if a.ndim != 1:
            raise ValueError(f"array {name!r} must be 1-D, got shape {a.shape}")
        raw = a.tobytes()
        specs.append({"name": name, "dtype": dt, "length": int(a.size), "offset": off})
        chunks.append(raw)
        chunks.append(b"\0" * _pad8(len(raw)))
        off += len(raw) + _pad8(len(raw))
    meta["arrays"] = specs
    head = json.dumps(meta, separators=(",", ":"), allow_nan=False).encode()
    prefix = MAGIC + struct.pack("<I", len(head)) + head
    return prefix + b"\0" * _pad8(len(prefix)) + b"".join(chunks)


def unpack(data: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """(header, {name: array}) from :func:`pack`'s output (used by tests and scripts)."""
    if data[:4] != MAGIC:
        raise ValueError(f"not a packed explorer body (magic {data[:4]!r}, expected {MAGIC!r})")
    (hlen,) = struct.unpack("<I", data[4:8])
    header = json.loads(data[8:8 + hlen])
    base = 8 + hlen + _pad8(8 + hlen)
    out = {}
    for s in header["arrays"]:
        dt = DTYPES[s["dtype"]]
        start = base + s["offset"]
        out[s["name"]] = np.frombuffer(data, dtype=dt, count=s["length"], offset=start)
    return header, out
