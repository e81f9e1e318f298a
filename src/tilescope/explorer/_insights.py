"""The summary page: totals, utilisation (HFU / MFU / MBU), arithmetic intensity, DMA sizes,
spill bytes, per-engine active time, idle-gap classes, and rule-based recommendations.

Rules are rows of a table (a code, a test over the metrics, a message with the numbers and
a fix), like the profile doctor's. On tilescope profiles every device figure is *modeled*;
on Kineto traces figures are measured on the device the trace names, and FLOPs / bytes per
op are estimates from input shapes (the engine's roofline rules).
"""

from __future__ import annotations

import json
from typing import Callable

from ..profiler.internal import GENERIC_SHARE_LIMIT as _GENERIC_LIMIT  # the doctor's threshold
from ._engine import rows

__all__ = ["summary_page", "summary_core", "summary_analyses", "DEVICE_RULES", "KINETO_RULES"]


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _kib(x) -> str:
    return f"{x / 1024:.1f} KiB"


def _program_facts(trace, allowed) -> dict:
    """Per executable: instructions' FLOPs / bytes / busy time by (engine, kind), scaled from the
    runs that have instruction traces to every execution of that executable; spill bytes."""
    per = rows(trace.sql("""
        WITH runs AS (SELECT program_hash, count(DISTINCT run) AS runs FROM instructions GROUP BY 1),
        ex AS (SELECT program_hash, count(*) AS executions, sum(dur_ns) AS dev_ns FROM events
               WHERE cat = 'hardware' AND program_hash IS NOT NULL GROUP BY 1),
        w AS (SELECT r.program_hash, r.runs, coalesce(ex.executions, r.runs) AS executions,
                     coalesce(ex.executions, r.runs)::DOUBLE / r.runs AS scale FROM runs r LEFT JOIN ex USING (program_hash))
        SELECT i.engine, i.kind, sum(i.flops * w.scale) AS flops, sum(i.bytes * w.scale) AS bytes,
               sum((i.end_ns - i.start_ns) * w.scale) AS busy_ns, sum(w.scale) AS n,
               sum(w.scale) FILTER (WHERE i.bytes > 0 AND i.bytes < 4096) AS n_small,
               sum((i.end_ns - i.start_ns) * w.scale) FILTER (WHERE i.bytes > 0 AND i.bytes < 4096) AS busy_small
        FROM instructions i JOIN w USING (program_hash) GROUP BY ALL"""))
    spill_store = spill_reload = hbm_read = hbm_write = 0.0
    execs = {r["program_hash"]: r for r in rows(trace.sql("""
        WITH runs AS (SELECT program_hash, min(run) AS run, count(DISTINCT run) AS runs FROM instructions GROUP BY 1)
        SELECT r.program_hash, r.run, r.runs, coalesce((SELECT count(*) FROM events e WHERE e.cat = 'hardware'
               AND e.program_hash = r.program_hash), 0) AS executions FROM runs r"""))}
    from ._device_view import _executable

    for h, r in execs.items():
        try:
            ex = _executable(trace, h, allowed)
        except (KeyError, OSError, PermissionError, ValueError):
            continue
        bufs = {b["name"]: b for b in ex.get("buffers", [])}
        sizes = {x["index"]: x["bytes"] for x in rows(trace.sql(
            "SELECT index, bytes FROM instructions WHERE program_hash = ? AND run = ?", params=[h, r["run"]]))}
        n = max(r["executions"], 1) if r["executions"] else 1
        for i, ins in enumerate(ex.get("instructions", [])):
            if ins.get("kind") not in ("dma_copy", "dma_indirect"):
                continue
            b = sizes.get(i, 0) or 0
            src = bufs.get((ins.get("src") or {}).get("ap", [None])[0] or "", {})
            dst = bufs.get((ins.get("dst") or {}).get("ap", [None])[0] or "", {})
            if src.get("memory") == "hbm":
                hbm_read += b * n
                if src.get("role") == "scratch":
                    spill_reload += b * n
            if dst.get("memory") == "hbm":
                hbm_write += b * n
                if dst.get("role") == "scratch":
                    spill_store += b * n
    return {"per": per, "spill_store": spill_store, "spill_reload": spill_reload, "hbm_read": hbm_read,
            "hbm_write": hbm_write}


def _device_metrics(trace, allowed) -> dict:
    s = trace.summary()
    facts = _program_facts(trace, allowed)
    per = facts["per"]
    dev_ns = trace.sql("SELECT coalesce(sum(dur_ns), 0) FROM events WHERE cat = 'hardware'").fetchall()[0][0]
    executions = trace.sql("SELECT count(*) FROM events WHERE cat = 'hardware'").fetchall()[0][0]
    if not dev_ns:  # standalone instruction traces: the runs' spans
        dev_ns = trace.sql("SELECT coalesce(sum(m), 0) FROM (SELECT max(end_ns) AS m FROM instructions GROUP BY program_hash, run)"
                           ).fetchall()[0][0]
        executions = trace.sql("SELECT count(DISTINCT (program_hash, run)) FROM instructions").fetchall()[0][0]
    engines: dict[str, dict] = {}
    tensor = transpose = allf = dma_bytes = dma_n = dma_small = dma_busy = dma_small_busy = 0.0
    for r in per:
        e = engines.setdefault(r["engine"], {"engine": r["engine"], "busy_ns": 0.0, "instructions": 0.0, "flops": 0.0,
                                             "bytes": 0.0})
        e["busy_ns"] += r["busy_ns"] or 0
        e["instructions"] += r["n"] or 0
        e["flops"] += r["flops"] or 0
        e["bytes"] += r["bytes"] or 0
        allf += r["flops"] or 0
        if r["engine"].startswith("TensorE"):
            if r["kind"] == "transpose":
                transpose += r["flops"] or 0
            else:
                tensor += r["flops"] or 0
        if r["engine"].startswith("DMA"):
            dma_bytes += r["bytes"] or 0
            dma_n += r["n"] or 0
            dma_small += r["n_small"] or 0
            dma_busy += r["busy_ns"] or 0
            dma_small_busy += r["busy_small"] or 0
    peak_flops = hbm_bw = None
    preset_name = trace.preset_name()
    try:
        from ..spec import preset

        sp = preset(preset_name)  # None: the spec's default preset
        peak_flops, hbm_bw = sp.peak_flops(), sp.hbm_bytes_per_ns
    except ValueError:  # an unknown preset name: utilisations stay n/a
        pass
    sec = dev_ns * 1e-9
    hbm = facts["hbm_read"] + facts["hbm_write"]
    generic = trace.generic_share()  # which executions the generic lowering modeled (None: not recorded)
    m = {
        "device_ns": dev_ns, "executions": executions, "span_ns": s["span_ns"], "preset": preset_name,
        "peak_flops": peak_flops, "hbm_bytes_per_ns": hbm_bw,
        "flops": allf, "tensore_flops": tensor, "transpose_flops": transpose, "tensore_flops_all": tensor + transpose,
        "hbm_bytes": hbm, "hbm_read_bytes": facts["hbm_read"], "hbm_write_bytes": facts["hbm_write"],
        "spill_store_bytes": facts["spill_store"], "spill_reload_bytes": facts["spill_reload"],
        "spill_bytes": facts["spill_store"] + facts["spill_reload"],
        "dma_bytes": dma_bytes, "dma_transfers": dma_n, "small_dma_transfers": dma_small,
        "small_dma_busy_share": dma_small_busy / dma_busy if dma_busy else None,
        "average_dma_bytes": dma_bytes / dma_n if dma_n else None,
        "arithmetic_intensity": allf / hbm if hbm else None,
        "hfu": (tensor + transpose) / (peak_flops * sec) if peak_flops and sec else None,
        "mfu": tensor / (peak_flops * sec) if peak_flops and sec else None,
        "mbu": hbm / (hbm_bw * dev_ns) if hbm_bw and dev_ns else None,
        "generic_share": generic["share"] if generic else None, "generic": generic,
        "engines": sorted(({**e, "active_share": e["busy_ns"] / dev_ns if dev_ns else None} for e in engines.values()),
                          key=lambda e: (-round(e["busy_ns"], 3), e["engine"])),
    }
    return m


def _gap_classes(trace) -> dict:
    try:
        t = trace.gaps()
    except Exception:  # a trace without device lanes
        return {}
    out: dict[str, dict] = {}
    for cls, ns in zip(t.column("class").to_pylist(), t.column("gap_ns").to_pylist()):
        d = out.setdefault(cls, {"gaps": 0, "ns": 0})
        d["gaps"] += 1
        d["ns"] += ns or 0
    return out


# ---- rules: code, applies to metrics m -> message or None, fix -------------------------------

Rule = tuple[str, Callable[[dict], str | None], str]

DEVICE_RULES: tuple[Rule, ...] = (
    ("generic-share",
     lambda m: (f"ops modeled by the generic lowering hold {_pct(m['generic_share'])} of modeled kernel time (over "
                f"{_pct(_GENERIC_LIMIT)}): their time is an estimate (one GpSimd routine), not the engines the hardware "
                f"would use; top: " + "; ".join(f"{t['op']} {_pct(t['share'])}" for t in m["generic"]["top"][:3])
                if (m.get("generic_share") or 0) > _GENERIC_LIMIT else None),
     "read those ops' time as rough; use ops with a specific lowering, torch.compile the region, or write a tile kernel"),
    ("transpose-flops",
     lambda m: (f"transposes are {_pct(m['transpose_flops'] / m['tensore_flops_all'])} of TensorE FLOPs (over 10%)"
                if m["tensore_flops_all"] and m["transpose_flops"] > 0.10 * m["tensore_flops_all"] else None),
     "produce or load data in the layout the matmul consumes (a transposed DMA access pattern, or transpose once upstream)"),
    ("spill-reload",
     lambda m: (f"spill reloads move {m['spill_reload_bytes'] / 2**20:,.2f} MiB, {_pct(m['spill_reload_bytes'] / m['hbm_read_bytes'])} "
                f"of HBM reads (over 25%)"
                if m["hbm_read_bytes"] and m["spill_reload_bytes"] > 0.25 * m["hbm_read_bytes"] else None),
     "keep intermediates on chip: smaller row groups in the fusion, or split the graph where the working set exceeds SBUF"),
    ("small-dma",
     lambda m: (f"average DMA transfer is {_kib(m['average_dma_bytes'])}; {m['small_dma_transfers']:,.0f} of "
                f"{m['dma_transfers']:,.0f} transfers are under 4 KiB"
                if m["average_dma_bytes"] is not None and (m["average_dma_bytes"] < 4096 or
                                                           m["small_dma_transfers"] > 0.5 * m["dma_transfers"]) else None),
     "move at least 4 KiB per DMA: bigger tiles, contiguous rows, or batch small tensors into one transfer"),
    ("dispatch-bound",
     lambda m: (f"the device waits on host dispatch for {_pct(m['wait_host_share'])} of the profiled span"
                if (m.get("wait_host_share") or 0) > 0.3 else None),
     "launch fewer, larger executions: torch.compile the region, use a fused op, or a tile kernel"),
    ("runtime-overhead",
     lambda m: (f"executions average {m['device_ns'] / m['executions'] / 1e3:,.2f} µs of modeled device time; "
                f"the runtime's fixed cost per execution is a large share of that"
                if m["executions"] >= 4 and m["device_ns"] / m["executions"] < 20_000 else None),
     "fuse consecutive ops so that each execution does more work (torch.compile or a fused built-in)"),
    ("dma-bound",
     lambda m: (f"DMA queues are the busiest resource while TensorE is active {_pct(m['tensor_share'])} of device time; "
                f"MBU {_pct(m['mbu'])}"
                if m.get("dma_share", 0) > 0.6 and (m.get("tensor_share") or 0) < 0.3 else None),
     "raise reuse per byte moved: larger tiles kept in SBUF across iterations, fewer HBM round trips between ops"),
)

KINETO_RULES: tuple[Rule, ...] = (
    ("device-idle",
     lambda m: (f"the device is idle {_pct(m['idle_share'])} of its span; the largest class is {m['top_gap_class']}"
                if (m.get("idle_share") or 0) > 0.3 else None),
     "if the device waits on the host: capture with CUDA graphs or torch.compile, move data loading off the critical path"),
    ("tiny-kernels",
     lambda m: (f"{m['kernels']:,} kernels with a median of {m['median_kernel_ns'] / 1e3:,.1f} µs each"
                if m.get("kernels", 0) >= 1000 and (m.get("median_kernel_ns") or 1e9) < 10_000 else None),
     "fuse elementwise chains (torch.compile) so each launch does more work"),
    ("memcpy-heavy",
     lambda m: (f"memory copies take {_pct(m['memcpy_share'])} of device busy time"
                if (m.get("memcpy_share") or 0) > 0.2 else None),
     "keep tensors on the device across steps; pin host memory and use non_blocking copies"),
    ("dominant-kernel",
     lambda m: (f"one kernel, {m['top_kernel']}, takes {_pct(m['top_kernel_share'])} of device time"
                if (m.get("top_kernel_share") or 0) > 0.4 else None),
     "look at that kernel first: its op in the op table, its shapes, and its roofline point"),
)


def _apply(rules, m) -> list[dict]:
    out = []
    for code, test, fix in rules:
        try:
            msg = test(m)
        except (KeyError, TypeError, ZeroDivisionError):
            msg = None
        if msg:
            out.append({"code": code, "message": msg, "fix": fix})
    return out


def _observations(m, fired) -> list[dict]:
    """What the device view marks but no rule's threshold reached (so the page never says
    "nothing applies" beside a warning): small DMA transfers below the small-dma rule."""
    out = []
    n = m.get("small_dma_transfers") or 0
    if n and not any(r["code"] == "small-dma" for r in fired):
        out.append({"code": "small-dma", "message":
                    f"{n:,.0f} of {m['dma_transfers']:,.0f} DMA transfers are under {_kib(4096)} "
                    f"({_pct(m.get('small_dma_busy_share'))} of DMA queue time; red bands in the device view); "
                    f"below the rule's threshold (an average under {_kib(4096)} or most transfers small)"})
    return out


def _kineto_metrics(trace) -> dict:
    s = trace.summary()
    ranks = trace.ranks_summary().to_pylist()
    span = sum(r["device_span_ns"] or 0 for r in ranks)
    active = sum(r["device_active_ns"] or 0 for r in ranks)
    k = rows(trace.sql("""SELECT count(*) AS n, median(dur_ns) AS med, sum(dur_ns) AS total FROM events
                          WHERE ph = 'X' AND side = 'device' AND kind = 'kernel'"""))[0]
    mc = rows(trace.sql("""SELECT coalesce(sum(dur_ns) FILTER (WHERE kind = 'memcpy'), 0) AS memcpy,
                                  coalesce(sum(dur_ns), 0) AS busy FROM events
                           WHERE ph = 'X' AND side = 'device' AND kind IN ('kernel', 'memcpy', 'memset')"""))[0]
    top = trace.kernels(limit=1).to_pylist()
    m = {"span_ns": s["span_ns"], "device_span_ns": span, "device_active_ns": active,
         "idle_share": (span - active) / span if span else None, "kernels": k["n"], "median_kernel_ns": k["med"],
         "kernel_ns": k["total"], "memcpy_share": mc["memcpy"] / mc["busy"] if mc["busy"] else None,
         "top_kernel": top[0]["name"] if top else None, "top_kernel_share": top[0]["share"] if top else None}
    try:
        rl = trace.roofline().to_pylist()
    except Exception:  # no shapes recorded
        rl = []
    fl = sum(r["flops"] or 0 for r in rl)
    by = sum(r["bytes"] or 0 for r in rl)
    ns = sum(r["device_ns"] or 0 for r in rl)
    pf = pb = None
    names = trace.device_names()
    if names:
        from tilescope.trace import GPU_PEAKS

        for row in GPU_PEAKS:
            if row[0].lower() in names[0].lower():
                pf, pb = row[1] * 1e12, row[3]
                break
    m.update({"estimated_flops": fl, "estimated_bytes": by, "estimated_ops_device_ns": ns,
              "arithmetic_intensity": fl / by if by else None,
              "mfu": fl / (pf * ns * 1e-9) if pf and ns else None,
              "mbu": by / (pb * ns) if pb and ns else None, "peak_flops": pf, "hbm_bytes_per_ns": pb})
    return m


def summary_page(trace, allowed=lambda p: True) -> dict:
    """Everything the summary page shows, as plain data (also ``tilescope explore --json``):
    :func:`summary_core` and :func:`summary_analyses` together."""
    return {**summary_core(trace, allowed), **summary_analyses(trace)}


def summary_analyses(trace) -> dict:
    """HTA's analyses (temporal breakdown, kernel types, overlap, launches, queues, bandwidth,
    critical path, kernel sequences): the same data `tilescope report` prints. The longest part
    of a summary on a large trace, so the page asks for it apart and shows the rest first."""
    from tilescope.trace.internal import hta_analyses

    out = {"analyses": hta_analyses(trace, trace.op_table(limit=15).to_pylist(), 5)}
    return _rounded(json.loads(json.dumps(out, default=float)))


def summary_core(trace, allowed=lambda p: True) -> dict:
    """The summary's figures, rules and gaps (without HTA's analyses)."""
    s = trace.summary()
    gaps = _gap_classes(trace)
    out = {"kind": trace.kind, "modeled": trace.modeled, "devices": s["devices"], "events": s["events"],
           "span_ns": s["span_ns"], "device_busy_ns": s["device_busy_ns"], "steps": s["steps"], "gaps": gaps,
           "warnings": s["warnings"], "notes": s["notes"]}
    if trace.modeled:
        m = _device_metrics(trace, allowed)
        m["wait_host_share"] = (gaps.get("device_waits_on_host", {}).get("ns", 0) / m["span_ns"]) if m["span_ns"] else None
        dma = sum(e["busy_ns"] for e in m["engines"] if e["engine"].startswith("DMA"))
        n_q = max(1, sum(1 for e in m["engines"] if e["engine"].startswith("DMA")))
        m["dma_share"] = dma / n_q / m["device_ns"] if m["device_ns"] else 0
        te = sum(e["busy_ns"] for e in m["engines"] if e["engine"] == "TensorE")
        m["tensor_share"] = te / m["device_ns"] if m["device_ns"] else None
        out["metrics"] = m
        out["recommendations"] = _apply(DEVICE_RULES, m)
        out["observations"] = _observations(m, out["recommendations"])
        out["label"] = (f"modeled by tilescope's device model (preset {m['preset']}); not measured on hardware")
    else:
        m = _kineto_metrics(trace)
        if gaps:
            dev_gaps = {k: v for k, v in gaps.items() if k.startswith("device")}
            m["top_gap_class"] = max(dev_gaps, key=lambda k: dev_gaps[k]["ns"]) if dev_gaps else None
        out["metrics"] = m
        out["recommendations"] = _apply(KINETO_RULES, m)
        dev = ", ".join(s["devices"]) or "the host CPU (no device in the trace)"
        out["label"] = (f"measured on {dev}, as recorded in the trace; FLOPs and bytes per op are estimated "
                        f"from input shapes")
    return _rounded(json.loads(json.dumps(out, default=float)))


def _rounded(o):
    """Floats to 12 significant digits: sums of doubles in parallel SQL aggregates differ in
    their last bits from run to run, and the page (and --json) should not."""
    if isinstance(o, float):
        return float(f"{o:.12g}")
    if isinstance(o, dict):
        return {k: _rounded(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_rounded(v) for v in o]
    return o
