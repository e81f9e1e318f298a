"""What tilescope's other packages use of the program layer beyond its public API
(:mod:`tilescope.program`): the builder's coercion of a scalar operand, which lowerings that
build instructions by hand apply the way the builder does. No stability promise."""

from __future__ import annotations

from ._builder import _scalar as scalar_operand

__all__ = ["scalar_operand"]
