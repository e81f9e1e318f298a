"""The system trace of a real-device run (CPU, CUDA, ROCm), from torch's Kineto trace.

Lanes follow the same ``<host>/pid:<pid>/<subsystem>`` scheme as simulated-device
profiles: framework (aten ops and annotations per host thread), runtime (CUDA/HIP
runtime and driver calls per host thread) and hardware (kernels, copies and
memsets per device stream). Each launch is linked by a flow, keyed by Kineto's
correlation id: framework op (the op whose ``External id`` the launch carries, or
the innermost op around it) -> runtime call -> device work.

>>> doc = {"traceEvents": [
...   {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 0, "dur": 10,
...    "args": {"External id": 1}},
...   {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7, "ts": 2, "dur": 3,
...    "args": {"External id": 1, "correlation": 9}},
...   {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 6, "dur": 20,
...    "args": {"device": 0, "stream": 7, "correlation": 9}}]}
>>> events = system_trace_from_kineto(doc, "host", 7)
>>> sorted(e["ph"] for e in events if e.get("cat") == "tilescope.flow")
['f', 's', 't']
"""

from __future__ import annotations

import bisect

__all__ = ["system_trace_from_kineto", "FRAMEWORK_CATS", "RUNTIME_CATS", "DEVICE_CATS"]

FRAMEWORK_CATS = {"cpu_op", "user_annotation", "python_function"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"}
DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "cuda_sync": "sync"}
_FW, _RT, _HW = 1, 2, 3


def _meta(pid, name):
    return {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}


def _thread(pid, tid, name):
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


def system_trace_from_kineto(doc: dict, host: str, pid: int) -> list[dict]:
    """Framework / runtime / hardware lanes and correlation flows from a Kineto trace."""
    raw = [e for e in doc.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    if not raw:
        return []
    t0 = min(float(e.get("ts", 0)) for e in raw)
    prefix = f"{host}/pid:{pid}"
    out = [_meta(_FW, f"{prefix}/framework"), _meta(_RT, f"{prefix}/runtime"), _meta(_HW, f"{prefix}/hardware")]
    lanes: dict[tuple, int] = {}

    def lane(pid_, key, name) -> int:
        tid = lanes.get((pid_, key))
        if tid is None:
            tid = lanes[(pid_, key)] = len([k for k in lanes if k[0] == pid_])
            out.append(_thread(pid_, tid, name))
        return tid

    by_ext: dict[object, dict] = {}
    fw_by_thread: dict[object, list] = {}
    launches: dict[object, dict] = {}
    device_work: dict[object, list] = {}
    for e in sorted(raw, key=lambda e: (float(e.get("ts", 0)), -float(e.get("dur", 0) or 0))):
        cat = e.get("cat")
        args = e.get("args") or {}
        ts = round(float(e.get("ts", 0)) - t0, 3)
        dur = round(float(e.get("dur", 0) or 0), 3)
        if cat in FRAMEWORK_CATS:
            tid = lane(_FW, e.get("tid"), f"tid:{e.get('tid')}")
            ev = {"ph": "X", "cat": cat, "name": e.get("name"), "pid": _FW, "tid": tid, "ts": ts, "dur": dur,
                  "args": {k: v for k, v in args.items() if k in ("External id", "Input Dims", "Call stack")}}
            out.append(ev)
            ext = args.get("External id")
            if ext is not None and cat == "cpu_op":
                by_ext.setdefault(ext, ev)
            fw_by_thread.setdefault(tid, []).append(ev)
        elif cat in RUNTIME_CATS:
            tid = lane(_RT, e.get("tid"), f"tid:{e.get('tid')}")
            ev = {"ph": "X", "cat": "runtime", "name": e.get("name"), "pid": _RT, "tid": tid, "ts": ts, "dur": dur,
                  "args": {k: v for k, v in args.items() if k in ("correlation", "External id", "cbid")},
                  "_fw_tid": lane(_FW, e.get("tid"), f"tid:{e.get('tid')}")}
            out.append(ev)
            if args.get("correlation") is not None:
                launches[args["correlation"]] = ev
        elif cat in DEVICE_CATS:
            device, stream = args.get("device", 0), args.get("stream", e.get("tid"))
            tid = lane(_HW, (device, stream), f"device:{device}/stream:{stream}")
            ev = {"ph": "X", "cat": "hardware" if DEVICE_CATS[cat] == "kernel" else DEVICE_CATS[cat],
                  "name": e.get("name"), "pid": _HW, "tid": tid, "ts": ts, "dur": dur,
                  "args": {k: v for k, v in args.items() if k in ("correlation", "device", "stream", "bytes",
                                                                  "grid", "block", "External id")}}
            out.append(ev)
            if args.get("correlation") is not None:
                device_work.setdefault(args["correlation"], []).append(ev)
    starts = {tid: [ev["ts"] for ev in evs] for tid, evs in fw_by_thread.items()}
    for corr, work in device_work.items():
        launch = launches.get(corr)
        if launch is None:
            continue
        fw_tid = launch["_fw_tid"]
        op = by_ext.get(launch["args"].get("External id"))
        if op is None or not (op["ts"] <= launch["ts"] <= op["ts"] + op["dur"]):
            op = _innermost(fw_by_thread.get(fw_tid, []), starts.get(fw_tid, []), launch["ts"])
        flow = {"cat": "tilescope.flow", "name": "launch", "id": corr}
        if op is not None:
            out.append({**flow, "ph": "s", "pid": _FW, "tid": op["tid"], "ts": launch["ts"]})
        out.append({**flow, "ph": "t" if op is not None else "s", "pid": _RT, "tid": launch["tid"], "ts": launch["ts"]})
        first = min(work, key=lambda ev: ev["ts"])
        out.append({**flow, "ph": "f", "bp": "e", "pid": _HW, "tid": first["tid"], "ts": first["ts"]})
    for ev in out:
        ev.pop("_fw_tid", None)
    return out


def _innermost(ops: list, starts: list, ts: float):
    """The shortest framework op on one thread whose interval contains ``ts``."""
    best = None
    for k in range(bisect.bisect_right(starts, ts) - 1, -1, -1):
        ev = ops[k]
        if ev["ts"] <= ts <= ev["ts"] + ev["dur"] and (best is None or ev["dur"] < best["dur"]):
            best = ev
        if best is not None and ev["ts"] + ev["dur"] < ts and k < len(ops) - 64:
            break
    return best
