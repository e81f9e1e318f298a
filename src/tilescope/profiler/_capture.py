"""Collecting device executions while torch's profiler records.

While torch's profiler is enabled, each device execution's record is kept, keyed by its
flow id, for the export.

torch records the execution itself when the session asked for device activities
(``ProfilerActivity.PrivateUse1``): the device's activity profiler for Kineto links it
to its op (``tilescope/device/_csrc/profiler.cpp``) and keeps the runtime's record with
it (``keep_recorded``), which the export takes with the session's launches
(``take_device_activities``; the capture only counts the records over that limit).
Otherwise -- a CPU-only session, or torch without Kineto -- the runtime calls
:meth:`Capture.on_execution`, on the thread that launched the execution and inside the aten
op that launched it, and the capture records a zero-length marker there (so the marker nests
under that op in torch's event tree), which the export replaces by device time on its parent
op (see ``_correlate``). The listener also sees every unprofiled execution.

The listener is subscribed only while a tilescope :class:`~tilescope.profiler.Profiler` is open
(:meth:`Capture.acquire` / :meth:`Capture.release`, counted, so nested and overlapping profilers
share it): a subscribed listener sends every device call through Python, off the native
dispatch fast path.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque

import torch

from ._fast_files import prepare_files

__all__ = ["MARKER", "Capture", "capture"]

MARKER = "tilescope::exec#"
_KEEP = 2_000_000  # records kept for export (older ones are dropped first)
_GAPS = 1024  # launch-to-launch gaps kept per profiler state (the median of the recent ones)
_GAP_LIMIT_NS = 50_000_000  # longer gaps are step boundaries or waits, not launch overhead
_RecordFunctionFast = torch._C._profiler._RecordFunctionFast


class Capture:
    """Listens to the runtime; keeps the executions launched while torch's profiler records.

    The profiled path is as short as it can be -- it runs once per device execution, inside
    the user's op, and on a machine whose cores are busy with the device's numerics every
    microsecond of it is paid several times over: nothing in Python when torch records the
    execution (the device's profiler keeps the record; the export takes it there), else the
    marker and the record stored by flow id with the launching thread's system id (a plain
    dict: one store is atomic; the lock guards only the rare eviction). Host time between
    unprofiled launches is kept for the doctor; the profiled gaps are read from the launches at
    export (:func:`launch_intervals_us`).

    A Program's first run outside a profiled window (the wait and warmup steps of a schedule)
    also prepares its executable's text and digest and its instruction trace's text: that run
    already pays for lowering and modeling the Program, a few percent more there spares the
    export of the profiled step from serialising every file.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[int, tuple] = {}  # flow id -> (execution, native thread id), launch order
        self._installed = False
        self.dropped = 0
        self._last_unprofiled_ns = 0  # wall time of the latest unprofiled launch; 0 after a profiled one
        self._last_unprofiled_flow = 0  # its flow id (a launch this listener did not see came in between if not +1)
        self.markers = 0  # markers recorded since the last export (none: the export skips looking for them)
        self._unprofiled_gaps: deque = deque(maxlen=_GAPS)  # µs, the recent ones
        self._holders = 0  # open profilers (acquire / release)
        self._hold_lock = threading.Lock()

    def install(self) -> None:
        """Register the device and listen to its runtime (idempotent)."""
        if self._installed:
            return
        from .. import device
        from ..device.internal import keep_recorded

        device.register()
        # the device's profiler keeps the records of the executions torch records (no call per
        # execution); the listener sees the others: unprofiled, or profiled without device activities
        keep_recorded(_KEEP)
        device.subscribe(self.on_execution, recorded=False)
        self._installed = True

    @property
    def installed(self) -> bool:
        return self._installed

    def uninstall(self) -> None:
        """Stop listening (what is kept stays until exported or forgotten)."""
        from .. import device
        from ..device.internal import keep_recorded

        device.unsubscribe(self.on_execution)
        keep_recorded(0)
        self._installed = False

    def acquire(self) -> None:
        """An open profiler needs the listener: installed while at least one holds it."""
        with self._hold_lock:
            self._holders += 1
            if self._holders == 1:
                self.install()

    def release(self) -> None:
        """A profiler closed: the last one out uninstalls the listener (the fast path is back).
        A release without an acquire is ignored."""
        with self._hold_lock:
            if self._holders == 0:
                return
            self._holders -= 1
            if self._holders == 0 and self._installed:
                self.uninstall()

    @property
    def holders(self) -> int:
        """Profilers open now."""
        return self._holders

    def on_execution(self, rec) -> None:
        if not torch.autograd.profiler._is_profiler_enabled:
            if rec.first_run and rec.program is not None:
                prepare_files(rec.program)
            self._unprofiled_launch(rec.flow_id)
            return
        self._last_unprofiled_ns = 0
        if not rec.recorded_by_torch:  # torch records no device activity in this session: a marker
            with _RecordFunctionFast(f"{MARKER}{rec.flow_id}"):
                pass
            self.markers += 1
        self._records[rec.flow_id] = (rec, threading.get_native_id())
        if len(self._records) > _KEEP:
            self._evict()

    def _unprofiled_launch(self, flow: int) -> None:
        now = time.time_ns()
        last, self._last_unprofiled_ns = self._last_unprofiled_ns, now
        if flow != self._last_unprofiled_flow + 1:  # profiled launches torch recorded came in between
            last = 0
        self._last_unprofiled_flow = flow
        if last and 0 <= now - last < _GAP_LIMIT_NS:  # longer: step boundaries, waits
            self._unprofiled_gaps.append((now - last) / 1000.0)

    def _evict(self) -> None:
        with self._lock:  # older records are dropped first
            while len(self._records) > _KEEP:
                del self._records[next(iter(self._records))]
                self.dropped += 1

    def count_dropped(self, dropped: int) -> None:
        """Records the device's profiler let go in a session (over its limit, see
        :func:`~tilescope.device._runtime.take_device_activities`)."""
        with self._lock:
            self.dropped += dropped

    def records(self) -> dict:
        """Every kept launch: flow id -> ``(execution, native thread id)`` (to read, not change)."""
        return self._records

    def get(self, flow_id: int):
        """``(execution, native thread id)`` of a profiled launch, or None."""
        return self.records().get(flow_id)

    def launch_intervals_us(self, profiled_launch_us=()) -> dict:
        """Median host time between consecutive device launches, with and without the profiler
        recording: the unprofiled gaps kept as they happened, the profiled ones between the
        given launch times (µs, this profile's markers); gaps over 50 ms -- step boundaries,
        waits -- are left out, and the latest 1024 of each kind are used."""
        times = sorted(profiled_launch_us)
        profiled = [g for a, b in zip(times, times[1:]) if 0 <= (g := b - a) < _GAP_LIMIT_NS / 1000][-_GAPS:]
        by_state = {"profiled": profiled, "unprofiled": list(self._unprofiled_gaps)}
        return {k: (statistics.median(v) if v else None) for k, v in by_state.items()} | {
            "samples": {k: len(v) for k, v in by_state.items()}}

    def forget(self, flow_ids) -> None:
        records = self.records()
        if not records:  # (the usual case: the device's profiler kept every record of the trace)
            return
        with self._lock:
            for f in flow_ids:
                records.pop(f, None)


capture = Capture()
