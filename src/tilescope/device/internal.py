"""What tilescope's other packages use of the device beyond its public API (:mod:`tilescope.device`).

The profiler reads the runtime's records and clocks, the compiler and C++ operators submit
executions and take CPU views of device memory, the NKI front end asks which device type
tensors are on. These are the device's internal API: its neighbours import from here, never
from its private modules; users import from :mod:`tilescope.device`. No stability promise.
"""

from __future__ import annotations

from ._native_runtime import load as load_native_runtime
from ._runtime import (
    DeviceActivities, activity_name, core_end_ns, keep_recorded, submit, take_device_activities,
)
from ._worker import on_cancel

__all__ = [
    "DeviceActivities", "activity_name", "take_device_activities", "keep_recorded", "core_end_ns", "submit",
    "load_native_runtime", "on_cancel", "cpu_view", "device_type",
]


def cpu_view(t):
    """A CPU tensor over the same memory as the ``sim`` tensor ``t`` (zero-copy)."""
    from . import _dispatch

    return _dispatch._rt.cpu_view(t)


def device_type() -> str:
    """The torch device type ``sim`` tensors report (``"privateuseone"`` until registered)."""
    from . import _dispatch

    return _dispatch._DEVICE_TYPE
