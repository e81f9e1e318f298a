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
_GAPS = 1024  # launch-to-launch gaps kept per profiler state (the median of the recent ones)


class Capture:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: OrderedDict[int, tuple] = OrderedDict()
        self._installed = False
        self.dropped = 0
        self._last_launch = (0, None)  # (wall ns, profiling?) of the latest launch
        # host time between consecutive launches (us), by whether the profiler recorded both:
        # the recent ones, kept as gaps so that an export reads a few thousand, not every launch
        self._gaps: dict[bool, deque] = {True: deque(maxlen=_GAPS), False: deque(maxlen=_GAPS)}

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
        last, last_enabled = self._last_launch
        self._last_launch = (now, enabled)
        if last_enabled == enabled and 0 <= now - last < 50_000_000:  # longer: step boundaries, waits
            self._gaps[enabled].append((now - last) / 1000.0)
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
        recording (over the latest gaps; gaps over 50 ms -- step boundaries, waits -- are left out)."""
        by_state = {k: list(v) for k, v in self._gaps.items()}
        return {("profiled" if k else "unprofiled"): (statistics.median(v) if v else None)
                for k, v in by_state.items()} | {"samples": {("profiled" if k else "unprofiled"): len(v)
                                                             for k, v in by_state.items()}}

    def forget(self, flow_ids) -> None:
        with self._lock:
            for f in flow_ids:
                self._records.pop(f, None)


capture = Capture()
