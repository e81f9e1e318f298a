"""Errors of C++ operators: building, running a kernel, and the output coverage check."""

from __future__ import annotations

import re

from ..errors import TilescopeError

__all__ = ["CppError", "CompileError", "CppKernelError", "CoverageError"]


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
    """A check inside a running kernel failed (TCM pool, accessor bounds, writes to inputs)."""


class CoverageError(CppError):
    """Output elements were written by more than one core, or never written."""
