"""How a device's time splits: compute / communication / memory (with their overlaps), the
temporal breakdown (idle / compute / non-compute per rank) and communication hidden under
computation -- HTA's kernel-type analyses, exact to the nanosecond.

Device work is typed by the rules table ``KERNEL_TYPES`` (first match wins), from the event's
kind and name. Per rank and type the work's intervals are merged (streams that overlap each
other count once); a sweep over all types' boundaries then gives the time during which each
combination of types runs.

>>> merge_intervals(np.array([0, 5, 20]), np.array([10, 8, 30]))
(array([ 0, 20]), array([10, 30]))
>>> sorted(sweep({"compute": (np.array([0]), np.array([10])), "memory": (np.array([5]), np.array([15]))}).items())
[('compute', 5), ('compute + memory', 5), ('memory', 5)]
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["KERNEL_TYPES", "kernel_type_of", "merge_intervals", "sweep", "kernel_type_breakdown",
           "temporal_breakdown", "comm_comp_overlap"]

# (type, kinds it applies to, name regex or None). HTA 0.5.0 types by name alone
# (^nccl.*Kernel communication; ^Memcpy|^Memset|^dma memory; the rest compute unless the name
# holds Memcpy/Memset/Sync); tilescope uses the kind the category rules gave (a copy is memory
# whatever its name) and knows the other vendors' collective libraries.
KERNEL_TYPES = (
    ("memory", ("memcpy", "memset"), None),
    ("communication", ("kernel",), r"(?i)^(nccl|rccl|hccl|xccl|oneccl|c10d::)|nccl(dev)?kernel"),
    ("compute", ("kernel",), None),
)
DISPLAY_ORDER = ("compute", "communication", "memory", "sync")  # how combinations are named


def kernel_type_of(kind: str, name: str) -> str | None:
    """The first ``KERNEL_TYPES`` row for an event's kind and name (None: not device work).

    >>> kernel_type_of("kernel", "ncclDevKernel_AllGather_RING_LL"), kernel_type_of("memcpy", "Memcpy DtoD")
    ('communication', 'memory')
    """
    for t, kinds, rx in KERNEL_TYPES:
        if kind in kinds and (rx is None or re.search(rx, name or "")):
            return t
    return None


def _type_case_sql() -> str:
    arms = []
    for t, kinds, rx in KERNEL_TYPES:
        cond = "kind IN (" + ", ".join(f"'{k}'" for k in kinds) + ")"
        if rx:
            pat = rx.replace("(?i)", "")
            cond += f" AND regexp_matches(coalesce(name, ''), '{pat}', 'i')"
        arms.append(f"WHEN {cond} THEN '{t}'")
    return "CASE " + " ".join(arms) + " END"


def merge_intervals(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of [ts, end) intervals as sorted, disjoint intervals (touching ones merge)."""
    if len(ts) == 0:
        return ts[:0], end[:0]
    o = np.lexsort((end, ts))
    ts, end = ts[o], end[o]
    reach = np.maximum.accumulate(end)
    new = np.r_[True, ts[1:] > reach[:-1]]
    starts = np.flatnonzero(new)
    return ts[starts], np.maximum.reduceat(end, starts) if len(starts) else end[:0]


def sweep(merged: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, int]:
    """Time during which each combination of types runs ('compute + memory': both and no other),
    from each type's merged intervals."""
    names = sorted(merged, key=lambda t: (DISPLAY_ORDER.index(t) if t in DISPLAY_ORDER else len(DISPLAY_ORDER), t))
    times, deltas = [], []
    for bit, t in enumerate(names):
        s, e = merged[t]
        times += [s, e]
        deltas += [np.full(len(s), 1 << bit, np.int64), np.full(len(e), -(1 << bit), np.int64)]
    if not times:
        return {}
    tm = np.concatenate(times)
    dl = np.concatenate(deltas)
    o = np.argsort(tm, kind="stable")
    tm, dl = tm[o], dl[o]
    mask = np.cumsum(dl)
    seg = np.diff(tm)  # the mask after event i holds until event i + 1
    out: dict[str, int] = {}
    for m in np.unique(mask[:-1]).tolist():
        if m <= 0:
            continue
        ns = int(seg[mask[:-1] == m].sum())
        if ns:
            out[" + ".join(t for b, t in enumerate(names) if m & (1 << b))] = ns
    return out


def _device_work(trace, busy_kinds) -> dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per rank and kernel type, the merged intervals of the device work of ``busy_kinds``
    (kinds outside the KERNEL_TYPES rows, e.g. 'sync', count as their kind)."""
    kinds = ", ".join(f"'{k}'" for k in busy_kinds)
    rows = trace.sql(f"""SELECT rank, coalesce({_type_case_sql()}, kind) AS t, ts_ns, end_ns FROM events
                         WHERE ph = 'X' AND side = 'device' AND kind IN ({kinds}) AND dur_ns IS NOT NULL""").fetchnumpy()
    out: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    rank, typ = rows["rank"], rows["t"]
    ts, end = rows["ts_ns"].astype(np.int64), rows["end_ns"].astype(np.int64)
    for r in np.unique(rank).tolist() if len(rank) else []:
        sel_r = rank == r
        out[int(r)] = {str(t): merge_intervals(ts[sel_r & (typ == t)], end[sel_r & (typ == t)])
                       for t in np.unique(typ[sel_r]).tolist()}
    return out


def kernel_type_breakdown(trace, *, busy_kinds=("kernel", "memcpy", "memset")):
    """Per rank: device time by kernel type and by their overlaps (HTA's kernel-type
    breakdown). Columns: rank, kernel_type ('compute', 'communication', 'memory',
    'compute + communication', ...), time_ns (time when exactly those types run), share (of
    the rank's device active time). Returns a pyarrow Table."""
    import pyarrow as pa

    cols: dict[str, list] = {"rank": [], "kernel_type": [], "time_ns": [], "share": []}
    for r, merged in sorted(_device_work(trace, busy_kinds).items()):
        sw = sweep(merged)
        total = sum(sw.values())
        for k, ns in sorted(sw.items(), key=lambda kv: -kv[1]):
            cols["rank"].append(r)
            cols["kernel_type"].append(k)
            cols["time_ns"].append(ns)
            cols["share"].append(ns / total if total else None)
    return pa.table(cols, schema=pa.schema([("rank", pa.int32()), ("kernel_type", pa.string()),
                                            ("time_ns", pa.int64()), ("share", pa.float64())]))


def temporal_breakdown(trace, *, busy_kinds=("kernel", "memcpy", "memset")):
    """Per rank, HTA's temporal breakdown: over the device span (first device work to the last),
    ``idle_ns`` (no device work), ``compute_ns`` (a compute kernel runs), ``non_compute_ns`` (only
    communication / memory runs), with their percentages of the span. ``busy_kinds`` says which
    kinds are work: add ``'sync'`` to count stream waits (MTIA ``event_wait``) as busy, as HTA does.
    Returns a pyarrow Table."""
    import pyarrow as pa

    cols: dict[str, list] = {k: [] for k in ("rank", "span_ns", "idle_ns", "compute_ns", "non_compute_ns",
                                             "idle_pct", "compute_pct", "non_compute_pct")}
    for r, merged in sorted(_device_work(trace, busy_kinds).items()):
        s_all, e_all = merge_intervals(np.concatenate([m[0] for m in merged.values()]),
                                       np.concatenate([m[1] for m in merged.values()]))
        if not len(s_all):
            continue
        span = int(e_all[-1] - s_all[0])
        active = int((e_all - s_all).sum())
        cs, ce = merged.get("compute", (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        compute = int((ce - cs).sum())
        idle = span - active
        cols["rank"].append(r)
        cols["span_ns"].append(span)
        cols["idle_ns"].append(idle)
        cols["compute_ns"].append(compute)
        cols["non_compute_ns"].append(active - compute)
        for k, v in (("idle_pct", idle), ("compute_pct", compute), ("non_compute_pct", active - compute)):
            cols[k].append(100.0 * v / span if span else None)
    return pa.table(cols)


def comm_comp_overlap(trace):
    """Per rank: communication time (merged), the part of it during which a compute kernel
    runs, and their ratio (HTA's ``get_comm_comp_overlap``: higher is better, the collective is
    hidden under computation). Returns a pyarrow Table."""
    import pyarrow as pa

    cols: dict[str, list] = {"rank": [], "communication_ns": [], "overlapped_ns": [], "overlap_ratio": []}
    for r, merged in sorted(_device_work(trace, ("kernel",)).items()):
        if "communication" not in merged:
            continue
        sw = sweep({k: v for k, v in merged.items() if k in ("communication", "compute")})
        comm = sum(v for k, v in sw.items() if "communication" in k)
        both = sw.get("compute + communication", 0)
        cols["rank"].append(r)
        cols["communication_ns"].append(comm)
        cols["overlapped_ns"].append(both)
        cols["overlap_ratio"].append(both / comm if comm else None)
    return pa.table(cols, schema=pa.schema([("rank", pa.int32()), ("communication_ns", pa.int64()),
                                            ("overlapped_ns", pa.int64()), ("overlap_ratio", pa.float64())]))
