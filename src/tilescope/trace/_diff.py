"""One diff engine for `tilescope diff` and `tilescope compare`: by op, by region, by fusion.

A *region* is the nearest enclosing ``record_function`` / module annotation of an op (step
markers excluded), else ``(step)`` inside a ProfilerStep, else ``(trace)``. Per-step
figures are used when every trace has steps, so runs of different lengths compare.
The fusion finding compares, per region, which ops launched device work and how many
executions (kernels on GPUs) that took: "6 aten ops became 1 execution".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pyarrow as pa

from ._labels import distinct, short_label
from ._nesting import ensure_hierarchy

__all__ = ["diff", "diff_profile", "TraceDiff", "FusionFinding", "program_overlap", "SAME_PROGRAM_MIN_OVERLAP"]

_STEP = re.compile(r"(#\d+|\*)$")  # ProfilerStep#3 and ProfilerStep* (a sim profile's) fold into ProfilerStep

# Two traces are the same program when they share most of their op mix or their regions.
# op overlap: the histogram intersection of the ops' shares of host self time (1: the same
# mix, 0: no op in common; self time rather than calls, because bookkeeping ops -- empty, to,
# detach, view -- are called by every model); region overlap: the Jaccard index of the
# annotation / module region names.
# Below this on both (or on ops alone when neither trace has regions), the diff says the
# traces are different programs and reports no fusion: a fused run keeps its model's regions
# (RMSNorm stays RMSNorm) even when its ops change, an unrelated model shares neither.
SAME_PROGRAM_MIN_OVERLAP = 0.25
_STEPS = frozenset({"ProfilerStep"})  # step markers are not regions of the model


def program_overlap(ops_a: dict, ops_b: dict, regions_a: set, regions_b: set) -> dict:
    """``{"ops": op overlap, "regions": region overlap or None}`` (see SAME_PROGRAM_MIN_OVERLAP).

    >>> program_overlap({"aten::mm": 2, "aten::add": 2}, {"aten::mm": 1, "aten::relu": 3}, {"Linear"}, {"Linear", "ReLU"})
    {'ops': 0.25, 'regions': 0.5}
    """
    ta, tb = sum(ops_a.values()) or 1, sum(ops_b.values()) or 1
    ops = sum(min(ops_a[k] / ta, ops_b[k] / tb) for k in set(ops_a) & set(ops_b))
    union = regions_a | regions_b
    return {"ops": round(ops, 6), "regions": round(len(regions_a & regions_b) / len(union), 6) if union else None}


@dataclass(frozen=True)
class FusionFinding:
    """Ops that ran as ``before_executions`` device executions in the base and as
    ``after_executions`` in the other trace, inside one region."""

    region: str
    base: str
    other: str
    before_ops: dict
    after_ops: dict
    before_executions: float
    after_executions: float
    before_device_ns: float
    after_device_ns: float
    before_bytes: float | None
    after_bytes: float | None
    modeled: bool

    def text(self) -> str:
        def fmt_ops(d):
            return ", ".join(f"{k}" + (f" x{v:g}" if v != 1 else "") for k, v in sorted(d.items()))

        n_before = sum(self.before_ops.values())
        dx = self.after_executions - self.before_executions
        dt = (self.after_device_ns - self.before_device_ns) / 1000
        parts = [f"{dx:+g} executions", f"{dt:+,.2f} us device time"]
        if self.before_bytes is not None and self.after_bytes is not None:
            parts.insert(1, f"{(self.after_bytes - self.before_bytes) / 1e6:+,.3f} MB HBM traffic")
        label = " (modeled)" if self.modeled else ""
        where = {"(step)": "Per step", "(trace)": "In the trace"}.get(self.region, f"In {self.region}")
        return (f"{where}: {n_before:g} ops ({fmt_ops(self.before_ops)}) ran as {self.before_executions:g} "
                f"device executions in {self.base}; in {self.other} they became {self.after_executions:g} "
                f"({fmt_ops(self.after_ops)}): {', '.join(parts)}{label}")


@dataclass
class TraceDiff:
    names: list[str]
    summary: pa.Table
    ops: pa.Table
    regions: pa.Table
    fusion: list[FusionFinding] = field(default_factory=list)
    per_step: bool = False
    modeled: list[bool] = field(default_factory=list)  # per trace: its times come from the device model
    overlap: list[dict] = field(default_factory=list)  # per other trace: program_overlap() with the base
    warnings: list[str] = field(default_factory=list)

    def times_label(self) -> str:
        """Where each column's times come from (``naive modeled, cuda measured``)."""
        return ", ".join(f"{n} {'modeled' if m else 'measured'}" for n, m in zip(self.names, self.modeled))

    def to_dict(self) -> dict:
        return {"names": self.names, "modeled": self.modeled, "per_step": self.per_step,
                "summary": self.summary.to_pylist(),
                "ops": self.ops.to_pylist(), "regions": self.regions.to_pylist(),
                "fusion": [dict(f.__dict__, text=f.text()) for f in self.fusion],
                "overlap": self.overlap, "warnings": self.warnings}


def diff_profile(trace) -> dict:
    """What :func:`diff` needs of one trace (its summary, op and region aggregates): plain
    data, JSON-safe, so a caller comparing the same trace with several others (the explorer)
    computes it once and passes it as ``diff(..., profiles=[...])``."""
    from ._summary import summary
    from ._trace import _arrow

    ensure_hierarchy(trace)
    s = summary(trace)
    steps = s["steps"]
    # op -> (calls, host self, device total, device self)
    ops = {r[0]: r[1:] for r in trace.sql("""
        SELECT e.name, count(*), sum(h.self_ns), sum(h.dev_total_ns), sum(h.dev_self_ns)
        FROM events e JOIN _hier h USING (eid) WHERE e.kind = 'op' AND e.ph = 'X' GROUP BY e.name""").fetchall()}
    # region of every op that launched device work: nearest non-step annotation ancestor
    dev = _arrow(trace.sql("""
        WITH RECURSIVE up(op_eid, eid, lvl) AS (
            SELECT DISTINCT op_eid, op_eid, 0 FROM _links WHERE op_eid IS NOT NULL
            UNION ALL SELECT up.op_eid, h.parent_eid, up.lvl + 1 FROM up JOIN _hier h ON h.eid = up.eid
            WHERE h.parent_eid >= 0 AND up.lvl < 64),
        reg AS (SELECT up.op_eid, arg_min(e.name, up.lvl) FILTER (WHERE e.kind = 'annotation') AS region,
                       bool_or(e.kind = 'step') AS in_step
                FROM up JOIN events e ON e.eid = up.eid GROUP BY up.op_eid)
        SELECT o.name AS op, coalesce(reg.region, CASE WHEN reg.in_step THEN '(step)' ELSE '(trace)' END) AS region,
               d.dur_ns, d.program_hash, x.hbm_bytes
        FROM _links k JOIN events d ON d.eid = k.dev_eid JOIN events o ON o.eid = k.op_eid
        LEFT JOIN reg ON reg.op_eid = k.op_eid
        LEFT JOIN (SELECT DISTINCT program_hash, hbm_bytes FROM executables) x ON x.program_hash = d.program_hash"""))
    regions_dev: dict = {}
    for op, region, dur, ph, hbm in zip(*(dev.column(c).to_pylist() for c in ("op", "region", "dur_ns", "program_hash", "hbm_bytes"))):
        region = _STEP.sub("", region or "(trace)")
        r = regions_dev.setdefault(region, {"ops": {}, "execs": 0, "dev_ns": 0, "bytes": 0, "has_bytes": True})
        r["ops"][op] = r["ops"].get(op, 0) + 1
        r["execs"] += 1
        r["dev_ns"] += dur or 0
        if hbm is None:
            r["has_bytes"] = False
        else:
            r["bytes"] += hbm
    regions = {}
    for name, n, total in trace.sql("""SELECT name, count(*), sum(dur_ns) FROM events
                                        WHERE kind IN ('annotation', 'step') AND ph = 'X' AND side = 'host' GROUP BY name""").fetchall():
        key = _STEP.sub("", name)
        a = regions.setdefault(key, [0, 0])
        a[0] += n
        a[1] += total or 0
    return {"summary": s, "steps": steps, "ops": ops, "regions": regions, "regions_dev": regions_dev,
            "modeled": trace.modeled}


def diff(*traces, names: list[str] | None = None, profiles: list | None = None) -> TraceDiff:
    """Compare two or more traces (``Trace`` objects or paths); the first is the base.
    ``names``: one per trace, None where its short label will do (labels of the paths, made
    distinct). ``profiles``: one per trace, each :func:`diff_profile` of it already computed
    or None (computed here)."""
    from ._trace import Trace, open_trace

    if len(traces) == 1 and isinstance(traces[0], (list, tuple)):
        traces = tuple(traces[0])
    if len(traces) < 2:
        raise ValueError(f"diff needs at least two traces, got {len(traces)}")
    ts = [t if isinstance(t, Trace) else open_trace(t) for t in traces]
    given = list(names) if names is not None else [None] * len(ts)
    chosen = [n for n in given if n is not None]
    if len(given) != len(ts) or len(set(chosen)) != len(chosen):
        raise ValueError(f"diff needs one distinct name per trace: got {given} for {len(ts)} traces")
    sources = [t.sources[0] for t in ts]
    names = distinct([n if n is not None else short_label(s) for n, s in zip(given, sources)], sources)
    if profiles is not None and len(profiles) != len(ts):
        raise ValueError(f"diff needs one profile (or None) per trace: got {len(profiles)} for {len(ts)} traces")
    profs = [p if p is not None else diff_profile(t) for t, p in zip(ts, profiles or [None] * len(ts))]
    per_step = all(p["steps"] > 0 for p in profs)
    div = [p["steps"] if per_step else 1 for p in profs]
    summ = {"metric": [], **{n: [] for n in names}}
    for key, label in (("events", "events"), ("device_busy_ns", "device busy ns (summed over device lanes)"), ("span_ns", "span ns"),
                       ("steps", "steps"), ("executables", "executables")):
        summ["metric"].append(label)
        for n, p, d in zip(names, profs, div):
            v = p["summary"][key]
            summ[n].append(v / d if key in ("events", "device_busy_ns", "span_ns") else v)
    summ["metric"].append("device executions / kernels")
    for n, p, d in zip(names, profs, div):
        summ[n].append(sum(r["execs"] for r in p["regions_dev"].values()) / d)
    all_ops = sorted(set().union(*(p["ops"] for p in profs)))
    ops = {"op": all_ops}
    for n, p, d in zip(names, profs, div):
        ops[f"calls[{n}]"] = [p["ops"].get(o, (0, 0, 0, 0))[0] / d for o in all_ops]
        ops[f"host_self_ns[{n}]"] = [(p["ops"].get(o, (0, 0, 0, 0))[1] or 0) / d for o in all_ops]
        ops[f"device_total_ns[{n}]"] = [(p["ops"].get(o, (0, 0, 0, 0))[2] or 0) / d for o in all_ops]
    for n in names[1:]:
        ops[f"delta_device_ns[{n}]"] = [b - a for a, b in zip(ops[f"device_total_ns[{names[0]}]"], ops[f"device_total_ns[{n}]"])]
        ops[f"delta_calls[{n}]"] = [b - a for a, b in zip(ops[f"calls[{names[0]}]"], ops[f"calls[{n}]"])]
    all_regions = sorted(set().union(*(p["regions"] for p in profs)))
    regions = {"region": all_regions}
    for n, p, d in zip(names, profs, div):
        regions[f"calls[{n}]"] = [p["regions"].get(r, (0, 0))[0] / d for r in all_regions]
        regions[f"total_ns[{n}]"] = [p["regions"].get(r, (0, 0))[1] / d for r in all_regions]
    fusion = []
    base = profs[0]
    overlap, warnings = [], []
    for n, p in zip(names[1:], profs[1:]):
        ov = program_overlap({k: v[1] or 0 for k, v in base["ops"].items()}, {k: v[1] or 0 for k, v in p["ops"].items()},
                             set(base["regions"]) - _STEPS, set(p["regions"]) - _STEPS)
        ov["other"] = n
        ov["same_program"] = ov["ops"] >= SAME_PROGRAM_MIN_OVERLAP or (
            ov["regions"] is not None and ov["regions"] >= SAME_PROGRAM_MIN_OVERLAP)
        overlap.append(ov)
        if not ov["same_program"]:
            reg_text = "" if ov["regions"] is None else f" and {ov['regions']:.0%} of their regions"
            warnings.append(f"{names[0]} and {n} look like different programs: they share {ov['ops']:.0%} of their "
                            f"ops' host time{reg_text} (below {SAME_PROGRAM_MIN_OVERLAP:.0%}); the op and region tables compare "
                            f"them, but no fusion is reported between them")
    for n, p, d, ov in zip(names[1:], profs[1:], div[1:], overlap):
        if p["modeled"] != base["modeled"]:
            continue  # a modeled and a measured trace ran on different devices: their kernels differ anyway
        if not ov["same_program"]:
            continue  # unrelated models: ops that differ were never fused into one another
        for region in sorted(set(base["regions_dev"]) & set(p["regions_dev"])):
            a, b = base["regions_dev"][region], p["regions_dev"][region]
            gone = {k: v / div[0] for k, v in a["ops"].items() if k not in b["ops"]}
            new = {k: v / d for k, v in b["ops"].items() if k not in a["ops"]}
            if not gone or not new:
                continue
            before_x = sum(gone.values())
            after_x = sum(new.values())
            if after_x >= before_x or len(gone) + 0 < 1:
                continue
            fusion.append(FusionFinding(
                region=region, base=names[0], other=n, before_ops=gone, after_ops=new,
                before_executions=before_x, after_executions=after_x,
                before_device_ns=a["dev_ns"] / div[0], after_device_ns=b["dev_ns"] / d,
                before_bytes=a["bytes"] / div[0] if a["has_bytes"] else None,
                after_bytes=b["bytes"] / d if b["has_bytes"] else None,
                modeled=base["modeled"]))
    return TraceDiff(names=names, summary=pa.table(summ), ops=pa.table(ops), regions=pa.table(regions),
                     fusion=fusion, per_step=per_step, modeled=[bool(p["modeled"]) for p in profs],
                     overlap=overlap, warnings=warnings)

