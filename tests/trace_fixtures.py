"""Small tilescope profile directories for the analysis-engine tests, made from the core modules.

They follow docs/profile-format.md (version 1) and the runtime's time rule: an execution
starts at max(host submit + runtime cost, end of the previous execution on the core).
The RMSNorm pair mirrors the reference study: the naive model runs six aten ops, each one
device execution; the fused model runs one ``aten::rms_norm`` execution.
"""

from __future__ import annotations

import hashlib
import json
import os

from tilescope.program import TileBuilder
from tilescope.sim import simulate
from tilescope.spec import preset

ROWS, COLS = 256, 512
NAIVE_OPS = ("aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul", "aten::mul")


def _unary_program(op: str, spec: str, rows: int = ROWS, cols: int = COLS, reduce: bool = False):
    """Load a tile, one compute instruction, store: the shape of one eager elementwise op."""
    b = TileBuilder(op.replace("aten::", ""), spec)
    x = b.input("x", (rows, cols), "float32")
    out_cols = 1 if reduce else cols
    y = b.output("y", (rows, out_cols), "float32")
    with b.provenance(op=op):
        for r0, n in b.tiles(rows, 128):
            t = b.sbuf((n, cols), "float32", site="t")
            b.dma_copy(t, x[r0:r0 + n])
            if reduce:
                s = b.sbuf((n, 1), "float32", site="s")
                b.tensor_reduce(s, t, "add")
                b.tensor_scalar(s, s, "multiply", 1.0 / cols)
                b.dma_copy(y[r0:r0 + n], s)
            else:
                if op == "aten::rsqrt":
                    b.activation(t, t, "rsqrt")
                elif op == "aten::pow":
                    b.tensor_tensor(t, t, t, "multiply")
                else:
                    b.tensor_scalar(t, t, "multiply" if op == "aten::mul" else "add", 1.5)
                b.dma_copy(y[r0:r0 + n], t)
    return b.build()


def _fused_program(spec: str, rows: int = ROWS, cols: int = COLS):
    b = TileBuilder("rms_norm", spec)
    x = b.input("x", (rows, cols), "float32")
    y = b.output("y", (rows, cols), "float32")
    with b.provenance(op="aten::rms_norm"):
        for r0, n in b.tiles(rows, 128):
            t = b.sbuf((n, cols), "float32", site="t")
            sq = b.sbuf((n, cols), "float32", site="sq")
            s = b.sbuf((n, 1), "float32", site="s")
            b.dma_copy(t, x[r0:r0 + n])
            b.tensor_tensor(sq, t, t, "multiply")
            b.tensor_reduce(s, sq, "add")
            b.tensor_scalar(s, s, "multiply", 1.0 / cols, "add", 1e-6)
            b.activation(s, s, "rsqrt")
            b.tensor_scalar(t, t, "multiply", 1.5)
            b.dma_copy(y[r0:r0 + n], t)
    return b.build()


def programs_for(model: str, spec: str):
    """[(aten op, Program)] in call order for one forward of ``model`` ('naive' or 'fused')."""
    if model == "naive":
        return [(op, _unary_program(op, spec, reduce=(op == "aten::mean"))) for op in NAIVE_OPS]
    if model == "fused":
        return [("aten::rms_norm", _fused_program(spec))]
    raise ValueError(model)


def write_profile(root: str, model: str = "naive", spec: str = "trn1", steps: int = 2,
                  itraces: bool = True, corrupt: str | None = None) -> str:
    """Write a complete profile directory under ``root``; return its path."""
    core = preset(spec)
    path = os.path.join(root, f"host_pid_100/{model}_{spec}")
    os.makedirs(os.path.join(path, "executables"), exist_ok=True)
    os.makedirs(os.path.join(path, "itraces"), exist_ok=True)
    pid, tid = 100, 100
    inst = "host"
    ev = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": f"{inst}/{pid}/framework"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": f"TID:{tid}"}},
        {"ph": "M", "name": "process_name", "pid": 2, "tid": 0, "args": {"name": f"{inst}/{pid}/runtime"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 0, "args": {"name": "NC:0"}},
        {"ph": "M", "name": "process_name", "pid": 3, "tid": 0, "args": {"name": f"{inst}/{pid}/hardware"}},
        {"ph": "M", "name": "thread_name", "pid": 3, "tid": 0, "args": {"name": "NC0:0"}},
    ]
    progs = programs_for(model, spec)
    seen_runs: dict[str, int] = {}
    t = 5.0  # us
    flow = 0
    prev_end = 0.0
    dispatch = core.host_dispatch_us
    runtime = core.runtime_exec_us
    ext = 0
    for step in range(steps):
        step_start = t
        t += 1.0
        module_start = t
        t += 1.0
        for op, prog in progs:
            flow += 1
            ext += 1
            res = simulate(prog, core)
            dur = res.summary.total_ns / 1000.0
            op_start = t
            submit = op_start + dispatch * 0.8
            hw_start = max(submit + runtime, prev_end)
            hw_end = hw_start + dur
            prev_end = hw_end
            ev.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": tid, "ts": op_start, "dur": dispatch,
                       "args": {"External id": ext, "Input Dims": [[ROWS, COLS]], "Input type": ["float"]}})
            ev.append({"ph": "s", "cat": "tilescope.flow", "name": "exec", "id": flow, "pid": 1, "tid": tid, "ts": submit})
            common = {"flow_id": flow, "program_hash": prog.hash, "op": op, "core": 0}
            ev.append({"ph": "X", "cat": "runtime", "name": f"execute {op}", "pid": 2, "tid": 0, "ts": submit,
                       "dur": hw_start - submit, "args": dict(common)})
            ev.append({"ph": "t", "cat": "tilescope.flow", "name": "exec", "id": flow, "pid": 2, "tid": 0, "ts": submit})
            ev.append({"ph": "X", "cat": "hardware", "name": f"exec_running {op}", "pid": 3, "tid": 0, "ts": hw_start,
                       "dur": dur, "args": {**common, "modeled": True, "instructions": len(prog)}})
            ev.append({"ph": "f", "bp": "e", "cat": "tilescope.flow", "name": "exec", "id": flow, "pid": 3, "tid": 0,
                       "ts": hw_start})
            t = op_start + dispatch + 0.5
            with open(os.path.join(path, "executables", f"exec_{prog.hash}.json"), "w") as f:
                json.dump(prog.to_json(), f)
            if itraces:
                run = seen_runs.get(prog.hash, 0)
                seen_runs[prog.hash] = run + 1
                tl = res.timeline
                doc = {"format": "tilescope.itrace", "version": 1, "program_hash": prog.hash, "preset": spec,
                       "modeled": True, "execution": {"flow_id": flow, "core": 0, "start_us": hw_start},
                       "lanes": list(tl.lanes), "kinds": list(tl.kinds),
                       "columns": {"index": tl.index.tolist(), "lane": tl.lane.tolist(), "kind": tl.kind.tolist(),
                                   "start_ns": tl.start_ns.tolist(), "end_ns": tl.end_ns.tolist(),
                                   "bytes": tl.nbytes.tolist(), "flops": tl.flops.tolist(), "prov": tl.prov.tolist()},
                       "summary": res.summary.to_dict()}
                with open(os.path.join(path, "itraces", f"exec_{prog.hash}.{run}.itrace.json"), "w") as f:
                    json.dump(doc, f)
        sync_start = t
        t = max(t, prev_end) + 2.0
        ev.append({"ph": "X", "cat": "sync", "name": "synchronize", "pid": 1, "tid": tid, "ts": sync_start,
                   "dur": t - sync_start, "args": {}})
        ev.append({"ph": "X", "cat": "user_annotation", "name": "RMSNorm", "pid": 1, "tid": tid, "ts": module_start,
                   "dur": sync_start - module_start, "args": {}})
        t += 1.0
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": tid,
                   "ts": step_start, "dur": t - step_start, "args": {}})
        t += 3.0
    doc = {"traceEvents": ev, "displayTimeUnit": "ns", "metadata": {"preset": spec}}
    with open(os.path.join(path, "system_trace.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(path, "trace.json"), "w") as f:
        json.dump({"traceEvents": [e for e in ev if e.get("pid") == 1]}, f)
    files = []
    for dirpath, _d, names in os.walk(path):
        for n in sorted(names):
            fp = os.path.join(dirpath, n)
            with open(fp, "rb") as f:
                data = f.read()
            files.append({"path": os.path.relpath(fp, path), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"format": "tilescope.profile", "version": 1, "complete": True, "created": "2026-11-29T07:40:00Z",
                "tilescope": "0.1.0", "device": {"kind": "sim", "name": "sim", "preset": spec,
                                                 "preset_fingerprint": core.fingerprint, "clock": "virtual"},
                "config": {}, "stats": {"events": len(ev), "executions": flow}, "files": files}
    if corrupt == "checksum":
        files[0]["sha256"] = "0" * 64
    if corrupt != "no_manifest":
        with open(os.path.join(path, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
    return path
