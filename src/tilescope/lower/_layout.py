"""Tensors in HBM as access patterns, dimension coalescing, and tile plans.

Every tensor operand of a lowered Program is one HBM buffer covering the memory its
view spans (its *extent*), so views, broadcasts (stride 0) and transposes are plain
access patterns over it -- no copy.

A :class:`TilePlan` covers an iteration space (the output's shape after coalescing)
with SBUF tiles ``[partitions, k * cols]``: the last dimension is the free dimension
(split when longer than ``max_free``), the one before it is spread over the 128
partitions with ``k`` consecutive rows per partition, and any outer dimensions are
looped over. Each operand gets the same tiles through its own strides.

>>> plan = TilePlan((1000, 64), max_free=2048, partitions=128)
>>> [(t.partitions, t.rows_per_partition, t.cols) for t in plan.tiles]
[(125, 8, 64)]
>>> [(t.partitions, t.rows_per_partition) for t in TilePlan((1009,), max_free=2048).tiles]
[(126, 8), (1, 1)]
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from math import prod

from ..dtypes import canonical
from ..isa import AP
from ..program import TileBuilder, View
from ._call import TensorMeta

__all__ = ["hbm_input", "hbm_output", "strided_view", "coalesce", "TilePlan", "Tile", "device_dtype"]


def device_dtype(torch_dtype) -> str:
    """The Program dtype of a torch dtype (bool is uint8 on the device)."""
    return canonical(torch_dtype)


def strided_view(handle, shape, stride, offset: int = 0) -> View:
    """A view of an HBM buffer with explicit element strides."""
    dims = tuple((int(s), int(n)) for s, n in zip(stride, shape)) or ((1, 1),)
    return View(handle.buffer, AP(handle.buffer.name, handle.buffer.dtype, offset, dims), tuple(shape) or (1,))


def _buffer_shape(meta: TensorMeta) -> tuple[int, ...]:
    if meta.is_contiguous and meta.numel > 0:
        return tuple(meta.shape) or (1,)
    return (max(meta.extent, 1),)


def hbm_input(b: TileBuilder, name: str, meta: TensorMeta) -> View:
    """Declare ``meta`` as an HBM input; returns a view with the tensor's own strides."""
    h = b.input(name, _buffer_shape(meta), meta.device_dtype)
    return strided_view(h, meta.shape, meta.stride)


def hbm_output(b: TileBuilder, name: str, meta: TensorMeta) -> View:
    h = b.output(name, _buffer_shape(meta), meta.device_dtype)
    return strided_view(h, meta.shape, meta.stride)


def coalesce(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Merge adjacent dims that every operand walks contiguously; drop size-1 dims.

    ``strides`` holds one stride tuple per operand (broadcast operands have 0s).
    """
    dims = [(n, [st[i] for st in strides]) for i, n in enumerate(shape) if n != 1]
    if not dims:
        return (1,), [(1,) for _ in strides]
    merged = [dims[0]]
    for n, st in dims[1:]:
        pn, pst = merged[-1]
        if all(p == s * n for p, s in zip(pst, st)):
            merged[-1] = (pn * n, st)
        else:
            merged.append((n, st))
    new_shape = tuple(n for n, _ in merged)
    new_strides = [tuple(st[k] for _, st in merged) for k in range(len(strides))]
    return new_shape, new_strides


@dataclass(frozen=True)
class Tile:
    """One tile of a plan: an outer index, a row range and a column range."""

    outer: tuple[int, ...]  # index into the outer (looped) dims
    row0: int  # first row of the partition dim covered
    partitions: int
    rows_per_partition: int
    col0: int
    cols: int

    @property
    def free(self) -> int:
        return self.rows_per_partition * self.cols


class TilePlan:
    """Tiles covering ``shape`` (already coalesced) as ``[P, k * cols]`` SBUF tiles."""

    def __init__(self, shape: tuple[int, ...], *, max_free: int, partitions: int = 128):
        self.shape = tuple(shape) if shape else (1,)
        if len(self.shape) == 1:
            # a single dim: rows of one element, k consecutive rows per partition
            self.rows_shape = (self.shape[0], 1)
        else:
            self.rows_shape = self.shape[-2:]
        self.outer_shape = self.shape[:-2] if len(self.shape) > 2 else ()
        self.max_free = max_free
        self.partitions = partitions
        self.tiles = list(self._make())

    def _make(self):
        rows, cols = self.rows_shape
        col_chunk = min(cols, self.max_free)
        k_max = max(1, self.max_free // col_chunk)
        for outer in product(*(range(n) for n in self.outer_shape)):
            for c0 in range(0, cols, col_chunk):
                cw = min(col_chunk, cols - c0)
                r = 0
                while r < rows:
                    left = rows - r
                    k = min(k_max, -(-left // self.partitions))
                    p = min(self.partitions, left // k)
                    yield Tile(tuple(outer), r, p, k, c0, cw)
                    r += p * k

    def operand_ap(self, view: View, strides: tuple[int, ...], tile: Tile) -> View:
        """The HBM region of one operand (with coalesced ``strides``) for ``tile``."""
        if len(self.shape) == 1:
            row_stride = col_stride = strides[0]
            outer_strides: tuple[int, ...] = ()
        else:
            row_stride, col_stride = strides[-2], strides[-1]
            outer_strides = strides[:-2]
        base = view.ap.offset + sum(i * st for i, st in zip(tile.outer, outer_strides))
        base += tile.row0 * row_stride + tile.col0 * col_stride
        k = tile.rows_per_partition
        dims = ((k * row_stride, tile.partitions), (row_stride, k), (col_stride, tile.cols))
        ap = AP(view.ap.buffer, view.ap.dtype, base, dims)
        return View(view.buffer, ap, (tile.partitions, k, tile.cols))


def numel(shape) -> int:
    return prod(shape)
