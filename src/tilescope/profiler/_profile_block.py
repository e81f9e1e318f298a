"""``tilescope.profile(...)``: the short way to profile a block of code.

>>> import torch, tilescope                                       # doctest: +SKIP
>>> with tilescope.profile("profile_out") as prof:                # doctest: +SKIP
...     y = model(x)
>>> print(prof.key_averages().table(sort_by="self_device_time_total"))  # doctest: +SKIP
>>> prof.profile_dir                                              # doctest: +SKIP
"""

from __future__ import annotations

import contextlib

import torch
from torch.profiler import ProfilerActivity

from ._config import ProfileConfig
from ._export import Profiler

__all__ = ["profile", "activities_for"]


@contextlib.contextmanager
def profile(output_dir="profile_out", *, device: str | None = None, config: ProfileConfig | None = None,
            record_shapes: bool = False, profile_memory: bool = False, with_stack: bool = False,
            synchronize: bool = True, **config_kwargs):
    """Profile the enclosed block into ``output_dir``.

    ``device`` is ``"sim"``, ``"cuda"`` or ``"cpu"`` (default: sim when the simulated device
    is registered, else cuda when available, else cpu). The block's end waits for the device
    (a ``tilescope::synchronize (profile exit)`` range); ``synchronize=False`` leaves that out,
    though torch's profiler still synchronises the device as it stops, as it does CUDA's.
    ``config`` (a ProfileConfig) or its keyword arguments, not both. The yielded torch profile
    gains a ``profile_dir`` attribute once the block exits, also when it exits by an exception.
    """
    if config is not None and (config_kwargs or output_dir != "profile_out"):
        given = sorted(config_kwargs) + (["output_dir"] if output_dir != "profile_out" else [])
        raise ValueError(f"profile(config=..., {', '.join(given)}=...): give the ProfileConfig or its arguments, "
                         f"not both (they would be ignored); put them in the config")
    cfg = config or ProfileConfig(output_dir=output_dir, **config_kwargs)
    device = device or _device_kind()
    activities = activities_for(device)
    exporter = Profiler(cfg)
    prof = None
    try:
        with torch.profiler.profile(activities=activities, experimental_config=cfg,
                                    on_trace_ready=exporter.export_trace, record_shapes=record_shapes,
                                    profile_memory=profile_memory, with_stack=with_stack) as prof:
            try:
                yield prof
            finally:
                if synchronize:
                    _synchronize(device)
    finally:  # also when the block raised: the profile of what ran was written
        exporter.close()  # the device's fast dispatch path is back (unless another profiler is open)
        if prof is not None:
            prof.profile_dir = exporter.path


DEVICES = ("sim", "cuda", "cpu")


def activities_for(device: str) -> list:
    """torch.profiler's activities for profiling ``device`` (the CPU's, and the device's own);
    registers the simulated device for ``"sim"``."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(map(repr, DEVICES))}, got {device!r}")
    if device == "sim":
        from ..device import register

        register()
        return [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])


def _device_kind() -> str:
    from ..device import is_registered

    if is_registered():
        return "sim"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


EXIT_SYNCHRONIZE = "tilescope::synchronize (profile exit)"  # the block's own wait, not one of its calls


def _synchronize(device: str) -> None:
    if device == "sim":
        from ..device import synchronize

        synchronize(label=EXIT_SYNCHRONIZE)
    elif device == "cuda":
        torch.cuda.synchronize()
