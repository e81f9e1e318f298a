"""The op table (self/total host and device time, calls, shapes) and the kernel table."""

from __future__ import annotations

from ._nesting import ensure_hierarchy

__all__ = ["op_table", "kernel_table"]


def op_table(trace, *, kinds=("op",), by_shape: bool = False, limit: int | None = None, sort: str = "device_total_ns"):
    """One row per op name (and input shapes with ``by_shape``), like ``key_averages()``.

    Columns: name, [shapes], calls, host_total_ns, host_self_ns, device_total_ns, device_self_ns,
    device_calls, host_avg_ns, device_avg_ns; only events with a usable duration count (a
    missing, negative or out-of-range ``dur`` is left out of calls as of totals). Device time of an op is the time of the device
    work it launched (self) and that its children launched (total); work launched outside any
    op is on the row of its launch call (``cudaLaunchKernel``). Returns a pyarrow Table.
    """
    from ._trace import _arrow

    ensure_hierarchy(trace)
    kinds_sql = ", ".join(f"'{k}'" for k in kinds)
    shape = "json_extract(e.args, '$.\"Input Dims\"')::VARCHAR AS shapes, " if by_shape else ""
    order = sort if sort in ("device_total_ns", "device_self_ns", "host_total_ns", "host_self_ns", "calls") else "device_total_ns"
    q = f"""
      SELECT e.name, {shape} count(*) AS calls, sum(e.dur_ns)::BIGINT AS host_total_ns, sum(h.self_ns)::BIGINT AS host_self_ns,
             sum(h.dev_total_ns)::BIGINT AS device_total_ns, sum(h.dev_self_ns)::BIGINT AS device_self_ns,
             sum(h.n_dev)::BIGINT AS device_calls,
             sum(e.dur_ns) / count(*) AS host_avg_ns, sum(h.dev_total_ns) / count(*) AS device_avg_ns
      FROM events e JOIN _hier h USING (eid)
      -- calls, totals and means count the same events: those with a usable duration (a
      -- missing, negative or out-of-range dur is NULL in the view; the ingest warned about them)
      WHERE e.ph = 'X' AND e.dur_ns IS NOT NULL AND (e.kind IN ({kinds_sql})
            -- a launch outside any op keeps the device time of the work it launched: its own row
            OR (e.kind = 'launch' AND h.dev_self_ns > 0 AND {"TRUE" if "op" in kinds else "FALSE"}))
      GROUP BY ALL ORDER BY {order} DESC, host_total_ns DESC, e.name {f'LIMIT {int(limit)}' if limit else ''}"""
    return _arrow(trace.sql(q))


def kernel_table(trace, *, limit: int | None = None, kinds=("kernel", "memcpy", "memset")):
    """Device work by name: calls, total, mean, min, max (ns), streams, share of device time."""
    from ._trace import _arrow

    kinds_sql = ", ".join(f"'{k}'" for k in kinds)
    q = f"""
      SELECT name, any_value(kind) AS kind, count(*) AS calls, sum(dur_ns)::BIGINT AS total_ns, avg(dur_ns) AS mean_ns,
             min(dur_ns) AS min_ns, max(dur_ns) AS max_ns, count(DISTINCT lane) AS lanes,
             sum(dur_ns) / sum(sum(dur_ns)) OVER () AS share
      FROM events WHERE ph = 'X' AND side = 'device' AND kind IN ({kinds_sql}) AND dur_ns IS NOT NULL
      GROUP BY name ORDER BY total_ns DESC, name {f'LIMIT {int(limit)}' if limit else ''}"""
    return _arrow(trace.sql(q))
