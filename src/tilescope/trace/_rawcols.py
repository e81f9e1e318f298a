"""The nesting's input as raw arrays beside the Parquet parts, written by the native ingest.

The first op table needs ten columns of every record (ph, cat, name, pid, tid as codes; ts,
dur, correlation, flow_id with their validity) and the names of the lanes. Reading them back
from Parquet costs pyarrow's reader (~10 MB and 0.05 s to import) and an Arrow copy of each
column; the C parser already has them in hand, so while it writes the pages it also hands
them over as arrays (the strings dictionary-encoded per batch), and this module appends them
to one flat file per column in the entry's ``columns/`` folder::

    columns/index.json      rows, the part files mirrored, per string column its values
                            (code -> value), the lane-naming 'M' records (row, args)
    columns/<col>.i32       ph cat name pid tid: int32 codes (-1: NULL)
    columns/<col>.i64       ts dur correlation flow_id: int64 (0 where NULL)
    columns/<col>.ok        their validity, one byte per row

Reading them is ``np.fromfile``: no Arrow, no Python object per row. An entry without the
folder (the DuckDB ingest, an older cache) or whose part files differ from the ones recorded
(the 'B'/'E' slices' part, added after the scan) is read from Parquet instead
(:func:`tilescope.trace._columns.read_entry`).
"""

from __future__ import annotations

import json
import os

import numpy as np

__all__ = ["RawColumnsWriter", "read_raw", "CODED", "INTS"]

VERSION = 1
CODED = ("ph", "cat", "name", "pid", "tid")  # the scanner's first five columns, in its order
INTS = {"ts": 5, "dur": 6, "correlation": 11, "flow_id": 15}  # column -> index in the scanner's pages
INDEX = "index.json"


def _page_ints(body: bytes, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """An optional INT64 page body as (dense values, 0 where NULL; validity).

    >>> import struct
    >>> body = struct.pack("<I", 2) + bytes([3, 0b101]) + struct.pack("<2q", 7, 9)
    >>> [a.tolist() for a in _page_ints(body, 3)]
    [[7, 0, 9], [True, False, True]]
    """
    deflen = int.from_bytes(body[:4], "little")
    groups = (rows + 7) // 8
    bitmap = np.frombuffer(body, dtype=np.uint8, count=groups, offset=4 + deflen - groups)
    valid = np.unpackbits(bitmap, bitorder="little", count=rows).astype(bool)
    dense = np.zeros(rows, dtype=np.int64)
    dense[valid] = np.frombuffer(body, dtype="<i8", offset=4 + deflen)
    return dense, valid


class RawColumnsWriter:
    """Appends each scanned batch's columns to ``folder`` (see the module doc); ``close(parts)``
    writes the index naming the part files the rows mirror."""

    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        self.rows = 0
        self.ids: dict[str, dict] = {c: {} for c in CODED}  # value -> entry-wide code, per column
        self.named: dict[tuple, tuple] = {}  # (name, pid, tid) -> (row, args) of its first naming record
        self._files = {c: open(os.path.join(folder, c + ".i32"), "wb") for c in CODED}
        for c in INTS:
            self._files[c] = open(os.path.join(folder, c + ".i64"), "wb")
            self._files[c + ".ok"] = open(os.path.join(folder, c + ".ok"), "wb")

    def add(self, r: dict) -> None:
        """One batch of ``_kscan.scan``'s result (its ``codes``, ``names`` and INT64 pages)."""
        rows = r["rows"]
        batch: dict[str, tuple] = {}
        for c, (codes, values) in zip(CODED, r["codes"]):
            ids = self.ids[c]
            remap = np.array([ids.setdefault(v, len(ids)) for v in values] + [-1], dtype=np.int32)
            local = np.frombuffer(codes, dtype=np.int32)
            remap[local].tofile(self._files[c])  # (-1, NULL, reads the trailing -1)
            batch[c] = (local, values)
        for c, k in INTS.items():
            dense, valid = _page_ints(r["bodies"][k], rows)
            dense.tofile(self._files[c])
            valid.tofile(self._files[c + ".ok"])
        for row, args in r["names"]:
            key = tuple(None if batch[c][0][row] < 0 else batch[c][1][batch[c][0][row]] for c in ("name", "pid", "tid"))
            self.named.setdefault(key, (self.rows + row, args))
        self.rows += rows

    def close(self, parts: list) -> None:
        """Finish the files; ``parts``: ``[base name, rows]`` of each Parquet part file, in row order."""
        self.abort()
        index = {"version": VERSION, "rows": self.rows, "parts": parts,
                 "values": {c: list(ids) for c, ids in self.ids.items()},
                 "named": sorted(self.named.values())}
        with open(os.path.join(self.folder, INDEX), "w", encoding="utf-8") as f:
            json.dump(index, f, separators=(",", ":"))

    def abort(self) -> None:
        """Close the files (again: a no-op)."""
        for f in self._files.values():
            f.close()


def read_raw(entry: str, part_files: list[str]) -> dict | None:
    """The arrays of ``entry/columns`` (``codes``, ``values``, ``ints``, ``valid``, ``named``,
    ``part_rows``), or None when there are none or they mirror other part files than
    ``part_files`` (paths of the entry's event Parquet files, in row order)."""
    folder = os.path.join(entry, "columns")
    try:
        with open(os.path.join(folder, INDEX), encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError):
        return None
    if index.get("version") != VERSION or [p for p, _n in index["parts"]] != [os.path.basename(p) for p in part_files]:
        return None
    if len({os.path.dirname(p) for p in part_files}) > 1:  # (the scanner writes one rank's folder)
        return None
    n = index["rows"]
    if sum(k for _p, k in index["parts"]) != n:
        return None
    out: dict = {"values": index["values"], "named": index["named"], "part_rows": [k for _p, k in index["parts"]],
                 "codes": {}, "ints": {}, "valid": {}}
    for c in CODED:
        out["codes"][c] = np.fromfile(os.path.join(folder, c + ".i32"), dtype=np.int32)
    for c in INTS:
        out["ints"][c] = np.fromfile(os.path.join(folder, c + ".i64"), dtype=np.int64)
        out["valid"][c] = np.fromfile(os.path.join(folder, c + ".ok"), dtype=np.bool_)
    if any(len(a) != n for d in ("codes", "ints", "valid") for a in out[d].values()):
        return None  # (a damaged folder: read the Parquet parts)
    return out
