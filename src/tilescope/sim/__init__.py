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

from collections import OrderedDict

from ..spec import CoreSpec, preset
from ._numerics import GPSIMD_IMPLS, poison_value, register_gpsimd_impl, run_numerics
from ._schedule import lane_names, schedule
from ._timeline import LANE_GROUPS, SimResult, Summary, Timeline

__all__ = [
    "simulate", "run_numerics", "register_gpsimd_impl", "SimResult", "Summary", "Timeline",
    "LANE_GROUPS", "cache_info", "clear_cache", "lane_names", "poison_value", "GPSIMD_IMPLS",
]

_CACHE: "OrderedDict[tuple[str, str], SimResult]" = OrderedDict()
_CACHE_SIZE = 512
_STATS = {"hits": 0, "misses": 0}


def simulate(program, spec: str | CoreSpec | None = None) -> SimResult:
    """Modeled timeline and summary of one run of ``program`` (cached by hash and preset).

    ``spec`` defaults to the preset the Program was built for.
    """
    spec = preset(spec if spec is not None else program.spec_name)
    key = (program.hash, spec.fingerprint)
    hit = _CACHE.get(key)
    if hit is not None:
        _STATS["hits"] += 1
        _CACHE.move_to_end(key)
        return hit
    _STATS["misses"] += 1
    result = schedule(program, spec)
    _CACHE[key] = result
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return result


def cache_info() -> dict:
    return {**_STATS, "size": len(_CACHE)}


def clear_cache() -> None:
    _CACHE.clear()
    _STATS.update(hits=0, misses=0)
