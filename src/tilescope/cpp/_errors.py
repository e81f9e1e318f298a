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
    def from_output(cls, what: str, output: str) -> "CompileError":
        lines = output.rstrip().splitlines()
        first = next((ln for ln in lines if re.search(r":\d+:\d+: (fatal )?error:", ln)), None)
        if first is None:
            first = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
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
