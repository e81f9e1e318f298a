"""The docstring examples of the modules run and stay true (one list for the whole package)."""

import doctest
import importlib
import importlib.util
import pathlib

import pytest

MODULES = [
    # core, profiler, compile
    "tilescope.dtypes",
    "tilescope._env",
    "tilescope._lru",
    "tilescope._console",
    "tilescope.trace._nesting",
    "tilescope.trace._native_ingest",
    "tilescope.trace._rawcols",
    "tilescope.spec",
    "tilescope.spec._model",
    "tilescope.isa._ap",
    "tilescope.isa._cost",
    "tilescope.program._builder",
    "tilescope.program._dump",
    "tilescope.sim",
    "tilescope.profiler._profile_writer",
    "tilescope.profiler._itrace",
    "tilescope.profiler._reader",
    "tilescope.profiler._doctor",
    "tilescope.profiler._events",
    "tilescope.profiler._kineto",
    "tilescope.profiler._auto",
    "tilescope.compile._explain",
    # device and lowerings
    "tilescope.device",
    "tilescope.device._settings",
    "tilescope.device._runtime",
    "tilescope.device._module",
    "tilescope.device._launch",
    "tilescope.device._kernels",
    "tilescope.device._rnn",
    "tilescope.lower",
    "tilescope.lower._call",
    "tilescope.lower._layout",
    "tilescope.lower._custom_ops",
    "tilescope.lower._conv",
    "tilescope.lower._conv_patch",
    "tilescope.lower._norm",
    "tilescope.lower._pool",
    "tilescope.lower.kernels",
    "tilescope.lower._indirect",
    "tilescope.lower._vocab",
    # tile language
    "tilescope.lang",
    "tilescope.lang._simulate",
    "tilescope.lang._kernel",
    "tilescope.lang._index_expr",
    "tilescope.lang._types",
    "tilescope.lang._analysis",
    "tilescope.bench",
    # NKI surface
    "tilescope.nki.language",
    "tilescope.nki.isa",
    "tilescope.nki.typing",
    "tilescope.nki._run_file",
    # C++ operators
    "tilescope.cpp._coverage",
    "tilescope.cpp._build",
    # analysis engine
    "tilescope.trace._jsonscan",
    "tilescope.trace._labels",
    "tilescope.trace._devices",
    "tilescope.trace._store",
    "tilescope.cpp._errors",
    "tilescope.cpp._execute",
    "tilescope.cpp._where",
    "tilescope.cpp._params",
    "tilescope.trace._parquet",
    "tilescope.trace._roofline",
    "tilescope.trace._report",
    # explorer and studies
    "tilescope.explorer._timeaxis",
    "tilescope.studies.rmsnorm",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert tried > 0, f"{name} has no examples"
    assert failures == 0


BENCHMARKS = ["profiler_overhead"]  # benchmark scripts whose helpers carry examples


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_docstring_examples(name):
    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # (a script: its main() runs only under __main__)
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert tried > 0, f"benchmarks/{name}.py has no examples"
    assert failures == 0
