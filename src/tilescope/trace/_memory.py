"""Peak device memory per op, from Kineto's ``[memory]`` instant events (``profile_memory=True``)."""

from __future__ import annotations

__all__ = ["peak_memory"]


def peak_memory(trace, *, device_only: bool = True):
    """Per op name: calls and the peak ``Total Allocated`` bytes seen during any of its calls.

    Empty when the trace has no memory events (profile with ``profile_memory=True``)."""
    from ._trace import _arrow

    dev = "AND TRY_CAST(json_extract_string(args, '$.\"Device Type\"') AS INTEGER) <> 0" if device_only else ""
    q = f"""
      WITH m AS (SELECT rank, pid, tid, ts_ns, TRY_CAST(json_extract_string(args, '$."Total Allocated"') AS BIGINT) AS total
                 FROM events WHERE name = '[memory]' {dev}),
      o AS (SELECT eid, rank, pid, tid, name, ts_ns, end_ns FROM events WHERE kind = 'op' AND ph = 'X'
            AND EXISTS (SELECT 1 FROM m LIMIT 1))
      SELECT o.name, count(DISTINCT o.eid) AS calls, max(m.total) AS peak_allocated_bytes
      FROM o JOIN m ON m.rank = o.rank AND m.pid = o.pid AND m.tid = o.tid AND m.ts_ns BETWEEN o.ts_ns AND o.end_ns
      GROUP BY o.name ORDER BY peak_allocated_bytes DESC"""
    return _arrow(trace.sql(q))
