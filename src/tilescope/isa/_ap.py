"""Operands: access patterns over named buffers, and runtime scalars.

Every buffer is a flat array of elements. An :class:`AP` (access pattern) picks
elements from it as ``offset + sum(i_k * stride_k)`` over ``(stride, count)``
pairs, outermost first -- the same form the real ISA uses. For SBUF and PSUM
operands the first pair is the partition dimension (stride = elements per
partition), the rest are free dimensions. A stride of 0 broadcasts.

>>> ap = AP("x", "float32", 0, ((512, 128), (1, 512)))
>>> ap.partitions, ap.free_size, ap.nbytes
(128, 512, 262144)
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ..dtypes import itemsize

__all__ = ["AP", "RuntimeScalar", "Scalar"]


@dataclass(frozen=True, slots=True)
class AP:
    buffer: str
    dtype: str
    offset: int
    dims: tuple[tuple[int, int], ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(c for _, c in self.dims)

    @property
    def partitions(self) -> int:
        """Size of the first (partition) dimension."""
        return self.dims[0][1] if self.dims else 1

    @property
    def free_size(self) -> int:
        """Elements per partition (N in the cost formulas)."""
        return prod(c for _, c in self.dims[1:])

    @property
    def size(self) -> int:
        return prod(c for _, c in self.dims)

    @property
    def nbytes(self) -> int:
        return self.size * itemsize(self.dtype)

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)

    def inner_stride_bytes(self) -> int:
        """Byte stride of the innermost dimension that has more than one element."""
        for stride, count in reversed(self.dims[1:]):
            if count > 1:
                return stride * itemsize(self.dtype)
        return itemsize(self.dtype)

    def contiguous_bytes(self) -> int:
        """Length in bytes of the longest contiguous run this pattern reads in one go."""
        run = 1
        expected = 1
        for stride, count in reversed(self.dims):
            if count == 1:
                continue
            if stride != expected:
                break
            run *= count
            expected = stride * count
        return run * itemsize(self.dtype)

    def key(self) -> tuple:
        return (self.buffer, self.dtype, self.offset, self.dims)

    def __reduce__(self):  # fast unpickling of cached Programs (see Instruction.__reduce__)
        return AP, (self.buffer, self.dtype, self.offset, self.dims)


@dataclass(frozen=True, slots=True)
class RuntimeScalar:
    """A scalar whose value is given at run time (not part of the Program hash).

    Optimizer step sizes and other per-call values use it, so a new value does not
    make a new Program.
    """

    name: str


# An immediate scalar operand: a constant, a runtime scalar, or a per-partition [P, 1] AP.
Scalar = float | int | RuntimeScalar | AP
