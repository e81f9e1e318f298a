"""The docstring examples of the public modules run and stay true."""

import doctest
import importlib

import pytest

MODULES = [
    "tilescope.dtypes",
    "tilescope._lru",
    "tilescope.spec",
    "tilescope.spec._model",
    "tilescope.isa._ap",
    "tilescope.isa._cost",
    "tilescope.program._builder",
    "tilescope.sim",
    "tilescope.profiler._format",
    "tilescope.profiler._reader",
    "tilescope.profiler._doctor",
    "tilescope.profiler._events",
    "tilescope.profiler._kineto",
    "tilescope.compile._explain",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert tried > 0, f"{name} has no examples"
    assert failures == 0
