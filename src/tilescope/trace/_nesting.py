"""Nesting of slices per lane (parent, depth, self time) and device-time attribution.

Computed once per Trace on first use (one pass over the slices sorted by lane, start and
end descending) and kept as the temp tables ``_hier`` and ``_links``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["ensure_hierarchy"]

_DEVICE_KINDS = ("kernel", "memcpy", "memset")


def ensure_hierarchy(trace) -> None:
    if trace._cache.get("hier"):
        return
    con = trace.con
    from ._trace import _arrow

    t = _arrow(con.sql("""SELECT eid, lane, ts_ns, end_ns, coalesce(dur_ns, 0) AS dur, kind FROM events
                   WHERE ph = 'X' ORDER BY lane, ts_ns, end_ns DESC, eid"""))
    eid = t.column("eid").to_numpy()
    lane = t.column("lane").to_numpy().tolist()
    ts = t.column("ts_ns").to_numpy().tolist()
    end = t.column("end_ns").to_numpy().tolist()
    dur = t.column("dur").to_numpy()
    kinds = t.column("kind").to_pylist()
    n = len(eid)
    parent = [-1] * n
    depth = [0] * n
    stack: list[int] = []
    prev = None
    overlaps = 0
    for i in range(n):
        if lane[i] != prev:
            stack.clear()
            prev = lane[i]
        s = ts[i]
        while stack and end[stack[-1]] <= s and not (end[stack[-1]] == s and ts[stack[-1]] == s):
            stack.pop()
        if stack:
            top = stack[-1]
            if end[i] > end[top]:
                overlaps += 1
            parent[i] = top
            depth[i] = len(stack)
        stack.append(i)
    par = np.array(parent, dtype=np.int64)
    child_sum = np.zeros(n, dtype=np.int64)
    has = par >= 0
    np.add.at(child_sum, par[has], dur[has])
    self_ns = np.maximum(dur - child_sum, 0)
    index = {int(e): i for i, e in enumerate(eid.tolist())}
    # device events -> the host event that submitted them
    links = _arrow(con.sql(f"""
        SELECT d.eid AS dev_eid, l.eid AS launch_eid, coalesce(d.dur_ns, 0) AS dur
        FROM events d JOIN events l ON d.rank = l.rank AND d.correlation = l.correlation
        WHERE d.kind IN {_DEVICE_KINDS} AND l.kind = 'launch' AND d.side = 'device' AND l.side = 'host'
        UNION ALL
        SELECT d.eid, l.eid, coalesce(d.dur_ns, 0)
        FROM events d JOIN events l ON d.rank = l.rank AND d.flow_id = l.flow_id
        WHERE d.kind IN {_DEVICE_KINDS} AND l.kind = 'launch' AND d.cat = 'hardware' AND l.cat = 'runtime'"""))
    # tilescope: the framework op is where the execution's flow starts ('s')
    starts = _arrow(con.sql("""
        SELECT f.id, e.eid, e.ts_ns FROM flows f JOIN lanes l ON l.rank = f.rank AND l.pid = f.pid AND l.tid = f.tid
        JOIN events e ON e.lane = l.lane AND e.ph = 'X' AND e.ts_ns <= f.ts_ns AND f.ts_ns <= e.end_ns
        WHERE f.ph = 's' AND f.cat = 'tilescope.flow'"""))
    flow_origin: dict[str, int] = {}
    best_depth: dict[str, int] = {}
    for fid, e, _ in zip(*(starts.column(c).to_pylist() for c in ("id", "eid", "ts_ns"))):
        i = index.get(e)
        if i is not None and depth[i] >= best_depth.get(fid, -1):
            best_depth[fid] = depth[i]
            flow_origin[fid] = i
    launch_flow = {}
    if flow_origin:
        lf = _arrow(con.sql("SELECT eid, flow_id FROM events WHERE cat = 'runtime' AND flow_id IS NOT NULL"))
        launch_flow = dict(zip(lf.column("eid").to_pylist(), lf.column("flow_id").to_pylist()))
    dev_self = np.zeros(n, dtype=np.int64)
    n_dev = np.zeros(n, dtype=np.int64)
    rows_dev, rows_launch, rows_op = [], [], []
    for d_eid, l_eid, d_dur in zip(*(links.column(c).to_pylist() for c in ("dev_eid", "launch_eid", "dur"))):
        i = index.get(l_eid)
        origin = None
        fid = launch_flow.get(l_eid)
        if fid is not None and str(fid) in flow_origin:
            origin = flow_origin[str(fid)]
        elif i is not None:
            origin = i
        op = origin
        j = origin
        while j is not None and j >= 0:
            if kinds[j] == "op":
                op = j
                break
            j = parent[j]
        if op is not None:
            dev_self[op] += d_dur
            n_dev[op] += 1
        rows_dev.append(d_eid)
        rows_launch.append(l_eid)
        rows_op.append(int(eid[op]) if op is not None else None)
    dev_total = dev_self.copy()
    for i in range(n - 1, -1, -1):
        p = parent[i]
        if p >= 0:
            dev_total[p] += dev_total[i]
    hier = pa.table({
        "eid": eid, "parent_eid": np.where(has, eid[np.maximum(par, 0)], -1), "depth": np.array(depth, dtype=np.int32),
        "self_ns": self_ns, "dev_self_ns": dev_self, "dev_total_ns": dev_total, "n_dev": n_dev,
    })
    con.register("_hier_arrow", hier)
    con.execute("CREATE OR REPLACE TEMP TABLE _hier AS SELECT * FROM _hier_arrow")
    con.unregister("_hier_arrow")
    lk = pa.table({"dev_eid": pa.array(rows_dev, pa.int64()), "launch_eid": pa.array(rows_launch, pa.int64()),
                   "op_eid": pa.array(rows_op, pa.int64())})
    con.register("_links_arrow", lk)
    con.execute("CREATE OR REPLACE TEMP TABLE _links AS SELECT * FROM _links_arrow")
    con.unregister("_links_arrow")
    trace._cache["hier"] = True
    trace._cache["overlaps"] = overlaps
    if overlaps:
        trace.notes.append(f"{overlaps:,} slices overlap a slice on the same lane without nesting in it "
                           f"(kept; self time counts only properly nested children)")
