"""Hardware presets as data.

>>> from tilescope.spec import preset, preset_names
>>> preset("trn1").tensor.clock_ghz
2.8
>>> "trn2" in preset_names()
True
"""

from __future__ import annotations

import importlib
import os
import pkgutil

from ._model import CoreSpec, DmaSpec, EngineSpec

__all__ = ["CoreSpec", "DmaSpec", "EngineSpec", "preset", "preset_names", "default_preset"]

DEFAULT_PRESET = "trn1"


def _registry() -> dict[str, CoreSpec]:
    from . import presets

    found: dict[str, CoreSpec] = {}
    for info in pkgutil.iter_modules(presets.__path__):
        module = importlib.import_module(f"{presets.__name__}.{info.name}")
        found.update(getattr(module, "PRESETS", {}))
    return found


_PRESETS: dict[str, CoreSpec] | None = None


def preset_names() -> list[str]:
    """Names of every known preset."""
    global _PRESETS
    if _PRESETS is None:
        _PRESETS = _registry()
    return sorted(_PRESETS)


def preset(name: str | CoreSpec | None = None) -> CoreSpec:
    """Look a preset up by name (a ``CoreSpec`` passes through unchanged).

    ``None`` means ``$TILESCOPE_PRESET`` or the default, ``trn1``.
    """
    global _PRESETS
    if isinstance(name, CoreSpec):
        return name
    if name is None:
        name = os.environ.get("TILESCOPE_PRESET") or DEFAULT_PRESET
    if _PRESETS is None:
        _PRESETS = _registry()
    try:
        return _PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown hardware preset {name!r}; known presets: {', '.join(sorted(_PRESETS))}. "
            f"Derive a variant with preset('trn1').replace(...)"
        ) from None


def default_preset() -> CoreSpec:
    return preset(None)
