"""``tilescope share DIR --redact``: a copy of a profile that is safe to send.

Redaction replaces the host name and the user name, drops environment-like and platform
fields, shortens every absolute path (a file of tilescope itself to ``tilescope/...``, any
other to its file name) and removes Python call stacks. Executables drop the source text
of the kernels they embed (``keep_sources=True`` keeps it, under the shortened names, and
also writes it to ``sources/`` for the explorer's code view).

An executable's content hash covers its provenance, so shortened paths make a new
Program: each original is checked against its recorded hash first (a damaged profile is
an error, never silently re-hashed), then redacted and hashed anew; the executables,
their instruction traces and every reference to them are renamed to the new hashes, so
the pairs still match. The copy is written through the atomic writer, so its manifest
checksums are its own.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
from pathlib import Path

from ._profile_writer import ProfileWriter
from ._reader import read_profile

__all__ = ["share"]

# an absolute path: a "/" that starts a name (not the "/" of "a/b" or "GB/s"), at least one
# directory, and the file name (group 1). A Windows drive letter only as a word of its own
# (not the "f:" of "sbuf:/..."). A component stops at white space, quotes and ":;," (so
# "/data/k.py:5:9" keeps its ":5:9").
_PATH = re.compile(r"(?<![\w.~/\\-])(?:[A-Za-z]:)?((?:/[^/\s\"':;,]+)+)/([^/\s\"':;,]+)")
_DROP_KEYS = {"Call stack", "platform", "python", "host_name", "hostname", "deviceProperties", "environ", "env"}
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../tilescope


class _PathNames:
    """Absolute path -> the name a redacted profile shows, the same everywhere in the copy.

    Two files of one name in different directories stay two names (``k.py``, ``2/k.py``):
    a redacted Program never merges slots or provenance that were distinct."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}
        self._dirs: dict[str, list[str]] = {}  # file name -> directories seen, in order

    def __call__(self, m: re.Match) -> str:
        directory, base = m.group(1), m.group(2)
        full = m.group(0)
        hit = self._names.get(full)
        if hit is None:
            if (directory + "/").startswith(_PACKAGE + "/"):  # tilescope's own code: public, keep its layout
                hit = "tilescope" + full[len(_PACKAGE):]
            else:
                dirs = self._dirs.setdefault(base, [])
                if directory not in dirs:
                    dirs.append(directory)
                k = dirs.index(directory)
                hit = base if k == 0 else f"{k + 1}/{base}"
            self._names[full] = hit
        return hit


def _word(name: str | None):
    """``name`` as a word of its own, not inside another (host "vm", op "llvm_vmap")."""
    if not name or len(name) < 2:
        return None
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])")


def _redactor(host: str, user: str | None = None, paths: _PathNames | None = None, *, drop_keys: bool = True):
    """A function redacting a JSON value: names replaced, absolute paths shortened, and (with
    ``drop_keys``) environment-like fields dropped."""
    named = _word(host)
    user_re = _word(user)
    paths = paths or _PathNames()
    drop = _DROP_KEYS if drop_keys else ()

    def text(v: str) -> str:
        v = _PATH.sub(paths, v)  # paths first: a user's home directory goes with its path
        if named is not None:
            v = named.sub("host", v)
        if user_re is not None:
            v = user_re.sub("user", v)
        return v

    def redact(v):
        if isinstance(v, dict):
            return {text(k) if isinstance(k, str) else k: redact(x) for k, x in v.items() if k not in drop}
        if isinstance(v, list):
            return [redact(x) for x in v]
        if isinstance(v, str):
            return text(v)
        return v

    return redact


def _redacted_programs(prof, redact, keep_sources: bool) -> dict[str, object]:
    """old hash -> the Program redacted: checked against its recorded hash, then its paths and
    names shortened (and embedded sources dropped unless kept) and hashed anew."""
    from ..program import Program

    out = {}
    for old, path in prof.executables().items():
        data = json.loads(path.read_text())
        Program.from_json(data)  # the original's integrity: raises on a modified or truncated file
        meta = dict(data.get("meta") or {})
        if not keep_sources:
            meta.pop("sources", None)
        data = redact({**data, "meta": meta})
        data.pop("hash", None)  # the redacted content has a hash of its own
        out[old] = Program.from_json(data)
    return out


def _redaction(prof, recorded_host: str, keep_sources: bool):
    """(the redactor of values, old hash -> redacted Program, old hash -> new hash)."""
    host = socket.gethostname().split(".")[0]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        user = None
    paths = _PathNames()
    base = _redactor(recorded_host or host, user, paths)
    programs = _redacted_programs(prof, _redactor(recorded_host or host, user, paths, drop_keys=False),
                                  keep_sources)
    return base, programs, {old: p.hash for old, p in programs.items() if p.hash != old}


def _renaming(base, renames: dict[str, str]):
    """``base`` (the redactor), then every old executable hash replaced by its new one."""
    def fn(v):
        v = base(v)
        if renames:
            text = json.dumps(v)
            for old, new in renames.items():
                text = text.replace(old, new)
            v = json.loads(text)
        return v
    return fn


def share(src, out_dir, *, redact: bool = True, keep_sources: bool = False) -> Path:
    """Copy the complete profile ``src`` into ``out_dir`` (redacted by default); returns the new path.

    ``keep_sources``: a redacted copy keeps the kernels' source text (it leaves it out by default)."""
    prof = read_profile(src).require_complete()
    recorded_host = Path(prof.path).parent.name.rsplit("_pid_", 1)[0]
    base, programs, renames = _redaction(prof, recorded_host, keep_sources) if redact else (lambda v: v, {}, {})
    fn = _renaming(base, renames)
    manifest = prof.manifest
    w = ProfileWriter(out_dir, device=fn(manifest.get("device", {})), config=fn(manifest.get("config", {})),
                      instance="host" if redact else recorded_host, pid=0 if redact else None,
                      timestamp=Path(prof.path).name, redacted=redact)
    with w:
        for entry in manifest["files"]:
            rel = entry["path"]
            if redact and rel.startswith("executables/"):
                w.add_executable(programs[rel.split("exec_", 1)[1].rsplit(".json", 1)[0]])
            elif redact:
                copied = _redacted_file(rel, (prof.path / rel).read_bytes(), base, fn, renames, keep_sources)
                if copied is not None:
                    w.write_bytes(*copied)
            else:
                w.write_bytes(rel, (prof.path / rel).read_bytes())
        if keep_sources:  # the kernels' text where the explorer's code view looks for it
            written = {e["path"] for e in manifest["files"]}
            for name, text in _sources(programs.values()).items():
                if f"sources/{name}" not in written and not os.path.isabs(name) and ".." not in name.split("/"):
                    w.write_bytes(f"sources/{name}", text.encode())
        w.stats = manifest.get("stats", {})
    return w.path


def _redacted_file(rel: str, data: bytes, base, fn, renames: dict[str, str],
                   keep_sources: bool) -> tuple[str, bytes] | None:
    """(path, content) of a profile file in the redacted copy; None to leave it out (a
    kernel's source, unless kept)."""
    if rel.startswith("sources/"):
        if not keep_sources:
            return None
        return "sources/" + base(rel[len("sources/"):]), base(data.decode("utf-8", "replace")).encode()
    if rel.endswith(".json"):
        data = json.dumps(fn(json.loads(data)), separators=(",", ":")).encode()
        for old, new in renames.items():
            rel = rel.replace(old, new)
    return rel, data


def _sources(programs) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in programs:
        for name, text in (p.meta.get("sources") or {}).items():
            out.setdefault(name, text)
    return out
