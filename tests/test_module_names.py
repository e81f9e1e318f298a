"""Every module's file name says its job: no two modules under src/tilescope share one.

Five ``_ops.py`` (ALU tables, custom ops, the fuser's op table, C++ registration, the analysis op
table) made "open _ops.py" mean nothing and every traceback ambiguous. A module here is a Python
file or a C extension's source (its built module has the same name); package ``__init__.py`` files
are exempt. Two files may share a name only when they do the same kind of job in parallel
packages (say, each preset of a family), listed in ``SAME_JOB`` with the reason.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tilescope"

# file name -> why the modules of that name do the same kind of job
SAME_JOB: dict[str, str] = {
    "internal": "each package's internal API: what its neighbours may import from it (tests/test_layers.py)",
}


def modules_by_name() -> dict[str, list[str]]:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in sorted(SRC.rglob("*")):
        if path.suffix not in (".py", ".c") or path.name == "__init__.py":
            continue
        if not (path.parent / "__init__.py").exists():  # C++ runtimes, static assets: not Python modules
            continue
        by_name[path.stem].append(path.relative_to(SRC).as_posix())
    return by_name


def test_the_walk_finds_modules_and_extensions():
    names = modules_by_name()
    assert "program/_builder.py" in names["_builder"] and "trace/_kscan.c" in names["_kscan"]
    assert "__init__" not in names


def test_no_two_modules_share_a_file_name():
    shared = {name: paths for name, paths in modules_by_name().items() if len(paths) > 1 and name not in SAME_JOB}
    assert not shared, ("modules that share a file name: name each for its job (git mv, then update its importers, "
                        "tests/test_layers.py and tests/lint_baseline.json), or, for the same kind of job, list it "
                        "in SAME_JOB with why:\n" + "\n".join(f"  {n}: {', '.join(p)}" for n, p in sorted(shared.items())))


def test_same_job_entries_are_still_shared():
    names = modules_by_name()
    stale = [n for n in SAME_JOB if len(names.get(n, [])) < 2]
    assert not stale, f"SAME_JOB entries no longer shared by two modules: delete them: {stale}"
