"""Elementwise work over a transposed operand: contiguous runs into SBUF, a TensorE transpose.

An operand whose contiguous dim is not the output's (``x.transpose(-1, -2) + y``, NHWC storage
read as NCHW, a ``.contiguous()`` of a permuted view) read straight into an output-shaped tile
is one DMA descriptor per element. The hardware's way [arch] [isa nc_transpose] is to read it
in its own layout -- partitions along the output's contiguous dim ``c``, each partition a
contiguous run along the operand's own contiguous dim ``r`` -- and transpose each 128 x 128
block on TensorE (a matmul against identity) into PSUM, where the engines read it as an
output-shaped tile. A :class:`TransposedPlan` lays that out for any permutation: ``r`` and ``c``
are whichever dims they are, every other dim loops, and when ``r`` is short (the 64 channels of
an NHWC feature map, the 12 heads of a ``[B, S, H, D]`` view) consecutive indices of the
innermost looped dim join it on the partitions.

[isa nc_transpose]: "The input data tile can be any valid NKI data type ... The output dst tile
must have the same data type as that of data": the PSUM tile keeps the operand's dtype, so a
transpose never rounds. (On NeuronCore-v2 a TensorE transpose of data holding NaN/Inf is not
bit-accurate on the hardware; the model's numerics are an exact transpose.)
8-byte dtypes (int64) are not a TensorE dtype: they keep the strided read.

>>> from tilescope.spec import preset
>>> plan = transposed_plan((16, 1024, 1024), [(1 << 20, 1024, 1), (1 << 20, 1, 1024)],
...                        ["float32", "float32"], preset("trn1"))
>>> plan.r, plan.c, plan.transposed, plan.fold
(1, 2, (1,), 1)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import cycle, product
from math import prod

from ..dtypes import itemsize
from ..isa import AP, DmaCopy, TensorTensor, Transpose, dma_cost, engine_ns, load_stationary_cycles
from ..program import TileBuilder, View
from ._layout import compact_load

__all__ = ["TransposedPlan", "transposed_plan", "transposed_ns", "transposed_tiles", "subtiles", "out_shape",
           "row_ap", "transpose_in", "queues"]

_RUN_BYTES = 2048  # [dmabw] >= 2 KiB per partition to approach the DMA peak: the run an operand is read in


@dataclass(frozen=True)
class TransposedPlan:
    """Where a transposed operand's tiles come from (dims index the coalesced shape).

    ``c``: the output's contiguous dim (the tiles' free dim); ``r``: the transposed operands'
    contiguous dim (the tiles' partition dim); ``transposed``: those operands (0 is the output);
    ``fold``: consecutive indices of dim ``g`` (the innermost other dim) that join ``r`` on the
    partitions when ``r`` is shorter than them; ``span``: elements of ``r`` read in one run;
    ``width``: elements of ``c`` per tile (one PSUM bank of the widest transposed dtype);
    ``m``: consecutive indices of ``c`` each partition reads when ``c`` and ``r`` are one
    contiguous block (NHWC's pixels x channels): runs of ``m`` rows instead of one; ``mo``:
    consecutive indices of ``r`` each partition of an output tile holds when the output's ``r``
    and ``c`` are one contiguous block and ``c`` is short (NCHW read as NHWC: 64 channels a
    pixel): the output's runs are ``mo`` rows long."""

    shape: tuple[int, ...]
    r: int
    c: int
    transposed: tuple[int, ...]
    g: int | None
    fold: int
    span: int
    width: int
    partitions: int
    m: int = 1
    mo: int = 1

    @property
    def outer(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.shape)) if d not in (self.r, self.c))


def transposed_plan(shape, strides, dtypes, spec) -> TransposedPlan | None:
    """The plan for an op over the coalesced ``shape`` (``strides`` and ``dtypes`` per operand,
    the output's first), or None when no input is transposed against the output, or when one
    that is has a dtype TensorE does not transpose."""
    out = strides[0]
    c = next((d for d in range(len(shape)) if out[d] == 1 and shape[d] > 1), None)
    found = _transposed_operands(shape, strides, dtypes, c) if c is not None else None
    if found is None:
        return None
    r, transposed = found
    P = spec.partitions
    # each transposed operand holds one PSUM tile (at most a bank) per output tile of a load:
    # half the banks at most, so the next load's transposes overlap this one's reads
    per_operand = spec.psum_banks // 2 // len(transposed)
    if per_operand == 0:
        return None
    rest = [d for d in range(len(shape)) if d not in (r, c)]
    g = rest[-1] if rest else None
    fold = min(shape[g], P // shape[r]) if g is not None and shape[r] < P else 1
    widest = max(itemsize(dtypes[i]) for i in transposed)
    span = shape[r] if fold > 1 else min(shape[r], max(P, _RUN_BYTES // widest // P * P), P * per_operand)
    bank = spec.psum_bank_bytes // widest
    plan = TransposedPlan(tuple(shape), r, c, tuple(transposed), g if fold > 1 else None, fold, span,
                          min(shape[c], bank), P)
    if span != shape[r] or any(strides[i][c] != shape[r] for i in transposed):
        return _output_runs(plan, strides, dtypes, spec)
    # c and r one contiguous block: each partition may read m rows as one run; fewer partitions
    # then carry a chunk, so the cost table picks m
    best = (transposed_ns(plan, strides, dtypes, spec), plan)
    for m in (2, 4, 8, 16, 32):
        if shape[c] % m or m * shape[r] * widest > _RUN_BYTES or m > bank:
            continue
        cand = replace(plan, m=m, width=min(shape[c], bank // m * m))
        best = min(best, (transposed_ns(cand, strides, dtypes, spec), cand), key=lambda x: x[0])
    return _output_runs(best[1], strides, dtypes, spec)


def _output_runs(plan: TransposedPlan, strides, dtypes, spec) -> TransposedPlan:
    """``plan`` with the ``mo`` the cost table prefers, where the output's ``r`` x ``c`` is one
    contiguous block and a whole ``c`` fits a PSUM bank ``mo`` times."""
    R, C = plan.shape[plan.r], plan.shape[plan.c]
    if plan.fold > 1 or plan.m > 1 or plan.width != C or strides[0][plan.r] != C:
        return plan
    widest = max(itemsize(dtypes[i]) for i in plan.transposed)
    best = (transposed_ns(plan, strides, dtypes, spec), plan)
    for mo in (2, 4, 8, 16, 32):
        if R % mo or plan.span % mo or mo * C * widest > spec.psum_bank_bytes:
            continue
        cand = replace(plan, mo=mo)
        best = min(best, (transposed_ns(cand, strides, dtypes, spec), cand), key=lambda x: x[0])
    return best[1]


def _transposed_operands(shape, strides, dtypes, c: int):
    """``(r, operands)``: the inputs contiguous along one dim ``r`` other than ``c`` (the first
    such dim found decides ``r``), or None when there are none or one is not a TensorE dtype."""
    r, transposed = None, []
    for i, st in enumerate(strides[1:], 1):
        if st[c] in (0, 1):
            continue
        ri = next((d for d in range(len(shape)) if st[d] == 1 and shape[d] > 1 and d != c), None)
        if ri is None or (r is not None and ri != r):
            continue  # no contiguous dim of its own (or another one's): read as it is
        if itemsize(dtypes[i]) > 4:
            return None
        r = ri
        transposed.append(i)
    return None if r is None else (r, transposed)


@dataclass(frozen=True)
class _Tile:
    """One load of the transposed operands: ``outer`` index (the folded dim's first index in
    place of its own), ``k`` folded indices, ``r0``/``rn`` the run along ``r``, ``c0``/``cw``."""

    outer: dict
    k: int
    r0: int
    rn: int
    c0: int
    cw: int

    @property
    def rows(self) -> int:
        return self.k * self.rn


def transposed_tiles(plan: TransposedPlan):
    """Every :class:`_Tile` of ``plan``: outer dims, folded groups, runs of ``r``, ``c`` chunks."""
    loop = [d for d in plan.outer if d != plan.g]
    R, C = plan.shape[plan.r], plan.shape[plan.c]
    groups = [(0, 1)] if plan.g is None else [
        (g0, min(plan.fold, plan.shape[plan.g] - g0)) for g0 in range(0, plan.shape[plan.g], plan.fold)]
    for idx in product(*(range(plan.shape[d]) for d in loop)):
        base = dict(zip(loop, idx))
        for g0, k in groups:
            outer = base | ({plan.g: g0} if plan.g is not None else {})
            for r0 in range(0, R, plan.span):
                for c0 in range(0, C, plan.width):
                    yield _Tile(outer, k, r0, min(plan.span, R - r0), c0, min(plan.width, C - c0))


def _offset(st, plan: TransposedPlan, tile: _Tile) -> int:
    return sum(i * st[d] for d, i in tile.outer.items()) + tile.r0 * st[plan.r] + tile.c0 * st[plan.c]


def _row_dims(st, plan: TransposedPlan, tile: _Tile, q0: int, rq: int) -> tuple[int, tuple, tuple]:
    """``(offset, partition dims, leading free dims)`` of rows ``[q0, q0 + rq)`` of a tile (the
    folded dim, then ``r``; ``mo`` consecutive rows a partition)."""
    if tile.k > 1:
        return 0, ((st[plan.g], tile.k), (st[plan.r], tile.rn)), ()
    mo = plan.mo
    return q0 * st[plan.r], ((st[plan.r] * mo, rq // mo),), (((st[plan.r], mo),) if mo > 1 else ())


def subtiles(plan: TransposedPlan, tile: _Tile):
    """``(q0, rq)``: the output tiles of a load, ``rq`` rows each on at most the partition count
    (``mo`` rows a partition)."""
    if tile.k > 1:
        return [(0, tile.rows)]
    step = plan.partitions * plan.mo
    return [(q0, min(step, tile.rn - q0)) for q0 in range(0, tile.rn, step)]


def out_shape(plan: TransposedPlan, tile: _Tile, rq: int) -> tuple[int, int]:
    """The SBUF / PSUM shape of an output tile of ``rq`` rows."""
    return rq // plan.mo, plan.mo * tile.cw


def _chunks(tile: _Tile, partitions: int, m: int):
    """``(j0, cj)``: the ``c`` chunks of a tile read by one DMA each, ``m`` indices a partition."""
    return [(j0, min(partitions * m, tile.cw - j0)) for j0 in range(0, tile.cw, partitions * m)]


def _transposed_load_ap(view: View, st, plan: TransposedPlan, tile: _Tile, j0: int, cj: int) -> View:
    """The HBM region of chunk ``[j0, j0 + cj)`` of ``c``: partitions along ``c``, each the tile's
    rows (folded indices x a contiguous run of ``r``)."""
    ap = AP(view.ap.buffer, view.ap.dtype, view.ap.offset + _offset(st, plan, tile) + j0 * st[plan.c],
            _load_dims(st, plan, tile, cj))
    return View(view.buffer, ap, (cj // plan.m, tile.rows * plan.m))


def _load_dims(st, plan: TransposedPlan, tile: _Tile, cj: int) -> tuple:
    m = plan.m
    free = ((st[plan.g], tile.k),) if tile.k > 1 else ()
    return ((st[plan.c] * m, cj // m),) + free + ((1, m * tile.rn),)


def _block(plan: TransposedPlan, tile: _Tile, pc: int, u: int, v: int, q0: int, rq: int) -> tuple[int, tuple]:
    """``(offset, dims)`` in a chunk's SBUF tile of what one transpose reads: the ``u``-th index
    of each partition's ``m``, rows ``q0 + v``, ``q0 + v + mo``, ... (``v`` < ``mo``) up to ``q0 + rq``."""
    m, rn, mo = plan.m, tile.rn, plan.mo
    fold = ((m * rn, tile.k),) if tile.k > 1 else ()
    last = (mo, rq // mo) if tile.k == 1 else (1, rn)
    return u * rn + q0 + v, ((tile.k * m * rn, pc),) + fold + (last,)


def row_ap(view: View, st, plan: TransposedPlan, tile: _Tile, q0: int, rq: int) -> View:
    """An operand read (or the output written) in the output's layout: rows ``[q0, q0 + rq)`` on
    the partitions, the tile's ``c`` chunk along the free dim."""
    off, head, lead = _row_dims(st, plan, tile, q0, rq)
    ap = AP(view.ap.buffer, view.ap.dtype, view.ap.offset + _offset(st, plan, tile) + off,
            head + lead + ((st[plan.c], tile.cw),))
    return View(view.buffer, ap, out_shape(plan, tile, rq))


def queues(spec):
    """DMA queue ids round-robin: a tile's many transfers issue side by side, as a kernel spreads
    its loads and stores, instead of one after another on one queue per tensor."""
    return cycle(range(spec.dma.queues))


def transpose_in(b: TileBuilder, view: View, st, dtype: str, plan: TransposedPlan, tile: _Tile, site: str,
                 queue) -> list:
    """One transposed operand of ``tile`` as PSUM tiles in the output's layout, one per output
    tile: each ``c`` chunk read as contiguous runs of ``r`` (one DMA, on the next of ``queue``),
    each 128-row block of it transposed on TensorE into its columns of the PSUM tile."""
    P = plan.partitions
    subs = subtiles(plan, tile)
    ps = [b.psum(out_shape(plan, tile, rq), dtype, site=f"{site}.ps{n}") for n, (_, rq) in enumerate(subs)]
    m, mo, cw = plan.m, plan.mo, tile.cw
    for j0, cj in _chunks(tile, P, m):
        pc = cj // m
        t = b.sbuf((pc, tile.rows * m), dtype, site=f"{site}.runs")
        b.dma_copy(t, _transposed_load_ap(view, st, plan, tile, j0, cj), queue=next(queue))
        for u, v in product(range(m), range(mo)):
            for p, (q0, rq) in zip(ps, subs):
                off, dims = _block(plan, tile, pc, u, v, q0, rq)
                rows = rq // mo if tile.k == 1 else rq
                src = View(t.buffer, AP(t.ap.buffer, t.ap.dtype, t.ap.offset + off, dims), (pc, rows))
                dst = View(p.buffer, AP(p.ap.buffer, p.ap.dtype, p.ap.offset + v * cw + j0 + u,
                                        ((mo * cw, rows), (m, pc))), (rows, pc))
                b.transpose(dst, src)
    return ps


def transposed_ns(plan: TransposedPlan, strides, dtypes, spec) -> float:
    """Modeled time of the plan from the cost table, as :func:`~tilescope.lower._layout.plan_ns`
    prices a layout: per tile the transposed operands' loads and TensorE transposes, the other
    operands' loads and the output's store, one VectorE pass per output tile; the DMA, TensorE
    and the engines overlap, so the longest of the three sums."""
    P = plan.partitions
    dma = pe = eng = 0.0
    counts: dict[tuple, int] = {}
    for tile in transposed_tiles(plan):
        key = (tile.k, tile.rn, tile.cw)
        counts[key] = counts.get(key, 0) + 1
    for (k, rn, cw), n in counts.items():
        tile = _Tile({d: 0 for d in plan.outer}, k, 0, rn, 0, cw)
        d = p = e = 0.0
        for i, (st, dt) in enumerate(zip(strides, dtypes)):
            if i in plan.transposed:
                for _, cj in _chunks(tile, P, plan.m):
                    x = AP("x", dt, 0, _load_dims(st, plan, tile, cj))
                    w = tile.rows * plan.m
                    d += _dma_ns(AP("t", dt, 0, ((w, cj // plan.m), (1, w))), x, spec)
                    for q0, rq in subtiles(plan, tile):
                        _, dims = _block(plan, tile, cj // plan.m, 0, 0, q0, rq)
                        rows = prod(c for _, c in dims[1:])
                        tr = Transpose(AP("p", dt, 0, ((cw, rows), (plan.m, cj // plan.m))), AP("t", dt, 0, dims))
                        p += plan.m * plan.mo * (engine_ns(tr, spec) + spec.engines["pe"].ns(load_stationary_cycles(tr)))
                continue
            for q0, rq in subtiles(plan, tile):
                _, head, lead = _row_dims(st, plan, tile, q0, rq)
                load, _ = compact_load(head + lead + ((st[plan.c], cw),), len(head))
                w = prod(c for _, c in load[len(head):])
                parts = prod(c for _, c in head)
                d += _dma_ns(AP("t", dt, 0, ((w, parts), (1, w))), AP("x", dt, 0, load), spec)
        for _, rq in subtiles(plan, tile):
            rows, f = out_shape(plan, tile, rq)
            t = AP("t", "float32", 0, ((f, rows), (1, f)))
            e += engine_ns(TensorTensor(t, t, t, "add"), spec)
        dma, pe, eng = dma + n * d, pe + n * p, eng + n * e
    return max(dma, pe, eng)


def _dma_ns(dst: AP, src: AP, spec) -> float:
    c = dma_cost(DmaCopy(dst, src), spec, "hbm", "sbuf")
    return c.engine_ns(spec) + c.fixed_ns / spec.dma.queues
