"""One event's stored record, read straight from the engine's Parquet files by its eid.

The engine numbers events ``eid = rank << 48 | part << 32 | row`` (``row`` within the part
file ``events/rank=<r>/part-<part>.parquet``), so a click needs one row group of one file:
a few milliseconds on a trace of millions of events, with no query engine and no lock (each
call opens its own file handle; the row-group offsets are read once per file).
"""

from __future__ import annotations

import glob
import json
import os
import threading

import numpy as np

__all__ = ["EventRows"]


class EventRows:
    """Stored records of one trace's events by eid (see the module doc)."""

    def __init__(self, trace):
        self.files: dict[tuple[int, int], str] = {}
        for entry, rank in zip(trace.entries, trace.ranks):
            for f in glob.glob(os.path.join(entry, "events", "*", "part-*.parquet")):
                try:
                    part = int(os.path.basename(f)[len("part-"):-len(".parquet")])
                except ValueError:
                    continue
                self.files[(int(rank), part)] = f
        self._offsets: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()  # guards the offsets dict only (never held while reading)

    def _row_groups(self, path: str) -> np.ndarray:
        off = self._offsets.get(path)
        if off is None:
            import pyarrow.parquet as pq

            md = pq.ParquetFile(path).metadata
            off = np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)])
            with self._lock:
                self._offsets[path] = off
        return off

    def record(self, eid: int) -> dict:
        """The stored columns of event ``eid`` (``args`` parsed); KeyError when it has none."""
        import pyarrow.parquet as pq

        rank, part, row = eid >> 48, (eid >> 32) & 0xFFFF, eid & 0xFFFFFFFF
        path = self.files.get((rank, part))
        if path is None:
            raise KeyError(f"no event with eid {eid}")
        off = self._row_groups(path)
        g = int(np.searchsorted(off, row, side="right")) - 1
        if not 0 <= g < off.size - 1:
            raise KeyError(f"no event with eid {eid}")
        tab = pq.ParquetFile(path).read_row_group(g).slice(row - int(off[g]), 1)
        d = {c: tab.column(c)[0].as_py() for c in tab.column_names}
        args = d.get("args")
        if isinstance(args, str):
            try:
                d["args"] = json.loads(args)
            except ValueError:
                pass
        elif args is None:
            d["args"] = {}
        return d
