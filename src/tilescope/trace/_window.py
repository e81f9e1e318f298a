"""The windowed, level-of-detail query the explorer draws from.

``window(trace, t0, t1, lanes, pixels)`` answers with compact numpy arrays. Times are
nanoseconds relative to ``trace.t0_ns`` (so they fit a JavaScript double exactly). When
the window holds at most ``max_events`` slices it returns them all (exact). Otherwise it
returns every slice at least one pixel wide, plus per-lane buckets from the LOD table
built on the first windowed query for everything smaller: count, busy ns and the longest event's name per
bucket. Neither path touches the events outside the window.
"""

from __future__ import annotations

import numpy as np

__all__ = ["window"]


def window(trace, t0_ns=None, t1_ns=None, lanes=None, pixels: int = 1000, *, max_events: int = 20000) -> dict:
    """Returns ``{"t0_ns", "t1_ns", "origin_ns", "exact", "bucket_ns", "names": [...],
    "events": {"eid","lane","start_ns","dur_ns","name","depth"} -> np.ndarray,
    "buckets": {"lane","start_ns","count","busy_ns","name"} -> np.ndarray}``;
    ``name`` columns index into ``names``."""
    from ._trace import _arrow

    con = trace.con
    origin = trace.t0_ns
    span = trace.t1_ns - origin
    a = 0 if t0_ns is None else int(t0_ns)
    b = span if t1_ns is None else int(t1_ns)
    if b <= a:
        raise ValueError(f"empty window: t1_ns ({b}) must be greater than t0_ns ({a})")
    pixels = max(1, int(pixels))
    px = max(1, (b - a) // pixels)
    lane_sql = ""
    if lanes is not None:
        lanes = [int(x) for x in lanes]
        lane_sql = f"AND lane IN ({', '.join(map(str, lanes)) or 'NULL'})"
    A, B = a + origin, b + origin
    has_lod = trace._ensure_lod()
    level = None
    if has_lod:
        levels = sorted({(m2["level"], m2["bucket_ns"]) for m in trace.meta for m2 in m.get("lod_levels", [])})
        # the coarsest level whose buckets are at most one pixel
        fine_enough = [lv for lv in levels if lv[1] <= px]
        level = max(fine_enough, key=lambda lv: lv[1]) if fine_enough else min(levels, key=lambda lv: lv[1])
    exact = True
    if level is not None:
        n = con.execute(f"""SELECT coalesce(sum(count), 0) FROM lod l JOIN (SELECT rank, min(first_ns) AS f FROM lanes GROUP BY rank) r USING (rank)
                            WHERE level = {level[0]} {lane_sql}
                            AND r.f + bucket * {level[1]} < {B} AND r.f + (bucket + 1) * {level[1]} > {A}""").fetchall()[0][0]
        exact = n <= max_events
    min_dur = 0 if exact else px
    ev = _arrow(con.sql(f"""
        SELECT e.eid, e.lane, e.ts_ns - {origin} AS start_ns, coalesce(e.dur_ns, 0) AS dur_ns, e.name
        FROM events e
        WHERE e.ts_ns < {B} AND e.end_ns >= {A} AND coalesce(e.dur_ns, 0) >= {min_dur} {lane_sql.replace('lane', 'e.lane')}
        ORDER BY e.lane, e.ts_ns, e.dur_ns DESC, e.eid LIMIT {max_events * 4}"""))
    names: dict[str, int] = {}
    ev_names = np.array([names.setdefault(x, len(names)) for x in ev.column("name").to_pylist()], dtype=np.int32)
    out = {
        "t0_ns": a, "t1_ns": b, "origin_ns": origin, "exact": exact, "bucket_ns": 0 if exact else level[1],
        "events": {"eid": ev.column("eid").to_numpy(), "lane": ev.column("lane").to_numpy().astype(np.int32),
                   "start_ns": ev.column("start_ns").to_numpy(), "dur_ns": ev.column("dur_ns").to_numpy(),
                   "name": ev_names, "depth": _depths(ev)},
        "buckets": {k: np.zeros(0, dtype=np.int64) for k in ("lane", "start_ns", "count", "busy_ns", "name")},
    }
    if not exact:
        bk = _arrow(con.sql(f"""
            SELECT l.lane, r.f + l.bucket * {level[1]} - {origin} AS start_ns, l.count, l.busy_ns, l.top_name
            FROM lod l JOIN (SELECT rank, min(first_ns) AS f FROM lanes GROUP BY rank) r USING (rank)
            WHERE l.level = {level[0]} {lane_sql.replace('lane', 'l.lane')}
              AND r.f + l.bucket * {level[1]} < {B} AND r.f + (l.bucket + 1) * {level[1]} > {A}
            ORDER BY l.lane, start_ns"""))
        out["buckets"] = {
            "lane": bk.column("lane").to_numpy().astype(np.int32), "start_ns": bk.column("start_ns").to_numpy(),
            "count": bk.column("count").to_numpy(), "busy_ns": bk.column("busy_ns").to_numpy(),
            "name": np.array([names.setdefault(x, len(names)) for x in bk.column("top_name").to_pylist()], dtype=np.int32),
        }
    out["names"] = list(names)
    return out


def _depths(ev) -> np.ndarray:
    """Nesting depth of each returned slice among the returned slices of its lane.

    Every ancestor of a returned slice overlaps the window and is at least as long, so it
    is returned too: the depth needs no table beyond the answer itself."""
    lane = ev.column("lane").to_pylist()
    start = ev.column("start_ns").to_pylist()
    end = [s + d for s, d in zip(start, ev.column("dur_ns").to_pylist())]
    depth = np.zeros(len(lane), dtype=np.int32)  # (slices with one timestamp nest as deep as they are many)
    stack: list[int] = []
    prev = None
    for i in range(len(lane)):
        if lane[i] != prev:
            stack.clear()
            prev = lane[i]
        while stack and end[stack[-1]] <= start[i] and not (end[stack[-1]] == start[i] == start[stack[-1]]):
            stack.pop()
        depth[i] = len(stack)
        stack.append(i)
    return depth
