"""The table of lowering rules: op name -> rule.

A key is either a full overload name (``"aten::add.Tensor"``) or a bare op name
(``"add"``, matching every overload); full names win. Each rule module adds its rows
with :func:`add_rules`; the table is assembled at import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["Rule", "RULES", "add_rules"]


@dataclass(frozen=True)
class Rule:
    """One lowering rule.

    ``build(call, spec)`` returns the Program, or None when this call is outside what
    the rule handles: the rule it replaced for this op (``fallback``) is tried next,
    and the generic lowering last.
    """

    name: str
    build: Callable
    doc: str = ""
    fallback: "Rule | None" = None


RULES: dict[str, Rule] = {}


def add_rules(names, rule: Rule) -> None:
    """Add ``rule`` for ``names``; a rule already there becomes its fallback."""
    import dataclasses

    for n in names:
        old = RULES.get(n)
        RULES[n] = dataclasses.replace(rule, fallback=old) if old is not None else rule


def _load() -> None:
    # order matters where two rules share an op: a later rule is tried first, the earlier is its
    # fallback (the fused softmax kernel before the any-dim reduction form, for instance)
    from . import _elementwise, _reduce, _matmul, _conv, _movement  # noqa: F401  (they add rows)
    from . import _norm, _pool  # noqa: F401  (convolution neighbours: norms, pooling)
    from . import _vocab  # noqa: F401  (long rows: after the any-dim softmax, before the fused kernels)
    from . import _fused, _gather, _scatter, _nll, _scan, _topk, _sort  # noqa: F401
    from . import _triangle, _attention, _dropout  # noqa: F401


_load()
