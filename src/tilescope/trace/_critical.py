"""Critical path: the chain of host and device work that set a rank's end time.

Walked back from the rank's last device work by the last-arriving predecessor (what a piece of
work waited for is whichever of its inputs became ready last):

- device work waited for its **launch** (the launch call returned after the previous work on
  its stream ended: the segment in between is ``launch_delay``, then the path goes to the host)
  or for the **previous work on its stream** (``stream_wait`` when there is a gap: a
  dependency or an event wait; none when back-to-back);
- a launch call was reached by its host thread running: back to the previous synchronize call
  on that thread (``host``: the CPU time in between), or to the thread's first event;
- a synchronize call returned when the device work it waited for ended: the device work that
  ended last within the call (``sync``: the time from that end to the call's return);
- device work on a stream told to wait for a CUDA event (``cudaStreamWaitEvent``; Kineto's
  ``cuda_sync`` "Stream Wait Event" records name the ``cudaEventRecord`` call they wait on)
  also waited for the device work launched on the recording thread just before that call, as
  HTA's critical path links them: when that work ended last, the path goes to it, on another
  stream and often another host thread (``event_wait``: the time from its end to the start).

Each row is one segment, in time order: rank, kind (``device``, ``host``, ``launch_delay``,
``stream_wait``, ``event_wait``, ``sync``), name, lane, start_ns, end_ns, dur_ns, eid. The segments tile the path
without gaps, so their durations add up to its length (tested).
"""

from __future__ import annotations

import numpy as np

from ._gaps import SYNC_NAMES
from ._nesting import ensure_hierarchy

__all__ = ["critical_path", "critical_path_summary"]


# host calls that block until device work is done (cudaStreamWaitEvent only enqueues a wait)
BLOCKING = tuple(n for n in SYNC_NAMES if "WaitEvent" not in n)


def _arrays(trace, rank: int, window: tuple[int, int] | None):
    syncs = " OR ".join(f"name ILIKE '%{s}%'" for s in BLOCKING)
    # a step's window (HTA's clipping): host calls that start in it and the device work they launched
    in_host = f"AND ts_ns BETWEEN {window[0]} AND {window[1]}" if window else ""
    in_dev = (f"AND d.eid IN (SELECT k2.dev_eid FROM _links k2 JOIN events l ON l.eid = k2.launch_eid "
              f"WHERE l.ts_ns BETWEEN {window[0]} AND {window[1]})") if window else ""
    dev = trace.sql(f"""SELECT d.eid, d.lane, d.ts_ns, d.end_ns, d.name, coalesce(k.launch_eid, -1) AS launch_eid
                        FROM events d LEFT JOIN _links k ON k.dev_eid = d.eid
                        WHERE d.rank = {rank} AND d.ph = 'X' AND d.side = 'device' AND d.kind IN ('kernel', 'memcpy', 'memset')
                          AND d.dur_ns IS NOT NULL {in_dev} ORDER BY d.lane, d.end_ns, d.ts_ns, d.eid""").fetchnumpy()
    host = trace.sql(f"""SELECT eid, lane, ts_ns, end_ns, name, ({syncs}) AS is_sync FROM events
                         WHERE rank = {rank} AND ph = 'X' AND side = 'host' AND dur_ns IS NOT NULL
                           AND (kind = 'launch' OR ({syncs})) {in_host} ORDER BY lane, ts_ns, eid""").fetchnumpy()
    first = dict(trace.sql(f"SELECT lane, min(first_ns) FROM lanes WHERE rank = {rank} GROUP BY lane").fetchall())
    if window:  # the walk back along a host thread stops at the step's start
        first = {ln: max(int(t), window[0]) if t is not None else window[0] for ln, t in first.items()}
    return dev, host, first, _event_waits(trace, rank)


def _event_waits(trace, rank: int) -> list[tuple[int, int, int]]:
    """(stream lane, wait's start ns, device eid waited for) per "Stream Wait Event": the device
    work launched last on the recording thread up to its ``cudaEventRecord`` call."""
    return trace.sql(f"""
      WITH w AS (SELECT lane, ts_ns,
                        TRY_CAST(json_extract_string(args, '$.wait_on_cuda_event_record_corr_id') AS BIGINT) AS rec
                 FROM events WHERE rank = {rank} AND ph = 'X' AND side = 'device' AND kind = 'sync'
                   AND name = 'Stream Wait Event'),
      r AS (SELECT correlation AS rec, lane, ts_ns FROM events
            WHERE rank = {rank} AND ph = 'X' AND name = 'cudaEventRecord' AND correlation IN (SELECT rec FROM w))
      SELECT w.lane, w.ts_ns, arg_max(k.dev_eid, l.ts_ns) AS dev_eid
      FROM w JOIN r USING (rec) JOIN events l ON l.lane = r.lane AND l.kind = 'launch' AND l.ts_ns <= r.ts_ns
      JOIN _links k ON k.launch_eid = l.eid
      GROUP BY w.lane, w.ts_ns, w.rec ORDER BY w.lane, w.ts_ns""").fetchall()


def _step_window(trace, rank: int, step: int) -> tuple[int, int]:
    """The ``step``-th (0-based, in start order) ProfilerStep slice of ``rank``: (start, end) ns."""
    rows = trace.sql(f"""SELECT ts_ns, end_ns FROM events WHERE rank = {rank} AND ph = 'X' AND kind = 'step'
                         AND dur_ns IS NOT NULL ORDER BY ts_ns, eid""").fetchall()
    if not 0 <= step < len(rows):
        raise ValueError(f"step {step} is not in rank {rank}: it has {len(rows)} ProfilerStep slices "
                         f"(steps 0..{len(rows) - 1}); pass step=None for the whole rank")
    return int(rows[step][0]), int(rows[step][1])


def critical_path(trace, *, rank: int | None = None, step: int | None = None):
    """The critical path of ``rank`` (default: the first rank) as segments; see the module doc.
    ``step``: only the ``step``-th ProfilerStep (0-based), clipped as HTA's
    ``critical_path_analysis(annotation="ProfilerStep", instance_id=step)`` clips: the host
    calls that start within the step, the device work they launched, and the walk back stops at
    the step's start. Returns a pyarrow Table."""
    import pyarrow as pa

    ensure_hierarchy(trace)
    r = trace.ranks[0] if rank is None else int(rank)
    if r not in trace.ranks:
        raise ValueError(f"rank {rank} is not in this trace (ranks: {trace.ranks})")
    dev, host, first, waits = _arrays(trace, r, None if step is None else _step_window(trace, r, int(step)))
    segs: list[tuple] = []  # (kind, name, lane, start, end, eid)
    if len(dev["eid"]):
        d_lane, d_ts, d_end = dev["lane"].astype(np.int64), dev["ts_ns"].astype(np.int64), dev["end_ns"].astype(np.int64)
        d_launch = dev["launch_eid"].astype(np.int64)
        h_eid, h_lane = host["eid"].astype(np.int64), host["lane"].astype(np.int64)
        h_ts, h_end = host["ts_ns"].astype(np.int64), host["end_ns"].astype(np.int64)
        h_sync = np.asarray(host["is_sync"], dtype=bool)
        h_row = {int(e): i for i, e in enumerate(h_eid.tolist())}
        lane_rows = {int(ln): np.flatnonzero(d_lane == ln) for ln in np.unique(d_lane).tolist()}
        waited = _waits_by_lane(waits, {int(e): j for j, e in enumerate(dev["eid"].tolist())})
        order_end = np.argsort(d_end, kind="stable")
        i = int(np.argmax(d_end))  # the last device work to end
        steps = 0
        while i >= 0 and steps < 10 * len(d_ts) + 10:
            steps += 1
            segs.append(("device", dev["name"][i], int(d_lane[i]), int(d_ts[i]), int(d_end[i]), int(dev["eid"][i])))
            rows = lane_rows[int(d_lane[i])]
            k = np.searchsorted(d_end[rows], d_ts[i], side="right") - 1  # work on the stream ending by this start
            prev = int(rows[k]) if k >= 0 else -1
            prev_end = int(d_end[prev]) if prev >= 0 else None
            li = h_row.get(int(d_launch[i]), -1)
            ev = _event_source(waited.get(int(d_lane[i])), d_ts, d_end, i, prev)
            ready = max(int(h_end[li]) if li >= 0 else -1, prev_end if prev_end is not None else -1)
            if ev >= 0 and d_end[ev] > ready:  # the event's work ended last: the path crosses to it
                if d_ts[i] > d_end[ev]:
                    segs.append(("event_wait", "", int(d_lane[i]), int(d_end[ev]), int(d_ts[i]), -1))
                i = ev
            elif li >= 0 and (prev_end is None or h_end[li] >= prev_end):
                if d_ts[i] > h_end[li]:
                    segs.append(("launch_delay", "", int(d_lane[i]), int(h_end[li]), int(d_ts[i]), -1))
                i = _host_back(segs, li, h_eid, h_lane, h_ts, h_end, h_sync, host["name"], d_end, order_end, first,
                               min(int(d_ts[i]), int(h_end[li])))
            elif prev >= 0:
                if d_ts[i] > prev_end:
                    segs.append(("stream_wait", "", int(d_lane[i]), prev_end, int(d_ts[i]), -1))
                i = prev
            else:
                i = -1
    segs.reverse()
    cols = {"rank": [r] * len(segs), "kind": [s[0] for s in segs], "name": [s[1] for s in segs],
            "lane": [s[2] for s in segs], "start_ns": [s[3] for s in segs], "end_ns": [s[4] for s in segs],
            "dur_ns": [s[4] - s[3] for s in segs], "eid": [s[5] for s in segs]}
    return pa.table(cols, schema=pa.schema([("rank", pa.int32()), ("kind", pa.string()), ("name", pa.string()),
                                            ("lane", pa.int32()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
                                            ("dur_ns", pa.int64()), ("eid", pa.int64())]))


def _waits_by_lane(waits, row_of: dict) -> dict:
    """Per stream lane: (wait starts, device rows waited for) sorted by start, for the waits
    whose source work is among the walk's device rows."""
    out: dict = {}
    for lane, ts, eid in waits:
        if eid is not None and int(eid) in row_of:
            out.setdefault(int(lane), []).append((int(ts), row_of[int(eid)]))
    return {ln: (np.array([t for t, _r in w], dtype=np.int64), np.array([r for _t, r in w], dtype=np.int64))
            for ln, w in out.items()}


def _event_source(waits, d_ts, d_end, i: int, prev: int) -> int:
    """The device row that device row ``i`` waited for through events: among the waits on its
    stream since the previous work there started (all before it, if none), the source that
    ended last, by the time ``i`` started; -1 if none."""
    if waits is None:
        return -1
    starts, rows = waits
    lo = np.searchsorted(starts, d_ts[prev], side="left") if prev >= 0 else 0
    hi = np.searchsorted(starts, d_ts[i], side="right")
    cand = rows[lo:hi]
    cand = cand[d_end[cand] <= d_ts[i]]
    return int(cand[np.argmax(d_end[cand])]) if len(cand) else -1


def _host_back(segs, li, h_eid, h_lane, h_ts, h_end, h_sync, h_name, d_end, order_end, first, until) -> int:
    """From launch call ``li`` back along its host thread to the previous synchronize call (and
    through it to the device work it waited for); returns that device row, or -1 at the start."""
    lane = int(h_lane[li])
    segs.append(("host", h_name[li], lane, int(h_ts[li]), until, int(h_eid[li])))
    on_lane = np.flatnonzero((h_lane == lane) & h_sync & (h_end <= h_ts[li]))
    ends = d_end[order_end]
    t = int(h_ts[li])
    # the latest synchronize call before the launch that did wait for device work
    for s in on_lane[np.argsort(-h_end[on_lane], kind="stable")].tolist():
        j = np.searchsorted(ends, h_end[s], side="right") - 1
        if j < 0 or ends[j] < h_ts[s]:
            continue  # it returned without waiting: the host kept running through it
        if t > h_end[s]:
            segs.append(("host", "", lane, int(h_end[s]), t, -1))
        d = int(order_end[j])
        segs.append(("sync", h_name[s], lane, int(d_end[d]), int(h_end[s]), int(h_eid[s])))
        return d
    start = int(first.get(lane, t))
    if start < t:
        segs.append(("host", "", lane, start, t, -1))
    return -1


def critical_path_summary(path) -> list[dict]:
    """Time on the path per segment kind, with its share of the path: plain rows."""
    total = sum(path.column("dur_ns").to_pylist()) or 1
    acc: dict[str, int] = {}
    for k, d in zip(path.column("kind").to_pylist(), path.column("dur_ns").to_pylist()):
        acc[k] = acc.get(k, 0) + d
    return [{"kind": k, "ns": v, "share": v / total} for k, v in sorted(acc.items(), key=lambda kv: -kv[1])]
