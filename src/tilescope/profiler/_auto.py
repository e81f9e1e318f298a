"""Capture with no code change: ``TILESCOPE_PROFILE=1 python script.py`` and ``tilescope profile``.

Environment: ``TILESCOPE_PROFILE=1`` turns it on; ``TILESCOPE_PROFILE_DIR`` (output dir,
default ``profile_out``), ``TILESCOPE_PROFILE_CORES`` (e.g. ``0,2-3``),
``TILESCOPE_PROFILE_MODE`` (comma-separated ``DEVICE,RUNTIME,HOST_CPU,HOST_MEMORY``),
``TILESCOPE_PROFILE_MAX_EVENTS`` (per-core ring buffer),
``TILESCOPE_PROFILE_DEVICE_PROFILE`` (``first`` or ``session``), ``TILESCOPE_PROFILE_DEVICE``
(``sim``, the default; ``cuda`` or ``cpu`` to profile a script that runs there) and
``TILESCOPE_PROFILE_ALL_THREADS`` (``1``: torch records the ops of every thread, not only the
main one's). The profile covers the whole run and is exported when the interpreter exits. The
variable is read when ``tilescope`` is imported: a script that never imports it is not
profiled -- ``tilescope profile script.py`` needs no import.

>>> config_from_env({"TILESCOPE_PROFILE": "1", "TILESCOPE_PROFILE_ALL_THREADS": "yes"}).profile_all_threads
True
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys

import torch

from .._env import count, flag
from ._config import ProfileConfig, mode_of
from ._export import Profiler
from ._profile_block import DEVICES, activities_for

__all__ = ["config_from_env", "device_from_env", "start_from_env", "run_script"]

_active = None


def config_from_env(environ=os.environ) -> ProfileConfig | None:
    if not flag("TILESCOPE_PROFILE", False, environ):
        return None
    kwargs = {}
    modes = environ.get("TILESCOPE_PROFILE_MODE")
    if modes:
        try:
            kwargs["modes"] = tuple(mode_of(m) for m in modes.split(",") if m.strip())
        except ValueError as e:
            raise ValueError(f"TILESCOPE_PROFILE_MODE={modes!r}: {e}") from None
    max_events = count("TILESCOPE_PROFILE_MAX_EVENTS", None, environ, minimum=1)
    if max_events is not None:
        kwargs["max_events_per_core"] = max_events
    return ProfileConfig(
        output_dir=environ.get("TILESCOPE_PROFILE_DIR", "profile_out"),
        capture_cores=environ.get("TILESCOPE_PROFILE_CORES"),
        device_profile=environ.get("TILESCOPE_PROFILE_DEVICE_PROFILE", "first"),
        profile_all_threads=flag("TILESCOPE_PROFILE_ALL_THREADS", False, environ),
        **kwargs,
    )


def device_from_env(environ=os.environ) -> str:
    """``TILESCOPE_PROFILE_DEVICE``: what the zero-code capture profiles (``sim``, the default;
    ``cuda``; ``cpu``)."""
    device = (environ.get("TILESCOPE_PROFILE_DEVICE") or "sim").strip().lower()
    if device not in DEVICES:
        raise ValueError(f"TILESCOPE_PROFILE_DEVICE={environ.get('TILESCOPE_PROFILE_DEVICE')!r}: use one of "
                         f"{', '.join(DEVICES)}")
    return device


def _start(cfg: ProfileConfig, device: str = "sim"):
    global _active
    if _active is not None:
        return _active
    activities = activities_for(device)
    exporter = Profiler(cfg)
    prof = torch.profiler.profile(activities=activities, experimental_config=cfg, on_trace_ready=exporter.export_trace)
    prof.start()
    _active = (prof, exporter)

    def stop():
        global _active
        if _active is None:
            return
        _active = None
        try:
            prof.stop()  # synchronises the device, then exports
        finally:
            exporter.close()
        if exporter.path is not None:
            print(f"tilescope: profile written to {exporter.path}", file=sys.stderr)

    atexit.register(stop)
    return _active


def start_from_env() -> bool:
    """Start a whole-run profile if ``TILESCOPE_PROFILE`` asks for one."""
    cfg = config_from_env()
    if cfg is None:
        return False
    _start(cfg, device_from_env())
    return True


def run_script(path: str, argv: list[str], cfg: ProfileConfig, device: str = "sim") -> Profiler:
    """Run ``path`` as ``__main__`` under a whole-run profile of ``device`` (``sim``, ``cuda``
    or ``cpu``); returns the exporter."""
    activities = activities_for(device)
    exporter = Profiler(cfg)
    old_argv = sys.argv
    sys.argv = [path] + list(argv)
    try:
        with torch.profiler.profile(activities=activities, experimental_config=cfg,
                                    on_trace_ready=exporter.export_trace):
            try:
                runpy.run_path(path, run_name="__main__")
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise
    finally:
        sys.argv = old_argv
        exporter.close()
    return exporter
