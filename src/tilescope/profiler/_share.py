"""``tilescope share DIR --redact``: a copy of a profile that is safe to send.

Redaction replaces the host name, drops environment-like and platform fields,
reduces absolute paths to file names and removes Python call stacks. Executables
keep only file names in their provenance, which changes their content hash: the
executables, their instruction traces and every reference to them are renamed to
the new hashes, so the pairs still match. The copy is written through the atomic
writer, so its manifest checksums are its own.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

from ._format import ProfileWriter
from ._reader import read_profile

__all__ = ["share"]

# an absolute path (a Windows drive letter only as a word of its own: not the "f:" of "sbuf:/...")
_PATH = re.compile(r"(?:(?<![A-Za-z])[A-Za-z]:)?(?:/[^/\s\"':;,]+){2,}/([^/\s\"':;,]+)")
_DROP_KEYS = {"Call stack", "platform", "python", "host_name", "deviceProperties", "environ", "env"}


def _redactor(host: str):
    # the host name as a name of its own, not inside another word (host "vm", op "llvm_vmap")
    named = re.compile(rf"(?<![A-Za-z0-9]){re.escape(host)}(?![A-Za-z0-9])") if host else None

    def redact(v):
        if isinstance(v, dict):
            return {k: redact(x) for k, x in v.items() if k not in _DROP_KEYS}
        if isinstance(v, list):
            return [redact(x) for x in v]
        if isinstance(v, str):
            if named is not None:
                v = named.sub("host", v)
            return _PATH.sub(r"\1", v)
        return v

    return redact


def _redacted_programs(prof) -> dict[str, object]:
    """old hash -> Program whose provenance and names keep file names only."""
    import dataclasses
    import os

    from ..program import Program

    out = {}
    for old, path in prof.executables().items():
        # every absolute path in its text (buffer sites, slot names) reduced to its file name
        p = Program.from_json(_PATH.sub(r"\1", path.read_text()))
        prov = [dataclasses.replace(x, file=os.path.basename(x.file) if x.file else x.file) for x in p.provenance]
        out[old] = Program(p.name, p.buffers.values(), p.instructions, inputs=p.inputs, outputs=p.outputs,
                           provenance=prov, instr_prov=p.instr_prov, slots=p.slots.values(),
                           placement=p.placement, meta=p.meta, spec_name=p.spec_name)
    return out


def share(src, out_dir, *, redact: bool = True) -> Path:
    """Copy the complete profile ``src`` into ``out_dir`` (redacted by default); returns the new path."""
    prof = read_profile(src).require_complete()
    host = socket.gethostname().split(".")[0]
    recorded_host = Path(prof.path).parent.name.rsplit("_pid_", 1)[0]
    programs = _redacted_programs(prof) if redact else {}
    renames = {old: p.hash for old, p in programs.items() if p.hash != old}
    base = _redactor(recorded_host or host) if redact else (lambda v: v)

    def fn(v):
        v = base(v)
        if renames:
            text = json.dumps(v)
            for old, new in renames.items():
                text = text.replace(old, new)
            v = json.loads(text)
        return v
    manifest = prof.manifest
    w = ProfileWriter(out_dir, device=fn(manifest.get("device", {})), config=fn(manifest.get("config", {})),
                      instance="host" if redact else recorded_host, pid=0 if redact else None,
                      timestamp=Path(prof.path).name, redacted=redact)
    with w:
        for entry in manifest["files"]:
            rel = entry["path"]
            data = (prof.path / rel).read_bytes()
            if redact and rel.startswith("executables/"):
                old = rel.split("exec_", 1)[1].rsplit(".json", 1)[0]
                w.add_executable(programs[old])
                continue
            if redact and rel.endswith(".json"):
                data = json.dumps(fn(json.loads(data)), separators=(",", ":")).encode()
                for old, new in renames.items():
                    rel = rel.replace(old, new)
            w.write_bytes(rel, data)
        w.stats = manifest.get("stats", {})
    return w.path
