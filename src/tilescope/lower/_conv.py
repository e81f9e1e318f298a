"""Convolution on TensorE as implicit GEMM: the forward op and ``grad_input``.

A 2-D convolution is the matrix product ``out[co, pixel] = sum over (ci, tap) of
W[co, ci, tap] * x[ci, pixel shifted by tap]``: a GEMM whose contraction is
``C_in * kh * kw`` and whose columns are the output pixels. Nothing is unfolded in HBM:

* **weights** are read once per execution, one contiguous DMA per block of up to 128
  output channels, and laid out as the ``[ci, co]`` operand of each tap by TensorE
  transposes; they stay in SBUF for the whole execution;
* **inputs** are read in large contiguous runs (whole rows of every channel) into SBUF
  tiles with channels on the partitions; a tap is a shifted window of a tile (an
  access pattern, no copy). When the channels leave partitions free (C_in <= 64), a
  tile holds ``G`` *replicas* of its rows, each shifted by one more kernel row, so one
  matmul contracts over ``G`` kernel rows at once: the contraction is packed into
  128-row chunks (channel block x kernel-row group x kw);
* **PSUM** accumulates over the chunks; the first chunk starts the accumulation group,
  the bias is added while PSUM is copied out.

Two mappings onto the systolic array, chosen by their TensorE cycles (cost table):

* *weights stationary* (M = output channels, N = up to 512 output pixels): the columns
  of a tap that would read padding are skipped, so input tiles need no padding;
* *pixels stationary* (M = up to 128 output pixels, N = output channels), for layers
  with few output channels, where the other mapping leaves half the array idle: the
  ``[pixels, co]`` result is transposed on TensorE, several pixel blocks per transpose.
  Input tiles are zero-padded so that every tap covers every pixel of a block.

``grad_input`` of a stride-1 convolution is the forward convolution of ``grad_output``
with the kernel flipped and its channel roles swapped, whose weight operand is the
weight tensor as stored (``[co, ci]`` per tap: no transposes). Other strides *scatter*
each tap's product ``W[co, ci, tap].T @ dy[co, pixels]`` into the strided PSUM region of
``grad_input`` it reaches. Groups (depthwise included) are packed several per matmul as
block-diagonal weights.

>>> from tilescope.lower import Call, TensorMeta, lower, contiguous_strides
>>> def t(*shape): return TensorMeta(shape, contiguous_strides(shape), "float32")
>>> call = Call("aten::convolution_overrideable", (t(8, 128, 28, 28), t(128, 128, 3, 3), None,
...             (1, 1), (1, 1), (1, 1), False, (0, 0), 1), (), (t(8, 128, 28, 28),))
>>> low = lower(call)
>>> low.rule, low.program.summary_counts()["matmul"]
('conv', 144)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..isa import AP
from ..program import TileBuilder, View
from ._call import Call, TensorMeta
from ._conv_patch import patch_applies, patch_forward, patch_forward_rows, patch_grad_weight
from ._layout import hbm_input, hbm_output
from ._rules import Rule, add_rules

__all__ = ["ConvGeom", "conv_geometry", "lower_conv", "lower_conv_backward", "PE_DTYPES"]

PE_DTYPES = ("float32", "bfloat16", "float16")
# per-partition SBUF budgets (bytes) of one store block's tiles, of the resident weights
_IN_BUDGET = 32 * 1024
_OUT_BUDGET = 16 * 1024
_W_BUDGET = 64 * 1024
_RESERVE = 16 * 1024  # per partition: small tiles (bias, masks, PSUM copies) beside the budgets above
_MAX_MATMULS = 40_000  # a Program beyond this is declined (generic): it would take minutes to build


# ---- geometry -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConvGeom:
    """A 2-D convolution's shape (1-D ones have ``h = oh = kh = 1``); channels per group."""

    n: int
    cin: int
    cout: int
    groups: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int = 1
    sw: int = 1
    ph: int = 0
    pw: int = 0
    dh: int = 1
    dw: int = 1

    @property
    def taps(self) -> int:
        return self.kh * self.kw

    @property
    def flops(self) -> int:
        """Multiply-adds x 2 of the forward pass (each backward op does as many)."""
        return 2 * self.n * self.oh * self.ow * self.groups * self.cout * self.cin * self.taps


def _as_2d(m: TensorMeta) -> TensorMeta:
    """A 1-D convolution's (N, C, L) operand as (N, C, 1, L)."""
    n, c, length = m.shape
    sn, sc, sl = m.stride
    return TensorMeta((n, c, 1, length), (sn, sc, sl * length, sl), m.dtype)


def conv_geometry(x: TensorMeta, w: TensorMeta, stride, padding, dilation, groups, transposed=False):
    """(ConvGeom, x, w) with 1-D operands seen as 2-D, or None when not a 1-/2-D convolution
    this module lowers (transposed, 3-D, complex, empty, or inconsistent)."""
    if not isinstance(x, TensorMeta) or not isinstance(w, TensorMeta) or transposed:
        return None
    if x.ndim not in (3, 4) or w.ndim != x.ndim or x.is_complex or w.is_complex or x.numel == 0 or w.numel == 0:
        return None
    stride, padding, dilation = (tuple(int(v) for v in t) for t in (stride, padding, dilation))
    if x.ndim == 3:
        if not len(stride) == len(padding) == len(dilation) == 1:
            return None
        x, w = _as_2d(x), _as_2d(w)
        stride, padding, dilation = (1,) + stride, (0,) + padding, (1,) + dilation
    if not len(stride) == len(padding) == len(dilation) == 2:
        return None
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or groups < 1:
        return None
    n, c_all, h, wd = x.shape
    co_all, cin, kh, kw = w.shape
    if cin * groups != c_all or co_all % groups:
        return None
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if oh < 1 or ow < 1:
        return None
    g = ConvGeom(n, cin, co_all // groups, groups, h, wd, oh, ow, kh, kw, stride[0], stride[1],
                 padding[0], padding[1], dilation[0], dilation[1])
    return g, x, w


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


# ---- access patterns ----------------------------------------------------------------------------

def _hbm(view: View, offset: int, dims) -> View:
    ap = view.ap
    dims = tuple((int(s), int(c)) for s, c in dims)
    return View(view.buffer, AP(ap.buffer, ap.dtype, ap.offset + offset, dims), tuple(c for _, c in dims))


def _on_chip(t: View, p0: int, parts: int, offset: int, dims) -> View:
    """A region of an SBUF/PSUM tile: partitions [p0, p0 + parts), free ``dims`` from ``offset``."""
    row = t.buffer.row_elems
    d = ((row, parts),) + tuple((int(s), int(c)) for s, c in dims)
    return View(t.buffer, AP(t.ap.buffer, t.ap.dtype, t.ap.offset + p0 * row + offset, d), tuple(c for _, c in d))


# ---- the blocks a convolution is computed in ----------------------------------------------------

@dataclass(frozen=True)
class _Step:
    """One matmul's share of the contraction: the taps (kh0 + a, kw0 + b) of the first
    ``rows // cs`` replicas of a chunk (a < uh, b < uw)."""

    kh0: int
    kw0: int
    rows: int
    uh: int
    uw: int


@dataclass(frozen=True)
class _Chunk:
    """Input channels [c0, c0 + cs) loaded together, as ``gh * gw`` *replicas*: replica (a, b)
    holds the rows shifted by ``a`` kernel rows and ``b`` kernel columns, so one matmul
    contracts over ``gh x gw`` taps. ``sub``: tile rows are output rows (input rows taken
    every ``sh``), possible when one replica group spans every kernel row."""

    c0: int
    cs: int
    gh: int = 1
    gw: int = 1
    sub: bool = False

    @property
    def reps(self) -> int:
        return self.gh * self.gw

    def replicas(self) -> list[tuple[int, int]]:
        # column-major when columns are packed, so that the replicas a step uses are a prefix
        return [(a, b) for b in range(self.gw) for a in range(self.gh)]

    def steps(self, g: ConvGeom) -> list[_Step]:
        if self.gw == 1:
            return [_Step(k * self.gh, kw, min(self.gh, g.kh - k * self.gh) * self.cs, min(self.gh, g.kh - k * self.gh), 1)
                    for k in range(_ceil_div(g.kh, self.gh)) for kw in range(g.kw)]
        return [_Step(0, kk * self.gw, min(self.gw, g.kw - kk * self.gw) * g.kh * self.cs, g.kh,
                      min(self.gw, g.kw - kk * self.gw)) for kk in range(_ceil_div(g.kw, self.gw))]

    def rows_t(self, g: ConvGeom, nr: int) -> int:
        """Tile rows for ``nr`` output rows."""
        groups = _ceil_div(g.kh, self.gh)
        if self.sub:
            return nr + (groups - 1) * self.gh * g.dh // g.sh
        return (nr - 1) * g.sh + (groups - 1) * self.gh * g.dh + 1

    def row(self, g: ConvGeom, oh_rel: int, kh0: int) -> int:
        """Tile row read for output row ``r0 + oh_rel`` by a step starting at kernel row ``kh0``."""
        return oh_rel + kh0 * g.dh // g.sh if self.sub else oh_rel * g.sh + kh0 * g.dh

    def row_step(self, g: ConvGeom) -> int:
        return 1 if self.sub else g.sh


@dataclass(frozen=True)
class _Unit:
    """Output channels [o0, o0 + os) computed together from ``chunks``.

    ``diag`` = (groups, cin, cout) when the unit packs several groups as block-diagonal
    weights; ``group`` is the (first) group.
    """

    o0: int
    os: int
    group: int
    chunks: tuple[_Chunk, ...]
    diag: tuple[int, int, int] | None = None


def _subsample(g: ConvGeom, gh: int) -> bool:
    """Whether tiles may hold only the input rows a stride reaches (each kernel-row group of
    ``gh`` rows starts a whole number of strides after the previous one)."""
    return g.sh > 1 and (gh >= g.kh or gh * g.dh % g.sh == 0)


def _units(g: ConvGeom, P: int, chunk_shape=None) -> list[_Unit]:
    """The units of ``g``; ``chunk_shape(cs) -> (gh, gw, sub)`` packs dense chunks (default:
    kernel-row replicas while channels leave partitions free)."""
    gp = min(g.groups, P // g.cin, P // g.cout) if g.cin <= P // 2 and g.cout <= P // 2 else 1
    units = []
    if gp > 1:
        for g0 in range(0, g.groups, gp):
            gn = min(gp, g.groups - g0)
            units.append(_Unit(g0 * g.cout, gn * g.cout, g0, (_Chunk(g0 * g.cin, gn * g.cin),),
                               (gn, g.cin, g.cout)))
        return units
    if chunk_shape is None:
        def chunk_shape(cs):
            gh = min(g.kh, P // cs) if cs <= P // 2 else 1
            return gh, 1, _subsample(g, gh)
    for grp in range(g.groups):
        chunks = []
        for c in range(0, g.cin, P):
            cs = min(P, g.cin - c)
            gh, gw, sub = chunk_shape(cs)
            chunks.append(_Chunk(grp * g.cin + c, cs, gh, gw, sub))
        for o in range(0, g.cout, P):
            units.append(_Unit(grp * g.cout + o, min(P, g.cout - o), grp, tuple(chunks)))
    return units


# ---- weights ------------------------------------------------------------------------------------

def _diag_mask(b: TileBuilder, rows: int, gn: int, cols_g: int, rows_g: int, base: int = 0) -> View:
    """[rows, gn * cols_g] float32 mask: 1 where the row's group ((row + base) // rows_g) is the
    column's (its index // cols_g): the block diagonal of a packed group product."""
    v = b.sbuf((rows, gn, cols_g), "float32", site="conv.mask", bufs=1)
    b.iota(v, base=base, partition_step=1, steps=(-rows_g, 0))  # base + p - g' * rows_g
    lo = b.sbuf((rows, gn, cols_g), "float32", site="conv.mask.lo", bufs=1)
    b.tensor_scalar(lo, v, "greater_equal", 0.0)
    m = b.sbuf((rows, gn * cols_g), "float32", site="conv.mask.m", bufs=1)
    b.tensor_scalar(m, v, "less", float(rows_g))
    b.tensor_tensor(m, m, lo, "multiply")
    return m


class _ForwardWeights:
    """Stationary ``[K = (replica, ci), M = co]`` tiles of the forward convolution, made from
    the weight tensor ``[co, ci, kh, kw]`` as stored (one contiguous DMA per unit and chunk)
    by TensorE transposes."""

    def __init__(self, b: TileBuilder, spec, g: ConvGeom, W: View, ws, dtype: str):
        self.b, self.spec, self.g, self.W, self.ws, self.dtype = b, spec, g, W, ws, dtype

    def prepare(self, unit: _Unit) -> dict:
        b, g, ws = self.b, self.g, self.ws
        L = g.cin * g.taps
        raw = b.sbuf((unit.os, L), self.W.dtype, site="conv.wraw", bufs=1)
        # one DMA per chunk of input channels, so the first transposes need not wait for all rows
        pieces = [(0, g.cin)] if unit.diag else [(ch.c0 - unit.group * g.cin, ch.cs) for ch in unit.chunks]
        for cl0, cs in pieces:
            b.dma_copy(_on_chip(raw, 0, unit.os, cl0 * g.taps, ((1, cs * g.taps),)),
                       _hbm(self.W, unit.o0 * ws[0] + cl0 * ws[1],
                            ((ws[0], unit.os), (ws[1], cs), (ws[2], g.kh), (ws[3], g.kw))))
        mask = None
        if unit.diag is not None:
            gn, cin_g, cout_g = unit.diag
            mask = _diag_mask(b, unit.os, gn, cin_g, cout_g)
        out = {}
        for ch in unit.chunks:
            cl0 = ch.c0 - unit.group * g.cin  # first channel within the group
            for s in ch.steps(g):
                tap = s.kh0 * g.kw + s.kw0
                if mask is not None:
                    gn, cin_g, _ = unit.diag
                    src = b.sbuf((unit.os, gn * cin_g), "float32", site="conv.wdiag")
                    b.tensor_tensor(src, mask, _on_chip(raw, 0, unit.os, tap, ((0, gn), (g.taps, cin_g))), "multiply")
                elif ch.gw == 1:  # partitions (a, ci)
                    src = _on_chip(raw, 0, unit.os, cl0 * g.taps + tap, ((g.kw, s.uh), (g.taps, ch.cs)))
                else:  # partitions (b, a, ci)
                    src = _on_chip(raw, 0, unit.os, cl0 * g.taps + tap, ((1, s.uw), (g.kw, s.uh), (g.taps, ch.cs)))
                ps = b.psum((s.rows, unit.os), "float32", site="conv.wT")
                b.transpose(ps, src)
                st = b.sbuf((s.rows, unit.os), self.dtype, site="conv.w", bufs=1)
                b.tensor_copy(st, ps)
                out[ch, s.kh0, s.kw0] = st
        return out


class _FlippedWeights:
    """``grad_input``'s weights as a forward convolution over ``grad_output``: input channels
    are the weight's ``co``, output channels its ``ci``, taps flipped. The stored layout
    ``[co, ci * taps]`` is already ``[K, M]``: replica (a, b) is the same rows loaded shifted
    by ``a`` kernel rows and ``b`` columns, so all replicas read one tap at one offset."""

    def __init__(self, b: TileBuilder, spec, g: ConvGeom, W: View, ws, dtype: str):
        # g: the *equivalent* forward geometry (cin = co of W, cout = ci of W)
        self.b, self.spec, self.g, self.W, self.ws, self.dtype = b, spec, g, W, ws, dtype
        self._raws: dict = {}  # chunk -> its rows, read once for every unit (while they fit)
        # what a partition holds beside the input and output tiles (double-buffered) and a reserve
        # for the small ones (bias, masks): rows beyond it are re-read by every unit
        self._budget = max(_W_BUDGET, spec.sbuf_bytes_per_partition - 2 * (_IN_BUDGET + _OUT_BUDGET) - _RESERVE)

    def _raw(self, chunk: _Chunk) -> View:
        raw = self._raws.get(chunk)
        if raw is None:
            raw = self._load_raw(chunk)
            if (len(self._raws) + 1) * self.g.cout * self.g.taps * (2 if self.dtype != "float32" else 4) <= self._budget:
                self._raws[chunk] = raw
        return raw

    def _load_raw(self, chunk: _Chunk) -> View:
        b, g, ws = self.b, self.g, self.ws
        L = g.cout * g.taps  # per W row (co): all ci of its group, all taps
        raw = b.sbuf((chunk.reps * chunk.cs, L), self.W.dtype, site="conv.wrawf", bufs=1)
        rows = _hbm(self.W, chunk.c0 * ws[0], ((ws[0], chunk.cs), (ws[1], g.cout), (ws[2], g.kh), (ws[3], g.kw)))
        for r, (a, bb) in enumerate(chunk.replicas()):
            shift = a * g.kw + bb  # replica (a, b) reads tap t - shift at the offset of tap t
            src = rows if shift == 0 else _flat_prefix(rows, g, L - shift, ws)
            b.dma_copy(_on_chip(raw, r * chunk.cs, chunk.cs, shift, ((1, L - shift),)), src)
        return raw

    def prepare(self, unit: _Unit) -> dict:
        b, g = self.b, self.g
        out = {}
        for ch in unit.chunks:
            raw = self._raw(ch)
            mask = None
            if unit.diag is not None:
                gn, cin_g, cout_g = unit.diag  # equivalent conv: rows (g, co of W), cols (g', ci of W)
                mask = _diag_mask(b, ch.cs, gn, cout_g, cin_g)
            ol0 = unit.o0 - unit.group * g.cout  # first output channel (ci of W) within the group
            for s in ch.steps(g):
                # equivalent tap (kh0, kw0) is the weight's (kh-1-kh0, kw-1-kw0)
                tap = (g.kh - 1 - s.kh0) * g.kw + (g.kw - 1 - s.kw0)
                if mask is None:
                    out[ch, s.kh0, s.kw0] = _on_chip(raw, 0, s.rows, ol0 * g.taps + tap, ((g.taps, unit.os),))
                else:
                    gn, _, cout_g = unit.diag
                    st = b.sbuf((s.rows, gn * cout_g), self.dtype, site="conv.w", bufs=1)
                    b.tensor_tensor(st, mask, _on_chip(raw, 0, s.rows, tap, ((0, gn), (g.taps, cout_g))), "multiply")
                    out[ch, s.kh0, s.kw0] = st
        return out


def _flat_prefix(rows: View, g: ConvGeom, count: int, ws) -> View:
    """The first ``count`` elements of each weight row (ci, kh, kw), for a contiguous weight."""
    if not (ws[3] == 1 and ws[2] == g.kw and ws[1] == g.taps):
        raise _Decline  # a weight whose rows are not contiguous: no shifted replicas
    ap = rows.ap
    return _hbm(View(rows.buffer, AP(ap.buffer, ap.dtype, 0, ap.dims), rows.shape), ap.offset,
                ((ws[0], ap.dims[0][1]), (1, count)))


class _Decline(Exception):
    """The call is outside what this lowering handles: the next rule (or generic) takes it."""


# ---- the forward convolution ------------------------------------------------------------------

def _short_run(run_bytes: int, spec) -> bool:
    """Whether a contiguous run of ``run_bytes`` moves at under two thirds of a DMA engine's
    bandwidth (its descriptor costs over half its bytes' time), per the preset."""
    dma = spec.dma
    return run_bytes / dma.bytes_per_ns_per_engine < getattr(dma, "descriptor_ns", 0.0)


class _Queues:
    """Round-robin DMA queues for loads that split one tensor by partitions: a kernel spreads
    them over queues, so each issues in parallel instead of one after another on the tensor's
    queue."""

    def __init__(self, spec):
        self.n = getattr(spec.dma, "queues", spec.dma.engines)
        self.k = 0

    def next(self) -> int:
        self.k = (self.k + 1) % self.n
        return self.k


def _ramp(rows: int, per_block: int, unit: int, first: bool) -> list[tuple[int, int]]:
    """(first row, rows) of the store blocks covering ``rows``. The very first block is a
    quarter of the others (whole ``unit``s): TensorE starts once its smaller load is in."""
    out = []
    r0 = 0
    if first and per_block >= 4 * unit:
        n = max(unit, per_block // 4 // unit * unit)
        out.append((0, n))
        r0 = n
    while r0 < rows:
        out.append((r0, min(per_block, rows - r0)))
        r0 += per_block
    return out


class _Forward:
    """Emits ``Y = conv(X, weights) (+ bias)`` for geometry ``g`` (X, Y: 4-D HBM views).

    ``weights`` is a class (:class:`_ForwardWeights` or :class:`_FlippedWeights`)."""

    def __init__(self, b: TileBuilder, spec, g: ConvGeom, X: View, xs, Y: View, ys, weights, W: View, ws, bias,
                 bias_stride, dtype: str, out_dtype: str):
        self.b, self.spec, self.g = b, spec, g
        self.X, self.xs, self.Y, self.ys = X, xs, Y, ys
        self.weights = weights(b, spec, g, W, ws, dtype)
        self.bias, self.bias_stride = bias, bias_stride
        self.dtype, self.out_dtype = dtype, out_dtype
        self.P = spec.partitions
        self.isz = 2 if dtype in ("bfloat16", "float16") else 4
        self.osz = 2 if out_dtype in ("bfloat16", "float16") else 4
        self._stationary: dict = {}
        self._deferred: list = []  # on-chip steps of input loads, emitted after the block's DMAs
        self._queues = _Queues(spec)

    # -- planning (estimates from the cost table and the preset; the simulator prices the result) --
    def _pe_ns(self, K: int, M: int, N: int) -> float:
        from ..isa import Matmul, matmul_cycles

        st = AP("s", self.dtype, 0, ((1, K), (1, M)))
        mv = AP("m", self.dtype, 0, ((1, K), (1, N)))
        return self.spec.tensor.ns(matmul_cycles(Matmul(AP("d", "float32", 0, ((1, M), (1, N))), st, mv), self.spec))

    def _dma_ns(self, nbytes: float) -> float:
        return nbytes / self.spec.dma_bytes_per_ns

    def _input_bytes(self, units, padded: bool) -> float:
        """DMA-charged bytes of the input tiles of ``units`` (replicas included): short
        contiguous runs are charged as the preset's DMA chunk floor."""
        g = self.g
        dma = self.spec.dma
        total = 0.0
        for ch in {c for u in units for c in u.chunks}:
            rows = g.oh * (1 if ch.sub else g.sh) + (g.kh - 1) * g.dh // (g.sh if ch.sub else 1)
            rows = min(g.h, rows)
            # runs: whole row blocks when rows are contiguous in the tile and in memory
            whole = not ch.sub and (not padded or ch.gw == 1)
            run = (rows if whole else 1) * g.w * self.isz
            # a descriptor per run: its cost in bytes of transfer time
            per_run = getattr(dma, "descriptor_ns", 0.0) * dma.bytes_per_ns_per_engine
            total += ch.reps * ch.cs * g.n * rows * g.w * self.isz * (1.0 + per_run / max(run, 1))
        return total

    def _estimate(self, mapping: str, units) -> float:
        """max(TensorE, DMA) nanoseconds of ``mapping`` with ``units`` (a planning estimate)."""
        g = self.g
        out_bytes = g.n * g.groups * g.cout * g.oh * g.ow * self.osz
        dma = self._dma_ns(self._input_bytes(units, mapping == "B") + out_bytes)
        if mapping == "A":
            pe = sum(len(c.steps(g)) * g.n * g.oh * g.ow / 512 * self._pe_ns(self.P, u.os, 512)
                     for u in units for c in u.chunks)
            return max(pe, dma)
        if g.sh == 1 and g.sw == 1:
            M = self.P
            blocks = g.n * _ceil_div(g.oh * ((g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1), M)
        else:
            rows_b = max(1, min(g.oh, self.P // g.ow))
            blocks = g.n * _ceil_div(g.oh, rows_b)
            M = rows_b * g.ow
        pe = 0.0
        for u in units:
            bp = max(1, self.P // u.os)
            pe += blocks * sum(len(c.steps(g)) for c in u.chunks) * self._pe_ns(self.P, M, u.os)
            pe += _ceil_div(blocks, bp) * self._pe_ns(M, min(self.P, bp * u.os), M)  # transposes
        return max(pe, dma)

    def _candidates(self, mapping: str):
        """Chunk shapes (kernel rows, kernel columns packed, rows subsampled) to consider."""
        g, P = self.g, self.P
        def rows_only(cs):
            return min(g.kh, P // cs) if cs <= P // 2 else 1
        for sub in (False, True):
            if mapping == "A":
                yield lambda cs, sub=sub: (rows_only(cs), 1, sub and _subsample(g, rows_only(cs)))
                continue
            for gw in range(1, g.kw + 1):
                def shape(cs, gw=gw, sub=sub):
                    if cs * g.kh <= P:
                        return g.kh, min(gw, P // (cs * g.kh)), sub and g.sh > 1
                    return rows_only(cs), 1, sub and _subsample(g, rows_only(cs))
                yield shape

    def _plan(self, mapping: str) -> tuple[float, list[_Unit]]:
        best = None
        for shape in self._candidates(mapping):
            units = _units(self.g, self.P, shape)
            cost = self._estimate(mapping, units)
            if best is None or cost < best[0]:
                best = (cost, units)
        return best

    def _b_applies(self) -> bool:
        g = self.g
        return g.ow <= self.P and g.cout <= self.P

    def emit(self) -> str:
        cost_a, units = self._plan("A")
        use_b = False
        if self._b_applies():
            cost_b, units_b = self._plan("B")
            if cost_b < 0.9 * cost_a:
                use_b, units = True, units_b
        for group in self._weight_groups(units):
            self._stationary_of(group[0])  # the first weights before any input: their DMA goes first
            biases = {u: self._bias(u, broadcast=use_b) for u in group} if self.bias is not None else {}
            (self._emit_b if use_b else self._emit_a)(group, biases)
        return "pixels-stationary" if use_b else "weights-stationary"

    def _stationary_of(self, unit: _Unit, p0: int = 0) -> dict:
        """The unit's weight tiles, from partition ``p0`` on (copies made once, by DMA)."""
        st = self._stationary.get((unit, p0))
        if st is None and p0 == 0:
            st = self._stationary[unit, 0] = self.weights.prepare(unit)
        elif st is None:
            st = {}
            for key, t in self._stationary_of(unit).items():
                q = self.b.sbuf((p0 + t.shape[0],) + tuple(t.shape[1:]), t.dtype, site="conv.wq", bufs=1)
                self.b.dma_copy(_on_chip(q, p0, t.shape[0], 0, ((1, t.ap.size // t.shape[0]),)), t)
                st[key] = _on_chip(q, p0, t.shape[0], 0, ((1, t.ap.size // t.shape[0]),))
            self._stationary[unit, p0] = st
        return st

    def _weight_groups(self, units) -> list[list[_Unit]]:
        """Units whose stationary weights stay in SBUF together (inputs are read once per group)."""
        groups, cur, used = [], [], 0
        for u in units:
            need = sum(len(c.steps(self.g)) for c in u.chunks) * u.os * self.isz
            need += self.g.cin * self.g.taps * self.isz  # the raw rows
            if cur and used + need > _W_BUDGET:
                groups.append(cur)
                cur, used = [], 0
            cur.append(u)
            used += need
        if cur:
            groups.append(cur)
        return groups

    def _bias(self, unit: _Unit, broadcast: bool) -> View:
        b, s = self.b, self.bias_stride
        if broadcast:  # [128, os]: the bias row on every partition (pixels-stationary results)
            t = b.sbuf((self.P, unit.os), self.bias.dtype, site="conv.bias", bufs=1)
            b.dma_copy(t, _hbm(self.bias, unit.o0 * s, ((0, self.P), (s, unit.os))))
        else:
            t = b.sbuf((unit.os, 1), self.bias.dtype, site="conv.bias", bufs=1)
            b.dma_copy(t, _hbm(self.bias, unit.o0 * s, ((s, unit.os), (1, 1))))
        if t.dtype != "float32":
            f = b.sbuf(t.shape, "float32", site="conv.bias32", bufs=1)
            b.tensor_copy(f, t)
            t = f
        return t

    # -- input tiles --
    def _load(self, ch: _Chunk, n0: int, ni: int, r0: int, nr: int, col0: int, wt: int, p0: int = 0) -> View:
        """Input for output rows [r0, r0 + nr) of images [n0, n0 + ni): tile
        ``[reps * cs, ni, rows_t, wt]``. Replica (a, b), tile row j is input row
        ``r0*sh - ph + a*dh + j`` (``(r0 + j)*sh - ph + a*dh`` when ``sub``), column c is input
        column ``c + col0 + b*dw``. Rows and columns outside the image are 0. The replicas sit
        from partition ``p0`` on (the tile has ``p0`` more partitions)."""
        b, g, xs = self.b, self.g, self.xs
        parts = ch.reps * ch.cs
        rows_t = ch.rows_t(g, nr)
        spans = []  # per replica: tile rows [j0, j1), columns [c0, c1) inside the image, first input row
        for a, bb in ch.replicas():
            if ch.sub:
                top = r0 * g.sh + a * g.dh - g.ph  # input row of tile row 0
                j0 = max(0, _ceil_div(-top, g.sh))
                j1 = min(rows_t, (g.h - 1 - top) // g.sh + 1)
            else:
                top = r0 * g.sh - g.ph + a * g.dh
                j0, j1 = max(0, -top), min(rows_t, g.h - top)
            left = col0 + bb * g.dw
            spans.append((j0, j1, max(0, -left), min(wt, g.w - left), top, left))
        lo, hi = max(s[0] for s in spans), min(s[1] for s in spans)
        cl, ch_ = max(s[2] for s in spans), min(s[3] for s in spans)
        short = ch.gw == 1 and not ch.sub and wt > ch_ - cl and _short_run((ch_ - cl) * self.isz, self.spec)
        t = b.sbuf((p0 + parts, ni, rows_t, wt), self.X.dtype, site="conv.x", bufs=2)
        if cl > 0:
            b.memset(_on_chip(t, p0, parts, 0, ((wt, ni * rows_t), (1, cl))), 0.0, engine="pool")
        if ch_ < wt:
            b.memset(_on_chip(t, p0, parts, max(ch_, 0), ((wt, ni * rows_t), (1, wt - max(ch_, 0)))), 0.0,
                     engine="pool")
        if short:
            # rows too short for a DMA descriptor to move efficiently would land in padded rows one
            # run at a time: load them contiguously, then widen on chip
            cols = ch_ - cl
            stage = b.sbuf((p0 + parts, ni, rows_t, cols), self.X.dtype, site="conv.xs", bufs=2)
            self._load_replicas(ch, spans, stage, cols, p0, parts, n0, ni, rows_t, lo, hi, flat=True)
            # on GpSimd, after every load of the block is under way (engines run in program order)
            self._deferred.append(lambda: b.tensor_copy(
                _on_chip(t, p0, parts, cl, ((rows_t * wt, ni), (wt, rows_t), (1, cols))),
                _on_chip(stage, p0, parts, 0, ((1, ni * rows_t * cols),)), engine="pool"))
        else:
            self._load_replicas(ch, spans, t, wt, p0, parts, n0, ni, rows_t, lo, hi, flat=False)
        return t

    def _load_replicas(self, ch: _Chunk, spans, t, width: int, p0, parts, n0, ni, rows_t, lo, hi, flat: bool) -> None:
        """Zero the tile rows outside the image, then DMA each run of replicas into ``t``
        (``width`` columns per row): at their columns (``flat``: whole rows of the in-image
        columns, contiguous, from column 0)."""
        self._zero_rows(t, parts, ni, rows_t, width, lo, hi, p0)
        for r, cnt, pdims, (j0, j1, c0, c1, top, left) in self._replica_runs(ch, spans):
            if j1 <= j0 or not flat and c1 <= c0:
                continue
            if flat:
                dst = _on_chip(t, p0 + r * ch.cs, cnt * ch.cs, j0 * width, ((rows_t * width, ni), (1, (j1 - j0) * width)))
            else:
                dst = _on_chip(t, p0 + r * ch.cs, cnt * ch.cs, j0 * width + c0,
                               ((rows_t * width, ni), (width, j1 - j0), (1, c1 - c0)))
            self.b.dma_copy(dst, self._src(ch, n0, ni, top, j0, j1, left + c0, width if flat else c1 - c0, pdims),
                            queue=self._queues.next())

    def _replica_runs(self, ch: _Chunk, spans):
        """Replicas loaded by one transfer each run: consecutive replicas whose rows and columns
        inside the image agree, as (first replica, count, their partition dims on the source, span).
        Replica (a, b) is the same source shifted by a kernel rows and b kernel columns, so a run
        over whole kernel-row sets is one access pattern (a queue issues its transfers one by one)."""
        g, xs = self.g, self.xs
        out = []
        r = 0
        n = len(spans)
        while r < n:
            e = r + 1
            while e < n and spans[e][:4] == spans[r][:4]:
                e += 1
            while r < e:
                a = r % ch.gh
                if a == 0 and e - r >= ch.gh:  # whole kernel-row sets of consecutive b
                    nb = (e - r) // ch.gh
                    dims = ((g.dw * xs[3], nb), (g.dh * xs[2], ch.gh), (xs[1], ch.cs))
                    out.append((r, nb * ch.gh, dims, spans[r]))
                    r += nb * ch.gh
                else:  # kernel rows of one b
                    cnt = min(e, r - a + ch.gh) - r
                    out.append((r, cnt, ((g.dh * xs[2], cnt), (xs[1], ch.cs)), spans[r]))
                    r += cnt
        return out

    def _zero_rows(self, t, parts, ni, rows_t, wt, lo, hi, p0: int = 0) -> None:
        b = self.b
        if hi <= lo:
            b.memset(_on_chip(t, p0, parts, 0, ((1, ni * rows_t * wt),)), 0.0, engine="pool")
            return
        if lo > 0:
            b.memset(_on_chip(t, p0, parts, 0, ((rows_t * wt, ni), (1, lo * wt))), 0.0, engine="pool")
        if hi < rows_t:
            b.memset(_on_chip(t, p0, parts, hi * wt, ((rows_t * wt, ni), (1, (rows_t - hi) * wt))), 0.0,
                     engine="pool")

    def _src(self, ch: _Chunk, n0, ni, top, j0, j1, col, cols, pdims) -> View:
        g, xs = self.g, self.xs
        step = g.sh if ch.sub else 1
        row = top + j0 * step
        return _hbm(self.X, n0 * xs[0] + ch.c0 * xs[1] + row * xs[2] + col * xs[3],
                    tuple(pdims) + ((xs[0], ni), (xs[2] * step, j1 - j0), (xs[3], cols)))

    def _store_rows(self, units, ni: int, nc: int, wt: int, pnr: int) -> int:
        """Output rows per store block: as many PSUM blocks as the SBUF budgets allow."""
        g = self.g
        chunks = {c for u in units for c in u.chunks}
        nr = g.oh
        while nr > pnr:
            in_bytes = sum(c.rows_t(g, nr) * wt * ni * self.isz for c in chunks)
            out_bytes = ni * nr * nc * self.osz
            if in_bytes <= _IN_BUDGET and out_bytes <= _OUT_BUDGET:
                break
            nr = max(pnr, (nr // 2) // pnr * pnr)
        return nr

    # -- mapping A: weights stationary --
    def _tiles(self, units, blk, col0: int, wt: int, finish: bool = True, p0: int = 0) -> dict:
        n0, ni, r0, nr = blk[:4]
        tiles = {}
        for u in units:
            for ch in u.chunks:
                if ch not in tiles:
                    tiles[ch] = self._load(ch, n0, ni, r0, nr, col0, wt, p0)
        if finish:
            self._finish_loads()
        return tiles

    def _finish_loads(self) -> None:
        for step in self._deferred:
            step()
        self._deferred.clear()

    def _pipelined(self, blocks, load, compute) -> None:
        """Load the tiles of block i + 1 before computing block i: every engine runs its
        instructions in program order, so the next loads (and their on-chip copies) must be
        ahead of this block's compute to overlap with it."""
        pending = load(blocks[0]) if blocks else None
        for i, blk in enumerate(blocks):
            tiles = pending
            if i + 1 < len(blocks):
                pending = load(blocks[i + 1])
            compute(blk, tiles)

    def _emit_a(self, units, biases) -> None:
        b, g, ys = self.b, self.g, self.ys
        fmax = self.spec.matmul_moving_fmax
        per_image = g.oh * g.ow
        ni_max = max(1, min(g.n, fmax // per_image)) if per_image <= fmax else 1
        halves = 2 if max(c.reps * c.cs for u in units for c in u.chunks) <= self.P // 2 else 1
        for c0, nc in [(c, min(fmax, g.ow - c)) for c in range(0, g.ow, fmax)]:
            if nc == g.ow:  # whole rows: contiguous runs of rows x width for the DMA
                ic0, ic1 = 0, g.w
            else:
                ic0 = max(0, c0 * g.sw - g.pw)
                ic1 = min(g.w, (c0 + nc - 1) * g.sw + (g.kw - 1) * g.dw - g.pw + 1)
            wt = max(1, ic1 - ic0)
            pnr = max(1, min(g.oh, fmax // (ni_max * nc)))
            nr_store = g.oh if ni_max > 1 else self._store_rows(units, 1, nc, wt, pnr)
            blocks = [(n0, min(ni_max, g.n - n0), r0, nr)
                      for n0 in range(0, g.n, ni_max) for r0, nr in _ramp(g.oh, nr_store, pnr, n0 == 0)]
            # with <= 64 contraction rows, consecutive blocks alternate partition halves: their
            # input loads run on different DMA engines (a transfer uses its partitions' engines)
            blocks = [blk + ((i % halves) * (self.P // 2),) for i, blk in enumerate(blocks)]

            def compute(blk, tiles, c0=c0, nc=nc, ic0=ic0, wt=wt, pnr=pnr):
                n0, ni, r0, nr, q0 = blk
                for u in units:
                    st = self._stationary_of(u, q0)
                    out = b.sbuf((u.os, ni, nr, nc), self.out_dtype, site="conv.out", bufs=2)
                    for p0 in range(r0, r0 + nr, pnr):
                        pn = min(pnr, r0 + nr - p0)
                        acc = b.psum((u.os, ni, pn, nc), "float32", site="conv.acc")
                        self._accumulate_a(u, st, tiles, acc, ni, r0, p0, pn, c0, nc, ic0, wt, nr, q0)
                        dst = _on_chip(out, 0, u.os, (p0 - r0) * nc, ((nr * nc, ni), (1, pn * nc)))
                        self._evacuate(dst, acc, biases.get(u))
                    b.dma_copy(_hbm(self.Y, n0 * ys[0] + u.o0 * ys[1] + r0 * ys[2] + c0 * ys[3],
                                    ((ys[1], u.os), (ys[0], ni), (ys[2], nr), (ys[3], nc))), out,
                               queue=self._queues.next())

            self._pipelined(blocks, lambda blk, ic0=ic0, wt=wt: self._tiles(units, blk, ic0, wt, p0=blk[4]), compute)

    def _accumulate_a(self, u, st, tiles, acc, ni, r0, p0, pn, c0, nc, ic0, wt, nr, q0=0) -> None:
        b, g = self.b, self.g
        plan = []
        for ch in u.chunks:
            for s in ch.steps(g):
                # output columns of this block whose input column is inside the image
                a = max(c0, _ceil_div(g.pw - s.kw0 * g.dw, g.sw))
                e = min(c0 + nc, (g.w - 1 + g.pw - s.kw0 * g.dw) // g.sw + 1)
                if a < e:
                    plan.append((e - a < nc, ch, s, a, e))
        if not plan:
            b.memset(acc, 0.0)
            return
        plan.sort(key=lambda p: p[0])  # a step covering every column first: it starts the group
        partial_first = plan[0][0]
        if partial_first:
            b.memset(acc, 0.0)
        for i, (_, ch, s, a, e) in enumerate(plan):
            rows_t = ch.rows_t(g, nr)
            row = ch.row(g, p0 - r0, s.kh0)
            col = a * g.sw + s.kw0 * g.dw - g.pw - ic0
            mv = _on_chip(tiles[ch], q0, s.rows, row * wt + col,
                          ((rows_t * wt, ni), (ch.row_step(g) * wt, pn), (g.sw, e - a)))
            dst = _on_chip(acc, 0, u.os, a - c0, ((pn * nc, ni), (nc, pn), (1, e - a)))
            b.matmul(dst, st[ch, s.kh0, s.kw0], mv, accumulate=i > 0 or partial_first)

    def _evacuate(self, dst: View, acc: View, bias) -> None:
        if bias is not None:
            self.b.activation(dst, acc, "identity", bias=bias)
        else:
            self.b.activation(dst, acc, "copy")

    # -- mapping B: pixels stationary --
    def _emit_b(self, units, biases) -> None:
        """Pixels stationary. ``bp = 128 // co`` images are computed side by side so that one
        TensorE transpose turns the ``[pixels, co]`` results of all of them (slot j: image
        ``n0 + j``) into ``[(j, co), pixels]``. With stride 1 a pixel block is 128 consecutive
        positions of the padded tile (the pad columns among them are computed and dropped);
        otherwise it is whole output rows."""
        g, P = self.g, self.P
        wt = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1  # padded width the taps read
        flat = g.sh == 1 and g.sw == 1 and not any(c.sub for u in units for c in u.chunks)
        rows_b = max(1, min(g.oh, P // g.ow))
        nr_store = self._store_rows(units, 1, wt if flat else g.ow, wt, rows_b)
        bp = max(1, P // max(u.os for u in units))
        blocks = [(n0, min(bp, g.n - n0), r0, nr)
                  for n0 in range(0, g.n, bp) for r0, nr in _ramp(g.oh, nr_store, rows_b, n0 == 0)]

        # few contraction rows (<= 32, <= 64): each image's tile goes in its own partition quarter
        # (half), so its loads use that part's DMA engines (a transfer moves on the engines of its
        # partitions) and consecutive images' loads run on different engines
        rows = max(c.reps * c.cs for u in units for c in u.chunks)
        parts = 4 if rows <= P // 4 else 2 if rows <= P // 2 else 1
        count = [0]

        def load(blk):
            n0, ni, r0, nr = blk
            tiles = []
            for n in range(n0, n0 + ni):
                p0 = (count[0] % parts) * (P // parts)
                count[0] += 1
                tiles.append((self._tiles(units, (n, 1, r0, nr), -g.pw, wt, finish=False, p0=p0), p0))
            self._finish_loads()
            return tiles

        def compute(blk, tiles):
            n0, ni, r0, nr = blk
            if flat:  # flat positions (oh - r0) * wt + ow of the tile
                span = (nr - 1) * wt + g.ow
                pix = [(f, min(P, span - f)) for f in range(0, span, P)]
            else:
                pix = [((p0 - r0) * g.ow, min(rows_b, r0 + nr - p0) * g.ow) for p0 in range(r0, r0 + nr, rows_b)]
            for u in units:
                sts = [self._stationary_of(u, p0) for _, p0 in tiles]
                self._unit_b(u, sts, tiles, biases.get(u), n0, ni, r0, nr, pix, wt, flat)

        self._pipelined(blocks, load, compute)

    def _unit_b(self, u, st, tiles, bias, n0, ni, r0, nr, pix, wt, flat) -> None:
        b, g, ys, P = self.b, self.g, self.ys, self.P
        span = pix[-1][0] + pix[-1][1]
        out = b.sbuf((ni * u.os, span), self.out_dtype, site="conv.out", bufs=2)
        plan = [(ch, s) for ch in u.chunks for s in ch.steps(g)]
        pending = None  # the previous block's transpose, issued after the next block's matmuls so
        # that TensorE does not wait for that block's PSUM copies

        def transpose(f0, m, tT):
            ps = b.psum((ni * u.os, m), "float32", site="conv.accT")
            b.transpose(ps, _on_chip(tT, 0, m, 0, ((1, ni * u.os),)))
            b.activation(_on_chip(out, 0, ni * u.os, f0, ((1, m),)), ps, "copy")

        for f0, m in pix:
            tT = b.sbuf((P, ni * u.os), self.dtype, site="conv.tT")
            for j in range(ni):
                acc = b.psum((m, u.os), "float32", site="conv.acc")
                tj, p0 = tiles[j]
                for i, (ch, s) in enumerate(plan):
                    base = ch.row(g, 0, s.kh0) * wt + s.kw0 * g.dw
                    if flat:
                        win = _on_chip(tj[ch], p0, s.rows, base + f0, ((1, m),))
                    else:
                        row0 = ch.row(g, f0 // g.ow, s.kh0)
                        win = _on_chip(tj[ch], p0, s.rows, row0 * wt + s.kw0 * g.dw,
                                       ((ch.row_step(g) * wt, m // g.ow), (g.sw, g.ow)))
                    b.matmul(acc, win, st[j][ch, s.kh0, s.kw0], accumulate=i > 0)
                if pending is not None:
                    transpose(*pending)
                    pending = None
                slot = _on_chip(tT, 0, m, j * u.os, ((1, u.os),))
                if bias is not None:
                    b.tensor_tensor(slot, acc, _on_chip(bias, 0, m, 0, ((1, u.os),)), "add")
                else:
                    b.activation(slot, acc, "copy")
            pending = (f0, m, tT)
        transpose(*pending)
        for j in range(ni):  # slot j is image n0 + j
            dst = _hbm(self.Y, (n0 + j) * ys[0] + u.o0 * ys[1] + r0 * ys[2], ((ys[1], u.os), (ys[2], nr), (ys[3], g.ow)))
            row = wt if flat else g.ow
            # each image's slot on its own queue: the slots sit on different partitions (DMA engines)
            b.dma_copy(dst, _on_chip(out, j * u.os, u.os, 0, ((row, nr), (1, g.ow))), queue=self._queues.next())


# ---- grad_input by scattering taps (strided convolutions) ---------------------------------------

class _ScatterGradInput:
    """``dx[ci, ih, iw] += W[co, ci, tap].T @ dy[co, oh, ow]`` at ``ih = oh*sh + kh*dh - ph`` (and
    likewise ``iw``): each tap's product goes to the strided PSUM region it reaches. Weights
    are used as stored (``[co, ci]`` per tap is ``[K, M]``); groups are packed block-diagonally."""

    def __init__(self, b, spec, g: ConvGeom, DY: View, dys, W: View, ws, DX: View, dxs, dtype, out_dtype,
                 bias=None, bias_stride=0):
        self.b, self.spec, self.g = b, spec, g
        self.DY, self.dys, self.DX, self.dxs = DY, dys, DX, dxs
        self.dtype, self.out_dtype = dtype, out_dtype
        self.bias, self.bias_stride = bias, bias_stride
        # channel roles swapped: "inputs" are the weight's co (dy's channels), "outputs" its ci
        self.eq = ConvGeom(g.n, g.cout, g.cin, g.groups, g.oh, g.ow, g.h, g.w, g.kh, g.kw)
        self.weights = _FlippedWeights(b, spec, self.eq, W, ws, dtype)
        self.units = _units(self.eq, spec.partitions, lambda cs: (1, 1, False))
        self._queues = _Queues(spec)

    def emit(self) -> None:
        g = self.g
        fmax = self.spec.matmul_moving_fmax
        if g.w > fmax:
            raise _Decline
        rows_blk = max(1, min(g.h, fmax // g.w))
        matmuls = sum(len(u.chunks) for u in self.units) * g.n * _ceil_div(g.h, rows_blk) * g.taps
        if matmuls > _MAX_MATMULS:
            raise _Decline  # few channels on both sides of a strided kernel: no useful TensorE form
        sts = {u: self.weights.prepare(u) for u in self.units}  # st[chunk, k, kw]: tap (kh-1-k, kw-1-kw)
        biases = {u: self._bias(u) for u in self.units} if self.bias is not None else {}
        # whole images per transfer when they fit, as many per transfer as fit (a queue issues
        # its transfers one by one, each with its fixed cost); dy read once for every unit
        isz = 4 if self.DY.dtype == "float32" else 2
        chunks = sorted({c for u in self.units for c in u.chunks}, key=lambda c: c.c0)
        dy_img_bytes = len(chunks) * g.oh * g.ow * isz
        out_img_bytes = g.h * g.w * 4
        if dy_img_bytes > _IN_BUDGET or out_img_bytes > _OUT_BUDGET:
            for u in self.units:
                for n in range(g.n):
                    for ih0 in range(0, g.h, rows_blk):
                        self._block(u, sts[u], n, ih0, min(rows_blk, g.h - ih0), biases.get(u))
            return
        per = max(1, min(g.n, _IN_BUDGET // dy_img_bytes, _OUT_BUDGET // out_img_bytes))
        for n0 in range(0, g.n, per):
            self._images(chunks, sts, biases, n0, min(per, g.n - n0), rows_blk)

    def _images(self, chunks, sts, biases, n0: int, ng: int, rows_blk: int) -> None:
        """Images [n0, n0 + ng): dy in one transfer per chunk, each unit's dx in one."""
        b, g, dxs = self.b, self.g, self.dxs
        dy = self._load_dy_images(chunks, n0, ng)
        for u in self.units:
            out = b.sbuf((u.os, ng, g.h, g.w), self.out_dtype, site="conv.outimg", bufs=2)
            for k in range(ng):
                img = {ch: (t, 0, k * g.oh * g.ow) for ch, t in dy.items()}
                for ih0 in range(0, g.h, rows_blk):
                    self._block(u, sts[u], n0 + k, ih0, min(rows_blk, g.h - ih0), biases.get(u), img,
                                (out, k * g.h * g.w))
            b.dma_copy(_hbm(self.DX, n0 * dxs[0] + u.o0 * dxs[1],
                            ((dxs[1], u.os), (dxs[0], ng), (dxs[2], g.h), (dxs[3], g.w))), out,
                       queue=self._queues.next())

    def _bias(self, u: _Unit) -> View:
        bias = self.b.sbuf((u.os, 1), "float32", site="conv.bias", bufs=len(self.units))
        raw = bias if self.bias.dtype == "float32" else self.b.sbuf((u.os, 1), self.bias.dtype,
                                                                      site="conv.bias.raw", bufs=1)
        self.b.dma_copy(raw, _hbm(self.bias, u.o0 * self.bias_stride, ((self.bias_stride, u.os), (1, 1))))
        if raw is not bias:
            self.b.tensor_copy(bias, raw)
        return bias

    def _load_dy_images(self, chunks, n0: int, ng: int) -> dict:
        """``dy`` of images [n0, n0 + ng), one transfer per channel chunk: [cs, ng, oh, ow]."""
        b, dys, g = self.b, self.dys, self.g
        tiles = {}
        for i, ch in enumerate(chunks):
            t = b.sbuf((ch.cs, ng, g.oh, g.ow), self.DY.dtype, site=f"conv.dyimg{i}", bufs=2)
            b.dma_copy(t, _hbm(self.DY, n0 * dys[0] + ch.c0 * dys[1],
                               ((dys[1], ch.cs), (dys[0], ng), (dys[2], g.oh), (dys[3], g.ow))),
                       queue=self._queues.next())
            tiles[ch] = t
        return tiles

    def _load_dy(self, u: _Unit, n: int, oh_lo: int, oh_hi: int) -> dict:
        b, dys, g = self.b, self.dys, self.g
        tiles = {}
        for ch in u.chunks:
            t = b.sbuf((ch.cs, oh_hi - oh_lo, g.ow), self.DY.dtype, site="conv.dy", bufs=2)
            b.dma_copy(t, _hbm(self.DY, n * dys[0] + ch.c0 * dys[1] + oh_lo * dys[2],
                               ((dys[1], ch.cs), (dys[2], oh_hi - oh_lo), (dys[3], g.ow))), queue=self._queues.next())
            tiles[ch] = (t, oh_lo, 0)
        return tiles

    def _block(self, u: _Unit, st, n, ih0, nr, bias=None, dy_img=None, out_img=None) -> None:
        b, g = self.b, self.g
        dxs = self.dxs
        # output rows reaching input rows [ih0, ih0 + nr) through some kernel row
        oh_lo = max(0, _ceil_div(ih0 + g.ph - (g.kh - 1) * g.dh, g.sh))
        oh_hi = min(g.oh, (ih0 + nr - 1 + g.ph) // g.sh + 1)
        acc = b.psum((u.os, nr, g.w), "float32", site="conv.acc")
        b.memset(acc, 0.0)
        if oh_lo < oh_hi:
            tiles = dy_img if dy_img is not None else self._load_dy(u, n, oh_lo, oh_hi)
            for kh in range(g.kh):
                a = max(oh_lo, _ceil_div(ih0 + g.ph - kh * g.dh, g.sh))
                e = min(oh_hi, (ih0 + nr - 1 + g.ph - kh * g.dh) // g.sh + 1)
                if a >= e:
                    continue
                for kw in range(g.kw):
                    ca = max(0, _ceil_div(g.pw - kw * g.dw, g.sw))
                    ce = min(g.ow, (g.w - 1 + g.pw - kw * g.dw) // g.sw + 1)
                    if ca >= ce:
                        continue
                    ih = a * g.sh + kh * g.dh - g.ph - ih0
                    iw = ca * g.sw + kw * g.dw - g.pw
                    dst = _on_chip(acc, 0, u.os, ih * g.w + iw, ((g.sh * g.w, e - a), (g.sw, ce - ca)))
                    for ch in u.chunks:
                        t, row0, base = tiles[ch]
                        mv = _on_chip(t, 0, ch.cs, base + (a - row0) * g.ow + ca, ((g.ow, e - a), (1, ce - ca)))
                        b.matmul(dst, st[ch, g.kh - 1 - kh, g.kw - 1 - kw], mv, accumulate=True)
        if out_img is not None:
            res = _on_chip(out_img[0], 0, u.os, out_img[1] + ih0 * g.w, ((1, nr * g.w),))
        else:
            res = b.sbuf((u.os, nr, g.w), self.out_dtype, site="conv.out")
        if bias is not None:
            b.activation(res, acc, "identity", bias=bias)
        else:
            b.activation(res, acc, "copy")
        if out_img is None:
            b.dma_copy(_hbm(self.DX, n * dxs[0] + u.o0 * dxs[1] + ih0 * dxs[2],
                            ((dxs[1], u.os), (dxs[2], nr), (dxs[3], g.w))), res)


# ---- rules ----------------------------------------------------------------------------------------

def _grad_weight_rows(b, spec, g: ConvGeom, X: View, xs, DY: View, dys, GW: View, gws, dtype: str, out_dtype: str,
                      form: str, transposed: bool) -> str:
    """grad_weight of ``g``; a kernel of more taps than partitions (ViT's 16x16 patches: 256)
    in bands of kernel rows, each the grad_weight of the same convolution with that band's
    rows as its kernel and the input seen from the band's first row (so without top padding,
    as every band is then an ordinary convolution over the same output rows)."""
    from ._conv_wgrad import grad_weight_program

    if form == "patch":
        return patch_grad_weight(b, spec, g, X, xs, DY, dys, GW, gws, dtype, out_dtype)
    P = spec.partitions
    if g.taps <= P or transposed or g.ph or g.groups != 1 or g.kw > P:
        return grad_weight_program(b, spec, g, X, xs, DY, dys, GW, gws, dtype, out_dtype, form)
    if g.ow > 1 and dys[3] != 1:
        # dy with its channels innermost (a patch embedding's dy, from the (b, patches, d) tokens) is
        # read one element per descriptor by every band: 3% of the bound at ViT-tiny's shape
        raise _Decline
    band = P // g.kw  # kernel rows per band
    forms = []
    for k0 in range(0, g.kh, band):
        kn = min(band, g.kh - k0)
        h = (g.oh - 1) * g.sh + (kn - 1) * g.dh + 1  # the input rows this band's taps read
        sub = ConvGeom(g.n, g.cin, g.cout, 1, h, g.w, g.oh, g.ow, kn, g.kw, g.sh, g.sw, 0, g.pw, g.dh, g.dw)
        Xb = _hbm(X, k0 * g.dh * xs[2], ((xs[0], g.n), (xs[1], g.cin), (xs[2], h), (xs[3], g.w)))
        GWb = _hbm(GW, k0 * gws[2], ((gws[0], g.cout), (gws[1], g.cin), (gws[2], kn), (gws[3], g.kw)))
        forms.append(grad_weight_program(b, spec, sub, Xb, xs, DY, dys, GWb, gws, dtype, out_dtype, form))
    return f"{len(forms)} kernel-row bands: {forms[0]}"


def _pe_dtype(*metas: TensorMeta) -> str | None:
    dts = {m.device_dtype for m in metas if m is not None}
    if len(dts) != 1:
        return None
    dt = dts.pop()
    return dt if dt in PE_DTYPES else None


def lower_conv(call: Call, spec):
    """``convolution_overrideable`` / ``convolution``: the forward convolution (1-D or 2-D),
    transposed ones included."""
    n = call.named()
    if n.get("transposed", False):
        return _lower_conv_transpose(call, spec)
    x, w, bias = n.get("input"), n.get("weight"), n.get("bias")
    if len(call.outputs) != 1:
        return None
    parsed = conv_geometry(x, w, n.get("stride"), n.get("padding"), n.get("dilation"), n.get("groups", 1),
                           n.get("transposed", False))
    if parsed is None:
        return None
    g, x2, w2 = parsed
    out = call.outputs[0]
    out2 = _as_2d(out) if out.ndim == 3 else out
    if out2.shape != (g.n, g.cout * g.groups, g.oh, g.ow) or out.is_complex:
        return None
    bias = bias if isinstance(bias, TensorMeta) and bias.numel else None
    dtype = _pe_dtype(x2, w2)
    if dtype is None:
        return None
    forms = ("sliding", "patch", "patch-rows") if patch_applies(g) else ("sliding",)
    return _shortest(_forward_program(call, spec, form, g, x, x2, w, w2, out, out2, bias, dtype) for form in forms)


def _forward_program(call: Call, spec, form: str, g: ConvGeom, x, x2, w, w2, out, out2, bias, dtype: str):
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        X = hbm_input(b, "in_input", x)
        Wv = hbm_input(b, "in_weight", w)
        Y = hbm_output(b, "out", out)
        Bv = hbm_input(b, "in_bias", bias) if bias is not None else None
        X, Wv, Y = (_view_2d(v, m) for v, m in ((X, x), (Wv, w), (Y, out)))
        bias_stride = bias.stride[0] if bias is not None else 0
        try:
            if form in ("patch", "patch-rows"):
                emit = patch_forward if form == "patch" else patch_forward_rows
                mapping = emit(b, spec, g, X, x2.stride, Wv, w2.stride, Y, out2.stride, Bv, bias_stride,
                               dtype, out2.device_dtype)
            else:
                fwd = _Forward(b, spec, g, X, x2.stride, Y, out2.stride, _ForwardWeights, Wv, w2.stride,
                               Bv, bias_stride, dtype, out2.device_dtype)
                mapping = fwd.emit()
        except _Decline:
            return None
    return _build(b, {"lowering": "conv", "mapping": mapping})


def _shortest(programs):
    """The Program the simulator times shortest among ``programs`` (None ones skipped): where
    several forms apply, each is built and priced by what it does, and the quickest is kept."""
    from ..sim import simulate

    best = None
    for prog in programs:
        if prog is None:
            continue
        t = simulate(prog).summary.total_ns
        if best is None or t < best[0]:
            best = (t, prog)
    return None if best is None else best[1]


def _build(b: TileBuilder, meta: dict):
    from ..errors import CapacityError

    try:
        return b.build(meta=meta, shrink_rotation=True)
    except CapacityError:
        return None  # a shape whose tiles do not fit SBUF: the generic lowering takes it, labelled


def _view_2d(view: View, meta: TensorMeta) -> View:
    if meta.ndim == 4:
        return view
    m2 = _as_2d(meta)
    return _hbm(View(view.buffer, AP(view.ap.buffer, view.ap.dtype, 0, view.ap.dims), view.shape), view.ap.offset,
                tuple(zip(m2.stride, m2.shape)))


def grad_input_program(b: TileBuilder, spec, g: ConvGeom, DY: View, dys, W: View, ws, DX: View, dxs, dtype: str,
                       out_dtype: str, bias=None, bias_stride=0) -> str:
    """Emit ``grad_input`` of the convolution ``g`` into ``b`` (plus ``bias`` per input channel:
    a transposed convolution); returns the form used."""
    if g.sh == 1 and g.sw == 1 and g.ph <= g.dh * (g.kh - 1) and g.pw <= g.dw * (g.kw - 1):
        # stride 1: the forward convolution of dy with the flipped kernel, channel roles swapped
        eq = ConvGeom(g.n, g.cout, g.cin, g.groups, g.oh, g.ow, g.h, g.w, g.kh, g.kw, 1, 1,
                      g.dh * (g.kh - 1) - g.ph, g.dw * (g.kw - 1) - g.pw, g.dh, g.dw)
        fwd = _Forward(b, spec, eq, DY, dys, DX, dxs, _FlippedWeights, W, ws, bias, bias_stride, dtype, out_dtype)
        return "gather:" + fwd.emit()
    _ScatterGradInput(b, spec, g, DY, dys, W, ws, DX, dxs, dtype, out_dtype, bias, bias_stride).emit()
    return "scatter"


def _lower_conv_transpose(call: Call, spec):
    """A transposed convolution is the ``grad_input`` of the convolution whose weight it shares:
    that convolution's input has the transposed one's output shape and vice versa."""
    n = call.named()
    x, w, bias = n.get("input"), n.get("weight"), n.get("bias")
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if not isinstance(x, TensorMeta) or not isinstance(w, TensorMeta) or out is None or x.ndim not in (3, 4):
        return None
    if out.ndim != x.ndim or x.is_complex or out.numel == 0:
        return None
    groups = n.get("groups", 1)
    # the convolution: input shaped like ``out`` (channels = w.shape[1] * groups), weight ``w``
    parsed = conv_geometry(out, w, n.get("stride"), n.get("padding"), n.get("dilation"), groups)
    if parsed is None:
        return None
    g, out2, w2 = parsed
    x2 = _as_2d(x) if x.ndim == 3 else x
    if x2.shape != (g.n, g.cout * g.groups, g.oh, g.ow):
        return None
    bias = bias if isinstance(bias, TensorMeta) and bias.numel else None
    dtype = _pe_dtype(x2, w2)
    if dtype is None:
        return None
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        X = _view_2d(hbm_input(b, "in_input", x), x)
        Wv = _view_2d(hbm_input(b, "in_weight", w), w)
        Y = _view_2d(hbm_output(b, "out", out), out)
        Bv = hbm_input(b, "in_bias", bias) if bias is not None else None
        try:
            form = grad_input_program(b, spec, g, X, x2.stride, Wv, w2.stride, Y, out2.stride, dtype,
                                      out2.device_dtype, Bv, bias.stride[0] if bias is not None else 0)
        except _Decline:
            return None
    return _build(b, {"lowering": "conv", "mapping": "transposed:" + form})


def lower_conv_backward(call: Call, spec):
    """``convolution_backward_overrideable``: grad_input, grad_weight and grad_bias as asked.

    grad_weight has up to three forms (pixel blocks on the partitions, pixels transposed onto
    them, or -- stride == kernel -- a matmul over the patches); where several apply, each
    Program is built and the one the simulator times shortest is kept."""
    from ._conv_wgrad import transposed_form_feasible

    parsed = _backward_geometry(call)
    forms = ["blocks"]
    if parsed is not None and parsed[1] and transposed_form_feasible(spec, parsed[0], parsed[2]):
        forms.append("transposed")
    if parsed is not None and parsed[1] and patch_applies(parsed[0]) and not call.named().get("transposed", False):
        forms.append("patch")
    return _shortest(_backward_program(call, spec, form) for form in forms)


def _backward_geometry(call: Call):
    """(conv geometry, grad_weight asked, PE dtype) of a backward call, or None."""
    n = call.named()
    dy, x, w = n.get("grad_output"), n.get("input"), n.get("weight")
    mask = tuple(bool(v) for v in (n.get("output_mask") or (True, True, True)))
    if not all(isinstance(t, TensorMeta) for t in (dy, x, w)):
        return None
    conv_in = dy if n.get("transposed", False) else x
    parsed = conv_geometry(conv_in, w, n.get("stride"), n.get("padding"), n.get("dilation"), n.get("groups", 1))
    if parsed is None:
        return None
    dtype = _pe_dtype(_as_2d(x) if x.ndim == 3 else x, parsed[2], _as_2d(dy) if dy.ndim == 3 else dy)
    return (parsed[0], mask[1], dtype) if dtype is not None else None


def _backward_program(call: Call, spec, gw_form: str):
    from ._conv_wgrad import grad_bias_program

    n = call.named()
    dy, x, w = n.get("grad_output"), n.get("input"), n.get("weight")
    mask = tuple(bool(v) for v in (n.get("output_mask") or (True, True, True)))
    transposed = bool(n.get("transposed", False))
    if not isinstance(dy, TensorMeta) or len(call.outputs) != sum(mask):
        return None
    # a transposed convolution's backward is the plain one's with grad_output and input swapped:
    # that convolution reads (the shape of) grad_output and writes (that of) the input
    conv_in, conv_out = (dy, x) if transposed else (x, dy)
    parsed = conv_geometry(conv_in, w, n.get("stride"), n.get("padding"), n.get("dilation"), n.get("groups", 1))
    if parsed is None or not isinstance(conv_out, TensorMeta):
        return None
    g, _, w2 = parsed
    x2 = _as_2d(x) if x.ndim == 3 else x
    dy2 = _as_2d(dy) if dy.ndim == 3 else dy
    co2 = x2 if transposed else dy2
    if co2.shape != (g.n, g.cout * g.groups, g.oh, g.ow):
        return None
    dtype = _pe_dtype(x2, w2, dy2)
    if dtype is None:
        return None
    outs = iter(call.outputs)
    gi = next(outs) if mask[0] else None
    gw = next(outs) if mask[1] else None
    gb = next(outs) if mask[2] else None
    if gi is not None and gi.shape != x.shape or gw is not None and gw.shape != w.shape:
        return None
    b = TileBuilder(call.op, spec)
    forms = []
    with b.provenance(op=call.op):
        DY = _view_2d(hbm_input(b, "in_grad_output", dy), dy)
        try:
            if gi is not None or gw is not None:
                Wv = _view_2d(hbm_input(b, "in_weight", w), w)
            if gw is not None:
                X = _view_2d(hbm_input(b, "in_input", x), x)
            if gi is not None:
                gi2 = _as_2d(gi) if gi.ndim == 3 else gi
                DX = _view_2d(hbm_output(b, "grad_input", gi), gi)
                if transposed:  # the plain convolution of grad_output
                    fwd = _Forward(b, spec, g, DY, dy2.stride, DX, gi2.stride, _ForwardWeights, Wv, w2.stride, None,
                                   0, dtype, gi2.device_dtype)
                    forms.append("grad_input=" + fwd.emit())
                else:
                    forms.append("grad_input=" + grad_input_program(b, spec, g, DY, dy2.stride, Wv, w2.stride, DX,
                                                                    gi2.stride, dtype, gi2.device_dtype))
            if gw is not None:
                gw2 = _as_2d(gw) if gw.ndim == 3 else gw
                GW = _view_2d(hbm_output(b, "grad_weight", gw), gw)
                (Xa, xa), (Ya, ya) = ((DY, dy2), (X, x2)) if transposed else ((X, x2), (DY, dy2))
                forms.append("grad_weight=" + _grad_weight_rows(b, spec, g, Xa, xa.stride, Ya, ya.stride, GW,
                                                                gw2.stride, dtype, gw2.device_dtype, gw_form,
                                                                transposed))
            if gb is not None:
                GB = hbm_output(b, "grad_bias", gb)
                # one bias per channel of grad_output, summed over its images and pixels
                gbg = ConvGeom(dy2.shape[0], 1, dy2.shape[1], 1, 1, 1, dy2.shape[2], dy2.shape[3], 1, 1)
                grad_bias_program(b, spec, gbg, DY, dy2.stride, GB, gb.stride[0] if gb.ndim else 1, gb.device_dtype)
                forms.append("grad_bias")
        except _Decline:
            return None
    return _build(b, {"lowering": "conv_backward", "forms": " ".join(forms)})


add_rules(["convolution_overrideable", "convolution"], Rule("conv", lower_conv, "2-D convolution on TensorE"))
add_rules(["convolution_backward_overrideable", "convolution_backward"],
          Rule("conv_backward", lower_conv_backward, "convolution backward on TensorE"))
