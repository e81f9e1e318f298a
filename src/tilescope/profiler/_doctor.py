"""The doctor: common profiling mistakes, found in a profile directory.

Each rule is one row of ``RULES``: a code, what it checks, and a function that
returns a message (the problem, with numbers) or None. The checklist follows the
mistakes users of the real toolchain report: no device activity, no device
column, no synchronize inside the profiled loop, unmatched executable / trace
pairs, an incomplete directory, dropped events, and signs of slow programs.

>>> import tempfile
>>> from tilescope.profiler import ProfileWriter
>>> from tilescope.profiler._doctor import diagnose
>>> with ProfileWriter(tempfile.mkdtemp(), device={"kind": "sim"}) as w:
...     _ = w.write_json("system_trace.json", {"traceEvents": []})
>>> [f.code for f in diagnose(w.path)]
['no-device-activity']
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

from ._lowering_stats import generic_message, lowering_stats
from ._reader import Profile, ProfileFormatError, read_profile

__all__ = ["Finding", "diagnose", "RULES"]


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str  # "error" | "warning" | "info"
    message: str
    fix: str

    def __str__(self) -> str:
        return f"[{self.severity}] {self.code}: {self.message}\n    fix: {self.fix}"


class _Ctx:
    """What the rules look at, loaded once."""

    def __init__(self, prof: Profile, events: list | None = None, summaries: list | None = None,
                 trusted: bool = False, slices: tuple | None = None):
        self.prof = prof
        self.manifest = prof.manifest or {}
        self.config = self.manifest.get("config", {})
        self.device = self.manifest.get("device", {})
        self.stats = self.manifest.get("stats", {})
        if slices is not None:  # indexed by the caller (the exporter knows what each event is)
            self._slices = slices
        else:
            self.events = events if events is not None else self._events()
        self.summaries = summaries
        self.trusted = trusted  # just written by this process: pairs and checksums are known good

    def _events(self) -> list[dict]:
        path = self.prof.path / "system_trace.json"
        if not path.exists():
            return []
        try:
            doc = json.loads(path.read_bytes())
        except json.JSONDecodeError:
            return []
        return [e for e in doc.get("traceEvents", []) if isinstance(e, dict)]

    def cat(self, name: str) -> list[dict]:
        """The slices (``ph`` X) of category ``name``."""
        found = self._slices[0].get(name, [])
        if callable(found):  # made when first asked for (see diagnose's slices)
            found = self._slices[0][name] = found()
        return found

    def named(self, name: str) -> list[dict]:
        """The slices whose name starts with ``name`` (``ProfilerStep``, ``tilescope::synchronize``)."""
        return [e for e in self._slices[1] if e["name"].startswith(name)]

    @cached_property
    def _slices(self) -> tuple[dict, list]:
        """One pass over the events: the slices by category, and those with a name (from a
        file, every slice; at export, the framework ranges -- the device slices passed then
        have none)."""
        by_cat: dict = {}
        named = []
        for e in self.events:
            if e.get("ph") == "X":
                if isinstance(e.get("cat"), str):  # (a profile from elsewhere may have anything there)
                    by_cat.setdefault(e["cat"], []).append(e)
                if isinstance(e.get("name"), str):
                    named.append(e)
        return by_cat, named


def _incomplete(c: _Ctx):
    if c.prof.problems:
        return "the profile directory is incomplete: " + "; ".join(c.prof.problems)


def _no_device_activity(c: _Ctx):
    if c.device.get("kind") != "sim" or c.stats.get("executions"):
        return None
    if not c.cat("hardware") and not c.cat("runtime"):
        return ("the profile has no device executions: no runtime or hardware events were recorded "
                "while the profiler was active")


def _not_correlated(c: _Ctx):
    if c.device.get("kind") != "sim":
        return None
    if c.config.get("correlate_device_time") is False:
        return "correlate_device_time=False: key_averages() has no device-time columns (Self SIM, SIM total)"
    if "device_columns" in c.device and not c.device["device_columns"] and c.stats.get("executions"):
        activities = c.device.get("activities") or []
        return (f"device executions ran, but the profiler's activities were {', '.join(activities) or 'none'}: "
                f"without ProfilerActivity.PrivateUse1, key_averages() has no device-time columns")


def _unsynchronized(c: _Ctx):
    pending = c.stats.get("pending_executions", 0)
    if pending:
        return (f"{pending} device execution(s) were still running when the trace was exported, so their "
                f"device time is missing from the profile")
    # torch synchronises the device when the trace stops, after the last step has ended: a step
    # that launched device work without synchronising inside attributes it to the wrong step
    steps = c.named("ProfilerStep")
    if not steps:  # (no schedule: nothing to check, and the device slices are not needed)
        return None
    syncs = [e["ts"] for e in c.named("tilescope::synchronize") if e["name"] == "tilescope::synchronize"]
    launches = [e["ts"] for e in c.cat("runtime")]
    bad = []
    for step in steps:
        lo, hi = step["ts"], step["ts"] + step.get("dur", 0)
        if any(lo <= t <= hi for t in launches) and not any(lo <= t <= hi for t in syncs):
            bad.append(step["name"])
    if bad:
        return (f"{', '.join(bad[:3])} launched device work but never called torch.sim.synchronize(): the device "
                f"was still running when the step ended, so its device time lands outside the step (and, "
                f"in a loop, in the next one)")


def _cold_start(c: _Ctx):
    cold = c.stats.get("cold_executions", 0)
    if cold:
        ops = ", ".join(c.stats.get("cold_ops", [])[:4])
        return (f"{cold} device execution(s) in the profiled window ran their Program for the first time "
                f"({ops}): their host time includes lowering and modeling the Program (warmup=0, or "
                f"profiling the first iteration)")


def _distortion(c: _Ctx):
    iv = c.stats.get("launch_interval_us") or {}
    prof, base = iv.get("profiled"), iv.get("unprofiled")
    samples = iv.get("samples") or {}
    if not prof or not base or min(samples.get("profiled", 0), samples.get("unprofiled", 0)) < 10:
        return None
    if prof / base > 1.5:
        return (f"host time between device launches was {prof / base:.1f}x longer while profiling "
                f"(median {prof:.1f} us vs {base:.1f} us unprofiled): the profile's host-side times are "
                f"the profiler's as much as the model's")


def _without_op(c: _Ctx):
    n, threads = c.stats.get("executions_without_op", 0), c.stats.get("threads_without_ops", 0)
    if n:
        return (f"{n} device execution(s) launched from {threads} thread(s) have no launching op in torch's "
                f"events: torch records the ops of the thread that started the profiler only, so their device "
                f"time is under no op in key_averages() (the system trace shows them on a lane of their thread)")


def _dropped(c: _Ctx):
    dropped = {k: v for k, v in (c.stats.get("dropped_events") or {}).items() if v}
    if dropped:
        total = sum(dropped.values())
        cores = ", ".join(f"core {k}: {v}" for k, v in sorted(dropped.items()))
        return (f"{total} instruction events were dropped by the per-core ring buffer "
                f"(max_events_per_core={c.config.get('max_events_per_core')}; {cores})")


def _unpaired(c: _Ctx):
    if c.trusted:
        return None
    exes = set(c.prof.executables())
    problems = []
    for h, run, path in c.prof.itraces():
        try:
            c.prof.load_itrace(path)
        except ProfileFormatError as e:
            problems.append(str(e))
    hashes = {e.get("args", {}).get("program_hash") for e in c.cat("hardware")} - {None}
    if c.config.get("modes") and "DEVICE" in c.config.get("modes", []):
        missing = sorted(h for h in hashes if h not in exes)
        if missing:
            problems.append(f"executions ran programs with no executable in the profile: {', '.join(missing[:5])}")
    if problems:
        return "; ".join(problems[:3])


def _host_copies(c: _Ctx):
    copies = c.cat("memcpy")
    if not copies:  # (the hardware slices are made only when there are copies)
        return None
    device = c.cat("hardware")
    if not device:
        return None
    copy_us = sum(e.get("dur", 0) for e in copies)
    dev_us = sum(e.get("dur", 0) for e in device)
    if dev_us and copy_us / (copy_us + dev_us) > 0.2:
        return (f"host<->device copies take {copy_us:.1f} us, {copy_us / (copy_us + dev_us):.0%} of device "
                f"time in the profiled window; they appear as host-side rows that an op filter hides")


def _itrace_summaries(c: _Ctx):
    if c.summaries is not None:
        yield from c.summaries
        return
    for h, run, path in c.prof.itraces()[:50]:
        try:
            yield json.loads(path.read_bytes()).get("summary", {})
        except (OSError, json.JSONDecodeError):
            continue


def _small_dma(c: _Ctx):
    small = []
    for summary in _itrace_summaries(c):
        avg = summary.get("average_dma_bytes", 0)
        if summary.get("dma_transfers", 0) >= 8 and 0 < avg < 4096:
            small.append((summary.get("program"), avg))
    if small:
        names = ", ".join(f"{p} ({a / 1024:.1f} KiB)" for p, a in small[:3])
        return f"programs moving data in small DMA transfers (average < 4 KiB, modeled): {names}"


def _generic_share(c: _Ctx):
    if c.device.get("kind") != "sim":
        return None
    generic = c.stats.get("generic")
    if generic is None and not c.trusted:  # written before the stats had it: from the hardware events
        generic = _generic_from_events(c)
    message = generic_message(generic) if generic else None
    declined = c.stats.get("lowering_declines")
    if message and declined:  # why ops missed their specific rules (process-wide, distinct calls)
        message += "; rules that declined calls: " + "; ".join(
            f"{d['rule']} {d['calls']}x ({d['reason']})" for d in declined[:5])
    return message


class _Run:
    """A hardware event as :func:`lowering_stats` reads an execution record."""

    __slots__ = ("kind", "lowering", "modeled_ns", "op", "program")

    def __init__(self, lowering, ns, op, program):
        self.kind, self.lowering, self.modeled_ns, self.op, self.program = "kernel", lowering, ns, op, program


def _generic_from_events(c: _Ctx) -> dict | None:
    events = [e for e in c.cat("hardware") if isinstance(e.get("args"), dict) and "lowering" in e["args"]]
    if not events:
        return None
    programs: dict = {}

    def program(h):  # the generic executables only, each read once
        if h not in programs:
            try:
                programs[h] = c.prof.program(h) if h else None
            except (OSError, ValueError, KeyError):
                programs[h] = None
        return programs[h]

    runs = [_Run(a["lowering"], float(e.get("dur") or 0) * 1000.0, a.get("op"),
                 program(a.get("program_hash")) if a["lowering"] == "generic" else None)
            for e in events for a in (e["args"],)]
    return lowering_stats(runs)["generic"]


# code, severity, check, fix
RULES: list[tuple[str, str, Callable[[_Ctx], str | None], str]] = [
    ("incomplete-profile", "error", _incomplete,
     "profile again; a directory interrupted during export is never complete"),
    ("no-device-activity", "error", _no_device_activity,
     "pass activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1] and experimental_config=ProfileConfig(...), "
     "and run the model on the sim device inside the active steps"),
    ("device-time-not-correlated", "warning", _not_correlated,
     "pass activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1] and keep "
     "ProfileConfig(correlate_device_time=True) (the default)"),
    ("no-synchronize", "warning", _unsynchronized,
     "call torch.sim.synchronize() before prof.step() inside the profiled loop"),
    ("cold-start", "warning", _cold_start,
     "profile warm iterations: schedule(wait=..., warmup=1, active=...), or run the model once first"),
    ("profiler-distortion", "info", _distortion,
     "profile fewer steps, turn record_shapes / with_stack off; device time (modeled) is not affected"),
    ("launches-without-op", "warning", _without_op,
     "pass ProfileConfig(profile_all_threads=True) (zero-code capture: TILESCOPE_PROFILE_ALL_THREADS=1, "
     "tilescope profile --all-threads) to record every thread's ops, or launch the device work "
     "from the thread that runs the profiler"),
    ("dropped-events", "warning", _dropped,
     "raise ProfileConfig(max_events_per_core=...) or capture fewer cores/steps"),
    ("unpaired-trace", "error", _unpaired,
     "keep executables/ and itraces/ together; do not mix files from different profiles"),
    ("host-copies", "info", _host_copies,
     "move inputs to the device once, outside the loop; look at the host-side rows of key_averages()"),
    ("generic-share", "warning", _generic_share,
     "read those ops' device time as a rough estimate; for the model to price them, use an op with a specific "
     "lowering (tilescope.lower.RULES), torch.compile the region, or write the op as a tile kernel"),
    ("small-dma", "info", _small_dma,
     "transfer at least 2-4 KiB per partition per DMA (bigger tiles, contiguous rows)"),
]


def diagnose(path, *, events: list | None = None, summaries: list | None = None,
             trusted: bool = False, manifest: dict | None = None, slices: tuple | None = None) -> list[Finding]:
    """Every finding for the profile at ``path`` (an empty list means no known mistake).

    The exporter passes what it has in memory and ``trusted=True`` for files it just wrote,
    so the check at export re-reads nothing: the system trace's ``events`` (at least those
    the rules read: runtime, hardware and memcpy slices, ``ProfilerStep`` and
    ``tilescope::synchronize`` ranges) -- or those ``slices`` already indexed, ``(slices by
    category, slices with a name)``, a category's list possibly a function that makes it --,
    the modeled ``summaries`` of the instruction traces and the ``manifest`` it wrote.
    """
    if trusted and manifest is not None:
        prof = Profile(Path(path), manifest)
    else:
        prof = read_profile(Path(path), verify=not trusted)
    ctx = _Ctx(prof, events, summaries, trusted, slices)
    findings = []
    for code, severity, check, fix in RULES:
        if prof.problems and code != "incomplete-profile":
            break  # the other rules would read files that cannot be trusted
        message = check(ctx)
        if message:
            findings.append(Finding(code, severity, message, fix))
    return findings
