"""The ``sim`` device kernel of C++ operators: one device execution on GpSimd per call.

Registered for the PrivateUse1 key when the simulated device (:mod:`tilescope.device`)
provides its custom-op hook; until then C++ operators run on CPU tensors only.
"""

from __future__ import annotations

__all__ = ["register_device_kernel"]


def register_device_kernel(tlib, op) -> bool:
    """Register ``op`` for the ``sim`` device on ``tlib``; False when the device has no hook yet."""
    return False
