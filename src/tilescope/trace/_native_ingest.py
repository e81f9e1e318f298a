"""The native ingest: the C parser (``_kscan``) turns the ``traceEvents`` array straight into
Parquet pages, with no intermediate text and no database in the loop.

The pure-Python scanner still reads everything outside the array (it is small) and hands the
array's bytes over; per block, ``_kscan.scan`` returns one page per column for the complete
events, and :class:`~tilescope.trace._parquet.ParquetWriter` frames them as a row group. Memory
is a few blocks whatever the trace's size, and the process never opens DuckDB: the engine's
first query does, over the finished files.

Used when the extension is built (``pip install`` compiles it; see ``available()``); the
DuckDB JSON path in ``_ingest.py`` is the fallback and can be forced with
``TILESCOPE_TRACE_INGEST=python``.
"""

from __future__ import annotations

import os
import struct
import time

from ._jsonscan import ChromeTraceScanner, TraceFormatError
from ._parquet import ParquetWriter

try:
    from . import _kscan
except ImportError:  # not built (no compiler at install time): the DuckDB path is used
    _kscan = None

__all__ = ["available", "NativeEvents", "ingest_native", "COLUMNS"]

# the events table as written here: (name, kind); kind as in ParquetWriter
COLUMNS = (("part", "INT32"), ("ph", "STRING"), ("cat", "STRING"), ("name", "STRING"), ("pid", "STRING"),
           ("tid", "STRING"), ("ts_ns", "INT64"), ("dur_ns", "INT64"), ("id", "STRING"), ("bp", "STRING"),
           ("s", "STRING"), ("args", "JSON"), ("correlation", "INT64"), ("external_id", "INT64"), ("stream", "INT64"),
           ("device", "INT64"), ("flow_id", "INT64"), ("program_hash", "STRING"))
assert _kscan is None or _kscan.COLUMNS == len(COLUMNS) - 1, "_kscan.c and COLUMNS disagree"
PART_ROWS = 1 << 22  # rows per part file (eid = part << 32 | row keeps far below 2**32)
_STAT_SUMS = ("events", "no_ts", "zero", "neg", "no_dur", "be", "huge_ts", "huge_dur")


def available() -> bool:
    """Whether ingest uses the native parser: ``TILESCOPE_TRACE_INGEST`` unset (when it is
    built), ``native`` (it must be built) or ``python`` (the DuckDB path)."""
    choice = os.environ.get("TILESCOPE_TRACE_INGEST", "").strip().lower()
    if choice not in ("", "native", "python"):
        raise ValueError(f"TILESCOPE_TRACE_INGEST={choice!r}: expected 'native' or 'python' "
                         f"(or unset: native when built)")
    if choice == "native" and _kscan is None:
        raise RuntimeError("TILESCOPE_TRACE_INGEST=native, but tilescope.trace._kscan is not built: install with "
                           "a C compiler (`make setup`, or `pip install -e .`), or unset the variable")
    return _kscan is not None and choice != "python"


MAX_ELEMENT_BYTES = 64 << 20  # one array element held whole while it is incomplete (memory stays bounded)
_WS = b" \t\r\n"


def _between_elements(rest: bytes) -> bytes:
    """What is left after the complete elements, without the whitespace before the next one
    (a run of it would be held, and scanned again, block after block).

    >>> _between_elements(b"   ,    {'ph'")
    b",{'ph'"
    """
    rest = rest.lstrip(_WS)
    if rest[:1] == b",":
        rest = b"," + rest[1:].lstrip(_WS)
    return rest


class NativeEvents:
    """Receives the bytes inside ``traceEvents`` (from the scanner) and passes each batch of
    parsed events to ``on_batch(result)``; keeps the incomplete last element for the next call."""

    def __init__(self, name: str, on_batch):
        self.name = name
        self.on_batch = on_batch
        self.leftover = b""
        self.rows = 0
        self.bad = 0
        self.stats = {k: 0 for k in _STAT_SUMS} | {"t_lo": None, "t_hi": None}

    @property
    def events(self) -> int:
        """Array elements seen so far (parsed rows and skipped malformed ones)."""
        return self.rows + self.bad

    def feed(self, data: bytes, offset: int) -> int:
        """Parse ``data`` (which starts at stream ``offset``); returns the index in ``data``
        just past the array's closing bracket, or -1 while the array goes on."""
        held = len(self.leftover)
        buf = self.leftover + data if held else data
        r = _kscan.scan(buf, False)
        self._take(r)
        if r["stray"] >= 0:
            raise TraceFormatError(f"{self.name}: byte offset {offset - held + r['stray']:,}: unbalanced '}}' "
                                   f"inside 'traceEvents' (more closing than opening brackets)")
        if r["ended"] >= 0:
            self.leftover = b""
            return r["ended"] - held
        self.leftover = _between_elements(buf[r["consumed"]:])
        if len(self.leftover) > MAX_ELEMENT_BYTES:
            raise TraceFormatError(
                f"{self.name}: byte offset {offset - held + r['consumed']:,}: one element of 'traceEvents' runs past "
                f"{MAX_ELEMENT_BYTES >> 20} MiB (a trace event is a few hundred bytes): not a trace this reader "
                f"follows; is the file damaged?")
        return -1

    def finish(self) -> bool:
        """The stream ended inside the array: parse what is left. True if an incomplete last
        element was dropped."""
        r = _kscan.scan(self.leftover, True)
        self._take(r)
        dropped = bool(self.leftover[r["consumed"]:].strip())
        self.leftover = b""
        return dropped

    def _take(self, r: dict) -> None:
        self.bad += r["bad"]
        if not r["rows"]:
            return
        self.rows += r["rows"]
        st = r["stats"]
        for k in _STAT_SUMS:
            self.stats[k] += st.get(k, 0)  # (an extension built before a count was added lacks it)
        if st["t_lo"] is not None:
            lo, hi = self.stats["t_lo"], self.stats["t_hi"]
            self.stats["t_lo"] = st["t_lo"] if lo is None else min(lo, st["t_lo"])
            self.stats["t_hi"] = st["t_hi"] if hi is None else max(hi, st["t_hi"])
        self.on_batch(r)


class _PartFiles:
    """Row groups into ``part-<k>.parquet`` files of at most PART_ROWS rows; with ``raw`` (a
    :class:`~tilescope.trace._rawcols.RawColumnsWriter`) the nesting's columns beside them."""

    def __init__(self, stage_dir: str, raw=None):
        self.stage_dir = stage_dir
        self.part = -1
        self.rows_in_part = PART_ROWS
        self.writer = None
        self.raw = raw
        self.sizes: list[list] = []  # [file name, rows] per part

    def write(self, r: dict) -> None:
        rows = r["rows"]
        if self.rows_in_part + rows > PART_ROWS:
            self.close()
            self.part += 1
            self.rows_in_part = 0
            name = f"part-{self.part:05d}.parquet"
            self.writer = ParquetWriter(os.path.join(self.stage_dir, name), COLUMNS)
            self.sizes.append([name, 0])
        self.rows_in_part += rows
        self.sizes[-1][1] += rows
        if self.raw is not None:
            self.raw.add(r)
        part_page = struct.pack("<i", self.part) * rows  # 'part' is not parsed: a constant column
        minmax = {"ts_ns": r["ts_minmax"], "dur_ns": r["dur_minmax"]}  # statistics: DuckDB skips row groups
        self.writer.write_row_group(rows, (part_page,) + r["bodies"], (0,) + r["nulls"],
                                    tuple(minmax.get(c) for c, _kind in COLUMNS))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    @property
    def parts(self) -> int:
        return self.part + 1


def ingest_native(path: str, stage_dir: str, *, progress: bool | None = None, columns_dir: str | None = None):
    """Ingest one Chrome/Kineto trace file into ``stage_dir/part-<k>.parquet`` (and, with
    ``columns_dir``, the nesting's columns as raw arrays there: ``_rawcols``); returns an
    :class:`~tilescope.trace._ingest.IngestResult` whose ``stats`` hold the time extent and
    the counts the cache's meta.json reports."""
    from ._ingest import IngestResult, _Reader, clean_blocks, gzip_first

    t0 = time.perf_counter()
    os.makedirs(stage_dir, exist_ok=True)
    reader = _Reader(path)
    name = os.path.basename(path)
    warnings: list[str] = []
    raw = None
    if columns_dir is not None and getattr(_kscan, "RAW_COLUMNS", 0):  # (an older build has no codes)
        from ._rawcols import RawColumnsWriter

        raw = RawColumnsWriter(columns_dir)
    parts = _PartFiles(stage_dir, raw)
    native = NativeEvents(name, parts.write)

    def no_text(_data):  # the native path emits no NDJSON
        raise AssertionError("the native ingest emits pages, not text")

    scanner = ChromeTraceScanner(name, no_text, native=native)
    try:
        for _raw, clean in clean_blocks(reader, name, warnings, progress):
            scanner.feed(clean)
        scanner.finish()
    except TraceFormatError as e:
        raise gzip_first(reader, e) from None
    finally:
        parts.close()
        reader.close()
        if raw is not None:
            raw.abort()
    if raw is not None:
        raw.close(parts.sizes)
    if native.bad:
        warnings.append(f"{name}: {native.bad:,} of {native.events:,} events are not valid JSON objects "
                        f"and were skipped")
    return IngestResult(
        source=os.path.abspath(path), bytes=reader.size, events=native.rows, parts=parts.parts,
        seconds=time.perf_counter() - t0, mode=scanner.mode, metadata=scanner.metadata,
        warnings=warnings + scanner.warnings, truncated=scanner.truncated, ts_type="exact",
        stats=native.stats,
    )
