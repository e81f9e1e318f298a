"""Indirect DMA: the building blocks of gathers and scatters whose cost follows the rows touched.

A Trainium-class core gathers rows by index with an *indirect* DMA (NKI: ``nisa.dma_copy``
with a ``vector_offset`` access pattern): the index tile is loaded into SBUF, GpSimd writes
one DMA descriptor per index (software DGE, the only descriptor mode that supports
gather/scatter, nki/deep-dives/nki-dge.rst), and the DMA engines move one row per
descriptor. So a gather of two rows of a 50257-row table moves two rows.

Scatters that combine values (``index_add``, ``scatter_add``, embedding backward) are
read-modify-write: gather the rows they touch, combine on an engine, scatter them back.
Equal indices inside one tile would race (two partitions read the same old row, each adds
its own value, the later write wins), so the tile first *merges* its duplicates: every
entry gets the combined value of all entries with its index (on TensorE as
``E.T @ values`` with ``E[j, k] = (index[j] == index[k])`` for whole rows, on VectorE as a
masked reduction for single elements); equal indices then write equal values. Tiles run
one after another (each scatter may touch any row the next gather reads).

>>> from tilescope.lower._indirect import row_blocks
>>> list(row_blocks(300, 2, 128))  # (first entry, partitions, entries per partition)
[(0, 128, 2), (256, 44, 1)]
"""

from __future__ import annotations

from math import prod

import numpy as np

from ..errors import ProgramError
from ..isa import AP, dge_cycles
from ..program import TileBuilder, View
from ..sim import register_gpsimd_impl

__all__ = [
    "sb", "descriptors", "table_ap", "build_eq", "merge_chunks", "merge_elements",
    "wrap_negative", "row_blocks", "INDEX_DTYPES", "ELEMENT_OPS", "as_vectors", "fits_or_declines",
]

INDEX_DTYPES = ("int64", "int32")


def fits_or_declines(build):
    """A rule's ``build`` that declines (returns None: the next rule, then generic, takes the call)
    when its tiles do not fit a shape's extremes (SBUF/PSUM capacity, tile limits)."""
    import functools

    from ..errors import CapacityError, TileLimitError

    @functools.wraps(build)
    def rule(call, spec):
        try:
            return build(call, spec)
        except (CapacityError, TileLimitError):
            return None

    return rule


def as_vectors(call):
    """``call`` with every 0-dim tensor seen as a 1-element vector (a scalar "table" is one row)."""
    from dataclasses import replace

    from ._call import TensorMeta

    def vec(v):
        if isinstance(v, TensorMeta) and v.ndim == 0:
            return TensorMeta((1,), (1,), v.dtype)
        if isinstance(v, tuple):
            return tuple(vec(x) for x in v)
        return v

    return replace(call, args=vec(call.args), kwargs=tuple((k, vec(v)) for k, v in call.kwargs), outputs=vec(call.outputs))


def sb(tile: View, shape: tuple[int, ...]) -> View:
    """A contiguous SBUF tile seen with the free shape ``shape[1:]`` (row-major)."""
    dims, step = [], 1
    for n in reversed(shape[1:]):
        dims.append((step, n))
        step *= n
    dims.append((step, shape[0]))
    ap = tile.ap
    return View(tile.buffer, AP(ap.buffer, ap.dtype, ap.offset, tuple(reversed(dims))), tuple(shape))


def descriptors(b: TileBuilder, shape: tuple[int, ...], indices, *, base: View | None = None,
                wrap: bool = False, site: str = "dge") -> View:
    """GpSimd writes one descriptor per index (software DGE): row offsets
    ``base + sum(index_j * mult_j)`` into a new int64 tile of ``shape``.

    ``indices`` holds ``(tile, size, mult)``: an index tile, the extent it indexes (indices
    outside ``[0, size)`` -- or ``[-size, size)`` with ``wrap``, negatives counting from
    the end as in Python -- are an error, as with ``oob_mode.error``) and its multiplier.
    """
    desc = b.sbuf(shape, "int64", site=site)
    cycles = dge_cycles(shape[0], prod(shape[1:]))  # the cost table's (assumed) descriptor rate
    inputs = ([base] if base is not None else []) + [t for t, _, _ in indices]
    attrs = (("sizes", tuple(int(s) for _, s, _ in indices)), ("mults", tuple(int(m) for _, _, m in indices)),
             ("wrap", bool(wrap)), ("base", base is not None))
    b.gpsimd_call("dge", "dge.offsets", inputs, [desc], cycles, attrs)
    return desc


def _dge_offsets(inputs, outputs, attrs) -> None:
    out = outputs[0]
    ins = list(inputs)
    total = ins.pop(0).astype(np.int64).reshape(out.shape) if attrs["base"] else np.zeros(out.shape, np.int64)
    for idx, size, mult in zip(ins, attrs["sizes"], attrs["mults"]):
        v = np.asarray(idx).astype(np.int64).reshape(out.shape)
        lo = -size if attrs["wrap"] else 0
        bad = (v < lo) | (v >= size)
        if bad.any():
            raise ProgramError(
                f"index {int(v[bad].flat[0])} is out of bounds for a dimension of size {size} "
                f"(valid: {lo}..{size - 1})"
            )
        if attrs["wrap"]:
            v = np.where(v < 0, v + size, v)
        total = total + v * mult
    out[...] = total


register_gpsimd_impl("dge.offsets", _dge_offsets)


def table_ap(view: View, offset: int, row_stride: int, rows: int, row_dims) -> AP:
    """The indirect operand: ``rows`` rows ``row_stride`` apart from ``offset``, each of ``row_dims``."""
    ap = view.ap
    return AP(ap.buffer, ap.dtype, ap.offset + offset, ((row_stride, rows),) + tuple(row_dims or ((1, 1),)))


def row_blocks(n: int, k_max: int, partitions: int):
    """``(r0, p, k)`` blocks covering ``range(n)``: ``p`` partitions of ``k`` consecutive entries."""
    r = 0
    while r < n:
        left = n - r
        k = max(1, min(k_max, -(-left // partitions)))
        p = min(partitions, left // k)
        yield r, p, k
        r += p * k


def build_eq(b: TileBuilder, pairs, p: int, keep: View | None = None, site: str = "merge") -> View:
    """``E[j, k] = 1`` where entries ``j`` and ``k`` of a tile name the same row, on VectorE.

    ``pairs`` holds, per index tensor, its ``[p, 1]`` column (entry ``j`` on partition ``j``)
    and ``[p, p]`` row tile (every entry along the free axis of every partition, as a
    broadcast DMA reads it); entries match when every index tensor matches. ``keep``
    ``[p, 1]`` (1 or 0) drops entries (their row of ``E`` is zeroed).
    """
    eq = b.sbuf((p, p), "float32", site=f"{site}.eq")
    for j, (col, row) in enumerate(pairs):
        c = View(col.buffer, AP(col.ap.buffer, col.ap.dtype, col.ap.offset, (col.ap.dims[0], (0, p))), (p, p))
        if j == 0:
            b.tensor_tensor(eq, row, c, "equal")
        else:
            m = b.sbuf((p, p), "float32", site=f"{site}.eq{j}")
            b.tensor_tensor(m, row, c, "equal")
            b.tensor_tensor(eq, eq, m, "multiply")
    if keep is not None:
        b.tensor_scalar(eq, eq, "multiply", keep)
    return eq


def merge_chunks(b: TileBuilder, spec, eq: View, vals: View, p: int, width: int,
                 site: str = "merge") -> list[tuple[int, int, View]]:
    """Every row the sum of the rows sharing its index: ``E.T @ vals`` on TensorE, per chunk of
    at most 512 columns (one PSUM bank). Returns ``(c0, cw, psum)`` per chunk."""
    moving = vals
    if vals.dtype != "float32":
        moving = b.sbuf((p, width), "float32", site=f"{site}.cast")
        b.tensor_copy(moving, vals)
    out = []
    for c0 in range(0, width, spec.matmul_moving_fmax):
        cw = min(spec.matmul_moving_fmax, width - c0)
        ps = b.psum((p, cw), "float32", site=f"{site}.ps")
        b.matmul(ps, eq, moving[:, c0:c0 + cw])
        out.append((c0, cw, ps))
    return out


def wrap_negative(b: TileBuilder, t: View, size: int, site: str) -> View:
    """Python-style negative indices counted from the end: ``t + size * (t < 0)`` on VectorE."""
    w = b.sbuf(t.shape, t.dtype, site=f"{site}.neg")
    b.tensor_scalar(w, t, "less", 0.0, "multiply", float(size))
    out = b.sbuf(t.shape, t.dtype, site=f"{site}.wrap")
    b.tensor_tensor(out, t, w, "add")
    return out


# element reductions: op -> (select fill for non-matching entries, reduce op, combine op)
ELEMENT_OPS = {
    "sum": (0.0, "add", "add"),
    "prod": (1.0, "multiply", "multiply"),
    "amax": (float("-inf"), "max", "maximum"),
    "amin": (float("inf"), "min", "minimum"),
}


def merge_elements(b: TileBuilder, desc: View, vals: View, shape3: tuple[int, int, int], op: str,
                   site: str = "emerge") -> View:
    """Combine equal targets within each row of a ``[p, k, g]`` tile on VectorE:
    ``merged[p, k, i] = reduce_j(vals[p, k, j] where desc[p, k, j] == desc[p, k, i])``.
    Targets of different rows never collide (the scatter dim is the row's free axis)."""
    p, k, g = shape3
    fill, red, _ = ELEMENT_OPS[op]
    d = desc.ap
    a_i = AP(d.buffer, d.dtype, d.offset, ((k * g, p), (g, k), (1, g), (0, g)))
    a_j = AP(d.buffer, d.dtype, d.offset, ((k * g, p), (g, k), (0, g), (1, g)))
    eq = b.sbuf((p, k * g * g), "float32", site=f"{site}.eq")
    eq4 = View(eq.buffer, AP(eq.ap.buffer, "float32", eq.ap.offset, ((k * g * g, p), (g * g, k), (g, g), (1, g))),
               (p, k, g, g))
    b.tensor_tensor(eq4, View(desc.buffer, a_i, (p, k, g, g)), View(desc.buffer, a_j, (p, k, g, g)), "equal")
    v = vals.ap
    vj = View(vals.buffer, AP(v.buffer, v.dtype, v.offset, ((k * g, p), (g, k), (0, g), (1, g))), (p, k, g, g))
    picked = b.sbuf((p, k * g * g), "float32", site=f"{site}.pick")
    pick4 = View(picked.buffer, AP(picked.ap.buffer, "float32", picked.ap.offset, eq4.ap.dims), (p, k, g, g))
    if op == "sum":
        b.tensor_tensor(pick4, eq4, vj, "multiply")
    else:
        b.select(pick4, eq4, vj, fill)
    merged = b.sbuf((p, k * g), "float32", site=f"{site}.out")
    b.tensor_reduce(sb(merged, (p, k, g)), pick4, red, axes=(3,))
    return merged
