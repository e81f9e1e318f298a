"""System-trace events of a simulated-device profile, formatted straight to JSON text.

The exporter writes each event once and never reads it back, so events are not built
as dicts and encoded: each one is a single f-string (times as ``%.3f`` µs). The same
device placement is rendered twice -- into the system trace and, shifted onto torch's
clock, into torch's ``trace.json`` -- and computed once. The doctor gets, as dicts, only
the events its rules read (see :func:`doctor_events`). A C version of these loops was dropped:
its end-to-end gain on a profile's export was 1.23-1.34x (``benchmarks/native_paths.py``), under
the 1.5x a native path must earn.

>>> js("a\\"b"), js(None)
('"a\\\\"b"', 'null')
"""

from __future__ import annotations

import functools
import json
import math
from typing import NamedTuple
from json.encoder import encode_basestring_ascii as _encode_str

import torch

from ._correlate import device_event_name

__all__ = ["FRAMEWORK", "RUNTIME", "HARDWARE", "HOST", "js", "meta", "Framework", "framework_events", "Placement",
           "placement", "device_events", "event_count", "doctor_events", "unrecorded_launch_lanes"]

FRAMEWORK, RUNTIME, HARDWARE, HOST = 1, 2, 3, 4
_CPU = torch.autograd.DeviceType.CPU.value
_DOCTOR_RANGES = ("ProfilerStep", "tilescope::synchronize")  # framework ranges the doctor reads


def js(value) -> str:
    """A JSON literal (strings as ``json.dumps`` writes them)."""
    return _encode_str(value) if isinstance(value, str) else json.dumps(value)


def meta(pid: int, name: str, tid: int | None = None, tname: str | None = None) -> list[str]:
    out = [f'{{"ph":"M","name":"process_name","pid":{pid},"tid":0,"args":{{"name":{js(name)}}}}}']
    if tid is not None:
        out.append(f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{tid},"args":{{"name":{js(tname)}}}}}')
    return out


class Framework(NamedTuple):
    """The framework lanes of a profile (see :func:`framework_events`)."""

    chunks: list[str]  # the events' text, chunks to join with ","
    count: int  # how many events they are
    threads: dict  # torch thread -> tid
    ranges: list[dict]  # the ranges the doctor reads
    end: float  # the end of the last event (µs)
    by_id: dict  # correlation id -> the first CPU event with it, for the ids asked for


def framework_events(prof, prefix: str, ids: set | frozenset | None = None) -> Framework:
    """Every CPU event of torch's profile on the framework lanes -- and, in the same pass, the
    CPU events whose correlation id is in ``ids`` (the executions' launching ops)."""
    events = prof.profiler.function_events
    if len(_HEADS) > _HEADS_KEPT:
        _HEADS.clear()
    chunks, threads, found, end, by_id = _framework_lanes(events, ids, _HEADS)
    count = len(chunks)
    ranges = [{"ph": "X", "cat": cat, "name": name, "pid": FRAMEWORK, "tid": tid, "ts": round(ts, 3),
               "dur": round(dur, 3)} for cat, name, tid, ts, dur in found]
    head = meta(FRAMEWORK, f"{prefix}/framework")
    head += [f'{{"ph":"M","name":"thread_name","pid":{FRAMEWORK},"tid":{tid},"args":{{"name":"tid:{tid}"}}}}'
             for tid in threads.values()]
    return Framework(head + chunks, len(head) + count, threads, ranges, end, by_id)


# the text of events up to their "ts", by (category, name, lane), made so far: a profiled loop
# runs the same ops profile after profile
_HEADS: dict[tuple, str] = {}
_HEADS_KEPT = 16384


def _framework_head(cat: str, name: str, tid: int) -> str:
    """An event's text up to its "ts" value: the same for every event of one name on one lane."""
    return f'{{"ph":"X","cat":"{cat}","name":{js(name)},"pid":{FRAMEWORK},"tid":{tid},"ts":'


def _framework_extra(evt) -> str:
    """The event's args after its External id (torch's input shapes, the Python stack)."""
    extra = ""
    if evt.input_shapes:
        extra = f',"Input Dims":{json.dumps(evt.input_shapes)}'
    if evt.stack:
        extra += f',"Call stack":{js(";".join(evt.stack))}'
    return extra


def _framework_lanes(function_events, ids=None, heads: dict | None = None) -> tuple[list[str], dict, list[tuple],
                                                                                  float, dict]:
    """Each event's text, the thread -> tid map, the doctor's ranges as tuples, the end (µs), the
    first CPU event of each id in ``ids``; ``heads``: (category, name, tid) -> the event's text
    up to "ts", made so far (added to)."""
    events: list[str] = []
    threads: dict[int, int] = {}
    ranges: list[tuple] = []
    by_id: dict = {}
    end = 0.0
    heads = {} if heads is None else heads
    for evt in function_events:
        if evt.device_type.value != _CPU:  # the enum's int: comparing the enums costs more
            continue
        tid = threads.get(evt.thread)
        if tid is None:
            tid = threads[evt.thread] = len(threads)
        name = evt.name
        cat = "user_annotation" if evt.is_user_annotation else "cpu_op"
        head = heads.get((cat, name, tid))
        if head is None:
            head = heads[cat, name, tid] = _framework_head(cat, name, tid)
        span = evt.time_range
        start = span.start
        dur = span.end - start
        extra = _framework_extra(evt) if evt.input_shapes or evt.stack else ""
        if ids is not None and evt.id in ids:
            by_id.setdefault(evt.id, evt)
        events.append(f'{head}{start:.3f},"dur":{dur:.3f},"args":{{"External id":{evt.id}{extra}}}}}')
        if start + dur > end:
            end = start + dur
        if name.startswith(_DOCTOR_RANGES):
            ranges.append((cat, name, tid, start, dur))
    return events, threads, ranges, end, by_id


class Placement(NamedTuple):
    """The executions on the runtime and hardware lanes (see :func:`placement`)."""

    rows: list[tuple]
    cores: list  # each row's core
    end: float  # the end of the latest hardware event (µs; -inf without rows)


def placement(matched) -> Placement:
    """Where each execution goes on the runtime and hardware lanes (µs on torch's clock), with
    the parts of its events that do not depend on the clock or the execution, as text.

    An execution's runtime ``execute`` event starts at its launch; its hardware
    ``exec_running`` event starts ``device_start - host_submit`` later (the modeled queue and
    runtime cost), never before the previous execution on that core ends (the times torch
    records for it, too); durations are the modeled ones, unchanged. Rows are ``(matched,
    runtime start, runtime dur, hardware start, hardware dur, framework op start, flow id,
    texts)``, ``texts`` shared by the executions of one Program by one op on one core (see
    :func:`_clock_free_text`); with them, each row's core and the latest hardware end.
    """
    if len(_TEXTS) > _TEXTS_KEPT:
        _TEXTS.clear()
    rows = _placement(matched, _TEXTS)
    return Placement(rows, [row[0].rec.core for row in rows], max((r[3] + r[4] for r in rows), default=-math.inf))


# the clock-free texts of the executions placed so far, by what they are made of: a profiled
# loop runs the same few Programs profile after profile
_TEXTS: dict[tuple, tuple] = {}
_TEXTS_KEPT = 4096


def _placement(matched, texts: dict) -> list[tuple]:
    """The rows; ``texts``: the clock-free texts made so far (added to)."""
    rows = []
    hw_end: dict[int, float] = {}
    for m in matched:
        rec = m.rec
        core = rec.core
        t_launch = m.launch_us
        submit = rec.host_submit_ns
        rt_dur = (rec.queued_ns - submit) / 1000.0
        hw_ts = t_launch + (rec.device_start_ns - submit) / 1000.0
        after = hw_end.get(core, hw_ts)  # (comparisons, not max(): this loop runs once per execution)
        if after > hw_ts:
            hw_ts = after
        if t_launch + rt_dur > hw_ts:
            hw_ts = t_launch + rt_dur
        hw_dur = (rec.device_end_ns - rec.device_start_ns) / 1000.0
        hw_end[core] = hw_ts + hw_dur
        fw_ts = m.parent.time_range.start if m.parent is not None else t_launch
        if fw_ts < t_launch - 1e-3:
            fw_ts = t_launch - 1e-3
        key = (rec.program_hash, rec.op, core, rec.lowering, rec.kind, rec.nbytes, rec.direction)
        text = texts.get(key)
        if text is None:
            text = texts[key] = _clock_free_text(rec)
        rows.append((m, t_launch, rt_dur, hw_ts, hw_dur, fw_ts, rec.flow_id, text))
    return rows


def _clock_free_text(rec) -> tuple[str, str, str, str]:
    """The runtime event's opening, the args after the flow id, the hardware event's opening
    and the end of its args: the same for every execution of one Program by one op on one core."""
    core = rec.core
    rest = f',"program_hash":{js(rec.program_hash)},"op":{js(rec.op)},"core":{core},"lowering":{js(rec.lowering)}'
    n = len(rec.program) if rec.program is not None else 0
    if rec.kind == "memcpy":
        cat, extra = "memcpy", f',"bytes":{js(rec.nbytes)},"direction":{js(rec.direction)}'
    else:
        cat, extra = "hardware", ""
    rt_head = f'{{"ph":"X","cat":"runtime","name":{js("execute " + rec.op)},"pid":{RUNTIME},"tid":{core}'
    hw_head = f'{{"ph":"X","cat":"{cat}","name":{js(device_event_name(rec))},"pid":{HARDWARE},"tid":{core}'
    return rt_head, rest, hw_head, f',"modeled":true,"instructions":{n}{extra}}}}}'


def device_events(rows, prefix: str, fw_tid, *, cores: list | None = None, shift: float = 0.0,
                  fw_pid: int = FRAMEWORK) -> list[str]:
    """The runtime and hardware lanes and the flows linking each execution to its framework op.

    ``fw_tid``: the op's lane -- a dict (torch thread -> lane, by each matched's ``thread``; 0
    when missing) or a function of the matched; ``cores``: each row's core (``Placement.cores``),
    when known; ``shift`` moves the events onto another trace's clock."""
    if not rows:
        return []
    cores = [row[0].rec.core for row in rows] if cores is None else cores
    events = meta(RUNTIME, f"{prefix}/runtime") + meta(HARDWARE, f"{prefix}/hardware")
    for c in sorted(set(cores)):
        events += [f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{c},"args":{{"name":"core:{c}"}}}}'
                   for pid in (RUNTIME, HARDWARE)]
    if isinstance(fw_tid, dict):
        lanes = fw_tid
        fw_tid = lambda m: lanes.get(m.thread, 0)  # noqa: E731
    return events + _device_lanes(rows, fw_tid, shift, fw_pid)


def _device_lanes(rows, fw_tid, shift: float, fw_pid: int) -> list[str]:
    """Each
    row's runtime and hardware slices and flow events, as one text."""
    events = []
    for m, rt_ts, rt_dur, hw_ts, hw_dur, fw_ts, flow_id, (rt_head, rest, hw_head, hw_tail) in rows:
        core = m.rec.core
        rt, hw, queued = f"{rt_ts + shift:.3f}", f"{hw_ts + shift:.3f}", f"{rt_dur:.3f}"  # written twice each
        flow = f'{{"cat":"tilescope.flow","name":"launch","id":{flow_id}'
        events.append(
            f'{rt_head},"ts":{rt},"dur":{queued},"args":{{"flow_id":{flow_id}{rest},"queued_us":{queued},'
            f'"assumed_runtime_cost":true}}}},'
            f'{hw_head},"ts":{hw},"dur":{hw_dur:.3f},"args":{{"flow_id":{flow_id}{rest}{hw_tail},'
            f'{flow},"ph":"s","pid":{fw_pid},"tid":{fw_tid(m)},"ts":{fw_ts + shift:.3f}}},'
            f'{flow},"ph":"t","pid":{RUNTIME},"tid":{core},"ts":{rt}}},'
            f'{flow},"ph":"f","bp":"e","pid":{HARDWARE},"tid":{core},"ts":{hw}}}')
    return events


def unrecorded_launch_lanes(without_op, threads: dict) -> tuple[dict, list[str]]:
    """Framework lanes for the executions with no launching op among torch's events.

    torch records the ops of the thread that started its profiler only (its
    ``profile_all_threads`` is off by default), while the device records every execution, as
    CUPTI records every kernel: work launched from another thread -- or outside any op -- has no
    op to start its flow from. Each such launching thread gets a lane of its own, named by its
    system id, with a zero-length ``launch <op>`` slice where each execution was launched (its
    flow starts there, as :func:`placement` places it), rather than a flow from whatever op
    thread 0 ran at that time.

    ``without_op``: those executions (matched, their ``thread`` the launching thread's); ``threads``:
    the framework lanes (torch thread -> tid). Returns the lanes with those threads added
    (``threads`` itself when there are none) and their events.
    """
    lanes, events = threads, []
    for m in without_op:
        if lanes is threads:
            lanes = dict(threads)
        tid = lanes.get(m.thread)
        if tid is None:
            tid = lanes[m.thread] = len(lanes)
            events.append(f'{{"ph":"M","name":"thread_name","pid":{FRAMEWORK},"tid":{tid},'
                          f'"args":{{"name":"thread {m.native_tid} (no recorded ops)"}}}}')
        events.append(f'{{"ph":"X","cat":"launch","name":{js("launch " + m.rec.op)},"pid":{FRAMEWORK},'
                      f'"tid":{tid},"ts":{m.launch_us:.3f},"dur":0,"args":{{"flow_id":{m.rec.flow_id}}}}}')
    return lanes, events


def event_count(rows, cores: list | None = None) -> int:
    """How many events :func:`device_events` writes for ``rows`` (``cores``: each one's core, when known)."""
    if not rows:
        return 0
    return 2 + 2 * len(set(cores if cores is not None else [row[0].rec.core for row in rows])) + 5 * len(rows)


def doctor_events(rows) -> dict:
    """The runtime, hardware and memcpy slices of ``rows`` as the doctor's rules read them, by
    category; each category's list is made when a rule first asks for it (a function to call):
    at export most rules need none of them, and the host-copies rule looks at the hardware
    slices only when there are copies."""
    return {cat: functools.partial(_doctor_slices, rows, cat) for cat in ("runtime", "hardware", "memcpy")}


def _doctor_slices(rows, cat: str) -> list[dict]:
    out = []
    for row in rows:
        rec = row[0].rec
        if cat == "runtime":
            ts, dur = row[1], row[2]
        elif (rec.kind == "memcpy") == (cat == "memcpy"):
            ts, dur = row[3], row[4]
        else:
            continue
        args = {"flow_id": rec.flow_id, "program_hash": rec.program_hash, "op": rec.op, "core": rec.core,
                "lowering": rec.lowering}
        out.append({"ph": "X", "cat": cat, "ts": ts, "dur": dur, "args": args})
    return out
