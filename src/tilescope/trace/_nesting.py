"""Nesting of slices per lane (parent, depth, self time) and device-time attribution.

Computed once per Trace on first use, from the slices' columns read with pyarrow (no
database: the first op table needs none), one pass over them sorted by lane, start and end
descending; :func:`ensure_hierarchy` hands the result to DuckDB as the temp tables
``_hier`` and ``_links`` for the analyses written in SQL.
"""

from __future__ import annotations

import numpy as np

try:
    from . import _kscan  # the C stack walk for lanes that are not trees (optional, as for the ingest)
except ImportError:
    _kscan = None

__all__ = ["ensure_hierarchy", "hierarchy", "nest", "nearest_op", "subtree_sums"]


def nest(lane: np.ndarray, ts: np.ndarray, end: np.ndarray):
    """Parent index, depth and the number of straddling slices, vectorised.

    Input: slices sorted by (lane, ts, end descending). A slice is open at ``ts[i]`` if it
    started before ``i`` (in that order), has a positive duration and ends after ``ts[i]``;
    the depth of ``i`` is the number of open slices, and its parent the latest earlier
    positive slice one level up on the same lane. Zero-length slices contain nothing. Lanes
    where slices straddle one another (no tree) are redone with the plain stack algorithm,
    whose answer this one equals on every lane (tested against it).

    >>> import numpy as np
    >>> p, d, o = nest(np.zeros(4, int), np.array([0, 1, 2, 5]), np.array([10, 4, 3, 6]))
    >>> p.tolist(), d.tolist(), o
    ([-1, 0, 1, 0], [0, 1, 2, 1], 0)
    """
    n = len(ts)
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    if n == 0:
        return parent, depth, 0
    pos = np.arange(n, dtype=np.int64)
    positive = end > ts
    starts = np.flatnonzero(np.r_[True, lane[1:] != lane[:-1]])
    stops = np.r_[starts[1:], n]
    for a, b in zip(starts.tolist(), stops.tolist()):
        pv = positive[a:b]
        before = np.cumsum(pv) - pv  # positive slices before each one, in this lane
        closed = np.searchsorted(np.sort(end[a:b][pv]), ts[a:b], side="right")
        depth[a:b] = before - closed
    depth = np.maximum(depth, 0)
    # parent: latest earlier positive slice of the same lane at depth - 1
    big = int(depth.max()) + 2
    cand = np.flatnonzero(positive)
    ckey = (lane[cand] * big + depth[cand]) * n + pos[cand]  # sorted: cand is in (lane, pos) order per depth
    order = np.argsort(ckey, kind="stable")
    ckey, cand = ckey[order], cand[order]
    need = np.flatnonzero(depth > 0)
    qkey = (lane[need] * big + depth[need] - 1) * n + pos[need]
    j = np.searchsorted(ckey, qkey, side="left") - 1
    ok = j >= 0
    ok[ok] = (ckey[j[ok]] // n) == (qkey[ok] // n)
    parent[need[ok]] = cand[j[ok]]
    # a lane whose slices straddle one another is not a tree: redo it with the stack
    has = parent >= 0
    bad = np.zeros(n, dtype=bool)
    bad[has] = (end[has] > end[parent[has]]) | (end[parent[has]] <= ts[has])
    overlaps = 0
    for ln in _distinct(lane[bad]):
        a, b = int(np.searchsorted(lane, ln, "left")), int(np.searchsorted(lane, ln, "right"))
        overlaps += _stack(ts, end, a, b, parent, depth)
    return parent, depth, overlaps


def _distinct(a: np.ndarray) -> list:
    """The sorted distinct values of ``a`` as a list (``np.unique(a)`` without an optional
    output imports ``numpy.ma`` on its first call: ~25 ms of the first op table).

    >>> _distinct(np.array([3, 1, 3]))
    [1, 3]
    """
    v = np.sort(a)
    return v[np.r_[True, v[1:] != v[:-1]]].tolist() if len(v) else []


def _stack(ts, end, a: int, b: int, parent, depth) -> int:
    """The plain stack algorithm on rows a..b of one lane; returns the straddling slices (in C
    when the trace extension is built: a lane of 100,000 straddling slices costs ~0.3 s here)."""
    if _kscan is not None and hasattr(_kscan, "nest_stack"):
        arrays = [np.ascontiguousarray(x, dtype=np.int64) for x in (ts, end)]
        if parent.dtype == np.int64 and depth.dtype == np.int64 and parent.flags.c_contiguous and depth.flags.c_contiguous:
            return _kscan.nest_stack(arrays[0], arrays[1], parent, depth, a, b)
    return _stack_py(ts, end, a, b, parent, depth)


def _stack_py(ts, end, a: int, b: int, parent, depth) -> int:
    T, E = ts[a:b].tolist(), end[a:b].tolist()
    stack: list[int] = []
    straddles = 0
    for k in range(b - a):
        while stack and E[stack[-1]] <= T[k]:
            stack.pop()
        parent[a + k] = a + stack[-1] if stack else -1
        depth[a + k] = len(stack)
        if stack and E[k] > E[stack[-1]]:
            straddles += 1
        if E[k] > T[k]:
            stack.append(k)
    return straddles

_DEVICE_KINDS = ("kernel", "memcpy", "memset")


def nearest_op(parent: np.ndarray, is_op: np.ndarray) -> np.ndarray:
    """Each slice's nearest op at or above it (itself if an op; -1: none), by pointer
    jumping: O(n log depth), so slices nested a million deep (identical timestamps) cost no
    more than a few passes.

    >>> nearest_op(np.array([-1, 0, 1, 2, -1]), np.array([True, False, True, False, False])).tolist()
    [0, 0, 2, 2, -1]
    """
    anc = parent.copy()
    done = (anc < 0) | is_op[np.maximum(anc, 0)]
    while not done.all():
        j = np.flatnonzero(~done)
        anc[j] = anc[anc[j]]  # (every read sees the previous round: a synchronous jump)
        done[j] = (anc[j] < 0) | is_op[np.maximum(anc[j], 0)]
    return np.where(is_op, np.arange(len(parent)), anc)


def subtree_sums(values: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Each slice's value plus its descendants'. A parent precedes its children (``nest``
    takes the latest earlier slice), so one pass from the last slice back adds each to its
    parent; shallow trees (the usual) do it a level at a time instead, vectorised.

    >>> subtree_sums(np.array([1, 2, 4, 8]), np.array([-1, 0, 1, 0]), np.array([0, 1, 2, 1])).tolist()
    [15, 6, 4, 8]
    """
    total = values.copy()
    deepest = int(depth.max()) if len(depth) else 0
    if deepest <= 64:
        has = np.flatnonzero(parent >= 0)
        by_depth = has[np.argsort(depth[has], kind="stable")]
        bounds = np.searchsorted(depth[by_depth], np.arange(deepest + 2))
        for d in range(deepest, 0, -1):  # children before parents, deepest level first
            sel = by_depth[bounds[d]:bounds[d + 1]]
            np.add.at(total, parent[sel], total[sel])
        return total
    t, p = total.tolist(), parent.tolist()
    for i in range(len(t) - 1, -1, -1):
        if p[i] >= 0:
            t[p[i]] += t[i]
    return np.asarray(t, dtype=total.dtype)


def _pairs(d_rows: np.ndarray, l_rows: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (d, l) of ``d_rows`` x ``l_rows`` with equal ``key`` (an inner join, duplicates
    included).

    >>> [x.tolist() for x in _pairs(np.array([0, 1]), np.array([2, 3, 4]), np.array([7, 8, 7, 7, 8]))]
    [[0, 0, 1], [2, 3, 4]]
    """
    o = l_rows[np.argsort(key[l_rows], kind="stable")]
    lk = key[o]
    lo = np.searchsorted(lk, key[d_rows], "left")
    cnt = np.searchsorted(lk, key[d_rows], "right") - lo
    total = int(cnt.sum())
    first = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt)
    return np.repeat(d_rows, cnt), o[first + np.arange(total)]


def _entry_slices(rank: int, cols, device_lane: np.ndarray, lane_base: int, names: dict) -> dict:
    """One entry's slices (its 'X' records with a time on a lane with a pid: the rows the
    events view keeps) as arrays; names mapped to ``names`` (shared by the entries)."""
    has_pid = np.array([pid is not None for pid, _tid in cols.lane_keys] + [False], dtype=bool)
    rows = np.flatnonzero(cols.ph_is("X") & cols.has_ts & has_pid[cols.lane])
    dur_ok = cols.has_dur[rows] & (cols.dur[rows] >= 0)  # the view's dur_ns (NULL when missing or negative)
    dur = np.where(dur_ok, cols.dur[rows], 0)
    name_ids = np.array([names.setdefault(n, len(names)) for n in cols.names] + [-1], dtype=np.int64)
    cat_is = {c: np.array([x == c for x in cols.cats] + [False], dtype=bool)[cols.cat[rows]] for c in ("hardware", "runtime")}
    return {
        "eid": cols.eid[rows], "rank": np.full(len(rows), rank, dtype=np.int64), "lane": cols.lane[rows] + lane_base,
        "ts": cols.ts[rows], "end": cols.ts[rows] + dur, "dur": dur, "dur_ok": dur_ok,
        "kind": cols.kind[rows].astype(np.int64), "device": device_lane[cols.lane[rows]],
        "hardware": cat_is["hardware"], "runtime": cat_is["runtime"], "name": name_ids[cols.name[rows]],
        "corr": np.where(cols.has_corr[rows], cols.correlation[rows], np.iinfo(np.int64).min),
        "has_corr": cols.has_corr[rows], "flow": cols.flow_id[rows], "has_flow": cols.has_flow[rows],
    }


def _slices(trace) -> dict:
    """Every entry's slices, sorted by (lane, start, end descending, eid): the nesting's order."""
    names: dict = {}
    parts, base = [], 0
    entries = trace._entry_columns()
    while entries:  # each entry's columns are let go of once its slices are taken
        rank, cols, device_lane = entries.pop(0)
        parts.append(_entry_slices(rank, cols, device_lane, base, names))
        base += len(cols.lane_keys)
        del cols
    if not parts or not sum(len(p["eid"]) for p in parts):
        return {}
    s = {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in parts[0]}
    del parts
    order = np.lexsort((s["eid"], -s["end"], s["ts"], s["lane"]))
    for k in list(s):
        s[k] = s[k][order]
    out: dict = s
    out["names"] = list(names)
    return out


def _links(s: dict) -> tuple[np.ndarray, np.ndarray]:
    """(device row, launch row) pairs: device work and the host launch that submitted it,
    by correlation id across the device and host lanes of a rank, or, for tilescope
    profiles, by flow id from a runtime launch to a hardware execution."""
    from ._columns import KINDS

    dev_kind = np.isin(s["kind"], [KINDS.index(k) for k in _DEVICE_KINDS])
    launch = s["kind"] == KINDS.index("launch")
    out_d, out_l = [], []
    for rank in _distinct(s["rank"]):
        r = s["rank"] == rank
        d_rows = np.flatnonzero(r & dev_kind & s["device"] & s["has_corr"])
        l_rows = np.flatnonzero(r & launch & ~s["device"] & s["has_corr"])
        d, lr = _pairs(d_rows, l_rows, s["corr"])
        out_d.append(d)
        out_l.append(lr)
        d_rows = np.flatnonzero(r & dev_kind & s["hardware"] & s["has_flow"])
        l_rows = np.flatnonzero(r & launch & s["runtime"] & s["has_flow"])
        d, lr = _pairs(d_rows, l_rows, s["flow"])
        out_d.append(d)
        out_l.append(lr)
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64)  # noqa: E731
    return cat(out_d), cat(out_l)


def _flow_origins(trace, s: dict, launch_rows: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """tilescope: the framework op is where the execution's flow starts ('s'): the innermost
    slice around that point on the framework lane (by SQL over the flows: profiles only)."""
    from ._trace import _arrow

    con = trace.con
    has_flows = con.execute("SELECT count(*) FROM flows WHERE ph = 's' AND cat = 'tilescope.flow'").fetchall()[0][0]
    if not has_flows:
        return origin
    starts = _arrow(con.sql("""
        SELECT TRY_CAST(f.id AS BIGINT) AS fid, arg_max(e.eid, e.ts_ns) AS eid
        FROM flows f JOIN lanes l ON l.rank = f.rank AND l.pid = f.pid AND l.tid = f.tid
        JOIN events e ON e.lane = l.lane AND e.ph = 'X' AND e.ts_ns <= f.ts_ns AND f.ts_ns <= e.end_ns
        WHERE f.ph = 's' AND f.cat = 'tilescope.flow' GROUP BY f.rank, f.id"""))
    if not starts.num_rows:
        return origin
    row_of = {e: i for i, e in enumerate(s["eid"].tolist())}
    flow_origin = {f: row_of.get(e, -1) for f, e in zip(starts.column("fid").to_pylist(), starts.column("eid").to_pylist())}
    lf = np.where(s["has_flow"][launch_rows], s["flow"][launch_rows], -1).tolist()
    return np.array([flow_origin.get(f, o) if f != -1 else o for f, o in zip(lf, origin.tolist())], dtype=np.int64)


def hierarchy(trace) -> dict:
    """The nesting and device-time attribution of every slice, as arrays in the nesting's
    order (computed once per Trace, without a database): ``eid``, ``parent`` (row, -1),
    ``depth``, ``self_ns``, ``dev_self_ns``, ``dev_total_ns``, ``n_dev``, the slice's ``name``
    (code into ``names``), ``kind``, ``dur`` and ``dur_ok``; ``links``: (device row, launch
    row, op row or -1)."""
    if "hier_arrays" in trace._cache:
        return trace._cache["hier_arrays"]
    h = _hierarchy(trace)
    trace._cache["hier_arrays"] = h
    _give_back_freed_heap()  # (the slices' arrays and the temporaries are gone by now)
    if h["overlaps"]:
        trace.notes.append(f"{h['overlaps']:,} slices overlap a slice on the same lane without nesting in it "
                           f"(kept; self time counts only properly nested children)")
    return h


def _hierarchy(trace) -> dict:
    from ._columns import KINDS

    s = _slices(trace)
    if not s:
        h: dict = {"eid": np.zeros(0, np.int64), "names": [], "links": (np.zeros(0, np.int64),) * 3, "overlaps": 0}
        for k in ("parent", "depth", "self_ns", "dev_self_ns", "dev_total_ns", "n_dev", "name", "kind", "dur"):
            h[k] = np.zeros(0, np.int64)
        h["dur_ok"] = np.zeros(0, bool)
        return h
    n = len(s["eid"])
    par, depth, overlaps = nest(s["lane"], s["ts"], s["end"])
    dur = s["dur"]
    child_sum = np.zeros(n, dtype=np.int64)
    has = par >= 0
    np.add.at(child_sum, par[has], dur[has])
    self_ns = np.maximum(dur - child_sum, 0)
    op_anc = nearest_op(par, s["kind"] == KINDS.index("op"))  # the nearest op at or above each slice (-1: none)
    dev_rows, launch_rows = _links(s)
    origin = launch_rows.copy()
    if trace.kind == "tilescope":
        origin = _flow_origins(trace, s, launch_rows, origin)
    op = np.where(origin >= 0, op_anc[np.maximum(origin, 0)], -1)
    op = np.where(op >= 0, op, origin)  # no op around it: the launch keeps its device time
    dev_self = np.zeros(n, dtype=np.int64)
    n_dev = np.zeros(n, dtype=np.int64)
    ok = op >= 0
    np.add.at(dev_self, op[ok], dur[dev_rows[ok]])
    np.add.at(n_dev, op[ok], 1)
    return {"eid": s["eid"], "parent": par, "depth": depth, "self_ns": self_ns, "dev_self_ns": dev_self,
            "dev_total_ns": subtree_sums(dev_self, par, depth), "n_dev": n_dev, "name": s["name"], "names": s["names"],
            "kind": s["kind"], "dur": dur, "dur_ok": s["dur_ok"], "links": (dev_rows, launch_rows, op),
            "overlaps": overlaps}


def _give_back_freed_heap() -> None:
    """Return the C heap's free pages to the OS (glibc's ``malloc_trim``). The nesting's numpy
    temporaries come from the heap once glibc's adaptive mmap threshold has risen, and what
    they freed stays in the process's RSS (~8 MB on a 35 MB trace), adding to the peak when
    pyarrow loads for the op table's result. Elsewhere than glibc: nothing to do."""
    import ctypes  # (numpy has imported it already)

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def ensure_hierarchy(trace) -> None:
    """The temp tables ``_hier`` (eid, parent_eid, depth, self_ns, dev_self_ns, dev_total_ns,
    n_dev) and ``_links`` (dev_eid, launch_eid, op_eid) in the trace's DuckDB connection,
    from :func:`hierarchy`."""
    if trace._cache.get("hier"):
        return
    import pyarrow as pa

    h = hierarchy(trace)
    con = trace.con
    eid, par = h["eid"], h["parent"]
    dev_rows, launch_rows, op = h["links"]
    ok = op >= 0
    hier = pa.table({
        "eid": eid, "parent_eid": np.where(par >= 0, eid[np.maximum(par, 0)], -1), "depth": h["depth"].astype(np.int32),
        "self_ns": h["self_ns"], "dev_self_ns": h["dev_self_ns"], "dev_total_ns": h["dev_total_ns"], "n_dev": h["n_dev"],
    })
    con.register("_hier_arrow", hier)
    con.execute("CREATE OR REPLACE TEMP TABLE _hier AS SELECT * FROM _hier_arrow")
    con.unregister("_hier_arrow")
    lk = pa.table({"dev_eid": pa.array(eid[dev_rows], pa.int64()), "launch_eid": pa.array(eid[launch_rows], pa.int64()),
                   "op_eid": pa.array(np.where(ok, eid[np.maximum(op, 0)], 0), pa.int64(), mask=~ok)})
    con.register("_links_arrow", lk)
    con.execute("CREATE OR REPLACE TEMP TABLE _links AS SELECT * FROM _links_arrow")
    con.unregister("_links_arrow")
    trace._cache["hier"] = True
    trace._cache["overlaps"] = h["overlaps"]
