"""What tilescope's other packages use of the lowerings beyond their public API (:mod:`tilescope.lower`).

The fusion pass composes the eager lowering's op semantics (the elementwise and reduction
tables, the GEMM planner) instead of re-deriving them; the device converts tensors the way the
generic lowering does and defines the ``torch.ops.tilescope`` operators. Neighbours import these
from here, never from lower's private modules. No stability promise.
"""

from __future__ import annotations

from . import _reduce as reductions
from ._custom_ops import define as define_custom_ops
from ._elementwise import _MAX_FREE as ELEMENTWISE_MAX_FREE
from ._elementwise import OPS, EngineLoad, TileOps, _Decline as Decline, balanced_copy
from ._gemm import Gemm
from ._generic import _to_numpy as to_numpy, _to_torch as to_torch
from ._reduce import REDUCTIONS

__all__ = [
    "OPS", "REDUCTIONS", "reductions", "EngineLoad", "TileOps", "Decline", "balanced_copy", "ELEMENTWISE_MAX_FREE",
    "Gemm", "to_numpy", "to_torch", "define_custom_ops",
]
