"""Errors of C++ operators: building, running a kernel, and the output coverage check."""

from __future__ import annotations

import re

from ..errors import TilescopeError

__all__ = ["CppError", "CompileError", "CppKernelError", "CoverageError", "TcmLeakWarning"]


class CppError(TilescopeError):
    """Base of every C++ operator error."""


class CompileError(CppError):
    """The compiler or linker rejected the sources. ``location`` is the first ``file:line``."""

    location: str | None = None
    output: str = ""

    @classmethod
    def from_output(cls, what: str, output: str, internal: tuple[str, ...] = ()) -> "CompileError":
        """The error of a failed compile or link; ``internal``: path prefixes of tilescope's own
        files (its header), whose errors -- the header's ``static_assert`` s -- are reported at
        the user's line that instantiated them.

        >>> out = ("inc/gpsimd.h: In instantiation of 'void f()':\\nk.cpp:7:41:   required from here\\n"
        ...        "inc/gpsimd.h:312:23: error: static assertion failed: needs a writable accessor")
        >>> CompileError.from_output("k.cpp", out, internal=("inc/",)).location
        'k.cpp:7'
        """
        lines = output.rstrip().splitlines()
        k = next((i for i, ln in enumerate(lines) if re.search(r":\d+:\d+: (fatal )?error:", ln)), None)
        if k is None:
            first = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
        else:
            first = lines[k]
            if internal and first.startswith(internal):
                first = _at_user_line(lines, k, internal) or first
        m = re.match(r"(.+?:\d+)(?::\d+)?:", first)
        shown = "\n".join(lines[:60]) + ("\n..." if len(lines) > 60 else "")
        err = cls(f"building {what} failed: {first.strip()}\n\ncompiler output:\n{shown}")
        err.location = m.group(1) if m else None
        err.output = output
        return err

    @classmethod
    def combine(cls, errors: list["CompileError"]) -> "CompileError":
        err = cls("\n\n".join(str(e) for e in errors))
        err.location = errors[0].location
        err.output = "\n".join(e.output for e in errors)
        return err


def _at_user_line(lines: list[str], k: int, internal: tuple[str, ...]) -> str | None:
    """The error of line ``k`` (in tilescope's header) restated at the user's line that led
    to it: gcc's ``required from here`` before it, clang's last ``requested here`` after it."""
    where = None
    for ln in reversed(lines[:k]):  # gcc: the instantiation chain precedes the error
        m = re.match(r"(.+?:\d+:\d+):\s+required from here", ln)
        if m and not ln.startswith(internal):
            where = m.group(1)
            break
        if re.search(r":\d+:\d+: (fatal )?error:", ln):
            break
    if where is None:  # clang: notes follow the error, the last is the outermost
        for ln in lines[k + 1:]:
            if re.search(r":\d+:\d+: (fatal )?error:", ln):
                break
            m = re.match(r"(.+?:\d+:\d+): note: in instantiation of .* requested here", ln)
            if m and not ln.startswith(internal):
                where = m.group(1)
    if where is None:
        return None
    message = re.sub(r"^.+?:\d+:\d+: ", "", lines[k])
    return f"{where}: {message}"


class CppKernelError(CppError):
    """A check inside a running kernel failed (TCM pool, accessor bounds, writes to inputs).
    ``location`` is the kernel's ``file:line`` the message names first (None if none).

    >>> CppKernelError("mylib::op: kernel.cpp:69: tcm_malloc(8000 bytes) failed").location
    'kernel.cpp:69'
    """

    def __init__(self, message: str):
        super().__init__(message)
        m = re.search(r"([\w./\\-]+\.(?:cpp|cc|cxx|c|hpp|h):\d+)", message)
        self.location = m.group(1) if m else None


class TcmLeakWarning(UserWarning):
    """A kernel returned with TCM buffers it did not free (shown by default: a leak fills the
    pool of the calls after it)."""


class CoverageError(CppError):
    """Output elements were written by more than one core, or never written."""
