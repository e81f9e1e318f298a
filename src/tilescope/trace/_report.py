"""What `tilescope report`, `diff`, `compare`, `sql` and `replay` print: rich tables, JSON, SVG charts.

Figures from tilescope's device model carry "(modeled)" in every header that shows them;
figures from real traces say which machine recorded them (the trace's device names).
"""

from __future__ import annotations

import json
import os
from html import escape

__all__ = ["report_dict", "print_report", "print_diff", "write_plots", "fmt_ns"]


def fmt_ns(ns) -> str:
    if ns is None:
        return "-"
    ns = float(ns)
    if abs(ns) >= 1e9:
        return f"{ns / 1e9:,.3f} s"
    if abs(ns) >= 1e6:
        return f"{ns / 1e6:,.3f} ms"
    if abs(ns) >= 1e3:
        return f"{ns / 1e3:,.2f} us"
    return f"{ns:,.0f} ns"


def _time_label(trace) -> str:
    if trace.modeled:
        return "modeled"
    devs = trace.device_names()
    vendors = sorted({v for v in trace.vendors().values() if v})
    if devs:
        return "measured on " + ", ".join(devs) + (f" ({', '.join(vendors)})" if vendors else "")
    has_device = trace.sql("SELECT count(*) FROM events WHERE side = 'device'").fetchall()[0][0]
    if has_device and vendors:
        return "measured on " + ", ".join(f"a {v} device" for v in vendors)
    # device work with no deviceProperties (a truncated or filtered trace): which GPU is unknown
    return "measured on an unnamed device" if has_device else "measured on the recording machine (CPU)"


def report_dict(trace, top: int = 15) -> dict:
    """The report as plain data (what ``--json`` prints)."""
    s = trace.summary()
    out = {"summary": s, "time_source": _time_label(trace),
           "ops": trace.op_table(limit=top).to_pylist(),
           "device_work": trace.kernels(limit=top).to_pylist(),
           "device_lanes": trace.breakdown().to_pylist(),
           "gaps": _gap_totals(trace),
           "roofline": (trace.roofline().slice(0, top) if top else trace.roofline()).to_pylist()}  # 0: all
    out.update(hta_analyses(trace, out["ops"], top))
    if s["instructions"]:
        out["engines"] = trace.engine_breakdown().to_pylist()
    generic = trace.generic_share() if trace.modeled else None
    if generic is not None:  # which lowering rule modeled the device time
        out["lowerings"] = trace.lowerings().to_pylist()
        out["generic"] = generic
    if s["ranks"] and len(s["ranks"]) > 1:
        out["ranks"] = trace.ranks_summary().to_pylist()
    return out


def hta_analyses(trace, ops: list[dict], top: int = 15) -> dict:
    """HTA's analyses as plain data: temporal breakdown and kernel types per rank, communication
    overlap, launch statistics, queue length and memory bandwidth summaries, the critical path's
    time per kind (first rank) and the frequent kernel sequences of the op with the most device time."""
    from ._critical import critical_path_summary

    out = {"temporal": trace.temporal_breakdown().to_pylist(), "kernel_types": trace.kernel_types().to_pylist(),
           "comm_comp_overlap": trace.comm_comp_overlap().to_pylist(), "launch_stats": trace.launch_stats().to_pylist(),
           "queue_length": trace.queue_length_summary().to_pylist(),
           "memory_bandwidth": trace.memory_bandwidth_summary().to_pylist()}
    out["critical_path"] = critical_path_summary(trace.critical_path()) if out["temporal"] else []
    first = next((r["name"] for r in ops if r.get("device_calls")), None)
    seq = trace.kernel_sequences(first, min_length=2, top=min(top or 5, 5)).to_pylist() if first else []
    out["kernel_sequences"] = {"op": first, "sequences": seq}
    return out


def _gap_totals(trace) -> list[dict]:
    """Per class: the gaps, their lanes and their total -- a sum over lanes (each device lane,
    a stream or a core, has its own gaps), which can exceed the trace's span."""
    g = trace.gaps()
    tot: dict[str, list] = {}
    for c, lane, ns in zip(g.column("class").to_pylist(), g.column("lane").to_pylist(), g.column("gap_ns").to_pylist()):
        a = tot.setdefault(c, [0, 0, set()])
        a[0] += 1
        a[1] += ns or 0
        a[2].add(lane)
    return [{"class": c, "count": n, "lanes": len(lanes), "total_ns": t}
            for c, (n, t, lanes) in sorted(tot.items(), key=lambda kv: -kv[1][1])]


def print_report(trace, console, top: int = 15) -> None:
    from rich.markup import escape as resc
    from rich.table import Table

    d = report_dict(trace, top)
    s = d["summary"]
    label = d["time_source"]
    console.print(f"[bold]{resc(', '.join(s['sources']))}[/bold]: {s['events']:,} events on {s['lanes']} lanes, "
                  f"ranks {s['ranks']}, span {fmt_ns(s['span_ns'])}; device busy {fmt_ns(s['device_busy_ns'])} "
                  + (f"summed over {s['device_lanes']} device lanes " if s["device_lanes"] > 1 else "")
                  + f"({label})")
    for w in s["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {resc(w)}")
    for n in s["notes"]:
        console.print(f"[dim]note: {resc(n)}[/dim]")
    if d.get("generic") is not None:
        _print_lowerings(d, console)
    t = Table(title=f"top ops (host measured; device {label})")
    for c in ("op", "calls", "host total", "host self", "device total", "device self"):
        t.add_column(c, justify="left" if c == "op" else "right")
    for r in d["ops"]:
        t.add_row(resc(r["name"][:70]), f"{r['calls']:,}", fmt_ns(r["host_total_ns"]), fmt_ns(r["host_self_ns"]),
                  fmt_ns(r["device_total_ns"]), fmt_ns(r["device_self_ns"]))
    console.print(t)
    if d["device_work"]:
        t = Table(title=f"device work by name ({label})")
        for c in ("name", "kind", "calls", "total", "mean", "share"):
            t.add_column(c, justify="left" if c in ("name", "kind") else "right")
        for r in d["device_work"]:
            t.add_row(resc(r["name"][:70]), r["kind"], f"{r['calls']:,}", fmt_ns(r["total_ns"]), fmt_ns(r["mean_ns"]),
                      f"{r['share']:.1%}")
        console.print(t)
    if d["device_lanes"]:
        t = Table(title=f"device lanes: busy time ({label})")
        for c in ("lane", "rank", "identifier", "events", "busy", "kernel", "memcpy", "memset", "busy share"):
            t.add_column(c, justify="left" if c == "identifier" else "right")
        for r in d["device_lanes"]:
            t.add_row(str(r["lane"]), str(r["rank"]), resc(str(r["identifier"]).strip()), f"{r['events']:,}",
                      fmt_ns(r["busy_ns"]), fmt_ns(r["kernel_ns"]), fmt_ns(r["memcpy_ns"]), fmt_ns(r["memset_ns"]),
                      f"{r['busy_share']:.1%}")
        console.print(t)
    _print_hta(d, console, label)
    if d.get("engines"):
        t = Table(title="engines (modeled)")
        for c in ("engine", "instructions", "busy", "bytes", "FLOPs"):
            t.add_column(c, justify="left" if c == "engine" else "right")
        for r in d["engines"]:
            t.add_row(r["engine"], f"{r['instructions']:,}", fmt_ns(r["busy_ns"]), f"{r['bytes']:,}", f"{r['flops']:,.0f}")
        console.print(t)
    if d["gaps"]:
        source = "device gaps modeled, the host's waits measured" if trace.modeled else label
        t = Table(title=f"idle gaps by cause ({source}; per lane, totals summed over lanes)")
        for c in ("class", "count", "lanes", "total"):
            t.add_column(c, justify="left" if c == "class" else "right")
        for r in d["gaps"]:
            t.add_row(r["class"], f"{r['count']:,}", f"{r['lanes']:,}", fmt_ns(r["total_ns"]))
        console.print(t)
    if d["roofline"]:
        est = "FLOPs/bytes estimated from shapes" if not trace.modeled else "modeled"
        t = Table(title=f"roofline ({est}; peaks: {d['roofline'][0]['peak_source']})")
        for c in ("name", "FLOPs", "bytes", "AI", "TFLOP/s", "GB/s", "MFU", "MBU", "% of roofline"):
            t.add_column(c, justify="left" if c == "name" else "right")
        for r in d["roofline"]:
            pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
            t.add_row(resc(str(r["name"])[:50]), f"{r['flops']:,.0f}", f"{r['bytes']:,.0f}", f"{r['intensity']:.2f}",
                      f"{r['tflops']:.3f}", f"{r['gbps']:.1f}", pct(r["mfu"]), pct(r["mbu"]), pct(r["pct_of_roofline"]))
        console.print(t)


def _pct(v) -> str:
    return "-" if v is None else f"{v:.1f}%"


def _print_hta(d, console, label: str) -> None:
    """Temporal breakdown, kernel types, overlap, launches, queues, bandwidth, critical path, sequences."""
    from rich.markup import escape as resc
    from rich.table import Table

    if d["temporal"]:
        t = Table(title=f"temporal breakdown per rank (of the device span; {label})")
        for c in ("rank", "device span", "idle", "compute", "non-compute", "comm. overlapped by compute"):
            t.add_column(c, justify="right")
        ov = {r["rank"]: r for r in d["comm_comp_overlap"]}
        for r in d["temporal"]:
            o = ov.get(r["rank"])
            t.add_row(str(r["rank"]), fmt_ns(r["span_ns"]), f"{fmt_ns(r['idle_ns'])} ({_pct(r['idle_pct'])})",
                      f"{fmt_ns(r['compute_ns'])} ({_pct(r['compute_pct'])})",
                      f"{fmt_ns(r['non_compute_ns'])} ({_pct(r['non_compute_pct'])})",
                      "-" if not o else f"{fmt_ns(o['overlapped_ns'])} of {fmt_ns(o['communication_ns'])} "
                                        f"({_pct(100 * (o['overlap_ratio'] or 0))})")
        console.print(t)
        t = Table(title=f"device time by kernel type, with overlaps ({label})")
        for c in ("rank", "kernel type", "time", "share"):
            t.add_column(c, justify="left" if c == "kernel type" else "right")
        for r in d["kernel_types"]:
            t.add_row(str(r["rank"]), r["kernel_type"], fmt_ns(r["time_ns"]), _pct(100 * (r["share"] or 0)))
        console.print(t)
    if d["launch_stats"]:
        t = Table(title="launches: host launch call vs device work (host measured)")
        for c in ("rank", "launches", "mean launch", "mean device", "mean delay", "device < launch", "long launches",
                  "long delays"):
            t.add_column(c, justify="right")
        for r in d["launch_stats"]:
            t.add_row(str(r["rank"]), f"{r['launches']:,}", fmt_ns(r["mean_cpu_duration_ns"]),
                      fmt_ns(r["mean_gpu_duration_ns"]), fmt_ns(r["mean_launch_delay_ns"]), f"{r['short_kernels']:,}",
                      f"{r['long_launches']:,}", f"{r['long_delays']:,}")
        console.print(t)
    if d["queue_length"]:
        t = Table(title="queue length per device lane (launched, not yet started)")
        for c in ("rank", "lane", "mean (time-weighted)", "max", "time at max"):
            t.add_column(c, justify="left" if c == "lane" else "right")
        for r in d["queue_length"]:
            tw = r["time_weighted_mean"]
            t.add_row(str(r["rank"]), resc(str(r["identifier"]).strip()), "-" if tw is None else f"{tw:.2f}",
                      f"{r['max']:,}", fmt_ns(r["time_at_max_ns"]))
        console.print(t)
    if d["memory_bandwidth"]:
        t = Table(title=f"memory copies: bandwidth ({label})")
        for c in ("rank", "copy type", "copies", "bytes", "busy", "achieved GB/s", "peak GB/s"):
            t.add_column(c, justify="left" if c == "copy type" else "right")
        for r in d["memory_bandwidth"]:
            g = lambda v: "-" if v is None else f"{v:,.1f}"  # noqa: E731
            t.add_row(str(r["rank"]), resc(r["copy_type"]), f"{r['copies']:,}",
                      "-" if r["bytes"] is None else f"{r['bytes']:,}", fmt_ns(r["busy_ns"]), g(r["achieved_gbps"]),
                      g(r["series_max_gbps"]))
        console.print(t)
    if d["critical_path"]:
        t = Table(title="critical path (first rank): time per kind")
        for c in ("kind", "time", "share"):
            t.add_column(c, justify="left" if c == "kind" else "right")
        for r in d["critical_path"]:
            t.add_row(r["kind"], fmt_ns(r["ns"]), _pct(100 * r["share"]))
        console.print(t)
    ks = d["kernel_sequences"]
    if ks["sequences"]:
        t = Table(title=f"frequent kernel sequences of {resc(ks['op'])}")
        for c in ("sequence", "count", "device time"):
            t.add_column(c, justify="left" if c == "sequence" else "right")
        for r in ks["sequences"]:
            names = r["pattern"].split("|")[1:]
            text = " > ".join(n[:40] for n in names[:6]) + (f" > ... ({len(names)} kernels)" if len(names) > 6 else "")
            t.add_row(resc(text), f"{r['count']:,}", fmt_ns(r["device_ns"]))
        console.print(t)


def _shapes_text(shapes) -> str:
    return ", ".join("x".join(map(str, sh)) or "scalar" for sh in shapes) if shapes else "-"


def _print_lowerings(d, console) -> None:
    """The generic share in one line, and (when any op ran generic) the rules and the generic ops."""
    from rich.markup import escape as resc
    from rich.table import Table

    from ..profiler.internal import GENERIC_SHARE_LIMIT

    g = d["generic"]
    over = g["share"] > GENERIC_SHARE_LIMIT
    style = "yellow" if over else "green"
    console.print(f"[{style}]generic lowering: {g['share']:.1%} of modeled kernel time[/{style}] "
                  f"({fmt_ns(g['generic_ns'])} of {fmt_ns(g['device_ns'])}, {g['generic_executions']:,} of "
                  f"{g['executions']:,} executions)"
                  + (f": over {GENERIC_SHARE_LIMIT:.0%}, this profile's device time is largely an estimate "
                     f"(`tilescope doctor` says more)" if over else ""))
    if not g["top"]:
        return
    t = Table(title="device time by lowering rule (modeled)")
    for c in ("lowering", "executions", "time", "share"):
        t.add_column(c, justify="left" if c == "lowering" else "right")
    for r in d["lowerings"]:
        t.add_row(resc(str(r["lowering"])), f"{r['executions']:,}", fmt_ns(r["device_ns"]), f"{r['share']:.1%}")
    console.print(t)
    t = Table(title="ops modeled by the generic lowering (modeled; one GpSimd routine, an estimate)")
    for c in ("op", "shapes", "executions", "time", "share"):
        t.add_column(c, justify="left" if c in ("op", "shapes") else "right")
    for r in g["top"]:
        t.add_row(resc(str(r["op"])[:60]), resc(_shapes_text(r["shapes"])[:60]), f"{r['executions']:,}",
                  fmt_ns(r["device_ns"]), f"{r['share']:.1%}")
    console.print(t)


def _count(v) -> str:
    """A count as a whole number when it is one (a per-step mean may not be).

    >>> _count(20.0), _count(2.5), _count(None)
    ('20', '2.5', '-')
    """
    if v is None:
        return "-"
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,.1f}"


def print_diff(d, console, top: int = 20) -> None:
    from rich.markup import escape as resc
    from rich.table import Table

    unit = " per step" if d.per_step else ""
    t = Table(title=f"summary{unit} (times: {resc(d.times_label())})")
    t.add_column("metric")
    for n in d.names:
        t.add_column(resc(n), justify="right")
    for r in d.summary.to_pylist():
        t.add_row(r["metric"], *[_count(r[n]) for n in d.names])
    console.print(t)
    for w in d.warnings:
        console.print(f"[yellow]warning:[/yellow] {resc(w)}")
    for f in d.fusion:
        console.print(f"[bold green]fusion:[/bold green] {resc(f.text())}")
    rows = d.ops.to_pylist()
    base = d.names[0]
    rows.sort(key=lambda r: -max(abs(r.get(f"delta_device_ns[{n}]", 0)) for n in d.names[1:]))
    t = Table(title=f"ops{unit}: calls and device time")
    t.add_column("op")
    for n in d.names:
        t.add_column(f"calls {resc(n)}", justify="right")
        t.add_column(f"device {resc(n)}", justify="right")
    for r in rows[:top]:
        cells = []
        for n in d.names:
            cells += [_count(r[f"calls[{n}]"]), fmt_ns(r[f"device_total_ns[{n}]"])]
        t.add_row(resc(r["op"][:60]), *cells)
    console.print(t)
    regs = d.regions.to_pylist()
    if regs:
        t = Table(title=f"regions (record_function / module / step){unit}")
        t.add_column("region")
        for n in d.names:
            t.add_column(resc(n), justify="right")
        for r in regs[:top]:
            t.add_row(resc(r["region"][:60]), *[fmt_ns(r[f"total_ns[{n}]"]) for n in d.names])
        console.print(t)
    _ = base


def _svg_bars(title: str, items: list[tuple[str, float]], unit: str) -> str:
    w, bar_h, left = 760, 18, 300
    h = 40 + bar_h * len(items) + 20
    top = max((v for _, v in items), default=1) or 1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="10" y="20" font-size="14">{escape(title)}</text>']
    for i, (name, v) in enumerate(items):
        y = 35 + i * bar_h
        bw = (w - left - 90) * v / top
        out.append(f'<text x="{left - 6}" y="{y + 12}" text-anchor="end">{escape(name[:48])}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{bw:.1f}" height="{bar_h - 4}" fill="#4e79a7"/>')
        out.append(f'<text x="{left + bw + 4:.1f}" y="{y + 12}">{escape(fmt_ns(v) if unit == "ns" else f"{v:,.3g}")}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _svg_roofline(title: str, rows: list[dict], peak_tflops: float | None, peak_gbps: float | None) -> str:
    import math

    w, h, m = 640, 420, 60
    pts = [(r["intensity"], r["tflops"], str(r["name"])) for r in rows if r["intensity"] > 0 and r["tflops"] > 0]
    if not pts:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="60"><text x="10" y="30">{escape(title)}: no points</text></svg>'
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts] + ([peak_tflops] if peak_tflops else [])
    x0, x1 = math.log10(min(xs)) - 0.5, math.log10(max(xs + [1000])) + 0.5
    y0, y1 = math.log10(min(ys)) - 0.5, math.log10(max(ys)) + 0.3

    def X(v):
        return m + (math.log10(v) - x0) / (x1 - x0) * (w - 2 * m)

    def Y(v):
        return h - m - (math.log10(v) - y0) / (y1 - y0) * (h - 2 * m)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="10" y="20" font-size="14">{escape(title)}</text>',
           f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="#333"/>',
           f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="#333"/>',
           f'<text x="{w / 2}" y="{h - 20}" text-anchor="middle">arithmetic intensity (FLOP/byte, log)</text>',
           f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">TFLOP/s (log)</text>']
    for k in range(math.ceil(x0), math.floor(x1) + 1):  # decade ticks
        out.append(f'<line x1="{X(10 ** k):.1f}" y1="{h - m}" x2="{X(10 ** k):.1f}" y2="{h - m + 5}" stroke="#333"/>'
                   f'<text x="{X(10 ** k):.1f}" y="{h - m + 17}" text-anchor="middle">{10.0 ** k:g}</text>')
    for k in range(math.ceil(y0), math.floor(y1) + 1):
        out.append(f'<line x1="{m - 5}" y1="{Y(10 ** k):.1f}" x2="{m}" y2="{Y(10 ** k):.1f}" stroke="#333"/>'
                   f'<text x="{m - 7}" y="{Y(10 ** k) + 4:.1f}" text-anchor="end">{10.0 ** k:g}</text>')
    if peak_tflops and peak_gbps:
        ridge = peak_tflops * 1e3 / peak_gbps
        a = max(10 ** x0, 10 ** y0 * 1e3 / peak_gbps)
        out.append(f'<polyline fill="none" stroke="#e15759" stroke-width="2" points="{X(a):.1f},{Y(a * peak_gbps / 1e3):.1f} '
                   f'{X(ridge):.1f},{Y(peak_tflops):.1f} {X(10 ** x1):.1f},{Y(peak_tflops):.1f}"/>')
        out.append(f'<text x="{X(10 ** x1) - 4:.1f}" y="{Y(peak_tflops) - 6:.1f}" text-anchor="end" fill="#e15759">'
                   f'peak {peak_tflops:,.1f} TFLOP/s, {peak_gbps:,.0f} GB/s</text>')
    for i, (ai, tf, name) in enumerate(pts):
        out.append(f'<circle cx="{X(ai):.1f}" cy="{Y(tf):.1f}" r="4" fill="#4e79a7"><title>{escape(name)}</title></circle>')
        if i < 12:
            out.append(f'<text x="{X(ai) + 6:.1f}" y="{Y(tf) - 6 - 11 * (i % 3):.1f}" font-size="10">{escape(name[:30])}</text>')
    out.append("</svg>")
    return "\n".join(out)


def write_plots(trace, out_dir: str, top: int = 15) -> list[str]:
    """SVG charts: device-time breakdown by op and the roofline. Returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    label = _time_label(trace)
    ops = trace.op_table(limit=top, sort="device_self_ns").to_pylist()
    items = [(r["name"], float(r["device_self_ns"] or 0)) for r in ops if r["device_self_ns"]]
    what = "self device time by op"
    if not items:  # no device time (a CPU-only trace): the host's
        items = [(r["name"], float(r["host_self_ns"] or 0))
                 for r in trace.op_table(limit=top, sort="host_self_ns").to_pylist()]
        what = "self host time by op (no device time in this trace)"
    paths = []
    p = os.path.join(out_dir, "breakdown.svg")
    with open(p, "w", encoding="utf-8") as f:
        f.write(_svg_bars(f"{what} ({label})", items, "ns"))
    paths.append(p)
    rf = trace.roofline().to_pylist()
    pf = pb = None
    if trace.modeled:
        from ..spec import preset

        spec = preset(trace.preset_name())  # None: the spec's default preset
        pf, pb = spec.peak_flops() / 1e12, spec.hbm_bytes_per_ns
    else:
        from ._roofline import gpu_peak

        names = trace.device_names()
        row = gpu_peak(names[0]) if names else None
        if row:
            pf, pb = row[1], row[3]
            label += "; roof: the 16-bit tensor peak (fp32 ops' MFU uses the FP32 peak)"
    p = os.path.join(out_dir, "roofline.svg")
    with open(p, "w", encoding="utf-8") as f:
        f.write(_svg_roofline(f"roofline ({label})", rf, pf, pb))
    paths.append(p)
    return paths


def to_json(obj) -> str:
    return json.dumps(obj, indent=1, default=lambda o: float(o) if hasattr(o, "__float__") else str(o))
