"""The device view of one execution: its modeled instructions per engine and DMA queue,
their provenance, dependencies, on-chip memory over time, and warnings.

Reads the analysis engine's ``instructions`` and ``executables`` tables and the executable
file they name (for provenance, buffers, slots and operands); dependencies come from
:class:`tilescope.program.Program` (the same edges the scheduler honoured). Every time
here is modeled by tilescope's device model.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np

from ._engine import rows

__all__ = ["executions", "execution_data", "instruction_detail", "memory_usage", "code_lines",
           "SMALL_DMA_BYTES", "ENGINE_ORDER"]

SMALL_DMA_BYTES = 4096  # transfers below this size pay the DMA's fixed cost for little data
ENGINE_ORDER = ("TensorE", "TensorE.LoadStationary", "VectorE", "ScalarE", "GpSimd")

_programs: dict[str, object] = {}
_programs_lock = threading.Lock()


def _engine_rank(name: str) -> tuple:
    if name in ENGINE_ORDER:
        return (0, ENGINE_ORDER.index(name), 0)
    if name.startswith("DMA.q"):
        try:
            return (1, 0, int(name[5:]))
        except ValueError:
            pass
    return (2, 0, name)


def executions(trace) -> list[dict]:
    """Every device execution that has an instruction trace (or runs of one, for standalone
    executable + instruction-trace pairs): eid, name, start, duration, program hash, run."""
    runs = rows(trace.sql("""SELECT program_hash, run, any_value(flow_id) AS flow_id, count(*) AS instructions,
                                    max(end_ns) AS span_ns,
                                    count(DISTINCT engine) FILTER (WHERE engine NOT LIKE 'DMA%') AS engines,
                                    count(DISTINCT engine) FILTER (WHERE engine LIKE 'DMA%') AS dma_queues
                             FROM instructions GROUP BY program_hash, run ORDER BY program_hash, run"""))
    if not runs:
        return []
    names = {r["program_hash"]: r["name"] for r in rows(trace.sql("SELECT program_hash, name FROM executables"))}
    by_flow = {(r["program_hash"], r["flow_id"]): r for r in runs if r["flow_id"] is not None}
    first_run = {}
    for r in runs:
        first_run.setdefault(r["program_hash"], r)
    out, used = [], set()
    origin = trace.t0_ns
    for e in rows(trace.sql("""SELECT eid, name, ts_ns, dur_ns, program_hash, flow_id, lane FROM events
                               WHERE cat = 'hardware' AND program_hash IS NOT NULL ORDER BY ts_ns""")):
        r = by_flow.get((e["program_hash"], e["flow_id"]))
        exact = r is not None
        r = r or first_run.get(e["program_hash"])
        if r is None:
            continue
        used.add((r["program_hash"], r["run"]))
        out.append({"eid": e["eid"], "name": e["name"], "start_ns": e["ts_ns"] - origin, "dur_ns": e["dur_ns"],
                    "lane": e["lane"], "program_hash": e["program_hash"], "program": names.get(e["program_hash"]),
                    "run": r["run"], "flow_id": e["flow_id"], "instructions": r["instructions"],
                    "engines": r["engines"], "dma_queues": r["dma_queues"], "span_ns": r["span_ns"],
                    "own_trace": exact})
    for r in runs:
        if (r["program_hash"], r["run"]) not in used:
            out.append({"eid": None, "name": names.get(r["program_hash"]) or r["program_hash"], "start_ns": None,
                        "dur_ns": r["span_ns"], "lane": None, "program_hash": r["program_hash"],
                        "program": names.get(r["program_hash"]), "run": r["run"], "flow_id": r["flow_id"],
                        "instructions": r["instructions"], "engines": r["engines"], "dma_queues": r["dma_queues"],
                        "span_ns": r["span_ns"], "own_trace": True})
    return out


def _executable(trace, program_hash: str, allowed) -> dict:
    rows_ = rows(trace.sql("SELECT path FROM executables WHERE program_hash = ? LIMIT 1", params=[program_hash]))
    if not rows_:
        raise KeyError(f"no executable with hash {program_hash!r} in this profile")
    path = rows_[0]["path"]
    if not allowed(path):
        raise PermissionError(f"the executable of {program_hash} lies outside the opened profile: {path}")
    st = os.stat(path)
    key = ("exe", path, st.st_size, st.st_mtime_ns)
    with _programs_lock:
        ex = _programs.get(key)
    if ex is None:
        with open(path, encoding="utf-8") as f:
            ex = json.load(f)
        with _programs_lock:
            _programs[key] = ex
    return ex


def _program(trace, program_hash: str, allowed):
    """The Program (for dependencies), parsed once per hash."""
    with _programs_lock:
        p = _programs.get(program_hash)
    if p is None:
        from ..program import Program

        p = Program.from_json(_executable(trace, program_hash, allowed))
        with _programs_lock:
            _programs[program_hash] = p
    return p


def _buffer_of(operand) -> str | None:
    if isinstance(operand, dict) and isinstance(operand.get("ap"), list) and operand["ap"]:
        return operand["ap"][0]
    return None


def _describe(p: dict) -> str:
    parts = [p.get("op") or "", f"fx:{p['fx_node']}" if p.get("fx_node") else "",
             (f"{p['file']}:{p['line']}" if p.get("line") else p.get("file")) or "", p.get("label") or ""]
    return " ".join(x for x in parts if x) or "-"


def execution_data(trace, program_hash: str, run: int, allowed) -> tuple[dict, dict]:
    """(header, columns) of one run's instructions for the device view.

    Columns (numpy, one row per instruction, sorted by engine then start): ``index``,
    ``engine`` (into header ``engines``), ``kind`` (into ``kinds``), ``start``, ``end`` (ns from
    the execution's start), ``bytes``, ``flops``, ``prov`` (into ``provenance``), ``flags``
    (bit 0: small DMA, bit 1: spill store, bit 2: spill reload, bit 3: HBM read, bit 4: HBM write)."""
    from ._engine import arrow

    t = arrow(trace.sql("""SELECT index, engine, kind, start_ns, end_ns, bytes, flops FROM instructions
                           WHERE program_hash = ? AND run = ? ORDER BY index""", params=[program_hash, int(run)]))
    if t.num_rows == 0:
        raise KeyError(f"no instruction trace for executable {program_hash} run {run}")
    ex = _executable(trace, program_hash, allowed)
    instrs = ex.get("instructions", [])
    prov_list = ex.get("provenance", [{}])
    buffers = {b["name"]: b for b in ex.get("buffers", [])}
    index = t.column("index").to_numpy().astype(np.int64)
    engines_raw = t.column("engine").to_pylist()
    kinds_raw = t.column("kind").to_pylist()
    engines = sorted(set(engines_raw), key=_engine_rank)
    # always show the compute engines, idle ones included: an idle engine is a finding
    for e in ENGINE_ORDER:
        if e not in engines and e != "TensorE.LoadStationary":
            engines.append(e)
    engines.sort(key=_engine_rank)
    kinds = sorted(set(kinds_raw))
    e_id = {e: i for i, e in enumerate(engines)}
    k_id = {k: i for i, k in enumerate(kinds)}
    prov = np.zeros(t.num_rows, dtype=np.int32)
    flags = np.zeros(t.num_rows, dtype=np.uint8)
    nbytes = t.column("bytes").to_numpy().astype(np.float64)
    for r, i in enumerate(index.tolist()):
        d = instrs[i] if 0 <= i < len(instrs) else {}
        prov[r] = int(d.get("prov", 0) or 0)
        if kinds_raw[r] in ("dma_copy", "dma_indirect"):
            src, dst = buffers.get(_buffer_of(d.get("src"))), buffers.get(_buffer_of(d.get("dst")))
            if 0 < nbytes[r] < SMALL_DMA_BYTES:
                flags[r] |= 1
            if dst is not None and dst.get("memory") == "hbm":
                flags[r] |= 16
                if dst.get("role") == "scratch":
                    flags[r] |= 2
            if src is not None and src.get("memory") == "hbm":
                flags[r] |= 8
                if src.get("role") == "scratch":
                    flags[r] |= 4
    eng = np.array([e_id[e] for e in engines_raw], dtype=np.int32)
    order = np.lexsort((t.column("start_ns").to_numpy(), eng))
    cols = {
        "index": index[order].astype(np.int32), "engine": eng[order], "kind": np.array([k_id[k] for k in kinds_raw],
                                                                                     dtype=np.int32)[order],
        "start": t.column("start_ns").to_numpy()[order], "end": t.column("end_ns").to_numpy()[order],
        "bytes": nbytes[order], "flops": t.column("flops").to_numpy().astype(np.float64)[order],
        "prov": prov[order], "flags": flags[order],
    }
    span = float(cols["end"].max()) if t.num_rows else 0.0
    header = {
        "program_hash": program_hash, "run": int(run), "program": ex.get("name"), "preset": ex.get("spec"),
        "engines": engines, "kinds": kinds, "span_ns": span, "instructions": int(t.num_rows), "modeled": True,
        "provenance": [{"text": _describe(p), "op": p.get("op"), "fx_node": p.get("fx_node"), "file": p.get("file"),
                        "line": p.get("line"), "label": p.get("label")} for p in prov_list],
        "small_dma_bytes": SMALL_DMA_BYTES, "meta": ex.get("meta") or {},
    }
    return header, cols


def instruction_detail(trace, program_hash: str, run: int, index: int, allowed, data=None) -> dict:
    """One instruction: timing, operands, provenance, and its predecessors / successors
    (data dependencies of the Program) with each edge's slack in this run. ``data`` is the
    run's :func:`execution_data` when the caller has it (no query then)."""
    ex = _executable(trace, program_hash, allowed)
    instrs = ex.get("instructions", [])
    if not 0 <= index < len(instrs):
        raise KeyError(f"executable {program_hash} has {len(instrs)} instructions; index {index} is out of range")
    header, cols = data if data is not None else execution_data(trace, program_hash, run, allowed)
    pos = np.full(len(instrs), -1, dtype=np.int64)
    ok = (cols["index"] >= 0) & (cols["index"] < len(instrs))
    pos[cols["index"][ok]] = np.flatnonzero(ok)

    class _Times:  # index -> its timing row (the run's columns, no query)
        @staticmethod
        def get(j, default=None):
            r = int(pos[j]) if 0 <= j < pos.size else -1
            if r < 0:
                return default if default is not None else {}
            return {"index": j, "engine": header["engines"][int(cols["engine"][r])],
                    "kind": header["kinds"][int(cols["kind"][r])], "start_ns": float(cols["start"][r]),
                    "end_ns": float(cols["end"][r]), "bytes": float(cols["bytes"][r]), "flops": float(cols["flops"][r])}

    times = _Times
    prog = _program(trace, program_hash, allowed)
    indptr, indices = prog.dependencies
    preds = indices[indptr[index]:indptr[index + 1]].tolist()
    succ_key = f"succ:{program_hash}"
    with _programs_lock:
        succ = _programs.get(succ_key)
    if succ is None:
        n = len(indptr) - 1
        src = np.repeat(np.arange(n), np.diff(indptr))
        order = np.argsort(indices, kind="stable")
        s_ptr = np.searchsorted(indices[order], np.arange(n + 1))
        succ = (s_ptr, src[order])
        with _programs_lock:
            _programs[succ_key] = succ
    s_ptr, s_idx = succ
    succs = s_idx[s_ptr[index]:s_ptr[index + 1]].tolist()
    me = times.get(index, {})

    def hop(j, pred: bool):
        r = times.get(j, {})
        d = {"index": j, "kind": instrs[j].get("kind"), "engine": r.get("engine"), "start_ns": r.get("start_ns"),
             "end_ns": r.get("end_ns")}
        if r and me:
            d["slack_ns"] = (me["start_ns"] - r["end_ns"]) if pred else (r["start_ns"] - me["end_ns"])
        return d

    d = dict(instrs[index])
    p = ex.get("provenance", [{}])
    pi = int(d.pop("prov", 0) or 0)
    operands = {k: v for k, v in d.items() if isinstance(v, dict) and "ap" in v}
    buffers = {b["name"]: b for b in ex.get("buffers", [])}
    return {
        "program_hash": program_hash, "run": int(run), "index": index, "kind": d.get("kind"), "engine": me.get("engine"),
        "start_ns": me.get("start_ns"), "end_ns": me.get("end_ns"), "bytes": me.get("bytes"), "flops": me.get("flops"),
        "provenance": p[pi] if 0 <= pi < len(p) else {}, "provenance_text": _describe(p[pi]) if 0 <= pi < len(p) else "-",
        "operands": {k: {"buffer": v["ap"][0], "dtype": v["ap"][1], "offset": v["ap"][2], "dims": v["ap"][3],
                         "memory": buffers.get(v["ap"][0], {}).get("memory"), "role": buffers.get(v["ap"][0], {}).get("role")}
                     for k, v in operands.items()},
        # the ISA's engine id ("dve") and an op equal to the kind repeat the heading in other words
        "fields": {k: v for k, v in d.items() if k not in operands and k != "engine"
                   and not (k == "op" and v == d.get("kind"))},
        "predecessors": [hop(j, True) for j in preds], "successors": [hop(j, False) for j in succs],
        "modeled": True,
    }


def memory_usage(trace, program_hash: str, run: int, allowed) -> dict:
    """SBUF and PSUM bytes per partition in use over the run (modeled), from the Program's
    slots: a slot is live from the start of its first instruction to the end of its last."""
    ex = _executable(trace, program_hash, allowed)
    times = rows(trace.sql("SELECT index, start_ns, end_ns FROM instructions WHERE program_hash = ? AND run = ?",
                           params=[program_hash, int(run)]))
    st = {r["index"]: r["start_ns"] for r in times}
    en = {r["index"]: r["end_ns"] for r in times}
    capacity = {}
    try:
        from ..spec import preset

        sp = preset(ex.get("spec") or trace.preset_name())  # None: the spec's default preset
        capacity = {"sbuf": sp.sbuf_bytes_per_partition, "psum": sp.psum_bytes_per_partition}
    except ValueError:  # an unknown preset name: show usage without the capacity line
        capacity = {}
    out = {"capacity": capacity, "modeled": True, "series": {}}
    for mem in ("sbuf", "psum"):
        deltas: dict[float, int] = {}
        peak_slots = []
        for s in ex.get("slots", []):
            if s.get("memory") != mem or s.get("start") not in st or s.get("end") not in en:
                continue
            a, b = st[s["start"]], en[s["end"]]
            deltas[a] = deltas.get(a, 0) + int(s["nbytes"])
            deltas[b] = deltas.get(b, 0) - int(s["nbytes"])
            peak_slots.append(s)
        ts = sorted(deltas)
        level, t_out, v_out = 0, [], []
        for x in ts:
            level += deltas[x]
            t_out.append(x)
            v_out.append(level)
        out["series"][mem] = {"t": t_out, "bytes": v_out, "peak": max(v_out, default=0), "slots": len(peak_slots)}
    return out


def _read_source(rel: str, roots: list[str]) -> tuple[str | None, str | None]:
    """(text, where) of a kernel source file found under one of ``roots`` (never outside them)."""
    for root in roots:
        root_real = os.path.realpath(root)
        cands = [rel, os.path.join(root_real, os.path.basename(rel))] if os.path.isabs(rel) \
            else [os.path.join(root_real, rel)]
        for cand in cands:
            cand = os.path.realpath(cand)
            if not cand.startswith(root_real + os.sep) or not os.path.isfile(cand):
                continue
            if os.path.getsize(cand) > 2 << 20:
                return None, f"{rel}: larger than 2 MiB, not shown"
            with open(cand, encoding="utf-8", errors="replace") as f:
                return f.read(), cand
    return None, None


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the installed tilescope/


def _builtin_source(rel: str) -> tuple[str | None, str | None]:
    """(text, where) of one of tilescope's own kernels (``src/tilescope/lower/kernels.py`` as
    provenance records it): read from the installed package, nothing outside it."""
    import re

    m = re.search(r"(?:^|/)tilescope/(.+)$", rel.replace(os.sep, "/"))
    if not m:
        return None, None
    cand = os.path.realpath(os.path.join(_PACKAGE, m.group(1)))
    if not cand.startswith(os.path.realpath(_PACKAGE) + os.sep) or not cand.endswith(".py") or not os.path.isfile(cand):
        return None, None
    with open(cand, encoding="utf-8", errors="replace") as f:
        return f.read(), f"tilescope's own kernel source: {cand}"


def _source_hint(rel: str) -> str:
    if os.path.isabs(rel):
        return (f"the source text is not part of the profile; run `tilescope explore PROFILE --sources "
                f"{os.path.dirname(rel)}` (the kernel's own directory) to show it")
    first = rel.replace(os.sep, "/").split("/")[0]
    return (f"the source text is not part of the profile; the kernel's path {rel!r} is relative to the directory "
            f"the profiled program ran from: run `tilescope explore PROFILE --sources DIR` with that directory "
            f"(the one holding {first!r})")


def code_lines(trace, program_hash: str, run: int, allowed, source_roots: list[str]) -> dict:
    """Kernel source lines of one run with the instructions they emitted: per (file, line)
    instruction count, modeled busy ns per engine, bytes and FLOPs; plus the files' text where
    it is inside the profile (``sources/``) or a directory given with ``--sources``."""
    header, cols = execution_data(trace, program_hash, run, allowed)
    prov = header["provenance"]
    lines: dict[tuple, dict] = {}
    dur = cols["end"] - cols["start"]
    for r in range(cols["index"].size):
        p = prov[int(cols["prov"][r])] if int(cols["prov"][r]) < len(prov) else {}
        key = (p.get("file") or "", p.get("line") or 0, p.get("label") or p.get("op") or "")
        d = lines.setdefault(key, {"file": key[0] or None, "line": key[1] or None, "label": key[2] or None,
                                   "prov": int(cols["prov"][r]), "instructions": 0, "busy_ns": {}, "bytes": 0.0,
                                   "flops": 0.0, "indices": []})
        d["instructions"] += 1
        e = header["engines"][int(cols["engine"][r])]
        d["busy_ns"][e] = d["busy_ns"].get(e, 0.0) + float(dur[r])
        d["bytes"] += float(cols["bytes"][r])
        d["flops"] += float(cols["flops"][r])
        if len(d["indices"]) < 2000:
            d["indices"].append(int(cols["index"][r]))
    files = {}
    for f in sorted({k[0] for k in lines if k[0]}):
        text, where = _read_source(f, source_roots)
        if text is None and where is None:
            text, where = _builtin_source(f)
        files[f] = {"text": text, "found_at": where, "note": None if text is not None else _source_hint(f)}
    out = sorted(lines.values(), key=lambda d: (d["file"] or "~", d["line"] or 0, d["label"] or ""))
    return {"program_hash": program_hash, "run": int(run), "lines": out, "files": files, "modeled": True}
