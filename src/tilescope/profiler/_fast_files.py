"""Making a profile's files cheaply: one system call per step, digests made once, links
instead of copies.

An export writes dozens of files, and on some file systems (network ones, busy virtual disks)
each ``open`` costs hundreds of microseconds. So a file is written with raw ``os.open`` /
``os.write`` (no buffered file object), read in one call of its size, and hashed from the parts
it was made of; an executable's text and checksum are made once per Program -- at its first run,
inside the user's op, which already pays for lowering and modeling it (:func:`prepare_files`) --
and a later profile of this process hard-links the file an earlier one wrote while that file is
unchanged.
"""

from __future__ import annotations

import hashlib
import os
import threading

from ..errors import TilescopeError
from ._itrace import _itrace_body

__all__ = ["write_file", "read_file", "sha256_of", "link_if_unchanged", "prepare_files", "Executable"]


def link_if_unchanged(link: tuple, target: str) -> bool:
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


def write_file(path: str, data: bytes | str | tuple) -> None:
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
        Executable.of(program)
        from ..sim import simulate

        _itrace_body(program, simulate(program))
    except (TilescopeError, TypeError, ValueError):  # not modeled, or a value JSON cannot hold (orjson's
        pass  # error is a TypeError): the export meets it again and reports it; a bug surfaces here


class Executable:
    """One executable's text and checksum (Programs are immutable: each is hashed once), and
    the file last written with it. Creating a file costs far more than linking one on common
    file systems, so a later profile of this process hard-links that file -- when it is still
    the file that was written (same inode, size and mtime)."""

    _known: dict[str, "Executable"] = {}  # program hash -> its executable, most recent last
    _lock = threading.Lock()  # launching threads prepare executables too (autograd's, the user's)

    def __init__(self, text: str):
        self.text = text
        data = text.encode()
        self.size, self.sha256 = len(data), hashlib.sha256(data).hexdigest()
        self._source: tuple | None = None  # (path, inode, size, mtime in ns) of the file last written

    @classmethod
    def of(cls, program) -> "Executable":
        text = program.dumps()
        with cls._lock:
            return cls._of(program, text)

    @classmethod
    def _of(cls, program, text: str) -> "Executable":
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
