"""ruff (pyflakes, bugbear, McCabe complexity) over src/, mypy over the core packages and lang.

Both are held to ``tests/lint_baseline.json``: per file, per rule, the number of findings today.
A count above its baseline (or a finding in a file or rule the baseline has no entry for) fails;
the baseline only goes down: after fixing findings, lower it with

    python tests/test_lint.py --update

(which lowers counts and drops zeros, never raises or adds one). A finding that is to stay (a
reviewed exception, or code landed beside the baseline's recording) is taken in deliberately with
``python tests/test_lint.py --accept`` (raises counts to what is found; review the diff). The core packages (spec, isa,
program, sim) are pyflakes-, bugbear- and mypy-clean: only complexity (C901) may stand in their
baseline; the tile language (lang) is mypy-clean too. The rules and tool versions are in pyproject.toml ([tool.ruff], [tool.mypy], the test extra).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASELINE = Path(__file__).with_name("lint_baseline.json")
CORE = ("spec", "isa", "program", "sim")
TYPED = CORE + ("lang",)  # mypy runs over these, and none may carry a mypy finding
_MYPY_LINE = re.compile(r"^(?P<path>[^:]+):\d+: error: .*\[(?P<code>[\w-]+)\]$")


def ruff_counts() -> dict[str, dict[str, int]]:
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "src", "--output-format", "json", "--exit-zero"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    counts: Counter = Counter()
    for finding in json.loads(out):
        counts[Path(finding["filename"]).resolve().relative_to(ROOT / "src").as_posix(), finding["code"]] += 1
    return _nest(counts)


def mypy_counts() -> dict[str, dict[str, int]]:
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    packages = [arg for p in TYPED for arg in ("-p", f"tilescope.{p}")]
    with tempfile.TemporaryDirectory() as cache:
        # run in src/ so this tree's tilescope is the one checked, with pyproject's [tool.mypy]
        proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                               "--cache-dir", cache, "--no-error-summary", "--no-pretty", *packages],
                              cwd=ROOT / "src", capture_output=True, text=True, env={**os.environ, "MYPYPATH": ""})
    if proc.returncode not in (0, 1):  # 2: mypy itself failed (bad config, crash)
        raise RuntimeError(f"mypy failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    counts: Counter = Counter()
    for line in proc.stdout.splitlines():
        m = _MYPY_LINE.match(line)
        if m:
            counts[m["path"], m["code"]] += 1
    return _nest(counts)


def _nest(counts: Counter) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (path, code), n in sorted(counts.items()):
        out.setdefault(path, {})[code] = n
    return out


def _compare(tool: str, found: dict, baseline: dict) -> None:
    over = [f"  {path} {code}: {n} (baseline {baseline.get(path, {}).get(code, 0)})"
            for path, codes in found.items() for code, n in codes.items()
            if n > baseline.get(path, {}).get(code, 0)]
    assert not over, (f"new {tool} findings (run `{tool}` on these files; fix them, the baseline only goes "
                      "down):\n" + "\n".join(over))
    under = [f"{path} {code}" for path, codes in baseline.items() for code, n in codes.items()
             if found.get(path, {}).get(code, 0) < n]
    if under:
        warnings.warn(f"{tool} findings fixed: lower the baseline with `python tests/test_lint.py --update` "
                      f"({', '.join(under)})", stacklevel=2)


def _baseline() -> dict:
    return json.loads(BASELINE.read_text())


def test_core_packages_are_clean_but_for_complexity():
    for path, codes in _baseline()["ruff"].items():
        if path.split("/")[1] in CORE:
            assert set(codes) <= {"C901"}, f"{path}: the core packages may not carry {set(codes) - {'C901'}}"
    typed = [path for path in _baseline()["mypy"] if path.split("/")[1] in TYPED]
    assert not typed, f"the core packages and lang are mypy-clean; these may not carry mypy findings: {typed}"


def test_ruff_at_or_below_its_baseline():
    _compare("ruff", ruff_counts(), _baseline()["ruff"])


@pytest.mark.slow
def test_mypy_at_or_below_its_baseline():
    _compare("mypy", mypy_counts(), _baseline()["mypy"])


def test_no_literal_preset_fallback():
    # a profile's preset comes from the profile, else from the spec (preset(None): $TILESCOPE_PRESET
    # or spec.DEFAULT_PRESET), never from a name written into the code as a fallback
    literal = re.compile(r"""\bor\s+["']trn\w*["']""")
    found = [f"{path.relative_to(ROOT)}:{i}" for path in sorted((ROOT / "src").rglob("*.py"))
             for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if literal.search(line)]
    assert not found, "literal preset fallbacks (use preset(name) with name None for the default): " + ", ".join(found)


def _lowered(old: dict, found: dict) -> dict:
    out: dict = {}
    for path, codes in old.items():
        for code, n in codes.items():
            m = min(n, found.get(path, {}).get(code, 0))
            if m:
                out.setdefault(path, {})[code] = m
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        old = _baseline()
        BASELINE.write_text(json.dumps({"ruff": _lowered(old["ruff"], ruff_counts()),
                                        "mypy": _lowered(old["mypy"], mypy_counts())}, indent=1, sort_keys=True) + "\n")
        print(f"lowered {BASELINE}")
    elif sys.argv[1:] == ["--accept"]:  # takes in every finding there is now: review the diff
        BASELINE.write_text(json.dumps({"ruff": ruff_counts(), "mypy": mypy_counts()}, indent=1, sort_keys=True) + "\n")
        print(f"recorded {BASELINE}: review `git diff {BASELINE.name}`")
    else:
        sys.exit("usage: python tests/test_lint.py --update | --accept")
