"""Frequent kernel sequences: the device work an op launches, as a sequence of kernel names,
counted over the op's calls (HTA's ``get_frequent_cuda_kernel_sequences``).

A candidate is an op whose name contains ``op_name``; only the outermost candidates count
(the least nesting depth among them), and only those that launched at least ``min_length``
device events (their own and their descendants' launches). The pattern is the op's name and
its device work's names in start order, joined by ``|``.
"""

from __future__ import annotations

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
    return _arrow(trace.sql(f"""
      WITH c AS (SELECT e.eid, e.rank, e.name, e.lane, e.ts_ns, e.end_ns, e.dur_ns, h.depth
                 FROM events e JOIN _hier h USING (eid)
                 WHERE e.ph = 'X' AND e.kind = 'op' AND contains(e.name, $op) {rank_sql}),
      r AS (SELECT * FROM c WHERE depth = (SELECT min(depth) FROM c)),
      k AS (SELECT r.eid AS root, d.name, d.ts_ns, d.eid, d.dur_ns
            FROM r JOIN events l ON l.lane = r.lane AND l.ts_ns >= r.ts_ns AND l.end_ns <= r.end_ns AND l.kind = 'launch'
            JOIN _links x ON x.launch_eid = l.eid JOIN events d ON d.eid = x.dev_eid),
      p AS (SELECT root, count(*) AS n, string_agg(name, '|' ORDER BY ts_ns, eid) AS seq, sum(dur_ns) AS dev
            FROM k GROUP BY root)
      SELECT r.name || '|' || p.seq AS pattern, count(*) AS count, any_value(p.n) AS kernels,
             sum(p.dev)::BIGINT AS device_ns, sum(r.dur_ns)::BIGINT AS op_ns, min(r.eid) AS first_eid
      FROM r JOIN p ON p.root = r.eid WHERE p.n >= {int(min_length)}
      GROUP BY 1 ORDER BY count DESC, pattern LIMIT {int(top)}""", params={"op": op_name}))
