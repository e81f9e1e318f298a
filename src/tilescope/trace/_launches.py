"""The path from a host launch to device work: launch statistics (CPU launch time vs device
time, launch delay, outliers), queue length per stream over time, and memory-copy bandwidth
-- HTA's launch and counter analyses, on every runtime that links launches to device work
by correlation id (CUDA, ROCm, MTIA, XPU, PrivateUse1) and on tilescope profiles (flow ids).

Each device event reached from a launch call (``_links``, built with the op table) is one
launch pair: ``cpu_duration_ns`` is the launch call's duration, ``gpu_duration_ns`` the device
work's, ``launch_delay_ns`` the time from the end of the launch call to the start of the work
(0 when the work starts before the call returns).
"""

from __future__ import annotations

from ._nesting import ensure_hierarchy

__all__ = ["LAUNCH_NAMES_HTA", "launch_pairs", "launch_stats", "queue_length", "queue_length_summary",
           "memory_bandwidth", "memory_bandwidth_summary"]

# The launch calls HTA 0.5.0 keeps in get_cuda_kernel_launch_stats (with its memory events);
# tilescope's default is every runtime call that submitted device work.
LAUNCH_NAMES_HTA = ("cudaLaunchKernel", "cudaLaunchKernelExC", "runFunction - job_prep_and_submit_for_execution",
                    "cudaMemcpyAsync", "cudaMemsetAsync")


def _names_sql(names) -> str:
    if names is None:
        return "TRUE"
    quoted = ", ".join("'" + n.replace("'", "''") + "'" for n in names)
    return f"l.name IN ({quoted})"


def launch_pairs(trace, *, launch_names: tuple[str, ...] | None = None, rank: int | None = None):
    """One row per (launch call, device work) pair: rank, launch_eid, dev_eid, launch_name,
    device_name, device_kind, lane (the device lane), launch_ts_ns, cpu_duration_ns, dev_ts_ns,
    gpu_duration_ns, launch_delay_ns. ``launch_names`` keeps only those calls (None: all).
    Returns a pyarrow Table ordered by launch time."""
    from ._trace import _arrow

    ensure_hierarchy(trace)
    rank_sql = f"AND d.rank = {int(rank)}" if rank is not None else ""
    return _arrow(trace.sql(f"""
      SELECT d.rank, l.eid AS launch_eid, d.eid AS dev_eid, l.name AS launch_name, d.name AS device_name,
             d.kind AS device_kind, d.lane, l.ts_ns AS launch_ts_ns, l.dur_ns AS cpu_duration_ns, d.ts_ns AS dev_ts_ns,
             d.dur_ns AS gpu_duration_ns, greatest(d.ts_ns - l.end_ns, 0) AS launch_delay_ns
      FROM _links k JOIN events l ON l.eid = k.launch_eid JOIN events d ON d.eid = k.dev_eid
      WHERE d.dur_ns IS NOT NULL AND l.dur_ns IS NOT NULL AND {_names_sql(launch_names)} {rank_sql}
      ORDER BY d.rank, l.ts_ns, d.ts_ns"""))


def launch_stats(trace, *, launch_names: tuple[str, ...] | None = None, long_launch_ns: int = 50_000,
                 long_delay_ns: int = 100_000):
    """Per rank: launch pairs, summed CPU launch / device / delay time, their means, and the
    outliers: ``short_kernels`` (device work shorter than its launch call: launch-bound),
    ``long_launches`` (a launch call over ``long_launch_ns``, default 50 us as in HTA) and
    ``long_delays`` (work starting over ``long_delay_ns`` after its launch returned, default
    100 us). Returns a pyarrow Table."""
    from ._trace import _arrow

    ensure_hierarchy(trace)
    return _arrow(trace.sql(f"""
      WITH p AS (
        SELECT d.rank, l.dur_ns AS cpu, d.dur_ns AS gpu, greatest(d.ts_ns - l.end_ns, 0) AS delay
        FROM _links k JOIN events l ON l.eid = k.launch_eid JOIN events d ON d.eid = k.dev_eid
        WHERE d.dur_ns IS NOT NULL AND l.dur_ns IS NOT NULL AND {_names_sql(launch_names)})
      SELECT rank, count(*) AS launches, sum(cpu)::BIGINT AS cpu_duration_ns, sum(gpu)::BIGINT AS gpu_duration_ns,
             sum(delay)::BIGINT AS launch_delay_ns, avg(cpu) AS mean_cpu_duration_ns, avg(gpu) AS mean_gpu_duration_ns,
             avg(delay) AS mean_launch_delay_ns,
             count(*) FILTER (WHERE gpu < cpu) AS short_kernels,
             count(*) FILTER (WHERE cpu > {int(long_launch_ns)}) AS long_launches,
             count(*) FILTER (WHERE delay > {int(long_delay_ns)}) AS long_delays
      FROM p GROUP BY rank ORDER BY rank"""))


def queue_length(trace, *, launch_names: tuple[str, ...] | None = None, rank: int | None = None):
    """Outstanding device work per device lane (a stream) over time: +1 when a launch call
    starts (work enqueued), -1 when the work starts on the device (HTA's definition). One row
    per change: rank, lane, ts_ns, queue_length (a step function: the value holds until the next
    row of the lane). Returns a pyarrow Table."""
    from ._trace import _arrow

    ensure_hierarchy(trace)
    rank_sql = f"AND d.rank = {int(rank)}" if rank is not None else ""
    return _arrow(trace.sql(f"""
      WITH p AS (
        SELECT d.rank, d.lane, l.ts_ns AS t_in, d.ts_ns AS t_out, d.eid
        FROM _links k JOIN events l ON l.eid = k.launch_eid JOIN events d ON d.eid = k.dev_eid
        WHERE {_names_sql(launch_names)} {rank_sql}),
      s AS (SELECT rank, lane, t_in AS ts_ns, 1 AS delta, 0 AS o, eid FROM p
            UNION ALL SELECT rank, lane, t_out, -1, 1, eid FROM p)
      SELECT rank, lane, ts_ns,
             sum(delta) OVER (PARTITION BY rank, lane ORDER BY ts_ns, o, eid ROWS UNBOUNDED PRECEDING)::BIGINT AS queue_length
      FROM s ORDER BY rank, lane, ts_ns, o, eid"""))


def queue_length_summary(trace, *, launch_names: tuple[str, ...] | None = None):
    """Per device lane: ``changes`` (rows of the time series), ``mean`` / ``max`` over the rows
    (HTA's ``get_queue_length_summary``), and the time-weighted mean over the lane's queue span
    (what the queue held on average; HTA's row mean weighs a 1 ns state like a 1 s one), plus
    ``time_at_max_ns``. Returns a pyarrow Table."""
    from ._trace import _arrow

    q = queue_length(trace, launch_names=launch_names)
    con = trace.con
    con.register("_ql_arrow", q)
    try:
        return _arrow(con.sql("""
          WITH s AS (SELECT *, lead(ts_ns) OVER (PARTITION BY rank, lane ORDER BY ts_ns) - ts_ns AS held FROM _ql_arrow),
          m AS (SELECT rank, lane, max(queue_length) AS mx FROM s GROUP BY ALL)
          SELECT s.rank, s.lane, l.identifier, count(*) AS changes, avg(queue_length) AS mean, max(queue_length) AS max,
                 sum(queue_length * held) / nullif(sum(held), 0) AS time_weighted_mean,
                 coalesce(sum(held) FILTER (WHERE queue_length = m.mx), 0)::BIGINT AS time_at_max_ns
          FROM s JOIN m USING (rank, lane) JOIN lanes l ON l.lane = s.lane
          GROUP BY ALL ORDER BY s.rank, s.lane"""))
    finally:
        con.unregister("_ql_arrow")


# copy type of a device memory event: Kineto names copies "Memcpy HtoD (Pinned -> Device)", ...
_COPY_TYPE = """CASE WHEN starts_with(name, 'Memset') THEN 'Memset'
                     WHEN starts_with(name, 'Memcpy') THEN substr(name, 1, 11)
                     ELSE name END"""


def memory_bandwidth(trace, *, rank: int | None = None):
    """Memory-copy bandwidth over time per copy type (Memcpy HtoD / DtoH / DtoD / Memset / MTIA
    dma_request...): each copy adds its bandwidth while it runs. One row per change: rank, copy_type,
    ts_ns, gbps (summed over the copies running then). A copy's bandwidth is Kineto's ``memory
    bandwidth (GB/s)`` arg (CUPTI computes it from the nanosecond duration, which the trace's
    ``dur`` may round to microseconds), else its ``bytes`` (MTIA: ``size``) over its duration.
    Returns a pyarrow Table."""
    from ._trace import _arrow

    rank_sql = f"AND rank = {int(rank)}" if rank is not None else ""
    return _arrow(trace.sql(f"""
      WITH c AS (
        SELECT rank, eid, {_COPY_TYPE} AS copy_type, ts_ns, end_ns,
               coalesce(TRY_CAST(json_extract(args, '$."memory bandwidth (GB/s)"') AS DOUBLE),
                        coalesce(TRY_CAST(json_extract(args, '$.bytes') AS DOUBLE),
                                 TRY_CAST(json_extract(args, '$.size') AS DOUBLE)) / nullif(dur_ns, 0)) AS gbps
        FROM events WHERE ph = 'X' AND side = 'device' AND kind IN ('memcpy', 'memset') {rank_sql}),
      s AS (SELECT rank, copy_type, ts_ns, gbps AS d, 1 AS o, eid FROM c WHERE gbps IS NOT NULL
            UNION ALL SELECT rank, copy_type, end_ns, -gbps, 0, eid FROM c WHERE gbps IS NOT NULL)
      SELECT rank, copy_type, ts_ns,
             greatest(sum(d) OVER (PARTITION BY rank, copy_type ORDER BY ts_ns, o, eid ROWS UNBOUNDED PRECEDING), 0) AS gbps
      FROM s ORDER BY rank, copy_type, ts_ns, o, eid"""))


def memory_bandwidth_summary(trace):
    """Per copy type: copies, bytes, busy time, achieved GB/s (bytes over the merged time the
    type was copying), and the bandwidth series' mean / max over its non-zero points (HTA's
    ``get_memory_bw_summary``). Returns a pyarrow Table."""
    from ._breakdown import busy_sql
    from ._trace import _arrow

    bw = memory_bandwidth(trace)
    con = trace.con
    con.register("_bw_arrow", bw)
    try:
        where = "ph = 'X' AND side = 'device' AND kind IN ('memcpy', 'memset')"
        busy = busy_sql(where, key=f"rank || '|' || {_COPY_TYPE}")
        return _arrow(con.sql(f"""
          WITH c AS (SELECT rank, {_COPY_TYPE} AS copy_type, count(*) AS copies,
                            sum(coalesce(TRY_CAST(json_extract(args, '$.bytes') AS BIGINT),
                                         TRY_CAST(json_extract(args, '$.size') AS BIGINT)))::BIGINT AS bytes
                     FROM events WHERE {where} GROUP BY ALL),
          b AS (SELECT lane AS k, busy_ns FROM ({busy})),
          s AS (SELECT rank, copy_type, avg(gbps) AS series_mean_gbps, max(gbps) AS series_max_gbps,
                       count(*) AS series_points FROM _bw_arrow WHERE gbps > 1e-12 GROUP BY ALL)
          SELECT c.rank, c.copy_type, c.copies, c.bytes, b.busy_ns, c.bytes / nullif(b.busy_ns, 0) AS achieved_gbps,
                 s.series_points, s.series_mean_gbps, s.series_max_gbps
          FROM c JOIN b ON b.k = c.rank || '|' || c.copy_type LEFT JOIN s USING (rank, copy_type)
          ORDER BY c.rank, b.busy_ns DESC"""))
    finally:
        con.unregister("_bw_arrow")
