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
from typing import NamedTuple
from itertools import product
from math import prod

from ..dtypes import canonical
from ..isa import AP
from ..program import TileBuilder, View
from ._call import TensorMeta

__all__ = ["hbm_input", "hbm_output", "strided_view", "coalesce", "memory_order", "TilePlan", "Tile", "device_dtype", "spread",
           "compact_load", "load_operand", "plan_ns", "Layout"]


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


def memory_order(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """The dims of an elementwise iteration space ordered as the first operand (the output) lays
    them out in memory, outermost first -- the order is free when every element is independent,
    and a permuted output (a channels-last feature map, an op over a transposed view, whose
    result torch lays out as its input) then coalesces as its memory does.

    >>> memory_order((8, 1024, 512), [(524288, 1, 1024), (524288, 1, 1024)])
    ((8, 512, 1024), [(524288, 1024, 1), (524288, 1024, 1)])
    """
    order = sorted(range(len(shape)), key=lambda d: -abs(strides[0][d]))  # stable: ties keep their order
    return tuple(shape[d] for d in order), [tuple(st[d] for d in order) for st in strides]


def _planes(shape, part_dims: int = 1) -> tuple[tuple[int, ...], tuple[int, int], tuple[int, ...]]:
    """``(shape, (rows, cols), outer dims)`` of a plan: the last two dims are the tiled plane (a
    single dim is rows of one element, ``k`` consecutive rows per partition); the rest loop.
    With ``part_dims=2`` the two dims before the last are the partitions together (a few rows
    times a factor of the last dim, at most the partition count: one row tile)."""
    shape = tuple(shape) if shape else (1,)
    if part_dims == 2:
        return shape, (shape[-3] * shape[-2], shape[-1]), tuple(shape[:-3])
    if len(shape) == 1:
        return shape, (shape[0], 1), ()
    return shape, tuple(shape[-2:]), tuple(shape[:-2])


def _operand_dims(shape, strides, part_dims: int, tile: "Tile") -> tuple[int, tuple[tuple[int, int], ...]]:
    """``(offset, dims)`` of one operand (``strides`` over the plan's ``shape``) for ``tile``,
    the partition dim(s) first: ``(partitions, [planes,] k, cols)``, or with ``part_dims=2``
    ``(rows, factor, [planes,] cols)``."""
    if part_dims == 2:
        cs = strides[-1]
        outer_strides, head, tail = strides[:-3], tuple(zip(strides[-3:-1], shape[-3:-1])), ((cs, tile.cols),)
        offset = tile.col0 * cs
    else:
        rs, cs = (strides[0], strides[0]) if len(shape) == 1 else (strides[-2], strides[-1])
        outer_strides = strides[:-2] if len(shape) > 1 else ()
        k = tile.rows_per_partition
        head, tail = ((k * rs, tile.partitions),), ((rs, k), (cs, tile.cols))
        offset = tile.row0 * rs + tile.col0 * cs
    offset += sum(i * st for i, st in zip(tile.outer, outer_strides))
    batch = ((outer_strides[-1], tile.outer_count),) if tile.outer_count > 1 else ()
    return offset, head + batch + tail


def _row_tiles(rows: int, cols: int, max_free: int, partitions: int):
    """``(row0, p, k, col0, cols)`` of the tiles covering a ``[rows, cols]`` plane: column chunks
    of at most ``max_free``, ``k`` consecutive rows on each of ``p`` partitions."""
    col_chunk = min(cols, max_free)
    k_max = max(1, max_free // col_chunk)
    for c0 in range(0, cols, col_chunk):
        cw = min(col_chunk, cols - c0)
        r = 0
        while r < rows:
            left = rows - r
            k = min(k_max, -(-left // partitions))
            p = min(partitions, left // k)
            yield r, p, k, c0, cw
            r += p * k


@dataclass(frozen=True)
class Tile:
    """One tile of a plan: an outer index, a row range and a column range (and, in a plan that
    batches small planes, ``outer_count`` consecutive indices of the innermost outer dim)."""

    outer: tuple[int, ...]  # index into the outer (looped) dims
    row0: int  # first row of the partition dim covered
    partitions: int
    rows_per_partition: int
    col0: int
    cols: int
    outer_count: int = 1

    @property
    def free(self) -> int:
        return self.outer_count * self.rows_per_partition * self.cols


def _batch(row_tiles: list, outer_shape: tuple[int, ...], max_free: int) -> int:
    """Planes of the innermost outer dim one tile covers: a plane that is one small tile shares
    it with the next planes (one transfer's fixed cost, and one instruction's, for several)."""
    if not outer_shape or len(row_tiles) != 1:
        return 1
    _, _, k, _, cw = row_tiles[0]
    return max(1, min(outer_shape[-1], max_free // (k * cw)))


class TilePlan:
    """Tiles covering ``shape`` (already coalesced) as ``[P, k * cols]`` SBUF tiles
    (``[P, m * k * cols]`` with ``batch_outer``: ``m`` planes of the innermost outer dim in a
    tile when one plane is a single small tile; for ops whose elements are independent)."""

    def __init__(self, shape: tuple[int, ...], *, max_free: int, partitions: int = 128, batch_outer: bool = False,
                 part_dims: int = 1):
        self.shape, self.rows_shape, self.outer_shape = _planes(shape, part_dims)
        self.max_free = max_free
        self.partitions = partitions
        self.batch_outer = batch_outer
        self.part_dims = part_dims  # HBM dims that make up the partition dim (see _planes)
        if part_dims == 2 and self.rows_shape[0] > partitions:
            raise ValueError(f"partition dims {self.shape[-3:-1]} hold {self.rows_shape[0]} rows; at most {partitions}")
        self.tiles = list(self._make())

    def _make(self):
        row_tiles = list(_row_tiles(*self.rows_shape, self.max_free, self.partitions))
        m = _batch(row_tiles, self.outer_shape, self.max_free) if self.batch_outer else 1
        if m == 1:
            for outer in product(*(range(n) for n in self.outer_shape)):
                for r, p, k, c0, cw in row_tiles:
                    yield Tile(tuple(outer), r, p, k, c0, cw)
            return
        (r, p, k, c0, cw), last = row_tiles[0], self.outer_shape[-1]
        for outer in product(*(range(n) for n in self.outer_shape[:-1])):
            for o in range(0, last, m):
                yield Tile(tuple(outer) + (o,), r, p, k, c0, cw, min(m, last - o))

    def operand_ap(self, view: View, strides: tuple[int, ...], tile: Tile) -> View:
        """The HBM region of one operand (with coalesced ``strides``) for ``tile``: dims
        ``(partitions, k, cols)``, ``(partitions, planes, k, cols)`` for a batched tile; with
        ``part_dims=2`` the first two dims are the partitions."""
        offset, dims = _operand_dims(self.shape, strides, self.part_dims, tile)
        ap = AP(view.ap.buffer, view.ap.dtype, view.ap.offset + offset, dims)
        return View(view.buffer, ap, (tile.partitions,) + tuple(c for _, c in dims[self.part_dims:]))


def numel(shape) -> int:
    return prod(shape)


def compact_load(dims: tuple[tuple[int, int], ...], part_dims: int = 1) -> tuple[tuple, tuple]:
    """How to bring an operand's tile ``dims`` (the ``part_dims`` partition dims first, then its
    free dims; HBM strides) on chip without reading a broadcast value more than once per
    partition: ``(load, widen)`` -- the HBM dims to load (the free dims of stride 0 left out)
    into a compact ``[p, w]`` SBUF tile, and the dims of a view over that tile that widens it
    back to the whole tile by stride-0 free dims (engines read a stride-0 free dim at no cost).

    >>> compact_load(((64, 128), (0, 4), (1, 16)))  # a row broadcast over 4 rows
    (((64, 128), (1, 16)), ((16, 128), (0, 4), (1, 16)))
    >>> compact_load(((3, 128), (1, 3), (0, 8)))  # one value per row
    (((3, 128), (1, 3)), ((3, 128), (1, 3), (0, 8)))
    >>> compact_load(((1, 64), (0, 2), (0, 1568)), part_dims=2)  # a channel's value, 2 partitions a channel
    (((1, 64), (0, 2), (1, 1)), ((1, 128), (0, 1568)))
    """
    head, free = dims[:part_dims], dims[part_dims:]
    p = prod(c for _, c in head)
    kept = [(s, c) for s, c in free if c > 1 and s != 0]
    widen, inner = [], 1
    for s, c in reversed(free):
        if c > 1 and s != 0:
            widen.append((inner, c))
            inner *= c
        else:
            widen.append((0, c))
    return head + (tuple(kept) or ((1, 1),)), ((inner, p),) + tuple(reversed(widen))


def load_operand(b: TileBuilder, full: View, part_dims: int, tshape, dtype: str, site: str,
                 queue: int | None = None) -> View:
    """An operand in the output's layout, a broadcast value loaded once per partition and widened
    on chip (:func:`~tilescope.lower._layout.compact_load`)."""
    if not any(s == 0 and c > 1 for s, c in full.ap.dims[part_dims:]):
        t = b.sbuf(tshape, dtype, site=site)
        b.dma_copy(t, full, queue=queue)
        return t
    load, widen = compact_load(full.ap.dims, part_dims)
    p, w = tshape[0], prod(c for _, c in load[part_dims:])
    t = b.sbuf((p, w), dtype, site=site)
    b.dma_copy(t, View(full.buffer, AP(full.ap.buffer, full.ap.dtype, full.ap.offset, load), (p, w)), queue=queue)
    return View(t.buffer, AP(t.ap.buffer, t.ap.dtype, t.ap.offset, widen), tshape)


class Layout(NamedTuple):
    """An elementwise op's iteration space as a :class:`TilePlan` takes it (see :func:`spread`)."""

    shape: tuple[int, ...]
    strides: list[tuple[int, ...]]  # per operand
    part_dims: int = 1

    def plan(self, *, max_free: int, partitions: int) -> "TilePlan":
        return TilePlan(self.shape, max_free=max_free, partitions=partitions, batch_outer=True,
                        part_dims=self.part_dims)


def plan_ns(layout: Layout, dtypes: list[str], spec, *, max_free: int) -> float:
    """Modeled time of one pass over the :class:`TilePlan` of ``layout``, from the cost table:
    per tile, one VectorE instruction over the tile and one DMA per operand (``dtypes`` per
    operand, the output's among them) loaded as :func:`compact_load` does. The engine passes
    and the transfers overlap, so the longer of the two sums. A transfer over ``p`` partitions
    runs on the DMA engines of those partitions, and every tile starts at partition 0, so the
    transfers' pieces add up on the first engine."""
    from ..isa import DmaCopy, TensorTensor, dma_cost, engine_ns

    shape, rows_shape, outer_shape = _planes(layout.shape, layout.part_dims)
    row_tiles = list(_row_tiles(*rows_shape, max_free, spec.partitions))
    m = _batch(row_tiles, outer_shape, max_free)
    groups: dict[tuple[int, int, int, int], int] = {}
    for _, p, k, _, cw in row_tiles:
        groups[(p, k, cw, m)] = groups.get((p, k, cw, m), 0) + 1
    if m > 1:  # one row tile per plane, batched m planes at a time along the innermost outer dim
        last = outer_shape[-1]
        groups = {(p, k, cw, m): last // m}
        if last % m:
            groups[(p, k, cw, last % m)] = 1
    outer0 = (0,) * len(outer_shape)
    eng = dma = 0.0
    for (p, k, cw, mm), count in groups.items():
        f = mm * k * cw
        t = AP("t", "float32", 0, ((f, p), (1, f)))
        eng += count * engine_ns(TensorTensor(t, t, t, "add"), spec)
        tile = Tile(outer0, 0, p, k, 0, cw, mm)
        for st, dt in zip(layout.strides, dtypes):
            load, _ = compact_load(_operand_dims(shape, st, layout.part_dims, tile)[1], layout.part_dims)
            w = prod(c for _, c in load[layout.part_dims:])
            c = dma_cost(DmaCopy(AP("t", dt, 0, ((w, p), (1, w))), AP("x", dt, 0, load)), spec, "hbm", "sbuf")
            # its issue cost too, spread over the queues: many small transfers wait on it
            dma += count * (c.engine_ns(spec) + c.fixed_ns / spec.dma.queues)
    return max(eng, dma) * prod(outer_shape[:-1] if m > 1 else outer_shape)


def _candidates(shape: tuple[int, ...], strides: list[tuple[int, ...]], partitions: int):
    """Every layout :func:`spread` prices (see there)."""
    n = len(shape)
    yield Layout(tuple(shape), list(strides))
    for c in (n - 1, None):  # the free dim: the last, or None (a size-1 free dim: rows of one element)
        for r in (d for d in range(n) if d != c):
            rest = [d for d in range(n) if d not in (r, c)]
            for o in [None] + rest:  # the innermost outer dim (the one a tile batches)
                outer = rest if o is None else [d for d in rest if d != o] + [o]
                order = tuple(outer) + (r, c)
                sh = tuple(1 if d is None else shape[d] for d in order)
                sts = [tuple(0 if d is None else st[d] for d in order) for st in strides]
                yield Layout(sh, sts)
                rows, cols = shape[r], 1 if c is None else shape[c]
                f = max((f for f in range(2, partitions // rows + 1) if cols % f == 0), default=0)
                if c is not None and f:  # few rows: a factor of the free dim joins them on the partitions
                    yield Layout(sh[:-1] + (f, cols // f), [st[:-1] + (st[-1] * (cols // f), st[-1]) for st in sts], 2)


def spread(shape: tuple[int, ...], strides: list[tuple[int, ...]], dtypes: list[str], spec, *,
           max_free: int) -> Layout:
    """The iteration space of an elementwise op (coalesced ``shape``; ``strides`` and ``dtypes``
    per operand) laid out so that its :class:`TilePlan` fills the partitions.

    Every element is independent, so any order of the dims is the same op. A plan puts its
    second-last dim on the partitions; when that dim is short (the 24 heads x batch of
    ``[2, 12, 512, 512]`` scores under a ``[512, 512]`` mask, the 3 or 64 channels of a feature
    map under a per-channel bias) only a few of the 128 lanes and of the 16 DMA engines work.
    So each candidate layout is priced by :func:`plan_ns` and the fastest kept (the given order
    on a tie): any dim on the partitions with the last dim free, or any dim alone as rows of one
    element (``k`` consecutive elements per partition); any other dim innermost of the looped
    ones, so that small planes batch along it; and for a short partition dim, a factor of the
    free dim split off to join it on the partitions (64 channels x 2 halves of each channel's
    pixels: 128 partitions, each operand through its own strides, a per-channel value the same
    on both of its channel's partitions).

    >>> from tilescope.spec import preset
    >>> lay = spread((24, 262144), [(262144, 1), (0, 1)], ["float32", "uint8"], preset("trn1"), max_free=2048)
    >>> lay.shape, lay.strides   # the 24 score planes looped; each plane's elements over the partitions
    ((24, 262144, 1), [(262144, 1, 0), (0, 1, 0)])
    """
    if len(shape) == 1:
        return Layout(tuple(shape), list(strides))
    best = None
    for lay in _candidates(tuple(shape), list(strides), spec.partitions):
        ns = plan_ns(lay, dtypes, spec, max_free=max_free)
        if best is None or ns < best[0]:
            best = (ns, lay)
    return best[1]
