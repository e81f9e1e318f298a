"""Collecting device executions while torch's profiler records.

The runtime calls :meth:`Capture.on_execution` for every device execution, on the
thread that launched it and inside the aten op that launched it. While torch's
profiler is enabled, the capture records a zero-length marker there (so the
marker nests under that op in torch's event tree) and keeps the execution
record, keyed by its flow id. At export the markers are replaced by device time
on their parent op (see ``_correlate``).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import OrderedDict, deque

import torch

__all__ = ["MARKER", "Capture", "capture"]

MARKER = "tilescope::exec#"
_KEEP = 2_000_000  # records kept for export (older ones are dropped first)


class Capture:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: OrderedDict[int, tuple] = OrderedDict()
        self._installed = False
        self.dropped = 0
        self._launches: deque = deque(maxlen=100_000)  # (wall ns, profiling?) of every launch

    def install(self) -> None:
        """Register the device and listen to its runtime (idempotent)."""
        if self._installed:
            return
        from .. import device

        device.register()
        device.subscribe(self.on_execution)
        self._installed = True

    def on_execution(self, rec) -> None:
        now = time.time_ns()
        fresh = rec.first_run
        enabled = torch.autograd.profiler._is_profiler_enabled
        self._launches.append((now, enabled))
        if not enabled:
            return
        with torch._C._profiler._RecordFunctionFast(f"{MARKER}{rec.flow_id}"):
            pass
        with self._lock:
            self._records[rec.flow_id] = (rec, now, fresh, threading.get_native_id())
            if len(self._records) > _KEEP:
                self._records.popitem(last=False)
                self.dropped += 1

    def get(self, flow_id: int):
        with self._lock:
            return self._records.get(flow_id)

    def launch_intervals_us(self) -> dict:
        """Median host time between consecutive device launches, with and without the profiler
        recording (gaps over 50 ms -- step boundaries, waits -- are left out)."""
        launches = list(self._launches)
        by_state: dict[bool, list[float]] = {True: [], False: []}
        for (t0, e0), (t1, e1) in zip(launches, launches[1:]):
            gap = (t1 - t0) / 1000.0
            if e0 == e1 and 0 <= gap < 50_000:
                by_state[e0].append(gap)
        return {("profiled" if k else "unprofiled"): (statistics.median(v) if v else None)
                for k, v in by_state.items()} | {"samples": {("profiled" if k else "unprofiled"): len(v)
                                                             for k, v in by_state.items()}}

    def forget(self, flow_ids) -> None:
        with self._lock:
            for f in flow_ids:
                self._records.pop(f, None)


capture = Capture()
