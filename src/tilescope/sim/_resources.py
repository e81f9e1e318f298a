"""Shared resources of the scheduler, as busy-interval timelines.

Engines and DMA queues issue their own instructions in order, so a single
"free at" time describes each of them. Resources that several of them share --
the DMA engines' time, HBM's bandwidth and the SBUF/PSUM ports -- are claimed by
instructions in program order but must not make an early-ready instruction wait
behind a later-ready one, so they keep their busy intervals and let claims fill gaps.
"""

from __future__ import annotations

from bisect import bisect_right

__all__ = ["IntervalResource", "DmaEngines"]


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


class DmaEngines:
    """The DMA queues, engines and HBM port of one core, as the scheduler claims them.

    A transfer is issued on its queue (``fixed`` ns, one instruction after another per
    queue), then each engine it spans moves its piece (``piece`` ns of that engine's time)
    after the queue's previous piece on that engine ([dmaintro] a queue's transfers run in
    order). [arch] an engine processes one transfer at a time, and [overlap] it switches
    between queues (rings) round-robin at packet boundaries, so a piece takes whatever
    engine time earlier-claimed pieces left free, packet by packet (a fluid share).
    Transfers touching HBM also draw ``hbm`` ns of HBM bandwidth, shared the same way.

    While every transfer spans all engines the engines are identical, so one stands for all
    (the common case costs one engine's bookkeeping); the first partial transfer splits them.
    """

    __slots__ = ("n", "issue_free", "done", "engines", "order", "hbm")

    def __init__(self, engines: int, queues: int) -> None:
        self.n = engines
        self.issue_free = [0.0] * queues
        self.done = [0.0] * queues
        self.engines: list[IntervalResource] = [IntervalResource()]
        self.order: list[list[float]] = [[0.0] for _ in range(queues)]
        self.hbm = IntervalResource()

    def first_free_queue(self) -> int:
        """The queue whose last transfer completes first (lowest id on ties)."""
        done = self.done
        return min(range(len(done)), key=done.__getitem__)

    def _split(self) -> None:
        one = self.engines[0]
        self.engines = [one] + [_copy(one) for _ in range(self.n - 1)]
        self.order = [row * self.n for row in self.order]

    def transfer(self, ready: float, q: int, fixed: float, first: int, count: int, piece: float,
                 hbm: float) -> tuple[float, float]:
        """Claim one transfer; returns (issue start, completion)."""
        s = self.issue_free[q]
        if ready > s:
            s = ready
        issued = s + fixed
        self.issue_free[q] = issued
        order = self.order[q]
        if count >= self.n and len(self.engines) == 1:
            engine = self.engines[0]
            t0 = order[0] if order[0] > issued else issued
            end = engine.consume(t0, piece)
            order[0] = end
        else:
            if len(self.engines) == 1:
                self._split()
                order = self.order[q]
            end = issued
            n = self.n
            for k in range(first, first + count):
                e = k % n
                engine = self.engines[e]
                t0 = order[e] if order[e] > issued else issued
                t = engine.consume(t0, piece)
                order[e] = t
                if t > end:
                    end = t
        if hbm > 0.0:
            h = self.hbm.consume(issued, hbm)
            if h > end:
                end = h
        self.done[q] = end
        return s, end


def _copy(r: IntervalResource) -> IntervalResource:
    c = IntervalResource()
    c.starts = list(r.starts)
    c.ends = list(r.ends)
    return c
