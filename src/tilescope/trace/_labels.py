"""Short, distinct names for the traces a diff or the explorer shows side by side.

>>> split_name("naive=runs/a"), split_name("runs/a")
(('naive', 'runs/a'), (None, 'runs/a'))
>>> short_label("profile_out/naive/vm_pid_12/20261129_082319_517000")
'naive · 20261129_082319'
>>> distinct(["trace.json.gz", "trace.json.gz", "b"], ["runA/trace.json.gz", "runB/trace.json.gz", "b"])
['runA/trace.json.gz', 'runB/trace.json.gz', 'b']
>>> distinct(["a", "a"], ["x/a", "x/a"])  # the same trace twice
['a', 'a (2)']
"""

from __future__ import annotations

import os
import re

__all__ = ["split_name", "short_label", "distinct"]

_NAMED = re.compile(r"([\w.\-]{1,40})=(.+)")
_TIMESTAMP = re.compile(r"\d{8}_\d{6}(_\d+)?")  # a profile directory's name
_PROCESS = re.compile(r".+_pid_\d+")  # the folder of one process's profiles


def split_name(arg: str) -> tuple[str | None, str]:
    """``NAME=PATH`` -> ``(NAME, PATH)``; a plain path -- or one with ``=`` that exists -- ->
    ``(None, path)``."""
    m = _NAMED.fullmatch(arg)
    if m and not os.path.exists(arg):
        return m.group(1), m.group(2)
    return None, arg


def short_label(path: str) -> str:
    """The basename, or for a profile's timestamp directory the folder above the
    ``<instance>_pid_<pid>`` level with the time (``naive · 20261129_082319``)."""
    path = os.fspath(path).rstrip("/")
    base = os.path.basename(path) or path
    if _TIMESTAMP.fullmatch(base):
        parent = os.path.dirname(path)
        up = os.path.basename(parent)
        if _PROCESS.fullmatch(up):
            up = os.path.basename(os.path.dirname(parent)) or up
        return f"{up} · {base[:15]}"
    return base


def distinct(labels: list[str], paths: list[str]) -> list[str]:
    """``labels`` made distinct: a label shared by different paths takes as many of their
    trailing folders as tell them apart; the same path again is numbered."""
    out = list(labels)
    for label in set(labels):
        same = [i for i, lab in enumerate(labels) if lab == label]
        if len(same) < 2:
            continue
        parts = {i: os.path.abspath(os.fspath(paths[i])).rstrip("/").split(os.sep) for i in same}
        paths_apart = len({tuple(p) for p in parts.values()})  # the same path twice stays the same
        depth = 1
        while len({tuple(parts[i][-depth:]) for i in same}) < paths_apart:
            depth += 1
        seen: dict[str, int] = {}
        for i in same:
            name = "/".join(parts[i][-depth:]) if depth > 1 else label
            seen[name] = seen.get(name, 0) + 1
            out[i] = name if seen[name] == 1 else f"{name} ({seen[name]})"
    return out
