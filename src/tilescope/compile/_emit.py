"""Turning planned segments into Programs, through the one tile builder.

A row group's ``[rows, D]`` space is tiled as the eager elementwise lowering tiles an op:
``p`` partitions x ``k`` consecutive rows x ``cw`` columns, narrow rows packed ``k`` to a
partition, rows wider than the SBUF budget cut into column chunks. Every op is computed by its
row of the eager lowering's tables -- :data:`tilescope.lower._elementwise.OPS` for pointwise ops,
the per-tile reduction functions of :mod:`tilescope.lower._reduce` -- over tiles already on chip,
so an op is defined once for both paths; the fuser only decides where operands live and in what
order the tiles go.

With column chunks, a value reduced over the whole row is complete only after the last chunk:
the group then runs in *passes*, each streaming the row's chunks once and recomputing what it
needs from the group's inputs; a max and the sum of ``exp(x - max)`` share one pass (an online
log-sum-exp, as flash attention keeps its softmax statistics). Values that do not fit the SBUF
budget are spilled to an HBM scratch tensor and reloaded (``spill`` provenance labels, counted by
``explain``). Matmul segments stream their output blocks through the same emitter as the
epilogue's tiles (:mod:`._matmul_segment`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import torch
import torch.fx as fx

from ..dtypes import canonical, itemsize
from ..errors import CapacityError
from ..isa import AP, Activation, ActivationReduce
from ..lower.internal import ELEMENTWISE_MAX_FREE as _EW_MAX_FREE
from ..lower.internal import Decline as _Decline
from ..lower.internal import EngineLoad, TileOps, balanced_copy
from ..lower.internal import reductions as red
from ..program import TileBuilder, View
from ._fusion_table import CONSTANTS, MATMULS, REDUCTIONS, VIEWS, is_reduction, named_args, packet_name, row_of
from ._plan import Segment, _tensor_args, node_dtype, node_shape, operand_class, value_class

__all__ = ["emit_segments", "EmitStats"]

TILE_FREE = _EW_MAX_FREE  # elements per partition of a tile of packed narrow rows, as eager tiles
MIN_CHUNK = 512  # narrowest column chunk: one PSUM bank of fp32, one bn_stats group


@dataclass
class EmitStats:
    spilled_values: list[str] = field(default_factory=list)
    spill_bytes: int = 0
    bufs: int = 3
    passes: int = 1  # the most passes over its rows a group took (column chunks and reductions)
    # values a matmul's first pass stores for its later passes (the logits of a projection's
    # log-softmax, written once instead of the product made again)
    kept_values: list[str] = field(default_factory=list)
    kept_bytes: int = 0


def _dt(torch_dtype) -> str:
    return canonical(torch_dtype if torch_dtype != torch.bool else "uint8")


class _Unfusable(Exception):
    pass


@dataclass
class _Val:
    kind: str  # row | rowvec | colvec | scalar | const (periodic and strided inputs: row values once loaded)
    dtype: str
    tile: View | None = None
    const: float | None = None
    spill: View | None = None  # HBM scratch holding a spilled row value
    act: int | None = None  # index of the one activation that produced it (activation_reduce)


@dataclass(frozen=True)
class _Block:
    """One tile of a row group: ``p`` partitions x ``k`` consecutive rows from row ``r0``, columns
    ``c0 .. c0 + cw``, on a device of ``lanes`` partitions (broadcast values fill them all)."""

    r0: int
    p: int
    k: int
    c0: int
    cw: int
    lanes: int

    def shape(self, kind: str) -> tuple[int, int]:
        return {"row": (self.p, self.k * self.cw), "periodic": (self.p, self.k * self.cw),
                "strided": (self.p, self.k * self.cw), "rowvec": (self.p, self.k),
                "colvec": (self.lanes, self.cw), "scalar": (self.lanes, 1)}[kind]


def _row_blocks(rows: int, k_max: int, lanes: int, fits=None):
    """``(r0, p, k)`` covering ``rows``: ``p <= lanes`` partitions of ``k`` consecutive rows (as
    TilePlan); ``fits(k)``: the row counts a partition may hold (1 always does)."""
    r = 0
    while r < rows:
        left = rows - r
        k = min(k_max, -(-left // lanes))
        while fits is not None and k > 1 and not fits(k):
            k -= 1
        p = min(lanes, left // k)
        yield r, p, k
        r += p * k


def _matmul_operands(node: fx.Node) -> tuple:
    """The two matrices of a matmul node (addmm's bias is an epilogue operand)."""
    return tuple(node.args[1:3]) if packet_name(node.target) == "addmm" else tuple(node.args[:2])


def _region(handle: View, kind: str, blk: _Block, d: int) -> View:
    """The HBM region of a value of ``kind`` (stored as [rows, d], [rows, 1], [1, d] or [1, 1]) that
    tile ``blk`` reads or writes; broadcast values are read into all the device's partitions."""
    ap = handle.ap
    if kind == "row":
        dims, off, shape = ((blk.k * d, blk.p), (d, blk.k), (1, blk.cw)), blk.r0 * d + blk.c0, (blk.p, blk.k, blk.cw)
    elif kind == "rowvec":
        dims, off, shape = ((blk.k, blk.p), (1, blk.k)), blk.r0, (blk.p, blk.k)
    elif kind == "colvec":
        dims, off, shape = ((0, blk.lanes), (1, blk.cw)), blk.c0, (blk.lanes, blk.cw)
    else:
        dims, off, shape = ((0, blk.lanes), (1, 1)), 0, (blk.lanes, 1)
    dims = dims[:1] + tuple(dm for dm in dims[1:] if dm[1] != 1) or dims[:1] + ((1, 1),)
    return View(handle.buffer, AP(ap.buffer, ap.dtype, ap.offset + off, dims), shape)


def row_layout(operand, out_shape, d: int):
    """The leading dims of ``operand`` read as rows of an ``[rows, d]`` block shaped
    ``out_shape``: ``[(size, stride)]``, outer first, adjacent dims merged where their strides
    allow (a contiguous operand is one dim: ``[(rows, d)]``); broadcast dims have stride 0.
    None if its rows are not laid out so (a last dim that is not contiguous, negative strides)."""
    val = operand.meta.get("val") if isinstance(operand, fx.Node) else None
    if not isinstance(val, torch.Tensor) or not out_shape or out_shape[-1] != d:
        return None
    shape, strides = list(val.shape), list(val.stride())
    if not shape or (shape[-1] != 1 and strides[-1] != 1) or any(st < 0 for st in strides):
        return None
    pad = len(out_shape) - len(shape)
    if pad < 0:
        return None
    shape, strides = [1] * pad + shape, [0] * pad + strides
    dims = []
    for size, n, st in zip(out_shape[:-1], shape[:-1], strides[:-1]):
        if size == 1:
            continue
        st = 0 if n == 1 else st
        if dims and dims[-1][1] == size * st:  # merge: the outer dim steps over the whole inner one
            dims[-1] = (dims[-1][0] * size, st)
        else:
            dims.append((size, st))
    return dims or [(1, d)]


def layout_span(dims, d: int) -> int:
    """Elements from a strided operand's first to its last (the HBM buffer it is read from)."""
    return 1 + sum((n - 1) * st for n, st in dims) + d - 1


def _digits(x: int, sizes) -> list[int]:
    """``x`` in the mixed radix ``sizes`` (outer first)."""
    out = []
    for n in reversed(sizes):
        x, dgt = divmod(x, n)
        out.append(dgt)
    return out[::-1]


def split_rows(dims, k: int):
    """How partitions of ``k`` consecutive rows lie in a layout ``dims`` (:func:`row_layout`):
    ``(partition levels, levels within a partition)``, each ``[(size, stride)]`` outer first,
    when ``k`` is whole inner dims times a divisor of the next one (3 heads of a token; its
    [qkv, heads] block of 9); None when a partition's rows would cross a dim's end.

    >>> split_rows([(4, 37824), (197, 64), (3, 12608)], 3)
    ([(4, 37824), (197, 64)], [(12608, 3)])
    >>> split_rows([(197, 64), (3, 151296), (3, 12608)], 9)
    ([(197, 64)], [(151296, 3), (12608, 3)])
    >>> split_rows([(2, 151296), (12, 12608)], 4)
    ([(2, 151296), (3, 50432)], [(12608, 4)])
    >>> split_rows([(197, 64), (3, 12608)], 2) is None
    True
    """
    inner, lvl = 1, len(dims) - 1
    while lvl >= 0 and k % (inner * dims[lvl][0]) == 0:
        inner *= dims[lvl][0]
        lvl -= 1
    j = k // inner
    if (lvl < 0 and j != 1) or (lvl >= 0 and dims[lvl][0] % j):
        return None
    within = [(st, n) for n, st in dims[lvl + 1:]]
    if lvl < 0:
        return [], within
    n, st = dims[lvl]
    return list(dims[:lvl]) + [(n // j, j * st)], [(st, j)] * (j > 1) + within


def _row_pieces(tile: View, handle: View, blk: _Block, d: int, dims):
    """(tile part, HBM region) pairs that fill ``tile`` (``blk``'s rows) from an operand laid out
    as ``dims`` (:func:`row_layout`).

    Where a partition's ``k`` rows are whole inner dims (:func:`split_rows`), partitions are
    numbered in the mixed radix of the dims left: one transfer covers as many partitions as one
    box of that radix holds -- the heads of 128 tokens of ViT's head merge in one multi-dim
    access pattern. A partition whose rows cross a dim's end is read run by run."""
    ap, k, cw = handle.ap, blk.k, blk.cw
    inner_n, inner_st = dims[-1]
    split = split_rows(dims, k)

    def offset(r: int) -> int:
        off = 0
        for n, st in reversed(dims):
            r, i = divmod(r, n)
            off += i * st
        return off

    def region(r: int, dm, within, parts: int, n: int) -> View:
        dm = tuple(dm) + tuple(within) + ((1, cw),)
        dm = dm[:1] + tuple(x for x in dm[1:] if x[1] != 1) or dm[:1] + ((1, 1),)
        return View(handle.buffer, AP(ap.buffer, ap.dtype, ap.offset + offset(r) + blk.c0, dm), (parts, n, cw))

    i = 0
    while i < blk.p:
        r = blk.r0 + i * k
        if split is not None and r % k == 0:
            levels, within = split
            sizes, steps = [n for n, _ in levels] or [1], [st for _, st in levels] or [0]
            left, dg = blk.p - i, _digits(r // k, sizes)
            lvl, span = len(sizes) - 1, 1
            while lvl > 0 and dg[lvl] == 0 and left >= span * sizes[lvl]:  # whole boxes of the inner levels
                span *= sizes[lvl]
                lvl -= 1
            c = min(left // span, sizes[lvl] - dg[lvl])
            dm = [(steps[lvl], c)] + [(steps[j], sizes[j]) for j in range(lvl + 1, len(sizes))]
            yield tile[i:i + c * span], region(r, dm, within, c * span, k)
            i += c * span
            continue
        j = 0  # this partition's rows cross a dim's end: read run by run
        while j < k:
            n = min(k - j, inner_n - (r + j) % inner_n)
            yield tile[i:i + 1, j * cw:(j + n) * cw], region(r + j, [(n * inner_st, 1)], [(inner_st, n)], 1, n)
            j += n
        i += 1


def _as_operand(v: _Val, out_kind: str, blk: _Block):
    """Value ``v`` as an operand of an op whose result is ``out_kind``: a number, the value's
    tile, or a stride-0 view broadcasting it over the result's tile."""
    if v.kind == "const":
        return v.const
    t = v.tile
    if v.kind == out_kind:
        return t
    p, k, cw = blk.p, blk.k, blk.cw
    ps = t.ap.dims[0][0]  # the tile's partition stride (a block of a wider tile keeps its own)
    if out_kind == "row":
        shape = (p, k * cw)
        dims = {"rowvec": ((ps, p), (1, k), (0, cw)), "colvec": ((ps, p), (0, k), (1, cw)),
                "scalar": ((ps, p), (0, k * cw))}.get(v.kind)
    elif out_kind == "rowvec" and v.kind == "scalar":
        shape, dims = (p, k), ((ps, p), (0, k))
    elif out_kind == "colvec" and v.kind == "scalar":
        shape, dims = (blk.lanes, cw), ((ps, blk.lanes), (0, cw))
    else:
        dims = None
    if dims is None:
        raise _Unfusable(f"a {v.kind} value cannot be an operand of a {out_kind} result")
    return View(t.buffer, AP(t.ap.buffer, t.ap.dtype, t.ap.offset, dims), shape)


def _fold(node: fx.Node, env: dict) -> float:
    """An op of constants, computed once at compile time."""
    def conv(a):
        if isinstance(a, fx.Node):
            return torch.tensor(env[a].const, dtype=node_dtype(a) or torch.float32)
        return a

    kwargs = {k: conv(v) for k, v in node.kwargs.items() if k != "device"}
    return float(node.target(*(conv(a) for a in node.args), **kwargs))


def _reduction_params(node: fx.Node):
    """(engine reduce op, post-processing, order or correction) of a fused reduction node."""
    name = packet_name(node.target)
    red_op, post = REDUCTIONS[name]
    named = named_args(node)
    extra = None
    if post in ("var", "std"):
        extra = named.get("correction")
        if extra is None:
            extra = 1 if named.get("unbiased", True) is not False else 0
    elif post == "norm":
        order = named.get("ord", 2)
        order = 2 if order is None else order
        red_op, post = red._NORMS.get(order, ("add", "pnorm"))
        extra = float(order)
    return red_op, post, extra


def strided_input(node, rows: int, d: int) -> bool:
    """A row block stored with gaps or in another order of its leading dims (a transposed
    head layout, a slice of the last dim): the group reads it where it is, by its strides,
    instead of a copy making it contiguous first."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.is_contiguous() or value_class(tuple(val.shape), rows, d) != "row":
        return False
    return row_layout(node, tuple(val.shape), d) is not None


class _RowGroup:
    """Emits one row group (or the epilogue of a matmul segment, block by block)."""

    def __init__(self, b: TileBuilder, seg: Segment, hbm: dict, budget: int, stats: EmitStats):
        self.b = b
        self.seg = seg
        self.hbm = hbm
        self.budget = budget
        self.stats = stats
        self.rows, self.d = seg.space
        self.lanes = b.spec.partitions  # the device preset's partitions
        self.nodes = list(seg.nodes)
        self.products: dict = {}  # matmul node -> its product in PSUM, per output block
        self.load = EngineLoad(b)
        # the inputs the group's ops read (a matmul's operands are the GEMM's, not the epilogue's)
        gemm_operands = {(n, a) for n in self.nodes if packet_name(n.target) in MATMULS
                         for a in _matmul_operands(n)}
        used = {a for n in self.nodes for a in _tensor_args(n) if (n, a) not in gemm_operands}
        self.inputs = [a for a in seg.inputs if a in used]
        self.cls: dict = {}
        for n in self.nodes:
            self.cls[n] = self._classify(n)
        for n in self.inputs:
            self.cls[n] = self._classify_input(n)
        # how periodic and strided inputs lay out their rows; tiles then hold whole runs of them
        self.layouts = {n: self._layout(n) for n in self.inputs if self.cls[n] in ("periodic", "strided")}
        self.outputs = list(seg.outputs)
        self.once: dict = {}  # values loaded or computed once for the whole group
        self.colvec_full: dict = {}  # matmul epilogues: colvec inputs held whole, sliced per block
        self._live_row_bytes = 0
        self._next_queue = 0  # the DMA queue of the next piece of a strided or periodic load

    # ---- classification and tiling ----------------------------------------------------------
    def _classify(self, node) -> str:
        if isinstance(node, fx.Node) and node.op == "call_function" and is_reduction(packet_name(node.target)):
            return "rowvec"
        cls = value_class(node_shape(node), self.rows, self.d)
        if cls is None:
            raise _Unfusable(f"{node.name} of shape {node_shape(node)} does not fit the [{self.rows}, {self.d}] space")
        return cls

    def _classify_input(self, node) -> str:
        """An input's class as its readers see it: broadcast into a row result, torch aligns
        trailing dims (a periodic block; per-row values only with a last dim of 1)."""
        seen = {operand_class(n, node, self.rows, self.d) for n in self.nodes if node in _tensor_args(n)}
        if "periodic" in seen:
            return "periodic"
        cls = self._classify(node)
        if cls == "row" and self.seg.kind == "rowgroup" and strided_input(node, self.rows, self.d):
            return "strided"
        return cls

    def _layout(self, node):
        reader = next((n for n in self.nodes if node in _tensor_args(n) and self.cls[n] == "row"), node)
        return row_layout(node, node_shape(reader), self.d)

    def _peak_row_values(self) -> int:
        last = {}
        for k, n in enumerate(self.nodes):
            for a in _tensor_args(n):
                last[a] = k
        for o in self.outputs:
            last[o] = len(self.nodes)
        live = {a for a in self.inputs if self.cls.get(a) in ("row", "periodic", "strided")}
        peak = len(live)
        for k, n in enumerate(self.nodes):
            if self.cls[n] == "row" and packet_name(n.target) not in VIEWS:
                live.add(n)
            peak = max(peak, len(live))
            live = {v for v in live if last.get(v, -1) > k}
        return max(1, peak)

    def _tiling(self) -> tuple[int, int]:
        """(k, cw): rows per partition and column chunk width of this group's tiles.

        Rows of at least MIN_CHUNK elements make efficient tiles one per partition (and keep
        ``bn_stats`` usable); narrower ones are packed ``k`` to a partition, up to the eager
        lowering's tile size. Rows wider than the budget are cut into column chunks."""
        per_elem = 4 * self._peak_row_values()  # engines compute in fp32
        d = max(self.d, 1)
        if d * per_elem > self.budget:
            cw = max(MIN_CHUNK, self.budget // per_elem // MIN_CHUNK * MIN_CHUNK)
            return 1, min(cw, d)
        if d >= MIN_CHUNK:
            return 1, d
        k = min(max(1, TILE_FREE // d), max(1, self.budget // (d * per_elem)), max(1, -(-self.rows // self.lanes)))
        if self.layouts:  # whole inner dims of every strided input: no partition's rows cross a dim's end
            k = max(j for j in range(1, k + 1) if self._fits(j))
        return k, d

    def _fits(self, k: int) -> bool:
        return all(split_rows(dims, k) is not None for dims in self.layouts.values())

    # ---- memory: spills of row values --------------------------------------------------------
    def _row_live(self, env) -> int:
        return sum(v.tile.ap.free_size * itemsize(v.dtype) for v in env.values()
                   if v.kind == "row" and v.tile is not None and v.tile.buffer.memory == "sbuf")

    def _next_use(self, node) -> int:
        later = [u for u in self.uses.get(node, ()) if u >= self.pos]
        return later[0] if later else 10**9

    def _make_room(self, env, need: int, blk: _Block) -> None:
        while self._row_live(env) + need > self.budget:
            victims = [(self._next_use(n), n.name, n) for n, v in env.items()
                       if v.kind == "row" and v.tile is not None and v.tile.buffer.memory == "sbuf"
                       and self._next_use(n) > self.pos]
            if not victims:
                return
            _, _, node = max(victims, key=lambda t: (t[0], t[1]))
            v = env[node]
            if self._next_use(node) >= 10**9:
                v.tile = None  # dead: nothing to save
                continue
            if v.spill is None:
                if node not in self._spills:
                    self._spills[node] = self.b.scratch((self.rows, self.d), v.dtype, name=f"spill_{node.name}")
                    self.stats.spilled_values.append(node.name)
                v.spill = self._spills[node]
            with self.b.provenance(label="spill"):
                self.b.dma_copy(_region(v.spill, "row", blk, self.d), v.tile)
            self.stats.spill_bytes += v.tile.ap.free_size * blk.p * itemsize(v.dtype)
            v.tile = None

    def _new_tile(self, env, node, shape, dtype: str, blk: _Block, kind: str):
        if kind == "row":
            self._make_room(env, shape[1] * itemsize(dtype), blk)
        return self.b.sbuf(shape, dtype, site=f"n:{node.name}")

    def _get(self, env, node, blk: _Block) -> _Val:
        """The value of ``node`` in this tile: computed, loaded on first use, or reloaded."""
        v = env.get(node)
        if v is None:
            v = env[node] = self._load(node, blk)
        if v.tile is None and v.kind != "const":
            self._make_room(env, blk.k * blk.cw * itemsize(v.dtype), blk)
            t = self.b.sbuf(blk.shape("row"), v.dtype, site=f"reload:{node.name}")
            with self.b.provenance(label="spill reload", fx_node=node.name):
                self.b.dma_copy(t, _region(v.spill, "row", blk, self.d))
            v.tile = t
        return v

    def _load(self, node, blk: _Block) -> _Val:
        """An input of the group: its tile of ``blk`` from HBM (broadcast ones: one value per row
        or per column, widened on chip by stride-0 operands)."""
        if node not in self.hbm:
            raise _Unfusable(f"{node.name} is used before it is computed")
        kind = self.cls[node]
        dt = _dt(node_dtype(node))
        full = self.colvec_full.get(node)
        if full is not None:  # held whole: this block's columns
            return _Val("colvec", dt, full[:, blk.c0:blk.c0 + blk.cw])
        site = f"in:{node.name}"
        if kind in ("row", "periodic", "strided"):
            env_need = blk.k * blk.cw * itemsize(dt)
            self._make_room(self._env, env_need, blk)
        t = self.b.sbuf(blk.shape(kind), dt, site=site)
        if kind in ("periodic", "strided"):
            pieces = list(_row_pieces(t, self.hbm[node], blk, self.d, self.layouts[node]))
            # the pieces fill different partitions of one tile: dealt round-robin over the DMA
            # queues (across tiles too), as a kernel does, they issue in parallel instead of one
            # after another on one queue
            queues = self.b.spec.dma.queues if len(pieces) > 1 else 0
            with self.b.provenance(label=f"load ({kind})", fx_node=node.name):
                for dst, src in pieces:
                    self.b.dma_copy(dst, src, queue=self._next_queue % queues if queues else None)
                    self._next_queue += 1 if queues else 0
            return _Val("row", dt, t)
        label = "load" if kind in ("row", "rowvec") else "load (broadcast)"
        with self.b.provenance(label=label, fx_node=node.name):
            self.b.dma_copy(t, _region(self.hbm[node], kind, blk, self.d))
        return _Val(kind, dt, t)

    def _store(self, env, node, blk: _Block) -> None:
        v = self._get(env, node, blk)
        kind = self.cls[node]
        dt = _dt(node_dtype(node))
        t = v.tile
        with self.b.provenance(label="store", fx_node=node.name):
            if v.kind == "const":
                t = self.b.sbuf(blk.shape(kind), dt, site=f"c:{node.name}")
                self.b.memset(t, v.const)
            elif t.buffer.memory == "psum" or t.dtype != dt:
                c = self.b.sbuf(blk.shape(kind), dt, site=f"evac:{node.name}")
                balanced_copy(self.b, self.load, c, t)
                t = c
            elif v.kind != kind:
                raise _Unfusable(f"{node.name} is stored as a {kind} value but holds a {v.kind} one")
            if kind in ("colvec", "scalar"):
                if blk.r0 != 0:
                    return
                t = t[0:1]
                dst = _region(self.hbm[node], kind, blk, self.d)
                dst = View(dst.buffer, AP(dst.ap.buffer, dst.ap.dtype, dst.ap.offset, dst.ap.dims[1:]),
                           dst.shape[1:])
                self.b.dma_copy(dst, View(t.buffer, AP(t.ap.buffer, t.ap.dtype, t.ap.offset, t.ap.dims[1:]),
                                          t.shape[1:]))
                return
            self.b.dma_copy(_region(self.hbm[node], kind, blk, self.d), t)

    # ---- one node -----------------------------------------------------------------------------
    def _emit_node(self, env, node, blk: _Block) -> _Val:
        name = packet_name(node.target)
        kind = self.cls[node]
        dt = _dt(node_dtype(node))
        if node in self.products:
            product = self.products[node]
            if name != "addmm":
                return product
            bias = self._get(env, node.args[0], blk)  # addmm: bias + product (alpha = beta = 1)
            return self._apply_row(env, node, row_of("add"), {"alpha": 1}, {"self": product, "other": bias},
                                   blk, kind, dt)
        if name in VIEWS:
            src = self._get(env, node.args[0], blk)
            same = src.kind == kind or {src.kind, kind} <= {"rowvec", "scalar"} and blk.p * blk.k == 1
            if src.kind != "const" and not same and name == "expand" and kind == "row" \
                    and src.kind in ("rowvec", "colvec", "scalar"):
                return _Val("row", src.dtype, _as_operand(src, "row", blk))  # a stride-0 view of it
            if src.kind != "const" and not same:
                err = _Unfusable(f"a view that changes the row layout (a {src.kind} value viewed as a {kind} one)")
                err.node = node  # the view is left out (free on the device), not the group's first op
                raise err
            return src
        if name in CONSTANTS:
            where = CONSTANTS[name]
            return _Val("const", dt, const=float(node.args[where] if isinstance(where, int) else where))
        if is_reduction(name):
            return self._reduce_whole(env, node, blk)
        row = row_of(name)
        if row is None:
            raise _Unfusable(f"no fusion rule for aten.{name}")
        args = named_args(node)
        operands = {k: self._get(env, v, blk) for k, v in args.items() if isinstance(v, fx.Node)}
        if operands and all(v.kind == "const" for v in operands.values()):
            return _Val("const", dt, const=_fold(node, env))
        return self._apply_row(env, node, row, args, operands, blk, kind, dt)

    def _apply_row(self, env, node, row, args, operands, blk, kind, dt) -> _Val:
        """Run the op's shared row over this tile's operands into a new tile."""
        shape = blk.shape(kind)
        dst = self._new_tile(env, node, shape, dt, blk, kind)
        args = dict(args)
        for k, v in operands.items():
            args[k] = _as_operand(v, kind, blk)
        start = self.b.instruction_count
        try:
            ok = row[1](TileOps(self.b, dst, shape, load=self.load, site=f"n:{node.name}"), args)
        except _Decline as e:
            raise _Unfusable(str(e)) from e
        if ok is False:
            raise _Unfusable(f"the aten.{packet_name(node.target)} row does not handle these operands")
        if isinstance(ok, View):  # the result is an operand's tile as it is
            return _Val(kind, dt, ok)
        act = None
        if self.b.instruction_count == start + 1:
            instr = self.b.instruction(start)
            if type(instr) is Activation and instr.dst.buffer == dst.buffer and not instr.accumulate:
                act = start
        return _Val(kind, dt, dst, act=act)

    def _reduce_whole(self, env, node, blk: _Block) -> _Val:
        """A reduction over rows held whole in the tile."""
        src = self._get(env, node.args[0], blk)
        if src.kind != "row":
            raise _Unfusable(f"a reduction over a {src.kind} value")
        red_op, post, extra = _reduction_params(node)
        out_dt = _dt(node_dtype(node))
        p, k, cw = blk.p, blk.k, blk.cw
        acc = self.b.sbuf((p, k), "float32", site=f"acc:{node.name}")
        if post in ("var", "std"):
            if k == 1:
                stats = red.bn_stats_tile(self.b, p, cw, site=f"acc:{node.name}")
                red.bn_stats_into(self.b, stats, src.tile, 0)
                red.variance_from_stats(self.b, acc, stats, cw, extra, post)
            else:
                red.variance_two_pass(self.b, acc, src.tile, (p, k, cw), cw, extra, post)
        elif not self._reduce_in_activation(node, src, acc, red_op, post, k):
            red.reduce_chunk(self.b, acc, src.tile, (p, k, cw), red_op, post, extra, site=f"acc:{node.name}")
        res = red.finish_reduction(self.b, acc, post, cw, extra, out_dt, site=f"acc:{node.name}")
        return _Val("rowvec", out_dt, res)

    def _reduce_in_activation(self, node, src: _Val, acc, red_op, post, k) -> bool:
        """The value's only use is this reduction and one activation made it: ScalarE reduces
        while it computes (activation_reduce) instead of a second pass over the tile."""
        producer = node.args[0]
        if (src.act is None or k != 1 or red_op not in ("add", "max", "min") or post not in (None, "mean")
                or len(self.uses.get(producer, ())) != 1 or producer in self.outputs):
            return False
        act = self.b.instruction(src.act)
        self.b.replace(src.act, ActivationReduce(act.dst, act.src, act.func, acc.ap, red_op, act.scale, act.bias))
        return True

    # ---- drivers ------------------------------------------------------------------------------
    def _set_order(self, nodes) -> None:
        order = {n: k for k, n in enumerate(nodes)}
        self.uses = {}
        for n in nodes:
            for a in _tensor_args(n):
                self.uses.setdefault(a, []).append(order[n])
        for n in self.outputs:
            self.uses.setdefault(n, []).append(len(nodes))
        self.pos = 0

    def emit(self) -> None:
        """The whole group: one pass per row tile when rows fit, else passes over column chunks."""
        self._spills: dict = {}
        if self.d < MIN_CHUNK and not any(is_reduction(packet_name(n.target)) for n in self.nodes) \
                and all(c in ("row", "scalar") for c in self.cls.values()):
            # pointwise work on whole rows only: any split of the elements into rows computes
            # the same thing, so tile the flat elements as the eager lowering does
            self.rows, self.d = self.rows * self.d, 1
        k, cw = self._tiling()
        if cw >= self.d:
            self._emit_whole_rows(k)
        else:
            self._emit_chunked(cw)

    def _hoist(self, nodes, blk: _Block) -> list:
        """Compute once, before the row loop, the values that do not depend on the rows
        (column-broadcast vectors and scalars); returns the nodes left for every row tile."""
        left = []
        for n in nodes:
            ins = [a for a in _tensor_args(n)]
            if self.cls[n] in ("colvec", "scalar") and all(
                    (a in self.once) or (a in self.inputs and self.cls[a] in ("colvec", "scalar")) for a in ins):
                for a in ins:
                    if a not in self.once:
                        self.once[a] = self._load(a, blk)
                with self.b.provenance(op=f"aten::{packet_name(n.target)}", fx_node=n.name):
                    self.once[n] = self._emit_node(self.once, n, blk)
            else:
                left.append(n)
        for a in self.inputs:
            if self.cls[a] in ("colvec", "scalar") and a not in self.once:
                self.once[a] = self._load(a, blk)
        return left

    def _emit_whole_rows(self, k_max: int) -> None:
        first = _Block(0, self.lanes, 1, 0, self.d, self.lanes)
        self._env = {}
        nodes = self._hoist(self.nodes, first)
        for o in self.outputs:
            if o in self.once:
                self._store(self.once, o, first)
        self._set_order(nodes)
        for r0, p, k in _row_blocks(self.rows, k_max, self.lanes, self._fits if self.layouts else None):
            blk = _Block(r0, p, k, 0, self.d, self.lanes)
            self.emit_block(blk, nodes)

    def emit_block(self, blk: _Block, nodes=None) -> None:
        """One tile: every node in order, then the group's outputs stored (a matmul calls this per
        output block, with its product in ``self.products``)."""
        if nodes is None:
            nodes = self.nodes
            if not hasattr(self, "uses"):
                self._set_order(nodes)
                self._spills = {}
        env = self._env = dict(self.once)
        for a in self.inputs:  # row inputs up front: their loads overlap the first compute
            if self.cls[a] in ("row", "periodic", "strided") and a not in env:
                env[a] = self._load(a, blk)
        for pos, node in enumerate(nodes):
            self.pos = pos
            if node in env:
                continue
            with self.b.provenance(op=f"aten::{packet_name(node.target)}", fx_node=node.name):
                env[node] = self._emit_node(env, node, blk)
        self.pos = len(nodes)
        for o in self.outputs:
            if o not in self.once:
                self._store(env, o, blk)

    # ---- rows cut into column chunks ----------------------------------------------------------
    def _plan_passes(self):
        """Pass of each node: a reduction over the row is complete only after the pass that
        streamed its source; what uses it runs in a later pass (recomputing from the inputs)."""
        pass_of, ready, online = {}, {}, {}
        for a in self.inputs:
            pass_of[a] = ready[a] = 0
        for n in self.nodes:
            ins = _tensor_args(n)
            if packet_name(n.target) in MATMULS:  # a product: made by the GEMM in each pass that needs it
                pass_of[n] = ready[n] = 0
            elif is_reduction(packet_name(n.target)):
                src = n.args[0]
                pass_of[n] = pass_of[src]
                ready[n] = pass_of[src] + 1
                pair = self._online_pair(n)
                if pair is not None:
                    online[n] = pair
                    pass_of[n] = pass_of[pair[0]]
                    ready[n] = ready[pair[0]]
            elif self.cls[n] in ("row", "colvec"):
                pass_of[n] = max([pass_of[a] if self.cls[a] in ("row", "colvec") else ready[a] for a in ins],
                                 default=0)
                ready[n] = pass_of[n]
            else:
                ready[n] = pass_of[n] = max([ready[a] for a in ins], default=0)
        return pass_of, ready, online

    def _online_pair(self, node):
        """``sum(exp(x - amax(x)))`` over the row: (the amax node, x, the sub node, the exp node),
        so the sum is kept with a running max in the amax's own pass."""
        if packet_name(node.target) != "sum":
            return None
        e = node.args[0]
        if not (isinstance(e, fx.Node) and e in self.cls and e.op == "call_function"
                and packet_name(e.target) == "exp"):
            return None
        s = e.args[0]
        if not (isinstance(s, fx.Node) and s in self.cls and s.op == "call_function"
                and packet_name(s.target) == "sub" and named_args(s).get("alpha", 1) == 1):
            return None
        x, m = s.args[0], s.args[1]
        if not (isinstance(m, fx.Node) and m in self.cls and m.op == "call_function"
                and packet_name(m.target) == "amax" and m.args[0] is x and self.cls.get(x) == "row"):
            return None
        return m, x, s, e

    def plan_passes(self):
        """(nodes of each pass, pass of each node, when each value is complete, online pairs,
        passes, the last pass a per-row value completes in) of a group streaming its rows in
        column chunks (or a matmul's output blocks)."""
        pass_of, ready, online = self._plan_passes()
        row_nodes = [n for n in self.nodes if self.cls[n] in ("row", "colvec") or is_reduction(packet_name(n.target))]
        n_passes = 1 + max([pass_of[n] for n in row_nodes], default=0)
        last_ready = max([ready[n] for n in self.nodes], default=0)
        self.stats.passes = max(self.stats.passes, n_passes)
        per_pass = []
        for s in range(n_passes):
            roots = {n for n in self.nodes if pass_of[n] == s and (
                (self.cls[n] in ("row", "colvec") and n in self.outputs))}
            reductions = [n for n in self.nodes if is_reduction(packet_name(n.target)) and pass_of[n] == s
                          and n not in online]
            roots |= {n.args[0] for n in reductions}
            need = set(roots)
            for n in reversed(self.nodes):
                if n in need and not is_reduction(packet_name(n.target)):
                    need |= {a for a in _tensor_args(n) if a in self.cls and self.cls[a] in ("row", "colvec")
                             and a not in self.inputs}
            need |= set(reductions)
            per_pass.append([n for n in self.nodes if n in need and (
                is_reduction(packet_name(n.target)) or self.cls[n] in ("row", "colvec"))])
        return per_pass, pass_of, ready, online, n_passes, last_ready

    def per_row_values(self, persist: dict, ready: dict, s: int, first: _Block) -> None:
        """The per-row values whose inputs are complete after pass ``s`` (stored if outputs)."""
        self._set_order([])
        for n in self.nodes:
            if self.cls[n] in ("rowvec", "scalar") and not is_reduction(packet_name(n.target)) and ready[n] == s:
                self._env = persist
                with self.b.provenance(op=f"aten::{packet_name(n.target)}", fx_node=n.name):
                    persist[n] = self._emit_node(persist, n, first)
                if n in self.outputs:
                    self._store(persist, n, first)

    def stream_chunk(self, nodes, persist: dict, blk: _Block, accs: dict, plan, s: int, loads=()) -> None:
        """Pass ``s``'s nodes over one column chunk: values, reductions accumulated into ``accs``,
        the pass's row outputs stored; ``loads``: values an earlier pass stored, read back."""
        _, pass_of, _, online, _, _ = plan
        partners = {pair[0]: r for r, pair in online.items()}  # amax -> the sum kept with it
        env = self._env = dict(persist)
        for a in loads:
            env[a] = self._load(a, blk)
        for pos, node in enumerate(nodes):
            self.pos = pos
            with self.b.provenance(op=f"aten::{packet_name(node.target)}", fx_node=node.name):
                if is_reduction(packet_name(node.target)):
                    if node in online:
                        continue  # kept with its amax
                    self._accumulate(env, node, blk, accs, partners.get(node), online)
                else:
                    env[node] = self._emit_node(env, node, blk)
        self.pos = len(nodes)
        for o in self.outputs:
            if o in env and self.cls[o] in ("row", "colvec") and pass_of[o] == s:
                self._store(env, o, blk)

    def finish_pass(self, persist: dict, accs: dict, first: _Block) -> None:
        """The reductions a pass completed, into the per-row values (stored if outputs)."""
        for node, state in accs.items():
            with self.b.provenance(op=f"aten::{packet_name(node.target)}", fx_node=node.name):
                persist[node] = self._finish(node, state)
            if node in self.outputs:
                self._store(persist, node, first)

    def _emit_chunked(self, cw: int) -> None:
        chunks = [(c0, min(cw, self.d - c0)) for c0 in range(0, self.d, cw)]
        plan = self.plan_passes()
        per_pass, _, ready, _, n_passes, last_ready = plan
        for r0, p, _ in _row_blocks(self.rows, 1, self.lanes):
            persist: dict = {}
            for s in range(last_ready + 1):
                first = _Block(r0, p, 1, 0, chunks[0][1], self.lanes)
                self.per_row_values(persist, ready, s, first)
                if s >= n_passes:
                    continue
                self._set_order(per_pass[s])
                accs: dict = {}
                for c0, w in chunks:
                    self.stream_chunk(per_pass[s], persist, _Block(r0, p, 1, c0, w, self.lanes), accs, plan, s)
                self.finish_pass(persist, accs, first)

    def _accumulate(self, env, node, blk: _Block, accs: dict, partner, online) -> None:
        """Add one column chunk to a reduction over the row (and to the sum kept with an amax)."""
        src = self._get(env, node.args[0], blk)
        red_op, post, extra = _reduction_params(node)
        p, cw = blk.p, blk.cw
        first = node not in accs
        b = self.b
        site = f"acc:{node.name}"
        if post in ("var", "std"):
            if first:
                accs[node] = {"stats": red.bn_stats_tile(b, p, self.d, site=site)}
            red.bn_stats_into(b, accs[node]["stats"], src.tile, blk.c0)
            return
        if partner is None:
            if first:
                accs[node] = {"acc": b.sbuf((p, 1), "float32", site=site)}
            red.reduce_chunk(b, accs[node]["acc"], src.tile, (p, 1, cw), red_op, post, extra, first=first, site=site)
            return
        # online log-sum-exp: the running max m and the sum s of exp(x - m), rescaled when m grows
        _, _, sub, exp = online[partner]
        m_new = b.sbuf((p, 1), "float32", site=site)
        if first:
            b.tensor_reduce(m_new, src.tile, "max")
        else:
            m_old, s_old = accs[node]["acc"], accs[partner]["acc"]
            part = b.sbuf((p, 1), "float32", site=f"{site}.part")
            b.tensor_reduce(part, src.tile, "max")
            b.tensor_tensor(m_new, m_old, part, "maximum")
            corr = b.sbuf((p, 1), "float32", site=f"{site}.corr")
            b.tensor_tensor(corr, m_old, m_new, "subtract")
            b.activation(corr, corr, "exp")
            b.tensor_tensor(s_old, s_old, corr, "multiply")
        accs[node] = {"acc": m_new}
        m_val = _Val("rowvec", "float32", m_new)
        shifted = self._apply_row(env, sub, row_of("sub"), named_args(sub), {"self": src, "other": m_val},
                                  blk, "row", "float32")
        e = self._apply_row(env, exp, row_of("exp"), named_args(exp), {"self": shifted}, blk, "row", "float32")
        s_first = partner not in accs
        if s_first:
            accs[partner] = {"acc": b.sbuf((p, 1), "float32", site=f"acc:{partner.name}")}
        red.reduce_chunk(b, accs[partner]["acc"], e.tile, (p, 1, cw), "add", None, first=s_first,
                         site=f"acc:{partner.name}")

    def _finish(self, node, state) -> _Val:
        red_op, post, extra = _reduction_params(node)
        out_dt = _dt(node_dtype(node))
        if "stats" in state:
            p = state["stats"].shape[0]
            acc = self.b.sbuf((p, 1), "float32", site=f"acc:{node.name}.var")
            red.variance_from_stats(self.b, acc, state["stats"], self.d, extra, post)
        else:
            acc = state["acc"]
        res = red.finish_reduction(self.b, acc, post, self.d, extra, out_dt, site=f"acc:{node.name}")
        return _Val("rowvec", out_dt, res)


def _hbm_view(b: TileBuilder, name: str, node, rows: int, d: int, role: str, shape=None):
    dt = _dt(node_dtype(node))
    if shape is not None:
        hshape = shape
    else:
        cls = value_class(node_shape(node), rows, d)
        if role == "output" and is_reduction(packet_name(node.target)):
            cls = "rowvec"  # a reduction's result is per row, whatever its shape says
        hshape = {"row": (rows, d), "rowvec": (rows, 1), "colvec": (1, d), "scalar": (1, 1)}.get(
            cls, (prod(node_shape(node)) or 1, 1))

    return b.input(name, hshape, dt) if role == "input" else b.output(name, hshape, dt)


def emit_segments(segments: list[Segment], name: str, spec, *, budget_fraction: float = 0.4):
    """One Program for a list of fused segments (run in order), plus emission statistics.

    Raises ``_Unfusable`` when a node has no emission rule (the caller then runs it eagerly).
    """
    from ..spec import preset

    spec = preset(spec)
    last_error = None
    # rotation as deep as the eager lowerings' (3) where the values fit, shallower where not
    for bufs, fraction in ((3, budget_fraction), (2, budget_fraction), (1, budget_fraction),
                           (1, budget_fraction / 2)):
        stats = EmitStats(bufs=bufs)
        b = TileBuilder(name, spec, bufs=bufs)
        try:
            strided = _emit_all(b, segments, spec, fraction, stats)
            return b.build(meta={"kind": "compiled", "segments": [s.names for s in segments],
                                 "read_strided": strided}), stats
        except CapacityError as e:
            last_error = e
    raise last_error


def _emit_all(b: TileBuilder, segments, spec, fraction, stats) -> list[str]:
    """Emit every segment; returns the inputs read where they are, by their strides (the
    runtime passes those as they are, not made contiguous)."""
    from ._matmul_segment import emit_matmul, matmul_operand_shapes

    hbm: dict = {}
    strided: list[str] = []
    produced = {n for seg in segments for n in seg.nodes}
    externals = []
    for seg in segments:
        for inp in seg.inputs:
            if inp not in produced and inp not in externals:
                externals.append(inp)
    for seg in segments:
        rows, d = seg.space
        natural = matmul_operand_shapes(seg) if seg.kind == "matmul" else {}
        for inp in seg.inputs:  # periodic and strided inputs: the span their rows are read from
            if seg.kind != "rowgroup" or inp in natural:
                continue
            readers = [n for n in seg.nodes if inp in _tensor_args(n)]
            periodic = any(operand_class(n, inp, rows, d) == "periodic" for n in readers)
            if periodic or strided_input(inp, rows, d):
                reader = next((n for n in readers if value_class(node_shape(n), rows, d) == "row"), inp)
                dims = row_layout(inp, node_shape(reader), d)
                if dims is not None:
                    natural[inp] = (1, layout_span(dims, d))
                    if not periodic:
                        strided.append(inp.name)
        for inp in seg.inputs:
            if inp not in hbm and inp in externals:
                hbm[inp] = _hbm_view(b, inp.name, inp, rows, d, "input", natural.get(inp))
        for out in seg.outputs:
            if out not in hbm:
                hbm[out] = _hbm_view(b, out.name, out, rows, d, "output")
    budget = int(spec.sbuf_bytes_per_partition * fraction / stats.bufs)
    for seg in segments:
        if seg.kind == "rowgroup":
            _RowGroup(b, seg, hbm, budget, stats).emit()
        elif seg.kind == "matmul":
            emit_matmul(b, seg, hbm, stats, budget, int(spec.sbuf_bytes_per_partition * fraction))
        else:
            raise _Unfusable(f"segment kind {seg.kind} is not emitted")
    return strided
