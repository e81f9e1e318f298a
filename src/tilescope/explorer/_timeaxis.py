"""Host waits on the simulated device, for a time axis that tells the truth.

On a profile of tilescope's simulated device the host's ``tilescope::synchronize`` returns
when the work submitted so far is done: its modeled device time *and* the simulator's
numerics, which run on the CPU and take wall-clock time that no hardware would spend. The
part of a synchronize after the last modeled device (or runtime) activity that started
before it returned is that wait alone: the explorer draws it as a *wait* and, by default,
collapses it on the time axis, so the modeled device work fills the first view instead of
a sliver before tens of milliseconds of numerics.

>>> import numpy as np
>>> merge([(0, 10), (5, 20), (30, 40)])
[(0, 20), (30, 40)]
"""

from __future__ import annotations

import numpy as np

__all__ = ["SYNC_PREFIX", "host_waits", "merge"]

SYNC_PREFIX = "tilescope::synchronize"


def merge(spans):
    """Overlapping or touching (start, end) spans merged, sorted."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def host_waits(ix) -> list[dict]:
    """The waits of a sim profile's synchronizes beyond its modeled work (ns from the trace
    start): ``[{"start_ns", "end_ns", "ns", "name"}]``, merged, in time order."""
    if ix.n == 0:
        return []
    ids = [i for i, n in enumerate(ix.names) if n.startswith(SYNC_PREFIX)]
    if not ids:
        return []
    syncs = np.flatnonzero(np.isin(ix.name, ids) & (ix.dur > 0))
    if syncs.size == 0:
        return []
    modeled_lanes = [ln["lane"] for ln in ix.lanes if ln.get("side") == "device" or ln.get("subsystem") == "runtime"]
    on = np.isin(ix.g_lane[ix.group], np.asarray(modeled_lanes, dtype=np.int64)) if modeled_lanes else np.zeros(ix.n, bool)
    dev = np.flatnonzero(on)
    starts = ix.start[dev]
    o = np.argsort(starts, kind="stable")
    starts = starts[o]
    ends = np.maximum.accumulate((ix.start[dev] + ix.dur[dev])[o]) if dev.size else np.zeros(0, dtype=np.int64)
    spans = []
    names = {}
    for r in syncs.tolist():
        s, e = int(ix.start[r]), int(ix.start[r] + ix.dur[r])
        k = int(np.searchsorted(starts, e, side="left")) - 1  # modeled work that began before it returned
        done = int(ends[k]) if k >= 0 else s
        a = max(s, done)
        if e > a:
            spans.append((a, e))
            names[(a, e)] = ix.names[ix.name[r]]
    out = []
    for a, b in merge(spans):
        out.append({"start_ns": a, "end_ns": b, "ns": b - a,
                    "name": next((n for (x, y), n in names.items() if a <= x and y <= b), SYNC_PREFIX)})
    return out
