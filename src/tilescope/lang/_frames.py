"""Where the user's code is: source lines for provenance and errors, and tracebacks
that end at the kernel line instead of inside tilescope.

The language's own modules (and ``tilescope.isa``'s kernel calls, and the NKI
surface ``tilescope.nki``) are *internal*: provenance and error locations name the first frame outside them.
A traceback leaving :func:`tilescope.simulate` drops every frame of the core
packages (lang, isa, program, sim, spec), so its last entry is the user's line.
Set ``TILESCOPE_FULL_TRACEBACK=1`` to keep them (for debugging tilescope itself).
"""

from __future__ import annotations

import linecache
import os
import sys
import types
from typing import Any, TypeVar

_E = TypeVar("_E", bound=BaseException)

__all__ = [
    "is_internal", "user_frame", "display_path", "locate", "filter_traceback", "source_line", "surface",
]

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LANG = os.path.dirname(os.path.abspath(__file__)) + os.sep
_NKI = os.path.join(_PKG, "nki") + os.sep  # the NKI-compatible surface forwards to the language
_ISA_API = os.path.join(_PKG, "isa", "_kernel_api.py")
# tilescope subpackages/modules whose frames a user never needs to see
_HIDDEN = tuple(_PKG + p for p in ("lang" + os.sep, "isa" + os.sep, "program" + os.sep, "sim" + os.sep,
                                   "spec" + os.sep, "nki" + os.sep, "errors.py", "dtypes.py", "bench.py"))
_internal_cache: dict[str, bool] = {}
_display_cache: dict[str, str] = {}


def is_internal(filename: str) -> bool:
    """True for the language's own files (skipped when looking for the user's line)."""
    hit = _internal_cache.get(filename)
    if hit is None:
        path = os.path.abspath(filename)
        hit = _internal_cache[filename] = path.startswith(_LANG) or path.startswith(_NKI) or path == _ISA_API
    return hit


def user_frame(depth: int = 2) -> types.FrameType | None:
    """The innermost frame outside the language's modules (``depth`` skips callers)."""
    f: types.FrameType | None = sys._getframe(depth)
    while f is not None and is_internal(f.f_code.co_filename):
        f = f.f_back
    return f


def display_path(filename: str) -> str:
    """A file name as shown in provenance and errors: relative to the working
    directory when it is inside it, absolute otherwise."""
    hit = _display_cache.get(filename)
    if hit is None:
        path = os.path.abspath(filename)
        try:
            rel = os.path.relpath(path)
        except ValueError:  # another drive
            rel = path
        hit = _display_cache[filename] = path if rel.startswith("..") else rel
    return hit


def source_line(filename: str, lineno: int) -> str:
    return linecache.getline(filename, lineno).strip()


def locate(err: _E, frame, kernel: str | None = None) -> _E:
    """Add the user's file:line (and the line's text) to ``err``'s message, once."""
    if getattr(err, "kernel_line", None) is not None or frame is None:
        return err
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    where = f"{display_path(filename)}:{lineno}"
    text = source_line(filename, lineno)
    func = frame.f_code.co_name
    msg = str(err.args[0]) if err.args else ""
    detail = f"\n  at {where} in {func}" + (f": {text}" if text else "")
    if kernel and kernel != func:
        detail += f" (kernel {kernel!r})"
    err.args = (msg + detail,) + tuple(err.args[1:])
    tagged: Any = err  # the location rides on the exception as two extra attributes
    tagged.kernel_file, tagged.kernel_line = filename, lineno
    return err


def _hidden(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_HIDDEN)


def filter_traceback(tb):
    """``tb`` without the frames of tilescope's core packages."""
    if os.environ.get("TILESCOPE_FULL_TRACEBACK"):
        return tb
    kept = []
    while tb is not None:
        if not _hidden(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for entry in reversed(kept):
        out = types.TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out


def surface(fn):
    """Decorate a user-facing method that is not a builtin (indexing, index arithmetic):
    a tilescope error it raises names the user's line."""
    import functools

    from ..errors import TilescopeError

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TilescopeError as e:
            from ._context import maybe_current

            ctx = maybe_current()
            raise locate(e, user_frame(2), ctx.kernel if ctx is not None else None)

    return wrapper
