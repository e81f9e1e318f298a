"""What tilescope's other packages use of the tile language beyond its public API (:mod:`tilescope.lang`).

The NKI front end (:mod:`tilescope.nki`) is NKI's spelling of this language: it wraps the
kernel objects, the tracing context, the value types and the frame helpers that point errors
at the user's line. The device runs kernels launched on ``sim`` tensors, and ``bench`` recognises
kernel launches. They import these from here, never from lang's private modules. No stability
promise.
"""

from __future__ import annotations

from ._context import builtin, current, maybe_current
from ._core import _binary as binary_op, _reduction as reduction_op, _unary as unary_op
from ._frames import filter_traceback, locate, user_frame
from ._kernel import KERNELS, KernelLaunch, _grid as launch_grid, register_call_handler
from ._types import Memory
from ._values import TENSOR_METHODS_LACK, View

__all__ = [
    "builtin", "current", "maybe_current", "binary_op", "unary_op", "reduction_op", "filter_traceback", "locate",
    "user_frame", "KERNELS", "KernelLaunch", "launch_grid", "register_call_handler", "Memory", "TENSOR_METHODS_LACK", "View",
]
