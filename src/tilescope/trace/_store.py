"""The Parquet cache: one entry per ingested source, written atomically.

Layout of one entry (``$TILESCOPE_CACHE_DIR/trace/<key>/``, default ``~/.cache/tilescope/trace/<key>/``)::

    events/rank=<r>/part-<k>.parquet   every trace record (see TABLES["events"])
    columns/                           the native ingest's raw arrays of the nesting's columns (_rawcols)
    executables.parquet                tilescope profiles only
    instructions.parquet               tilescope profiles only (modeled)
    meta.json                          written last: an entry without it is rebuilt
    lanes.parquet                      one row per (pid, tid) lane with names and extent
    lod.parquet, lod_names.parquet     level-of-detail buckets for the windowed query

The last three are derived from the events on first use (the first query, the first
windowed query) and written atomically into the entry: ingest never opens a database when
the native parser reads the trace.

The ``events/rank=*/part-*.parquet`` glob is hive-partitioned by rank, so Spark, Dask,
Polars or DuckDB read many ranks' entries (or an :meth:`Trace.export_parquet` copy) as
one table.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from typing import TYPE_CHECKING

from .. import __version__
from . import _native_ingest
from ._ingest import ingest_chrome_file
from ._jsonscan import TraceFormatError
from ._profile import instruction_rows, read_itrace_pair, read_profile_dir
from ._schema import SCHEMA_VERSION, TABLES

if TYPE_CHECKING:  # imported where a database is needed: the native ingest never opens one
    import duckdb

__all__ = ["cache_root", "build_entry", "classify_source", "distributed_info", "ensure_lanes", "ensure_lod", "lod_levels", "LOD_LEVELS"]

LOD_BASE_BUCKETS = 1024  # buckets across the entry's span at level 0
LOD_LEVELS = 5  # each level has 4x more buckets: 1k, 4k, 16k, 64k, 256k


def cache_root() -> str:
    """``$TILESCOPE_CACHE_DIR/trace`` (tilescope's cache root, shared with the device's build
    cache), default ``~/.cache/tilescope/trace``."""
    base = os.environ.get("TILESCOPE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tilescope")
    root = os.path.join(base, "trace")
    os.makedirs(root, exist_ok=True)
    return root


def classify_source(path: str) -> str:
    """``profile`` | ``chrome`` | ``itrace`` | ``executable`` for one path."""
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "manifest.json")) or path.rstrip("/").endswith(".partial") \
                or os.path.isdir(os.path.join(path, "executables")):
            return "profile"
        raise TraceFormatError(f"{path}: a directory, but not a tilescope profile (no manifest.json)")
    if not os.path.exists(path):
        raise TraceFormatError(f"{path}: no such file or directory")
    if path.endswith(".itrace.json"):
        return "itrace"
    if os.path.basename(path).startswith("exec_") and path.endswith(".json"):
        return "executable"
    return "chrome"


def distributed_info(metadata: dict) -> dict:
    """The trace's ``distributedInfo`` as a dict. Some Kineto builds write it as the text of a
    Python dict (``"{'backend': 'mtia:hccl', 'rank': 0, ...}"``), read here as a literal.

    >>> distributed_info({"distributedInfo": "{'backend': 'nccl', 'rank': 3}"})["rank"]
    3
    >>> distributed_info({"distributedInfo": "rank three"}), distributed_info({})
    ({}, {})
    """
    dist = metadata.get("distributedInfo")
    if isinstance(dist, str):
        import ast

        try:
            dist = ast.literal_eval(dist)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            dist = None
    return dist if isinstance(dist, dict) else {}


def _key(path: str, kind: str) -> str:
    st = os.stat(path)
    if kind == "profile":
        st = os.stat(os.path.join(path, "manifest.json")) if os.path.exists(os.path.join(path, "manifest.json")) else st
    blob = f"{SCHEMA_VERSION}|{__version__}|{kind}|{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _connect() -> duckdb.DuckDBPyConnection:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads={max(1, os.cpu_count() or 1)}")
    con.execute("SET memory_limit='1GB'")
    con.execute("SET preserve_insertion_order=true")
    return con


BE_PART = 65535  # the part number of slices made from 'B'/'E' pairs


def _pair_begin_end(con, entry: str, rank: int) -> tuple[int, int]:
    """Duration events given as 'B' ... 'E' on a thread become one 'X' slice each.

    Per thread, in time order (file order for ties), a running depth gives every 'B' the
    level it opens and every 'E' the level it closes; the k-th 'B' of a level pairs with the
    k-th 'E' of that level. The slice keeps the 'B' record's name, category and args and
    lives in its own part file; the views show it instead of the two records."""
    glob = os.path.join(entry, "events", "*", "*.parquet")
    n = con.execute(f"SELECT count(*) FROM read_parquet('{glob}') WHERE ph IN ('B', 'E')").fetchall()[0][0]
    if not n:
        return 0, 0
    dst = os.path.join(entry, "events", f"rank={rank}", f"part-{BE_PART:05d}.parquet")
    con.execute(f"""
      CREATE OR REPLACE TEMP TABLE _be AS
      WITH be AS (SELECT * FROM read_parquet('{glob}', file_row_number=true) WHERE ph IN ('B', 'E') AND ts_ns IS NOT NULL),
      o AS (SELECT *, sum(CASE WHEN ph = 'B' THEN 1 ELSE -1 END) OVER (
                PARTITION BY pid, tid ORDER BY ts_ns, part, file_row_number ROWS UNBOUNDED PRECEDING) AS run FROM be),
      k AS (SELECT *, CASE WHEN ph = 'B' THEN run ELSE run + 1 END AS level FROM o),
      nth AS (SELECT *, row_number() OVER (PARTITION BY pid, tid, level, ph ORDER BY ts_ns, part, file_row_number) AS k FROM k)
      SELECT b.* EXCLUDE (file_row_number, run, level, k) REPLACE ('X' AS ph, {BE_PART} AS part, e.ts_ns - b.ts_ns AS dur_ns)
      FROM nth b JOIN nth e ON e.pid = b.pid AND e.tid IS NOT DISTINCT FROM b.tid AND e.level = b.level AND e.k = b.k
      WHERE b.ph = 'B' AND e.ph = 'E' AND e.ts_ns >= b.ts_ns
      ORDER BY b.ts_ns""")
    paired = con.execute("SELECT count(*) FROM _be").fetchall()[0][0]
    if paired:
        con.execute(f"COPY _be TO '{dst}' (FORMAT parquet)")
    con.execute("DROP TABLE _be")
    return paired, n - 2 * paired


def lod_levels(t0: int, t1: int) -> list[dict]:
    """The LOD levels for a span: level k has LOD_BASE_BUCKETS * 4**k buckets of ``bucket_ns``."""
    finest = LOD_LEVELS - 1
    w = max(1, -(-max(1, t1 - t0) // (LOD_BASE_BUCKETS * 4 ** finest)))
    return [{"level": k, "bucket_ns": w * 4 ** (finest - k)} for k in range(LOD_LEVELS)]


def _build_lod(con, entry: str, t0: int, t1: int, dst: str | None = None) -> list[dict]:
    """Buckets per lane at LOD_LEVELS resolutions; level k has LOD_BASE_BUCKETS * 4**k buckets."""
    glob = os.path.join(entry, "events", "*", "*.parquet")
    levels = lod_levels(t0, t1)
    finest = LOD_LEVELS - 1
    w = levels[finest]["bucket_ns"]
    # one statement: the finest level from the events, each coarser one merging 4**j of its
    # buckets; the longest event's name travels as a hash (names are long: kernel templates)
    arms = []
    for k in range(finest, -1, -1):
        div = 4 ** (finest - k)
        arms.append(f"""SELECT {k}::TINYINT AS level, pid, tid, b // {div} AS bucket, sum(c)::BIGINT AS count,
                               sum(busy)::BIGINT AS busy_ns, arg_max(hn, m) AS top_hash, max(m) AS top_ns
                        FROM f GROUP BY pid, tid, b // {div}""")
    src = f"read_parquet('{glob}', hive_partitioning=false)"
    con.execute(f"""
      COPY (
        WITH f AS MATERIALIZED (
          SELECT pid, tid, (ts_ns - {t0}) // {w} AS b, count(*) AS c, sum(dur_ns) AS busy,
                 arg_max(hash(name), dur_ns) AS hn, max(dur_ns) AS m
          FROM {src} WHERE ph = 'X' AND ts_ns IS NOT NULL AND dur_ns IS NOT NULL GROUP BY ALL)
        {' UNION ALL '.join(arms)}
      ) TO '{dst or os.path.join(entry, 'lod.parquet')}' (FORMAT parquet)""")
    if dst is None:
        _build_lod_names(con, entry, os.path.join(entry, "lod_names.parquet"))
    return levels


def _build_lod_names(con, entry: str, dst: str) -> None:
    src = f"read_parquet('{os.path.join(entry, 'events', '*', '*.parquet')}', hive_partitioning=false)"
    con.execute(f"""COPY (SELECT hash(name) AS top_hash, any_value(name) AS top_name FROM {src}
                         WHERE ph = 'X' GROUP BY 1) TO '{dst}' (FORMAT parquet)""")


def _event_stats(con, entry: str) -> dict:
    """Time extent and the counts meta.json reports, by SQL (the native ingest counts them while parsing)."""
    glob = os.path.join(entry, "events", "*", "*.parquet")
    row = con.execute(f"""
      SELECT min(ts_ns) FILTER (WHERE ph NOT IN ('M','s','t','f')),
             max(ts_ns + greatest(coalesce(dur_ns, 0), 0)) FILTER (WHERE ph NOT IN ('M','s','t','f')),
             count(*) FILTER (WHERE ph NOT IN ('M','s','t','f')),
             count(*) FILTER (WHERE ph NOT IN ('M') AND ts_ns IS NULL),
             count(*) FILTER (WHERE ph = 'X' AND dur_ns = 0),
             count(*) FILTER (WHERE dur_ns < 0),
             count(*) FILTER (WHERE ph = 'X' AND dur_ns IS NULL AND ts_ns IS NOT NULL),
             count(*) FILTER (WHERE ph IN ('B', 'E'))
      FROM read_parquet('{glob}', hive_partitioning=false)""").fetchall()[0]
    return dict(zip(("t_lo", "t_hi", "events", "no_ts", "zero", "neg", "no_dur", "be"), row))


def _replace_atomically(con, entry: str, name: str, build) -> None:
    """Write ``entry/name`` through a temporary name (concurrent readers see all or nothing)."""
    tmp = os.path.join(entry, f".{name}.tmp-{os.getpid()}-{time.monotonic_ns()}")
    try:
        build(con, tmp)
        os.replace(tmp, os.path.join(entry, name))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def ensure_lanes(entry: str, build) -> None:
    """lanes.parquet, derived from the events on first use (not at ingest), by ``build(dst)``
    (``_columns.write_lanes``: no database)."""
    if not os.path.exists(os.path.join(entry, "lanes.parquet")):
        _replace_atomically(None, entry, "lanes.parquet", lambda _c, dst: build(dst))


def ensure_lod(con, entry: str, t0: int, t1: int) -> list[dict]:
    """lod.parquet and lod_names.parquet, built on the first windowed query; returns the levels."""
    if not os.path.exists(os.path.join(entry, "lod.parquet")):
        _replace_atomically(con, entry, "lod_names.parquet", lambda c, dst: _build_lod_names(c, entry, dst))
        _replace_atomically(con, entry, "lod.parquet", lambda c, dst: _build_lod(c, entry, t0, t1, dst))
    return lod_levels(t0, t1)


def _write_program_tables(entry: str, pairs: list[tuple[str, int, str]], executables: dict[str, str]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ex_rows = {c: [] for c, _t, _d in TABLES["executables"]}
    ex_rows.update({"flops": [], "hbm_bytes": [], "modeled_ns": []})
    seen = {}
    for h, fp in sorted(executables.items()):
        with open(fp, encoding="utf-8") as f:
            ex = json.load(f)
        if ex.get("format") != "tilescope.executable":
            raise TraceFormatError(f"{fp}: field 'format' is {ex.get('format')!r}, expected 'tilescope.executable'")
        if ex.get("hash") != h:
            raise TraceFormatError(f"{fp}: file name says hash {h} but the executable records {ex.get('hash')!r}")
        seen[h] = ex
    writer = None
    n = 0
    summaries: dict[str, dict] = {}
    for h, run, fp in pairs:
        ex, it = read_itrace_pair(executables[h], fp)
        summaries.setdefault(h, it.get("summary") or {})
        table = pa.table(instruction_rows(ex, it, run))
        if writer is None:
            writer = pq.ParquetWriter(os.path.join(entry, "instructions.parquet"), table.schema)
        writer.write_table(table)
        n += table.num_rows
    if writer is not None:
        writer.close()
    for h, ex in seen.items():
        s = summaries.get(h, {})
        ex_rows["program_hash"].append(h)
        ex_rows["name"].append(ex.get("name"))
        ex_rows["spec"].append(ex.get("spec"))
        ex_rows["instructions"].append(len(ex.get("instructions", [])))
        ex_rows["path"].append(executables[h])
        shapes = (ex.get("meta") or {}).get("shapes")
        ex_rows["shapes"].append(json.dumps(shapes, separators=(",", ":")) if shapes is not None else None)
        ex_rows["flops"].append(float(s.get("flops", 0.0)) if s else None)
        ex_rows["hbm_bytes"].append(int(s.get("hbm_read_bytes", 0) + s.get("hbm_write_bytes", 0)) if s else None)
        ex_rows["modeled_ns"].append(float(s.get("total_ns", 0.0)) if s else None)
    if seen:
        pq.write_table(pa.table(ex_rows), os.path.join(entry, "executables.parquet"))
    return n


def build_entry(path: str, kind: str, *, rank: int | None = None, progress: bool | None = None,
                refresh: bool = False, pair: str | None = None, root: str | None = None) -> str:
    """Ingest ``path`` into the cache (if not cached yet) and return the entry directory.
    ``root``: the folder to hold the entry instead of :func:`cache_root` (the per-rank ingest
    writes beside its layout, on storage every worker shares)."""
    root = cache_root() if root is None else root
    entry = os.path.join(root, _key(path, kind) + (f"-r{rank}" if rank is not None else ""))
    if not refresh and os.path.exists(os.path.join(entry, "meta.json")):
        return entry
    tmp = f"{entry}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    con = None

    def db():
        """DuckDB, opened only for the work that needs it (the native ingest does not)."""
        nonlocal con
        if con is None:
            con = _connect()
            con.execute(f"SET temp_directory='{tmp}/_duckdb_tmp'")
        return con

    t0 = time.perf_counter()
    meta: dict = {"schema": SCHEMA_VERSION, "tilescope": __version__, "source": os.path.abspath(path),
                  "kind": kind, "warnings": [], "notes": []}
    try:
        executables: dict[str, str] = {}
        pairs: list[tuple[str, int, str]] = []
        trace_file = None
        if kind == "profile":
            prof = read_profile_dir(path)
            meta["manifest"] = prof.manifest
            meta["warnings"] += prof.warnings
            trace_file = prof.trace_file
            executables, pairs = prof.executables, prof.itraces
        elif kind == "chrome":
            trace_file = path
        elif kind in ("itrace", "executable"):
            itrace = path if kind == "itrace" else pair
            exe = pair if kind == "itrace" else path
            if itrace is None or exe is None:
                raise TraceFormatError(f"{path}: an instruction trace needs its executable (pass both files)")
            ex, it = read_itrace_pair(exe, itrace)
            import re
            m = re.search(r"\.(\d+)\.itrace\.json$", itrace)
            executables = {ex["hash"]: exe}
            pairs = [(ex["hash"], int(m.group(1)) if m else 0, itrace)]
        stage = os.path.join(tmp, "events", "_stage")
        r = 0 if rank is None else rank
        res = None
        if trace_file is not None:
            if _native_ingest.available():
                res = _native_ingest.ingest_native(trace_file, stage, progress=progress, columns_dir=os.path.join(tmp, "columns"))
            else:
                res = ingest_chrome_file(trace_file, stage, db(), progress=progress)
            meta["ingest"] = {"source": res.source, "bytes": res.bytes, "events": res.events, "parts": res.parts,
                              "seconds": round(res.seconds, 3), "mode": res.mode, "truncated": res.truncated,
                              "ts_type": res.ts_type}
            meta["warnings"] += res.warnings
            md = res.metadata
            meta["trace_metadata"] = {k: v for k, v in md.items() if k != "traceEvents"}
            dist = distributed_info(md)
            if rank is None and isinstance(dist.get("rank"), int):
                r = dist["rank"]
        else:
            os.makedirs(stage, exist_ok=True)
        meta["rank"] = r
        os.rename(stage, os.path.join(tmp, "events", f"rank={r}"))
        has_events = any(f.endswith(".parquet") for f in os.listdir(os.path.join(tmp, "events", f"rank={r}")))
        if has_events:
            st = res.stats if res is not None and res.stats is not None else _event_stats(db(), tmp)
            t_lo, t_hi, n_ev = st["t_lo"], st["t_hi"], st["events"]
            meta.update(t0_ns=t_lo, t1_ns=t_hi, events=n_ev)
            name = os.path.basename(trace_file or path)
            if st["no_ts"]:
                meta["warnings"].append(
                    f"{name}: {st['no_ts']:,} records have no numeric 'ts' (missing or not a number); "
                    f"they are kept in the raw table (SELECT * FROM raw WHERE ts_ns IS NULL) but left out of "
                    f"events and every analysis")
            if st.get("huge_ts"):
                meta["warnings"].append(
                    f"{name}: {st['huge_ts']:,} records have a 'ts' too large to be a time (beyond +-9.2e15 us, "
                    f"the range of int64 nanoseconds); they are kept but left out of every time-based analysis")
            if st.get("huge_dur"):
                meta["warnings"].append(
                    f"{name}: {st['huge_dur']:,} events have a 'dur' too large to be a time (past +-9.2e15 us, "
                    f"the range of int64 nanoseconds, e.g. 1e20); they are kept as instants without a duration")
            if st["neg"]:
                meta["warnings"].append(
                    f"{name}: {st['neg']:,} events have a negative 'dur'; they are left out of busy-time sums")
            if st["no_dur"]:
                meta["warnings"].append(
                    f"{name}: {st['no_dur']:,} complete ('X') events have no numeric 'dur'; treated as instants")
            if st["zero"]:
                meta["notes"].append(f"{name}: {st['zero']:,} complete events have zero duration (kept; they add no busy time)")
            if n_ev == 0:
                meta["warnings"].append(f"{name}: the trace holds no events")
            if st.get("be", 1):
                paired, unmatched = _pair_begin_end(db(), tmp, r)
                if paired:
                    meta["notes"].append(f"{name}: {paired:,} 'B'/'E' pairs became slices (part {BE_PART})")
                if unmatched:
                    meta["warnings"].append(
                        f"{name}: {unmatched:,} 'B'/'E' events have no partner on their thread; they are left out of slices")
            meta["timing"] = {"ingest_s": round(res.seconds, 3) if res is not None else 0.0}
        else:
            meta.update(t0_ns=None, t1_ns=None, events=0)
            if trace_file is not None:
                meta["warnings"].append(f"{os.path.basename(trace_file)}: the trace holds no events")
        if pairs or executables:
            meta["instructions"] = _write_program_tables(tmp, pairs, executables)
        meta["build_seconds"] = round(time.perf_counter() - t0, 3)
        shutil.rmtree(os.path.join(tmp, "_duckdb_tmp"), ignore_errors=True)
        with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1, default=str)
        if con is not None:
            con.close()
        shutil.rmtree(entry, ignore_errors=True)
        os.rename(tmp, entry)
    except BaseException:
        if con is not None:
            con.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return entry
