"""The opened sources of one explorer session: each a trace, its timeline index, the files
it may serve, its stored records by eid, and a few engine connections for analyses (see
:mod:`._work`: no request holds anything another request needs).

A source that cannot be loaded stays in the session with its error and the fix, so the
page can say why instead of showing an empty timeline.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time

from ..trace.internal import distinct, short_label, split_name

__all__ = ["Session", "Source", "LoadError"]


class LoadError(Exception):
    """A source the explorer cannot open (the message names the path and what to do)."""


def _fix_for(msg: str) -> str:
    m = msg.lower()
    if "a folder profiles are written under" in m:
        return "pass one profile directory (<host>_pid_<pid>/<timestamp>), e.g. the newest one named above"
    if "incomplete" in m or "manifest" in m:
        return "re-run the profile (an interrupted export never completes); `tilescope doctor PATH` says more"
    if "no such file" in m:
        return "check the path; tilescope explore takes profile directories, Kineto .json/.json.gz traces, " \
               "a directory of per-rank traces, or EXEC.json+ITRACE.json"
    if "hash" in m:
        return "pair an instruction trace with the executable of the same exec_<hash> name"
    if "json" in m or "format" in m:
        return "the file is not a Chrome/Kineto trace or tilescope profile; re-export it with torch.profiler " \
               "(prof.export_chrome_trace) or the tilescope profiler"
    return "see the message; `tilescope report PATH` shows the same error on the command line"


class Source:
    """One opened path (``NAME=PATH`` names it)."""

    def __init__(self, sid: str, path: str, source_dirs: list[str] | None = None):
        self.id = sid
        label, path = split_name(path)  # NAME=PATH names a profile for the tabs and compare
        self.path = os.path.abspath(path) if "+" not in path or os.path.exists(path) else path
        self.label = label or short_label(self.path)
        self.source_dirs = [os.path.abspath(d) for d in (source_dirs or [])]
        self.trace = None
        self.index = None
        self.rows = None  # stored records by eid (_rows.EventRows)
        self.readers = None  # engine connections for analyses (_work.Readers)
        self.results = None  # analyses' answers, computed once (_work.Results)
        self.facts: dict = {}  # what /meta and the lifecycle need, computed at load
        self.error: str | None = None
        self.fix: str | None = None
        self.doctor: list[dict] = []
        self.load_seconds = None
        self.files: dict[str, str] = {}  # servable: relative name -> absolute path
        self.roots: list[str] = []  # directories whose files (and only those) may be read

    # ---- loading ------------------------------------------------------------------------
    def load(self) -> "Source":
        from ._engine import open_source
        from ._index import TimelineIndex
        from ._rows import EventRows
        from ._work import Readers, Results, code_tag

        t0 = time.perf_counter()
        try:
            self.open_trace()
            self.index = TimelineIndex.load_or_build(self.trace)
            self.rows = EventRows(self.trace)
            self.readers = Readers(self.trace, lambda: open_source(self.path))
            d = TimelineIndex._cache_dir(self.trace)
            self.results = Results(f"{d.replace('explorer-index-', 'explorer-answers-')}-{code_tag()}" if d else None)
            self.facts = self._facts()
        except Exception as e:  # every failure becomes a clear page, never a traceback
            self.trace = self.index = None
            self.error = f"{self.path}: {e}" if self.path not in str(e) else str(e)
            self.fix = _fix_for(self.error)
        self.load_seconds = time.perf_counter() - t0
        if self.trace is not None and self.kind_of_path() == "profile":
            try:
                from ..profiler import diagnose

                self.doctor = [{"code": f.code, "severity": f.severity, "message": f.message, "fix": f.fix}
                               for f in diagnose(self.path)]
            except Exception as e:  # the doctor is advice: its failure must not hide the profile
                self.doctor = [{"code": "doctor-failed", "severity": "info", "message": str(e),
                                "fix": "run `tilescope doctor PATH` to see the problem"}]
        return self

    def open_trace(self) -> None:
        """The servable files and the trace alone (what an analysis needs; no index)."""
        from ._engine import open_source

        self._collect_files()
        self.trace = open_source(self.path)

    def _facts(self) -> dict:
        """Facts of the trace that requests read often: computed once, here."""
        from . import _device_view
        from ._timeaxis import host_waits

        t, ix = self.trace, self.index
        preset = t.preset_name() if t.modeled else None
        execs = _device_view.executions(t)
        first_step = None
        if "step" in ix.kinds and ix.n:
            on = ix.kind == ix.kinds.index("step")
            if on.any():
                first_step = int(ix.start[on].min())
        return {"preset": preset, "executions": execs, "by_eid": {e["eid"]: e for e in execs if e["eid"] is not None},
                "first_step_ns": first_step, "devices": t.device_names(), "modeled": t.modeled, "kind": t.kind,
                "waits": host_waits(ix) if t.modeled else []}

    def analysis(self, key, fn, *, store: str | None = None):
        """``fn(trace)``'s answer for ``key``, computed once on a connection of its own (see
        :mod:`._work`); ``store`` names the file that keeps it across sessions."""
        def job(j):
            with self.readers.take() as tr:
                j.traces.append(tr)
                try:
                    return fn(tr)
                finally:
                    j.traces.remove(tr)
        return self.results.get(key, job, store=store)

    def warm(self, key, fn, *, store: str | None = None) -> None:
        """Start computing ``key`` in the background (the warm-up of :meth:`Session.warm_up`)."""
        def job(j):
            with self.readers.take() as tr:
                return fn(tr)
        self.results.warm(key, job, store=store)

    def kind_of_path(self) -> str:
        p = self.path
        if "+" in p and not os.path.exists(p):
            return "pair"
        if os.path.isdir(p):
            return "profile" if os.path.exists(os.path.join(p, "manifest.json")) else "ranks"
        return "file"

    def _collect_files(self) -> None:
        """The files this source may serve: the profile's manifest list, or the trace file(s)."""
        kind = self.kind_of_path()
        files = {}
        if kind == "profile":
            self.roots = [os.path.realpath(self.path)]
            try:
                with open(os.path.join(self.path, "manifest.json"), encoding="utf-8") as f:
                    man = json.load(f)
                for e in man.get("files", []):
                    if isinstance(e, dict) and isinstance(e.get("path"), str):
                        files[e["path"]] = os.path.join(self.path, e["path"])
            except (OSError, ValueError):
                pass
            files["manifest.json"] = os.path.join(self.path, "manifest.json")
            for extra in glob.glob(os.path.join(self.path, "sources", "**", "*"), recursive=True):
                if os.path.isfile(extra):
                    files[os.path.relpath(extra, self.path)] = extra
        elif kind == "ranks":
            self.roots = [os.path.realpath(self.path)]
            for f in sorted(glob.glob(os.path.join(self.path, "*.json")) + glob.glob(os.path.join(self.path, "*.json.gz"))):
                files[os.path.basename(f)] = f
        elif kind == "pair":
            parts = [os.path.abspath(x) for x in self.path.split("+")]
            self.roots = [os.path.realpath(os.path.dirname(x)) for x in parts]
            for x in parts:
                files[os.path.basename(x)] = x
        else:
            self.roots = [os.path.realpath(os.path.dirname(self.path))]
            files[os.path.basename(self.path)] = self.path
        # keep only regular files that really lie inside the roots (no symlink escapes)
        self.files = {k: v for k, v in files.items() if self.allowed(v) and os.path.isfile(v)}

    # ---- access rules -------------------------------------------------------------------
    def allowed(self, path: str) -> bool:
        """True when ``path`` resolves inside this source (the profile directory, or for a single
        trace file: that file only; an executable named by the tables: inside the profile)."""
        real = os.path.realpath(path)
        kind = self.kind_of_path()
        if kind == "file":
            me = os.path.realpath(self.path)
            if real == me:
                return True
            # an instruction trace opened alone reads its executable beside it or in ../executables/
            if me.endswith(".itrace.json") and os.path.basename(real).startswith("exec_") and real.endswith(".json"):
                here = os.path.dirname(me)
                return os.path.dirname(real) in (here, os.path.join(os.path.dirname(here), "executables"))
            return False
        if kind == "pair":
            return real in {os.path.realpath(x) for x in self.path.split("+")}
        return any(real == r or real.startswith(r + os.sep) for r in self.roots)

    def source_roots(self) -> list[str]:
        """Directories that kernel source text may be read from: the profile's ``sources/`` and
        the directories given with ``--sources``."""
        roots = []
        if self.kind_of_path() == "profile":
            roots.append(os.path.join(self.path, "sources"))
        return roots + self.source_dirs

    def file_path(self, rel: str) -> str:
        """Absolute path of a servable file by its listed name; KeyError otherwise."""
        if rel not in self.files:
            raise KeyError(f"{rel!r} is not a file of {self.label} (its files: {', '.join(sorted(self.files)[:8])}"
                           f"{', ...' if len(self.files) > 8 else ''})")
        p = self.files[rel]
        if not self.allowed(p):
            raise KeyError(f"{rel!r} resolves outside {self.label}")
        return p

    # ---- facts --------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return self.trace is not None

    def label_text(self) -> str:
        """What the figures are: modeled (tilescope's device) or measured (on which device)."""
        t = self.trace
        if t is None:
            return ""
        if t.modeled:
            return f"modeled: device times come from tilescope's device model (preset {self.facts.get('preset') or '?'})"
        names = self.facts.get("devices", [])
        return f"measured on {', '.join(names)}" if names else "measured on the host CPU (no device in the trace)"

    def describe(self) -> dict:
        d = {"id": self.id, "path": self.path, "label": self.label, "ok": self.ok, "error": self.error, "fix": self.fix,
             "load_seconds": round(self.load_seconds or 0, 3)}
        if self.ok:
            d.update({"modeled": self.trace.modeled, "kind": self.trace.kind, "events": self.index.n,
                      "what": self.label_text()})
        return d


class Session:
    """All sources opened by one ``tilescope explore`` (ids ``p0``, ``p1``, ... in argument order)."""

    def __init__(self, paths: list[str], *, source_dirs: list[str] | None = None, load: bool = True):
        if not paths:
            raise ValueError("tilescope explore needs at least one PATH (profile directory or trace)")
        self.sources = [Source(f"p{i}", p, source_dirs) for i, p in enumerate(paths)]
        # tabs and comparisons tell them apart (two runs' trace.json, one profile opened twice)
        for source, label in zip(self.sources, distinct([s.label for s in self.sources], [s.path for s in self.sources])):
            source.label = label
        self.started = time.time()
        from ._work import Results

        self.results = Results()  # answers over several sources (compare)
        if load:
            for s in self.sources:
                s.load()

    def get(self, sid: str) -> Source:
        if re.fullmatch(r"p\d{1,4}", sid or ""):
            for s in self.sources:
                if s.id == sid:
                    return s
        opened = ", ".join(f"{s.id} ({s.label})" for s in self.sources)
        raise KeyError(f"no profile {sid!r}; open ones, by id (label): {opened}")

    def describe(self) -> list[dict]:
        return [s.describe() for s in self.sources]

    def warm_up(self, *, processes: bool = True) -> None:
        """Start computing, in the background, the tables, summary and roofline of every
        opened source and the comparison of all of them (seconds on traces of millions of
        events), so that the page's first click on them answers at once. Nothing waits for
        it: a request for an answer still being computed waits for that answer alone.
        ``processes``: in worker processes at a lower priority (see :mod:`._offload`), so
        that they slow no request down; False: on this process' threads."""
        from ._api import warm_up

        warm_up(self, processes=processes)
