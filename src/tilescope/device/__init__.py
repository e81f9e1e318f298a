"""The simulated device inside PyTorch.

>>> import torch, tilescope.device
>>> tilescope.device.register()
'sim'
>>> x = torch.ones(4, 4, device="sim")
>>> (x * 2 + 1).sum().item()
48.0
"""

from __future__ import annotations

from ._settings import Settings, configure, settings
from ._launch import launch
from ._registration import device_name, is_registered, register
from ._runtime import Execution, now_ns, recording, reset_clocks, subscribe, synchronize, unsubscribe
from ._worker import DeviceExecutionError

__all__ = [
    "register", "is_registered", "device_name", "configure", "settings", "Settings",
    "Execution", "subscribe", "unsubscribe", "recording", "synchronize", "now_ns", "reset_clocks",
    "launch", "DeviceExecutionError",
]
