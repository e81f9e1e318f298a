"""Exceptions users see. Each message names the values, the limit and the fix."""

from __future__ import annotations

__all__ = [
    "TilescopeError", "ProgramError", "TileLimitError", "CapacityError", "IndexRangeError",
    "KernelError", "DtypeError", "UnsupportedError",
]


class TilescopeError(Exception):
    """Base of every tilescope error."""


class ProgramError(TilescopeError, ValueError):
    """A Program (or an instruction being added to one) is malformed."""


class TileLimitError(ProgramError):
    """A tile exceeds a hardware limit (partitions, PSUM bank width, matmul sizes)."""


class CapacityError(ProgramError):
    """Live tiles do not fit in SBUF or PSUM.

    ``instruction`` (the index of the first instruction using the tile that did not
    fit) and ``site`` (its allocation site) are set when the allocator knows them.
    """

    instruction: int | None = None
    site: str | None = None


class IndexRangeError(ProgramError, IndexError):
    """An access reaches outside the tensor or tile it indexes."""


class KernelError(ProgramError):
    """A tile kernel uses the language wrongly (operand kinds, shapes, calls outside a kernel)."""


class DtypeError(KernelError, TypeError):
    """Operand dtypes do not fit together (a cast is needed)."""


class UnsupportedError(KernelError, AttributeError):
    """A kernel uses an NKI construct tilescope does not model; the message says what to use
    instead. Also an ``AttributeError``, so ``hasattr`` and ``getattr(x, name, default)`` work."""
