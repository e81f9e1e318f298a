"""Per-lane (CUDA stream, tilescope core) busy time and per-engine breakdown of instructions."""

from __future__ import annotations

__all__ = ["breakdown", "engine_breakdown", "busy_sql"]


def busy_sql(where: str, key: str = "lane") -> str:
    """SQL: per ``key`` (a lane, or ``rank`` for all lanes of a rank), the union of [ts, end)
    of the selected slices (overlaps counted once). Output columns: lane (the key), busy_ns, islands."""
    return f"""
      WITH d0 AS (SELECT {key} AS k, ts_ns, end_ns FROM events WHERE {where}),
      d AS (SELECT k, ts_ns, end_ns,
                   max(end_ns) OVER (PARTITION BY k ORDER BY ts_ns, end_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS pe
            FROM d0),
      g AS (SELECT k, ts_ns, end_ns,
                   sum(CASE WHEN pe IS NULL OR ts_ns > pe THEN 1 ELSE 0 END)
                     OVER (PARTITION BY k ORDER BY ts_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island FROM d),
      isl AS (SELECT k, island, min(ts_ns) AS s, max(end_ns) AS e FROM g GROUP BY ALL)
      SELECT k AS lane, sum(e - s)::BIGINT AS busy_ns, count(*) AS islands FROM isl GROUP BY k"""


def breakdown(trace, *, side: str = "device"):
    """Per lane of ``side`` ('device' or 'host'): events, busy (union) ns, summed ns, share of the
    rank's span, and the device-work split into kernel / memcpy / memset / other.

    On CUDA traces a device lane is one stream (``tid``); on tilescope profiles one core's
    hardware lane (times *modeled*)."""
    from ._trace import _arrow

    kinds = "('kernel', 'memcpy', 'memset')" if side == "device" else "('op', 'annotation', 'launch', 'python')"
    where = f"ph = 'X' AND side = '{side}' AND kind IN {kinds} AND dur_ns IS NOT NULL"
    q = f"""
      WITH b AS ({busy_sql(where)}),
      s AS (SELECT lane, count(*) AS events, sum(dur_ns)::BIGINT AS sum_ns,
                   sum(dur_ns) FILTER (WHERE kind = 'kernel')::BIGINT AS kernel_ns,
                   sum(dur_ns) FILTER (WHERE kind = 'memcpy')::BIGINT AS memcpy_ns,
                   sum(dur_ns) FILTER (WHERE kind = 'memset')::BIGINT AS memset_ns
            FROM events WHERE {where} GROUP BY lane),
      span AS (SELECT rank, max(last_ns) - min(first_ns) AS span_ns FROM lanes GROUP BY rank)
      SELECT l.lane, l.rank, l.pid, l.tid, l.identifier, l.subsystem, s.events, b.busy_ns, s.sum_ns,
             coalesce(s.kernel_ns, 0) AS kernel_ns, coalesce(s.memcpy_ns, 0) AS memcpy_ns,
             coalesce(s.memset_ns, 0) AS memset_ns, b.busy_ns / span.span_ns AS busy_share
      FROM s JOIN b USING (lane) JOIN lanes l USING (lane) JOIN span ON span.rank = l.rank
      ORDER BY l.lane"""
    return _arrow(trace.sql(q))


def engine_breakdown(trace, *, program_hash: str | None = None):
    """Per engine of tilescope's device (modeled): instructions, busy ns, bytes, FLOPs, per executable run."""
    from ._trace import _arrow

    where = f"WHERE program_hash = '{program_hash}'" if program_hash else ""
    q = f"""
      SELECT engine, count(*) AS instructions, sum(end_ns - start_ns) AS busy_ns, sum(bytes)::BIGINT AS bytes,
             sum(flops) AS flops, count(DISTINCT (program_hash, run)) AS runs, true AS modeled
      FROM instructions {where} GROUP BY engine ORDER BY busy_ns DESC"""
    return _arrow(trace.sql(q))
