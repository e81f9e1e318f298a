"""Putting modeled device time into torch's own tables.

When the session asked for device activities (``ProfilerActivity.PrivateUse1``), torch
records each execution itself through the device's activity profiler for Kineto
(``tilescope/device/_csrc/profiler.cpp``): its parse adds the modeled time to the launching
op (``Self SIM`` / ``SIM total``) and a PrivateUse1 event to its list, as it does for CUDA
kernels. What is left here is to find, for the profile directory, each execution's launching
op -- the event whose correlation id the activity is linked to -- and to take out of torch's
tables what must not be there (executions still running when the trace was exported, or all
of them with ``correlate_device_time=False``).

Otherwise (a CPU-only session, torch without Kineto) each launch left a
``tilescope::exec#<flow>`` marker inside the op that launched it. The markers are taken out
of torch's raw events before torch parses them -- torch turns every raw event into a
``FunctionEvent`` at tens of µs each, and small-op loops have about one marker per op -- and
each one's launching op is found as torch's own event tree would have found its parent (same
thread, the innermost range containing it). The marker is replaced by:

* a kernel on its parent op (``FunctionEvent.append_kernel``), which fills the
  ``Self SIM`` / ``SIM total`` columns of ``key_averages()``, and
* a PrivateUse1 ``FunctionEvent`` on the device timeline, which torch counts in the
  table's totals footer, as it does CUDA kernels.

Executions still running on the device when the trace is exported are left out
(as a real device's unfinished kernels are) and counted as pending. When torch has
parsed its events already (``acc_events=True``), the markers are found among them and
taken out of the event list and tree instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

from torch.autograd.profiler_util import DeviceType, FunctionEvent, Interval

from ..device.internal import DeviceActivities, activity_name, take_device_activities
from ._capture import MARKER

__all__ = ["Matched", "Correlation", "correlate"]

_CPU = DeviceType.CPU.value
_DEVICE = DeviceType.PrivateUse1.value
_ACTIVITY_PREFIXES = (activity_name("kernel", ""), activity_name("memcpy", ""))  # the device's activity names
_flow_of_launch = itemgetter(0)  # of a (flow, thread, start, parent) launch


UNRECORDED_THREAD = "launching thread"  # Matched.thread of an execution with no launching op: (this, system id)


@dataclass(slots=True)
class Matched:
    """One execution found in the trace: its record, launch time and launching op."""

    rec: object
    launch_us: float  # launch time on torch's clock (us from the trace start)
    thread: object  # torch's thread of the launching op; (UNRECORDED_THREAD, system id) without one
    parent: FunctionEvent | None
    native_tid: int = 0  # the launching thread's system id (Kineto's tid)
    recorded_by_torch: bool = False  # a device activity in torch's own events (else a marker's)


def device_event_name(rec) -> str:
    return activity_name(rec.kind, rec.op)


class _Marker(NamedTuple):
    flow: int
    thread: int  # torch's thread id
    start_us: float  # on torch's clock (µs from the trace start), as its events are
    parent: FunctionEvent | None


def correlate(prof, capture, now_ns: float, *, into_tables: bool) -> tuple[list[Matched], int]:
    """Match markers to executions; with ``into_tables`` add device time to torch's events.

    Returns the matched executions (launch order) and how many were still pending.
    """
    return Correlation(prof, capture, now_ns).complete(into_tables=into_tables)


class Correlation:
    """The correlation of one trace, in two steps.

    Made before torch parses its events, it knows every execution of the trace
    (:attr:`launches`: record, launch time, thread) -- from the device activities torch
    recorded and from the raw markers -- enough for what depends only on the executions
    (their executables and instruction traces) to start while torch parses. :meth:`complete`
    lets torch parse (without the markers), finds each execution's launching op and settles
    the device time in torch's tables. When torch has parsed markers already
    (``acc_events=True``), :attr:`launches` is None and :meth:`complete` finds them among the
    parsed events.
    """

    def __init__(self, prof, capture, now_ns: float):
        self._prof, self._capture, self._now = prof, capture, now_ns
        result = getattr(prof.profiler, "kineto_results", None)
        t0 = result.trace_start_ns() if result is not None else 0
        taken = take_device_activities(t0) if result is not None else DeviceActivities.none()
        # (the device's profiler made them in the forms read here: no pass per execution)
        recorded = self._recorded = taken.launches  # (flow, 0, launch µs, None), launch order
        self._ranges: dict[int, tuple] = taken.ranges  # flow -> its linked range's correlation id, then the enclosing ones'
        self._range_ids: set[int] = taken.range_ids
        # the records of the executions torch recorded are this export's alone (the capture
        # holds only the listener's: unprofiled launches, markers)
        self._records: dict[int, tuple] = taken.records
        if taken.dropped:
            capture.count_dropped(taken.dropped)
        markers_recorded, capture.markers = capture.markers, 0
        # (markers, the other raw events); None when torch has parsed its events already
        self._taken = _take_markers(prof.profiler) if markers_recorded else ([], None)
        self.launches: list[Matched] | None = None
        self.pending = 0
        self.marked = 0  # matched executions found by their markers (not recorded by torch)
        self.without_op: list[Matched] = []  # executions torch recorded with no launching op among its events
        self._pending_recorded: list[int] = []  # flows of pending executions torch recorded (in its trace too)
        self._marks: dict[int, list] = {}  # torch thread -> [(start, -end, flow)], from the raw markers
        if self._taken is not None:
            marked = []
            for e, name in self._taken[0]:
                flow = _flow_of(name)
                if flow is not None:  # times as torch computes its events' (µs from the trace start)
                    start, end, thread = (e.start_ns() - t0) / 1000, (e.end_ns() - t0) / 1000, e.start_thread_id()
                    self._marks.setdefault(thread, []).append((start, -end, flow))
                    marked.append((flow, thread, start, None))
            self.launches, self.pending = self._match(recorded + marked if marked else recorded)

    def _match(self, launches) -> tuple[list[Matched], int]:
        """``(flow, thread, start, parent)`` of each launch -> the executions, launch order."""
        matched, pending, marked = [], 0, 0
        get = self._lookup()
        links, now = self._ranges, self._now
        if launches is not self._recorded:  # markers too (the device's launches come in launch order)
            launches = sorted(launches, key=_flow_of_launch)
        for flow, thread, start, parent in launches:
            entry = get(flow)
            if entry is None:
                continue
            rec, native_tid = entry
            recorded = flow in links
            if rec.device_end_ns > now:
                pending += 1
                if recorded:
                    self._pending_recorded.append(flow)
                continue
            marked += not recorded
            matched.append(Matched(rec, start, thread, parent, native_tid, recorded))
        self.marked = marked
        return matched, pending

    def _lookup(self):
        """``flow -> (execution, native thread id)`` or None: the records taken with the trace,
        then the capture's (the markers')."""
        own, kept = self._records.get, self._capture.records()
        if not kept:  # (the usual case: torch recorded every execution)
            return own
        return lambda flow: own(flow) or kept.get(flow)

    def parse(self) -> list[FunctionEvent]:
        """torch's parse (without the markers) -- once -- and its events."""
        profiler = self._prof.profiler
        if self._taken is not None and self._taken[0]:  # torch parses now, without the markers
            markers, keep = self._taken
            result = profiler.kineto_results
            profiler.kineto_results = _WithoutMarkers(result, keep)
            try:
                profiler.function_events
            finally:
                profiler.kineto_results = result
            self._taken = ([], keep)
        return profiler.function_events

    def range_ids(self) -> set[int]:
        """The correlation ids of the ranges that launched the executions torch recorded (and
        of the ranges around them): :meth:`complete` looks them up among torch's CPU events,
        or takes them found by the caller's own pass over those events."""
        return self._range_ids

    def complete(self, *, into_tables: bool, ranges: dict | None = None) -> tuple[list[Matched], int]:
        """torch's parse, each execution's launching op, device time in torch's tables; returns
        the matched executions (launch order) and how many were still pending. ``ranges``: the
        first CPU event of each of :meth:`range_ids`, when the caller found them already."""
        profiler = self._prof.profiler
        if self._taken is None:
            events = profiler.function_events
            marked = _markers_among(events)
            matched, pending = self._match(self._recorded + marked if marked else self._recorded)
        else:
            events = self.parse()
            matched, pending = self.launches, self.pending
            if self._marks:
                parents = _launching_ops(self._marks, events)
                for m in matched:
                    if not m.recorded_by_torch:
                        m.parent = parents.get(m.rec.flow_id)
        if self._ranges:
            self._settle_recorded(matched, events, into_tables,
                                  ranges if ranges is not None else _ranges_by_id(events, self.range_ids()))
        if into_tables:
            _add_device_time([m for m in matched if not m.recorded_by_torch], events, profiler.use_device)
        return matched, pending

    @property
    def pending_recorded(self) -> list[int]:
        """Flow ids of the executions torch recorded that were still running at export: out of
        its tables once :meth:`complete` ran; its Chrome trace still has them."""
        return list(self._pending_recorded)

    def _settle_recorded(self, matched: list[Matched], events, into_tables: bool, ranges: dict) -> None:
        """The launching ops of the executions torch recorded (``ranges``: torch's CPU events by
        correlation id); their device time taken out of torch's tables where it must not be
        (pending executions; all without ``into_tables``)."""
        parents: dict[int, FunctionEvent | None] = {}  # flow -> its launching op, as torch's events have it
        merged: set[int] = set()  # ranges not found, nor the op they were merged into
        for flow, ids in self._ranges.items():
            range_id = ids[0]
            parent = ranges.get(range_id)
            if parent is None and range_id > 0:
                parent = self._merged_into(flow, ids[1:], ranges)
                if parent is None:
                    merged.add(range_id)
            parents[flow] = parent
        if merged:  # merged more than 3 levels deep (or not at all): looked for in the raw events (slower)
            found = _merged_ranges(self._prof.profiler, events, merged)
            for flow, parent in parents.items():
                if parent is None:
                    parents[flow] = found.get(self._ranges[flow][0])
        without_op = self.without_op = []
        for m in matched:
            if m.recorded_by_torch:
                parent = m.parent = parents[m.rec.flow_id]
                if parent is not None:
                    m.thread = parent.thread
                else:  # no launching op among torch's events (a thread torch does not profile, or
                    # outside any op): the launching thread, by its system id (see unrecorded_launch_lanes)
                    m.thread = (UNRECORDED_THREAD, m.native_tid)
                    without_op.append(m)
        if not into_tables:
            _remove_all_recorded(events)
        elif self._pending_recorded:
            _remove_recorded(events, {flow: parents[flow] for flow in self._pending_recorded})

    def _merged_into(self, flow: int, enclosing: tuple, ranges: dict) -> FunctionEvent | None:
        """The op a range missing from torch's events was merged into: torch merges an op into a
        parent of the same name (``aten::mean`` calling ``aten::mean``) and lifts its kernels
        there -- the nearest enclosing range torch kept, if it holds this execution's kernel."""
        parent = next((ranges[r] for r in enclosing if r in ranges), None)
        entry = self._lookup()(flow)
        if parent is None or entry is None:
            return None
        name = device_event_name(entry[0])
        return parent if any(k.name == name for k in parent.kernels) else None


def _ranges_by_id(events, ids: set[int]) -> dict[int, FunctionEvent]:
    """torch's CPU events (ops, record_function ranges) whose correlation id is in ``ids``."""
    out = {}
    if ids:
        for evt in events:
            if evt.id in ids and evt.device_type.value == _CPU:
                out.setdefault(evt.id, evt)
    return out


def _merged_ranges(profiler, events, ids: set[int]) -> dict[int, FunctionEvent]:
    """Ranges torch took out of its events: an op whose parent has its name and no other child
    (``aten::mean`` calling ``aten::mean``) is merged into that parent, its kernels with it.
    Each is found in this trace's raw events and replaced by the innermost event of this trace
    with its name and thread that contains it (with ``acc_events=True`` torch's list also
    holds earlier cycles', timed from their own start)."""
    t0 = profiler.kineto_results.trace_start_ns()
    raw, current = {}, set()
    for e in profiler.kineto_results.events():
        if e.device_type() != DeviceType.CPU:  # a device activity's id is a flow id, not a range's
            continue
        cid = e.correlation_id()
        current.add(cid)
        if cid in ids:
            raw[cid] = (e.name(), e.start_thread_id(), (e.start_ns() - t0) / 1000, (e.end_ns() - t0) / 1000)
    names = {(name, thread) for name, thread, _, _ in raw.values()}
    by_name: dict[tuple, list] = {}
    for evt in events:
        key = (evt.name, evt.thread)
        if key in names and evt.id in current and evt.device_type.value == _CPU:
            by_name.setdefault(key, []).append(evt)
    out = {}
    for cid, (name, thread, start, end) in raw.items():
        around = [evt for evt in by_name.get((name, thread), ())
                  if evt.time_range.start <= start and end <= evt.time_range.end]
        if around:
            out[cid] = min(around, key=lambda evt: evt.time_range.end - evt.time_range.start)
    return out


def _remove_recorded(events, parents: dict[int, FunctionEvent | None]) -> None:
    """Device activities torch recorded (flow -> launching op) out of its event list, and their
    time off their ops (the kernels torch's parse appended)."""
    ids = {flow & 0x7FFFFFFF: flow for flow in parents}  # an activity's id is its flow id's low 31 bits
    keep, removed = [], []
    for evt in events:
        flow = ids.get(evt.id) if evt.device_type.value == _DEVICE else None
        if flow is None:
            keep.append(evt)
        else:
            removed.append((evt, parents[flow]))
    events[:] = keep
    cpu = None
    for evt, parent in removed:
        kernel = (evt.name, evt.time_range.elapsed_us())  # as torch's parse appended it
        if parent is None or not _drop_kernel(parent, kernel):
            cpu = cpu if cpu is not None else [e for e in keep if e.device_type.value == _CPU and e.kernels]
            any(_drop_kernel(e, kernel) for e in cpu)  # its op not found: the first one that has it


def _drop_kernel(evt: FunctionEvent, kernel: tuple) -> bool:
    for k, (name, _, duration) in enumerate(evt.kernels):
        if (name, duration) == kernel:
            del evt.kernels[k]
            return True
    return False


def _remove_all_recorded(events) -> None:
    """Every device execution torch recorded out of its tables (``correlate_device_time=False``)."""
    names = set()
    keep = []
    for evt in events:
        if evt.device_type.value == _DEVICE and evt.name.startswith(_ACTIVITY_PREFIXES):
            names.add(evt.name)
        else:
            keep.append(evt)
    events[:] = keep
    if names:
        for evt in keep:
            if evt.kernels:
                evt.kernels = [k for k in evt.kernels if k.name not in names]


def _add_device_time(matched: list[Matched], events, use_device) -> None:
    """Each execution as a kernel of its launching op (the ``Self SIM`` columns) and as a
    PrivateUse1 event (the totals footer)."""
    if not matched:  # (torch recorded them all itself: nothing to add, no ids to look for)
        return
    next_id = max((evt.id for evt in events), default=0) + 1  # the first id free for device events
    make_event = _DeviceEventFactory(use_device)
    device_events = []
    for m in matched:
        rec = m.rec
        dur_us = (rec.device_end_ns - rec.device_start_ns) / 1000.0
        name = device_event_name(rec)
        if m.parent is not None:
            m.parent.append_kernel(name, DeviceType.PrivateUse1, dur_us)
        start = m.launch_us + (rec.device_start_ns - rec.host_submit_ns) / 1000.0
        device_events.append(make_event(next_id, name, rec.stream, start, start + dur_us, rec.core))
        next_id += 1
    events.extend(device_events)


class _DeviceEventFactory:
    """PrivateUse1 ``FunctionEvent``s, as ``FunctionEvent(...)`` makes them, ~5x faster.

    torch's constructor sets some 45 attributes one by one; a loop of small ops has one
    device event per op. The first event is built by the constructor; the others copy its
    attributes and replace those that differ -- and every mutable container (kernels,
    children, stack, ...) with a fresh one, so that no two events share one.
    """

    def __init__(self, use_device):
        self.use_device = use_device
        self._proto: dict | None = None
        self._mutable: tuple = ()

    def __call__(self, id, name, thread, start_us, end_us, core) -> FunctionEvent:
        if self._proto is None:
            evt = FunctionEvent(
                id=id, name=name, thread=thread, start_us=start_us, end_us=end_us,
                device_type=DeviceType.PrivateUse1, device_index=core, use_device=self.use_device,
                is_legacy=False, stack=[], input_shapes=[], trace_name=name,
            )
            self._proto = dict(vars(evt))
            self._mutable = tuple(k for k, v in self._proto.items() if isinstance(v, (list, dict, set)))
            return evt
        evt = FunctionEvent.__new__(FunctionEvent)
        d = evt.__dict__
        d.update(self._proto)
        for k in self._mutable:
            d[k] = d[k].copy()
        d["id"], d["name"], d["trace_name"], d["device_index"] = id, name, name, core
        d["thread"] = d["device_resource_id"] = thread
        d["time_range"] = Interval(start_us, end_us)
        return evt


class _WithoutMarkers:
    """torch's profiler result whose ``events()`` leaves the markers out (the rest delegates:
    ``save`` -- the Chrome trace export -- still writes every event)."""

    def __init__(self, result, events):
        self._result, self._events = result, events

    def events(self):
        return self._events

    def __getattr__(self, name):
        return getattr(self._result, name)


def _flow_of(name: str) -> int | None:
    try:
        return int(name[len(MARKER):])
    except ValueError:
        return None


def _take_markers(profiler) -> tuple[list, list] | None:
    """The raw marker events (with their names) and the other events, before torch parses;
    None when torch has parsed its events already (or has none)."""
    result = getattr(profiler, "kineto_results", None)
    if result is None or getattr(profiler, "_function_events", None) is not None:
        return None
    keep, markers = [], []
    for e in result.events():
        name = e.name()
        if name.startswith(MARKER):
            markers.append((e, name))
        else:
            keep.append(e)
    return markers, keep


def _launching_ops(marks: dict[int, list], events) -> dict[int, FunctionEvent]:
    """Each marker's launching op (flow -> event): on the marker's thread, the innermost
    synchronous CPU range that contains it -- torch's own tree rule (``_populate_cpu_children``:
    ranges ordered by (start, -end), a stack of the open ones), applied to torch's final events."""
    ops: dict[int, list] = {t: [] for t in marks}
    for evt in events:  # torch keeps them ordered by (start, -end)
        lane = ops.get(evt.thread)
        if lane is not None and not evt.is_async and evt.device_type.value == _CPU:  # ints compare faster
            lane.append(evt)
    out = {}
    for thread, thread_marks in marks.items():
        lane, i, stack = ops[thread], 0, []
        for start, neg_end, flow in sorted(thread_marks):
            end = -neg_end
            while i < len(lane) and (lane[i].time_range.start, -lane[i].time_range.end) <= (start, neg_end):
                _push(stack, lane[i])
                i += 1
            while stack and (start >= stack[-1].time_range.end or end > stack[-1].time_range.end):
                stack.pop()
            if stack:
                out[flow] = stack[-1]
    return out


def _push(stack: list, evt: FunctionEvent) -> None:
    r = evt.time_range
    while stack and (r.start >= stack[-1].time_range.end or r.end > stack[-1].time_range.end):
        stack.pop()
    stack.append(evt)


def _markers_among(events) -> list[_Marker]:
    """The markers of events torch has parsed already, taken out of the list and the tree."""
    found = [evt for evt in events if evt.name.startswith(MARKER)]
    if not found:
        return []
    ids = {id(m) for m in found}
    for p in {id(m.cpu_parent): m.cpu_parent for m in found if m.cpu_parent is not None}.values():
        p.cpu_children = [c for c in p.cpu_children if id(c) not in ids]
    events[:] = [e for e in events if id(e) not in ids]
    return [_Marker(flow, m.thread, m.time_range.start, m.cpu_parent)
            for m in found if (flow := _flow_of(m.name)) is not None]
