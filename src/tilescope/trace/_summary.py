"""Whole-trace and per-rank summaries."""

from __future__ import annotations

from ._breakdown import busy_sql

__all__ = ["summary", "ranks_summary"]


def summary(trace) -> dict:
    """Counts by kind, span, device busy time and utilisation, devices, warnings (plain dict)."""
    con = trace.con
    kinds = dict(con.execute("SELECT kind, count(*) FROM events GROUP BY kind ORDER BY kind").fetchall())
    cats = dict(con.execute("SELECT cat, count(*) FROM events WHERE ph = 'X' GROUP BY cat ORDER BY cat").fetchall())
    span = con.execute("SELECT coalesce(max(last_ns) - min(first_ns), 0) FROM lanes").fetchall()[0][0]
    dev = "ph = 'X' AND side = 'device' AND kind IN ('kernel', 'memcpy', 'memset')"
    busy = con.execute(f"SELECT coalesce(sum(busy_ns), 0)::BIGINT FROM ({busy_sql(dev)})").fetchall()[0][0]
    dev_lanes = con.execute("SELECT count(*) FROM lanes WHERE side = 'device'").fetchall()[0][0]
    steps = con.execute("SELECT count(*) FROM events WHERE kind = 'step' AND ph = 'X'").fetchall()[0][0]
    return {
        "sources": trace.sources, "kind": trace.kind, "ranks": trace.ranks, "devices": trace.device_names(),
        "modeled": trace.modeled, "events": sum(kinds.values()), "by_kind": kinds, "by_category": cats,
        "flows": con.execute("SELECT count(*) FROM flows").fetchall()[0][0],
        "lanes": con.execute("SELECT count(*) FROM lanes").fetchall()[0][0], "device_lanes": dev_lanes,
        "span_ns": span, "device_busy_ns": busy, "steps": steps,
        "executables": con.execute("SELECT count(*) FROM executables").fetchall()[0][0],
        "instructions": con.execute("SELECT count(*) FROM instructions").fetchall()[0][0],
        "warnings": list(trace.warnings), "notes": list(trace.notes),
    }


def ranks_summary(trace):
    """Per rank: events, ops, kernels, span; device time as in HTA's temporal breakdown:
    ``device_span_ns`` (first to last device event), ``device_active_ns`` (union over all the
    rank's device lanes), ``device_idle_ns`` (span minus active); ``device_busy_ns`` sums the
    per-lane unions (streams overlapping each other count twice)."""
    from ._trace import _arrow

    dev = "ph = 'X' AND side = 'device' AND kind IN ('kernel', 'memcpy', 'memset')"
    q = f"""
      WITH b AS ({busy_sql(dev)}),
      bl AS (SELECT l.rank, sum(b.busy_ns)::BIGINT AS device_busy_ns FROM b JOIN lanes l USING (lane) GROUP BY l.rank),
      ev AS (SELECT rank, count(*) AS events, count(*) FILTER (WHERE kind = 'op') AS ops,
                    count(*) FILTER (WHERE kind = 'kernel') AS kernels FROM events GROUP BY rank),
      sp AS (SELECT rank, min(first_ns) AS first_ns, max(last_ns) AS last_ns FROM lanes GROUP BY rank),
      act AS (SELECT lane AS rank, busy_ns AS device_active_ns FROM ({busy_sql(dev, key="rank")})),
      dsp AS (SELECT rank, max(end_ns) - min(ts_ns) AS device_span_ns FROM events WHERE {dev} GROUP BY rank)
      SELECT rank, events, ops, kernels, first_ns, last_ns - first_ns AS span_ns,
             coalesce(device_busy_ns, 0)::BIGINT AS device_busy_ns, coalesce(device_span_ns, 0)::BIGINT AS device_span_ns,
             coalesce(device_active_ns, 0)::BIGINT AS device_active_ns,
             coalesce(device_span_ns - device_active_ns, 0)::BIGINT AS device_idle_ns
      FROM ev JOIN sp USING (rank) LEFT JOIN bl USING (rank) LEFT JOIN act USING (rank) LEFT JOIN dsp USING (rank)
      ORDER BY rank"""
    return _arrow(trace.sql(q))
