"""A minimal Parquet writer for the native ingest's column pages (no Arrow, no DuckDB).

The native scanner (``_kscan``) hands over one page body per column per batch (PLAIN
values, definition levels as one bit-packed run); this module frames them as data pages,
one row group per batch, and writes the footer (Thrift compact protocol) on close.
Pages are uncompressed: compressing would cost more time than the whole scan, and the
cache is read from the page cache. Only what the events table needs is implemented:
flat INT32/INT64/BYTE_ARRAY columns, no dictionaries, no nesting. :func:`write_table` frames
small tables given as Python lists the same way (the lanes table: no pyarrow needed).

>>> import duckdb, os, struct, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
>>> w = ParquetWriter(path, [("n", "INT64", None), ("s", "STRING", None)])
>>> valid = struct.pack("<I", 2) + bytes([3, 0b11])  # 2 rows, both present
>>> w.write_row_group(2, [valid + struct.pack("<2q", 7, 8),
...                       valid + struct.pack("<I", 1) + b"a" + struct.pack("<I", 2) + b"bc"],
...                   nulls=[0, 0], minmax=[(7, 8), None])
>>> w.close()
>>> duckdb.sql(f"SELECT * FROM '{path}'").fetchall()
[(7, 'a'), (8, 'bc')]
"""

from __future__ import annotations

import struct

from .. import __version__

__all__ = ["ParquetWriter", "plain_page", "write_table"]

# Thrift compact protocol type ids
_BOOL_TRUE, _I32, _I64, _BINARY, _LIST, _STRUCT = 1, 5, 6, 8, 9, 12

# Parquet enums (parquet.thrift)
_PHYSICAL = {"INT32": 1, "INT64": 2, "STRING": 6, "JSON": 6}
_CONVERTED = {"STRING": 0, "JSON": 19}  # UTF8, JSON
_LOGICAL_FIELD = {"STRING": 1, "JSON": 12}  # LogicalType union members
_PLAIN, _RLE, _DATA_PAGE, _REQUIRED, _OPTIONAL, _UNCOMPRESSED = 0, 3, 0, 0, 1, 0


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _zigzag(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


def _struct(fields) -> bytes:
    """fields: (id, type, value) in increasing id order; None values are left out."""
    out = bytearray()
    last = 0
    for fid, t, v in fields:
        if v is None:
            continue
        delta = fid - last
        out += bytes([(delta << 4) | t]) if 0 < delta <= 15 else bytes([t]) + _zigzag(fid)
        last = fid
        out += _value(t, v)
    out.append(0)
    return bytes(out)


def _value(t: int, v) -> bytes:
    if t in (_I32, _I64):
        return _zigzag(v)
    if t == _BINARY:
        v = v.encode() if isinstance(v, str) else v
        return _varint(len(v)) + v
    if t == _STRUCT:
        return v if isinstance(v, bytes) else _struct(v)  # bytes: already encoded
    if t == _LIST:
        elem, items = v
        head = bytes([(len(items) << 4) | elem]) if len(items) < 15 else bytes([0xF0 | elem]) + _varint(len(items))
        return head + b"".join(_value(elem, x) for x in items)
    raise ValueError(f"thrift type {t} is not used by this writer")


class ParquetWriter:
    """Writes row groups of pre-encoded pages; ``columns`` is ``[(name, kind, _), ...]`` with
    kind ``INT32`` (required) or ``INT64`` / ``STRING`` / ``JSON`` (optional)."""

    def __init__(self, path: str, columns):
        self.columns = [(name, kind) for name, kind, *_ in columns]
        self._f = open(path, "wb")
        self._f.write(b"PAR1")
        self._pos = 4
        self._groups: list[tuple] = []
        self._rows = 0

    def write_row_group(self, rows: int, bodies, nulls, minmax) -> None:
        """One row group: ``bodies[i]`` is column i's page body, ``nulls[i]`` its null count,
        ``minmax[i]`` ``(min, max)`` for INT64 statistics or None."""
        chunks = []
        start = self._pos
        for (name, kind), body, n_null, mm in zip(self.columns, bodies, nulls, minmax):
            stats = [(3, _I64, n_null)] if kind != "INT32" else []
            if mm is not None:
                stats += [(5, _BINARY, struct.pack("<q", mm[1])), (6, _BINARY, struct.pack("<q", mm[0]))]
            header = _struct([
                (1, _I32, _DATA_PAGE), (2, _I32, len(body)), (3, _I32, len(body)),
                (5, _STRUCT, [(1, _I32, rows), (2, _I32, _PLAIN), (3, _I32, _RLE), (4, _I32, _RLE),
                              (5, _STRUCT, stats or None)]),
            ])
            offset = self._pos
            self._f.write(header)
            self._f.write(body)
            size = len(header) + len(body)
            self._pos += size
            meta = [(1, _I32, _PHYSICAL[kind]), (2, _LIST, (_I32, [_PLAIN, _RLE])), (3, _LIST, (_BINARY, [name])),
                    (4, _I32, _UNCOMPRESSED), (5, _I64, rows), (6, _I64, size), (7, _I64, size),
                    (9, _I64, offset), (12, _STRUCT, stats or None)]
            chunks.append(_struct([(2, _I64, offset), (3, _STRUCT, meta)]))
        total = self._pos - start
        self._groups.append((chunks, total, rows, start))
        self._rows += rows

    def close(self) -> None:
        schema = [[(4, _BINARY, "schema"), (5, _I32, len(self.columns))]]
        for name, kind in self.columns:
            el = [(1, _I32, _PHYSICAL[kind]), (3, _I32, _REQUIRED if kind == "INT32" else _OPTIONAL), (4, _BINARY, name)]
            if kind in _CONVERTED:
                el += [(6, _I32, _CONVERTED[kind]), (10, _STRUCT, [(_LOGICAL_FIELD[kind], _STRUCT, [])])]
            schema.append(el)
        groups = [[(1, _LIST, (_STRUCT, chunks)), (2, _I64, total), (3, _I64, rows), (5, _I64, start),
                   (6, _I64, total)] for chunks, total, rows, start in self._groups]
        footer = _struct([(1, _I32, 1), (2, _LIST, (_STRUCT, schema)), (3, _I64, self._rows),
                          (4, _LIST, (_STRUCT, groups)), (6, _BINARY, f"tilescope version {__version__}")])
        self._f.write(footer)
        self._f.write(struct.pack("<I", len(footer)))
        self._f.write(b"PAR1")
        self._f.close()

    def abort(self) -> None:
        self._f.close()


def plain_page(kind: str, values: list) -> tuple[bytes, int, tuple | None]:
    """One column's page body from Python values (None: NULL), its null count and its
    (min, max) for INT64: ``kind`` as in :class:`ParquetWriter` (``INT32`` has no NULLs).

    >>> plain_page("INT64", [5, None, 2])
    (b'\\x02\\x00\\x00\\x00\\x03\\x05\\x05\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02\\x00\\x00\\x00\\x00\\x00\\x00\\x00', 1, (2, 5))
    """
    if kind == "INT32":
        return struct.pack(f"<{len(values)}i", *values), 0, None
    present = [v for v in values if v is not None]
    bits = bytearray((len(values) + 7) // 8)
    for i, v in enumerate(values):
        if v is not None:
            bits[i >> 3] |= 1 << (i & 7)
    levels = _varint((len(bits) << 1) | 1) + bytes(bits)  # one bit-packed run of definition levels
    if kind == "INT64":
        body = struct.pack(f"<{len(present)}q", *present)
        minmax = (min(present), max(present)) if present else None
    else:
        encoded = [v.encode() for v in present]
        body = b"".join(struct.pack("<I", len(b)) + b for b in encoded)
        minmax = None
    return struct.pack("<I", len(levels)) + levels + body, len(values) - len(present), minmax


def write_table(path: str, columns, data: dict) -> None:
    """A small table (``data``: column name -> list of values) as one row group;
    ``columns``: ``[(name, kind), ...]`` as in :class:`ParquetWriter`."""
    rows = len(data[columns[0][0]]) if columns else 0
    pages = [plain_page(kind, data[name]) for name, kind in columns]
    w = ParquetWriter(path, columns)
    try:
        if rows:
            w.write_row_group(rows, [p[0] for p in pages], [p[1] for p in pages], [p[2] for p in pages])
        w.close()
    except BaseException:
        w.abort()
        raise
