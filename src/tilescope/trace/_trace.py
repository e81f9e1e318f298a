"""The one entry class: a set of ingested sources, as DuckDB views over Parquet."""

from __future__ import annotations

import glob as _glob
import json
import os
import re
import warnings as _warnings
from typing import TYPE_CHECKING

from ._jsonscan import TraceFormatError
from ._schema import ARG_COLUMNS, kind_case_sql
from ._store import build_entry, classify_source, ensure_lanes, ensure_lod

if TYPE_CHECKING:  # DuckDB is imported on the first query, not with the package (its import is ~0.3 s, 27 MB)
    import duckdb

__all__ = ["Trace", "TraceWarning", "open_trace"]


_LOD_NAME = re.compile(r"\blod\b", re.IGNORECASE)
_HIER_NAME = re.compile(r"\b_(hier|links)\b", re.IGNORECASE)


class TraceWarning(UserWarning):
    """Something in a trace was odd but readable (the message says what and where)."""


def _expand(paths) -> list[tuple[str, str, str | None]]:
    """(path, kind, pair) for every source among ``paths``."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    paths = [os.fspath(p) for p in paths]
    execs = [p for p in paths if classify_source(p) == "executable"]
    for p in paths:
        kind = classify_source(p)
        if kind == "executable":
            continue
        if kind == "itrace":
            pair = None
            h = os.path.basename(p).split(".")[0]
            for e in execs:
                if os.path.basename(e) == f"{h}.json":
                    pair = e
            if pair is None and len(execs) == 1:
                pair = execs[0]  # given together: the hash check names both files if they do not belong
            if pair is None:
                for cand in (os.path.join(os.path.dirname(p), f"{h}.json"),
                             os.path.join(os.path.dirname(os.path.dirname(p)), "executables", f"{h}.json")):
                    if os.path.exists(cand):
                        pair = cand
            out.append((p, kind, pair))
        else:
            out.append((p, kind, None))
    if not out and execs:
        raise TraceFormatError(f"{execs[0]}: an executable alone has no timeline; pass its .itrace.json too")
    return out


class Trace:
    """One or more ingested sources (ranks), queried with DuckDB.

    >>> import tilescope.trace as tt                                   # doctest: +SKIP
    >>> t = tt.open("trace.json.gz")                                   # doctest: +SKIP
    >>> t.sql("SELECT kind, count(*) FROM events GROUP BY kind").fetchall()   # doctest: +SKIP

    Views: ``events`` (slices and instants, with ``lane``, ``kind``, ``end_ns``), ``flows``,
    ``lanes``, ``raw`` (every record), ``executables``, ``instructions``, ``lod``.
    Times are integer nanoseconds on each trace's own clock; ``t0_ns`` is the earliest.
    """

    def __init__(self, entries: list[str], sources: list[str], align: str = "none"):
        self.entries = entries
        self.sources = sources
        self.meta = []
        for e in entries:
            with open(os.path.join(e, "meta.json"), encoding="utf-8") as f:
                self.meta.append(json.load(f))
        self.warnings: list[str] = [w for m in self.meta for w in m.get("warnings", [])]
        self.notes: list[str] = [n for m in self.meta for n in m.get("notes", [])]
        ranks = [m["rank"] for m in self.meta]
        if len(set(ranks)) != len(ranks) and len(entries) > 1:
            self.warnings.append(
                f"several sources claim the same rank ({ranks}); ranks were renumbered by position 0..{len(ranks) - 1}")
            ranks = list(range(len(entries)))
        self.ranks = ranks
        self.align = align
        self._con: duckdb.DuckDBPyConnection | None = None
        self._offsets = self._clock_offsets(align)
        self._cache: dict = {}
        for w in self.warnings:
            _warnings.warn(w, TraceWarning, stacklevel=3)

    # ---- set-up ---------------------------------------------------------------------
    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection with the views, opened on the first query (opening a trace
        reads only meta.json: the tables derived from the events are built here, once)."""
        if self._con is None:
            import duckdb

            con = duckdb.connect()
            con.execute(f"SET threads={max(1, os.cpu_count() or 1)}")
            con.execute("SET memory_limit='2GB'")
            self._ensure_lanes()  # (the views read lanes.parquet)
            self._con = con
            self._make_views()
        return self._con

    def _with_events(self) -> list[tuple[str, int]]:
        return [(e, r) for e, r in zip(self.entries, self.ranks)
                if _glob.glob(os.path.join(e, "events", "*", "*.parquet"))]

    def _ensure_lanes(self) -> None:
        """Every entry's lanes.parquet (derived from the events' columns on first use, without
        a database), then the check for device-looking events no rule classifies (once)."""
        from ._columns import read_entry, write_lanes

        for e, r in self._with_events():
            ensure_lanes(e, lambda dst, e=e, r=r: write_lanes(read_entry(e, r), r, dst))
        if not self._cache.get("checked"):
            self._cache["checked"] = True
            self._check_devices()

    def _entry_columns(self) -> list:
        """Per entry with events: (rank, its columns as arrays, device side per lane code),
        read without a database (``_columns``; the nesting's input, not kept: a second
        call reads them again). Writes each entry's lanes.parquet if it is not there yet."""
        import numpy as np

        from ._columns import lane_rows, read_entry, write_lanes

        out = []
        for e, r in self._with_events():
            cols = read_entry(e, r)
            if cols is None:
                continue
            rows = lane_rows(cols, r)
            ensure_lanes(e, lambda dst, c=cols, rk=r, rw=rows: write_lanes(c, rk, dst, rows=rw))
            self._cache.setdefault("lane_rows", {})[e] = rows  # (the device check reads them, not the file)
            device = np.zeros(len(cols.lane_keys) + 1, dtype=bool)
            device[rows["lane_code"]] = [side == "device" for side in rows["side"]]
            out.append((r, cols, device))
        self._ensure_lanes()
        return out

    def _check_devices(self) -> None:
        """Warn about events that look like device work but that no rule classifies (so a
        trace from an accelerator tilescope does not know is never reported as CPU-only)."""
        from ._devices import CATEGORY_HINT, unclassified_device_events

        lanes = []
        for e in self.entries:
            t = self._cache.get("lane_rows", {}).get(e)
            f = os.path.join(e, "lanes.parquet")
            if t is None and os.path.exists(f):
                import pyarrow.parquet as pq

                t = pq.ParquetFile(f).read(columns=["side", "process_name", "pid", "other_cats"]).to_pydict()
            if t is not None:
                lanes += [(side, proc if proc is not None else pid, other) for side, proc, pid, other
                          in zip(t["side"], t["process_name"], t["pid"], t["other_cats"]) if other is not None]
        found = unclassified_device_events(lanes)
        if found:
            listed = "; ".join(f"{cat} ({n:,} events, {where})" for where, cat, n in found[:6])
            more = f" and {len(found) - 6} more" if len(found) > 6 else ""
            msg = (f"device-looking events that no rule classifies: {listed}{more}. They are left out of device "
                   f"time, kernels and gaps; {CATEGORY_HINT}")
            self.warnings.append(msg)
            _warnings.warn(msg, TraceWarning, stacklevel=4)

    def _ensure_lod(self) -> bool:
        """Build the level-of-detail tables the windowed query reads (first call only)."""
        if "has_lod" not in self._cache:
            built = False
            for e, m in zip(self.entries, self.meta):
                if m.get("t0_ns") is not None and _glob.glob(os.path.join(e, "events", "*", "*.parquet")):
                    m["lod_levels"] = ensure_lod(self.con, e, m["t0_ns"], m["t1_ns"])
                    built = True
            if built:
                self._make_views()
            self._cache["has_lod"] = built
        return self._cache["has_lod"]

    def _clock_offsets(self, align: str) -> dict[int, int]:
        spans = [(r, m.get("t0_ns"), m.get("t1_ns")) for r, m in zip(self.ranks, self.meta) if m.get("t0_ns") is not None]
        offsets = {r: 0 for r in self.ranks}
        if len(spans) > 1:
            lo = min(s[1] for s in spans)
            starts = sorted(spans, key=lambda s: s[1])
            shortest = min(s[2] - s[1] for s in spans) or 1
            overlap = min(s[2] for s in spans) - max(s[1] for s in spans)
            skew = starts[-1][1] - lo
            if overlap <= 0 or skew > shortest / 2:
                msg = (f"ranks' clocks disagree: rank {starts[-1][0]} starts {skew / 1e6:,.3f} ms after rank "
                       f"{starts[0][0]} (traces span {shortest / 1e6:,.3f} ms); cross-rank timing may be skewed")
                if align == "start":
                    msg += "; aligned each rank's first event to t=0 (align='start')"
                else:
                    msg += ". Open with align='start' to align each rank's first event"
                self.warnings.append(msg)
            if align == "start":
                offsets = {r: t0 - lo for r, t0, _ in spans}
        return offsets

    def _make_views(self) -> None:
        con = self.con
        globs = []
        for e, r in zip(self.entries, self.ranks):
            files = _glob.glob(os.path.join(e, "events", "*", "*.parquet"))
            if files:
                globs.append((os.path.join(e, "events", "*", "*.parquet"), r))
        if globs:
            selects = " UNION ALL ".join(
                f"SELECT {r}::INTEGER AS rank, ((({r}::BIGINT) << 48) | (part::BIGINT << 32) | file_row_number) AS eid, "
                f"* EXCLUDE (file_row_number) FROM read_parquet('{g}', hive_partitioning=false, file_row_number=true)"
                for g, r in globs)
        else:
            selects = ("SELECT NULL::INTEGER AS rank, NULL::BIGINT AS eid, NULL::INTEGER AS part, NULL AS ph, NULL AS cat, "
                       "NULL AS name, NULL AS pid, NULL AS tid, NULL::BIGINT AS ts_ns, NULL::BIGINT AS dur_ns, NULL AS id, "
                       "NULL AS bp, NULL AS s, NULL::JSON AS args, "
                       + ", ".join(f"NULL::{t} AS {c}" for c, _p, t in ARG_COLUMNS) + " WHERE false")
        off = " UNION ALL ".join(f"SELECT {r}::INTEGER AS rank, {o}::BIGINT AS off" for r, o in self._offsets.items()) \
            or "SELECT 0 AS rank, 0::BIGINT AS off"
        con.execute(f"CREATE OR REPLACE TEMP VIEW _raw0 AS {selects}")
        con.execute(f"CREATE OR REPLACE TEMP TABLE _offsets AS {off}")
        con.execute("""CREATE OR REPLACE TEMP VIEW raw AS
            SELECT r.* REPLACE (r.ts_ns - o.off AS ts_ns) FROM _raw0 r JOIN _offsets o USING (rank)""")
        lane_files = [(os.path.join(e, "lanes.parquet"), r) for e, r in zip(self.entries, self.ranks)
                      if os.path.exists(os.path.join(e, "lanes.parquet"))]
        if lane_files:
            lsel = " UNION ALL ".join(f"SELECT * REPLACE ({r}::INTEGER AS rank) FROM read_parquet('{f}')" for f, r in lane_files)
            con.execute(f"""CREATE OR REPLACE TEMP TABLE lanes AS
              WITH l AS ({lsel}),
              p AS (SELECT *, regexp_extract(process_name, '^(.*)/([^/]+)/(framework|runtime|hardware)$', ['inst', 'p', 'sub']) AS m FROM l)
              SELECT (row_number() OVER (ORDER BY rank, CASE WHEN side = 'host' THEN 0 ELSE 1 END,
                        CASE m.sub WHEN 'framework' THEN 0 WHEN 'runtime' THEN 1 WHEN 'hardware' THEN 2 ELSE 3 END,
                        TRY_CAST(pid AS BIGINT) NULLS LAST, pid, TRY_CAST(tid AS BIGINT) NULLS LAST, tid) - 1)::INTEGER AS lane,
                     rank, pid, tid, process_name, thread_name,
                     CASE WHEN m.sub <> '' THEN m.inst ELSE 'rank' || rank END AS instance,
                     CASE WHEN m.sub <> '' THEN m.sub ELSE side END AS subsystem,
                     coalesce(thread_name, CASE WHEN side = 'device' THEN coalesce(labels, 'device ' || pid) || ' stream ' || tid
                                                ELSE 'thread ' || tid END) AS identifier,
                     CASE WHEN m.sub = 'hardware' THEN 'device' ELSE side END AS side,
                     events, first_ns - o.off AS first_ns, last_ns - o.off AS last_ns
              FROM p JOIN _offsets o USING (rank)""")
        else:
            con.execute("""CREATE OR REPLACE TEMP TABLE lanes (lane INTEGER, rank INTEGER, pid VARCHAR, tid VARCHAR,
              process_name VARCHAR, thread_name VARCHAR, instance VARCHAR, subsystem VARCHAR, identifier VARCHAR,
              side VARCHAR, events BIGINT, first_ns BIGINT, last_ns BIGINT)""")
        con.execute(f"""CREATE OR REPLACE TEMP VIEW events AS
            SELECT r.eid, r.rank, l.lane, r.ph, r.cat, r.name, {kind_case_sql('r.cat', 'r.name')} AS kind, l.side,
                   r.ts_ns, CASE WHEN r.dur_ns >= 0 THEN r.dur_ns ELSE NULL END AS dur_ns,
                   r.ts_ns + CASE WHEN r.dur_ns > 0 THEN r.dur_ns ELSE 0 END AS end_ns,
                   r.pid, r.tid, {', '.join('r.' + c for c, _p, _t in ARG_COLUMNS)}, r.args,
                   -- the lowering rule that modeled a tilescope execution (its runtime and hardware events)
                   CASE WHEN r.cat IN ('runtime', 'hardware', 'memcpy') THEN json_extract_string(r.args, '$.lowering')
                   END AS lowering
            FROM raw r JOIN lanes l ON l.rank = r.rank AND l.pid = r.pid AND l.tid IS NOT DISTINCT FROM r.tid
            WHERE r.ph NOT IN ('s', 't', 'f', 'M', 'B', 'E') AND r.ts_ns IS NOT NULL""")
        con.execute("""CREATE OR REPLACE TEMP VIEW flows AS
            SELECT eid, rank, ph, cat, name, id, pid, tid, ts_ns, bp FROM raw WHERE ph IN ('s', 't', 'f')""")
        ex = [os.path.join(e, "executables.parquet") for e in self.entries if os.path.exists(os.path.join(e, "executables.parquet"))]
        ins = [(os.path.join(e, "instructions.parquet"), r) for e, r in zip(self.entries, self.ranks)
               if os.path.exists(os.path.join(e, "instructions.parquet"))]
        if ex:
            con.execute(f"CREATE OR REPLACE TEMP VIEW executables AS SELECT DISTINCT * FROM read_parquet({ex!r})")
        else:
            con.execute("""CREATE OR REPLACE TEMP VIEW executables AS SELECT NULL::VARCHAR AS program_hash, NULL::VARCHAR AS name,
              NULL::VARCHAR AS spec, NULL::BIGINT AS instructions, NULL::VARCHAR AS path, NULL::VARCHAR AS shapes,
              NULL::DOUBLE AS flops,
              NULL::BIGINT AS hbm_bytes, NULL::DOUBLE AS modeled_ns WHERE false""")
        if ins:
            isel = " UNION ALL ".join(f"SELECT {r}::INTEGER AS rank, * FROM read_parquet('{f}')" for f, r in ins)
            con.execute(f"CREATE OR REPLACE TEMP VIEW instructions AS {isel}")
        else:
            con.execute("""CREATE OR REPLACE TEMP VIEW instructions AS SELECT NULL::INTEGER AS rank, NULL::VARCHAR AS program_hash,
              NULL::INTEGER AS run, NULL::BIGINT AS flow_id, NULL::VARCHAR AS preset, NULL::INTEGER AS index,
              NULL::VARCHAR AS engine, NULL::VARCHAR AS kind, NULL::DOUBLE AS start_ns, NULL::DOUBLE AS end_ns,
              NULL::BIGINT AS bytes, NULL::DOUBLE AS flops, NULL::VARCHAR AS source WHERE false""")
        lods = [(os.path.join(e, "lod.parquet"), os.path.join(e, "lod_names.parquet"), r)
                for e, r in zip(self.entries, self.ranks) if os.path.exists(os.path.join(e, "lod.parquet"))]
        if lods:
            lsel = " UNION ALL ".join(
                f"SELECT {r}::INTEGER AS rank, l.* EXCLUDE (top_hash), n.top_name FROM read_parquet('{f}') l "
                f"LEFT JOIN read_parquet('{nf}') n USING (top_hash)" for f, nf, r in lods)
            con.execute(f"""CREATE OR REPLACE TEMP VIEW lod AS SELECT l.lane, x.* FROM ({lsel}) x
                            JOIN lanes l ON l.rank = x.rank AND l.pid = x.pid AND l.tid IS NOT DISTINCT FROM x.tid""")

    # ---- basic facts ------------------------------------------------------------------
    @property
    def t0_ns(self) -> int:
        """Earliest event start (after alignment)."""
        return self.con.execute("SELECT coalesce(min(first_ns), 0) FROM lanes").fetchall()[0][0]

    @property
    def t1_ns(self) -> int:
        return self.con.execute("SELECT coalesce(max(last_ns), 0) FROM lanes").fetchall()[0][0]

    @property
    def kind(self) -> str:
        """``tilescope`` (a profile directory) or ``kineto`` (any other Chrome trace)."""
        return "tilescope" if any(m["kind"] in ("profile", "itrace") for m in self.meta) else "kineto"

    @property
    def modeled(self) -> bool:
        """Device times come from tilescope's device model (a simulated device)."""
        for m in self.meta:
            dev = (m.get("manifest") or {}).get("device") or {}
            if m["kind"] == "itrace" or dev.get("kind") == "sim":
                return True
        return False

    def device_names(self) -> list[str]:
        names = []
        for m in self.meta:
            for d in (m.get("trace_metadata") or {}).get("deviceProperties") or []:
                if isinstance(d, dict) and d.get("name") and d["name"] not in names:
                    names.append(d["name"])
            dev = (m.get("manifest") or {}).get("device") or {}
            if dev.get("preset") and f"tilescope {dev['preset']}" not in names:
                names.append(f"tilescope {dev['preset']}")
        return names

    def vendors(self) -> dict[int, str | None]:
        """Per rank, whose accelerator recorded the trace (``_devices.VENDORS``: from categories,
        launch names, device process labels, deviceProperties and the distributed backend);
        None for a rank with no device evidence (a CPU-only trace).

        >>> tt.open("mtia_rank_0.json.gz").vendors()          # doctest: +SKIP
        {0: 'Meta MTIA'}
        """
        from ._devices import vendor_of
        from ._store import distributed_info

        if "vendors" not in self._cache:
            facts: dict[int, set[str]] = {r: set() for r in self.ranks}
            for rank, fact in self.con.execute("""
                SELECT DISTINCT rank, 'cat:' || cat FROM events WHERE ph = 'X' AND cat IS NOT NULL
                UNION ALL
                SELECT DISTINCT rank, 'name:' || name FROM events WHERE kind = 'launch' AND name ILIKE '%launch%'
                UNION ALL
                SELECT DISTINCT rank, 'label:' || process_name FROM lanes WHERE side = 'device' AND process_name IS NOT NULL
                """).fetchall():
                facts.setdefault(rank, set()).add(fact)
            for r, m in zip(self.ranks, self.meta):
                md = m.get("trace_metadata") or {}
                for d in md.get("deviceProperties") or []:
                    if isinstance(d, dict) and d.get("name"):
                        facts[r].add(f"device:{d['name']}")
                backend = distributed_info(md).get("backend")
                if isinstance(backend, str):
                    facts[r].add(f"backend:{backend}")
            self._cache["vendors"] = {r: vendor_of(f) for r, f in facts.items()}
        return self._cache["vendors"]

    def preset_name(self) -> str | None:
        for m in self.meta:
            dev = (m.get("manifest") or {}).get("device") or {}
            if dev.get("preset"):
                return dev["preset"]
        row = self.con.execute("SELECT any_value(preset) FROM instructions").fetchall()
        return row[0][0] if row else None

    # ---- querying ---------------------------------------------------------------------
    def sql(self, query: str, params=None) -> duckdb.DuckDBPyRelation:
        """Run SQL over the views; returns a DuckDB relation (``.fetchall()``, ``.arrow()``, ``.pl()``, ``.df()``)."""
        if _LOD_NAME.search(query):
            self._ensure_lod()  # the LOD tables are built on first use
        if _HIER_NAME.search(query):
            from ._nesting import ensure_hierarchy

            ensure_hierarchy(self)  # the nesting's tables, in the database once SQL reads them
        return self.con.sql(query, params=params)

    def table(self, name: str):
        """A whole view as a pyarrow Table (``events``, ``flows``, ``lanes``, ``executables``, ``instructions``)."""
        if name not in ("events", "flows", "lanes", "executables", "instructions", "raw", "lod"):
            raise ValueError(f"unknown table {name!r}; tables: events, flows, lanes, executables, instructions, raw, lod")
        return _arrow(self.sql(f"SELECT * FROM {name}"))

    def to_pandas(self, name: str = "events"):
        """A view as a pandas DataFrame (through Arrow; needs pandas installed)."""
        return self.table(name).to_pandas()

    def to_polars(self, name: str = "events"):
        """A view as a polars DataFrame (through Arrow; needs polars installed)."""
        import polars as pl

        return pl.from_arrow(self.table(name))

    def export_parquet(self, out_dir: str) -> str:
        """Copy the tables into ``out_dir`` in the hive layout distributed engines read:
        ``events/rank=<r>/part-*.parquet``, ``lanes.parquet``, ``executables.parquet``, ``instructions.parquet``."""
        import shutil

        for e, r in zip(self.entries, self.ranks):
            for src in _glob.glob(os.path.join(e, "events", "*", "*.parquet")):
                d = os.path.join(out_dir, "events", f"rank={r}")
                os.makedirs(d, exist_ok=True)
                shutil.copy2(src, os.path.join(d, os.path.basename(src)))
        self.con.execute(f"COPY lanes TO '{os.path.join(out_dir, 'lanes.parquet')}' (FORMAT parquet)")
        for name in ("executables", "instructions"):
            if self.con.execute(f"SELECT count(*) FROM {name}").fetchall()[0][0]:
                self.con.execute(f"COPY {name} TO '{os.path.join(out_dir, name + '.parquet')}' (FORMAT parquet)")
        return out_dir

    def event(self, eid: int) -> dict:
        """One event as a dict (args parsed)."""
        rel = self.con.execute("SELECT * FROM events WHERE eid = ?", [eid])
        cols = [d[0] for d in rel.description]
        rows = rel.fetchall()
        row = rows[0] if rows else None
        if row is None:
            raise KeyError(f"no event with eid {eid}")
        d = dict(zip(cols, row))
        try:
            d["args"] = json.loads(d["args"]) if d.get("args") else {}
        except ValueError:
            pass
        return d

    # ---- analyses (one module each) ----------------------------------------------------
    def summary(self) -> dict:
        """Counts by kind and category, span, device busy time, lanes, warnings (plain dict)."""
        from ._summary import summary

        return summary(self)

    def op_table(self, *, kinds: tuple[str, ...] = ("op",), by_shape: bool = False, limit: int | None = None,
                 sort: str = "device_total_ns"):
        """key_averages-like table: calls, host total/self, device total/self per op name (and
        input shapes with ``by_shape``); ``sort`` by device_total_ns, device_self_ns,
        host_total_ns, host_self_ns or calls. See ``_op_table.op_table``."""
        from ._op_table import op_table

        return op_table(self, kinds=kinds, by_shape=by_shape, limit=limit, sort=sort)

    def kernels(self, *, limit: int | None = None, kinds: tuple[str, ...] = ("kernel", "memcpy", "memset")):
        """Device work by name: calls, total, mean, min, max (ns), lanes, share of device time."""
        from ._op_table import kernel_table

        return kernel_table(self, limit=limit, kinds=kinds)

    def breakdown(self, *, side: str = "device"):
        """Per lane of ``side`` ('device' or 'host'): busy time (union), kernel / memcpy / memset split."""
        from ._breakdown import breakdown

        return breakdown(self, side=side)

    def engine_breakdown(self, *, program_hash: str | None = None):
        """tilescope: per engine (TensorE, VectorE, DMA queues ...), modeled busy time, bytes, FLOPs."""
        from ._breakdown import engine_breakdown

        return engine_breakdown(self, program_hash=program_hash)

    def gaps(self, *, min_ns: int = 0):
        """Idle gaps of at least ``min_ns``, classified (device waits on host / runtime / other;
        host waits on device)."""
        from ._gaps import idle_gaps

        return idle_gaps(self, min_ns=min_ns)

    def kernel_types(self, *, busy_kinds: tuple[str, ...] = ("kernel", "memcpy", "memset")):
        """Per rank: device time split into compute / communication / memory and the time each
        combination overlaps ('compute + communication', ...): HTA's kernel-type breakdown.
        Types come from ``_utilization.KERNEL_TYPES``."""
        from ._utilization import kernel_type_breakdown

        return kernel_type_breakdown(self, busy_kinds=busy_kinds)

    def temporal_breakdown(self, *, busy_kinds: tuple[str, ...] = ("kernel", "memcpy", "memset")):
        """Per rank: idle / compute / non-compute time and percentages of the device span (HTA's
        temporal breakdown). Add ``'sync'`` to ``busy_kinds`` to count stream waits as busy, as HTA does."""
        from ._utilization import temporal_breakdown

        return temporal_breakdown(self, busy_kinds=busy_kinds)

    def comm_comp_overlap(self):
        """Per rank: communication time, the part of it overlapped by computation, their ratio."""
        from ._utilization import comm_comp_overlap

        return comm_comp_overlap(self)

    def launch_stats(self, *, launch_names: tuple[str, ...] | None = None, long_launch_ns: int = 50_000,
                     long_delay_ns: int = 100_000):
        """Per rank: launch pairs, CPU launch vs device duration, launch delay, and the outliers
        (short kernels, launches over ``long_launch_ns``, delays over ``long_delay_ns``).
        ``launch_names``: only those calls (``_launches.LAUNCH_NAMES_HTA`` is HTA's set)."""
        from ._launches import launch_stats

        return launch_stats(self, launch_names=launch_names, long_launch_ns=long_launch_ns,
                            long_delay_ns=long_delay_ns)

    def launches(self, *, launch_names: tuple[str, ...] | None = None, rank: int | None = None):
        """One row per (launch call, device work) pair with cpu_duration_ns, gpu_duration_ns, launch_delay_ns."""
        from ._launches import launch_pairs

        return launch_pairs(self, launch_names=launch_names, rank=rank)

    def queue_length(self, *, launch_names: tuple[str, ...] | None = None, rank: int | None = None):
        """Outstanding device work per device lane over time (a step function: one row per change)."""
        from ._launches import queue_length

        return queue_length(self, launch_names=launch_names, rank=rank)

    def queue_length_summary(self, *, launch_names: tuple[str, ...] | None = None):
        """Per device lane: changes, mean and max queue length, time-weighted mean, time at the max."""
        from ._launches import queue_length_summary

        return queue_length_summary(self, launch_names=launch_names)

    def memory_bandwidth(self, *, rank: int | None = None):
        """Memory-copy bandwidth over time per copy type (Memcpy HtoD / DtoH / DtoD, Memset, DMA)."""
        from ._launches import memory_bandwidth

        return memory_bandwidth(self, rank=rank)

    def memory_bandwidth_summary(self):
        """Per copy type: copies, bytes, busy time, achieved GB/s, the bandwidth series' mean and max."""
        from ._launches import memory_bandwidth_summary

        return memory_bandwidth_summary(self)

    def kernel_sequences(self, op_name: str, *, min_length: int = 3, rank: int | None = None, top: int = 10):
        """The most frequent sequences of device work launched by the outermost ops named like ``op_name``."""
        from ._sequences import kernel_sequences

        return kernel_sequences(self, op_name, min_length=min_length, rank=rank, top=top)

    def critical_path(self, *, rank: int | None = None, step: int | None = None):
        """The chain of host and device work that set the end time, walked back from the last
        device work: per-segment rows and what bounded it (see ``_critical``); ``step``: within
        the ``step``-th ProfilerStep only (0-based), as HTA's ``critical_path_analysis`` clips."""
        from ._critical import critical_path

        return critical_path(self, rank=rank, step=step)

    def lineage(self, eid: int) -> list[dict]:
        """From any hop, the chain parents -> op -> launch(es) -> device execution(s) -> instructions."""
        from ._lineage import lineage

        return lineage(self, eid)

    def links(self):
        """Every device event with the host launch that submitted it and the framework op
        behind that launch (``dev_eid, launch_eid, op_eid``; op null when none), as a pyarrow
        Table: the edges :meth:`lineage` follows, for tools that index them once."""
        from ._nesting import ensure_hierarchy

        ensure_hierarchy(self)
        return _arrow(self.con.sql("SELECT dev_eid, launch_eid, op_eid FROM _links"))

    def execution(self, eid: int) -> dict:
        """tilescope: one device execution's instructions (modeled) and per-engine busy time."""
        from ._lineage import execution

        return execution(self, eid)

    def lowerings(self):
        """tilescope: modeled kernel time per lowering rule."""
        from ._lowering import lowering_table

        return lowering_table(self)

    def generic_share(self, *, top: int = 5) -> dict | None:
        """tilescope: the generic lowering's share of modeled kernel time and its ``top`` (op, shapes)."""
        from ._lowering import generic_share

        return generic_share(self, top=top)

    def roofline(self, *, peak_tflops: float | None = None, peak_gbps: float | None = None):
        """FLOPs, bytes, intensity, MFU, MBU, % of roofline per op / executable (peaks overridable)."""
        from ._roofline import roofline

        return roofline(self, peak_tflops=peak_tflops, peak_gbps=peak_gbps)

    def memory(self, *, device_only: bool = True):
        """Peak device memory per op (Kineto profile_memory traces)."""
        from ._memory import peak_memory

        return peak_memory(self, device_only=device_only)

    def ranks_summary(self):
        """Per rank: events, ops, kernels, span, device busy / span / active / idle."""
        from ._summary import ranks_summary

        return ranks_summary(self)

    def window(self, t0_ns=None, t1_ns=None, lanes=None, pixels: int = 1000, *, max_events: int = 20000):
        """The explorer's level-of-detail query (see docs/trace-analysis.md, "The windowed query")."""
        from ._window import window

        return window(self, t0_ns, t1_ns, lanes, pixels, max_events=max_events)

    def replay(self, preset, *, out_dir: str | None = None) -> "Trace":
        """What-if: the profile's Programs re-simulated on another preset (modeled)."""
        from ._replay import replay

        return replay(self, preset, out_dir=out_dir)

    def __repr__(self) -> str:
        n = sum(m.get("events") or 0 for m in self.meta)
        return f"Trace({', '.join(os.path.basename(s.rstrip('/')) for s in self.sources)}: {n:,} events, ranks {self.ranks})"


def _arrow(rel):
    """A DuckDB relation as a pyarrow Table (the method name changed across DuckDB versions)."""
    for name in ("to_arrow_table", "fetch_arrow_table", "arrow"):
        fn = getattr(rel, name, None)
        if fn is not None:
            out = fn()
            if hasattr(out, "read_all"):
                out = out.read_all()
            return out
    raise RuntimeError("this DuckDB cannot export Arrow")


def open_trace(paths, *, align: str = "none", progress: bool | None = None, refresh: bool = False) -> Trace:
    """Open profile directories, Kineto/Chrome traces (one per rank) or executable+itrace pairs.

    A directory that is not a profile but holds ``*.json``/``*.json.gz`` traces opens as one
    trace per rank. ``align='start'`` shifts each rank so that clocks agree at the first event.
    """
    if align not in ("none", "start"):
        raise ValueError(f"align must be 'none' or 'start', got {align!r}")
    if isinstance(paths, (str, os.PathLike)) and os.path.isdir(paths) and _classify_or_none(os.fspath(paths)) is None:
        found = sorted(_glob.glob(os.path.join(paths, "*.json")) + _glob.glob(os.path.join(paths, "*.json.gz")))
        if not found:
            from ..profiler.internal import profiles_inside

            raise TraceFormatError(profiles_inside(paths) or f"{paths}: no manifest.json and no *.json / *.json.gz "
                                                            f"traces inside")
        paths = found
    srcs = _expand(paths)
    entries = [build_entry(p, kind, progress=progress, refresh=refresh, pair=pair) for p, kind, pair in srcs]
    return Trace(entries, [s[0] for s in srcs], align=align)


def _classify_or_none(path: str):
    try:
        return classify_source(path)
    except TraceFormatError:
        return None
