"""The few helpers the explorer needs on top of the analysis engine's public API.

Everything here goes through ``tilescope.trace`` (``open``, ``Trace.sql`` and the analysis
methods); nothing reads the engine's private modules or the device.
"""

from __future__ import annotations

__all__ = ["arrow", "rows", "open_source"]


def arrow(rel):
    """A DuckDB relation as a pyarrow Table (the analysis engine's own conversion)."""
    from ..trace.internal import arrow as _arrow

    return _arrow(rel)


def rows(rel) -> list[dict]:
    """A DuckDB relation as a list of dicts."""
    return arrow(rel).to_pylist()


def open_source(path: str):
    """Open one explorer source (profile directory, Kineto trace, directory of per-rank
    traces, or an executable + instruction-trace pair given as ``EXEC.json+ITRACE.json``)."""
    import warnings

    import tilescope.trace as tt

    paths = path.split("+") if "+" in path and not __import__("os").path.exists(path) else path
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the explorer shows the trace's warnings in its banner
        return tt.open(paths)
