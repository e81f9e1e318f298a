"""Shared resources of the scheduler, as busy-interval timelines.

Engines and DMA queues issue their own instructions in order, so a single
"free at" time describes each of them. Resources that several engines share --
the DMA bandwidth pool and the SBUF/PSUM ports -- are claimed by instructions in
program order but must not make an early-ready instruction wait behind a
later-ready one, so they keep their busy intervals and let claims fill gaps.
"""

from __future__ import annotations

from bisect import bisect_right

__all__ = ["IntervalResource"]


class IntervalResource:
    """Sorted, disjoint busy intervals ``[start, end)`` of one shared resource."""

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def earliest_gap(self, t0: float, duration: float) -> float:
        """Earliest start >= t0 of a free interval of at least ``duration``."""
        starts, ends = self.starts, self.ends
        i = bisect_right(ends, t0)
        t = t0
        while i < len(starts):
            if starts[i] - t >= duration:
                return t
            if ends[i] > t:
                t = ends[i]
            i += 1
        return t

    def reserve(self, start: float, end: float) -> None:
        """Mark ``[start, end)`` busy (it must be free), merging with neighbours."""
        if end <= start:
            return
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, start)
        merge_left = i > 0 and ends[i - 1] >= start
        merge_right = i < len(starts) and starts[i] <= end
        if merge_left and merge_right:
            ends[i - 1] = ends[i]
            del starts[i], ends[i]
        elif merge_left:
            ends[i - 1] = max(ends[i - 1], end)
        elif merge_right:
            starts[i] = start
        else:
            starts.insert(i, start)
            ends.insert(i, end)

    def consume(self, t0: float, amount: float) -> float:
        """Use ``amount`` of free time from ``t0`` on, filling gaps; returns when it is done.

        This is how transfers share bandwidth: each takes whatever capacity the
        earlier-claimed transfers left free.
        """
        if amount <= 0:
            return t0
        starts, ends = self.starts, self.ends
        i = bisect_right(ends, t0)
        t = t0
        pieces = []
        while amount > 0:
            if i < len(starts) and starts[i] <= t:
                t = max(t, ends[i])
                i += 1
                continue
            gap_end = starts[i] if i < len(starts) else float("inf")
            take = min(amount, gap_end - t)
            pieces.append((t, t + take))
            amount -= take
            t += take
        for s, e in pieces:
            self.reserve(s, e)
        return t
