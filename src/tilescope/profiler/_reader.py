"""Reading profile directories: completeness, checksums, executable / trace pairs.

>>> import tempfile
>>> from tilescope.profiler import ProfileWriter, read_profile
>>> with ProfileWriter(tempfile.mkdtemp()) as w:
...     _ = w.write_json("trace.json", {"traceEvents": []})
>>> read_profile(w.path).complete
True
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ._profile_writer import FORMAT, FORMAT_VERSION

__all__ = ["Profile", "IncompleteProfileError", "ProfileFormatError", "read_profile", "find_profiles", "profiles_inside"]

_EXEC_RE = re.compile(r"^exec_([0-9a-f]+)\.json$")
_ITRACE_RE = re.compile(r"^exec_([0-9a-f]+)\.(\d+)\.itrace\.json$")


class ProfileFormatError(ValueError):
    """A file that should be part of a profile is malformed or does not match its pair."""


class IncompleteProfileError(ProfileFormatError):
    """The directory is not a complete profile (a crash or kill during export, or edits)."""


@dataclass
class Profile:
    """One profile directory. ``problems`` lists why it is incomplete (empty when complete)."""

    path: Path
    manifest: dict | None
    problems: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.problems

    def require_complete(self) -> "Profile":
        if self.problems:
            raise IncompleteProfileError(
                f"{self.path} is not a complete tilescope profile: " + "; ".join(self.problems)
                + ". It was probably interrupted while being written; profile again."
            )
        return self

    @property
    def device(self) -> dict:
        return (self.manifest or {}).get("device", {})

    def file(self, relpath: str) -> Path:
        return self.path / relpath

    def executables(self) -> dict[str, Path]:
        """program hash -> executable path."""
        d = self.path / "executables"
        out = {}
        if d.is_dir():
            for p in sorted(d.iterdir()):
                m = _EXEC_RE.match(p.name)
                if m:
                    out[m.group(1)] = p
        return out

    def itraces(self) -> list[tuple[str, int, Path]]:
        """(program hash, run, path) of every instruction trace, in run order."""
        d = self.path / "itraces"
        out = []
        if d.is_dir():
            for p in d.iterdir():
                m = _ITRACE_RE.match(p.name)
                if m:
                    out.append((m.group(1), int(m.group(2)), p))
        return sorted(out, key=lambda r: (r[1], r[0]))

    def program(self, program_hash: str):
        from ..program import Program

        path = self.executables().get(program_hash)
        if path is None:
            raise ProfileFormatError(f"{self.path} has no executable for program hash {program_hash}")
        return Program.from_json(path.read_text())

    def load_itrace(self, path: Path) -> dict:
        """Load an instruction trace and check it against its executable's hash."""
        doc = _load_json(path)
        m = _ITRACE_RE.match(Path(path).name)
        if doc.get("format") != "tilescope.itrace":
            raise ProfileFormatError(f"{path}: not a tilescope instruction trace (format {doc.get('format')!r})")
        if m and doc.get("program_hash") != m.group(1):
            raise ProfileFormatError(
                f"{path}: instruction trace is for program {doc.get('program_hash')} but its name says {m.group(1)}"
            )
        exe = self.executables().get(doc.get("program_hash", ""))
        if exe is None:
            raise ProfileFormatError(
                f"{path}: no executable exec_{doc.get('program_hash')}.json pairs with this instruction trace"
            )
        return doc


def _load_json(path: Path):
    try:
        return json.loads(Path(path).read_bytes())
    except json.JSONDecodeError as e:
        raise ProfileFormatError(f"{path}: invalid JSON at offset {e.pos}: {e.msg}") from None


def read_profile(path, *, verify: bool = True) -> Profile:
    """Open a profile directory and check its completeness (and checksums with ``verify``)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no profile directory at {path}")
    problems: list[str] = []
    if path.name.endswith(".partial"):
        problems.append("the directory is still named .partial (its export never finished)")
    mpath = path / "manifest.json"
    manifest = None
    if not mpath.exists():
        holds = profiles_inside(path) if not problems else None
        if holds:  # an output directory (or one process's), not a profile that lost its manifest
            raise FileNotFoundError(holds)
        problems.append("manifest.json is missing (it is written last)")
    else:
        try:
            manifest = json.loads(mpath.read_bytes())
        except json.JSONDecodeError as e:
            problems.append(f"manifest.json is not valid JSON (offset {e.pos})")
    if manifest is not None:
        if manifest.get("format") != FORMAT:
            problems.append(f"manifest format is {manifest.get('format')!r}, expected {FORMAT!r}")
        elif manifest.get("version") != FORMAT_VERSION:
            problems.append(
                f"profile format version {manifest.get('version')} is not supported by this tilescope "
                f"(reads version {FORMAT_VERSION}); use the tilescope version that wrote it"
            )
        if manifest.get("complete") is not True:
            problems.append("the manifest does not say complete: true")
        for entry in manifest.get("files", []):
            f = path / entry["path"]
            if not f.exists():
                problems.append(f"{entry['path']} is listed in the manifest but missing")
                continue
            size = f.stat().st_size
            if size != entry["bytes"]:
                problems.append(f"{entry['path']} has {size} bytes, the manifest says {entry['bytes']}")
            elif verify and hashlib.sha256(f.read_bytes()).hexdigest() != entry["sha256"]:
                problems.append(f"{entry['path']} does not match its sha256 in the manifest")
        problems += _unlisted(path, manifest)
    return Profile(path, manifest, problems)


# the folders whose files are read as the profile's executables and instruction traces
_LISTED_DIRS = (("executables", _EXEC_RE), ("itraces", _ITRACE_RE))


def _unlisted(path: Path, manifest: dict) -> list[str]:
    """A problem for each executable or instruction trace in the folder that the manifest does
    not list: it would be read as part of the profile with no checksum behind it."""
    listed = {entry["path"] for entry in manifest.get("files", [])}
    out = []
    for folder, pattern in _LISTED_DIRS:
        d = path / folder
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            rel = f"{folder}/{p.name}"
            if pattern.match(p.name) and rel not in listed:
                out.append(f"{rel} is not listed in the manifest (added after the export, or copied in from "
                           f"another profile); remove it, or profile again")
    return out


def profiles_inside(path) -> str | None:
    """When ``path`` is not a profile but the folder profiles are written under -- the
    ``output_dir`` (``<output_dir>/<host>_pid_<pid>/<timestamp>/``) or one process's folder in
    it --, what to say: how many it holds and the newest one's path; else None."""
    path = Path(path)
    found = [m.parent for pattern in ("*/manifest.json", "*/*/manifest.json") for m in path.glob(pattern)]
    partial = [d for d in found if d.name.endswith(".partial")]  # still being written, or never finished
    found = [d for d in found if d not in partial]
    if not found and not partial:
        return None
    held = (f"it holds {len(found)} profile(s)"
            + (f" and {len(partial)} unfinished one(s) (.partial)" if partial else ""))
    if not found:
        return (f"{path} is not a profile directory but a folder profiles are written under ({held}, none "
                f"complete); profile again, or run `tilescope doctor` on the .partial one to see what is missing")
    newest = max(found, key=lambda d: d.name)  # (a profile's name is its timestamp)
    return (f"{path} is not a profile directory but a folder profiles are written under ({held}); pass "
            f"one of them -- the newest is {newest}")


def find_profiles(root) -> list[Profile]:
    """Every profile under ``root`` (an output dir, an ``<instance>_pid_<pid>`` dir or a profile),
    incomplete ones included and flagged, newest last."""
    root = Path(root)
    if (root / "manifest.json").exists() or root.name.endswith(".partial"):
        return [read_profile(root, verify=False)]
    found = []
    for d in sorted(root.rglob("*")):
        if d.is_dir() and ((d / "manifest.json").exists() or d.name.endswith(".partial")):
            found.append(read_profile(d, verify=False))
    return found
