"""The analysis engine: tilescope profiles and real Kineto traces as fast tables.

One entry point, :func:`open`, returns a :class:`Trace` over Parquet tables queried with
DuckDB; each analysis is a method backed by its own module (op table, lineage, breakdown,
gaps, roofline, memory, window, replay) returning a pyarrow Table or plain data;
:func:`diff` compares traces. Jobs too big for one process: :func:`ingest_ranks` ingests
per-rank traces in parallel into a hive Parquet layout, :func:`cross_rank` analyses it on
DuckDB or on a Dask cluster.

>>> import tilescope.trace as tt
>>> t = tt.open("tests/data/kineto/cpu_only_tiny.json.gz")     # doctest: +SKIP
>>> t.sql("SELECT kind, count(*) FROM events GROUP BY ALL ORDER BY ALL").fetchall()  # doctest: +SKIP
[('annotation', 10), ('op', 4), ('other', 3), ('step', 1)]

This package imports DuckDB only when a trace is opened, so ``tilescope --help`` stays fast.
"""

from __future__ import annotations

from ._jsonscan import TraceFormatError
from ._schema import CATEGORY_KINDS, TABLES

__all__ = ["open", "diff", "diff_profile", "Trace", "TraceFormatError", "TraceWarning", "TABLES", "CATEGORY_KINDS", "VENDORS",
           "GPU_PEAKS", "ingest_ranks", "rank_metrics", "cross_rank", "RANK_METRICS"]


def open(paths, *, align: str = "none", progress: bool | None = None, refresh: bool = False):  # noqa: A001
    """Open profile directories, Kineto/Chrome traces (one per rank; ``.json`` or ``.json.gz``),
    a directory of per-rank traces, or an executable + instruction-trace pair.

    Ingest happens once per file (cached as Parquet under ``$TILESCOPE_CACHE_DIR/trace``, default
    ``~/.cache/tilescope/trace``); ``refresh=True`` re-ingests. ``align='start'`` shifts each
    rank so that their first events coincide (for clocks that disagree)."""
    from ._trace import open_trace

    return open_trace(paths, align=align, progress=progress, refresh=refresh)


def diff(*traces, **kw):
    """Compare two or more traces (paths or Trace objects); the first is the base.
    Returns a :class:`tilescope.trace._diff.TraceDiff` (summary, ops, regions, fusion findings)."""
    from ._diff import diff as _diff

    return _diff(*traces, **kw)


def diff_profile(trace) -> dict:
    """One trace's part of :func:`diff` (plain data): compute it once, pass it to
    ``diff(..., profiles=[...])`` for each comparison the trace takes part in."""
    from ._diff import diff_profile as _profile

    return _profile(trace)


def __getattr__(name):
    if name in ("Trace", "TraceWarning"):
        from . import _trace

        return getattr(_trace, name)
    if name == "VENDORS":
        from ._devices import VENDORS

        return VENDORS
    if name in ("ingest_ranks", "rank_metrics", "cross_rank", "RANK_METRICS"):  # jobs past one machine
        from . import _multirank

        return getattr(_multirank, name)
    if name == "GPU_PEAKS":
        from ._roofline import GPU_PEAKS

        return GPU_PEAKS
    raise AttributeError(f"module 'tilescope.trace' has no attribute {name!r}")
