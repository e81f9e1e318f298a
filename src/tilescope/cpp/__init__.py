"""GpSimd-style C++ custom operators: write a kernel in C++, call it as ``torch.ops.<lib>.<op>``.

A kernel runs on the GpSimd engine's cores (8 on NeuronCore-v2), reads and writes tensors
through TCM accessors into a small scratch pool per core (16 KB), and splits work by
``get_cpu_id()`` / ``get_cpu_count()``. tilescope builds it with the machine's compiler,
runs it once per core on the host with every memory access checked, verifies that the
cores together wrote each output element exactly once, and models its device time.

    >>> import torch, tilescope.cpp as cpp                                  # doctest: +SKIP
    >>> lib = cpp.load("giou", compute_srcs=["giou.cpp"], shape_srcs=["giou_shape.cpp"],
    ...                multicore=True)                                      # doctest: +SKIP
    >>> out = torch.ops.giou_ops.giou(boxes1, boxes2, 1e-7)                 # doctest: +SKIP
    >>> print(lib["giou"].estimate(boxes1, boxes2, 1e-7).text())            # doctest: +SKIP

The header is ``tilescope/gpsimd.h`` (:func:`include_dir`); the runnable example is
``examples/giou/``, and the full guide ``docs/cpp-operators.md``.

Where the port differs from the real toolchain's C++ API (Neuron custom operators) and why:

===================================  ====================================  ===========================================
real toolchain                       tilescope                             why
===================================  ====================================  ===========================================
``#include <torch/torch.h>``,        ``#include <tilescope/gpsimd.h>``     no PyTorch headers: a cold build takes ~1 s
``neuron/neuron-utils.hpp``          (namespace ``tilescope``)             instead of tens of seconds, and the ABI
                                                                           does not depend on the torch build
``t.tcm_accessor()``                 ``tcm_accessor(t)``                   a ``torch::Tensor`` cannot gain member
                                                                           functions; a free function keeps the same
                                                                           read-only (const) / writable split
``torch::neuron::tcm_malloc``        ``tilescope::tcm_malloc``             same pool (16 KB per core); exhaustion
returns ``nullptr`` on failure       raises, naming the request, what is   throws instead of returning null: a null
                                     in use and what is free               check that is forgotten silently produces
                                                                           zeros (a common complaint about samples)
``m.def(name, &shape, "kernel")``    ``m.def(name, &shape, &kernel)``      C++ cannot look a function up by name
(kernel by name)                                                           portably; a pointer lets the compiler check
                                                                           that both take the same arguments
``NEURON_LIBRARY(lib, m)``           ``TILESCOPE_LIBRARY(lib, m)``         same role; several libraries per build are
one library, 10 ops per model        any number                            allowed
shape function returns               returns ``empty(sizes, dtype)``       the shape function never touches data;
``torch::zeros(sizes, kFloat)``      (``zeros`` is an alias)               ``empty`` says so
``torch::Tensor`` arguments,         ``tilescope::Tensor``, ``double``,    ``torch::Scalar`` has no meaning without
``Scalar``, ``double``, ``int64_t``  ``int64_t``, ``bool``                 torch; use ``double`` or ``int64_t``
dtypes incl. ``kLong``               float32, bfloat16, float16, int32,    the simulated device has no 64-bit types
                                     int16, int8, uint8, bool
standard ``accessor<T,N>()`` and     TCM accessors only                    multicore mode requires them on the device;
streaming accessors                                                        each copy is a DMA transfer in the model
tensor library ops (``exp_out``...)  not provided                          compute in plain C++ on TCM buffers
undefined behaviour on bad access    every access checked, errors name     the point of a simulator
                                     the values and your source line
``printf`` via runtime log env vars  ``printf`` to the host's stdout       no device log queue to configure
===================================  ====================================  ===========================================
"""

from __future__ import annotations

import os
from pathlib import Path

from ._build import BuildResult, build, include_dir
from ._errors import CompileError, CoverageError, CppError, CppKernelError, TcmLeakWarning
from ._cost_model import CoreEstimate, CostModel
from ._library import CppLibrary, CppOp, Estimate
from ._abi import NativeLibrary
from ..spec import preset as _preset

__all__ = [
    "load", "load_library", "include_dir", "CppLibrary", "CppOp", "Estimate", "CostModel", "CoreEstimate",
    "CppError", "CompileError", "CppKernelError", "CoverageError", "TcmLeakWarning", "BuildResult",
]


def load(name: str, compute_srcs, shape_srcs, build_directory: str | os.PathLike | None = None,
         multicore: bool = False, verbose: bool = False, *, extra_cflags: list[str] | None = None,
         check: str = "raise", cost_model: CostModel | None = None, preset=None,
         timeout_s: float | None = 60.0) -> CppLibrary:
    """Build (or reuse) ``lib<name>.so`` from the sources and register its operators.

    Args:
        name: library file name (``lib<name>.so``); the operators' namespace comes from
            ``TILESCOPE_LIBRARY(<lib>, m)`` in the sources.
        compute_srcs: kernel sources (C++ files including ``<tilescope/gpsimd.h>``).
        shape_srcs: shape-function sources with the ``TILESCOPE_LIBRARY`` block.
        build_directory: where objects and the library go; default
            ``$TILESCOPE_CACHE_DIR/cpp/<name>`` (``~/.cache/tilescope/cpp/<name>``).
            Unchanged sources are never recompiled.
        multicore: run each kernel on all GpSimd cores (8), else on one.
        verbose: print compiler commands and warnings.
        extra_cflags: more compiler flags (e.g. ``["-DSTACK_SIZE=20000"]``).
        check: the output-coverage check: ``"raise"`` (default), ``"warn"`` or ``"off"``.
        cost_model: how calls become modeled time (:class:`CostModel`).
        preset: hardware preset for core count and TCM pool size (default: the default preset).
        timeout_s: a call whose kernel runs longer is stopped with a ``CppKernelError`` naming
            the line it was at (an infinite loop); None: no limit. Ctrl-C stops it too.

    Returns the :class:`CppLibrary`; its operators are also ``torch.ops.<lib>.<op>``. The
    library records the mode it was built for (``multicore``), which :func:`load_library`
    uses. A kernel that faults (null pointer, stack overflow, division by zero, abort) raises
    ``CppKernelError`` naming the core and its source line; the Python session goes on.
    """
    if isinstance(compute_srcs, (str, os.PathLike)):
        compute_srcs = [compute_srcs]
    if isinstance(shape_srcs, (str, os.PathLike)):
        shape_srcs = [shape_srcs]
    sources = list(compute_srcs) + [s for s in shape_srcs if s not in list(compute_srcs)]
    spec = _preset(preset)
    cores = spec.gpsimd_cores if multicore else 1
    result = build(name, sources, build_directory, extra_cflags=extra_cflags, verbose=verbose, cores=cores)
    if verbose:
        state = "cached" if result.cached else f"compiled {', '.join(result.compiled) or 'nothing'}"
        print(f"lib{name}: {result.path} ({state}, {result.seconds:.2f} s)")
    shown = {str(Path(s).resolve()): str(s) for s in sources}
    return load_library(result.path, multicore=multicore, check=check, cost_model=cost_model, preset=preset,
                        timeout_s=timeout_s, _sources=shown, _build=result)


def load_library(path: str | os.PathLike, multicore: bool | None = None, *, check: str = "raise",
                 cost_model: CostModel | None = None, preset=None, timeout_s: float | None = 60.0,
                 _sources=None, _build=None) -> CppLibrary:
    """Load a library built earlier by :func:`load` (in any process) and register its operators.

    ``multicore``: None (default) runs the kernels in the mode the library was built for
    (``load(..., multicore=...)``); True or False overrides it.
    """
    native = NativeLibrary(path)
    if multicore is None:
        built = native.built_cores
        multicore = bool(built and built > 1)
    if not native.ops:
        raise CppError(
            f"{path} defines no operators: add a TILESCOPE_LIBRARY(my_ops, m) {{ m.def(\"op\", &op_shape, "
            f"&op_kernel); }} block to a shape source"
        )
    lib = CppLibrary(native, multicore=multicore, check=check, cost_model=cost_model, sources=_sources,
                     spec=preset, build=_build, timeout_s=timeout_s)
    return lib.register()
