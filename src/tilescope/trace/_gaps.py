"""Idle gaps, classified: the device waiting on host dispatch, the host waiting on the device, other."""

from __future__ import annotations

from ._nesting import ensure_hierarchy

__all__ = ["idle_gaps", "GAP_RULES", "SYNC_NAMES"]

# A host event whose name matches waits for the device.
SYNC_NAMES = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaStreamWaitEvent",
              "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "synchronize")

# classification rules, first match wins: (class, condition in SQL over the gap row, meaning)
GAP_RULES = (
    ("device_waits_on_host", "next_submit_ns IS NOT NULL AND next_submit_ns >= gap_start_ns",
     "the next device work was submitted by the host only after the device went idle"),
    ("device_waits_on_runtime", "next_launch_end_ns IS NOT NULL AND next_launch_end_ns >= gap_end_ns",
     "submitted in time, but the runtime was still queueing / launching it (launch latency, runtime cost)"),
    ("device_other", "true", "work was already submitted and launched: a dependency, an event wait or another stream"),
)


def idle_gaps(trace, *, min_ns: int = 0):
    """Rows: lane, class, gap_start_ns, gap_end_ns, gap_ns, next_eid. Device gaps are between
    consecutive busy intervals of a device lane; host gaps (``host_waits_on_device``) are the
    host's synchronize calls."""
    from ._trace import _arrow

    ensure_hierarchy(trace)
    case = " ".join(f"WHEN {cond} THEN '{cls}'" for cls, cond, _m in GAP_RULES)
    syncs = " OR ".join(f"name ILIKE '%{s}%'" for s in SYNC_NAMES)
    q = f"""
      WITH d AS (
        SELECT lane, eid, ts_ns, end_ns,
               max(end_ns) OVER (PARTITION BY lane ORDER BY ts_ns, end_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS pe
        FROM events WHERE ph = 'X' AND side = 'device' AND kind IN ('kernel', 'memcpy', 'memset')),
      g AS (SELECT d.lane, d.pe AS gap_start_ns, d.ts_ns AS gap_end_ns, d.eid AS next_eid, l.ts_ns AS next_submit_ns, l.end_ns AS next_launch_end_ns
            FROM d LEFT JOIN _links k ON k.dev_eid = d.eid LEFT JOIN events l ON l.eid = k.launch_eid
            WHERE d.pe IS NOT NULL AND d.ts_ns > d.pe)
      SELECT lane, CASE {case} END AS class, gap_start_ns, gap_end_ns, gap_end_ns - gap_start_ns AS gap_ns, next_eid
      FROM g WHERE gap_end_ns - gap_start_ns >= {int(min_ns)}
      UNION ALL
      SELECT lane, 'host_waits_on_device', ts_ns, end_ns, dur_ns, eid FROM events
      WHERE ph = 'X' AND side = 'host' AND ({syncs}) AND dur_ns >= {int(min_ns)}
      ORDER BY gap_start_ns"""
    return _arrow(trace.sql(q))
