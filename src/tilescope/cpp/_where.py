"""The user's source line of a stopped kernel: its frames (offsets in the library) through
``addr2line`` and the line tables the user's sources are built with (``-g``).

The first frame is the stopped instruction itself; the others are return addresses, looked
up one byte back (inside the call). Of each frame's inline chain, innermost first, the first
line in a file that is neither tilescope's header nor its runtime is the user's line.
"""

from __future__ import annotations

import linecache
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SourceLine", "user_line"]

_HERE = Path(__file__).resolve().parent
_INTERNAL = (str(_HERE / "include"), str(_HERE / "runtime"))
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]+$")


@dataclass(frozen=True)
class SourceLine:
    file: str
    line: int
    function: str | None

    @property
    def text(self) -> str:
        return linecache.getline(self.file, self.line).rstrip()


def _symbolize(library: Path, addresses: list[int]) -> list[list[tuple[str, str, int]]]:
    """Per address: its inline chain, innermost first, as (function, file, line)."""
    tool = shutil.which("addr2line")
    if tool is None or not addresses:
        return [[] for _ in addresses]
    try:
        out = subprocess.run([tool, "-e", str(library), "-f", "-C", "-i", "-a"] + [hex(a) for a in addresses],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return [[] for _ in addresses]
    chains: list[list[tuple[str, str, int]]] = []
    lines = out.splitlines()
    k = 0
    while k < len(lines):
        if _ADDRESS.match(lines[k].strip()):
            chains.append([])
            k += 1
            continue
        if chains and k + 1 < len(lines):
            func, where = lines[k].strip(), lines[k + 1].strip()
            where = where.split(" (discriminator", 1)[0]
            file, _, line = where.rpartition(":")
            if file and file != "??" and line.isdigit() and int(line) > 0:
                chains[-1].append((_short(func), file, int(line)))
            k += 2
            continue
        k += 1
    return (chains + [[] for _ in addresses])[:len(addresses)]


def _short(func: str) -> str | None:
    """``ns::f(tilescope::Tensor const&, long)`` -> ``ns::f``.

    >>> _short("(anonymous namespace)::deep(int)"), _short("??")
    ('deep', None)
    """
    if func == "??" or not func:
        return None
    func = func.replace("(anonymous namespace)::", "")
    return func.split("(", 1)[0] or func


def user_line(library: str | Path, frames) -> SourceLine | None:
    """The first line of the user's own sources among ``frames`` (None if none is known)."""
    wanted = [(k, (f if k == 0 else f - 1)) for k, f in enumerate(frames) if f is not None]
    if not wanted:
        return None
    chains = _symbolize(Path(library), [a for _, a in wanted])
    for chain in chains:
        for func, file, line in chain:
            if not file.startswith(_INTERNAL):
                return SourceLine(file, line, func)
    return None
