"""The simulator: modeled time (scheduler) and values (numerics), kept apart.

>>> from tilescope.program import TileBuilder
>>> from tilescope.sim import simulate
>>> b = TileBuilder("scale")
>>> x, y = b.input("x", (128, 512), "float32"), b.output("y", (128, 512), "float32")
>>> t = b.sbuf((128, 512), "float32")
>>> _ = b.dma_copy(t, x), b.activation(t, t, "exp"), b.dma_copy(y, t)
>>> result = simulate(b.build())
>>> result.summary.instructions, result.summary.modeled
(3, True)
"""

from __future__ import annotations

from .._lru import LruCache
from ..spec import CoreSpec, preset
from ._numerics import GPSIMD_IMPLS, poison_value, register_gpsimd_impl, run_numerics
from ._schedule import lane_names, schedule
from ._timeline import LANE_GROUPS, SimResult, Summary, Timeline

__all__ = [
    "simulate", "run_numerics", "register_gpsimd_impl", "SimResult", "Summary", "Timeline",
    "LANE_GROUPS", "cache_info", "clear_cache", "lane_names", "poison_value", "GPSIMD_IMPLS",
]

_CACHE = LruCache(512)  # (program hash, preset fingerprint) -> SimResult


def simulate(program, spec: str | CoreSpec | None = None) -> SimResult:
    """Modeled timeline and summary of one run of ``program`` (cached by hash and preset).

    ``spec`` defaults to the preset the Program was built for.
    """
    spec = preset(spec if spec is not None else program.spec_name)
    return _CACHE.get_or_build((program.hash, spec.fingerprint), lambda: schedule(program, spec))


def cache_info() -> dict:
    return {"hits": _CACHE.hits, "misses": _CACHE.misses, "size": len(_CACHE)}


def clear_cache() -> None:
    _CACHE.clear()
