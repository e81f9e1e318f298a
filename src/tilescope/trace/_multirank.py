"""Past one machine: per-rank ingest in parallel into the hive Parquet layout, and the
cross-rank analyses on DuckDB (embedded, the default) or on a Dask cluster, over that layout.

The layout is the one ``Trace.export_parquet`` writes and distributed engines read::

    DIR/events/rank=<r>/part-<k>.parquet     every record of rank r (TABLES["events"])
    DIR/ranks/rank=<r>.json                  that rank's meta (source, warnings, time extent)

Per rank (``RANK_METRICS``): the steps (``ProfilerStep#n`` slices: count, mean, max), the
device span, the union of device work (active), idle, and the union of compute /
communication / memory work (``_utilization.KERNEL_TYPES``). Device work is recognised by its
category (``CATEGORY_KINDS``: the layout holds events, not process labels). The two engines
compute these independently -- DuckDB in SQL over the whole layout, Dask one task per rank
with pyarrow and numpy -- and the tests require the same answer from both. The cross-rank
figures (step time per rank, stragglers, communication wait skew) are computed from the
per-rank rows the same way for both engines (:func:`cross_rank`).

Why Dask: it installs from PyPI as pure Python (no JVM as Spark needs, no native object
store as Ray brings), runs a ``LocalCluster`` in CI on two cores, and schedules plain
Python functions over files on shared storage -- one task per rank is the natural unit here.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np

__all__ = ["RANK_METRICS", "trace_files", "ingest_ranks", "rank_metrics", "rank_metrics_of_table", "cross_rank"]

RANK_METRICS = (
    ("rank", "rank"),
    ("events", "records of the rank"),
    ("steps", "ProfilerStep slices"),
    ("step_mean_ns", "mean step duration"),
    ("step_max_ns", "longest step"),
    ("device_span_ns", "first device work to the last"),
    ("active_ns", "union of device work"),
    ("idle_ns", "device span minus active"),
    ("compute_ns", "union of compute kernels"),
    ("communication_ns", "union of communication kernels (collectives: time spent in or waiting in them)"),
    ("memory_ns", "union of copies and memsets"),
    ("non_compute_ns", "active minus compute: device time with no compute kernel running (HTA's non-compute)"),
    ("overlap_ns", "time compute and communication kernels run at once (communication hidden under compute)"),
)
_COLUMNS = ["ph", "cat", "name", "ts_ns", "dur_ns"]
_STEP = re.compile(r"^ProfilerStep#\d+$")


# ---- parallel ingest -------------------------------------------------------------------------
def _ingest_one(path: str, out_dir: str, position: int) -> dict:
    """Ingest one rank's trace into ``out_dir/_staging/<position>/`` (runs in a worker: a local
    process or a Dask task; the staging folder sits beside the layout, on the storage every
    worker shares, so the client only renames it into place)."""
    from ._store import build_entry, classify_source

    root = os.path.join(out_dir, "_staging", str(position))
    entry = build_entry(path, classify_source(path), root=root, progress=False)
    with open(os.path.join(entry, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    return {"entry": entry, "rank": meta["rank"], "position": position, "source": os.path.abspath(path),
            "events": meta.get("events") or 0, "warnings": meta.get("warnings", []),
            "t0_ns": meta.get("t0_ns"), "t1_ns": meta.get("t1_ns")}


def _place(info: dict, rank: int, out_dir: str) -> None:
    """Move an ingested entry's event parts to ``out_dir/events/rank=<rank>/`` (a rename) and
    write ``out_dir/ranks/rank=<rank>.json``."""
    src = os.path.join(info["entry"], "events", f"rank={info['rank']}")
    dst = os.path.join(out_dir, "events", f"rank={rank}")
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.replace(src, dst)
    os.makedirs(os.path.join(out_dir, "ranks"), exist_ok=True)
    with open(os.path.join(out_dir, "ranks", f"rank={rank}.json"), "w", encoding="utf-8") as f:
        json.dump({k: v for k, v in info.items() if k != "entry"} | {"rank": rank}, f, indent=1)


def trace_files(paths) -> list[str]:
    """The traces named by ``paths``: files and tilescope profile folders as given, other
    folders expanded to the ``*.json`` / ``*.json.gz`` files directly inside them (sorted)."""
    out = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p) and not os.path.exists(os.path.join(p, "manifest.json")):
            found = sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith((".json", ".json.gz")))
            if not found:
                raise FileNotFoundError(f"{p}: a folder without .json / .json.gz traces in it")
            out += found
        elif os.path.exists(p):
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such trace file or folder")
    return out


def ingest_ranks(paths, out_dir: str, *, workers: int | None = None, client=None) -> list[int]:
    """Ingest per-rank Kineto traces in parallel into the hive layout under ``out_dir``;
    returns the ranks, in the order of ``paths``. Each file is one task: on ``client`` (a
    ``dask.distributed.Client``, whose workers must see ``paths`` and ``out_dir``: shared
    storage) or else on ``workers`` local processes (default: one per CPU). The rank comes
    from each trace's ``distributedInfo``; when files claim the same rank, every file is
    numbered by its position instead, with a warning in its rank's json. ``out_dir`` must not
    hold a layout already (a stale rank would join the analysis)."""
    # absolute: a cluster's workers do not share the client's working directory
    paths = [os.path.abspath(p) for p in trace_files(paths)]
    out_dir = os.path.abspath(out_dir)
    if not paths:
        raise ValueError("ingest_ranks needs at least one trace file")
    if os.path.isdir(os.path.join(out_dir, "events")):
        raise FileExistsError(f"{out_dir}: already holds a layout (events/); give a new folder or remove that one")
    if workers is not None and workers < 1:
        raise ValueError(f"workers={workers}: give 1 or more local processes")
    os.makedirs(out_dir, exist_ok=True)
    try:
        if client is not None:
            futures = client.map(_ingest_one, paths, [out_dir] * len(paths), list(range(len(paths))), pure=False)
            infos = client.gather(futures)
        else:
            n = max(1, min(workers or os.cpu_count() or 1, len(paths)))
            if n == 1:
                infos = [_ingest_one(p, out_dir, i) for i, p in enumerate(paths)]
            else:
                from concurrent.futures import ProcessPoolExecutor

                with ProcessPoolExecutor(max_workers=n) as ex:
                    infos = list(ex.map(_ingest_one, paths, [out_dir] * len(paths), range(len(paths))))
        ranks = [i["rank"] for i in infos]
        if len(set(ranks)) != len(ranks):
            dup = sorted({r for r in ranks if ranks.count(r) > 1})
            for i in infos:
                i["warnings"] = i["warnings"] + [f"several files claim rank {dup}; every file is numbered by its "
                                                 f"position instead: {os.path.basename(i['source'])} is rank {i['position']}"]
            ranks = [i["position"] for i in infos]
        for info, r in zip(infos, ranks):
            _place(info, r, out_dir)
    finally:
        shutil.rmtree(os.path.join(out_dir, "_staging"), ignore_errors=True)
    return ranks


# ---- the per-rank metrics: DuckDB (SQL) and a numpy reference (the Dask tasks) -------------
def _device_kinds_sql() -> str:
    from ._schema import kind_case_sql

    return kind_case_sql("cat", "name")


def rank_metrics(layout: str, *, engine: str = "duckdb", client=None):
    """``RANK_METRICS`` per rank of the layout under ``layout``, on ``engine`` ('duckdb' or
    'dask'; 'dask' runs one task per rank on ``client``, a ``dask.distributed.Client``, or on
    a local cluster made for the call). Returns a pyarrow Table ordered by rank."""
    if engine == "duckdb":
        return _metrics_duckdb(layout)
    if engine == "dask":
        return _metrics_dask(layout, client)
    raise ValueError(f"engine must be 'duckdb' or 'dask', got {engine!r}")


def _rank_dirs(layout: str) -> dict[int, str]:
    base = os.path.join(layout, "events")
    if not os.path.isdir(base):
        raise FileNotFoundError(f"{layout}: no events/ folder; expected the layout events/rank=<r>/part-*.parquet "
                                f"(ingest_ranks or Trace.export_parquet write it)")
    out = {}
    for d in os.listdir(base):
        m = re.fullmatch(r"rank=(-?\d+)", d)
        if m:
            out[int(m.group(1))] = os.path.join(base, d)
    return dict(sorted(out.items()))


_GROUPS = ("active", "compute", "communication", "memory", "compute_or_communication")


def _metrics_duckdb(layout: str):
    """RANK_METRICS in SQL: one scan of the layout for the per-rank counts and the device
    slices (typed), then one windowed union pass over every (rank, group) at once."""
    import duckdb

    from ._breakdown import busy_sql
    from ._trace import _arrow
    from ._utilization import _type_case_sql

    ranks = list(_rank_dirs(layout))  # (also the error for a folder that is not a layout)
    con = duckdb.connect()
    glob = os.path.join(layout, "events", "rank=*", "*.parquet")
    is_step = "ph = 'X' AND regexp_full_match(name, 'ProfilerStep#[0-9]+') AND dur_ns IS NOT NULL"
    is_dev = "ph = 'X' AND kind IN ('kernel', 'memcpy', 'memset') AND dur_ns >= 0 AND ts_ns IS NOT NULL"
    try:
        import glob as _glob

        src = (f"read_parquet('{glob}', hive_partitioning=true)" if _glob.glob(glob) else
               "(SELECT NULL::INTEGER AS rank, NULL AS ph, NULL AS cat, NULL AS name, NULL::BIGINT AS ts_ns, "
               "NULL::BIGINT AS dur_ns WHERE false)")
        con.execute(f"""CREATE TEMP TABLE r AS
            SELECT rank::INTEGER AS rank, ph, name, ts_ns, dur_ns, {_device_kinds_sql()} AS kind FROM {src}""")
        con.execute(f"""CREATE TEMP TABLE dev AS
            SELECT rank, ts_ns, ts_ns + dur_ns AS end_ns, {_type_case_sql()} AS t FROM r WHERE {is_dev}""")
        # every rank folder is a row, also one whose trace held no events (no Parquet part)
        per_rank = f"""SELECT rank, count(r.kind) AS events, count(*) FILTER (WHERE {is_step}) AS steps,
                              avg(dur_ns) FILTER (WHERE {is_step}) AS step_mean_ns,
                              max(dur_ns) FILTER (WHERE {is_step}) AS step_max_ns
                       FROM (SELECT unnest({ranks or [0]}::INTEGER[]) AS rank) LEFT JOIN r USING (rank) GROUP BY rank"""
        # each device slice in the groups it belongs to (_GROUPS), as the view busy_sql reads
        con.execute("""CREATE TEMP VIEW events AS
            SELECT rank, 'active' AS g, ts_ns, end_ns FROM dev
            UNION ALL SELECT rank, t, ts_ns, end_ns FROM dev
            UNION ALL SELECT rank, 'compute_or_communication', ts_ns, end_ns FROM dev
                      WHERE t IN ('compute', 'communication')""")
        unions = busy_sql("true", key="{'rank': rank, 'g': g}")
        busy = ", ".join(f"coalesce(sum(busy_ns) FILTER (WHERE lane.g = '{g}'), 0) AS {g}_u" for g in _GROUPS)
        q = f"""
          WITH ev AS ({per_rank}),
          sp AS (SELECT rank, max(end_ns) - min(ts_ns) AS device_span_ns FROM dev GROUP BY rank),
          u AS (SELECT lane.rank AS rank, {busy} FROM ({unions}) GROUP BY lane.rank)
          SELECT rank, events, steps, step_mean_ns, step_max_ns,
                 coalesce(device_span_ns, 0) AS device_span_ns, coalesce(active_u, 0) AS active_ns,
                 coalesce(device_span_ns - active_u, 0) AS idle_ns, coalesce(compute_u, 0) AS compute_ns,
                 coalesce(communication_u, 0) AS communication_ns, coalesce(memory_u, 0) AS memory_ns,
                 coalesce(active_u - compute_u, 0) AS non_compute_ns,
                 coalesce(compute_u + communication_u - compute_or_communication_u, 0) AS overlap_ns
          FROM ev LEFT JOIN sp USING (rank) LEFT JOIN u USING (rank) ORDER BY rank"""
        return _normalize(_arrow(con.sql(q)))
    finally:
        con.close()


def _normalize(t):
    """The metrics table with RANK_METRICS' columns and types (both engines return this)."""
    import pyarrow as pa

    types = {c: pa.int64() for c, _d in RANK_METRICS} | {"rank": pa.int32(), "step_mean_ns": pa.float64()}
    return pa.table({c: t.column(c).cast(types[c]) for c, _d in RANK_METRICS})


def _kinds(cat, name) -> np.ndarray:
    """CATEGORY_KINDS (first matching row) for pyarrow arrays of categories and names."""
    import pyarrow.compute as pc

    from ._schema import CATEGORY_KINDS

    out = np.full(len(cat), "other", dtype=object)
    done = np.zeros(len(cat), dtype=bool)
    for c, prefix, kind, _side in CATEGORY_KINDS:
        m = ~done
        if c is not None:
            m &= pc.fill_null(pc.equal(cat, c), False).to_numpy(zero_copy_only=False)
        if prefix is not None:
            m &= pc.fill_null(pc.starts_with(name, prefix), False).to_numpy(zero_copy_only=False)
        out[m] = kind
        done |= m
    return out


def _types(kind: np.ndarray, name) -> np.ndarray:
    """``_utilization.KERNEL_TYPES`` (first matching row) per event; None where no row applies."""
    import pyarrow.compute as pc

    from ._utilization import KERNEL_TYPES

    out = np.full(len(kind), None, dtype=object)
    done = np.zeros(len(kind), dtype=bool)
    for t, kinds, rx in KERNEL_TYPES:
        m = ~done & np.isin(kind, list(kinds))
        if rx is not None:
            m &= pc.fill_null(pc.match_substring_regex(name, rx), False).to_numpy(zero_copy_only=False)
        out[m] = t
        done |= m
    return out


def rank_metrics_of_table(rank: int, table) -> dict:
    """``RANK_METRICS`` of one rank from a pyarrow Table of its records (columns ph, cat, name,
    ts_ns, dur_ns): what each Dask task computes, with pyarrow and numpy (no SQL), so the two
    engines are independent implementations of the same definitions."""
    import pyarrow.compute as pc

    from ._utilization import merge_intervals

    n = table.num_rows
    name = table.column("name")
    ts_ok = pc.is_valid(table.column("ts_ns")).to_numpy(zero_copy_only=False)
    dur_ok = pc.is_valid(table.column("dur_ns")).to_numpy(zero_copy_only=False)
    ts = pc.fill_null(table.column("ts_ns"), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    dur = pc.fill_null(table.column("dur_ns"), -1).to_numpy(zero_copy_only=False).astype(np.int64)
    x = pc.fill_null(pc.equal(table.column("ph"), "X"), False).to_numpy(zero_copy_only=False)
    steps = x & dur_ok & pc.fill_null(pc.match_substring_regex(name, _STEP.pattern), False).to_numpy(zero_copy_only=False)
    kind = _kinds(table.column("cat"), name)
    dev = x & ts_ok & dur_ok & (dur >= 0) & np.isin(kind, ["kernel", "memcpy", "memset"])
    out = {"rank": rank, "events": n, "steps": int(steps.sum()),
           "step_mean_ns": float(dur[steps].mean()) if steps.any() else None,
           "step_max_ns": int(dur[steps].max()) if steps.any() else None}
    s, e = ts[dev], ts[dev] + dur[dev]
    if len(s):
        ms, me = merge_intervals(s, e)
        out["device_span_ns"] = int(e.max() - s.min())
        out["active_ns"] = int((me - ms).sum())
    else:
        out["device_span_ns"] = out["active_ns"] = 0
    out["idle_ns"] = out["device_span_ns"] - out["active_ns"]
    types = _types(kind, name)[dev]
    for t in ("compute", "communication", "memory"):
        ms, me = merge_intervals(s[types == t], e[types == t])
        out[f"{t}_ns"] = int((me - ms).sum())
    out["non_compute_ns"] = out["active_ns"] - out["compute_ns"]
    cc = (types == "compute") | (types == "communication")
    ms, me = merge_intervals(s[cc], e[cc])
    out["overlap_ns"] = out["compute_ns"] + out["communication_ns"] - int((me - ms).sum())
    return out


def _rank_task(rank: int, folder: str) -> dict:
    """One Dask task: read one rank's Parquet parts and compute its metrics."""
    return rank_metrics_of_table(rank, _rank_table(folder))


def _rank_table(folder: str):
    """The columns the metrics read, from one rank's Parquet parts (an empty table if none)."""
    import glob

    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = [pq.read_table(f, columns=_COLUMNS) for f in sorted(glob.glob(os.path.join(folder, "*.parquet")))]
    empty = pa.schema([("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()), ("ts_ns", pa.int64()),
                       ("dur_ns", pa.int64())])
    return pa.concat_tables(parts) if parts else empty.empty_table()


def _metrics_dask(layout: str, client):
    import pyarrow as pa

    dirs = _rank_dirs(layout)
    own = None
    if client is None:
        from distributed import Client, LocalCluster

        own = Client(LocalCluster(n_workers=min(os.cpu_count() or 1, 4), threads_per_worker=1, processes=True,
                                  dashboard_address=":0"))
        client = own
    try:
        futures = client.map(_rank_task, list(dirs), list(dirs.values()), pure=False)
        rows = client.gather(futures)
    finally:
        if own is not None:
            cluster = own.cluster
            own.close()
            cluster.close()
    cols = {c: [r[c] for r in rows] for c, _d in RANK_METRICS}
    return _normalize(pa.table(cols))


# ---- cross-rank -----------------------------------------------------------------------------
def cross_rank(layout: str, *, engine: str = "duckdb", client=None, straggler_threshold: float = 0.1) -> dict:
    """The cross-rank view of a layout: ``ranks`` (RANK_METRICS per rank, a pyarrow Table),
    ``step_time`` (median / min / max of the ranks' mean step), ``comm_wait_skew`` (the spread of
    the ranks' communication time) and ``stragglers``, each with its reason:

    - ``slow steps``: a mean step over the median by more than ``straggler_threshold``;
    - ``late to collectives``: communication time under the median by more than the threshold.
      In a collective every rank waits for the last to arrive, so in a synchronous job (where
      step times agree) the rank that spends the least time in communication is the one the
      others wait for."""
    if straggler_threshold < 0:
        raise ValueError(f"straggler_threshold={straggler_threshold}: give 0 or more (0.1 = 10% over the median)")
    t = rank_metrics(layout, engine=engine, client=client)
    rows = t.to_pylist()
    steps = np.array([r["step_mean_ns"] for r in rows if r["steps"]], dtype=float)
    med_step = float(np.median(steps)) if len(steps) else None
    comm = np.array([r["communication_ns"] for r in rows], dtype=float)
    med_comm = float(np.median(comm)) if len(comm) and comm.any() else None
    stragglers = []
    for r in rows:
        if med_step and r["steps"] and r["step_mean_ns"] > med_step * (1 + straggler_threshold):
            stragglers.append({"rank": r["rank"], "reason": "slow steps", "value_ns": r["step_mean_ns"],
                               "median_ns": med_step, "off_median": r["step_mean_ns"] / med_step - 1})
        if med_comm and r["communication_ns"] < med_comm * (1 - straggler_threshold):
            stragglers.append({"rank": r["rank"], "reason": "late to collectives", "value_ns": r["communication_ns"],
                               "median_ns": med_comm, "off_median": r["communication_ns"] / med_comm - 1})
    skew = None
    if med_comm:
        lo = min(rows, key=lambda r: (r["communication_ns"], r["rank"]))
        hi = max(rows, key=lambda r: (r["communication_ns"], -r["rank"]))
        skew = {"min_rank": lo["rank"], "min_ns": lo["communication_ns"], "max_rank": hi["rank"],
                "max_ns": hi["communication_ns"], "skew_ns": hi["communication_ns"] - lo["communication_ns"]}
    return {"engine": engine, "ranks": t,
            "step_time": {"median_ns": med_step, "min_ns": float(steps.min()) if len(steps) else None,
                          "max_ns": float(steps.max()) if len(steps) else None},
            "stragglers": sorted(stragglers, key=lambda s: (s["rank"], s["reason"])), "comm_wait_skew": skew}
