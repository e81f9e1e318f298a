"""Which output elements each core wrote: overlaps, gaps, and a diagnosis.

On the device the GpSimd cores run a multicore kernel at the same time with no
synchronisation between them, so each output element must be written by exactly one
core. From the log of every ``tcm_to_tensor`` into the output, :func:`check_coverage`
finds elements written by more than one core and elements never written, names the
cores and the offset ranges, and recognises the classic partition-offset mistake.

>>> import numpy as np
>>> from tilescope.cpp._abi import LOG_DTYPE
>>> def writes(*spans):  # (offset, count) pairs of one core
...     log = np.zeros(len(spans), LOG_DTYPE)
...     log["dir"], log["arg"] = 1, -1
...     log["offset"], log["count"] = zip(*spans)
...     return log
>>> report = check_coverage([writes((0, 4)), writes((4, 4))], (8,))
>>> report.ok
True
>>> report = check_coverage([writes((0, 5)), writes((4, 3))], (8,))
>>> report.overlap_elements, report.missing_elements
(1, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import numpy as np

__all__ = ["CoverageReport", "check_coverage"]

_SHOW = 4  # ranges listed per kind in a message


@dataclass(frozen=True)
class CoverageReport:
    """Result of the coverage check of one call.

    ``overlaps``: ``(start, end, cores)`` ranges written by more than one core;
    ``missing``: ``(start, end)`` ranges never written. Offsets are flat element indices.
    """

    numel: int
    shape: tuple[int, ...]
    cores: int
    overlaps: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    missing: list[tuple[int, int]] = field(default_factory=list)
    writes_per_core: tuple[int, ...] = ()
    elements_per_core: tuple[int, ...] = ()

    @property
    def overlap_elements(self) -> int:
        return sum(e - s for s, e, _ in self.overlaps)

    @property
    def missing_elements(self) -> int:
        return sum(e - s for s, e in self.missing)

    @property
    def ok(self) -> bool:
        return not self.overlaps and not self.missing


def _merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of half-open intervals, as sorted disjoint intervals."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def check_coverage(core_logs: list[np.ndarray], shape: tuple[int, ...]) -> CoverageReport:
    """Analyse the output writes (``dir == 1``, ``arg == -1``) of each core's log."""
    numel = prod(shape)
    merged = []
    writes, elements = [], []
    for log in core_logs:
        w = log[(log["dir"] == 1) & (log["arg"] == -1)]
        s = w["offset"].astype(np.int64)
        e = s + w["count"].astype(np.int64)
        ms, me = _merge(s, e)
        merged.append((ms, me))
        writes.append(len(w))
        elements.append(int((me - ms).sum()))
    # sweep over every boundary: how many cores cover each elementary segment
    bounds = [np.array([0, numel], np.int64)] + [np.concatenate([ms, me]) for ms, me in merged]
    points = np.unique(np.concatenate(bounds))
    diff = np.zeros(len(points) + 1, np.int64)
    for ms, me in merged:
        np.add.at(diff, np.searchsorted(points, ms), 1)
        np.add.at(diff, np.searchsorted(points, me), -1)
    count = np.cumsum(diff)[: len(points) - 1]
    seg_s, seg_e = points[:-1], points[1:]
    inside = seg_e <= numel
    overlaps: list[tuple[int, int, tuple[int, ...]]] = []
    for k in np.flatnonzero((count >= 2) & inside):
        a, b = int(seg_s[k]), int(seg_e[k])
        who = tuple(c for c, (ms, me) in enumerate(merged)
                    if len(ms) and (j := np.searchsorted(ms, a, "right") - 1) >= 0 and me[j] >= b)
        if overlaps and overlaps[-1][1] == a and overlaps[-1][2] == who:
            overlaps[-1] = (overlaps[-1][0], b, who)
        else:
            overlaps.append((a, b, who))
    missing: list[tuple[int, int]] = []
    for k in np.flatnonzero((count == 0) & inside):
        a, b = int(seg_s[k]), int(seg_e[k])
        if missing and missing[-1][1] == a:
            missing[-1] = (missing[-1][0], b)
        else:
            missing.append((a, b))
    return CoverageReport(numel, tuple(shape), len(core_logs), overlaps, missing, tuple(writes), tuple(elements))


# ---- messages ------------------------------------------------------------------------------

def _index(flat: int, shape: tuple[int, ...]) -> str:
    if len(shape) <= 1:
        return f"[{flat}]"
    idx = []
    for n in reversed(shape):
        idx.append(flat % n)
        flat //= n
    return "[" + ", ".join(map(str, reversed(idx))) + "]"


def _range(a: int, b: int, shape: tuple[int, ...]) -> str:
    n = b - a
    where = f"out{_index(a, shape)}" if n == 1 else f"out{_index(a, shape)} .. out{_index(b - 1, shape)}"
    return f"elements [{a}, {b}) ({n} element{'s' if n != 1 else ''}: {where})"


def _cores(cores: tuple[int, ...]) -> str:
    if len(cores) == 2:
        return f"cores {cores[0]} and {cores[1]}"
    return "cores " + ", ".join(map(str, cores))


def _core_line(core: int, log: np.ndarray, where: str) -> str:
    w = log[(log["dir"] == 1) & (log["arg"] == -1)]
    if not len(w):
        return f"  core {core}: no writes to the output"
    offs = w["offset"]
    counts = np.unique(w["count"])
    size = f"{int(counts[0])} elements" if len(counts) == 1 else f"{int(counts.min())}-{int(counts.max())} elements"
    shown = ", ".join(str(int(o)) for o in offs[:4]) + (f", ... {int(offs[-1])}" if len(offs) > 4 else "")
    lo, hi = int(offs.min()), int((offs + w["count"]).max())
    many = len(w) != 1
    return (f"  core {core}: {len(w)} write{'s' if many else ''} of {size} at offset{'s' if many else ''} {shown} "
            f"(span [{lo}, {hi})){where}")


def _regular(offsets: np.ndarray) -> int | None:
    """The constant step between consecutive offsets, if there is one."""
    if len(offsets) < 2:
        return None
    d = np.diff(offsets)
    return int(d[0]) if np.all(d == d[0]) and d[0] > 0 else None


def _diagnose(report: CoverageReport, core_logs: list[np.ndarray]) -> list[str]:
    """Recognise the usual causes from the shape of each core's writes."""
    firsts, steps, counts, spans = [], [], [], []
    for log in core_logs:
        w = log[(log["dir"] == 1) & (log["arg"] == -1)]
        if not len(w):
            continue
        offs = w["offset"].astype(np.int64)
        firsts.append(int(offs[0]))
        steps.append(_regular(offs))
        counts.append(len(w))
        spans.append(int((offs + w["count"]).max() - offs.min()))
    hints = []
    if report.overlaps and len(firsts) >= 2:
        gap = _regular(np.array(firsts))
        step = steps[0]
        if gap is not None and step is not None and all(s == step for s in steps) and gap < spans[0]:
            if gap == counts[0] and step > 1:
                hints.append(
                    f"Each core's first write is {gap} elements after the previous core's, which equals its "
                    f"number of rows ({counts[0]}), while its rows are {step} elements apart: the row index was "
                    f"scaled by the row size but the core's partition offset was not. This is the pattern of "
                    f"an offset computed as `partition*cpu_id + i*row_size`; write "
                    f"`(partition*cpu_id + i)*row_size` (= partition*cpu_id*row_size + i*row_size)."
                )
            else:
                hints.append(
                    f"Consecutive cores start {gap} elements apart, but each core's writes span {spans[0]} "
                    f"elements, so the cores' ranges overlap. Each core should write [start, start + share) "
                    f"with start = share*cpu_id, where share covers whole rows: a partition offset of p rows "
                    f"is p*row_size elements: `(partition*cpu_id + i)*row_size`, not "
                    f"`partition*cpu_id + i*row_size`."
                )
        else:
            hints.append(
                "Cores write overlapping ranges: derive each core's range only from get_cpu_id() and "
                "get_cpu_count(), so that the ranges of all cores tile the output exactly once."
            )
    if report.missing and not report.overlaps:
        tail = report.missing[-1]
        if len(report.missing) == 1 and tail[1] == report.numel and report.cores > 1:
            hints.append(
                f"Only the last {tail[1] - tail[0]} elements are missing: when the work does not divide "
                f"evenly among {report.cores} cores, someone must take the remainder (e.g. the last core "
                f"runs to the end, or the first `rows % cores` cores take one row more)."
            )
        elif sum(report.writes_per_core) == 0:
            hints.append(
                "No core wrote the output: kernels write their results with "
                "`Tensor t_out = get_dst_tensor(); tcm_accessor(t_out).tcm_to_tensor<T>(buf, offset, count);`."
            )
    return hints


def coverage_message(report: CoverageReport, core_logs: list[np.ndarray], op: str, where: list[str]) -> str:
    """The error text of a failed check. ``where[c]`` is `` at file:line`` of core c's writes."""
    shape = report.shape
    mode = f"multicore, {report.cores} GpSimd cores" if report.cores > 1 else "single core"
    lines = [f"C++ operator {op} ({mode}) did not write its output {list(shape)} exactly once:"]
    if report.overlaps:
        lines.append(f"- {report.overlap_elements} output elements were written by more than one core "
                     f"(the cores run at the same time, so the result depends on timing):")
        for a, b, who in report.overlaps[:_SHOW]:
            lines.append(f"    {_range(a, b, shape)} by {_cores(who)}")
        if len(report.overlaps) > _SHOW:
            lines.append(f"    ... and {len(report.overlaps) - _SHOW} more ranges")
    if report.missing:
        lines.append(f"- {report.missing_elements} output elements were never written (they hold NaN, the "
                     f"fill of a new output):")
        for a, b in report.missing[:_SHOW]:
            lines.append(f"    {_range(a, b, shape)}")
        if len(report.missing) > _SHOW:
            lines.append(f"    ... and {len(report.missing) - _SHOW} more ranges")
    lines.append("Writes of each core (tcm_to_tensor into get_dst_tensor()):")
    for c, log in enumerate(core_logs):
        lines.append(_core_line(c, log, where[c] if c < len(where) else ""))
    hints = _diagnose(report, core_logs)
    if hints:
        lines.append("Hint: " + "\nHint: ".join(hints))
    return "\n".join(lines)
