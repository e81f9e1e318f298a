"""Putting modeled device time into torch's own tables.

torch's CPU-only build cannot record PrivateUse1 kernels by itself. After torch
has parsed its events, each ``tilescope::exec#<flow>`` marker (recorded inside
the op that launched an execution) is replaced by:

* a kernel on its parent op (``FunctionEvent.append_kernel``), which fills the
  ``Self SIM`` / ``SIM total`` columns of ``key_averages()``, and
* a PrivateUse1 ``FunctionEvent`` on the device timeline, which torch counts in the
  table's totals footer, as it does CUDA kernels.

Executions still running on the device when the trace is exported are left out
(as a real device's unfinished kernels are) and counted as pending.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.autograd.profiler_util import DeviceType, FunctionEvent

from ._capture import MARKER

__all__ = ["Matched", "correlate"]


@dataclass
class Matched:
    """One execution found in the trace: its record, marker time and launching op."""

    rec: object
    real_ns: int  # wall-clock time of the launch (time.time_ns)
    marker_us: float  # marker time on torch's clock (us from the trace start)
    thread: int
    parent: FunctionEvent | None
    fresh: bool = False  # the first execution of its Program in this process
    native_tid: int = 0  # the launching thread's system id (Kineto's tid)


def device_event_name(rec) -> str:
    return f"{'memcpy' if rec.kind == 'memcpy' else 'exec_running'} {rec.op}"


def correlate(prof, capture, now_ns: float, *, into_tables: bool) -> tuple[list[Matched], int]:
    """Match markers to executions; with ``into_tables`` rewrite torch's events.

    Returns the matched executions (launch order) and how many were still pending.
    """
    events = prof.profiler.function_events
    use_device = prof.profiler.use_device
    matched: list[Matched] = []
    pending = 0
    markers = []
    next_id = 0
    for evt in events:  # one pass: the markers, and the first id free for device events
        if evt.name.startswith(MARKER):
            markers.append(evt)
        if evt.id > next_id:
            next_id = evt.id
    next_id += 1
    device_events = []
    for m in markers:
        try:
            flow = int(m.name[len(MARKER):])
        except ValueError:
            continue
        entry = capture.get(flow)
        if entry is None:
            continue
        rec, real_ns, fresh, native_tid = entry
        if rec.device_end_ns > now_ns:
            pending += 1
            continue
        parent = m.cpu_parent
        start = m.time_range.start
        matched.append(Matched(rec, real_ns, start, m.thread, parent, fresh, native_tid))
        if into_tables:
            dur_us = (rec.device_end_ns - rec.device_start_ns) / 1000.0
            name = device_event_name(rec)
            if parent is not None:
                parent.append_kernel(name, DeviceType.PrivateUse1, dur_us)
            start += (rec.device_start_ns - rec.host_submit_ns) / 1000.0
            dev = FunctionEvent(
                id=next_id, name=name, thread=rec.stream, start_us=start, end_us=start + dur_us,
                device_type=DeviceType.PrivateUse1, device_index=rec.core, use_device=use_device,
                is_legacy=False, stack=[], input_shapes=[], trace_name=name,
            )
            next_id += 1
            device_events.append(dev)
    if markers:  # markers are bookkeeping, not ops: take them out of the event list and the tree
        marker_ids = {id(m) for m in markers}
        parents = {id(m.cpu_parent): m.cpu_parent for m in markers if m.cpu_parent is not None}
        for p in parents.values():
            p.cpu_children = [c for c in p.cpu_children if id(c) not in marker_ids]
        events[:] = [e for e in events if id(e) not in marker_ids]
    if into_tables:
        events.extend(device_events)
    matched.sort(key=lambda x: x.rec.flow_id)
    return matched, pending
