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

from . import _device
from ._binary import pack
from ._engine import rows
from ._index import COLOR_MODES
from ._insights import summary_page

__all__ = ["Response", "ApiError", "handle", "ROUTES", "to_json"]


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
    try:
        x = int(float(v))
    except ValueError:
        raise ApiError(400, f"parameter {name!r} must be an integer, got {v!r}", f"pass {name}=<integer>") from None
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        raise ApiError(400, f"parameter {name!r} = {x} is outside [{lo}, {hi}]", f"pass {lo} <= {name} <= {hi}")
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
        return [int(x) for x in str(v).split(",") if x != ""]
    except ValueError:
        raise ApiError(400, f"parameter 'lanes' must be comma-separated lane numbers, got {v!r}",
                       "pass lanes=0,1,2 or lanes=all") from None


def _hash(q):
    return _str(q, "hash", pattern=r"[0-9a-f]{4,64}")


# ---- endpoints ----------------------------------------------------------------------------
def _core_of(lane: dict) -> str:
    ident = lane.get("identifier") or ""
    m = re.match(r"(?:NC|core)[:]?(\d+)", ident, re.IGNORECASE)
    if m and lane.get("subsystem") in ("runtime", "hardware"):
        return f"NC{m.group(1)}"
    if lane.get("side") == "device":
        return f"device {lane.get('pid')}"
    return "host"


def _meta(src, q):
    ix, t = src.index, src.trace
    lanes = []
    for ln in ix.lanes:
        d = dict(ln)
        i = d["lane"]
        d["max_depth"] = int(ix.max_depth[i]) if i < ix.max_depth.size else 0
        d["core"] = _core_of(d)
        lanes.append(d)
    with src.lock:  # one thread at a time on the trace's DuckDB connection
        execs = _executions(src)
        steps = rows(t.sql("SELECT min(ts_ns) AS first FROM events WHERE kind = 'step' AND ph = 'X'"))[0]["first"]
        preset = t.preset_name() if t.modeled else None
    return {
        "id": src.id, "label": src.label, "path": src.path, "kind": t.kind, "modeled": t.modeled,
        "what": src.label_text(), "devices": t.device_names(), "preset": preset,
        "origin_ns": ix.origin_ns, "span_ns": ix.span_ns, "events": ix.n, "lanes": lanes, "names": ix.names,
        "kinds": ix.kinds, "color_modes": list(COLOR_MODES), "warnings": list(t.warnings), "notes": list(t.notes),
        "doctor": src.doctor, "index": ix.stats(), "executions": len(execs),
        "first_step_ns": (steps - ix.origin_ns) if steps is not None else None,
        "files": sorted(src.files),
    }


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


def _lineage_hops(src, eid: int) -> list[dict]:
    t, ix = src.trace, src.index
    with src.lock:
        hops = t.lineage(eid)
        execs = {e["eid"]: e for e in _executions(src) if e["eid"] is not None}
    eids = [h.get("eid") for h in hops]
    refs = ix.refs_of([e if e is not None else -1 for e in eids])
    out = []
    for h, r in zip(hops, refs.tolist()):
        d = dict(h)
        if d.get("ts_ns") is not None:
            d["start_ns"] = d.pop("ts_ns") - ix.origin_ns
        d["ref"] = r if r >= 0 else None
        if r >= 0:
            d["depth"] = ix.event_brief(r)["depth"]
        ex = execs.get(d.get("eid"))
        if ex is not None:
            d["device_view"] = {"hash": ex["program_hash"], "run": ex["run"], "own_trace": ex["own_trace"]}
        out.append(d)
    # the instructions hop opens the device view of the execution before it
    for i, d in enumerate(out):
        if d.get("hop") == "instructions" and i and out[i - 1].get("device_view"):
            d["device_view"] = out[i - 1]["device_view"]
    return out


def _event(src, q):
    ix, t = src.index, src.trace
    if _one(q, "ref") is not None:
        ref = _int(q, "ref", lo=0, hi=max(0, ix.n - 1))
        eid = int(ix.eid[ref])
    else:
        eid = _int(q, "eid")
    with src.lock:
        try:
            ev = t.event(eid)
        except KeyError:
            raise ApiError(404, f"no event with eid {eid}", "take eids from the window or lineage endpoints") from None
    ev["start_ns"] = ev["ts_ns"] - ix.origin_ns
    r = int(ix.refs_of([eid])[0])
    ev["ref"] = r if r >= 0 else None
    if r >= 0:
        b = ix.event_brief(r)
        ev["depth"] = b["depth"]
    return ev


def _lineage(src, q):
    ix = src.index
    if _one(q, "ref") is not None:
        eid = int(ix.eid[_int(q, "ref", lo=0, hi=max(0, ix.n - 1))])
    else:
        eid = _int(q, "eid")
    try:
        hops = _lineage_hops(src, eid)
    except KeyError as e:
        raise ApiError(404, _key_message(e), "take eids from the window or event endpoints") from None
    return {"eid": eid, "hops": hops, "modeled": src.trace.modeled}


def _select(src, q):
    ix = src.index
    t0, t1 = _int(q, "t0"), _int(q, "t1")
    if t1 <= t0:
        raise ApiError(400, f"empty selection: t1 ({t1}) must be greater than t0 ({t0})", "drag over a time range")
    return {**ix.select(t0, t1, _lanes(q)), "modeled": src.trace.modeled}


def _search(src, q):
    ix = src.index
    text = str(_one(q, "q", "")).lower()
    if not text:
        return {"ids": [], "names": []}
    ids = [i for i, n in enumerate(ix.names) if text in n.lower()][:5000]
    return {"ids": ids, "names": [ix.names[i] for i in ids[:50]]}


def _cached(src, key, fn):
    with src.lock:
        if key not in src.cache:
            src.cache[key] = fn()
        return src.cache[key]


def _ops(src, q):
    by_shape = _one(q, "by_shape", "0") in ("1", "true", "yes")
    return _cached(src, ("ops", by_shape), lambda: {"table": _table(src.trace.op_table(by_shape=by_shape)),
                                                     "modeled": src.trace.modeled, "what": src.label_text()})


def _kernels(src, q):
    return _cached(src, "kernels", lambda: {"table": _table(src.trace.kernels()), "modeled": src.trace.modeled,
                                            "what": src.label_text()})


def _breakdown(src, q):
    return _cached(src, "breakdown", lambda: {"device": _table(src.trace.breakdown(side="device")),
                                              "host": _table(src.trace.breakdown(side="host")),
                                              "modeled": src.trace.modeled, "what": src.label_text()})


def _engines(src, q):
    return _cached(src, "engines", lambda: {"table": _table(src.trace.engine_breakdown()), "modeled": True})


def _roofline(src, q):
    def build():
        t = src.trace
        tab = t.roofline()
        pf = pb = None
        source = None
        if t.modeled:
            try:
                from ..spec import preset

                sp = preset(t.preset_name() or "trn1")
                pf, pb, source = sp.peak_flops() / 1e12, sp.hbm_bytes_per_ns, f"preset {sp.name}"
            except Exception:  # unknown preset
                pass
        else:
            from tilescope.trace import GPU_PEAKS

            names = t.device_names()
            for row in GPU_PEAKS:
                if names and row[0].lower() in names[0].lower():
                    pf, pb, source = row[1], row[3], row[4]
                    break
        return {"table": _table(tab), "peak_tflops": pf, "peak_gbps": pb, "peak_source": source,
                "modeled": t.modeled, "what": src.label_text(),
                "estimated": not t.modeled}
    return _cached(src, "roofline", build)


def _summary(src, q):
    return _cached(src, "summary", lambda: summary_page(src.trace, src.allowed))


def _executions(src):
    with src.lock:
        if "executions" not in src.cache:
            src.cache["executions"] = _device.executions(src.trace)
        return src.cache["executions"]


def _executions_ep(src, q):
    return {"executions": _executions(src), "modeled": True}


def _device_data(src, h, run):
    key = ("device", h, run)
    with src.lock:
        if key not in src.cache:
            try:
                src.cache[key] = _device.execution_data(src.trace, h, run, src.allowed)
            except KeyError as e:
                raise ApiError(404, _key_message(e), "pick an execution from /executions") from None
        return src.cache[key]


def _device_ep(src, q):
    h, run = _hash(q), _int(q, "run", 0, lo=0)
    header, cols = _device_data(src, h, run)
    arrays = {"index": ("u32", cols["index"]), "engine": ("u16", cols["engine"]), "kind": ("u16", cols["kind"]),
              "start": ("f64", cols["start"]), "end": ("f64", cols["end"]), "bytes": ("f64", cols["bytes"]),
              "flops": ("f64", cols["flops"]), "prov": ("u32", cols["prov"]), "flags": ("u8", cols["flags"])}
    return Response(200, pack(arrays, _clean(header)), "application/octet-stream")


def _instruction(src, q):
    h, run, i = _hash(q), _int(q, "run", 0, lo=0), _int(q, "index", lo=0)
    with src.lock:
        try:
            return _device.instruction_detail(src.trace, h, run, i, src.allowed)
        except KeyError as e:
            raise ApiError(404, _key_message(e), "pick an instruction of the device view") from None


def _memory(src, q):
    h, run = _hash(q), _int(q, "run", 0, lo=0)
    return _cached(src, ("memory", h, run), lambda: _device.memory_usage(src.trace, h, run, src.allowed))


def _code(src, q):
    h, run = _hash(q), _int(q, "run", 0, lo=0)
    return _cached(src, ("code", h, run),
                   lambda: _device.code_lines(src.trace, h, run, src.allowed, src.source_roots()))


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
            t1 = float(_int(q, "t1", 2**62))
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


def _compare(session, q):
    ids = str(_one(q, "ids", "")).split(",")
    ids = [i for i in ids if i]
    if len(ids) < 2:
        raise ApiError(400, f"compare needs at least two profiles, got {ids}", "pass ids=p0,p1")
    srcs = []
    for i in ids:
        try:
            s = session.get(i)
        except KeyError as e:
            raise ApiError(404, _key_message(e), "pass ids of opened profiles (see /api/profiles)") from None
        if not s.ok:
            raise ApiError(409, f"{s.label} could not be loaded: {s.error}", s.fix or "")
        srcs.append(s)
    key = ("compare", tuple(ids))
    cache = session.__dict__.setdefault("compare_cache", {})
    if key not in cache:
        import tilescope.trace as tt

        locks = sorted({id(s.lock): s.lock for s in srcs}.items())
        for _k, lk in locks:
            lk.acquire()
        try:
            labels = []
            for s in srcs:
                lab = s.label
                while lab in labels:
                    lab += "'"
                labels.append(lab)
            d = tt.diff(*[s.trace for s in srcs], names=labels)
        finally:
            for _k, lk in reversed(locks):
                lk.release()
        prof = []
        for s in srcs:
            m = _meta(s, {})
            prof.append({"id": s.id, "label": s.label, "modeled": s.trace.modeled, "what": s.label_text(),
                         "span_ns": m["span_ns"], "first_step_ns": m["first_step_ns"]})
        cache[key] = {"profiles": prof, "diff": d.to_dict(),
                      "ops": _table(d.ops), "summary": _table(d.summary), "regions": _table(d.regions)}
    return cache[key]


ROUTES = {
    "meta": _meta, "window": _window, "event": _event, "lineage": _lineage, "select": _select, "search": _search,
    "ops": _ops, "kernels": _kernels, "breakdown": _breakdown, "engines": _engines, "roofline": _roofline,
    "summary": _summary, "executions": _executions_ep, "device": _device_ep, "instruction": _instruction,
    "memory": _memory, "code": _code, "files": _files, "file": _file,
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
    except ValueError as e:
        return _error(400, str(e), "check the request's parameters")
    except PermissionError as e:
        return _error(403, str(e), "only files inside the opened profiles are read")
