"""Writing the profile directory (format: docs/profile-format.md), atomically.

A profile is written into ``.<timestamp>.partial`` next to its final name; ``manifest.json``
(with each file's size and sha256) goes last, and only then is the directory renamed -- the
one step that makes it a profile. A crash at any point leaves a ``.partial`` directory, which
readers report as incomplete, never as a profile. Nothing is fsynced (on a busy disk one
fsync can cost more than the rest of an export): a write torn by a power loss -- the
manifest's included -- shows as a missing file, an unreadable manifest, or a size or checksum
mismatch, which readers also report as incomplete.

Files added with ``later=True`` (instruction traces) and executables -- hard links to the
copy this process wrote last while that file is unchanged, else new files -- are written in
batches, in the order they were added, when :meth:`ProfileWriter.start_writes` (or
:meth:`~ProfileWriter.finish`) is called; the file-level work is in :mod:`._fast_files`, the
instruction traces' and executables' text in :mod:`._itrace`.

>>> import tempfile
>>> from tilescope.profiler import ProfileWriter
>>> with ProfileWriter(tempfile.mkdtemp(), device={"kind": "sim"}) as w:
...     _ = w.write_json("trace.json", {"traceEvents": []})
>>> w.path.name.startswith("20") and (w.path / "manifest.json").exists()
True
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import socket
import sys
import threading
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

import orjson

from ._fast_files import Executable, link_if_unchanged, read_file, sha256_of, write_file
from ._itrace import FORMAT_VERSION, executable_name, itrace_name, itrace_parts

__all__ = ["ProfileWriter", "FORMAT", "FORMAT_VERSION", "write_kernel_profile"]

FORMAT = "tilescope.profile"


def _versions() -> dict:
    """The software's versions and the platform (the same for the whole process: made once,
    once torch is imported; a copy each time)."""
    if _VERSIONS:
        return dict(_VERSIONS)
    from .. import __version__

    # not platform.platform(): it also runs `uname -p` in a subprocess (a fork of a process
    # that holds torch, on the first profile)
    system = "-".join((platform.system(), platform.release(), platform.machine()))
    out = {"tilescope": __version__, "python": platform.python_version(), "platform": system}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__
        _VERSIONS.update(out)
    return out


_VERSIONS: dict = {}  # made by the first _versions() call after torch is imported


class ProfileWriter:
    """Writes one profile directory; use as a context manager (aborts on an exception).

    Args:
        output_dir: the parent directory (``ProfileConfig.output_dir``).
        device: the manifest's ``device`` object (kind, name, preset, clock, ...).
        config: the manifest's ``config`` object (the profile configuration).
        instance: host name used in ``<instance>_pid_<pid>`` (default: this host).
    """

    def __init__(self, output_dir, *, device: dict | None = None, config: dict | None = None,
                 instance: str | None = None, pid: int | None = None, timestamp: str | None = None,
                 redacted: bool = False):
        now = _unique_now()
        self.created = now.isoformat().replace("+00:00", "Z")
        stamp = timestamp or (f"{now.year:04}{now.month:02}{now.day:02}_{now.hour:02}{now.minute:02}"
                              f"{now.second:02}_{now.microsecond:06}")  # (strftime's format, at a fraction of its cost)
        instance = instance or socket.gethostname().split(".")[0] or "host"
        pid = os.getpid() if pid is None else pid
        parent = self._parent = os.path.join(output_dir, f"{instance}_pid_{pid}")
        self._partial, self._final = f"{parent}/.{stamp}.partial", f"{parent}/{stamp}"  # (joined hundreds of times)
        if timestamp is not None:  # a name chosen by the caller: claimed now, as no other writer's
            if self.path.exists():
                raise FileExistsError(f"profile directory {self.path} already exists; pick another timestamp")
            self.partial.mkdir(parents=True, exist_ok=False)
        # else the name is this process's alone (its pid, a timestamp strictly increasing in it)
        # and the directory is made by the first file written into it -- usually by the first
        # batch
        self.device = dict(device or {})
        self.config = dict(config or {})
        self.stats: dict = {}
        self.final_manifest: dict | None = None  # the manifest as written, once sealed
        self.redacted = redacted
        self._files: dict[str, tuple[int, str] | None] = {}  # relpath -> (size, sha256); None: being hashed
        self._hashing: dict[str, str] = {}  # path -> relpath of the files a batch hashes
        self._later: list[_Item] = []  # not written yet
        self._written_later: list[tuple] = []  # (executable, path, final path, link source) among them
        self._writers: list[_BatchWriter] = []
        self._executables: set[str] = set()
        self._dirs: set[str] = {self._partial} if timestamp is not None else set()  # made (or found) here
        self._finished = False

    @cached_property
    def path(self) -> Path:
        """The profile's directory (its final name)."""
        return Path(self._final)

    @cached_property
    def partial(self) -> Path:
        """Where it is written until it is finished."""
        return Path(self._partial)

    # ---- files -------------------------------------------------------------
    def _target(self, relpath: str, *, later: bool = False) -> str:
        """The path ``relpath`` is written to; its directory is made here, or -- ``later`` --
        by the batch that writes it."""
        if self.final_manifest is not None:
            raise RuntimeError(f"cannot add {relpath!r}: the profile's manifest is already made (seal() was called)")
        # (string operations, not os.path: an export adds dozens of files)
        if relpath[:1] in ("/", "\\", "") or (".." in relpath and ".." in relpath.replace("\\", "/").split("/")):
            raise ValueError(f"profile file paths must be relative and inside the profile: {relpath!r}")
        target = f"{self._partial}/{relpath}"
        if not later:
            parent = target[:target.rfind("/")]
            if parent not in self._dirs:  # one look per directory, not per file
                if not os.path.isdir(parent):  # (usually made already: by the first batch)
                    os.makedirs(parent, exist_ok=True)
                self._dirs.add(parent)
        return target

    def target(self, relpath: str) -> str:
        """Where ``relpath`` goes: a tool that can only write to a path (torch's trace export)
        writes there; the file is then listed by :meth:`add_written`, or rewritten by
        :meth:`write_bytes`. (A string: making a ``Path`` costs more than the rest of this.)"""
        return self._target(relpath)

    def write_bytes(self, relpath: str, data: bytes | tuple[bytes, ...], *, sha256: str | None = None,
                    later: bool = False) -> str:
        """Write one file: ``data`` its bytes, or a tuple of parts written one after the other (a
        large file made in pieces is never joined); ``sha256`` is its known digest (e.g. of an
        executable written before). ``later``: in the next batch (:meth:`start_writes`) -- its
        digest, when not given, made there too (large files are hashed at ~1 ms per 2 MB)."""
        target = self._target(relpath, later=later)
        if later:  # its digest, when not known, made by the batch
            self._later.append(_Item(target, data, hashed=sha256 is None))
            if sha256 is None:
                self._files[relpath] = None
                self._hashing[target] = relpath
                return relpath
        else:
            write_file(target, data)
        parts = data if isinstance(data, tuple) else (data,)
        if sha256 is None:
            sha256 = sha256_of(parts)
        self._files[relpath] = (sum(map(len, parts)), sha256)
        return relpath

    def reserve(self, *relpaths: str) -> None:
        """Create these files empty in the next batch: they are filled later, by a batch or a tool
        that can only write to a path. (Until the profile is finished its directory is
        ``.partial``: never taken for a profile.)"""
        for relpath in relpaths:  # (created if missing, never truncated: another writer may fill it first)
            self._later.append(_Item(self._target(relpath, later=True), None))

    def add_written(self, relpath: str, data: bytes | None = None) -> str:
        """List a file a tool wrote itself at :meth:`target` (``data``: its bytes, as written --
        or None: the next batch reads and hashes the file)."""
        target = self._target(relpath)
        if data is None:
            self._later.append(_Item(target, None, hashed=True))
            self._files[relpath] = None
            self._hashing[target] = relpath
        else:
            self._files[relpath] = (len(data), hashlib.sha256(data).hexdigest())
        return relpath

    def start_writes(self) -> None:
        """Write the files added with ``later=True`` now, in the order they were added
        (:meth:`finish` raises the error that stopped a batch)."""
        batch, self._later = self._later, []
        if batch:
            self._writers.append(_BatchWriter(batch))

    def _wait_for_writes(self) -> None:
        """Every batch written (the first error raised); executables written in one noted, so
        that later profiles can link them."""
        self.start_writes()
        writers, self._writers = self._writers, []
        errors = [w.wait() for w in writers]
        for err in errors:
            if err is not None:
                raise err
        self._collect_digests(writers)
        linked = {path for w in writers for path in w.linked}
        for exe, target, final, source in self._written_later:
            if target not in linked:
                exe.written(target, final)
            elif exe.link_source() == source:  # the same file (a link keeps inode, size and mtime)
                exe.moved(final)
        self._written_later = []

    def _take_digests(self) -> None:
        """The digests the batches make, once they are made: only those batches are waited
        for (the batches run in order: the ones started after them may still be writing)."""
        self.start_writes()
        hashing = [w for w in self._writers if w.hashes]
        for w in hashing:
            err = w.wait()  # (waiting again later returns the same)
            if err is not None:
                raise err
        self._collect_digests(hashing)

    def _collect_digests(self, writers: list["_BatchWriter"]) -> None:
        for w in writers:
            for target, size_and_digest in w.digests.items():
                relpath = self._hashing.pop(target, None)
                if relpath is not None:
                    self._files[relpath] = size_and_digest

    def write_json(self, relpath: str, obj) -> str:
        return self.write_bytes(relpath, json.dumps(obj, separators=(",", ":"), allow_nan=False,
                                                    default=_json_default).encode())

    def add_file(self, relpath: str, source: Path) -> str:
        """Copy an existing file (e.g. torch's exported trace.json) into the profile."""
        return self.write_bytes(relpath, Path(source).read_bytes())

    def add_executable(self, program) -> str:
        """``executables/exec_<hash>.json`` (written once per distinct Program)."""
        rel = executable_name(program.hash)
        if program.hash not in self._executables:
            exe = Executable.of(program)
            target = self._target(rel, later=True)
            # in the batch: a link to the file this process wrote last, while it is unchanged
            source = exe.link_source()
            self._later.append(_Item(target, exe.text, link=source))
            self._written_later.append((exe, target, os.path.join(self._final, rel), source))
            self._files[rel] = (exe.size, exe.sha256)
            self._executables.add(program.hash)
        return rel

    def add_itrace(self, program, result, run: int, execution: dict | None = None) -> str:
        """The instruction trace of one run, paired with its executable by hash."""
        self.add_executable(program)
        parts, sha256 = itrace_parts(program, result, execution=execution)
        return self.write_bytes(itrace_name(program.hash, run), parts, sha256=sha256, later=True)

    # ---- completion -------------------------------------------------------
    def manifest(self, *, files: bool = True) -> dict:
        """The manifest (once the batches that hash files have made their digests); without
        ``files``: all of it but the file list, at once (what the doctor reads at export)."""
        if files and self._hashing:
            self._take_digests()
        versions = _versions()
        if self.redacted:  # keep the software versions, drop what describes the machine
            versions = {k: v for k, v in versions.items() if k not in ("platform", "python")}
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "complete": True,
            "created": self.created,
            **({"redacted": True} if self.redacted else {}),
            **versions,
            "device": self.device,
            "config": self.config,
            "stats": self.stats,
            **({"files": [{"path": p, "bytes": n, "sha256": h} for p, (n, h) in sorted(self._files.items())]}
               if files else {}),
        }

    def seal(self) -> dict:
        """Every file is added: the manifest is made now (once the batches hashing files are
        done) and written last, once every other file is. Returns the manifest; :meth:`finish`
        moves the directory to its final name."""
        if self.final_manifest is None:
            manifest = self.manifest()
            data = orjson.dumps(manifest, default=_json_default,  # indented: people read it
                                option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
            self._wait_for_writes()
            write_file(self._target("manifest.json"), data)  # inside .partial: no temporary needed
            self.final_manifest = manifest
        return self.final_manifest

    def finish(self) -> Path:
        """Write the manifest last and move the directory to its final name."""
        if self._finished:
            return self.path
        try:
            self.seal()
            self._wait_for_writes()
        except BaseException:
            self.abort()
            raise
        os.replace(self._partial, self._final)
        self._finished = True
        return self.path

    def abort(self) -> None:
        for w in self._writers:  # nothing left writing into what is removed
            w.wait()
        self._writers, self._later = [], []
        shutil.rmtree(self.partial, ignore_errors=True)
        self._finished = True

    def __enter__(self) -> "ProfileWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abort()


class _Item(NamedTuple):
    """One file of a batch."""

    path: str  # ending in "/" with a None data: a directory
    data: object  # bytes, str, a tuple of them, or None: a reservation (created if missing, kept as it is)
    link: tuple | None = None  # (source, inode, size, mtime in ns): linked to source while unchanged
    hashed: bool = False  # its size and SHA-256 made by the batch (of its data, or of the file for None)


class _BatchWriter:
    """Writes a batch of :class:`_Item` in order, making the directories they need. Once done,
    ``linked``: the paths that were linked rather than written; ``digests``: path -> (size,
    sha256) of those hashed; :meth:`wait` returns the error that stopped it (None)."""

    def __init__(self, batch: list[_Item]):
        self._error: BaseException | None = None
        self.hashes = any(it.hashed for it in batch)
        self.linked: set[str] = set()
        self.digests: dict[str, tuple[int, str]] = {}
        try:
            made: set[str] = set()
            for path, data, link, hashed in batch:
                is_directory = data is None and path.endswith("/")
                directory = path.rstrip("/") if is_directory else os.path.dirname(path)
                if directory not in made:
                    os.makedirs(directory, exist_ok=True)
                    made.add(directory)
                if is_directory:
                    continue
                if hashed:
                    parts = (read_file(path),) if data is None else data if isinstance(data, tuple) else (data,)
                    self.digests[path] = (sum(len(p.encode() if isinstance(p, str) else p) for p in parts),
                                          sha256_of(parts))
                    if data is None:  # a file another writer made: read only
                        continue
                if link is not None and link_if_unchanged(link, path):
                    self.linked.add(path)
                elif data is None:  # a reservation
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666))
                else:
                    write_file(path, data)
        except OSError as e:  # raised again by the writer's finish
            self._error = e

    def wait(self) -> BaseException | None:
        return self._error


def _after_fork() -> None:  # a lock the parent's threads may have held
    global _stamp_lock
    _stamp_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


_stamp_lock = threading.Lock()
_last_stamp = [_dt.datetime.min.replace(tzinfo=_dt.timezone.utc)]


def _unique_now() -> _dt.datetime:
    """The time (UTC), one microsecond after the previous call's at least: two profiles of one
    process never share a directory name."""
    now = _dt.datetime.now(_dt.timezone.utc)
    with _stamp_lock:
        if now <= _last_stamp[0]:
            now = _last_stamp[0] + _dt.timedelta(microseconds=1)
        _last_stamp[0] = now
    return now


def _json_default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__fspath__"):
        return os.fspath(o)
    raise TypeError(f"cannot write {type(o).__name__} into a profile: {o!r}")


def write_kernel_profile(output_dir, program, result, *, name: str | None = None, config: dict | None = None) -> Path:
    """A profile of one modeled kernel run: manifest, executable, instruction trace,
    and a system trace with the run on the hardware lane of core 0."""
    from ..spec import preset as _preset

    spec = _preset(result.summary.preset)
    device = {"kind": "sim", "name": "sim", "preset": spec.name, "preset_fingerprint": spec.fingerprint,
              "clock": "virtual"}
    label = name or program.name
    dur_us = result.summary.total_ns / 1000.0
    instance = socket.gethostname().split(".")[0] or "host"
    pid = os.getpid()
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": f"{instance}/{pid}/hardware"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "NC0:0"}},
        {"ph": "X", "cat": "hardware", "name": f"exec_running {label}", "pid": 1, "tid": 0, "ts": 0.0,
         "dur": dur_us, "args": {"flow_id": 1, "program_hash": program.hash, "op": label, "core": 0,
                                 "modeled": True, "instructions": len(program)}},
    ]
    with ProfileWriter(output_dir, device=device, config=config or {"source": "kernel"}) as w:
        w.add_itrace(program, result, 0, execution={"flow_id": 1, "core": 0, "start_us": 0.0})
        w.write_json("system_trace.json", {"traceEvents": events, "displayTimeUnit": "ns",
                                           "metadata": {"tilescope": {"modeled": True}}})
        w.stats = {"executions": 1, "events": len(events)}
    return w.path
