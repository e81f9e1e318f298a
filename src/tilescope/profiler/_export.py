"""``Profiler(config).export_trace``: from a finished torch profile to a profile directory.

It reads the device executions from torch's raw events and -- in DEVICE mode -- writes one
executable plus instruction traces per Program that ran, lets torch parse, correlates device
time into torch's tables, then writes the system trace with framework / runtime / hardware
lanes linked by flows and torch's own framework trace (``trace.json``, device executions
added); all through the atomic writer (docs/profile-format.md).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import importlib
import json
import os
import socket
import sys
import threading
import time
import weakref
from pathlib import Path

import torch

from ..device import device_name, is_registered, now_ns, settings
from ..sim import simulate
from ._capture import capture
from ._config import ProfileConfig, ProfileMode
from ._correlate import Correlation, Matched
from ._doctor import diagnose
from ._events import (HOST, Framework, Placement, device_events, doctor_events, event_count, framework_events,
                      placement, unrecorded_launch_lanes)
from ._fast_files import read_file
from ._itrace import itrace_summary
from ._profile_writer import ProfileWriter
from ._lowering_stats import lowering_stats

__all__ = ["Profiler"]

# modules torch imports lazily as a profile starts: imported inside a with_stack window, their
# frames reach torch's parse with names it cannot decode (a UnicodeDecodeError that loses the
# whole profile, in ~1 of 4 fresh processes with the device registered): imported here, before any
# profile starts
for _lazy in ("torch.profiler._cupti_monitor", "torch.profiler.python_tracer"):
    with contextlib.suppress(ImportError):
        importlib.import_module(_lazy)

# torch's profiler activities by name: ``.name`` of a pybind11 enum compares the value with
# each member's in turn, a hash lookup is a third of that
_ACTIVITY_NAMES = {activity: name for name, activity in torch.profiler.ProfilerActivity.__members__.items()}


class Profiler:
    """Writes one profile directory per finished trace; pass ``export_trace`` as ``on_trace_ready``.

    ``path`` is the directory written last (``paths`` every one).

    While it is open it keeps the capture's listener subscribed (see ``_capture``), which takes
    every device call off the native dispatch fast path. It closes (:meth:`close`) when the
    torch profile it exports stops, when a ``with Profiler(cfg) as exporter:`` block ends, or
    when it is garbage; the last profiler to close gives the fast path back.
    """

    def __init__(self, config: ProfileConfig | None = None):
        self.config = config or ProfileConfig()
        self.paths: list[Path] = []
        self._sampler = _shared_sampler() if (self.config.has(ProfileMode.HOST_CPU)
                                               or self.config.has(ProfileMode.HOST_MEMORY)) else None
        self._hold = None  # releases this profiler's hold on the capture (once)
        self._watched: set[int] = set()  # ids of the torch profiles whose start/stop open/close it
        if self._device_in_use():
            _check_cores(self.config)
            self._open()

    def _open(self) -> None:
        if self._hold is None or not self._hold.alive:
            capture.acquire()
            self._hold = weakref.finalize(self, capture.release)

    def close(self) -> None:
        """Stop listening to the device (idempotent): torch profiles exported earlier keep their
        directories; an export after this still works from what torch recorded."""
        if self._hold is not None:
            self._hold()

    @property
    def closed(self) -> bool:
        return self._hold is None or not self._hold.alive

    def __enter__(self) -> "Profiler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _watch(self, prof) -> None:
        """Close when ``prof`` (the torch profile being exported) stops; open again if it starts
        again. Its first export is the first time this profiler sees it: a profile exported from
        its ``stop`` (no schedule) is closed after that export (see :meth:`export_trace`)."""
        if id(prof) in self._watched or not hasattr(prof, "stop") or not hasattr(prof, "start"):
            return
        self._watched.add(id(prof))
        me = weakref.ref(self)
        stop, start = prof.stop, prof.start

        def stop_then_close():
            try:
                stop()
            finally:
                if (p := me()) is not None:
                    p.close()

        def start_and_open():
            if (p := me()) is not None and p._device_in_use():
                p._open()
            start()

        prof.stop, prof.start = stop_then_close, start_and_open

    @staticmethod
    def _device_in_use() -> bool:
        # (the zero-code capture of a CUDA or CPU script: the simulated device is not registered)
        return (os.environ.get("TILESCOPE_PROFILE_DEVICE") or "sim").strip().lower() not in ("cuda", "cpu", "none")

    @property
    def path(self) -> Path | None:
        return self.paths[-1] if self.paths else None

    def export_trace(self, prof) -> Path:
        """The ``on_trace_ready`` callback."""
        try:
            with _collector_paused():
                return self._export(prof)
        finally:
            if _stopping(prof):
                self.close()  # the profile stopped: the listener is no longer needed
            else:
                self._watch(prof)

    def _export(self, prof) -> Path:
        cfg = self.config
        activities = sorted(_ACTIVITY_NAMES.get(a) or a.name for a in getattr(prof, "activities", ()))
        registered = is_registered()
        now = _runtime_now() if registered else float("inf")
        correlation = Correlation(prof, capture, now)  # the executions, before torch parses
        trace_start_ns = prof.profiler.kineto_results.trace_start_ns()
        with ProfileWriter(cfg.output_dir, config=cfg.to_dict()) as w:
            # made with the executables and instruction traces, whose contents depend on the
            # executions alone (one batch), and filled once torch has parsed. Not trace.json: torch writes it through a temporary file of its own and replaces
            # the file there, so a reserved one would only be removed again, on this thread.
            w.reserve("system_trace.json", "manifest.json")
            dropped, summaries = {}, []
            device_traces = cfg.has(ProfileMode.DEVICE)
            if device_traces and correlation.launches is not None:
                dropped, summaries = _write_device_traces(w, _captured(correlation.launches, cfg), cfg)
                device_traces = False
            w.start_writes()
            framework = None
            ids = correlation.range_ids()
            if ids:  # the device recorded executions: the framework lanes' pass also finds their ops
                correlation.parse()
                framework = framework_events(prof, _lane_prefix(), ids)
            matched, pending = correlation.complete(into_tables=cfg.correlate_device_time,
                                                    ranges=framework.by_id if framework else None)
            use_device = getattr(prof.profiler, "use_device", None)  # set by ProfilerActivity.PrivateUse1
            device = _device_info(sim=bool(matched) or (registered and use_device is not None))
            device["activities"] = activities
            device["device_columns"] = use_device
            w.device = device
            matched = _captured(matched, cfg)
            if device_traces:  # torch had parsed before the export: no launches known earlier
                dropped, summaries = _write_device_traces(w, matched, cfg)
            placed = placement(matched)
            sim = device["kind"] == "sim"
            unlinked = _captured(correlation.without_op, cfg)  # executions with no launching op
            if sim:  # written and hashed before torch exports its own trace
                chunks, n_events, checked = _system_trace(prof, placed, trace_start_ns, cfg, self._sampler, framework,
                                                          unlinked)
                w.write_bytes("system_trace.json", _system_trace_parts(chunks, device), later=True)
                w.start_writes()
            trace_path = _torch_trace(w, prof)
            unrecorded = [row for row in placed.rows if not row[0].recorded_by_torch] if correlation.marked else []
            if sim and not unrecorded and not correlation.pending_recorded:
                # torch's file as torch wrote it (it recorded the device executions itself):
                # read and hashed before the stats are made and the doctor reads
                # what is in memory (the manifest waits for its digest after that)
                w.add_written("trace.json")
                w.start_writes()
            else:
                fw_data = read_file(trace_path)
                trace = _framework_trace_with_device(fw_data, prof, unrecorded, correlation.pending_recorded)
                if trace is fw_data:
                    w.add_written("trace.json", fw_data)
                else:
                    w.write_bytes("trace.json", trace)
            if not sim:  # a real device: lanes and flows come from Kineto's own records
                chunks, n_events, checked = _kineto_system_trace(fw_data)
                w.write_bytes("system_trace.json", _system_trace_parts(chunks, device), later=True)
                w.start_writes()
            # the first execution of its Program in this process: its cost includes building it
            cold = [m for m in matched if m.rec.first_run]
            w.stats = {
                "events": n_events, "executions": len(matched), "pending_executions": pending,
                "dropped_events": dropped, "record_buffer_drops": capture.dropped,
                "cold_executions": len(cold), "cold_ops": sorted({m.rec.op for m in cold})[:8],
                "executions_without_op": len(unlinked), "threads_without_ops": len({m.native_tid for m in unlinked}),
                "launch_interval_us": capture.launch_intervals_us(m.launch_us for m in matched),
                **lowering_stats(m.rec for m in matched),  # which rule modeled what, the generic share
                **({"lowering_declines": _lowering_declines()} if sim else {}),
            }
            # its findings are told once the profile is complete
            findings = _findings(w.path, w.manifest(files=False), checked, summaries)
            w.seal()  # the manifest, written last
            if correlation.marked:  # the markers' records, kept by the capture
                capture.forget(m.rec.flow_id for m in matched if not m.recorded_by_torch)
        self.paths.append(w.path)
        for f in findings:
            print(f"tilescope doctor: [{f.severity}] {f.code}: {f.message} (fix: {f.fix})", file=sys.stderr)
        return w.path


def _stopping(prof) -> bool:
    """Whether torch's ``prof`` is exporting from inside its own ``stop`` (its last export; a
    ``step`` that ends an active window exports too, and the profile goes on): its class's
    ``stop`` is on the call stack with ``prof`` as ``self``."""
    code = getattr(getattr(type(prof), "stop", None), "__code__", None)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code and frame.f_locals.get("self") is prof:
            return True
        frame = frame.f_back
    return False


def _check_cores(cfg: ProfileConfig) -> None:
    """``capture_cores`` naming a core the device does not have would capture nothing."""
    cores = settings().preset.cores_per_chip
    missing = sorted(c for c in cfg.cores or () if c >= cores)
    if missing:
        raise ValueError(f"capture_cores {cfg.capture_cores!r}: the device has {cores} core(s), 0-{cores - 1}; "
                         f"{', '.join(map(str, missing))} is not one of them")


def _captured(matched, cfg: ProfileConfig) -> list:
    if cfg.cores is None:  # every core (the default): no copy
        return matched
    return [m for m in matched if cfg.captures(m.rec.core)]


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off for the export's duration.

    The export allocates ~10^5 short-lived containers (event and instruction records) in a
    process where torch keeps ~3x10^5 tracked objects; each full collection it triggers walks
    all of them, which more than doubled the export's time. Nothing the export makes is cyclic
    garbage (reference counting frees it), and the collector's previous state is restored.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _findings(path: Path, manifest: dict, checked: dict, summaries: list) -> list:
    """The doctor runs at export too, on what is in memory (``checked``: the system trace's
    ``events``, or its ``slices`` as the doctor indexes them); its warnings and errors (one
    line each on stderr)."""
    return [f for f in diagnose(path, summaries=summaries, trusted=True, manifest=manifest, **checked)
            if f.severity != "info"]


def _lowering_declines() -> list[dict]:
    """The calls lowering rules declined in this process (why an op took a later rule, or the
    generic one), most first: :func:`tilescope.lower.declines`."""
    from ..lower import declines

    return [{"rule": rule, "reason": reason, "calls": n} for rule, reason, n in declines()[:20]]


def _runtime_now() -> float:
    return now_ns()


def _device_info(sim: bool) -> dict:
    """Which device the profiled code ran on: the simulator, a GPU, or the CPU alone."""
    if not sim:
        if torch.cuda.is_available():
            return {"kind": "cuda", "name": torch.cuda.get_device_name(0),
                    "measured_on": torch.cuda.get_device_name(0)}
        import platform

        return {"kind": "cpu", "name": "cpu", "measured_on": platform.processor() or platform.machine()}
    s = settings()
    return {"kind": "sim", "name": device_name(), "preset": s.preset.name,
            "preset_fingerprint": s.preset.fingerprint, "clock": s.clock, "numerics": s.numerics,
            "assumed": {"runtime_exec_us": s.preset.runtime_exec_us, "host_dispatch_us": s.preset.host_dispatch_us}}


def _meta(pid: int, name: str) -> list[dict]:
    return [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}]


def _lane_prefix() -> str:
    return f"{socket.gethostname().split('.')[0] or 'host'}/pid:{os.getpid()}"


def _torch_trace(w: ProfileWriter, prof) -> str:
    """torch's Chrome trace, exported where the profile's trace.json goes (and rewritten there
    when device events are added); its path."""
    path = w.target("trace.json")
    prof.export_chrome_trace(path)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:  # torch logs a failed write and goes on
        directory = os.path.dirname(path)
        try:
            free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
        except OSError:
            free = None
        full = free is not None and free < (1 << 20)
        raise OSError(errno.ENOSPC if full else errno.EIO,
                      "torch's profiler could not write its trace"
                      + (f" ({free:,} bytes free on that file system: the disk is full)" if full else
                         "" if free is None else f" ({free:,} bytes free on that file system)"), path)
    return path


def _kineto_system_trace(fw_data: bytes) -> tuple[list[str], int, dict]:
    """The system trace's events (JSON text), how many there are, and what the doctor reads
    (the events themselves)."""
    from ._kineto import system_trace_from_kineto

    events = system_trace_from_kineto(json.loads(fw_data), socket.gethostname().split(".")[0] or "host", os.getpid())
    text = [json.dumps(events, separators=(",", ":"), allow_nan=False)[1:-1]] if events else []
    return text, len(events), {"events": events}


def _system_trace(prof, placed: Placement, trace_start_ns: int, cfg: ProfileConfig, sampler,
                  framework: Framework | None = None, without_op=()) -> tuple[list[str], int, dict]:
    """The system trace's events (JSON text), how many there are, and what the doctor reads:
    the slices by category, and those with a name (the framework ranges); ``framework``: the
    framework lanes, when made already; ``without_op``: the executions with no launching op
    (:attr:`Correlation.without_op`), on lanes of their launching threads."""
    prefix = _lane_prefix()
    fw_chunks, n_events, threads, named, end_us, _ = framework or framework_events(prof, prefix)
    chunks = list(fw_chunks)  # extended below; the framework's own list stays as it was made
    by_cat: dict[str, list[dict]] = {}
    rows = placed.rows
    if cfg.has(ProfileMode.RUNTIME) and rows:
        threads, launch_lanes = unrecorded_launch_lanes(without_op, threads)
        chunks += launch_lanes
        n_events += len(launch_lanes)
        chunks += device_events(rows, prefix, threads, cores=placed.cores)
        n_events += event_count(rows, placed.cores)
        by_cat = doctor_events(rows)
        end_us = max(end_us, placed.end)
    for e in named:
        by_cat.setdefault(e["cat"], []).append(e)
    if sampler is not None:
        host = sampler.events(trace_start_ns, cfg, end_us)
        chunks += [json.dumps(e, separators=(",", ":")) for e in host]
        n_events += len(host)
    return chunks, n_events, {"slices": (by_cat, named)}


def _system_trace_parts(chunks: list[str], device: dict) -> tuple[bytes, ...]:
    """The system trace file as parts to write one after the other: its events (``chunks``,
    each one or more events' text) are never joined into one buffer -- at 10^5 events that
    copy, and the page faults of the fresh memory it takes, cost milliseconds."""
    tail = json.dumps({"tilescope": {"modeled_device": device["kind"] == "sim", "clock": device.get("clock")}})
    parts = [b'{"traceEvents":[']
    for chunk in chunks:
        parts += (chunk.encode(), b",")
    if chunks:
        parts.pop()  # the last separator
    parts.append(f'],"displayTimeUnit":"ns","metadata":{tail}}}'.encode())
    return tuple(parts)


def _framework_trace_with_device(data: bytes, prof, rows, pending: list[int] = ()) -> bytes:
    """torch's own Chrome trace with the device executions of ``rows`` (and their flows) added
    -- the placement rows of those torch did not record itself (its trace has the others, as
    ``kernel`` / ``gpu_memcpy`` events linked to their ops by ``External id``) -- less the
    ``pending`` ones torch recorded (still running at export: left out, as from its tables).

    torch's timestamps are ``(trace start - baseTimeNanoseconds) / 1000`` µs ahead of the
    event times the correlation used, and its framework lanes are (pid, system thread id): the
    device events are spliced into the file's text without parsing it (a large trace would
    cost more to parse than everything else the export does)."""
    import re

    if pending:  # rare (a missing synchronize): worth parsing the trace for
        drop = {str(flow) for flow in pending}
        doc = json.loads(data)
        doc["traceEvents"] = [e for e in doc.get("traceEvents", []) if not (
            e.get("cat") in ("kernel", "gpu_memcpy") and str((e.get("args") or {}).get("flow_id")) in drop)]
        data = json.dumps(doc).encode()
    if not rows:
        return data
    head = data[:4096].decode("utf-8", "replace")
    base = re.search(r'"baseTimeNanoseconds":\s*(\d+)', head)
    cut = data.rfind(b"]", 0, data.rfind(b'"traceName"')) if b'"traceName"' in data[-4096:] else -1
    if base is None or cut < 0:
        return _framework_trace_parsed(data, prof, rows)
    shift = (prof.profiler.kineto_results.trace_start_ns() - int(base.group(1))) / 1000.0
    extra = device_events(rows, _lane_prefix(), lambda m: m.native_tid, shift=shift, fw_pid=os.getpid())
    return b"".join((data[:cut], b",\n", ",".join(extra).encode(), data[cut:]))


def _framework_trace_parsed(data: bytes, prof, rows) -> bytes:
    """The slow path: parse torch's trace and shift by a matched event (any trace layout)."""
    doc = json.loads(data)
    events = doc.get("traceEvents", [])
    by_ext = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ext = e.get("args", {}).get("External id")
            if ext is not None:
                by_ext.setdefault(ext, e)
    shift = None
    for evt in prof.profiler.function_events:
        e = by_ext.get(evt.id)
        if e is not None and e.get("name") == evt.name:
            shift = e["ts"] - evt.time_range.start
            break
    if shift is None:
        return data
    extra = device_events(rows, _lane_prefix(), lambda m: m.native_tid, shift=shift, fw_pid=os.getpid())
    doc["traceEvents"] = events + json.loads("[" + ",".join(extra) + "]")
    return json.dumps(doc).encode()


def _write_device_traces(w: ProfileWriter, matched, cfg: ProfileConfig) -> dict:
    """Executables and instruction traces; keeps at most ``max_events_per_core`` rows per core,
    dropping the oldest runs first (a ring buffer), and returns the drops per core."""
    if cfg.device_profile == "first":  # each Program's first run in the trace
        firsts: dict[str, Matched] = {}
        for m in matched:  # (once per execution: as little as it can be)
            prog = m.rec.program
            if prog is not None and prog.hash not in firsts:
                firsts[prog.hash] = m
        chosen = [(m, 0) for m in firsts.values()]
        programs = [m.rec.program for m in firsts.values()]
    else:
        runs: dict[str, int] = {}
        programs = []  # every Program that ran, in order of first run
        chosen = []
        for m in matched:
            prog = m.rec.program
            if prog is None:
                continue
            run = runs.get(prog.hash, 0)
            runs[prog.hash] = run + 1
            if run == 0:
                programs.append(prog)
            chosen.append((m, run))
    per_core: dict[int, int] = {}
    dropped: dict[str, int] = {}
    keep = []
    for m, run in reversed(chosen):  # newest first: the ring buffer keeps the latest events
        rows = len(m.rec.program)
        core = m.rec.core
        if per_core.get(core, 0) + rows > cfg.max_events_per_core:
            dropped[str(core)] = dropped.get(str(core), 0) + rows
            continue
        per_core[core] = per_core.get(core, 0) + rows
        keep.append((m, run))
    summaries = []
    for m, run in reversed(keep):
        rec = m.rec
        result = simulate(rec.program)
        summaries.append(itrace_summary(rec.program, result))
        w.add_itrace(rec.program, result, run, execution={
            "flow_id": rec.flow_id, "core": rec.core, "op": rec.op, "lowering": rec.lowering,
            "start_us": round(m.launch_us + (rec.device_start_ns - rec.host_submit_ns) / 1000.0, 3),
        })
        if cfg.executable_cache_dir:
            _cache_executable(cfg.executable_cache_dir, rec.program)
    for prog in programs:  # every Program that ran has its executable, traced or not
        w.add_executable(prog)
    return dropped, summaries


def _cache_executable(directory: str, program) -> None:
    path = Path(directory) / f"exec_{program.hash}.json"
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(program.dumps())
    os.replace(tmp, path)


_SAMPLER: "_HostSampler | None" = None


def _shared_sampler() -> "_HostSampler":
    """The process's one host sampler (each profiler used to start a thread that never stopped)."""
    global _SAMPLER
    if _SAMPLER is None or not _SAMPLER.alive:  # (a forked child starts its own)
        _SAMPLER = _HostSampler()
    return _SAMPLER


class _HostSampler:
    """Samples host CPU utilisation and resident memory every 10 ms, on a daemon thread."""

    def __init__(self, interval_s: float = 0.01):
        self.samples: list[tuple[int, float, int]] = []
        self._interval = interval_s
        self._thread = threading.Thread(target=self._run, name="tilescope-host-sampler", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        last_wall, last_cpu = time.time_ns(), time.process_time_ns()
        while True:
            time.sleep(self._interval)
            wall, cpu = time.time_ns(), time.process_time_ns()
            util = (cpu - last_cpu) / max(1, wall - last_wall)
            rss = 0
            try:
                with open("/proc/self/statm") as f:
                    rss = int(f.read().split()[1]) * page
            except OSError:
                pass
            self.samples.append((wall, util, rss))
            if len(self.samples) > 100_000:
                del self.samples[:50_000]
            last_wall, last_cpu = wall, cpu

    def events(self, trace_start_ns: int, cfg: ProfileConfig, end_us: float) -> list[dict]:
        out = _meta(HOST, f"{_lane_prefix()}/host")
        for wall, util, rss in list(self.samples):
            ts = (wall - trace_start_ns) / 1000.0
            if ts < 0 or ts > end_us:
                continue
            if cfg.has(ProfileMode.HOST_CPU):
                out.append({"ph": "C", "name": "host CPU", "pid": HOST, "tid": 0, "ts": round(ts, 3),
                            "args": {"cpu_util": round(util, 4)}})
            if cfg.has(ProfileMode.HOST_MEMORY):
                out.append({"ph": "C", "name": "host memory", "pid": HOST, "tid": 0, "ts": round(ts, 3),
                            "args": {"rss_bytes": rss}})
        return out
