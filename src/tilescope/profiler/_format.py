"""Writing the profile directory (format: docs/profile-format.md), atomically.

A profile is written into ``.<timestamp>.partial`` next to its final name; ``manifest.json``
(with each file's size and sha256) goes last, and only then is the directory renamed -- the
one step that makes it a profile. A crash at any point leaves a ``.partial`` directory, which
readers report as incomplete, never as a profile. Nothing is fsynced (on a busy disk one
fsync can cost more than the rest of an export): a write torn by a power loss -- the
manifest's included -- shows as a missing file, an unreadable manifest, or a size or checksum
mismatch, which readers also report as incomplete.

Files added with ``later=True`` (instruction traces) and executables -- hard links to the
copy this process wrote last while that file is unchanged, else new files -- are made by one
call of the ``_filebatch`` extension on a background thread, the GIL released throughout,
while the exporter goes on: on some file systems (network ones, busy virtual disks) creating
a file costs hundreds of microseconds, and a profile is dozens of files.
:meth:`ProfileWriter.finish` waits for them and fails -- leaving nothing -- if one could not
be written.

>>> import tempfile
>>> from tilescope.profiler import ProfileWriter
>>> with ProfileWriter(tempfile.mkdtemp(), device={"kind": "sim"}) as w:
...     _ = w.write_json("trace.json", {"traceEvents": []})
>>> w.path.name.startswith("20") and (w.path / "manifest.json").exists()
True
"""

from __future__ import annotations

import atexit
import contextlib
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

import numpy as np
import orjson

try:
    from . import _filebatch
except ImportError:  # not built (no compiler at install time): files are written one by one, here
    _filebatch = None

__all__ = [
    "ProfileWriter", "FORMAT", "FORMAT_VERSION", "itrace_json", "executable_name", "itrace_name",
    "write_kernel_profile",
]

FORMAT = "tilescope.profile"
FORMAT_VERSION = 1


def executable_name(program_hash: str) -> str:
    return f"executables/exec_{program_hash}.json"


def itrace_name(program_hash: str, run: int) -> str:
    return f"itraces/exec_{program_hash}.{run}.itrace.json"


_COLUMNS_CACHE: dict = {}  # id(result) -> (result, text up to "execution", its sha256 state, summary), the latest 256
_COLUMNS_LOCK = threading.Lock()  # filled by the exporter and by launching threads (prepare_files)


def itrace_bytes(program, result, *, execution: dict | None = None) -> bytes:
    """``itrace_json`` serialised; the columns (the bulk) are serialised once per result."""
    return b"".join(itrace_parts(program, result, execution=execution)[0])


def itrace_parts(program, result, *, execution: dict | None = None) -> tuple[tuple[bytes, bytes], str]:
    """``itrace_bytes`` as the file's two parts and its SHA-256: the document up to its
    ``execution`` object -- the same for every run of one modeled result, made and hashed once
    -- and that object. An export writes the parts as they are (no join) and finishes the
    digest from the first part's."""
    prefix, digest, _ = _itrace_body(program, result)
    tail = orjson.dumps(execution or {}) + b"}"
    digest = digest.copy()
    digest.update(tail)
    return (prefix, tail), digest.hexdigest()


def _itrace_body(program, result) -> tuple[bytes, "hashlib._Hash", dict]:
    """The instruction trace's text up to its ``execution`` object (which it ends with), that
    text's SHA-256 state and the run's summary as a dict: all depend on the (immutable)
    Program and its modeled run alone."""
    key = id(result)
    cached = _COLUMNS_CACHE.get(key)
    if cached is None or cached[0] is not result:
        doc = _itrace_doc(program, result, None, _numpy_column)
        doc.pop("execution")
        prefix = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)[:-1] + b',"execution":'
        cached = (result, prefix, hashlib.sha256(prefix), doc["summary"])
        with _COLUMNS_LOCK:
            _COLUMNS_CACHE[key] = cached
            while len(_COLUMNS_CACHE) > 256:
                del _COLUMNS_CACHE[next(iter(_COLUMNS_CACHE))]
    return cached[1], cached[2], cached[3]


def itrace_summary(program, result) -> dict:
    """``result.summary.to_dict()``, made once per result (do not modify it)."""
    return _itrace_body(program, result)[2]


def _numpy_column(a: np.ndarray):
    """A column orjson writes itself, without a Python number per value: the text of its
    ``tolist()`` for ints and float64 (orjson writes a float32 value's shortest float32 form)."""
    if a.dtype.kind == "f" and a.dtype != np.float64:
        return a.tolist()
    return np.ascontiguousarray(a)


def itrace_json(program, result, *, execution: dict | None = None) -> dict:
    """The instruction-trace document of one modeled run (``result`` is a SimResult)."""
    return _itrace_doc(program, result, execution, np.ndarray.tolist)


def _itrace_doc(program, result, execution: dict | None, column) -> dict:
    tl = result.timeline
    return {
        "format": "tilescope.itrace",
        "version": FORMAT_VERSION,
        "program_hash": program.hash,
        "preset": result.summary.preset,
        "modeled": True,
        "execution": execution or {},
        "lanes": list(tl.lanes),
        "kinds": list(tl.kinds),
        "columns": {
            "index": column(tl.index),
            "lane": column(tl.lane),
            "kind": column(tl.kind),
            "start_ns": column(tl.start_ns),
            "end_ns": column(tl.end_ns),
            "bytes": column(tl.nbytes),
            "flops": column(tl.flops),
            "prov": column(tl.prov),
        },
        "summary": result.summary.to_dict(),
    }


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
        prepare_next: once this profile is sealed, make the next one's directory ahead (off
            this thread, as this one began: its subdirectories, its reserved files), named
            ``.spare/next`` beside it -- the next such writer of this process there takes it over
            with one rename, where making a directory or a file can cost hundreds of
            microseconds (network file systems, busy virtual disks); it is meant for a writer
            that reserves and writes the same files each time (the exporter). Removed when the
            process exits.
    """

    def __init__(self, output_dir, *, device: dict | None = None, config: dict | None = None,
                 instance: str | None = None, pid: int | None = None, timestamp: str | None = None,
                 redacted: bool = False, prepare_next: bool = False):
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
        # batch, off this thread: creating directories costs hundreds of microseconds on some
        # file systems
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
        self._prepare_next = prepare_next and timestamp is None and _filebatch is not None
        self._reserved: list[str] = []
        # the spare directory is keyed by its absolute path (the working directory may change)
        self._spare_key = os.path.abspath(parent) if self._prepare_next else None
        # (taken over by writers that prepare them only: they reserve and write the same files)
        spare = _spares.pop(self._spare_key, None) if self._prepare_next else None
        self._taking = spare is not None  # until the batch that takes it over is written
        if spare is not None:  # made after this process's previous profile here: taken over
            self._later.append(_Item(self._partial + "/", None, move=spare.path))

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
        by the batch that writes it (off this thread)."""
        if self.final_manifest is not None:
            raise RuntimeError(f"cannot add {relpath!r}: the profile's manifest is already made (seal() was called)")
        # (string operations, not os.path: an export adds dozens of files)
        if relpath[:1] in ("/", "\\", "") or (".." in relpath and ".." in relpath.replace("\\", "/").split("/")):
            raise ValueError(f"profile file paths must be relative and inside the profile: {relpath!r}")
        target = f"{self._partial}/{relpath}"
        if not later:
            if self._taking:  # the directory made ahead is renamed first by the first batch
                self.start_writes()
                if not os.path.isdir(self._partial):  # (usually taken over by now)
                    self._writers[0].wait()
                self._taking = False
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
        executable written before). ``later``: in the next batch (:meth:`start_writes`), off the
        calling thread -- its digest, when not given, made there too (large files are hashed at
        ~1 ms per 2 MB)."""
        target = self._target(relpath, later=later)
        if later:  # its digest, when not known, made by the batch (off this thread)
            self._later.append(_Item(target, data, hashed=sha256 is None))
            if sha256 is None:
                self._files[relpath] = None
                self._hashing[target] = relpath
                return relpath
        else:
            _write_file(target, data)
        parts = data if isinstance(data, tuple) else (data,)
        if sha256 is None:
            sha256 = sha256_of(parts)
        self._files[relpath] = (sum(map(len, parts)), sha256)
        return relpath

    def reserve(self, *relpaths: str) -> None:
        """Create these files empty in the next batch, off the calling thread: where creating a
        file costs hundreds of microseconds, writing them later only overwrites them. (Until the
        profile is finished its directory is ``.partial``: never taken for a profile.)"""
        for relpath in relpaths:  # (created if missing, never truncated: another writer may fill it first)
            self._later.append(_Item(self._target(relpath, later=True), None))
            self._reserved.append(relpath)

    def add_written(self, relpath: str, data: bytes | None = None) -> str:
        """List a file a tool wrote itself at :meth:`target` (``data``: its bytes, as written --
        or None: the next batch reads and hashes the file, off this thread)."""
        target = self._target(relpath)
        if data is None:
            self._later.append(_Item(target, None, hashed=True))
            self._files[relpath] = None
            self._hashing[target] = relpath
        else:
            self._files[relpath] = (len(data), hashlib.sha256(data).hexdigest())
        return relpath

    def start_writes(self) -> None:
        """Start writing the files added with ``later=True`` (a background thread, when the
        extension is built; :meth:`finish` waits for it and raises its error)."""
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
            exe = _Executable.of(program)
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
            # written here, not by a batch of its own (a wake-up of each thread): the writer is
            # usually done by now, the digests the manifest waited for were its last work
            self._wait_for_writes()
            _write_file(self._target("manifest.json"), data)  # inside .partial: no temporary needed
            self.final_manifest = manifest
            if self._prepare_next:  # (made off this thread; nothing waits for it)
                subdirs = {rel[:rel.rfind("/")] for rel in self._files if "/" in rel}
                _spares[self._spare_key] = _Spare(self._spare_key, sorted(subdirs), self._reserved)
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
    """One file of a batch (see ``_filebatch``)."""

    path: str  # ending in "/" with a None data: a directory
    data: object  # bytes, str, a tuple of them, or None: a reservation (created if missing, kept as it is)
    link: tuple | None = None  # (source, inode, size, mtime in ns): linked to source while unchanged
    hashed: bool = False  # its size and SHA-256 made by the batch (of its data, or of the file for None)
    move: str | None = None  # a file or directory renamed to path first, when it is there


class _BatchWriter:
    """Writes a batch of :class:`_Item`: on ``_filebatch``'s writer thread (a POSIX thread
    that never takes the GIL: it starts at once, whatever the exporter does meanwhile), else
    -- the extension not built -- right here. Once done, ``linked``: the paths that were linked
    rather than written; ``digests``: path -> (size, sha256) of those hashed."""

    def __init__(self, batch: list[_Item]):
        self._error: BaseException | None = None
        self._batch = None
        self._paths = [it.path for it in batch]
        self._hashed = [it.hashed for it in batch]
        self.hashes = any(self._hashed)
        self.linked: set[str] = set()
        self.digests: dict[str, tuple[int, str]] = {}
        if _filebatch is not None:
            moves = [it.move for it in batch]
            try:
                self._batch = _filebatch.start(self._paths, [it.data for it in batch], [it.link for it in batch],
                                               self._hashed if self.hashes else None,
                                               moves if any(moves) else None)
            except OSError as e:  # no thread to be had: raised again by the writer's finish
                self._error = e
            return
        try:
            made: set[str] = set()  # as the extension does: the batch makes its directories
            for path, data, link, hashed, move in batch:
                if move is not None:
                    with contextlib.suppress(OSError):  # not there (or onto a non-empty directory): made below
                        os.rename(move, path.rstrip("/"))
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
                if link is not None and _link_if_unchanged(link, path):
                    self.linked.add(path)
                elif data is None:  # a reservation
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666))
                else:
                    _write_file(path, data)
        except Exception as e:  # raised again by the writer's finish, as from the thread
            self._error = e

    def wait(self) -> BaseException | None:
        if self._batch is not None:
            batch, self._batch = self._batch, None
            try:
                result = batch.wait()
            except OSError as e:
                self._error = e
            else:
                if self.hashes:
                    self.linked = {p for p, (was, _, _) in zip(self._paths, result) if was}
                    self.digests = {p: (size, digest) for p, hashed, (_, size, digest)
                                    in zip(self._paths, self._hashed, result) if hashed}
                else:
                    self.linked = {p for p, was in zip(self._paths, result) if was}
        return self._error


SPARE_DIR = ".spare"  # holds the next profile's directory, made ahead (see ProfileWriter's prepare_next)


class _Spare:
    """The next profile's directory, made now by a batch (off the exporter's thread), in
    ``<parent>/.spare/next``: not in the profiles' directory itself, where making it would hold
    that directory's lock while the exporter renames its profile there."""

    def __init__(self, parent: str, subdirs: list[str], reserved: list[str]):
        self.parent = parent
        self.path = path = f"{parent}/{SPARE_DIR}/next"
        # never a manifest.json: tools that look for profiles look for that file
        self.writer = _BatchWriter([*(_Item(f"{path}/{d}/", None) for d in subdirs),
                                    *(_Item(f"{path}/{rel}", None) for rel in reserved if rel != "manifest.json")])

    def remove(self) -> None:
        self.writer.wait()
        shutil.rmtree(f"{self.parent}/{SPARE_DIR}", ignore_errors=True)
        with contextlib.suppress(OSError):  # a process that wrote no profile there leaves no directory
            os.rmdir(self.parent)


_spares: dict[str, _Spare] = {}  # profiles' parent directory -> its spare directory, not taken yet


@atexit.register
def _remove_spares() -> None:
    for spare in list(_spares.values()):
        spare.remove()
    _spares.clear()


def _link_if_unchanged(link: tuple, target: str) -> bool:
    """Hard-link ``target`` to ``link[0]`` if that file still has ``link[1:]`` (inode, size,
    mtime in ns); False when it changed or cannot be linked (gone, another file system)."""
    source, *expected = link
    try:
        st = os.stat(source)
        if [st.st_ino, st.st_size, st.st_mtime_ns] != expected:
            return False  # deleted, replaced or edited since
        os.link(source, target)
    except OSError:
        return False
    return True


def start_writer() -> None:
    """Start the thread that writes profiles' file batches now rather than at the first export."""
    if _filebatch is not None:
        _filebatch.start_worker()


def _after_fork() -> None:  # a lock the parent's threads may have held
    global _stamp_lock
    _stamp_lock = threading.Lock()
    _spares.clear()  # the parent's (a child writes under its own pid)


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


def _write_file(path: str, data: bytes | str | tuple) -> None:
    """open/write/close without the buffered file object (its extra syscalls add up over
    the hundreds of small files of a profile); a tuple's parts one after the other."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        for part in data if isinstance(data, tuple) else (data,):
            view = memoryview(part.encode() if isinstance(part, str) else part)
            while view:
                view = view[os.write(fd, view):]
    except OSError as e:  # os.write's error names no file (a full disk): name it
        raise OSError(e.errno, e.strerror, path) from None
    finally:
        os.close(fd)


def sha256_of(parts) -> str:
    """The SHA-256 (hex) of bytes or str parts (str as UTF-8), one after the other."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
    return digest.hexdigest()


def read_file(path: str) -> bytes:
    """A file's bytes: read in one call of its size (``Path.read_bytes`` goes through a
    buffered file object, at twice the cost for the exporter's trace.json)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        data = os.read(fd, os.fstat(fd).st_size)
        more = []
        while chunk := os.read(fd, 1 << 20):  # to the end: a short read, or grown since
            more.append(chunk)
        return data + b"".join(more) if more else data
    finally:
        os.close(fd)


def prepare_files(program) -> None:
    """Make ``program``'s executable text and digest and its instruction trace's text now, so
    that a later export only writes (or links) them. Called inside the user's op, at the
    Program's first run (which already pays for lowering and modeling it): a Program that
    cannot be serialised or modeled is left for the export, which reports it."""
    try:
        _Executable.of(program)
        from ..sim import simulate

        _itrace_body(program, simulate(program))
    except Exception:
        pass


class _Executable:
    """One executable's text and checksum (Programs are immutable: each is hashed once), and
    the file last written with it. Creating a file costs far more than linking one on common
    file systems, so a later profile of this process hard-links that file -- when it is still
    the file that was written (same inode, size and mtime)."""

    _known: dict[str, "_Executable"] = {}  # program hash -> its executable, most recent last
    _lock = threading.Lock()  # launching threads prepare executables too (autograd's, the user's)

    def __init__(self, text: str):
        self.text = text
        data = text.encode()
        self.size, self.sha256 = len(data), hashlib.sha256(data).hexdigest()
        self._source: tuple | None = None  # (path, inode, size, mtime in ns) of the file last written

    @classmethod
    def of(cls, program) -> "_Executable":
        text = program.dumps()
        with cls._lock:
            return cls._of(program, text)

    @classmethod
    def _of(cls, program, text: str) -> "_Executable":
        exe = cls._known.get(program.hash)
        if exe is None or exe.text is not text:
            if exe is None or exe.text != text:  # same hash, other metadata: another file
                exe = cls(text)
            else:
                exe.text = text
            cls._known[program.hash] = exe
            if len(cls._known) > 1024:
                cls._known.pop(next(iter(cls._known)))
        return exe

    def link_source(self) -> tuple | None:
        """``(path, inode, size, mtime in ns)`` of the file last written with this text, for
        a later profile to link while it is unchanged; None before one is written."""
        return self._source

    def written(self, target: str, final: str) -> None:
        """Written at ``target``, to be at ``final`` once its profile is finished."""
        st = os.stat(target)
        self._source = (final, st.st_ino, st.st_size, st.st_mtime_ns)

    def moved(self, final: str) -> None:
        """The same file (linked) is at ``final`` too: a later profile links that one."""
        self._source = (final, *self._source[1:])


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
