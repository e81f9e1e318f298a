"""The tile kernel language (NKI-style), imported as ``import tilescope.lang as tl``.

A kernel loads tiles from HBM into SBUF, computes on the engines, and stores
results back. Tiles are at least 1-D with the partition dimension first
(<= 128); loops over tiles are Python loops, unrolled when the kernel is traced
into a Program. ``tilescope.simulate`` returns the values *and* the modeled
per-engine timeline.

>>> import numpy as np, tilescope
>>> import tilescope.lang as tl
>>> @tilescope.kernel
... def rowmax(x):
...     out = tl.ndarray((x.shape[0], 1), x.dtype, buffer=tl.hbm)
...     i_p, i_f = tl.mgrid[0:128, 0:x.shape[1]]
...     for i in tl.affine_range(x.shape[0] // 128):
...         t = tl.load(x[i * 128 + i_p, i_f])
...         tl.store(out[i * 128:(i + 1) * 128, :], tl.max(t, axis=1, keepdims=True))
...     return out
>>> x = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
>>> r = tilescope.simulate(rowmax, x)
>>> bool((r.value[:, 0] == x.max(axis=1)).all()), r.summary.bound_by
(True, 'DMA')

Layers: builtins (:mod:`._core`, this namespace) -> semantics and checks
(:mod:`._semantic`) -> instructions through the one TileBuilder. Kernels written
for AWS's NKI port by renaming imports (``nl`` -> ``tilescope.lang``,
``nisa`` -> ``tilescope.isa``) and using ``@tilescope.kernel``.
"""

from ._core import (
    abs, add, affine_range, broadcast_to, copy, cos, device_print, divide, ds, empty_like, equal, erf,
    exp, full, gelu, gelu_tanh, greater, greater_equal, less, less_equal, load, log, logical_and,
    logical_or, logical_xor, matmul, max, maximum, mean, min, minimum, multiply, ndarray, negative,
    load_transpose2d, not_equal, num_programs, ones, power, program_id, reciprocal, relu, rsqrt,
    sequential_range, shared_constant, shared_identity_matrix, sigmoid, sign, silu, sin, softplus, sqrt,
    square, static_range, store, subtract, sum, tanh, transpose, var, where, zeros, zeros_like,
)
from ._index_expr import IndexExpr, arange, mgrid
from ._kernel import Kernel, TensorSpec, Traced, kernel
from ._simulate import KernelResult, simulate
from ._types import (
    bfloat16, bool_, float8_e4m3, float16, float32, hbm, int8, int16, int32, par_dim,
    private_hbm, psum, sbuf, shared_hbm, tile_size, uint8,
)
from ._values import Tensor, Tile

from ..isa.internal import bind_kernel_language as _bind
from . import _isa

_bind(_isa)  # tilescope.isa's kernel calls forward to the language (isa sits below lang)
del _bind

__all__ = [
    # kernels and running them
    "kernel", "simulate", "Kernel", "KernelResult", "Traced", "TensorSpec", "Tensor", "Tile", "IndexExpr",
    # memories, dtypes, sizes
    "sbuf", "psum", "hbm", "shared_hbm", "private_hbm", "par_dim", "tile_size",
    "float32", "bfloat16", "float16", "float8_e4m3", "int32", "int16", "int8", "uint8", "bool_",
    # indices, loops, launch grids
    "arange", "mgrid", "affine_range", "sequential_range", "static_range", "program_id", "num_programs",
    # buffers and data movement
    "load", "store", "ndarray", "zeros", "ones", "full", "zeros_like", "empty_like", "copy",
    "broadcast_to", "ds", "load_transpose2d", "shared_constant", "shared_identity_matrix",
    # elementwise (VectorE)
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "negative", "abs",
    "reciprocal", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "logical_and", "logical_or", "logical_xor", "where",
    # activation functions (ScalarE)
    "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu",
    "softplus", "erf", "square", "sin", "cos", "sign",
    # reductions, TensorE, printing
    "sum", "max", "min", "mean", "var", "matmul", "transpose", "device_print",
]
