"""Read a tilescope profile directory (docs/profile-format.md) and executable/itrace pairs.

Only the format is read here, never the device: the manifest and its checksums, the
system trace (handed to the Chrome-trace ingest), executables and instruction traces.
"""

from __future__ import annotations

import glob
import json
import os
import re

from ._jsonscan import TraceFormatError

__all__ = ["ProfileDir", "read_profile_dir", "read_itrace_pair", "instruction_rows"]

_ITRACE = re.compile(r"exec_([0-9a-f]+)\.(\d+)\.itrace\.json$")


class ProfileDir:
    """A validated profile directory: its manifest and the files to ingest."""

    def __init__(self, path: str, manifest: dict, trace_file: str, executables: dict[str, str],
                 itraces: list[tuple[str, int, str]], warnings: list[str]):
        self.path = path
        self.manifest = manifest
        self.trace_file = trace_file
        self.executables = executables  # hash -> path
        self.itraces = itraces  # (hash, run, path)
        self.warnings = warnings


def read_profile_dir(path: str, verify: bool = True) -> ProfileDir:
    """Validate ``path`` with the profiler's reader (completeness, sizes, SHA-256); raise
    TraceFormatError naming every problem if it is not a complete profile."""
    from ..profiler import read_profile  # the format's own reader (no torch, no device)

    path = os.path.abspath(path)
    try:
        prof = read_profile(path, verify=verify)
    except (OSError, ValueError) as e:
        raise TraceFormatError(f"{path}: {e}") from None
    if not prof.complete:
        raise TraceFormatError(
            f"{path}: incomplete profile directory: {'; '.join(prof.problems)}. "
            f"It was probably interrupted while being written (the manifest is written last); profile again"
        )
    manifest = prof.manifest
    warnings: list[str] = []
    trace_file = os.path.join(path, "system_trace.json")
    if not os.path.exists(trace_file):
        trace_file = os.path.join(path, "trace.json")
        if not os.path.exists(trace_file):
            raise TraceFormatError(f"{path}: neither system_trace.json nor trace.json is present")
        warnings.append(f"{path}: no system_trace.json; read trace.json (no runtime/hardware lanes)")
    executables = {}
    for fp in sorted(glob.glob(os.path.join(path, "executables", "exec_*.json"))):
        executables[os.path.basename(fp)[5:-5]] = fp
    itraces = []
    for fp in sorted(glob.glob(os.path.join(path, "itraces", "exec_*.itrace.json"))):
        m = _ITRACE.search(fp)
        if m:
            itraces.append((m.group(1), int(m.group(2)), fp))
    for h, _run, fp in itraces:
        if h not in executables:
            raise TraceFormatError(f"{fp}: instruction trace without its executable exec_{h}.json")
    return ProfileDir(path, manifest, trace_file, executables, itraces, warnings)


def _load_json(path: str, fmt: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise TraceFormatError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise TraceFormatError(f"{path}: field 'format' is {got!r}, expected {fmt!r}")
    return data


def read_itrace_pair(exec_path: str, itrace_path: str) -> tuple[dict, dict]:
    """An executable and one of its instruction traces; their hashes must match."""
    ex = _load_json(exec_path, "tilescope.executable")
    it = _load_json(itrace_path, "tilescope.itrace")
    if it.get("program_hash") != ex.get("hash"):
        raise TraceFormatError(
            f"{itrace_path} records program_hash {it.get('program_hash')!r} but {exec_path} has hash "
            f"{ex.get('hash')!r}: this instruction trace belongs to another executable. "
            f"Pair files with the same exec_<hash> name"
        )
    cols = it.get("columns")
    need = ("index", "lane", "kind", "start_ns", "end_ns", "bytes", "flops", "prov")
    if not isinstance(cols, dict) or any(c not in cols for c in need):
        raise TraceFormatError(f"{itrace_path}: field 'columns' must hold {', '.join(need)}")
    n = len(cols["index"])
    for c in need:
        if len(cols[c]) != n:
            raise TraceFormatError(f"{itrace_path}: column {c!r} has {len(cols[c])} rows, 'index' has {n}")
    return ex, it


def instruction_rows(ex: dict, it: dict, run: int) -> dict[str, list]:
    """Columns of the instructions table for one run."""
    cols = it["columns"]
    lanes, kinds = it.get("lanes", []), it.get("kinds", [])
    prov = ex.get("provenance", [])

    def describe(p: int) -> str:
        if not (0 <= p < len(prov)):
            return "-"
        d = prov[p]
        parts = [d.get("op") or "", f"fx:{d['fx_node']}" if d.get("fx_node") else "",
                 (f"{d['file']}:{d['line']}" if d.get("line") else d.get("file")) or "", d.get("label") or ""]
        return " ".join(x for x in parts if x) or "-"

    n = len(cols["index"])
    lane_of = [lanes[int(x)] if isinstance(x, int) and x < len(lanes) else str(x) for x in cols["lane"]]
    kind_of = [kinds[int(x)] if isinstance(x, int) and x < len(kinds) else str(x) for x in cols["kind"]]
    ex_info = it.get("execution") or {}
    return {
        "program_hash": [ex["hash"]] * n,
        "run": [run] * n,
        "flow_id": [ex_info.get("flow_id")] * n,
        "preset": [it.get("preset")] * n,
        "index": [int(x) for x in cols["index"]],
        "engine": lane_of,
        "kind": kind_of,
        "start_ns": [float(x) for x in cols["start_ns"]],
        "end_ns": [float(x) for x in cols["end_ns"]],
        "bytes": [int(x) for x in cols["bytes"]],
        "flops": [float(x) for x in cols["flops"]],
        "source": [describe(int(p)) for p in cols["prov"]],
    }
