"""Nesting of slices per lane (parent, depth, self time) and device-time attribution.

Computed once per Trace on first use (one pass over the slices sorted by lane, start and
end descending) and kept as the temp tables ``_hier`` and ``_links``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["ensure_hierarchy", "nest", "nearest_op", "subtree_sums"]


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
    for ln in np.unique(lane[bad]).tolist():
        a, b = int(np.searchsorted(lane, ln, "left")), int(np.searchsorted(lane, ln, "right"))
        overlaps += _stack(ts, end, a, b, parent, depth)
    return parent, depth, overlaps


def _stack(ts, end, a: int, b: int, parent, depth) -> int:
    """The plain stack algorithm on rows a..b of one lane; returns the straddling slices."""
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


def ensure_hierarchy(trace) -> None:
    if trace._cache.get("hier"):
        return
    con = trace.con
    from ._trace import _arrow

    # the slices' few columns, materialized once: the three queries below would otherwise each
    # re-derive the events view (kinds, lanes) from the Parquet files
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _slices AS
        SELECT eid, rank, lane, kind, side, cat, ts_ns, end_ns, coalesce(dur_ns, 0) AS dur, correlation, flow_id
        FROM events WHERE ph = 'X'""")
    t = _arrow(con.sql("""SELECT eid, lane, ts_ns, end_ns, dur, kind = 'op' AS is_op
                   FROM _slices ORDER BY lane, ts_ns, end_ns DESC, eid"""))
    eid = t.column("eid").to_numpy()
    lane_a = t.column("lane").to_numpy().astype(np.int64)
    ts_a = t.column("ts_ns").to_numpy()
    end_a = t.column("end_ns").to_numpy()
    dur = t.column("dur").to_numpy()
    is_op = t.column("is_op").to_numpy(zero_copy_only=False).astype(bool)
    n = len(eid)
    par_idx, depth_a, overlaps = nest(lane_a, ts_a, end_a)
    par = par_idx
    child_sum = np.zeros(n, dtype=np.int64)
    has = par >= 0
    np.add.at(child_sum, par[has], dur[has])
    self_ns = np.maximum(dur - child_sum, 0)
    op_anc = nearest_op(par, is_op)  # the nearest op at or above each slice (-1: none)
    order = np.argsort(eid, kind="stable")
    sorted_eid = eid[order]

    def index_of(eids: np.ndarray) -> np.ndarray:
        """Row of each eid in the sorted slices (-1 if it is not a slice)."""
        j = np.searchsorted(sorted_eid, eids)
        j = np.minimum(j, max(n - 1, 0))
        ok = (n > 0) & (sorted_eid[j] == eids) if n else np.zeros(len(eids), bool)
        return np.where(ok, order[j], -1)

    # device events -> the host event that submitted them
    links = _arrow(con.sql(f"""
        SELECT d.eid AS dev_eid, l.eid AS launch_eid, d.dur, l.flow_id
        FROM _slices d JOIN _slices l ON d.rank = l.rank AND d.correlation = l.correlation
        WHERE d.kind IN {_DEVICE_KINDS} AND l.kind = 'launch' AND d.side = 'device' AND l.side = 'host'
        UNION ALL
        SELECT d.eid, l.eid, d.dur, l.flow_id
        FROM _slices d JOIN _slices l ON d.rank = l.rank AND d.flow_id = l.flow_id
        WHERE d.kind IN {_DEVICE_KINDS} AND l.kind = 'launch' AND d.cat = 'hardware' AND l.cat = 'runtime'"""))
    dev_eid = links.column("dev_eid").to_numpy().astype(np.int64)
    launch_eid = links.column("launch_eid").to_numpy().astype(np.int64)
    d_dur = links.column("dur").to_numpy().astype(np.int64)
    origin = index_of(launch_eid)
    # tilescope: the framework op is where the execution's flow starts ('s'): the innermost
    # slice around that point on the framework lane
    has_flows = trace.kind == "tilescope" and con.execute(
        "SELECT count(*) FROM flows WHERE ph = 's' AND cat = 'tilescope.flow'").fetchall()[0][0]
    starts = _arrow(con.sql("""
        SELECT TRY_CAST(f.id AS BIGINT) AS fid, arg_max(e.eid, e.ts_ns) AS eid
        FROM flows f JOIN lanes l ON l.rank = f.rank AND l.pid = f.pid AND l.tid = f.tid
        JOIN _slices e ON e.lane = l.lane AND e.ts_ns <= f.ts_ns AND f.ts_ns <= e.end_ns
        WHERE f.ph = 's' AND f.cat = 'tilescope.flow' GROUP BY f.rank, f.id""")) if has_flows else None
    if starts is not None and starts.num_rows:
        fids = starts.column("fid").to_pylist()
        flow_origin = dict(zip(fids, index_of(starts.column("eid").to_numpy().astype(np.int64)).tolist()))
        lf = links.column("flow_id").to_pylist()
        origin = np.array([flow_origin.get(f, o) if f is not None else o for f, o in zip(lf, origin.tolist())],
                          dtype=np.int64)
    op = np.where(origin >= 0, op_anc[np.maximum(origin, 0)], -1)
    op = np.where(op >= 0, op, origin)  # no op around it: the launch keeps its device time
    dev_self = np.zeros(n, dtype=np.int64)
    n_dev = np.zeros(n, dtype=np.int64)
    ok = op >= 0
    np.add.at(dev_self, op[ok], d_dur[ok])
    np.add.at(n_dev, op[ok], 1)
    rows_dev, rows_launch = dev_eid, launch_eid
    rows_op = pa.array(np.where(ok, eid[np.maximum(op, 0)], 0), pa.int64(), mask=~ok)
    dev_total = subtree_sums(dev_self, par_idx, depth_a)  # totals: its own and its descendants'
    hier = pa.table({
        "eid": eid, "parent_eid": np.where(has, eid[np.maximum(par, 0)], -1), "depth": depth_a.astype(np.int32),
        "self_ns": self_ns, "dev_self_ns": dev_self, "dev_total_ns": dev_total, "n_dev": n_dev,
    })
    con.register("_hier_arrow", hier)
    con.execute("CREATE OR REPLACE TEMP TABLE _hier AS SELECT * FROM _hier_arrow")
    con.unregister("_hier_arrow")
    lk = pa.table({"dev_eid": pa.array(rows_dev, pa.int64()), "launch_eid": pa.array(rows_launch, pa.int64()),
                   "op_eid": rows_op})
    con.register("_links_arrow", lk)
    con.execute("CREATE OR REPLACE TEMP TABLE _links AS SELECT * FROM _links_arrow")
    con.unregister("_links_arrow")
    con.execute("DROP TABLE IF EXISTS _slices")  # its memory back: the tables above hold what is needed
    trace._cache["hier"] = True
    trace._cache["overlaps"] = overlaps
    if overlaps:
        trace.notes.append(f"{overlaps:,} slices overlap a slice on the same lane without nesting in it "
                           f"(kept; self time counts only properly nested children)")
