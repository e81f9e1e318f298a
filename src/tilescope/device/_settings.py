"""The device's settings: one frozen, validated dataclass and ``configure``.

>>> from tilescope.device import configure, settings
>>> _ = configure(clock="virtual")
>>> settings().clock
'virtual'
>>> _ = configure(clock="wall")
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from .._env import count, flag
from ..spec import CoreSpec, preset

__all__ = ["Settings", "settings", "configure"]

_CLOCKS = ("wall", "virtual")


@dataclass(frozen=True)
class Settings:
    """How the simulated device behaves.

    Attributes:
        preset: the hardware preset every core models (``$TILESCOPE_PRESET``, default trn1).
        clock: ``"wall"`` places executions at real host submit times and makes
            ``synchronize`` wait for modeled time; ``"virtual"`` models host dispatch cost
            too (the preset's assumed ``host_dispatch_us``) and never sleeps, so runs are
            deterministic.
        numerics: compute values (on the device worker). ``False`` skips them for
            performance-only studies: wall time then follows the model exactly, and
            tensor contents are undefined.
        blocking: wait for each execution's numerics before returning (like
            ``CUDA_LAUNCH_BLOCKING=1``), so errors surface at the call that caused them.
            ``$TILESCOPE_LAUNCH_BLOCKING=1`` sets it.
        gil_switch_interval_s: the interpreter's thread switch interval while the device
            is registered. The default 5 ms lets a busy host thread hold the GIL so long
            that the worker lags far behind; 0.5 ms keeps it close. ``None`` leaves it alone.
        worker_threads: intra-op (OpenMP) threads the worker's CPU kernels use; the
            default leaves one CPU core to the host thread, so big numerics do not slow
            dispatch down (``$TILESCOPE_WORKER_THREADS``). Applied when the worker starts.
        fast_dispatch: repeat calls of a signature the device has run before take the native
            fast path (no interpreter: outputs, execution, numerics queued in C++), except
            while a listener or a profiler watches each execution. ``False`` sends every call
            through the Python handler (``$TILESCOPE_FAST_DISPATCH=0``); values and modeled
            times are the same either way.
    """

    preset: CoreSpec
    clock: str = "wall"
    numerics: bool = True
    blocking: bool = False
    gil_switch_interval_s: float | None = 0.0005
    worker_threads: int = max(1, (os.cpu_count() or 2) - 1)
    fast_dispatch: bool = True

    def __post_init__(self) -> None:
        if self.clock not in _CLOCKS:
            raise ValueError(f"clock must be one of {_CLOCKS}, got {self.clock!r}")
        if self.worker_threads < 1:
            raise ValueError(f"worker_threads must be >= 1, got {self.worker_threads}")
        if self.gil_switch_interval_s is not None and not 0 < self.gil_switch_interval_s <= 1:
            raise ValueError(
                f"gil_switch_interval_s must be in (0, 1] seconds or None, got {self.gil_switch_interval_s}"
            )


_SETTINGS: Settings | None = None
_LISTENERS: list = []


def settings() -> Settings:
    """The current settings (created from the environment on first use)."""
    global _SETTINGS
    if _SETTINGS is None:
        _SETTINGS = Settings(
            preset=preset(None),
            clock=os.environ.get("TILESCOPE_CLOCK", "wall") or "wall",
            numerics=flag("TILESCOPE_NUMERICS", True),
            blocking=flag("TILESCOPE_LAUNCH_BLOCKING", False),
            fast_dispatch=flag("TILESCOPE_FAST_DISPATCH", True),
            **({"worker_threads": threads} if (threads := count("TILESCOPE_WORKER_THREADS", None, minimum=1)) else {}),
        )
    return _SETTINGS


def configure(*, preset: str | CoreSpec | None = None, clock: str | None = None,
              numerics: bool | None = None, blocking: bool | None = None,
              gil_switch_interval_s: float | None = ..., worker_threads: int | None = None,
              fast_dispatch: bool | None = None) -> Settings:
    """Change settings; unspecified ones keep their value. Returns the new settings.

    Changing the preset or the clock first waits for pending device work (so no
    execution straddles two models) and resets the device clocks.
    """
    global _SETTINGS
    old = settings()
    changes: dict = {}
    if preset is not None:
        changes["preset"] = _resolve(preset)
    if clock is not None:
        changes["clock"] = clock
    if numerics is not None:
        changes["numerics"] = bool(numerics)
    if blocking is not None:
        changes["blocking"] = bool(blocking)
    if gil_switch_interval_s is not ...:
        changes["gil_switch_interval_s"] = gil_switch_interval_s
    if worker_threads is not None:
        changes["worker_threads"] = worker_threads
    if fast_dispatch is not None:
        changes["fast_dispatch"] = bool(fast_dispatch)
    new = dataclasses.replace(old, **changes)
    if new == old:
        return old
    for fn in list(_LISTENERS):
        fn(old, new)
    _SETTINGS = new
    return new


def _resolve(p) -> CoreSpec:
    return preset(p)


def on_change(fn) -> None:
    """Call ``fn(old, new)`` before every change takes effect (the runtime uses it)."""
    _LISTENERS.append(fn)
