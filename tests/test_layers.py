"""The layer contract: which package may import which, checked over the whole import graph.

Packages form layers, each importing only from its own layer and those below it::

    base (errors, dtypes, _env, _lru, _console) -> spec, isa -> program -> sim -> lang, lower
        -> device, compile, cpp -> profiler -> trace -> explorer -> nki, studies, bench, cli

And a package's private modules and names (a leading underscore) are its own: a neighbour
imports what the package's ``__init__`` exports (its public API) or what its ``internal`` module
exports (``tilescope.device.internal``, ...: the small API its neighbours use, with no promise to
users). Every ``import`` statement counts, those inside functions too (they hide cycles from
Python, not from readers).

``ALLOWED`` lists today's exceptions. It may only shrink: a new violation fails, and so does an
entry whose import is gone (delete the entry). Each entry says why it exists and how to remove it.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tilescope"

# package (or top-level module) -> layer; higher layers may import lower ones, not the reverse
LAYER = {
    "base": 0,
    "spec": 1, "isa": 1,
    "program": 2,
    "sim": 3,
    "lang": 4, "lower": 4,
    "device": 5, "compile": 5, "cpp": 5,
    "profiler": 6,
    "trace": 7,
    "explorer": 8,
    "nki": 9, "studies": 9, "bench": 9, "cli": 9, "__main__": 9, "root": 9,
}
BASE_MODULES = {"_env", "_lru", "_console", "dtypes", "errors"}  # tilescope's top-level helpers, below everything
ROOT_BASE_NAMES = {"__version__"}  # defined in tilescope/__init__.py itself, which imports nothing eagerly


@dataclass(frozen=True, order=True)
class Edge:
    file: str  # importing file, relative to src/tilescope
    target: str  # imported module, dotted below tilescope ("device._runtime")
    kind: str  # "upward" (to a higher layer) or "private" (another package's _module or _name)


def _unit(parts: tuple[str, ...]) -> str:
    if not parts:
        return "root"
    return "base" if parts[0] in BASE_MODULES else parts[0]


def _is_module(parts: tuple[str, ...]) -> bool:
    path = SRC.joinpath(*parts)
    return (path.with_suffix(".py").exists() or (path / "__init__.py").exists()
            or path.with_suffix(".c").exists())  # a C extension's source stands for the built module


def _imports(path: Path):
    """(module parts, imported name or None) for every tilescope import in one file."""
    rel = path.relative_to(SRC).with_suffix("").parts
    package = rel[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                head, *rest = alias.name.split(".")
                if head == "tilescope":
                    yield tuple(rest), None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = base + (tuple(node.module.split(".")) if node.module else ())
            elif node.module and node.module.split(".")[0] == "tilescope":
                module = tuple(node.module.split(".")[1:])
            else:
                continue
            for alias in node.names:
                if _is_module(module + (alias.name,)):
                    yield module + (alias.name,), None, node.lineno
                else:
                    yield module, alias.name, node.lineno


@functools.cache
def violations() -> dict[Edge, list[str]]:
    """Every import that breaks the contract -> the places it occurs ("file:line")."""
    found: dict[Edge, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("").parts
        src = _unit(rel[:-1] if rel[-1] == "__init__" else rel)
        for module, name, line in _imports(path):
            dst = "base" if (not module and name in ROOT_BASE_NAMES) else _unit(module)
            if dst == src:
                continue
            for unit in (src, dst):
                assert unit in LAYER, (f"tilescope.{unit} is in no layer: give it one in LAYER (or BASE_MODULES, "
                                       f"for a helper that imports no other tilescope package) in tests/test_layers.py")
            kinds = []
            if LAYER[dst] > LAYER[src]:
                kinds.append("upward")
            inner = module[1:] + ((name,) if name else ())
            if dst not in ("base", "root") and any(p.startswith("_") and not p.startswith("__") for p in inner):
                kinds.append("private")
            for kind in kinds:
                edge = Edge(str(path.relative_to(SRC)), ".".join(module), kind)
                found.setdefault(edge, []).append(f"{edge.file}:{line}")
    return found


def _e(file: str, target: str, kind: str = "private") -> Edge:
    return Edge(file, target, kind)


# Today's exceptions. Each group: why it exists, and how to remove it.
ALLOWED: set[Edge] = {
    # the tile language writes a kernel's profile directory: move that to profiler (or nki's
    # runner) so simulate() returns the result and the caller writes it.
    _e("lang/_simulate.py", "profiler", "upward"),
}


def test_the_graph_is_read():
    # guards the walker itself: a few known edges, function-level ones included
    edges = {(e.file, e.target) for e in violations()}
    assert ("lang/_simulate.py", "profiler") in edges  # inside a function
    assert LAYER.keys() >= {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}


def test_the_walker_finds_private_and_upward_imports(tmp_path, monkeypatch):
    # a small tree of its own: a private import (module and name), an upward one inside a
    # function, and the imports the contract allows (public names, a package's internal module)
    root = tmp_path / "tilescope"
    for pkg, files in {
        "device": {"_runtime.py": "def now_ns(): return 0\n", "internal.py": "from ._runtime import now_ns\n"},
        "trace": {"_a.py": ("from ..device._runtime import now_ns\nfrom ..device import _runtime\n"
                            "from ..device.internal import now_ns as n\n\ndef f():\n    from ..explorer import x\n")},
        "explorer": {},
    }.items():
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
        for name, text in files.items():
            (root / pkg / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "SRC", root)
    violations.cache_clear()
    try:
        found = violations()
    finally:
        violations.cache_clear()
    assert set(found) == {Edge("trace/_a.py", "device._runtime", "private"), Edge("trace/_a.py", "explorer", "upward")}
    assert found[Edge("trace/_a.py", "device._runtime", "private")] == ["trace/_a.py:1", "trace/_a.py:2"]


def test_no_new_layer_violations():
    new = {e: where for e, where in violations().items() if e not in ALLOWED}
    assert not new, "imports that break the layer contract (tests/test_layers.py):\n" + "\n".join(
        f"  {e.kind}: {', '.join(where)} imports tilescope.{e.target}" for e, where in sorted(new.items()))


def test_allowlist_only_shrinks():
    gone = sorted(ALLOWED - violations().keys())
    assert not gone, "these imports are gone: delete their ALLOWED entries in tests/test_layers.py:\n" + "\n".join(
        f"  {e}" for e in gone)
