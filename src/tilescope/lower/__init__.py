"""aten ops -> Programs: a table of lowering rules, one cache, and the generic fallback.

Every aten op that reaches the simulated device becomes a Program built with the one
tile builder (:class:`tilescope.program.TileBuilder`). :data:`RULES` maps op names to
rules; an op without a rule, or one a rule declines (returns None), gets the
*generic* lowering (DMA in, one GpSimd routine, DMA out), labelled as such.

Lowered Programs are cached by (call, preset): the op, tensor shapes/strides/dtypes,
non-number arguments and output metadata. Number arguments are runtime operands, so
an optimizer's changing step size reuses one Program.

>>> import torch
>>> from tilescope.lower import Call, TensorMeta, ScalarArg, lower
>>> x = TensorMeta((256, 512), (512, 1), "float32")
>>> low = lower(Call("aten::mul.Tensor", (x, ScalarArg("s0", float)), (), (x,)))
>>> low.rule, low.program.runtime_scalars, low.modeled_ns > 0
('elementwise', ('s0',), True)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .._lru import LruCache
from ..program import Program
from ..sim import simulate
from ..spec import CoreSpec, preset
from . import _declines
from ._call import Call, OutputRef, ScalarArg, TensorMeta, contiguous_strides, meta_of
from ._declines import declines
from ._generic import lower_generic
from ._rules import RULES, Rule

__all__ = [
    "Call", "TensorMeta", "ScalarArg", "OutputRef", "Lowered", "lower", "RULES", "Rule",
    "cache_info", "clear_cache", "declines", "meta_of", "contiguous_strides",
]


@dataclass(frozen=True, slots=True)
class Lowered:
    """A lowered call: its Program, the Program's modeled duration and the rule used.

    ``modeled_ns`` and ``hbm_bytes`` come from the simulator (modeled figures).
    """

    program: Program
    modeled_ns: float
    rule: str
    hbm_bytes: int

    @property
    def generic(self) -> bool:
        return self.rule == "generic"


_CACHE = LruCache(8192)  # (call, preset fingerprint) -> Lowered; least recently used dropped first
_BY_RULE: Counter = Counter()


def lower(call: Call, spec: str | CoreSpec | None = None) -> Lowered:
    """The Program of ``call`` on ``spec`` (cached), built by its rule or the generic lowering."""
    spec = preset(spec)
    def build() -> Lowered:
        result = _build(call, spec)
        _BY_RULE[result.rule] += 1
        return result

    return _CACHE.get_or_build((call, spec.fingerprint), build)


def _build(call: Call, spec: CoreSpec) -> Lowered:
    rule = RULES.get(call.op) or RULES.get(call.packet)
    program = None
    name = "generic"
    while rule is not None and program is None:
        program = rule.build(call, spec)
        name = rule.name
        if program is None:
            _declines.count(name)
        rule = rule.fallback
    if program is None:
        program, _ = lower_generic(call, spec)
        name = "generic"
    summary = simulate(program, spec).summary
    return Lowered(program, float(summary.total_ns), name, int(summary.hbm_bytes))


def cache_info() -> dict:
    """Lowering cache statistics: Programs built (misses), reuses (hits), Programs per rule, and the
    calls each rule declined, by reason (:func:`declines`)."""
    return {"programs": len(_CACHE), "hits": _CACHE.hits, "misses": _CACHE.misses, "by_rule": dict(_BY_RULE),
            "declined": [{"rule": r, "reason": why, "calls": n} for r, why, n in declines()]}


def clear_cache() -> None:
    _CACHE.clear()
    _BY_RULE.clear()
    _declines.clear()
