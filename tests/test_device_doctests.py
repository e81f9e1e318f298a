"""The docstring examples of the device and lowering modules run and stay true."""

import doctest
import importlib

import pytest

MODULES = [
    "tilescope.device",
    "tilescope.device._config",
    "tilescope.device._module",
    "tilescope.device._launch",
    "tilescope.device._kernels",
    "tilescope.lower",
    "tilescope.lower._call",
    "tilescope.lower._layout",
    "tilescope.lower._ops",
    "tilescope.lower.kernels",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert tried > 0, f"{name} has no examples"
    assert failures == 0
