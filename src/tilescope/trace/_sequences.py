"""Frequent kernel sequences: the device work an op launches, as a sequence of kernel names,
counted over the op's calls (HTA's ``get_frequent_cuda_kernel_sequences``).

A candidate is an op whose name contains ``op_name``; only the outermost candidates count
(the least nesting depth among them), and only those that launched at least ``min_length``
device events (their own and their descendants' launches). The pattern is the op's name and
its device work's names in start order, joined by ``|``.

An op's launches are the launch slices on its lane that start and end within it (by time, so
a launch straddling the op's end is not its own). That range join runs here with numpy, by
binary search in each lane's launches sorted by start: the database's join on the lane with
the two time conditions as a filter compared every op with every launch of its lane (49.6 s
of a 5-million-event trace's summary).
"""

from __future__ import annotations

import numpy as np

from ._nesting import ensure_hierarchy

__all__ = ["kernel_sequences"]


def kernel_sequences(trace, op_name: str, *, min_length: int = 3, rank: int | None = None, top: int = 10):
    """Rows: pattern, count, kernels (in the pattern), device_ns (summed over the occurrences),
    op_ns (the ops' summed duration), first_eid (the earliest occurrence's op). ``rank``: one
    rank (None: every rank). Returns a pyarrow Table, most frequent first."""
    from ._trace import _arrow

    if not op_name:
        raise ValueError("op_name is empty: give (part of) an op's name, e.g. 'aten::linear'")
    if min_length < 1:
        raise ValueError(f"min_length={min_length}: a sequence has at least 1 kernel")
    ensure_hierarchy(trace)
    rank_sql = f"AND e.rank = {int(rank)}" if rank is not None else ""
    roots = _arrow(trace.sql(f"""
      WITH c AS (SELECT e.eid, e.name, e.lane, e.ts_ns, e.end_ns, e.dur_ns, h.depth
                 FROM events e JOIN _hier h USING (eid)
                 WHERE e.ph = 'X' AND e.kind = 'op' AND contains(e.name, $op) {rank_sql})
      SELECT eid, name, lane, ts_ns, end_ns, dur_ns FROM c
      WHERE depth = (SELECT min(depth) FROM c) AND end_ns IS NOT NULL""",
                             params={"op": op_name}))
    pairs = _root_launches(trace, roots)
    con = trace.con
    con.register("_seq_roots", roots)
    con.register("_seq_pairs", pairs)
    try:
        return _arrow(con.sql(f"""
          WITH k AS (SELECT q.root, d.name, d.ts_ns, d.eid, d.dur_ns
                     FROM _seq_pairs q JOIN _links x ON x.launch_eid = q.launch JOIN events d ON d.eid = x.dev_eid),
          p AS (SELECT root, count(*) AS n, string_agg(name, '|' ORDER BY ts_ns, eid) AS seq, sum(dur_ns) AS dev
                FROM k GROUP BY root)
          SELECT r.name || '|' || p.seq AS pattern, count(*) AS count, any_value(p.n) AS kernels,
                 sum(p.dev)::BIGINT AS device_ns, sum(r.dur_ns)::BIGINT AS op_ns, min(r.eid) AS first_eid
          FROM _seq_roots r JOIN p ON p.root = r.eid WHERE p.n >= {int(min_length)}
          GROUP BY 1 ORDER BY count DESC, pattern LIMIT {int(top)}"""))
    finally:
        con.unregister("_seq_pairs")
        con.unregister("_seq_roots")


def _root_launches(trace, roots):
    """(root, launch) eids: every launch slice on a root's lane with ``root.ts <= ts`` and
    ``end <= root.end``. Per lane, the launches sorted by start; a root's candidates are those
    starting in [root.ts, root.end] (binary search), kept when they also end by root.end."""
    import pyarrow as pa

    from ._trace import _arrow

    empty = pa.table({"root": pa.array([], pa.int64()), "launch": pa.array([], pa.int64())})
    if not roots.num_rows:
        return empty
    r_lane = roots.column("lane").to_numpy(zero_copy_only=False)
    lanes = np.unique(r_lane)
    launches = _arrow(trace.con.sql(f"""
      SELECT eid, lane, ts_ns, end_ns FROM events
      WHERE kind = 'launch' AND ts_ns IS NOT NULL AND end_ns IS NOT NULL AND lane IN ({', '.join(map(str, lanes.tolist()))})
      ORDER BY lane, ts_ns"""))
    if not launches.num_rows:
        return empty
    l_eid, l_lane, l_ts, l_end = (launches.column(c).to_numpy(zero_copy_only=False) for c in ("eid", "lane", "ts_ns", "end_ns"))
    r_eid, r_ts, r_end = (roots.column(c).to_numpy(zero_copy_only=False) for c in ("eid", "ts_ns", "end_ns"))
    out_r, out_l = [], []
    for ln in lanes.tolist():
        a, b = np.searchsorted(l_lane, ln, "left"), np.searchsorted(l_lane, ln, "right")
        rs = np.flatnonzero(r_lane == ln)
        lo = a + np.searchsorted(l_ts[a:b], r_ts[rs], "left")
        hi = a + np.searchsorted(l_ts[a:b], r_end[rs], "right")
        cnt = np.maximum(hi - lo, 0)
        ri = np.repeat(rs, cnt)
        li = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
        keep = l_end[li] <= r_end[ri]
        out_r.append(r_eid[ri[keep]])
        out_l.append(l_eid[li[keep]])
    return pa.table({"root": pa.array(np.concatenate(out_r), pa.int64()), "launch": pa.array(np.concatenate(out_l), pa.int64())})
