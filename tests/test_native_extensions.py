"""Every optional C extension that pyproject.toml declares is built and importable.

The extensions are ``optional = true`` so that an install without a C compiler still works (each
has a Python path that gives the same results). CI must not pass that way though: ``.ci/run`` sets
``TILESCOPE_REQUIRE_NATIVE=1``, under which a missing extension fails here, and every test that
would skip because an extension "is not built" fails instead (tests/conftest.py).
"""

from __future__ import annotations

import importlib
import os
import tomllib
from pathlib import Path

import pytest

REQUIRE = os.environ.get("TILESCOPE_REQUIRE_NATIVE") == "1"
_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
EXTENSIONS = [ext["name"] for ext in tomllib.loads(_PYPROJECT.read_text())["tool"]["setuptools"]["ext-modules"]]


def test_pyproject_declares_the_extensions():
    # the list below is read from pyproject: an empty list would make this file test nothing
    assert {"tilescope.trace._kscan", "tilescope.sim._loop"} <= set(EXTENSIONS)


@pytest.mark.parametrize("name", EXTENSIONS)
def test_extension_is_built(name):
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        msg = f"{name} is not built ({e}): run `make setup` with a C compiler"
        if REQUIRE:
            pytest.fail(msg)
        pytest.skip(msg)
    # an extension module, not a stray Python file of the same name
    assert Path(module.__file__).suffix in (".so", ".pyd"), module.__file__
