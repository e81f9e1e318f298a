"""NKI on tilescope: kernels written for AWS's NKI run here, with a modeled timeline.

``tilescope.nki`` is NKI's surface -- ``language``, ``isa``, ``typing``, ``compiler``,
``jit``, ``baremetal``, ``simulate_kernel``, ``simulate``, ``benchmark``, ``profile`` --
for both the ``neuronxcc.nki`` API (tiles returned, ``mask=``) and the current ``nki``
API (``dst=`` forms). A kernel file runs with only its import lines changed::

    import tilescope.nki as nki                # was: from neuronxcc import nki / import nki
    import tilescope.nki.language as nl        # was: neuronxcc.nki.language / nki.language
    import tilescope.nki.isa as nisa

or unchanged, with ``tilescope nki run FILE.py`` (:func:`run_file`), which maps those
imports for the run only and writes a profile of every launch. What runs and what
differs from hardware NKI: ``docs/nki.md``.
"""

from . import compiler, isa, language, typing
from ._jit import (
    BenchmarkResult, Launch, NkiKernel, baremetal, benchmark, jit, profile, recording, simulate,
    simulate_kernel,
)
from ._run_file import NkiRun, nki_imports, run_file
from .typing import tensor

kernel = jit  # ``tilescope.nki.kernel``: the decorator, by its other name
Kernel = NkiKernel

__all__ = [
    "language", "isa", "typing", "compiler", "jit", "kernel", "Kernel", "NkiKernel", "baremetal",
    "simulate_kernel", "simulate", "benchmark", "profile", "tensor", "run_file", "NkiRun", "Launch",
    "BenchmarkResult", "recording", "nki_imports",
]
