"""Collecting device executions while torch's profiler records.

The runtime calls :meth:`Capture.on_execution` for every device execution, on the
thread that launched it and inside the aten op that launched it. While torch's
profiler is enabled, the capture records a zero-length marker there (so the
marker nests under that op in torch's event tree) and keeps the execution
record, keyed by its flow id. At export the markers are replaced by device time
on their parent op (see ``_correlate``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

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

    def install(self) -> None:
        """Register the device and listen to its runtime (idempotent)."""
        if self._installed:
            return
        from .. import device

        device.register()
        device.subscribe(self.on_execution)
        self._installed = True

    def on_execution(self, rec) -> None:
        if not torch.autograd.profiler._is_profiler_enabled:
            return
        with torch._C._profiler._RecordFunctionFast(f"{MARKER}{rec.flow_id}"):
            pass
        with self._lock:
            self._records[rec.flow_id] = (rec, time.time_ns())
            if len(self._records) > _KEEP:
                self._records.popitem(last=False)
                self.dropped += 1

    def get(self, flow_id: int):
        with self._lock:
            return self._records.get(flow_id)

    def forget(self, flow_ids) -> None:
        with self._lock:
            for f in flow_ids:
                self._records.pop(f, None)


capture = Capture()
