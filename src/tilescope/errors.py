"""Exceptions users see. Each message names the values, the limit and the fix."""

from __future__ import annotations

__all__ = ["TilescopeError", "ProgramError", "TileLimitError", "CapacityError", "IndexRangeError"]


class TilescopeError(Exception):
    """Base of every tilescope error."""


class ProgramError(TilescopeError, ValueError):
    """A Program (or an instruction being added to one) is malformed."""


class TileLimitError(ProgramError):
    """A tile exceeds a hardware limit (partitions, PSUM bank width, matmul sizes)."""


class CapacityError(ProgramError):
    """Live tiles do not fit in SBUF or PSUM."""


class IndexRangeError(ProgramError, IndexError):
    """An access reaches outside the tensor or tile it indexes."""
