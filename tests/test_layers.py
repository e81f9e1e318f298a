"""The layer contract: which package may import which, checked over the whole import graph.

Packages form layers, each importing only from its own layer and those below it::

    base (errors, dtypes, _env, _lru, _console) -> spec, isa -> program -> sim -> lang, lower
        -> device, compile, cpp -> profiler -> trace -> explorer -> nki, studies, bench, cli

And a package's private modules and names (a leading underscore) are its own: a neighbour
imports what the package's ``__init__`` exports. Every ``import`` statement counts, those inside
functions too (they hide cycles from Python, not from readers).

``ALLOWED`` lists today's exceptions. It may only shrink: a new violation fails, and so does an
entry whose import is gone (delete the entry). Each entry says why it exists and how to remove it.
"""

from __future__ import annotations

import ast
import functools
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
    # isa's kernel calls forward to the tile language at call time (isa sits below lang). Remove by
    # inverting it: lang registers its implementation with isa on import (isa._kernel_api.bind).
    _e("isa/_kernel_api.py", "lang._isa", "upward"), _e("isa/_kernel_api.py", "lang._isa"),
    # the tile language writes a kernel's profile directory: move that to profiler (or nki's
    # runner) so simulate() returns the result and the caller writes it.
    _e("lang/_simulate.py", "profiler", "upward"),
    # lower/kernels.py decorates with `tilescope.kernel` (the root's lazy alias of lang.kernel):
    # spell it `tl.kernel`.
    _e("lower/kernels.py", "", "upward"),
    # the tile language's loop tracing reads instruction fields and operands: import them from
    # isa / program (both export them now).
    _e("lang/_loops.py", "isa._instructions"), _e("lang/_loops.py", "program._instruction_columns"),
    # the builder reads instruction fields: `from ..isa import field_access` (exported now).
    _e("program/_builder.py", "isa._instructions"),
    # lower's elementwise rows build access patterns with the builder's helpers: export
    # as_ap (already public) from program and make _scalar a public helper there.
    _e("lower/_elementwise.py", "program._builder"),
    # the fusion pass (compile) reuses the eager lowering's elementwise and reduction tables and
    # its GEMM planner: export them from lower's __init__ as the op-semantics API.
    _e("compile/_emit.py", "lower._elementwise"), _e("compile/_emit.py", "lower._reduce"),
    _e("compile/_fusion_table.py", "lower._elementwise"), _e("compile/_fusion_table.py", "lower._reduce"),
    _e("compile/_matmul_segment.py", "lower._gemm"),
    # compile runs its Programs through the device's runtime: a device-side launch API
    # (device/__init__) for compiled graphs.
    _e("compile/_fused_launch.py", "device._native_runtime"), _e("compile/_fused_launch.py", "device._runtime"),
    # C++ operators launch through the device's dispatcher, launch path and worker: same launch API.
    _e("cpp/_sim_kernel.py", "device._dispatch"), _e("cpp/_sim_kernel.py", "device._launch"),
    _e("cpp/_sim_kernel.py", "device._worker"),
    # the device's kernel bridge and fused built-ins use lang's kernel objects and lower's tables
    # and tensor conversions: export KernelLaunch/KERNELS/register_call_handler from lang, the
    # conversions and the op table from lower.
    _e("device/_kernels.py", "lang._frames"), _e("device/_kernels.py", "lang._kernel"),
    _e("device/_kernels.py", "lower._generic"), _e("device/_launch.py", "lower._generic"),
    _e("device/_composite_ops.py", "lower._custom_ops"),
    # the profiler reads the device runtime's executions and activities: a small recording API in
    # device/__init__ (executions, activities, registration state).
    _e("profiler/_capture.py", "device._runtime"), _e("profiler/_correlate.py", "device._runtime"),
    _e("profiler/_events.py", "device._runtime"), _e("profiler/_export.py", "device._registration"),
    _e("profiler/_export.py", "device._runtime"), _e("profiler/_profile_block.py", "device._registration"),
    _e("profiler/_profile_block.py", "device._runtime"),
    # trace reads profile directories with the profiler's reader and its generic-share limit:
    # export read_profile / profiles_inside / GENERIC_SHARE_LIMIT from profiler.
    _e("trace/_profile.py", "profiler._reader"), _e("trace/_trace.py", "profiler._reader"),
    _e("trace/_report.py", "profiler._lowering_stats"),
    # the explorer reuses trace's labels, arrow tables and HTA analyses, and the share limit:
    # export them from trace / profiler.
    _e("explorer/_engine.py", "trace._trace"), _e("explorer/_session.py", "trace._labels"),
    _e("explorer/_insights.py", "trace._report"), _e("explorer/_insights.py", "profiler._lowering_stats"),
    # nki is NKI's spelling of the tile language: it wraps lang's kernel, context, types and
    # frames. Export what it needs from lang (an internal API in lang/__init__).
    _e("nki/_jit.py", "device._dispatch"), _e("nki/_jit.py", "lang._context"), _e("nki/_jit.py", "lang._frames"),
    _e("nki/_jit.py", "lang._kernel"), _e("nki/_jit.py", "lang._simulate"), _e("nki/_names.py", "lang._frames"),
    _e("nki/_names.py", "lang._values"), _e("nki/_run_file.py", "lang._frames"),
    _e("nki/compiler.py", "lang._types"), _e("nki/isa.py", "lang._context"), _e("nki/isa.py", "lang._values"),
    _e("nki/language.py", "lang._context"), _e("nki/language.py", "lang._core"), _e("nki/language.py", "lang._types"),
    _e("nki/typing.py", "lang._kernel"),
    # the CLI collects each package's sub-commands from its _cli module: export `register_cli`
    # from profiler, trace, explorer and nki.
    _e("cli.py", "profiler._profile_cli"), _e("cli.py", "trace._analysis_cli"), _e("cli.py", "explorer._explore_cli"),
    _e("cli.py", "nki._nki_cli"),
    # TILESCOPE_PROFILE=1 starts the profiler on import: export start_from_env from profiler.
    _e("__init__.py", "profiler._auto"),
    # bench recognises kernel launches and reads the device clock: export KernelLaunch from lang
    # and the clock readers (now_ns, core_end_ns) from device.
    _e("bench.py", "lang._kernel"), _e("bench.py", "device._runtime"),
}


def test_the_graph_is_read():
    # guards the walker itself: a few known edges, function-level ones included
    edges = {(e.file, e.target) for e in violations()}
    assert ("profiler/_capture.py", "device._runtime") in edges  # inside a function
    assert ("isa/_kernel_api.py", "lang._isa") in edges
    assert LAYER.keys() >= {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}


def test_no_new_layer_violations():
    new = {e: where for e, where in violations().items() if e not in ALLOWED}
    assert not new, "imports that break the layer contract (tests/test_layers.py):\n" + "\n".join(
        f"  {e.kind}: {', '.join(where)} imports tilescope.{e.target}" for e, where in sorted(new.items()))


def test_allowlist_only_shrinks():
    gone = sorted(ALLOWED - violations().keys())
    assert not gone, "these imports are gone: delete their ALLOWED entries in tests/test_layers.py:\n" + "\n".join(
        f"  {e}" for e in gone)
