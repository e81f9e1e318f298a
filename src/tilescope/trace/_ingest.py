"""Chrome / Kineto trace files -> Parquet parts, in bounded memory: the block reader both
ingest paths share, and the DuckDB path (the fallback when the native parser, ``_native_ingest.py``,
is not built).

The file is read in blocks (gzip decompressed on the fly); :class:`ChromeTraceScanner`
turns the ``traceEvents`` array into newline-delimited JSON parts of ~16 MiB; a worker
thread hands each finished part to DuckDB's parallel JSON reader, which writes one
Parquet file per part while the next part is being scanned. Memory stays at a few parts,
whatever the trace's size.

Checks: the number of records DuckDB read must equal the number the scanner found (the
fast path is re-run in exact mode if not; in exact mode the difference is reported as
unparseable events); invalid UTF-8 is replaced (U+FFFD) with a warning naming the first
offset; non-numeric times are kept as NULL and reported.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field

from ._jsonscan import ChromeTraceScanner, TraceFormatError
from ._schema import RAW_JSON_COLUMNS, TS_EXACT_TYPE, arg_columns_sql, arg_paths_sql

__all__ = ["IngestResult", "ingest_chrome_file", "clean_blocks", "BLOCK_BYTES", "PART_BYTES"]

BLOCK_BYTES = 4 << 20
FIRST_BLOCK_BYTES = 256 << 10
PART_BYTES = 16 << 20
WORKER_THREADS = max(1, os.cpu_count() or 1)
PROGRESS_MIN_BYTES = 64 << 20


@dataclass
class IngestResult:
    """What one file's ingest produced (kept in the cache's meta.json)."""

    source: str
    bytes: int
    events: int
    parts: int
    seconds: float
    mode: str
    metadata: dict
    warnings: list[str] = field(default_factory=list)
    truncated: bool = False
    ts_type: str = "DOUBLE"
    stats: dict | None = None  # native ingest: time extent and counts (else computed by SQL)


_FRACTIONAL_EPOCH_TS = re.compile(rb'"ts"\s*:\s*"?-?\d{13,}\.\d')


def _ns(col: str, exact: bool) -> str:
    """Microseconds -> integer nanoseconds without a double product (which rounds above 2**53).
    NaN, infinities and values past int64 nanoseconds become NULL (TRY_CAST), not an error."""
    if exact:
        return f"TRY_CAST({col} * 1000 AS BIGINT)"
    return (f"TRY_CAST(TRY_CAST(floor({col}) AS BIGINT) * 1000 + TRY_CAST(round(({col} - floor({col})) * 1000) AS BIGINT)"
            f" AS BIGINT)")


def _select_sql(src: str, part: int, exact_ts: bool = False) -> str:
    """The per-part SELECT: raw columns, times as integer ns, the typed args columns
    (ARG_COLUMNS: correlation, stream, ...; the columns and their order as the native ingest
    writes them)."""
    types = dict(RAW_JSON_COLUMNS, ts=TS_EXACT_TYPE) if exact_ts else RAW_JSON_COLUMNS
    cols = ", ".join(f"'{k}': '{v}'" for k, v in types.items())
    return f"""
    SELECT {part}::INTEGER AS part,
      CASE WHEN ph IS NOT NULL THEN ph WHEN dur IS NOT NULL THEN 'X' WHEN ts IS NOT NULL THEN 'i' END AS ph,
      cat, name, pid, tid,
      {_ns("ts", exact_ts)} AS ts_ns, {_ns("dur", exact_ts)} AS dur_ns,
      id, bp, s, args,
      {arg_columns_sql()}
    FROM (SELECT *, {arg_paths_sql()} AS _a
          FROM read_json('{src}', format='newline_delimited', columns={{{cols}}}, ignore_errors=true))
    """


class _Reader:
    """Blocks of a file, decompressing gzip; tracks compressed and raw offsets."""

    def __init__(self, path: str):
        self.path = path
        self.size = os.path.getsize(path)
        self._f = open(path, "rb")
        magic = self._f.read(2)
        self._f.seek(0)
        self._z = zlib.decompressobj(wbits=31) if magic == b"\x1f\x8b" else None
        self.consumed = 0  # bytes of the file read

    def read(self, n: int) -> bytes:
        if self._z is None:
            b = self._f.read(n)
            self.consumed += len(b)
            return b
        out = []
        got = 0
        while got < n:
            if self._z.unconsumed_tail:
                chunk = self._z.unconsumed_tail
            else:
                chunk = self._f.read(1 << 20)
                self.consumed += len(chunk)
                if not chunk:
                    if not self._z.eof:
                        raise TraceFormatError(
                            f"{self.path}: gzip stream ends early at compressed byte {self.consumed:,} "
                            f"(truncated download?); re-copy the file"
                        )
                    break
            try:
                d = self._z.decompress(chunk, n - got)
            except zlib.error as e:
                raise TraceFormatError(f"{self.path}: corrupt gzip data near compressed byte {self.consumed:,}: {e}") from None
            out.append(d)
            got += len(d)
            if self._z.eof:
                rest = self._z.unused_data
                if rest.strip(b"\x00"):  # concatenated gzip members
                    self._z = zlib.decompressobj(wbits=31)
                    d2 = self._z.decompress(rest)
                    out.append(d2)
                    got += len(d2)
                elif not chunk:
                    break
            if not d and not self._z.unconsumed_tail and self._z.eof:
                break
        return b"".join(out)

    def gzip_error(self) -> str | None:
        """For a gzip file whose JSON went wrong: read the rest of the stream and return the
        gzip error (a corrupt block, a failed CRC, an early end) that explains it, or None."""
        if self._z is None:
            return None
        try:
            while self.read(1 << 22):
                pass
        except TraceFormatError as e:
            return str(e)
        return None

    def close(self) -> None:
        self._f.close()


def gzip_first(reader: _Reader, err: TraceFormatError) -> TraceFormatError:
    """The error to report for ``err`` raised while scanning: corrupt gzip data decompresses to
    bytes that are not JSON before zlib's checksum can tell, so a JSON error in a gzip file
    whose stream is corrupt is reported as the corruption (naming the compressed offset)."""
    problem = reader.gzip_error()
    if problem is None:
        return err
    return TraceFormatError(f"{problem} (the JSON error it caused: {str(err).split(': ', 1)[-1]})")


def _utf8_clean(block: bytes, offset: int, name: str, warnings: list[str], carry: bytearray) -> bytes:
    """Valid UTF-8 (a multi-byte character split across blocks is carried over)."""
    if carry:
        block = bytes(carry) + block
        carry.clear()
    if block.isascii():
        return block
    try:
        block.decode("utf-8")
        return block
    except UnicodeDecodeError as e:
        if e.end == len(block) and e.reason == "unexpected end of data" and len(block) - e.start < 4:
            carry += block[e.start:]
            block = block[:e.start]
            try:
                block.decode("utf-8")
                return block
            except UnicodeDecodeError as e2:
                e = e2
        if not any("invalid UTF-8" in w for w in warnings):
            warnings.append(
                f"{name}: invalid UTF-8 at byte offset {offset + e.start:,} (and maybe later); "
                f"replaced with U+FFFD"
            )
        return block.decode("utf-8", errors="replace").encode("utf-8")


def clean_blocks(reader: "_Reader", name: str, warnings: list[str], progress: bool | None):
    """The file's blocks as ``(raw, valid UTF-8)`` pairs -- a small first block (the scan of the
    document's head is the slow part), then BLOCK_BYTES each -- with a progress bar on large
    files at a terminal. A multi-byte character split at the end arrives as a last ``(b"", ...)``."""
    bar = task = None
    show = progress if progress is not None else (reader.size >= PROGRESS_MIN_BYTES and sys.stderr.isatty())
    try:
        if show:
            from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

            bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                           TransferSpeedColumn(), transient=True)
            bar.start()
            task = bar.add_task(f"ingest {name}", total=reader.size)
        carry = bytearray()
        offset = 0
        size = FIRST_BLOCK_BYTES
        while True:
            block = reader.read(size)
            size = BLOCK_BYTES
            if not block:
                break
            clean = _utf8_clean(block, offset, name, warnings, carry)
            offset += len(block)
            yield block, clean
            if bar is not None:
                bar.update(task, completed=reader.consumed)
        if carry:
            yield b"", bytes(carry).decode("utf-8", errors="replace").encode()
    finally:
        if bar is not None:
            bar.stop()


def ingest_chrome_file(path: str, stage_dir: str, con, *, progress: bool | None = None,
                       fast: bool = True) -> IngestResult:
    """Ingest one Chrome/Kineto trace file into ``stage_dir/part-<k>.parquet`` files with
    DuckDB's JSON reader (the path used when the native parser is not built)."""
    t0 = time.perf_counter()
    os.makedirs(stage_dir, exist_ok=True)
    reader = _Reader(path)
    name = os.path.basename(path)
    warnings: list[str] = []
    tmp_dir = os.path.join(stage_dir, "_ndjson")
    os.makedirs(tmp_dir, exist_ok=True)

    jobs: queue.Queue = queue.Queue(maxsize=2)
    results: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def worker():
        cur = con.cursor()
        cur.execute(f"SET threads={WORKER_THREADS}")
        while True:
            job = jobs.get()
            if job is None:
                return
            k, src = job
            try:
                dst = os.path.join(stage_dir, f"part-{k:05d}.parquet")
                sql = _select_sql(src, k, exact_ts=state["exact_ts"])
                cur.execute(f"COPY ({sql}) TO '{dst}' (FORMAT parquet, COMPRESSION lz4)").fetchall()
                # a line DuckDB could not parse comes back as a row of NULLs (ignore_errors)
                # (the small columns only: re-reading args would cost as much as writing it)
                results[k] = cur.execute(f"""SELECT count(*), count(*) FILTER (WHERE ph IS NULL AND name IS NULL
                                             AND cat IS NULL AND pid IS NULL AND tid IS NULL)
                                             FROM read_parquet('{dst}')""").fetchall()[0]
            except BaseException as e:  # reported in the main thread
                errors.append(e)
            finally:
                try:
                    os.remove(src)
                except OSError:
                    pass

    th = threading.Thread(target=worker, name="tilescope-ingest", daemon=True)
    th.start()

    state = {"k": 0, "f": None, "bytes": 0, "exact_ts": False}

    def emit(data: bytes) -> None:
        if state["f"] is None:
            state["f"] = open(os.path.join(tmp_dir, f"part-{state['k']:05d}.ndjson"), "wb")
        state["f"].write(data)
        state["bytes"] += len(data)

    def rotate() -> None:
        """Hand the finished part to the worker (parts end on event boundaries)."""
        f = state["f"]
        if f is None:
            return
        f.close()
        k = state["k"]
        state.update(f=None, bytes=0, k=k + 1)
        if errors:
            raise errors[0]
        jobs.put((k, f.name))

    scanner = ChromeTraceScanner(name, emit, fast=fast)
    try:
        for i, (raw, clean) in enumerate(clean_blocks(reader, name, warnings, progress)):
            if i == 0:  # epoch times with fractions need DECIMAL (see _schema.TS_EXACT_TYPE)
                state["exact_ts"] = bool(_FRACTIONAL_EPOCH_TS.search(raw))
            scanner.feed(clean)
            if state["bytes"] >= PART_BYTES:
                rotate()
        scanner.finish()
        rotate()
    except TraceFormatError as e:
        jobs.put(None)
        th.join()
        raise gzip_first(reader, e) from None
    except BaseException:
        jobs.put(None)
        th.join()
        raise
    finally:
        reader.close()
    jobs.put(None)
    th.join()
    shutil.rmtree(tmp_dir, ignore_errors=True)
    if errors:
        raise errors[0]
    read = sum(r[0] for r in results.values())
    bad = sum(r[1] for r in results.values())
    found = scanner.events
    mode = scanner.mode
    counted = not scanner.events_uncounted
    if (counted and read != found) or bad:
        if fast:
            # the fast split was wrong somewhere (or an event is malformed): redo exactly
            for fn in os.listdir(stage_dir):
                if fn.endswith(".parquet"):
                    os.remove(os.path.join(stage_dir, fn))
            return ingest_chrome_file(path, stage_dir, con, progress=progress, fast=False)
        warnings.append(
            f"{name}: {found - read + bad:,} of {found:,} events are not valid JSON objects and were skipped"
        )
    warnings = warnings + scanner.warnings
    return IngestResult(
        source=os.path.abspath(path), bytes=reader.size, events=read - bad, parts=state["k"],
        seconds=time.perf_counter() - t0, mode=mode, metadata=scanner.metadata,
        warnings=warnings, truncated=scanner.truncated,
        ts_type=TS_EXACT_TYPE if state["exact_ts"] else RAW_JSON_COLUMNS["ts"],
    )
