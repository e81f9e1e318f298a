"""Small tilescope profile directories for the analysis-engine tests, made from the core modules.

They follow docs/profile-format.md (version 1) and the runtime's time rule: an execution
starts at max(host submit + runtime cost, end of the previous execution on the core).
The RMSNorm pair mirrors the reference study: the naive model runs six aten ops, each one
device execution; the fused model runs one ``aten::rms_norm`` execution.
"""

from __future__ import annotations

import json
import os

from tilescope.profiler import ProfileWriter
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
    """Write a complete profile directory under ``root`` with the profiler's ProfileWriter;
    return its path. ``corrupt``: ``"checksum"`` (a manifest SHA-256 no longer matches) or
    ``"no_manifest"`` (as if the export was killed before the manifest)."""
    core = preset(spec)
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
    device = {"kind": "sim", "name": "sim", "preset": spec, "preset_fingerprint": core.fingerprint, "clock": "virtual"}
    progs = programs_for(model, spec)
    runs: dict[str, int] = {}
    t = 5.0  # us
    flow = 0
    prev_end = 0.0
    dispatch = core.host_dispatch_us
    runtime = core.runtime_exec_us
    with ProfileWriter(root, device=device, config={"source": "trace_fixtures", "model": model},
                       instance=inst, pid=pid, timestamp=f"{model}_{spec}") as w:
        for step in range(steps):
            step_start = t
            t += 1.0
            module_start = t
            t += 1.0
            for op, prog in progs:
                flow += 1
                res = simulate(prog, core)
                dur = res.summary.total_ns / 1000.0
                op_start = t
                submit = op_start + dispatch * 0.8
                hw_start = max(submit + runtime, prev_end)
                prev_end = hw_start + dur
                ev.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": tid, "ts": op_start,
                           "dur": dispatch, "args": {"External id": flow, "Input Dims": [[ROWS, COLS]],
                                                     "Input type": ["float"]}})
                ev.append({"ph": "s", "cat": "tilescope.flow", "name": "exec", "id": flow, "pid": 1, "tid": tid,
                           "ts": submit})
                common = {"flow_id": flow, "program_hash": prog.hash, "op": op, "core": 0}
                ev.append({"ph": "X", "cat": "runtime", "name": f"execute {op}", "pid": 2, "tid": 0, "ts": submit,
                           "dur": hw_start - submit, "args": dict(common)})
                ev.append({"ph": "t", "cat": "tilescope.flow", "name": "exec", "id": flow, "pid": 2, "tid": 0,
                           "ts": submit})
                ev.append({"ph": "X", "cat": "hardware", "name": f"exec_running {op}", "pid": 3, "tid": 0,
                           "ts": hw_start, "dur": dur, "args": {**common, "modeled": True, "instructions": len(prog)}})
                ev.append({"ph": "f", "bp": "e", "cat": "tilescope.flow", "name": "exec", "id": flow, "pid": 3,
                           "tid": 0, "ts": hw_start})
                t = op_start + dispatch + 0.5
                if itraces:
                    run = runs.get(prog.hash, 0)
                    runs[prog.hash] = run + 1
                    w.add_itrace(prog, res, run, execution={"flow_id": flow, "core": 0, "start_us": hw_start})
                else:
                    w.add_executable(prog)
            sync_start = t
            t = max(t, prev_end) + 2.0
            ev.append({"ph": "X", "cat": "sync", "name": "synchronize", "pid": 1, "tid": tid, "ts": sync_start,
                       "dur": t - sync_start, "args": {}})
            ev.append({"ph": "X", "cat": "user_annotation", "name": "RMSNorm", "pid": 1, "tid": tid,
                       "ts": module_start, "dur": sync_start - module_start, "args": {}})
            t += 1.0
            ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": tid,
                       "ts": step_start, "dur": t - step_start, "args": {}})
            t += 3.0
        w.write_json("system_trace.json", {"traceEvents": ev, "displayTimeUnit": "ns", "metadata": {"preset": spec}})
        w.write_json("trace.json", {"traceEvents": [e for e in ev if e.get("pid") == 1]})
        w.stats = {"events": len(ev), "executions": flow}
    path = str(w.path)
    mpath = os.path.join(path, "manifest.json")
    if corrupt == "checksum":
        with open(mpath) as f:
            manifest = json.load(f)
        manifest["files"][0]["sha256"] = "0" * 64
        with open(mpath, "w") as f:
            json.dump(manifest, f)
    elif corrupt == "no_manifest":
        os.remove(mpath)
    return path
