"""The runtime: per-core queues on a modeled clock, execution records, listeners.

Every device execution goes through :func:`submit`. Its time is decided there, at
submission, from the model alone (DESIGN, "Time semantics"):

* host submit time: the real ``perf_counter_ns`` (``clock="wall"``) or a virtual host
  clock advanced by the preset's *assumed* ``host_dispatch_us`` per execution
  (``clock="virtual"``);
* queued (the runtime can start it): submit + the preset's *assumed* ``runtime_exec_us``;
* device start: max(queued, end of the previous execution on that core);
* device end: start + the Program's modeled duration.

Numerics are a separate matter: the work item goes to the device worker thread
(:mod:`tilescope.device._worker`). :func:`synchronize` waits for both -- the
worker, and in wall mode the modeled end in wall-clock time.

Each execution produces one :class:`Execution` record, given to every listener
(:func:`subscribe`) on the submitting thread, inside the aten op that launched it.
While torch's profiler records device activities, each execution is also handed to the
device's activity profiler for Kineto (``_csrc/profiler.cpp``): torch then records it
itself, as it records CUDA kernels (see :func:`use_device_profiler`).
"""

from __future__ import annotations

import os
import threading
import time
from typing import NamedTuple

from . import _settings, _worker

__all__ = [
    "Execution", "submit", "synchronize", "subscribe", "unsubscribe", "recording", "now_ns", "core_end_ns",
    "reset_clocks", "counters", "activity_name", "use_device_profiler", "take_device_activities",
    "keep_recorded", "DeviceActivities",
]


class Execution(NamedTuple):
    """One device execution, as the runtime scheduled it (immutable). Times are nanoseconds.

    A named tuple rather than a frozen dataclass: one is made per device execution while
    anything listens (a profiler does), inside the user's op, and a frozen dataclass's
    constructor costs ~8x a tuple's (3.6 vs 0.45 us, 20 fields).

    Attributes:
        flow_id: unique id linking the framework op, this runtime record and the
            hardware execution (profiles draw it as a flow).
        op: what ran (``"aten::add.Tensor"``, ``"memcpy HtoD"``, a custom op's name).
        kind: ``"kernel"`` or ``"memcpy"``.
        lowering: the lowering rule that made the Program (``"elementwise"``,
            ``"generic"``, ``"fused:rms_norm"``, ``"dma"``, ...).
        program: the Program that ran (its instruction trace comes from
            ``tilescope.sim.simulate(program)``).
        program_hash: ``program.hash``.
        core, stream: where it ran (``sim:<core>``, stream 0 is the default stream).
        thread_id: the host thread that submitted it.
        host_submit_ns: host time of submission, in the runtime's clock (:func:`now_ns`).
        queued_ns: submit + the assumed runtime cost per execution.
        device_start_ns, device_end_ns: modeled execution window on the core.
        modeled_ns: the Program's modeled duration (from the simulator).
        runtime_ns: the assumed runtime cost per execution (preset ``runtime_exec_us``).
        nbytes: bytes moved (copies) or HBM bytes touched (kernels), modeled.
        direction: ``"HtoD"``, ``"DtoH"`` or ``"DtoD"`` for copies, else None.
        clock: ``"wall"`` or ``"virtual"``.
        first_run: the first execution of this Program in this process (its lowering and
            modeled time were built for it: a cold start).
        recorded_by_torch: torch's profiler recorded it as a device activity (through the
            device's activity profiler for Kineto, see :func:`use_device_profiler`).
    """

    flow_id: int
    op: str
    kind: str
    lowering: str
    program: object
    program_hash: str
    core: int
    stream: int
    thread_id: int
    host_submit_ns: float
    queued_ns: float
    device_start_ns: float
    device_end_ns: float
    modeled_ns: float
    runtime_ns: float
    nbytes: int
    direction: str | None
    clock: str
    first_run: bool = False
    recorded_by_torch: bool = False

    @property
    def duration_ns(self) -> float:
        return self.device_end_ns - self.device_start_ns


_new_execution = tuple.__new__  # Execution from its fields, without the named tuple's Python-level __new__


class _State:
    """Mutable runtime state; one per process. The clocks (each core's end of its last
    execution, the virtual host clock, the flow ids) live in the native runtime
    (``_csrc/worker.cpp``), which the dispatch fast path schedules on too."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.listeners: tuple = ()  # called for every execution
        self.recorded_listeners: tuple = ()  # those among them also called for the executions torch records
        self.keep_recorded = False  # the device's profiler keeps the records of the executions torch records
        self.keep_limit = 0  # how many per session (keep_recorded)
        self.ran: set[str] = set()  # Program hashes executed in this process
        self.native = None  # the native runtime module, once the device is registered
        self.device_profiler = None  # its profiler_record, while torch may record device activities
        self.apply(_settings.settings())

    def apply(self, s: _settings.Settings) -> None:
        self.settings = s
        self.virtual = s.clock == "virtual"
        self.numerics = s.numerics
        self.blocking = s.blocking
        self.clock = s.clock
        self.dispatch_ns = s.preset.host_dispatch_us * 1000.0
        self.runtime_ns = s.preset.runtime_exec_us * 1000.0
        if self.native is not None:
            self.native.clock_configure(self.virtual, self.dispatch_ns, self.runtime_ns, s.preset.cores_per_chip)
        self.update_fast_path()

    def update_fast_path(self) -> None:
        """The native dispatch fast path runs only where Python need not see each execution:
        no listener, not blocking (see ``_csrc/dispatch.cpp``)."""
        if self.native is not None:
            s = self.settings
            self.native.fast_enable(bool(s.fast_dispatch and not s.blocking and not self.listeners))
            self.native.fast_numerics(bool(s.numerics))


_S = _State()


def _on_settings(old: _settings.Settings, new: _settings.Settings) -> None:
    if old.preset != new.preset or old.clock != new.clock or old.numerics != new.numerics:
        synchronize()
    if old.preset != new.preset and _S.native is not None:
        _S.native.fast_forget()  # the signatures it learned carry the old preset's modeled times
    if old.preset != new.preset or old.clock != new.clock:
        reset_clocks(_state_settings=new)
    else:
        _S.apply(new)


def attach(native) -> None:
    """Keep the runtime's clocks in the native runtime (at registration)."""
    _S.native = native
    _S.apply(_S.settings)


_settings.on_change(_on_settings)


def activity_name(kind: str, op: str) -> str:
    """The name an execution has in torch's tables and traces: ``exec_running <op>``, or for a
    copy ``memcpy <op>`` -- its op when that says so already (``memcpy HtoD``).

    >>> activity_name("kernel", "aten::mul.Tensor"), activity_name("memcpy", "memcpy HtoD")
    ('exec_running aten::mul.Tensor', 'memcpy HtoD')
    """
    if kind != "memcpy":
        return f"exec_running {op}"
    return op if op.startswith("memcpy ") else f"memcpy {op}"


def use_device_profiler(native, on: bool = True) -> bool:
    """Hand executions to the device's activity profiler for Kineto (``on``), or not: without
    it, torch.profiler sees no device activity and tilescope's profiler marks each launch in
    torch's CPU events instead. Returns whether it is in use (torch built without Kineto has
    none). ``TILESCOPE_DEVICE_PROFILER=0`` turns it off at registration."""
    available = bool(native is not None and native.profiler_available())
    on = bool(on and available)
    if available:
        native.profiler_enable(on)
        native.profiler_keep(_S.keep_limit)
    _S.native = native
    _S.device_profiler = native.profiler_record if on else None
    _S.keep_recorded = _S.keep_limit > 0 and available
    return on


# Kineto starts the device's session ~0.1 ms after torch starts its trace: a session that started
# outside this window belongs to another trace
_SESSION_START_WINDOW_NS = (1_000_000, 20_000_000)  # before, after the trace's start


class DeviceActivities(NamedTuple):
    """What the device recorded in one profiling session (:func:`take_device_activities`), in the
    forms the profiler's correlation reads (made by the device's profiler: the export would
    otherwise make them in Python, once per execution)."""

    launches: list  # (flow id, 0, launch time in us from the trace start, None), by flow id
    ranges: dict  # flow id -> correlation ids of its linked range (0: none), then of those around it
    range_ids: set  # every such id but 0
    records: dict  # flow id -> (Execution, launching thread's system id), where kept (keep_recorded)
    dropped: int  # records the limit let go

    @classmethod
    def none(cls) -> "DeviceActivities":
        """A session in which the device recorded nothing."""
        return cls([], {}, set(), {}, 0)


def take_device_activities(trace_start_ns: int) -> DeviceActivities:
    """The executions the device recorded in the profiling session whose trace started at
    ``trace_start_ns`` (handed over once; empty when it recorded none): each launch's ``(flow
    id, 0, launch time in us from trace_start_ns, None)`` -- the 0 and None stand for torch's
    thread and launching op, found once torch has parsed --, the correlation ids of the range
    it is linked to and of the ranges around that one (innermost first, up to 3), and the
    runtime's records of them while :func:`keep_recorded` asked for them."""
    taken = (_S.native.profiler_take(int(trace_start_ns), *_SESSION_START_WINDOW_NS, Execution)
             if _S.native is not None else None)
    return DeviceActivities(*taken[1:]) if taken is not None else DeviceActivities.none()


def reset_clocks(*, _state_settings: _settings.Settings | None = None) -> None:
    """Start the modeled clocks afresh (virtual host time 0, every core idle)."""
    with _S.lock:
        _S.apply(_state_settings or _S.settings)
        if _S.native is not None:
            _S.native.clock_reset(0.0 if _S.virtual else float(time.perf_counter_ns()))


def now_ns() -> float:
    """The host's current time in the runtime's clock (virtual or ``perf_counter_ns``)."""
    if _S.virtual:
        return _S.native.clock_vhost() if _S.native is not None else 0.0
    return float(time.perf_counter_ns())


def core_end_ns(core: int | None = None) -> float:
    """Modeled end of the last execution submitted to ``core`` (all cores if None)."""
    if _S.native is None:
        return 0.0
    return _S.native.clock_core_end(-1 if core is None else core)


def counters() -> dict:
    """Executions and modeled busy time per core since the clocks were reset."""
    if _S.native is None:
        n = _S.settings.preset.cores_per_chip
        return {"executions": [0] * n, "busy_ns": [0.0] * n}
    executions, busy = _S.native.clock_counters()
    return {"executions": list(executions), "busy_ns": list(busy)}


def subscribe(fn, *, recorded: bool = True) -> None:
    """Call ``fn(execution)`` for every execution, on the submitting thread.

    ``recorded=False``: not for the executions torch's profiler records (the profiler capture
    takes those from the device's profiler, see :func:`keep_recorded`).
    """
    with _S.lock:
        if fn not in _S.listeners:
            _S.listeners = _S.listeners + (fn,)
            if recorded:
                _S.recorded_listeners = _S.recorded_listeners + (fn,)
            _S.update_fast_path()


def keep_recorded(limit: int = 2_000_000) -> int:
    """Have the device's profiler keep the runtime's record of each execution torch's profiler
    records -- up to ``limit`` per session, the others counted as dropped; 0 stops -- for
    :func:`take_device_activities` to hand over with the session's launches.

    It is how the profiler capture keeps what a profiled window ran: the records stay in the
    device's C++ profiler, as plain values, with no Python object kept and no listener called
    per execution -- this runs inside the user's op, once per device execution, and a Python
    call there cost more than everything else the capture did. Returns the previous limit.
    """
    limit = max(0, int(limit))
    with _S.lock:
        if _S.native is not None:
            _S.native.profiler_keep(limit)
        previous, _S.keep_limit = _S.keep_limit, limit
        _S.keep_recorded = limit > 0 and _S.native is not None and _S.native.profiler_available()
        return previous


class recording:
    """``with recording() as execs:`` collects every Execution submitted inside the block."""

    def __init__(self):
        self.executions: list[Execution] = []

    def __enter__(self) -> list:
        subscribe(self.executions.append)
        return self.executions

    def __exit__(self, *exc) -> None:
        unsubscribe(self.executions.append)


def unsubscribe(fn) -> None:
    """Stop calling ``fn`` (bound methods compare equal, so ``unsubscribe(recs.append)`` works)."""
    with _S.lock:
        _S.listeners = tuple(f for f in _S.listeners if f != fn)
        _S.recorded_listeners = tuple(f for f in _S.recorded_listeners if f != fn)
        _S.update_fast_path()


def submit(core: int, op: str, kind: str, lowering: str, program, modeled_ns: float,
           work, nbytes: int = 0, direction: str | None = None, extra_wait_core: int | None = None,
           want_record: bool = False):
    """Schedule one execution; queue its numerics ``work`` = ``(fn, args, kwargs, label)``.

    Returns the device end time (ns), or the :class:`Execution` with ``want_record``.
    ``extra_wait_core``: a second core whose pending work must finish first (copies
    between cores).
    """
    s = _S
    flow, host, queued, start, end = s.native.clock_submit(core, modeled_ns,
                                                           -1 if extra_wait_core is None else extra_wait_core)
    key = program.hash if program is not None else ""
    first = key not in s.ran
    if first:
        s.ran.add(key)
    record = s.device_profiler
    if record is not None and _profiler_enabled():  # torch records it (profiler.cpp), with our record if kept
        recorded = (record(flow, op, kind == "memcpy", core, host, start, end, queued, modeled_ns, s.runtime_ns,
                           nbytes, lowering, program, key, direction, s.clock, first) if s.keep_recorded
                    else record(flow, op, kind == "memcpy", core, host, start, end))
    else:
        recorded = False
    listeners = s.recorded_listeners if recorded else s.listeners
    rec = None
    if listeners or want_record:
        rec = _new_execution(Execution, (flow, op, kind, lowering, program, key, core, 0, threading.get_ident(), host,
                                         queued, start, end, modeled_ns, s.runtime_ns, nbytes, direction, s.clock,
                                         first, recorded))
        for fn in listeners:
            fn(rec)
    if work is not None and s.numerics:
        _worker.put(work)
        if s.blocking:
            _worker.wait()
    return rec if want_record else end


def wait_numerics() -> None:
    """Wait until the worker has computed everything submitted so far (raises its errors)."""
    _worker.wait()


def synchronize(core: int | None = None, *, label: str | None = "tilescope::synchronize") -> None:
    """Return when the work submitted so far is done: numerics computed and, in wall
    mode, modeled device time elapsed in wall-clock time. In virtual mode the host
    clock jumps to the device's end instead of sleeping.

    While torch's profiler records, the wait is a range named ``label`` on the host thread
    (``tilescope::synchronize``: the profiles' "synchronize waits", which the doctor looks
    for per step); None records none.
    """
    if label is not None and _profiler_enabled():
        import torch

        with torch.profiler.record_function(label):
            _synchronize(core)
        return
    _synchronize(core)


def _profiler_enabled() -> bool:
    import sys

    prof = sys.modules.get("torch.autograd.profiler")
    return bool(prof is not None and prof._is_profiler_enabled)


def _synchronize(core: int | None) -> None:
    _worker.wait()
    _host_waits_until(core_end_ns(core))


def wait_until(end_ns: float) -> None:
    """Host waits for one execution that ends at ``end_ns`` (a data-dependent read)."""
    _worker.wait()
    _host_waits_until(end_ns)


def _host_waits_until(end_ns: float) -> None:
    """The host's clock reaches ``end_ns``: moved forward (virtual clock) or slept to (wall clock)."""
    if _S.virtual:
        if _S.native is not None:
            _S.native.clock_advance_vhost(end_ns)
        return
    remaining = end_ns - time.perf_counter_ns()
    if remaining > 0:
        time.sleep(remaining / 1e9)


def settings() -> _settings.Settings:
    return _S.settings


def _after_fork_in_child() -> None:
    _S.lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
