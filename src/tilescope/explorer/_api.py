"""The explorer's data API: one function per endpoint, HTTP-free so that tests and
``tilescope explore --json`` call it directly.

``handle(session, path, query)`` returns a :class:`Response`. JSON bodies are plain objects;
timeline windows and instruction columns travel packed (``_binary.pack``). Every error is a
JSON body ``{"error": ..., "fix": ...}`` with a 4xx status that names the parameter and the
accepted values.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field

import numpy as np

from . import _device_view
from ._binary import pack
from ._index import COLOR_MODES
from ._insights import summary_analyses, summary_core
from ._work import Cancelled

__all__ = ["Response", "ApiError", "handle", "ROUTES", "to_json", "CANCELLED"]

CANCELLED = 499  # the status of a request whose client went away (nothing is sent)


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str
    headers: dict = field(default_factory=dict)


class ApiError(Exception):
    """A request the API refuses: ``status``, the message and the fix."""

    def __init__(self, status: int, message: str, fix: str = ""):
        super().__init__(message)
        self.status = status
        self.fix = fix


def _key_message(e: KeyError) -> str:
    """A KeyError's message as raised (``str()`` of a KeyError quotes it as a key)."""
    return str(e.args[0]) if e.args else "not found"


def _clean(o):
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return _clean(float(o))
    if isinstance(o, np.ndarray):
        return _clean(o.tolist())
    if isinstance(o, (bytes, bytearray)):
        return o.decode("utf-8", "replace")
    return o


def to_json(obj) -> bytes:
    """JSON with NaN/inf as null and numpy scalars as numbers."""
    return json.dumps(_clean(obj), separators=(",", ":"), default=str, allow_nan=False).encode()


def _ok(obj) -> Response:
    return Response(200, to_json(obj), "application/json")


def _table(t) -> dict:
    """A pyarrow Table as ``{"columns": [...], "rows": [[...], ...]}``."""
    cols = t.column_names
    data = [t.column(c).to_pylist() for c in cols]
    return {"columns": cols, "rows": [list(r) for r in zip(*data)] if cols else []}


# ---- parameters -------------------------------------------------------------------------
INT_LIMIT = 2**62  # integers beyond it (ns: ~146 years) are refused, never overflowed
MAX_COMPARE = 8  # profiles one compare request may ask for


def _one(q: dict, name: str, default=None):
    v = q.get(name)
    if isinstance(v, list):
        v = v[0] if v else None
    return default if v in (None, "") else v


def _int(q, name, default=None, *, lo=None, hi=None):
    v = _one(q, name)
    if v is None:
        if default is None:
            raise ApiError(400, f"parameter {name!r} is required", f"add ?{name}=<integer>")
        return default
    lo = -INT_LIMIT if lo is None else lo
    hi = INT_LIMIT if hi is None else hi
    try:
        f = float(v)
    except (ValueError, OverflowError):
        raise ApiError(400, f"parameter {name!r} must be an integer, got {v!r}", f"pass {name}=<integer>") from None
    def bound(x):
        return "-2^62" if x == -INT_LIMIT else "2^62" if x == INT_LIMIT else f"{x}"

    if not math.isfinite(f):
        raise ApiError(400, f"parameter {name!r} must be a finite integer, got {v!r}",
                       f"pass {bound(lo)} <= {name} <= {bound(hi)}")
    x = int(v) if re.fullmatch(r"[+-]?\d+", str(v).strip()) else int(f)
    if x < lo or x > hi:
        raise ApiError(400, f"parameter {name!r} = {v} is outside [{bound(lo)}, {bound(hi)}]",
                       f"pass {bound(lo)} <= {name} <= {bound(hi)}" + (" (ns from the trace start)" if name in ("t0", "t1", "t") else ""))
    return x


def _str(q, name, default=None, *, pattern=r"[\w.:\-]{1,200}"):
    v = _one(q, name, default)
    if v is None:
        raise ApiError(400, f"parameter {name!r} is required", f"add ?{name}=...")
    if not re.fullmatch(pattern, str(v)):
        raise ApiError(400, f"parameter {name!r} has an unexpected value {v!r}", f"it must match {pattern}")
    return str(v)


def _lanes(q):
    v = _one(q, "lanes")
    if v is None or v == "all":
        return None
    try:
        out = [int(x) for x in str(v).split(",") if x != ""]
    except ValueError:
        raise ApiError(400, f"parameter 'lanes' must be comma-separated lane numbers, got {v!r}",
                       "pass lanes=0,1,2 or lanes=all") from None
    if len(out) > 100_000:
        raise ApiError(400, f"parameter 'lanes' lists {len(out):,} lanes (at most 100,000)", "pass lanes=all")
    return out


def _hash(q):
    return _str(q, "hash", pattern=r"[0-9a-f]{4,64}")


def _ref(src, q) -> int:
    """The event a request names: ``ref`` (its index position) or ``eid`` (the engine's id)."""
    ix = src.index
    if _one(q, "ref") is not None:
        return _int(q, "ref", lo=0, hi=max(0, ix.n - 1))
    eid = _int(q, "eid")
    r = int(ix.refs_of([eid])[0])
    if r < 0:
        raise ApiError(404, f"no event with eid {eid}", "take eids from the window or lineage endpoints")
    return r


# ---- endpoints ----------------------------------------------------------------------------
def _core_of(lane: dict) -> str:
    ident = lane.get("identifier") or ""
    m = re.match(r"(?:NC|core)[:]?(\d+)", ident, re.IGNORECASE)
    if m and lane.get("subsystem") in ("runtime", "hardware"):
        return f"NC{m.group(1)}"
    if lane.get("side") == "device":
        return f"device {lane.get('pid')}"
    return "host"


def _device_extent(ix) -> tuple[int | None, int | None]:
    """First start and last end of the events on device lanes (ns from the trace start)."""
    dev = [ln["lane"] for ln in ix.lanes if ln.get("side") == "device"]
    if not dev or ix.n == 0:
        return None, None
    gs = np.flatnonzero(np.isin(ix.g_lane, dev))
    first = last = None
    for g in gs.tolist():
        a, b = int(ix.g_lo[g]), int(ix.g_hi[g])
        if b > a:
            s, e = int(ix.start[a]), int(ix.ecm[b - 1])
            first = s if first is None else min(first, s)
            last = e if last is None else max(last, e)
    return first, last


def _meta(src, q):
    ix, t, f = src.index, src.trace, src.facts
    if "meta" not in f:
        lanes = []
        for ln in ix.lanes:
            d = dict(ln)
            i = d["lane"]
            d["max_depth"] = int(ix.max_depth[i]) if i < ix.max_depth.size else 0
            d["core"] = _core_of(d)
            lanes.append(d)
        first_dev, dev_end = _device_extent(ix)
        f["meta"] = {
            "id": src.id, "label": src.label, "path": src.path, "kind": f["kind"], "modeled": f["modeled"],
            "what": src.label_text(), "devices": f["devices"], "preset": f["preset"],
            "origin_ns": ix.origin_ns, "span_ns": ix.span_ns, "events": ix.n, "lanes": lanes, "names": ix.names,
            "kinds": ix.kinds, "color_modes": list(COLOR_MODES), "doctor": src.doctor, "index": ix.stats(),
            "executions": len(f["executions"]), "first_step_ns": f["first_step_ns"],
            "first_device_ns": first_dev, "device_end_ns": dev_end, "waits": f["waits"],
            "files": sorted(src.files),
        }
    # the engine may add notes later (e.g. on first nesting): read them at each call
    return {**f["meta"], "warnings": list(t.warnings), "notes": list(t.notes)}


def _window(src, q):
    ix = src.index
    color = _one(q, "color", "op")
    if color not in COLOR_MODES:
        raise ApiError(400, f"parameter 'color' must be one of {', '.join(COLOR_MODES)}, got {color!r}",
                       "pass color=op, color=name or color=kind")
    t0 = _int(q, "t0", 0)
    t1 = _int(q, "t1", ix.span_ns)
    if t1 <= t0:
        raise ApiError(400, f"empty window: t1 ({t1}) must be greater than t0 ({t0})", "pass t0 < t1 (ns from the trace start)")
    px = _int(q, "px", 1000, lo=1, hi=100_000)
    max_events = _int(q, "max", 30000, lo=100, hi=500_000)
    w = ix.window(t0, t1, _lanes(q), px, max_events=max_events, color=color)
    ev, bk = w["events"], w["buckets"]
    names = ix.name[ev["ref"].astype(np.int64)] if ev["ref"].size else np.zeros(0, dtype=np.int32)
    # buckets travel compactly (16 bytes each): position in buckets from bk_origin, and how full
    # each is in 1/255ths of its width
    bn = max(1, int(w["bucket_ns"]))
    origin = int(bk["start"].min()) if bk["start"].size else 0
    arrays = {
        "ev_ref": ("u32", ev["ref"]), "ev_lane": ("u32", ev["lane"]), "ev_depth": ("u16", np.minimum(ev["depth"], 65535)),
        "ev_start": ("f64", ev["start"]), "ev_dur": ("f64", ev["dur"]), "ev_key": ("u32", ev["key"]),
        "ev_name": ("u32", names),
        "bk_lane": ("u16", np.minimum(bk["lane"], 65535)), "bk_depth": ("u8", np.minimum(bk["depth"], 255)),
        "bk_fill": ("u8", np.clip(np.rint(bk["busy"] * 255.0 / bn), 0, 255)),
        "bk_pos": ("u32", (bk["start"] - origin) // bn), "bk_count": ("u32", np.minimum(bk["count"], 2**32 - 1)),
        "bk_key": ("u32", bk["key"]),
    }
    head = {"t0": w["t0"], "t1": w["t1"], "exact": w["exact"], "bucket_ns": w["bucket_ns"], "bk_origin": origin,
            "total": w["total"], "color": color}
    return Response(200, pack(arrays, head), "application/octet-stream")


def _event(src, q):
    """One event: what the index knows plus its stored record (args), read by eid."""
    ix = src.index
    ref = _ref(src, q)
    b = ix.event_brief(ref)
    eid = b["eid"]
    try:
        rec = src.rows.record(eid)
    except KeyError:
        rec = {}
    lane = next((ln for ln in ix.lanes if ln["lane"] == b["lane"]), {})
    args = rec.get("args") if isinstance(rec.get("args"), dict) else {}
    ev = {k: v for k, v in rec.items() if k not in ("part",)}
    ev.update({
        "eid": eid, "ref": ref, "rank": eid >> 48, "lane": b["lane"], "depth": b["depth"], "name": b["name"],
        "kind": ix.kinds[int(ix.kind[ref])], "side": lane.get("side"), "start_ns": b["start"], "dur_ns": b["dur"],
        "ts_ns": b["start"] + ix.origin_ns, "end_ns": b["start"] + b["dur"] + ix.origin_ns, "args": args,
        "lowering": args.get("lowering") if rec.get("cat") in ("runtime", "hardware", "memcpy") else None,
    })
    return ev


def _lineage(src, q):
    from ._lifecycle import MAX_PAGE, PAGE, lifecycle

    ix = src.index
    ref = _ref(src, q)
    page = _int(q, "page", 0, lo=0, hi=10**9)
    per_page = _int(q, "per_page", PAGE, lo=1, hi=MAX_PAGE)
    out = lifecycle(ix, ref, executions=src.facts.get("by_eid", {}), page=page, per_page=per_page)
    return {"eid": int(ix.eid[ref]), "ref": ref, **out, "modeled": src.facts.get("modeled", False)}


def _select(src, q):
    ix = src.index
    t0, t1 = _int(q, "t0"), _int(q, "t1")
    if t1 <= t0:
        raise ApiError(400, f"empty selection: t1 ({t1}) must be greater than t0 ({t0})", "drag over a time range")
    return {**ix.select(t0, t1, _lanes(q)), "modeled": src.facts.get("modeled", False)}


def _name_ids(src, text: str, exact: bool) -> list[int]:
    names = src.index.names
    if exact:
        return [i for i, n in enumerate(names) if n == text]
    low = text.lower()
    return [i for i, n in enumerate(names) if low in n.lower()]


def _search(src, q):
    text = str(_one(q, "q", ""))
    if len(text) > 1000:
        raise ApiError(400, f"search text of {len(text):,} characters (at most 1,000)", "search for a shorter name")
    if not text:
        return {"ids": [], "names": []}
    ids = _name_ids(src, text, _one(q, "exact", "0") in ("1", "true"))[:5000]
    return {"ids": ids, "names": [src.index.names[i] for i in ids[:50]]}


def _matches(src, text: str, exact: bool):
    """(starts, refs) of the events whose name matches, in time order (kept for a few texts:
    Enter after Enter walks the same list)."""
    key = ("matches", text, exact)
    got = src.facts.get(key)
    if got is None:
        ix = src.index
        ids = _name_ids(src, text, exact)
        refs = np.flatnonzero(np.isin(ix.name, np.asarray(ids, dtype=np.int32))) if ids else np.zeros(0, np.int64)
        o = np.lexsort((refs, ix.start[refs]))
        got = (ix.start[refs][o], refs[o])
        old = [k for k in src.facts if isinstance(k, tuple) and k[:1] == ("matches",)]
        for k in old[:-7]:  # keep the last few
            src.facts.pop(k, None)
        src.facts[key] = got
    return got


def _match(src, q):
    """The next (``dir=1``) or previous (``dir=-1``) event whose name matches ``q`` after
    (before) time ``t`` — ties broken by ``ref`` —, with its rank among all matches."""
    ix = src.index
    text = str(_one(q, "q", ""))
    if not text or len(text) > 1000:
        raise ApiError(400, "parameter 'q' must be 1 to 1,000 characters", "pass q=<part of an event name>")
    exact = _one(q, "exact", "0") in ("1", "true")
    d = _int(q, "dir", 1, lo=-1, hi=1) or 1
    t = _int(q, "t", -INT_LIMIT if d > 0 else INT_LIMIT)
    after = _int(q, "ref", -1 if d > 0 else INT_LIMIT, lo=-1)
    starts, refs = _matches(src, text, exact)
    total = int(refs.size)
    if total == 0:
        return {"total": 0, "match": None}
    if d > 0:
        k = int(np.searchsorted(starts, t, side="left"))
        while k < total and starts[k] == t and refs[k] <= after:
            k += 1
        if k >= total:
            k = 0  # wrap around, as Perfetto does
    else:
        k = int(np.searchsorted(starts, t, side="right")) - 1
        while k >= 0 and starts[k] == t and refs[k] >= after:
            k -= 1
        if k < 0:
            k = total - 1
    r = int(refs[k])
    return {"total": total, "index": k, "match": ix.event_brief(r)}


def _roofline_of(t, label):
    tab = t.roofline()
    pf = pb = None
    source = None
    if t.modeled:
        try:
            from ..spec import preset

            sp = preset(t.preset_name())  # None: the spec's default preset
            pf, pb, source = sp.peak_flops() / 1e12, sp.hbm_bytes_per_ns, f"preset {sp.name}"
        except ValueError:  # a preset name this install does not know
            pass
    else:
        from tilescope.trace import GPU_PEAKS

        names = t.device_names()
        for row in GPU_PEAKS:
            if names and row[0].lower() in names[0].lower():
                pf, pb, source = row[1], row[3], row[4]
                break
    return {"table": _table(tab), "peak_tflops": pf, "peak_gbps": pb, "peak_source": source,
            "modeled": t.modeled, "what": label, "estimated": not t.modeled}


def _diff_profile(t):
    import tilescope.trace as tt

    return tt.diff_profile(t)


# The analyses of one source the page opens, by name: (key of its answer in the source's
# Results, the file that keeps it, how: ``fn(trace, what, allowed)`` with ``what`` the
# source's label_text() and ``allowed`` its file check). The session computes them in the
# background at start, in worker processes (._offload), and the endpoints below answer from
# the same keys: a click waits for the background's answer instead of computing it again.
NAMED = {
    "ops": (("ops", False), "ops", lambda t, what, allowed: {"table": _table(t.op_table(by_shape=False)),
                                                              "modeled": t.modeled, "what": what}),
    "ops-by-shape": (("ops", True), "ops-by-shape", lambda t, what, allowed: {
        "table": _table(t.op_table(by_shape=True)), "modeled": t.modeled, "what": what}),
    "summary-core": ("summary-core", "summary-core", lambda t, what, allowed: summary_core(t, allowed)),
    "kernels": ("kernels", "kernels", lambda t, what, allowed: {"table": _table(t.kernels()), "modeled": t.modeled,
                                                                 "what": what}),
    "breakdown": ("breakdown", "breakdown", lambda t, what, allowed: {
        "device": _table(t.breakdown(side="device")), "host": _table(t.breakdown(side="host")),
        "modeled": t.modeled, "what": what}),
    "roofline": ("roofline", "roofline", lambda t, what, allowed: _roofline_of(t, what)),
    "engines": ("engines", "engines", lambda t, what, allowed: {"table": _table(t.engine_breakdown()), "modeled": True}),
    "summary-analyses": ("summary-analyses", "summary-analyses", lambda t, what, allowed: summary_analyses(t)),
    # each source's part of every comparison it takes part in (tilescope.trace.diff_profile)
    "diff-profile": ("diff-profile", "diff-profile", lambda t, what, allowed: _diff_profile(t)),
}


def _named(src, name: str):
    key, store, how = NAMED[name]
    what = src.label_text()
    return src.analysis(key, lambda t: how(t, what, src.allowed), store=store)


def _ops(src, q):
    return _named(src, "ops-by-shape" if _one(q, "by_shape", "0") in ("1", "true", "yes") else "ops")


def _kernels(src, q):
    return _named(src, "kernels")


def _breakdown(src, q):
    return _named(src, "breakdown")


def _engines(src, q):
    return _named(src, "engines")


def _roofline(src, q):
    return _named(src, "roofline")


SUMMARY_PARTS = ("all", "core", "analyses")  # the page asks for core and analyses apart: core is quick


def _summary(src, q):
    part = _one(q, "part", "all")
    if part not in SUMMARY_PARTS:
        raise ApiError(400, f"parameter 'part' must be one of {', '.join(SUMMARY_PARTS)}, got {part!r}",
                       "pass part=core (figures, rules, gaps), part=analyses (HTA's analyses) or part=all")
    core = analyses = {}
    if part in ("core", "all"):
        core = _named(src, "summary-core")
    if part in ("analyses", "all"):
        analyses = _named(src, "summary-analyses")
    return {**core, **analyses}


def _executions_ep(src, q):
    return {"executions": src.facts.get("executions", []), "modeled": True}


def _device_data(src, h, run):
    def build(t):
        try:
            return _device_view.execution_data(t, h, run, src.allowed)
        except KeyError as e:
            raise ApiError(404, _key_message(e), "pick an execution from /executions") from None
    return src.analysis(("device", h, run), build)


def _device_ep(src, q):
    h, run = _hash(q), _int(q, "run", 0, lo=0)
    header, cols = _device_data(src, h, run)
    arrays = {"index": ("u32", cols["index"]), "engine": ("u16", cols["engine"]), "kind": ("u16", cols["kind"]),
              "start": ("f64", cols["start"]), "end": ("f64", cols["end"]), "bytes": ("f64", cols["bytes"]),
              "flops": ("f64", cols["flops"]), "prov": ("u32", cols["prov"]), "flags": ("u8", cols["flags"])}
    return Response(200, pack(arrays, _clean(header)), "application/octet-stream")


def _instruction(src, q):
    h, run, i = _hash(q), _int(q, "run", 0, lo=0), _int(q, "index", lo=0)
    data = _device_data(src, h, run)

    def build(t):
        try:
            return _device_view.instruction_detail(t, h, run, i, src.allowed, data=data)
        except KeyError as e:
            raise ApiError(404, _key_message(e), "pick an instruction of the device view") from None
    return src.analysis(("instruction", h, run, i), build)


def _memory(src, q):
    h, run = _hash(q), _int(q, "run", 0, lo=0)
    return src.analysis(("memory", h, run), lambda t: _device_view.memory_usage(t, h, run, src.allowed))


def _code(src, q):
    h, run = _hash(q), _int(q, "run", 0, lo=0)
    return src.analysis(("code", h, run),
                        lambda t: _device_view.code_lines(t, h, run, src.allowed, src.source_roots()))


def _files(src, q):
    import os

    return {"files": [{"name": k, "bytes": os.path.getsize(v)} for k, v in sorted(src.files.items())]}


def _file(src, q):
    name = _one(q, "path")
    if name is None:
        raise ApiError(400, "parameter 'path' is required", "pass one of the names listed by /files")
    try:
        p = src.file_path(str(name))
    except KeyError as e:
        raise ApiError(404, _key_message(e), "only the files of the opened profile are served; see /files") from None
    with open(p, "rb") as f:
        data = f.read()
    ctype = "application/json" if p.endswith(".json") else "application/gzip" if p.endswith(".gz") else "text/plain"
    base = re.sub(r"[^\w.\-]", "_", name.split("/")[-1])
    return Response(200, data, ctype, {"Content-Disposition": f'attachment; filename="{base}"'})


def _csv(header: list[str], data: list[list]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(data)
    return buf.getvalue().encode()


def _export(src, what: str, q):
    if what == "instructions.csv":
        h, run = _hash(q), _int(q, "run", 0, lo=0)
        header, cols = _device_data(src, h, run)
        sel = np.ones(cols["index"].size, dtype=bool)
        if _one(q, "t0") is not None or _one(q, "t1") is not None:
            t0 = float(_int(q, "t0", 0))
            t1 = float(_int(q, "t1", INT_LIMIT))
            sel &= (cols["end"] > t0) & (cols["start"] < t1)
        eng = _one(q, "engines")
        if eng:
            wanted = set(str(eng).split(","))
            unknown = wanted - set(header["engines"])
            if unknown:
                raise ApiError(400, f"unknown engines {sorted(unknown)}; this execution has {header['engines']}",
                               "pass engines=<comma-separated names from the device view>")
            ids = [i for i, e in enumerate(header["engines"]) if e in wanted]
            sel &= np.isin(cols["engine"], ids)
        prov = header["provenance"]
        out = []
        for r in np.flatnonzero(sel).tolist():
            f = int(cols["flags"][r])
            out.append([int(cols["index"][r]), header["engines"][cols["engine"][r]], header["kinds"][cols["kind"][r]],
                        f"{cols['start'][r]:.3f}", f"{cols['end'][r]:.3f}", f"{cols['end'][r] - cols['start'][r]:.3f}",
                        int(cols["bytes"][r]), float(cols["flops"][r]), prov[int(cols["prov"][r])]["text"],
                        int(bool(f & 1)), int(bool(f & 6))])
        out.sort(key=lambda x: x[0])
        body = _csv(["index", "engine", "kind", "start_ns_modeled", "end_ns_modeled", "dur_ns_modeled", "bytes", "flops",
                     "provenance", "small_dma", "spill"], out)
        return Response(200, body, "text/csv", {"Content-Disposition": f'attachment; filename="instructions_{h}_{run}.csv"'})
    if what in ("ops.csv", "kernels.csv"):
        t = (_ops(src, {}) if what == "ops.csv" else _kernels(src, {}))["table"]
        return Response(200, _csv(t["columns"], t["rows"]), "text/csv",
                        {"Content-Disposition": f'attachment; filename="{src.label}_{what}"'})
    if what == "summary.json":
        return Response(200, to_json(_summary(src, q)), "application/json",
                        {"Content-Disposition": f'attachment; filename="{src.label}_summary.json"'})
    raise ApiError(404, f"unknown export {what!r}", "exports: instructions.csv, ops.csv, kernels.csv, summary.json")


def _compare_ids(session, q) -> list:
    raw = str(_one(q, "ids", ""))
    if len(raw) > 2000:
        raise ApiError(400, f"parameter 'ids' is {len(raw):,} characters long", f"pass at most {MAX_COMPARE} ids: ids=p0,p1")
    ids = [i for i in raw.split(",") if i]
    if len(ids) < 2:
        raise ApiError(400, f"compare needs at least two profiles, got {ids}", "pass ids=p0,p1")
    if len(ids) > MAX_COMPARE:
        raise ApiError(400, f"compare of {len(ids)} profiles asked; one request compares at most {MAX_COMPARE}",
                       f"pass at most {MAX_COMPARE} distinct ids")
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ApiError(400, f"profile {', '.join(dup)} is listed more than once in ids={raw}",
                       "list each profile once (open the same path twice to compare it with itself)")
    srcs = []
    for i in ids:
        try:
            s = session.get(i)
        except KeyError as e:
            raise ApiError(404, _key_message(e), "pass ids of opened profiles (see /api/profiles)") from None
        if not s.ok:
            raise ApiError(409, f"{s.label} could not be loaded: {s.error}", s.fix or "")
        srcs.append(s)
    return srcs


def _compare_of(srcs, job=None):
    """The diff of ``srcs`` from each one's diff profile: computed once per source (in the
    background from the start) and shared by every comparison it takes part in, so a pair
    compared for the first time costs only the combination."""
    import tilescope.trace as tt

    from ._work import check

    labels = []
    for s in srcs:
        lab = s.label
        while lab in labels:
            lab += "'"
        labels.append(lab)
    profiles = []
    for s in srcs:
        profiles.append(_named(s, "diff-profile"))
        check()
    # the traces only name the columns here: every figure comes from the profiles
    d = tt.diff(*[s.trace for s in srcs], names=labels, profiles=profiles)
    out = {"diff": d.to_dict(), "ops": _table(d.ops), "summary": _table(d.summary), "regions": _table(d.regions)}
    prof = []
    for s, lab in zip(srcs, labels):
        m = _meta(s, {})
        prof.append({"id": s.id, "label": lab, "modeled": m["modeled"], "what": m["what"], "span_ns": m["span_ns"],
                     "first_step_ns": m["first_step_ns"], "first_device_ns": m["first_device_ns"],
                     "device_end_ns": m["device_end_ns"], "waits": m["waits"]})
    return {"profiles": prof, **out}


def _compare(session, q):
    srcs = _compare_ids(session, q)
    key = ("compare", tuple(s.id for s in srcs))
    return session.results.get(key, lambda job: _compare_of(srcs, job))


# what a session computes in the background at start, per source, in this order (the
# quick tables first, HTA's analyses and the comparison parts -- the longest on a large
# trace -- last)
WARM = ("ops", "summary-core", "kernels", "breakdown", "roofline", "engines")
WARM_LATE = ("summary-analyses", "diff-profile")


def warm_up(session, *, processes: bool = True) -> None:
    """Start the analyses every page opens, and the comparison of every opened source, in
    the background (see ``Session.warm_up``): in worker processes (._offload) unless
    ``processes`` is False or none can start, else on the sources' own threads."""
    ok = [s for s in session.sources if s.ok]
    for s in ok:
        s.results.warm("links", lambda job, ix=s.index: ix.prepare_links())  # a step's first click answers at once
    for names in (WARM, WARM_LATE):
        for s in ok:
            for name in names:
                if name == "engines" and not s.facts.get("modeled"):
                    continue
                _warm_named(s, name, processes)
    if len(ok) >= 2:
        first = ok[:MAX_COMPARE]
        session.results.warm(("compare", tuple(s.id for s in first)), lambda job: _compare_of(first, job))


def _warm_named(src, name: str, processes: bool) -> None:
    from . import _offload

    key, store, how = NAMED[name]
    what = src.label_text()
    spec = {"path": src.path, "source_dirs": src.source_dirs, "what": what, "store": src.results.store_dir}
    if processes and src.results.warm_elsewhere(key, lambda: _offload.submit(spec, name), store=store):
        return
    src.warm(key, lambda t: how(t, what, src.allowed), store=store)


ROUTES = {
    "meta": _meta, "window": _window, "event": _event, "lineage": _lineage, "select": _select, "search": _search,
    "match": _match, "ops": _ops, "kernels": _kernels, "breakdown": _breakdown, "engines": _engines,
    "roofline": _roofline, "summary": _summary, "executions": _executions_ep, "device": _device_ep,
    "instruction": _instruction, "memory": _memory, "code": _code, "files": _files, "file": _file,
}


def _error(status: int, message: str, fix: str = "") -> Response:
    return Response(status, to_json({"error": message, "fix": fix}), "application/json")


def handle(session, path: str, query: dict) -> Response:
    """Answer one API request: ``path`` like ``/api/p/p0/window``, ``query`` a dict of lists."""
    try:
        parts = [p for p in path.split("/") if p]
        if parts[:1] != ["api"]:
            raise ApiError(404, f"no API at {path!r}", "API paths start with /api/")
        if parts[1:] == ["profiles"]:
            return _ok({"profiles": session.describe()})
        if parts[1:2] == ["compare"] and len(parts) == 2:
            return _ok(_compare(session, query))
        if len(parts) >= 4 and parts[1] == "p":
            try:
                src = session.get(parts[2])
            except KeyError as e:
                raise ApiError(404, _key_message(e), "see /api/profiles for the opened profiles") from None
            if not src.ok:
                raise ApiError(409, f"{src.label} could not be loaded: {src.error}", src.fix or "")
            if parts[3] == "export" and len(parts) == 5:
                return _export(src, parts[4], query)
            fn = ROUTES.get(parts[3]) if len(parts) == 4 else None
            if fn is None:
                raise ApiError(404, f"no endpoint {'/'.join(parts[3:])!r}", f"endpoints: {', '.join(sorted(ROUTES))}, export/...")
            out = fn(src, query)
            return out if isinstance(out, Response) else _ok(out)
        raise ApiError(404, f"no API at {path!r}", "see /api/profiles")
    except ApiError as e:
        return _error(e.status, str(e), e.fix)
    except Cancelled:
        return Response(CANCELLED, b"", "application/json")
    except (ValueError, OverflowError) as e:
        return _error(400, str(e), "check the request's parameters")
    except PermissionError as e:
        return _error(403, str(e), "only files inside the opened profiles are read")
