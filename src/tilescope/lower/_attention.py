"""Scaled dot-product attention as flash-style Programs: one forward, one backward.

``softmax(scale * q @ k.T + mask) @ v`` per (batch, head), never materialising the score
matrix in HBM. Both Programs are built with the tile builder over the tensors *as stored*:
``q``/``k``/``v`` may be strided views (the usual ``view(B, L, H, E).transpose(1, 2)`` of one
projection), the mask any broadcast of ``[B, H, L, S]``, and key/value heads may be shared
by several query heads (GQA/MQA: ``Hq % Hk == 0``, or an ``expand`` with stride 0) -- then
each distinct key/value head is loaded once for all the query heads that use it.

Forward (two passes per block of up to 512 queries; PSUM is the only place TensorE
writes, and ScalarE and VectorE share its port [arch], so each score element crosses that
port exactly twice):

1. **row max** -- ``S = Q K^T`` per 128 queries x 512 keys into one PSUM bank, VectorE
   ``tensor_reduce(max)``. Masks enter the accumulation on TensorE (a ``[2, S]`` hi/lo row
   for masks broadcast over queries, identity x mask tiles for full masks, a constant
   lower-triangular bias tile on the causal diagonal), so VectorE reads each score once.
2. **probabilities and output** -- ``S^T = K Q^T`` per 128 keys x 512 queries, with the
   row max folded in as one more contraction row, so ScalarE's ``exp`` writes ``P^T``
   straight out of PSUM in the layout the ``P @ V`` matmul needs (keys on partitions):
   no transposes of ``P``. A column of ones beside ``V`` yields the softmax denominator in
   the same matmuls. Row masks are ScalarE's per-partition bias; full masks are added
   exactly by transposing matmuls of their hi/lo bf16 parts.

Backward (FlashAttention-2 order: key/value tiles outer, query tiles inner; ``dK``/``dV``
accumulate in PSUM, ``dQ`` in SBUF): ``S`` again, ``P = exp(scale*S - lse)`` (ScalarE,
per-partition bias), ``dP = dO V^T``, ``dS = P * (dP - D)`` with ``D = rowsum(dO * O)``,
``dV += P^T dO``, ``dK += dS^T Q``, ``dQ += dS K`` (``dS`` transposed on TensorE).

Dropout uses VectorE's ``dropout`` instruction (the Program draws its own random numbers;
the device's values come from CPU torch with the device generator's state). Causal is
top-left aligned, as torch's ``is_causal``; fully masked blocks are skipped.

>>> from tilescope.lower import TensorMeta
>>> q = TensorMeta((1, 2, 256, 64), (32768, 16384, 64, 1), "bfloat16")
>>> prog = attention_forward(q, q, q, None, causal=True, scale=0.125, dropout_p=0.0)
>>> prog.summary_counts()["matmul"] > 0, [b for b in prog.outputs]
(True, ['out', 'logsumexp'])
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from math import prod

from ..errors import ProgramError, TilescopeError
from ..program import TileBuilder, View
from ..spec import CoreSpec, preset
from ._call import TensorMeta
from ._elementwise import broadcast_strides
from ._layout import hbm_input, hbm_output, strided_view

__all__ = ["attention_forward", "attention_backward", "lower_attention", "lower_attention_backward",
           "AttentionForm", "attention_form", "BIG"]

BIG = 1.0e30  # masked logits are clamped to -BIG: finite, so 0 * mask never makes NaN on TensorE
_PE_DTYPES = ("float32", "bfloat16", "float16")
_KB = 512  # keys per pass-1 block / backward tile (one PSUM bank of fp32)
_QB = 4  # query tiles (of 128) per forward query block (512 queries: one PSUM bank of fp32)
# per partition: SBUF for the resident key/value heads (K^T and V kept on chip for all query blocks):
# three homes (the head finishing, the current one, the prefetched one), or two for long sequences;
# longer still, each query block streams the keys it uses
_RESIDENT_BYTES = 120 * 1024
_MASK_CACHE_BYTES = 48 * 1024  # per partition: a full mask's blocks kept from pass 1 to pass 2 up to this


class _Decline(TilescopeError):
    """The call is outside this kernel's form (the rule returns None, the generic lowering runs)."""


@dataclass(frozen=True)
class AttentionForm:
    """The validated problem: 4-D metadata, head mapping, mask kind.

    ``mask_kind``: None, ``"row"`` (broadcast over queries: a padding mask ``[B, 1, 1, S]``)
    or ``"full"``. ``kv_head(h)`` is the key/value head of query head ``h``.
    """

    q: TensorMeta
    k: TensorMeta
    v: TensorMeta
    mask: TensorMeta | None
    mask_strides: tuple[int, int, int, int] | None
    mask_kind: str | None

    @property
    def B(self):
        return self.q.shape[0]

    @property
    def H(self):
        return self.q.shape[1]

    @property
    def L(self):
        return self.q.shape[2]

    @property
    def S(self):
        return self.k.shape[2]

    @property
    def E(self):
        return self.q.shape[3]

    @property
    def Ev(self):
        return self.v.shape[3]

    def kv_head(self, h: int) -> int:
        hk = self.k.shape[1]
        return h // (self.H // hk)

    def kv_key(self, b: int, h: int) -> tuple[int, int]:
        """Element offsets of the key and value head that query head ``(b, h)`` reads."""
        kh = self.kv_head(h)
        return (b * self.k.stride[0] + kh * self.k.stride[1], b * self.v.stride[0] + kh * self.v.stride[1])


def _as4d(m: TensorMeta) -> TensorMeta:
    if m.ndim == 4:
        return m
    if m.ndim == 3:  # (H, L, E): one batch
        return TensorMeta((1,) + m.shape, (m.extent or 1,) + m.stride, m.dtype)
    raise _Decline(f"attention operands must be 3-D or 4-D, got {m.shape}")


def attention_form(q, k, v, mask) -> AttentionForm:
    """Validate and canonicalise the operands (raises ``_Decline`` outside the kernel's form)."""
    if not all(isinstance(t, TensorMeta) for t in (q, k, v)):
        raise _Decline("query, key and value must be tensors")
    q, k, v = _as4d(q), _as4d(k), _as4d(v)
    if q.dtype not in _PE_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise _Decline(f"dtypes {q.dtype}/{k.dtype}/{v.dtype}: the kernel takes one of {_PE_DTYPES}")
    B, H, L, E = q.shape
    Bk, Hk, S, Ek = k.shape
    if Ek != E or v.shape[:3] != (Bk, Hk, S) or Bk != B or Hk < 1 or H % Hk:
        raise _Decline(f"shapes q {q.shape}, k {k.shape}, v {v.shape} are not one attention")
    if min(B, H, L, S, E, v.shape[3]) == 0:
        raise _Decline("empty attention")
    if any(t.stride[3] != 1 for t in (q, k, v) if t.shape[3] > 1):
        raise _Decline("the head dim must be contiguous (stride 1)")
    if v.shape[3] > 511:
        raise _Decline(f"value head dim {v.shape[3]} > 511: its accumulator (and the row sum) exceeds a PSUM bank")
    strides, kind = None, None
    if mask is not None:
        if not isinstance(mask, TensorMeta) or mask.dtype not in _PE_DTYPES + ("bool",) or mask.ndim > 4:
            raise _Decline("attn_mask must be a float or bool tensor of at most 4 dims")
        try:
            strides = broadcast_strides(mask, (B, H, L, S))
        except Exception:  # noqa: BLE001 - not broadcastable: not this kernel's call
            raise _Decline(f"attn_mask {mask.shape} does not broadcast to {(B, H, L, S)}") from None
        if any(n not in (1, want) for n, want in zip(((1,) * (4 - mask.ndim)) + mask.shape, (B, H, L, S))):
            raise _Decline(f"attn_mask {mask.shape} does not broadcast to {(B, H, L, S)}")
        kind = "row" if (L == 1 or strides[2] == 0) else "full"
    return AttentionForm(q, k, v, mask, strides, kind)


# ---- useful work -------------------------------------------------------------------------------
def scored_pairs(L: int, S: int, causal: bool) -> int:
    """(query, key) pairs the attention scores: all ``L * S``, or causal (top-left aligned, key
    ``s <= q``) the lower triangle. A boolean / additive mask's values are data: its pairs count.

    >>> scored_pairs(4, 4, True), scored_pairs(4, 6, False)
    (10, 24)
    """
    if not causal:
        return L * S
    tri = min(L, S)  # queries 0..tri-1 see q + 1 keys; the rest see all S
    return tri * (tri + 1) // 2 + (L - tri) * S


def useful_flops(B: int, H: int, L: int, S: int, E: int, Ev: int, causal: bool, backward: bool = False) -> int:
    """FLOPs of the attention's own math per scored pair -- what "% of TensorE peak" counts, not
    what the kernel executes (its second scoring pass, mask and stabiliser matmuls are overhead):
    forward Q K^T (2E) and P V (2Ev); backward the recomputed S (2E), dP = dO V^T (2Ev),
    dV = P^T dO (2Ev), dQ = dS K (2E) and dK = dS^T Q (2E) -- 2.5x the forward at E == Ev.

    >>> useful_flops(1, 1, 128, 128, 64, 64, False)
    4194304
    >>> useful_flops(1, 1, 128, 128, 64, 64, False, backward=True) / useful_flops(1, 1, 128, 128, 64, 64, False)
    2.5
    """
    per_pair = 2 * (3 * E + 2 * Ev) if backward else 2 * (E + Ev)
    return B * H * scored_pairs(L, S, causal) * per_pair


# ---- shared building blocks -----------------------------------------------------------------

def _mat(view: View, offset: int, rows: int, rs: int, cols: int, cs: int) -> View:
    """A [rows, cols] region of an HBM view at element ``offset`` (relative to the view)."""
    ap = view.ap
    from ..isa import AP

    return View(view.buffer, AP(ap.buffer, ap.dtype, ap.offset + offset, ((rs, rows), (cs, cols))), (rows, cols))


def _dma_rows(b: TileBuilder, tile: View, hbm: View, base: int, rs: int, rows: int, cols: int, cs: int = 1,
              *, store: bool = False) -> None:
    """Move ``rows`` rows of ``cols`` elements (row stride ``rs``, column stride ``cs``, from element
    ``base`` of ``hbm``) between HBM and ``tile`` ``[128, k, cols]`` whose slot ``i`` holds rows
    ``128 i .. 128 i + 127`` on the partitions: one transfer for the full slots and one for a ragged
    last slot, instead of one per 128 rows (a DMA queue issues one transfer at a time)."""
    full, rem = divmod(rows, 128)
    pairs = []
    if full:
        hv = View(hbm.buffer, _ap(hbm, base, ((rs, 128), (128 * rs, full), (cs, cols))), (128, full, cols))
        pairs.append((tile[:, :full, :cols], hv))
    if rem:
        pairs.append((tile[:rem, full, :cols], _mat(hbm, base + full * 128 * rs, rem, rs, cols, cs)))
    for t, h in pairs:
        if store:
            _dma(b, h, t)
        else:
            _dma(b, t, h)


_RINGS: "weakref.WeakKeyDictionary[TileBuilder, list[int]]" = weakref.WeakKeyDictionary()


def _dma(b: TileBuilder, dst, src) -> None:
    """One transfer on the next DMA queue, round-robin per Program: each queue issues its transfers
    one after another at a fixed cost (~1.3 us) [dma guide], so a kernel spreads its loads and stores
    over the queues instead of leaving every transfer of one tensor on one queue."""
    ring = _RINGS.setdefault(b, [0])
    ring[0] = (ring[0] + 1) % b.spec.dma.queues
    b.dma_copy(dst, src, queue=ring[0])


def _chunks(n: int, size: int):
    return [(s, min(size, n - s)) for s in range(0, n, size)]


class _Consts:
    """Constant tiles made once per Program on GpSimd/VectorE: identity, ones, causal bias."""

    def __init__(self, b: TileBuilder, aux_dt: str, pe_dt: str, prefix: str = "attn.c"):
        self.b = b
        self.aux_dt, self.pe_dt, self.prefix = aux_dt, pe_dt, prefix
        self._ident = self._ones = self._causal = self._ones_col = None
        self._twins: dict = {}

    def like(self, dtype: str) -> "_Consts":
        """These constants in ``dtype`` (identity, ones and the causal bias are exact in bf16, whose
        matmuls run at 4x fp32's rate: an fp32 attention adds its causal bias and a boolean mask
        with bf16 matmuls into the same fp32 PSUM accumulation)."""
        if dtype == self.aux_dt:
            return self
        if dtype not in self._twins:
            self._twins[dtype] = _Consts(self.b, dtype, self.pe_dt, prefix=f"{self.prefix}.{dtype}")
        return self._twins[dtype]

    @property
    def exact(self) -> "_Consts":
        """The constants at bf16 (exact there) when this set is fp32."""
        return self.like("bfloat16") if self.aux_dt == "float32" else self

    def _iota_diff(self, site):
        t = self.b.sbuf((128, 128), "float32", site=site, bufs=1)
        self.b.iota(t, base=0, partition_step=1, steps=(-1,))  # t[p, j] = p - j
        return t

    @property
    def ident(self) -> View:
        if self._ident is None:
            d = self._iota_diff(self.prefix + ".iota_i")
            self._ident = self.b.sbuf((128, 128), self.aux_dt, site=self.prefix + ".ident", bufs=1)
            self.b.tensor_scalar(self._ident, d, "equal", 0.0, engine="pool")
        return self._ident

    @property
    def causal(self) -> View:
        """``[q, s]``: 0 where ``s <= q`` (kept), ``-BIG`` above the diagonal (bf16 holds both exactly)."""
        if self._causal is None:
            d = self._iota_diff(self.prefix + ".iota_c")
            keep = self.b.sbuf((128, 128), "float32", site=self.prefix + ".keep", bufs=1)
            self.b.tensor_scalar(keep, d, "greater_equal", 0.0, engine="pool")
            self._causal = self.b.sbuf((128, 128), self.aux_dt, site=self.prefix + ".causal", bufs=1)
            self.b.tensor_scalar(self._causal, keep, "subtract", 1.0, "multiply", BIG, engine="pool")
        return self._causal

    @property
    def ones(self) -> View:
        """``[3, 512]`` of ones: the stationary side of the hi/lo (or three-part) contraction rows."""
        if self._ones is None:
            self._ones = self.b.sbuf((3, 512), self.aux_dt, site=self.prefix + ".ones", bufs=1)
            self.b.memset(self._ones, 1.0, engine="pool")
        return self._ones

    @property
    def ones_col(self) -> View:
        if self._ones_col is None:
            self._ones_col = self.b.sbuf((128, 1), self.pe_dt, site=self.prefix + ".ones_col", bufs=1)
            self.b.memset(self._ones_col, 1.0, engine="pool")
        return self._ones_col


def _load_rows(b: TileBuilder, src: View, base: int, rs: int, rows: int, cols: int, dtype: str, site: str,
               ones: int = 0, bufs: int | None = None):
    """DMA ``rows`` x ``cols`` of a row-major HBM matrix (row stride ``rs``) into ``[128, cols + ones]``
    tiles, rows on the partitions (contiguous runs of ``cols`` elements: the DMA is priced by the real
    access pattern); ``ones`` extra columns of ones. Returns ``[(r0, blocks, tiles)]`` per 512 rows."""
    width = cols + ones
    groups = []
    for r0, rw in _chunks(rows, 512):
        blocks = _chunks(rw, 128)
        t = b.sbuf((128, len(blocks), width), dtype, site=site + ".rows", bufs=bufs)
        _dma_rows(b, t, src, base + r0 * rs, rs, rw, cols)
        if ones:
            b.memset(t[:, :, cols:width], 1.0, engine="pool")
        groups.append((r0, blocks, [t[:, k, :] for k in range(len(blocks))]))
    return groups


def _transpose_groups(b: TileBuilder, groups, width: int, dtype: str, dst_tiles, col0: int = 0,
                      engine: str = "act") -> None:
    for r0, blocks, loaded in groups:
        _transpose_into(b, loaded, blocks, width, dtype, dst_tiles, col0 + r0, engine)


def _load_transposed(b: TileBuilder, src: View, base: int, rs: int, rows: int, cols: int, dtype: str,
                     dst_tiles, col0: int, site: str, ones: int = 0) -> None:
    """Load rows (:func:`_load_rows`) and write their transpose into ``dst_tiles`` (one ``[<=128, *]``
    SBUF tile per 128 columns) at column ``col0``: TensorE transposes 128-row blocks into PSUM (four
    per bank), one copy per bank takes them back to SBUF. Extra ``ones`` columns become rows of ones."""
    groups = _load_rows(b, src, base, rs, rows, cols, dtype, site, ones)
    _transpose_groups(b, groups, cols + ones, dtype, dst_tiles, col0)


def _transpose_into(b: TileBuilder, loaded, blocks, width: int, dtype: str, dst_tiles, col: int,
                    engine: str = "act") -> None:
    """Transpose row tiles ``loaded[k][:rows_k, :width]`` into ``dst_tiles`` (per 128 columns) at
    ``col``; ``engine`` copies them out of PSUM (the one that next works on them, to keep order)."""
    total = sum(kw for _, kw in blocks)
    for ci, (c0, cw) in enumerate(_chunks(width, 128)):
        ps = b.psum((128, 512), dtype, site="attn.ps.a")
        for (k0, kw), t in zip(blocks, loaded):
            b.transpose(ps[:cw, k0:k0 + kw], t[:kw, c0:c0 + cw])
        b.tensor_copy(dst_tiles[ci][:cw, col:col + total], ps[:cw, :total], engine=engine)


class _KV:
    """One key/value head on chip: ``K^T`` (per 128 rows of the head dim) and ``V`` rows.

    Resident (loaded once, shared by every query head and block that uses it) when it fits
    ``_RESIDENT_BYTES`` per partition; otherwise each block loads what it uses. ``ones``
    rows of ones follow ``K^T``'s last head-dim row (the forward's stabiliser contraction);
    ``ones_column``: a column of ones beside ``V`` (the softmax denominator).
    """

    def __init__(self, b, form: AttentionForm, K: View, V: View, k_off: int, v_off: int, pe_dt: str,
                 ones_column: bool, ones: int = 0, resident: bool | None = None, slots: "_KVSlots | None" = None):
        self.b, self.form, self.K, self.V = b, form, K, V
        self.k_off, self.v_off, self.pe_dt, self.ones = k_off, v_off, pe_dt, ones
        S, E, Ev = form.S, form.E, form.Ev
        self.echunks = _chunks(E, 128)
        self.vcols = Ev + (1 if ones_column else 0)
        isz = 4 if pe_dt == "float32" else 2
        need = (S * len(self.echunks) + -(-S // 128) * self.vcols) * isz
        self.need = need
        self.resident = need * 3 <= _RESIDENT_BYTES if resident is None else resident
        self.ones_column = ones_column
        self._kt = self._v = self._rows = self._kt1 = None
        self.p1_rows = None  # a row mask's [2, S] hi/lo rows, folded into pass 1's keys (see kt_as)
        self._slot = None
        self._homes = slots.count if slots is not None else 3
        if self.resident:  # the DMAs now; the transposes when finish() is called (a block later)
            # a head's rows stay until the next block transposes them, while the next head's arrive
            self._rows = _load_rows(b, K, k_off, form.k.stride[2], S, E, pe_dt, "attn.kload",
                                    bufs=2 * -(-S // 512) + 2)
            if slots is not None:  # on-chip homes made once, their rows/column of ones set once
                self._slot = slots.next()
                self._v = self._slot[1]
                self._fill_v(self._v, 0, S)
            else:
                self._v = self._load_v(0, S, site="attn.v", bufs=3)

    def finish(self) -> None:
        """Transpose the loaded ``K`` rows into ``K^T`` (resident mode; idempotent)."""
        if self._rows is not None:
            if self._slot is not None:
                self._kt = self._slot[0]
            else:
                self._kt = [self.b.sbuf((128, self.form.S), self.pe_dt, site=f"attn.kt{c}", bufs=3)
                            for c in range(len(self.echunks))]
            _transpose_groups(self.b, self._rows, self.form.E, self.pe_dt, self._kt, engine="dve")
            self._rows = None
            if self._slot is None:
                self._ones_rows(self._kt[-1], self.form.S)

    def _ones_rows(self, tile: View, n: int) -> None:
        """Rows of ones after the last head-dim row of a ``K^T`` tile (once per tile, not per row block)."""
        if not self.ones:
            return
        e = self.echunks[-1][1]
        if e % 32 == 0:  # an engine may start there (two partitions: 0, 32, 64 or 96)
            self.b.memset(tile[e:e + self.ones, :n], 1.0, engine="pool")
            return
        ones = self.b.sbuf((self.ones, 512), self.pe_dt, site="attn.c.ones_dma", bufs=1)
        self.b.memset(ones, 1.0, engine="pool")
        for c0, cw in _chunks(n, 512):  # DMA may write any partition
            _dma(self.b, tile[e:e + self.ones, c0:c0 + cw], ones[:, :cw])

    def _load_v(self, s0: int, n: int, site: str, bufs: int = 3) -> View:
        b, form = self.b, self.form
        t = b.sbuf((128, -(-n // 128), self.vcols), self.pe_dt, site=site, bufs=bufs)
        self._fill_v(t, s0, n)
        if self.ones_column:
            b.memset(t[:, :, form.Ev:form.Ev + 1], 1.0, engine="pool")
        return t

    def _fill_v(self, t: View, s0: int, n: int) -> None:
        form = self.form
        _dma_rows(self.b, t, self.V, self.v_off + s0 * form.v.stride[2], form.v.stride[2], n, form.Ev)

    def kt(self, s0: int, n: int, ones: bool = False) -> list[View]:
        """``K^T[:, s0:s0+n]`` per head-dim chunk (``[ec, n]`` views; ``ones``: with the rows of ones)."""
        extra = self.ones if ones else 0
        if self.resident:
            return [t[:ec + (extra if c == len(self.echunks) - 1 else 0), s0:s0 + n]
                    for c, (t, (_, ec)) in enumerate(zip(self._kt, self.echunks))]
        tiles = [self.b.sbuf((128, n), self.pe_dt, site=f"attn.kts{c}") for c in range(len(self.echunks))]
        _load_transposed(self.b, self.K, self.k_off + s0 * self.form.k.stride[2], self.form.k.stride[2], n,
                         self.form.E, self.pe_dt, tiles, 0, "attn.kload")
        if extra:
            self._ones_rows(tiles[-1], n)
        return [t[:ec + (extra if c == len(self.echunks) - 1 else 0), :n]
                for c, (t, (_, ec)) in enumerate(zip(tiles, self.echunks))]

    def kt_as(self, s0: int, n: int, dtype: str) -> list[View]:
        """``K^T[:, s0:s0+n]`` in ``dtype`` (the forward's pass 1 in bf16 for fp32 keys): cast once
        per resident head, on VectorE (SBUF to SBUF, off the PSUM port; pass 1 is its work), or per
        streamed block."""
        if dtype == self.pe_dt:
            return self.kt(s0, n)
        b, S = self.b, self.form.S
        if self.resident:
            if self._kt1 is None:
                self._kt1 = [b.sbuf((128, S), dtype, site=f"attn.kt1_{c}", bufs=self._homes)
                             for c in range(len(self.echunks))]
                for t1, t, (_, ec) in zip(self._kt1, self._kt, self.echunks):
                    b.tensor_copy(t1[:ec, :], t[:ec, :S], engine="dve")
                if self.p1_rows is not None:  # the mask's rows below the last head-dim row (DMA: any partition)
                    e = self.echunks[-1][1]
                    _dma(b, self._kt1[-1][e:e + 2, :S], self.p1_rows[:2, :S])
            extra = 2 if self.p1_rows is not None else 0
            last = len(self.echunks) - 1
            return [t[:ec + (extra if c == last else 0), s0:s0 + n]
                    for c, (t, (_, ec)) in enumerate(zip(self._kt1, self.echunks))]
        out = []
        for c, (t, (_, ec)) in enumerate(zip(self.kt(s0, n), self.echunks)):
            t1 = b.sbuf((128, n), dtype, site=f"attn.kts1_{c}")
            b.tensor_copy(t1[:ec, :], t[:ec, :n], engine="pool")
            out.append(t1[:ec, :n])
        return out

    def v_rows(self, s0: int, n: int) -> View:
        """``V[s0:s0+n]`` as ``[n, vcols]`` (n <= 128, s0 a multiple of 128)."""
        if self.resident:
            return self._v[:n, s0 // 128, :]
        return self._load_v(s0, n, site="attn.vs")[:n, 0, :]


class _KVSlots:
    """Three on-chip homes for resident key/value heads (finishing, current, prefetched), made
    once per Program with their constant rows of ones (K^T) and column of ones (V) set once."""

    def __init__(self, b: TileBuilder, form: AttentionForm, pe_dt: str, ones: int, ones_column: bool,
                 count: int = 3):
        self.b, self.form, self.pe_dt, self.ones, self.ones_column = b, form, pe_dt, ones, ones_column
        self.count = count
        self._homes: list = []
        self._n = 0

    def next(self):
        if len(self._homes) < self.count:
            self._homes.append(self._make(len(self._homes)))
        home = self._homes[self._n % self.count]
        self._n += 1
        return home

    def _make(self, k: int):
        b, f = self.b, self.form
        echunks = _chunks(f.E, 128)
        kt = [b.sbuf((128, f.S), self.pe_dt, name=f"attn_kt{k}_{c}", site=f"attn.home.kt{k}.{c}", bufs=1)
              for c in range(len(echunks))]
        vcols = f.Ev + (1 if self.ones_column else 0)
        v = b.sbuf((128, -(-f.S // 128), vcols), self.pe_dt, name=f"attn_v{k}", site=f"attn.home.v{k}", bufs=1)
        if self.ones:
            e = echunks[-1][1]
            kv = _KV.__new__(_KV)  # the row-of-ones helper, without a head
            kv.b, kv.ones, kv.echunks, kv.pe_dt = b, self.ones, echunks, self.pe_dt
            kv._ones_rows(kt[-1], f.S)
        if self.ones_column:
            b.memset(v[:, :, f.Ev:f.Ev + 1], 1.0, engine="pool")
        return kt, v


class _Mask:
    """Mask operand tiles, prepared on GpSimd (clamped to ``-BIG``, divided by ``scale``)."""

    def __init__(self, b: TileBuilder, form: AttentionForm, M: View, scale: float, pe_dt: str):
        self.b, self.form, self.M, self.scale, self.pe_dt = b, form, M, scale, pe_dt
        self.kind = form.mask_kind
        self.strides = form.mask_strides
        self._rows: dict = {}

    def _clamped(self, dst, src):
        """``dst = max(src, -BIG) / scale`` in fp32 (bool masks: 0 kept, -BIG/scale dropped)."""
        if self.form.mask.dtype == "bool":
            self.b.tensor_scalar(dst, src, "subtract", 1.0, "multiply", BIG / self.scale, engine="pool")
        else:
            self.b.tensor_scalar(dst, src, "maximum", -BIG, "multiply", 1.0 / self.scale, engine="pool")

    def _hilo(self, x: View, rows: int, cols: int, site: str) -> tuple[View, View]:
        """Split fp32 ``x`` into bf16 ``hi + lo`` (exact to ~2^-16): TensorE adds both."""
        b = self.b
        hi = b.sbuf((128, cols), self.pe_dt, site=site + ".hi")
        b.tensor_copy(hi[:rows, :], x, engine="pool")
        lo = b.sbuf((128, cols), self.pe_dt, site=site + ".lo")
        b.tensor_tensor(lo[:rows, :], x, hi[:rows, :], "subtract", engine="pool")
        return hi[:rows, :], lo[:rows, :]

    def row(self, bi: int, h: int):
        """For a row mask: (``[2, S]`` hi/lo rows in ``pe_dt``, ``[128, nS]`` fp32 per-key column).

        ``col[p, c]`` is the clamped mask (unscaled) of key ``c*128 + p``: ScalarE's bias.
        """
        mb, mh, _, ms = self.strides
        off = bi * mb + h * mh
        hit = self._rows.get(off)
        if hit is not None:
            return hit
        b, S = self.b, self.form.S
        src_dt = self.form.mask.device_dtype
        raw = b.sbuf((1, S), src_dt, site="attn.m.raw", bufs=2)
        _dma(b, raw, _mat(self.M, off, 1, 0, S, ms))
        x = b.sbuf((1, S), "float32", site="attn.m.x", bufs=2)
        self._clamped(x, raw)
        hi, lo = self._hilo(x, 1, S, "attn.m.row")
        hl = b.sbuf((2, S), self.pe_dt, site="attn.m.hl", bufs=2)
        _dma(b, hl[0:1, :], hi)
        _dma(b, hl[1:2, :], lo)
        nS = -(-S // 128)
        rawc = b.sbuf((128, nS), src_dt, site="attn.m.rawc", bufs=2)
        full = S // 128
        if full:
            _dma(b, rawc[:, :full], View(self.M.buffer, _ap(self.M, off, ((ms, 128), (128 * ms, full))),
                                            (128, full)))
        if S % 128:
            t = S % 128
            _dma(b, rawc[:t, full:full + 1], _mat(self.M, off + full * 128 * ms, t, ms, 1, 1))
        col = b.sbuf((128, nS), "float32", site="attn.m.col", bufs=2)
        if self.form.mask.dtype == "bool":
            b.tensor_scalar(col, rawc, "subtract", 1.0, "multiply", BIG, engine="pool")
        else:
            b.tensor_scalar(col, rawc, "maximum", -BIG, engine="pool")
        self._rows[off] = (hl, col)
        return hl, col

    def row_parts(self, bi: int, h: int) -> View:
        """An fp32 row mask as ``[3, S]`` bf16 rows whose sum is its clamped, scaled fp32 value exactly
        (three 8-bit mantissas hold fp32's 24; each remainder is exact in fp32): TensorE adds them
        at the bf16 rate, a quarter of an fp32 matmul's time, into the same fp32 accumulation."""
        mb, mh, _, ms = self.strides
        off = ("parts", bi * mb + h * mh)
        hit = self._rows.get(off)
        if hit is not None:
            return hit
        b, S = self.b, self.form.S
        raw = b.sbuf((1, S), self.form.mask.device_dtype, site="attn.m.raw3", bufs=2)
        _dma(b, raw, _mat(self.M, off[1], 1, 0, S, ms))
        r = b.sbuf((1, S), "float32", site="attn.m.x3", bufs=2)
        self._clamped(r, raw)
        parts = b.sbuf((3, S), "bfloat16", site="attn.m.parts", bufs=2)
        for k in range(3):
            pk = b.sbuf((1, S), "bfloat16", site=f"attn.m.part{k}", bufs=2)
            b.tensor_copy(pk, r, engine="pool")  # rounds to bf16
            _dma(b, parts[k:k + 1, :], pk)  # DMA: any partition
            if k < 2:
                rest = b.sbuf((1, S), "float32", site=f"attn.m.rest{k}", bufs=2)
                b.tensor_tensor(rest, r, pk, "subtract", engine="pool")  # exact in fp32
                r = rest
        self._rows[off] = parts
        return parts

    def block(self, bi: int, h: int, q0: int, lt: int, s0: int, kw: int, site: str):
        """A full mask's ``[lt, kw]`` block as bf16 ``(hi, lo)`` of ``clamp(mask) / scale``."""
        mb, mh, ml, ms = self.strides
        b = self.b
        raw = b.sbuf((128, kw), self.form.mask.device_dtype, site=site + ".raw")
        _dma(b, raw[:lt, :], _mat(self.M, bi * mb + h * mh + q0 * ml + s0 * ms, lt, ml, kw, ms))
        x = b.sbuf((128, kw), "float32", site=site + ".x")
        self._clamped(x[:lt, :], raw[:lt, :])
        return self._hilo(x[:lt, :], lt, kw, site)


def _ap(view: View, offset: int, dims):
    from ..isa import AP

    return AP(view.ap.buffer, view.ap.dtype, view.ap.offset + offset, dims)


def _head_order(form: AttentionForm, bi: int) -> list[int]:
    """Query heads of batch ``bi`` ordered so that heads sharing a key/value head are adjacent."""
    return sorted(range(form.H), key=lambda h: (form.kv_key(bi, h), h))


# ---- forward ----------------------------------------------------------------------------------

def attention_forward(q, k, v, mask, *, causal: bool, scale: float | None, dropout_p: float,
                      out: TensorMeta | None = None, spec: str | CoreSpec | None = None,
                      name: str = "aten::_scaled_dot_product_fused_attention_overrideable"):
    """The forward Program: inputs ``query``, ``key``, ``value`` (, ``attn_mask``); outputs
    ``out`` (``out``'s layout, default contiguous) and ``logsumexp`` ``[B, H, L]`` fp32."""
    spec = preset(spec)
    form = attention_form(q, k, v, mask)
    B, H, L, S, E, Ev = form.B, form.H, form.L, form.S, form.E, form.Ev
    scale = float(scale) if scale is not None else 1.0 / (E ** 0.5)
    dropout_p = float(dropout_p or 0.0)
    if not 0.0 <= dropout_p < 1.0:
        raise _Decline(f"dropout_p {dropout_p} outside [0, 1)")
    out = _as4d(out) if out is not None else TensorMeta((B, H, L, Ev), _contig((B, H, L, Ev)), form.q.dtype)
    # useful FLOPs run at the inputs' dtype's peak (a bf16 stabiliser pass is overhead, not a faster peak)
    meta = {"lowering": "attention", "useful_flops": useful_flops(B, H, L, S, E, Ev, causal),
            "flops_dtype": form.q.device_dtype}
    forms = _pass1_forms(form.q.device_dtype)
    build = lambda p1_dt: _forward_program(form, out, causal, scale, dropout_p, spec, name, p1_dt, meta)  # noqa: E731
    return build(forms[0]) if len(forms) == 1 else _shortest((build(dt) for dt in forms), spec)


def _forward_program(form, out, causal, scale, dropout_p, spec, name, p1_dt, meta):
    B, H, L = form.B, form.H, form.L
    pe_dt = form.q.device_dtype
    aux_dt = _aux_dtype(pe_dt)
    b = TileBuilder(name, spec)
    with b.provenance(op=name):
        Q = hbm_input(b, "query", form.q)
        K = hbm_input(b, "key", form.k)
        V = hbm_input(b, "value", form.v)
        Mv = hbm_input(b, "attn_mask", form.mask) if form.mask is not None else None
        O = hbm_output(b, "out", out)
        lse_meta = TensorMeta((B, H, L), _contig((B, H, L)), "float32")
        LSE = hbm_output(b, "logsumexp", lse_meta)
        consts = _Consts(b, aux_dt, pe_dt)
        masks = _Mask(b, form, Mv, scale, _mask_dtype(form, aux_dt)) if Mv is not None else None
        _Forward(b, form, Q, K, V, O, out, LSE, consts, masks, causal, scale, dropout_p, pe_dt, p1_dt).run()
    return b.build(meta=dict(meta), spill=True)


def _mask_dtype(form: AttentionForm, aux_dt: str) -> str:
    """The dtype a mask is added to the scores in: a boolean mask's values (0 or the floor) are
    exact enough in bf16 (the floor only has to be far below every score), a float mask's are not."""
    return "bfloat16" if form.mask is not None and form.mask.dtype == "bool" else aux_dt


def _aux_dtype(pe_dt: str) -> str:
    """The dtype of the masks, the stabiliser and the constants that TensorE adds to the scores:
    fp16 cannot hold the mask floor (-BIG), so fp16 attention adds them in bf16."""
    return "bfloat16" if pe_dt == "float16" else pe_dt


def _pass1_forms(pe_dt: str) -> tuple[str, ...]:
    """The dtypes the forward's row maxima may be scored in: fp32 attention also from bf16 copies
    of Q and K (a stabiliser needs no more; TensorE runs bf16 at 4x its fp32 rate, but the casts
    cost GpSimd time that a single short block waits for), so both are built and the simulator
    keeps the quicker; else the inputs' own dtype."""
    return ("bfloat16", pe_dt) if pe_dt == "float32" else (pe_dt,)


def _shortest(programs, spec: CoreSpec):
    """The Program the simulator times shortest among ``programs``."""
    from ..sim import simulate

    return min(programs, key=lambda prog: simulate(prog, spec).summary.total_ns)


def _contig(shape):
    from ._call import contiguous_strides

    return contiguous_strides(shape)


class _Forward:
    def __init__(self, b, form, Q, K, V, O, out, LSE, consts, masks, causal, scale, dropout_p, pe_dt, p1_dt):
        self.b, self.form, self.Q, self.K, self.V, self.O, self.out, self.LSE = b, form, Q, K, V, O, out, LSE
        self.c, self.masks, self.causal, self.scale, self.p, self.pe_dt = consts, masks, causal, scale, dropout_p, pe_dt
        self.ones_column = dropout_p == 0.0
        self.aux_dt = _aux_dtype(pe_dt)
        # pass 1 only stabilises the softmax (any value within a few units of the row max gives the
        # same probabilities to rounding: pass 2 and the row sums use the value it finds), so fp32
        # attention may score it from bf16 copies of Q and K at bf16's matmul rate (fp32 costs 4x)
        self.p1_dt = p1_dt
        self.c1 = consts if self.p1_dt == pe_dt else _Consts(b, "bfloat16", "bfloat16", prefix="attn.c1")
        self._rows1: dict = {}
        # the stabiliser (-row max, as bf16 hi + lo) rides in pass 2's contraction as two more rows
        # when the last head-dim chunk leaves room; else it is one more K=2 matmul per key chunk
        self.aug = 0 < form.E % 128 <= 126 and self.aux_dt == pe_dt
        # query tiles per block: while pass 2 of one block overlaps pass 1 of the next, PSUM holds
        # two banks of scores each, the row maxima and the block's accumulators (+ row sums with
        # dropout): at most 8 banks
        vcols = form.Ev + (1 if self.ones_column else 0)
        per_bank = max(1, 512 // vcols)
        self.qb = min(_QB, per_bank * (3 - (0 if self.ones_column else 1)))
        self.parts_in_psum = self.qb * -(-form.S // _KB) * 4 <= 2048

    def run(self):
        """Query blocks in a software pipeline (program order is issue order on every engine):

        ``DMA(n+2)`` is issued a whole block before its data is transposed (``TR(n+1)``), and the
        next block's row maxima (pass 1, VectorE) are interleaved with this block's probabilities
        (pass 2, ScalarE), so the PSUM port the two engines share is never idle between blocks.
        """
        items = self._blocks()
        self._kv, self._key, self._slots = None, None, None
        self._dma(items[0])
        if len(items) > 1:
            self._dma(items[1])
        self._cast(items[0])
        self._transposes(items[0])
        for _ in self._pass1(items[0]):
            pass
        self._between(items, 0)
        for n, blk in enumerate(items):
            nxt = items[n + 1] if n + 1 < len(items) else None
            if n + 2 < len(items):
                self._dma(items[n + 2])
            p1 = self._pass1(nxt) if nxt is not None else iter(())
            self._pass2(blk, p1)
            for _ in p1:
                pass
            if nxt is not None:
                self._between(items, n + 1)
            self._epilogue(blk)

    def _between(self, items, n: int) -> None:
        """After block ``n``'s pass 1: its stabiliser (VectorE), then block ``n+1``'s transposes
        (TensorE works on them while VectorE finishes the stabiliser), then block ``n``'s pass-2
        operand, which waits for the stabiliser."""
        if n + 1 < len(items):
            self._cast(items[n + 1])
        self._stats(items[n])
        if n + 1 < len(items):
            self._transposes(items[n + 1])
        self._operands(items[n])

    def _kv_need(self) -> int:
        """SBUF bytes per partition of one resident key/value head."""
        f = self.form
        vcols = f.Ev + (1 if self.ones_column else 0)
        isz = 4 if self.pe_dt == "float32" else 2
        p1 = f.S * len(_chunks(f.E, 128)) * 2 if self.p1_dt != self.pe_dt else 0  # pass 1's bf16 K^T
        return (f.S * len(_chunks(f.E, 128)) + -(-f.S // 128) * vcols) * isz + p1

    def _heads_per_block(self) -> int:
        """Query heads sharing one block: a short sequence fills a block (512 queries, one PSUM bank
        of scores) with several heads, so each instruction of the block's statistics, transposes and
        exps serves them all instead of paying its fixed cost once per head. Their key/value heads
        stay resident (three blocks' worth: finishing, current, prefetched)."""
        f = self.form
        full_mask = self.masks is not None and self.masks.kind != "row"
        if self.causal or full_mask:
            return 1
        per = min(self.qb // -(-f.L // 128), 512 // f.L)
        while per > 1 and 3 * per * self._kv_need() > _RESIDENT_BYTES:
            per -= 1
        return max(per, 1)

    def _blocks(self) -> list["_Block"]:
        """The forward's blocks in issue order: up to 512 queries of one head, or several whole
        heads of a short sequence (heads sharing a row mask's row)."""
        f = self.form
        per = self._heads_per_block()
        heads = [(bi, h) for bi in range(f.B) for h in _head_order(f, bi)]
        if per == 1:
            return [_Block([(bi, h, qb0, min(self.qb * 128, f.L - qb0))])
                    for bi, h in heads for qb0 in range(0, f.L, self.qb * 128)]
        ms = self.form.mask_strides
        row_of = (lambda bi, h: bi * ms[0] + h * ms[1]) if ms is not None else (lambda bi, h: 0)
        items, segs = [], []
        for bi, h in heads:
            if segs and (len(segs) == per or row_of(bi, h) != row_of(*segs[0][:2])):
                items.append(_Block(segs))
                segs = []
            segs.append((bi, h, 0, f.L))
        items.append(_Block(segs))
        return items

    def _dma(self, blk: "_Block") -> None:
        """Issue a block's loads: its query rows, and each key/value head when that changes."""
        f, b = self.form, self.b
        E = f.E
        ones = 2 if self.aug else 0
        if self._slots is None:
            need = self._kv_need()
            per = len(blk.segs)
            homes = 3 * per if 3 * per * need <= _RESIDENT_BYTES else 2
            self._resident = homes * need <= _RESIDENT_BYTES
            self._slots = _KVSlots(b, f, self.pe_dt, ones, self.ones_column, homes)
            self.fold = self._fold_mask_rows()
        # query rows [lt, E | r_hi | r_lo] per tile; pass 1 uses their transpose without the r columns
        blk.qrows = b.sbuf((128, self.qb, E + 2), self.pe_dt, site="attn.qrows", bufs=4)
        # -max as hi + lo: beside the query rows when it rides in their contraction, else its own tile
        blk.rc = blk.qrows[:, :, E:E + 2] if self.aug else b.sbuf((128, self.qb, 2), self.aux_dt, site="attn.rc",
                                                                    bufs=4)
        blk.kvs, blk.seg_of, blk.qtiles, blk.first_tile = [], [], [], []
        col = 0
        for si, (bi, h, qb0, nq) in enumerate(blk.segs):
            if f.kv_key(bi, h) != self._key:
                self._key = f.kv_key(bi, h)
                self._kv = _KV(b, f, self.K, self.V, self._key[0], self._key[1], self.pe_dt, self.ones_column,
                               ones=ones, slots=self._slots, resident=self._resident)
            blk.kvs.append(self._kv)
            ts = len(blk.qtiles)
            blk.first_tile.append(ts)
            # the block's query columns: each head's tiles follow the previous head's, packed
            for _, lt in _chunks(nq, 128):
                blk.qtiles.append((col, lt))
                blk.seg_of.append(si)
                col += lt
            q_off = bi * f.q.stride[0] + h * f.q.stride[1]
            _dma_rows(b, blk.qrows[:, ts:len(blk.qtiles), :], self.Q, q_off + qb0 * f.q.stride[2], f.q.stride[2],
                      nq, E)
        blk.kv = blk.kvs[0]
        blk.ncols = col

    def _fold_mask_rows(self) -> bool:
        """Does pass 1 add a row mask in its own contraction? Two more rows of the bf16 keys hold the
        mask (hi, lo) and two rows of ones follow the queries, so the scores need no extra K=2
        matmul (a matmul costs its moving columns, whatever its contraction). For the bf16 pass 1
        of fp32 attention (its keys are their own copy), resident heads whose query heads all see
        one mask row, and a last head-dim chunk with room for two rows where an engine may start."""
        f, m = self.form, self.masks
        e = f.E - 128 * (len(_chunks(f.E, 128)) - 1)
        one_row = m is not None and (m.strides[1] == 0 or f.k.shape[1] == f.H)
        return (m is not None and m.kind == "row" and one_row and self.p1_dt != self.pe_dt and self._resident
                and e + 2 <= 128 and _may_start(e, 2))

    def _qt_home(self, e: int) -> View:
        """Pass 1's query operand for head-dim chunk ``e``: with folded mask rows, one of three homes
        whose two rows of ones (after the last chunk's head-dim rows) are set once."""
        b = self.b
        last = len(_chunks(self.form.E, 128)) - 1
        if not self.fold or e != last:
            return b.sbuf((128, 512), self.p1_dt, site=f"attn.qt{e}")
        homes = self.__dict__.setdefault("_qt_homes", [])
        if len(homes) < 3:
            t = b.sbuf((128, 512), self.p1_dt, name=f"attn_qt1_{len(homes)}", site=f"attn.qthome{len(homes)}",
                       bufs=1)
            ec = self.form.E - 128 * last
            b.memset(t[ec:ec + 2, :], 1.0, engine="pool")
            homes.append(t)
        self._qt_n = getattr(self, "_qt_n", -1) + 1
        return homes[self._qt_n % 3]

    def _cast(self, blk: "_Block") -> None:
        """Pass 1's query rows in its dtype (fp32 attention scoring its maxima in bf16): a VectorE
        copy, SBUF to SBUF (off the PSUM port), issued before the previous block's statistics so the
        transposes never wait behind them."""
        b, E = self.b, self.form.E
        blk.q1 = blk.qrows
        if self.p1_dt != self.pe_dt:
            blk.q1 = b.sbuf((128, self.qb, E), self.p1_dt, site="attn.q1rows")
            full = sum(lt == 128 for _, lt in blk.qtiles)
            if full:
                b.tensor_copy(blk.q1[:, :full, :], blk.qrows[:, :full, :E], engine="dve")
            for i, (_, lt) in enumerate(blk.qtiles[full:], start=full):
                b.tensor_copy(blk.q1[:lt, i, :], blk.qrows[:lt, i, :E], engine="dve")

    def _transposes(self, blk: "_Block") -> None:
        for kv in blk.kvs:
            kv.finish()
        b, E = self.b, self.form.E
        blk.qt = [self._qt_home(e) for e in range(len(blk.kv.echunks))]
        src = blk.q1
        loaded = [src[:, i, :E] for i in range(len(blk.qtiles))]
        _transpose_into(b, loaded, blk.qtiles, E, self.p1_dt, blk.qt, 0, "dve")  # pass 1 is VectorE's
        masks = self.masks
        blk.rows = masks.row(blk.bi, blk.h) if masks is not None and masks.kind == "row" else None
        blk.rows1 = None
        if blk.rows is not None and self.fold:
            for kv in blk.kvs:
                kv.p1_rows = blk.rows[0]
        elif blk.rows is not None:
            blk.rows1 = blk.rows[0]
            mdt = masks.pe_dt
            if self.p1_dt != mdt and not (mdt == "bfloat16" and self.p1_dt == "float32"):  # cast once per row
                hit = self._rows1.get(id(blk.rows[0]))
                if hit is None:
                    hit = b.sbuf((2, self.form.S), self.p1_dt, site="attn.m.hl1", bufs=2)
                    b.tensor_copy(hit, blk.rows[0], engine="pool")
                    self._rows1[id(blk.rows[0])] = hit
                blk.rows1 = hit
        n = len(blk.qtiles) * -(-self.form.S // _KB) * _KB * 4
        blk.full_cache = {} if n <= _MASK_CACHE_BYTES else None

    def _pass1(self, blk: "_Block"):
        """Row maxima of a block's queries (the softmax's stabiliser: approximate is fine), one
        score block per step; then the stabiliser rows pass 2 contracts with."""
        f, b, c, c1 = self.form, self.b, self.c, self.c1
        kv, qt, rows, qtiles = blk.kv, blk.qt, blk.rows, blk.qtiles
        nt = len(qtiles)
        nblk = -(-f.S // _KB)
        if self.parts_in_psum:  # VectorE's maxima then never touch SBUF (GpSimd keeps its port)
            parts = b.psum((128, self.qb, nblk), "float32", site="attn.ps.parts", bufs=1)
        else:
            parts = b.sbuf((128, self.qb, nblk), "float32", site="attn.parts", bufs=2)
        pending = None  # each block's scores are issued before the previous block's max (two banks in use)
        his = [min(f.S, blk.qb0 + t0 + lt) if self.causal else f.S for t0, lt in qtiles]  # keys each tile sees
        if any(len(_chunks(hi, _KB)) < nblk for hi in his):  # causal: blocks a tile skips do not count
            b.memset(parts[:, :nt, :nblk], -BIG, engine="dve")  # one instruction for the block's tiles
        # resident keys: tile by tile; streamed keys: block by block, each loaded once for all tiles
        order = [(i, j) for i in range(nt) for j in range(len(_chunks(his[i], _KB)))]
        if not kv.resident:
            order.sort(key=lambda ij: (ij[1], ij[0]))
        streamed = (None, None)  # (block, K^T tiles) of the block loaded last
        for i, j in order:
            t0, lt = qtiles[i]
            q0 = blk.qb0 + t0
            s0, kw = _chunks(his[i], _KB)[j]
            kv = blk.kvs[blk.seg_of[i]]
            if kv.resident:
                kts = kv.kt_as(s0, kw, self.p1_dt)
            else:
                if streamed[0] != j:
                    streamed = (j, kv.kt_as(s0, min(_KB, max(his) - s0), self.p1_dt))
                kts = [t[:, :kw] for t in streamed[1]]
            ps = b.psum((128, _KB), "float32", site="attn.ps.s1", bufs=2)
            for e in range(len(kv.echunks)):
                rows_e = kts[e].shape[0]  # with a folded mask: two more rows (the mask; ones beside the queries)
                b.matmul(ps[:lt, :kw], qt[e][:rows_e, t0:t0 + lt], kts[e], accumulate=e > 0)
            if rows is not None and not self.fold:
                b.matmul(ps[:lt, :kw], c1.like(blk.rows1.dtype).ones[:2, :lt], blk.rows1[:2, s0:s0 + kw],
                         accumulate=True)
            elif self.masks is not None and rows is None:  # the stabiliser needs no more than the hi part
                hi, lo = self._full_block(blk, i, q0, lt, j, s0, kw)
                b.matmul(ps[:lt, :kw], c.like(hi.dtype).ident[:lt, :lt], hi, accumulate=True)
            if self.causal and s0 <= q0 < s0 + kw:
                cw = min(128, s0 + kw - q0)
                cx = c1.exact
                b.matmul(ps[:lt, q0 - s0:q0 - s0 + cw], cx.ident[:lt, :lt], cx.causal[:lt, :cw], accumulate=True)
            if pending is not None:
                b.tensor_reduce(*pending, "max")
                yield
            pending = (parts[:lt, i, j:j + 1], ps[:lt, :kw])
        b.tensor_reduce(*pending, "max")
        blk.parts, blk.nblk = parts, nblk
        yield

    def _stats(self, blk: "_Block") -> None:
        """The stabiliser of a block whose pass 1 is issued: ``r = -max`` as bf16 hi + lo (VectorE)."""
        b, nt, parts, nblk = self.b, len(blk.qtiles), blk.parts, blk.nblk
        m = b.sbuf((128, self.qb), "float32", site="attn.m")
        b.tensor_reduce(m[:, :nt], parts[:, :nt, :nblk], "max", axes=(2,))
        # r = -max, clamped at a quarter of the mask floor: a row whose every key is masked keeps
        # its logits 0.75 * BIG below the stabiliser (exp gives exactly 0, never a cancellation)
        neg = b.sbuf((128, self.qb), "float32", site="attn.neg")
        b.tensor_scalar(neg[:, :nt], m[:, :nt], "maximum", -0.25 * BIG / self.scale, "multiply", -1.0)
        rc = blk.rc
        b.tensor_copy(rc[:, :nt, 0], neg[:, :nt])  # r as bf16 hi + lo: exact to ~2^-16
        b.tensor_tensor(rc[:, :nt, 1], neg[:, :nt], rc[:, :nt, 0], "subtract")

    def _operands(self, blk: "_Block") -> None:
        """Pass 2's moving operand: the queries transposed with the stabiliser rows (or beside them)."""
        b, E, kv, qt, qtiles = self.b, self.form.E, blk.kv, blk.qt, blk.qtiles
        qrows, rc, nt = blk.qrows, blk.rc, len(blk.qtiles)
        if self.aug:
            blk.qt2 = [b.sbuf((128, 512), self.pe_dt, site=f"attn.qt2{e}") for e in range(len(kv.echunks))]
            self._transpose_rows(qrows, qtiles, E + 2, blk.qt2)
            blk.stab = None
        else:
            blk.qt2 = qt
            if self.p1_dt != self.pe_dt:  # pass 1 saw bf16 queries; pass 2 contracts the exact ones
                blk.qt2 = [b.sbuf((128, 512), self.pe_dt, site=f"attn.qt2{e}") for e in range(len(kv.echunks))]
                self._transpose_rows(qrows, qtiles, E, blk.qt2)
            blk.stab = [b.sbuf((128, 512), self.aux_dt, site="attn.stab")]
            _transpose_into(b, [rc[:, i, :] for i in range(nt)], qtiles, 2, self.aux_dt, blk.stab, 0)

    def _pass2(self, blk: "_Block", interleave) -> None:
        """``P^T = exp(scale * (K Q^T + mask - max))`` per 128 keys, then ``O += P V``; one step of
        ``interleave`` (the next block's pass 1) after each chunk."""
        f, b, c = self.form, self.b, self.c
        kv, qtiles = blk.kv, blk.qtiles
        nt = len(qtiles)
        vcols = kv.vcols
        per_bank = max(1, 512 // vcols)
        blk.per_bank = per_bank
        blk.accs = [b.psum((128, min(per_bank, nt - a0), vcols), "float32", site=f"attn.ps.o{a0 // per_bank}",
                           bufs=1) for a0 in range(0, nt, per_bank)]
        blk.lacc = None if self.ones_column else b.psum((128, self.qb), "float32", site="attn.ps.l", bufs=1)
        hi_s = min(f.S, blk.qb0 + blk.nq) if self.causal else f.S
        chunks = _chunks(hi_s, 128)
        # software pipelined: the scores of chunk n+1 are issued before chunk n's P @ V, so TensorE
        # never waits for ScalarE's exp in program order
        pending = self._scores(blk, chunks[0])
        for n in range(len(chunks)):
            nxt = self._scores(blk, chunks[n + 1]) if n + 1 < len(chunks) else None
            next(interleave, None)  # before this chunk's P @ V, which waits for ScalarE
            s0, sw, lo_col, ncols, pt_ps, live = pending
            pt = b.sbuf((128, 512), self.pe_dt, site="attn.pt")
            bias = blk.rows[1][:sw, s0 // 128:s0 // 128 + 1] if blk.rows is not None else None
            b.activation(pt[:sw, :ncols], pt_ps[:sw, :ncols], "exp", scale=self.scale, bias=bias)
            pv = pt
            if self.p:
                pv = b.sbuf((128, 512), self.pe_dt, site="attn.ptd")
                b.dropout(pv[:sw, :ncols], pt[:sw, :ncols], self.p)
            for i, t0, lt in live:
                cols = slice(t0 - lo_col, t0 - lo_col + lt)
                vr = blk.kvs[blk.seg_of[i]].v_rows(s0, sw)
                b.matmul(blk.acc(i)[:lt, :], pv[:sw, cols], vr, accumulate=s0 > 0)
                if blk.lacc is not None:
                    b.matmul(blk.lacc[:lt, i:i + 1], pt[:sw, cols], c.ones_col[:sw, :], accumulate=s0 > 0)
            pending = nxt

    def _transpose_rows(self, qrows, qtiles, width, dst, engine="act"):
        loaded = [qrows[:, i, :width] for i in range(len(qtiles))]
        _transpose_into(self.b, loaded, qtiles, width, self.pe_dt, dst, 0, engine)

    def _scores(self, blk: "_Block", chunk):
        """Issue ``S^T - max`` (+ masks) of one 128-key chunk into PSUM; returns what pass 2 needs."""
        f, b, c = self.form, self.b, self.c
        kv, qb0, qtiles, rows = blk.kv, blk.qb0, blk.qtiles, blk.rows
        s0, sw = chunk
        nq = blk.ncols
        lo_col = max(qb0, s0) - qb0 if self.causal else 0  # a multiple of 128: whole query tiles
        ncols = nq - lo_col
        pt_ps = b.psum((128, 512), "float32", site="attn.ps.s2", bufs=2)
        last = len(kv.echunks) - 1
        for si, skv in enumerate(blk.kvs):  # each head's columns against its keys
            c0 = max(lo_col, qtiles[blk.first_tile[si]][0])
            c1 = blk.qtiles[blk.first_tile[si + 1]][0] if si + 1 < len(blk.kvs) else nq
            kts = skv.kt(s0, sw, ones=self.aug)
            for e, (e0, ec) in enumerate(skv.echunks):
                rows_e = ec + (2 if self.aug and e == last else 0)
                b.matmul(pt_ps[:sw, c0 - lo_col:c1 - lo_col], kts[e], blk.qt2[e][:rows_e, c0:c1], accumulate=e > 0)
        if blk.stab is not None:
            b.matmul(pt_ps[:sw, :ncols], c.ones[:2, :sw], blk.stab[0][:2, lo_col:nq], accumulate=True)
        live = [(i, t0, lt) for i, (t0, lt) in enumerate(qtiles) if t0 >= lo_col]
        if self.masks is not None and rows is None:
            for i, t0, lt in live:
                if blk.full_cache is not None:  # pass 1's blocks, still on chip
                    j, sb0 = s0 // _KB, (s0 // _KB) * _KB
                    hi, lo = self._full_block(blk, i, qb0 + t0, lt, j, sb0,
                                              min(_KB, min(f.S, qb0 + t0 + lt if self.causal else f.S) - sb0))
                    hi, lo = hi[:lt, s0 - sb0:s0 - sb0 + sw], lo[:lt, s0 - sb0:s0 - sb0 + sw]
                else:
                    hi, lo = self.masks.block(blk.bi, blk.h, qb0 + t0, lt, s0, sw, site="attn.mf2")
                # transposing matmuls: S^T[s, q] += mask[q, s] (hi and lo: exact to ~2^-16)
                cols = pt_ps[:sw, t0 - lo_col:t0 - lo_col + lt]
                mc = c.like(hi.dtype)
                b.matmul(cols, hi, mc.ident[:lt, :lt], accumulate=True)
                b.matmul(cols, lo, mc.ident[:lt, :lt], accumulate=True)
        if self.causal:
            for i, t0, lt in live:
                if qb0 + t0 == s0:
                    b.matmul(pt_ps[:sw, t0 - lo_col:t0 - lo_col + lt], c.exact.causal[:lt, :sw], c.exact.ident[:lt, :lt],
                             accumulate=True)
        return s0, sw, lo_col, ncols, pt_ps, live

    def _epilogue(self, blk: "_Block"):
        """``O = acc / l``, ``lse = ln(l) - scale * r``; a row whose every key is masked gives 0 / -inf.

        Statistics of the whole block are [128, tiles] tiles: one instruction each, on GpSimd and
        ScalarE (VectorE starts the next block's row maxima meanwhile). ScalarE first copies the
        accumulators (with their row sums) out of PSUM in one instruction per bank, so the bank is
        free for the next block's transposes and matmuls as soon as the last ``P @ V`` is done; the
        division and the statistics then run from SBUF on GpSimd, off the PSUM port, while ScalarE
        goes on with the next block's exps.
        """
        f, b = self.form, self.b
        E, Ev = f.E, f.Ev
        qtiles, rc, accs, per_bank, lacc = blk.qtiles, blk.rc, blk.accs, blk.per_bank, blk.lacc
        nt = len(qtiles)
        if lacc is not None:
            l_sb = b.sbuf((128, self.qb), "float32", site="attn.l")
            b.tensor_copy(l_sb[:, :nt], lacc[:, :nt], engine="act")
            acc_sb = None
        else:
            acc_sb = b.sbuf((128, self.qb, accs[0].shape[2]), "float32", site="attn.acc")
            for a, acc in enumerate(accs):
                b.tensor_copy(acc_sb[:, a * per_bank:a * per_bank + acc.shape[1], :], acc, engine="act")
            l_sb = acc_sb[:, :, Ev]
        ln = b.sbuf((128, self.qb), "float32", site="attn.ln")
        b.activation(ln[:, :nt], l_sb[:, :nt], "log")  # -inf for a row with no key (lse is -inf there)
        r = b.sbuf((128, self.qb), "float32", site="attn.r")
        b.tensor_tensor(r[:, :nt], rc[:, :nt, 0], rc[:, :nt, 1], "add", engine="pool")
        live = b.sbuf((128, self.qb), "float32", site="attn.live")  # the max stayed above the mask floor
        b.tensor_scalar(live[:, :nt], r[:, :nt], "less", 0.1 * BIG / self.scale, "multiply",
                        1.0 / (1.0 - self.p), engine="pool")
        safe = b.sbuf((128, self.qb), "float32", site="attn.safe")
        b.tensor_scalar(safe[:, :nt], l_sb[:, :nt], "maximum", 1e-30, engine="pool")
        inv = b.sbuf((128, self.qb), "float32", site="attn.inv")
        b.tensor_tensor(inv[:, :nt], live[:, :nt], safe[:, :nt], "divide", engine="pool")
        ost = self.out.stride
        o = b.sbuf((128, self.qb, Ev), self.out.device_dtype, site="attn.o", bufs=3)
        for i, (t0, lt) in enumerate(qtiles):
            if acc_sb is not None:
                b.tensor_scalar(o[:lt, i, :], acc_sb[:lt, i, :Ev], "multiply", inv[:lt, i:i + 1], engine="act")
            else:
                acc = accs[i // per_bank][:, i % per_bank, :]
                b.tensor_scalar(o[:lt, i, :], acc[:lt, :Ev], "multiply", inv[:lt, i:i + 1], engine="act")
        for si, (bi, h, qb0, nq) in enumerate(blk.segs):
            ts = blk.first_tile[si]
            _dma_rows(b, o[:, ts:, :], self.O, bi * ost[0] + h * ost[1] + qb0 * ost[2], ost[2], nq, Ev, ost[3],
                      store=True)
        lse = b.sbuf((128, self.qb), "float32", site="attn.lse")
        b.tensor_scalar(lse[:, :nt], r[:, :nt], "multiply", -self.scale, engine="pool")
        b.tensor_tensor(lse[:, :nt], lse[:, :nt], ln[:, :nt], "add", engine="pool")
        b.select(lse[:, :nt], live[:, :nt], lse[:, :nt], float("-inf"), engine="pool")
        for si, (bi, h, qb0, nq) in enumerate(blk.segs):
            base = (bi * f.H + h) * f.L + qb0
            ts = blk.first_tile[si]
            tiles = _chunks(nq, 128)
            full = [k for k, (_, lt) in enumerate(tiles) if lt == 128]
            if full:  # one store for the full tiles: element (p, k) is query qb0 + 128 k + p
                _dma(b, View(self.LSE.buffer, _ap(self.LSE, base, ((1, 128), (128, len(full)))), (128, len(full))),
                     lse[:, ts:ts + len(full)])
            for k, (t0, lt) in enumerate(tiles):
                if lt < 128:
                    _dma(b, _mat(self.LSE, base + t0, lt, 1, 1, 1), lse[:lt, ts + k:ts + k + 1])

    def _full_block(self, blk, i, q0, lt, j, s0, kw):
        cache = blk.full_cache
        if cache is None:
            return self.masks.block(blk.bi, blk.h, q0, lt, s0, kw, site="attn.mf1")
        hit = cache.get((i, j))
        if hit is None:
            hit = cache[(i, j)] = self.masks.block(blk.bi, blk.h, q0, lt, s0, kw, site="attn.mf")
        return hit


class _Block:
    """One forward query block and the tiles made for it: ``segs`` ``[(bi, h, qb0, nq)]``, up to
    512 queries of one head, or several whole heads of a short sequence (``bi``, ``h``, ``qb0``,
    ``nq``: the first)."""

    def __init__(self, segs):
        self.segs = segs
        self.bi, self.h, self.qb0, self.nq = segs[0]

    def acc(self, i: int) -> View:
        return self.accs[i // self.per_bank][:, i % self.per_bank, :]


# ---- backward ---------------------------------------------------------------------------------

def attention_backward(grad_out, q, k, v, out, lse, mask, *, causal: bool, scale: float | None,
                       dropout_p: float, grad_mask: bool = False, grads: tuple | None = None,
                       spec: str | CoreSpec | None = None,
                       name: str = "aten::_scaled_dot_product_fused_attention_overrideable_backward"):
    """The backward Program: inputs ``grad_out``, ``query``, ``key``, ``value``, ``out``,
    ``logsumexp`` (, ``attn_mask``); outputs ``grad_query``, ``grad_key``, ``grad_value``
    (, ``grad_attn_mask`` when ``grad_mask``: only for a mask of the full ``[B, H, L, S]``)."""
    spec = preset(spec)
    form = attention_form(q, k, v, mask)
    B, H, L, S, E, Ev = form.B, form.H, form.L, form.S, form.E, form.Ev
    if E > 512:
        raise _Decline(f"head dim {E} > 512: the backward's dK accumulator exceeds a PSUM bank")
    scale = float(scale) if scale is not None else 1.0 / (E ** 0.5)
    dropout_p = float(dropout_p or 0.0)
    if grad_mask and (form.mask is None or form.mask.dtype == "bool" or form.mask.shape != (B, H, L, S)
                      and _as4d_shape(form.mask) != (B, H, L, S)):
        raise _Decline("the mask gradient is built for a [B, H, L, S] float mask only")
    g = _as4d(grad_out)
    o = _as4d(out)
    if g.shape != (B, H, L, Ev) or o.shape != (B, H, L, Ev) or g.stride[3] != 1 or o.stride[3] != 1:
        raise _Decline("grad_out / out do not match the attention's output")
    gq, gk, gv = (grads or (None, None, None))[:3]
    gq = _as4d(gq) if gq is not None else TensorMeta(form.q.shape, _contig(form.q.shape), form.q.dtype)
    gk = _as4d(gk) if gk is not None else TensorMeta(form.k.shape, _contig(form.k.shape), form.k.dtype)
    gv = _as4d(gv) if gv is not None else TensorMeta(form.v.shape, _contig(form.v.shape), form.v.dtype)
    pe_dt = form.q.device_dtype
    aux_dt = _aux_dtype(pe_dt)
    b = TileBuilder(name, spec)
    with b.provenance(op=name):
        ins = {
            "grad_out": hbm_input(b, "grad_out", g), "query": hbm_input(b, "query", form.q),
            "key": hbm_input(b, "key", form.k), "value": hbm_input(b, "value", form.v),
            "out": hbm_input(b, "out", o),
            "logsumexp": hbm_input(b, "logsumexp", TensorMeta((B, H, L), _contig((B, H, L)), "float32")),
        }
        Mv = hbm_input(b, "attn_mask", form.mask) if form.mask is not None else None
        outs = {"grad_query": (hbm_output(b, "grad_query", gq), gq), "grad_key": (hbm_output(b, "grad_key", gk), gk),
                "grad_value": (hbm_output(b, "grad_value", gv), gv)}
        if grad_mask:
            gm = TensorMeta((B, H, L, S), _contig((B, H, L, S)), form.mask.dtype)
            outs["grad_attn_mask"] = (hbm_output(b, "grad_attn_mask", gm), gm)
        consts = _Consts(b, aux_dt, pe_dt)
        masks = _Mask(b, form, Mv, scale, _mask_dtype(form, aux_dt)) if Mv is not None else None
        _Backward(b, form, ins, g, o, outs, consts, masks, causal, scale, dropout_p, pe_dt).run()
    return b.build(meta={"lowering": "attention_backward",
                         "useful_flops": useful_flops(B, H, L, S, E, Ev, causal, backward=True),
                         "flops_dtype": pe_dt}, spill=True)


def _may_start(start: int, rows: int) -> bool:
    """May an engine access of ``rows`` partitions start at partition ``start`` [arch]?"""
    return start == 0 or (rows <= 64 and start == 64) or (rows <= 32 and start % 32 == 0 and start < 128)


def _as4d_shape(m: TensorMeta):
    return (1,) * (4 - m.ndim) + m.shape


class _Head:
    """One query head of the backward: its tiles (made by ``_head_dma`` / ``_head_prep``)."""

    def __init__(self, bi, h, key, group, first, last):
        self.bi, self.h, self.key, self.group, self.first, self.last = bi, h, key, group, first, last


class _KTile:
    """One tile of keys of one head's backward, and its accumulators."""

    def __init__(self, head: _Head, s0: int, kw: int, last: bool):
        self.head, self.s0, self.kw, self.last = head, s0, kw, last
        self.subs = _chunks(kw, 128)
        self.written = [0] * len(self.subs)  # rows of each dK/dV accumulator written (causal: fewer)
        self.dk = self.dv = None


class _Backward:
    """FlashAttention-2 order, software pipelined (program order is issue order on every engine):
    each block's scores, probabilities and ``dS`` (TensorE, ScalarE, VectorE) are issued before
    the previous block's gradient matmuls and ``dS^T`` copy, and each tile's and head's loads one
    tile ahead, so TensorE never waits in program order for the other engines."""

    def __init__(self, b, form, ins, g, o, outs, consts, masks, causal, scale, dropout_p, pe_dt):
        self.b, self.form, self.ins, self.g, self.o, self.outs = b, form, ins, g, o, outs
        self.c, self.masks, self.causal, self.scale, self.p, self.pe_dt = consts, masks, causal, scale, dropout_p, pe_dt
        E, Ev = form.E, form.Ev
        # keys per tile: dK/dV accumulators [128, keys/128, E] fp32 in one PSUM bank each
        self.kb = 128 * max(1, min(_KB // 128, 512 // max(E, Ev)))
        self.echunks, self.vchunks = _chunks(E, 128), _chunks(Ev, 128)
        # head dims that fit the partitions together (d64): Q beside dO and K beside V in one tile,
        # so one TensorE transpose (and one copy out of PSUM) serves both -- a transpose costs its
        # source's rows, whatever its width -- and dO^T / V^T sit on partitions E.. of the same tiles
        self.pack = (E + Ev <= 128 and _may_start(E, Ev) and g.device_dtype == pe_dt
                     and form.v.device_dtype == pe_dt)
        # a head's tiles rotate over three homes where they fit (loading, working, finishing: the
        # pipeline's gradient matmuls and dQ trail the scores, so the head before the working one
        # still reads its rows when the next head's loads are issued), else two
        isz = 4 if pe_dt == "float32" else 2
        per_head = -(-form.L // 128) * ((2 * E + 2 * Ev) * isz + 4 * E + 12) + 2 * form.L * isz
        self.hbufs = 3 if 3 * per_head <= _RESIDENT_BYTES // 2 else 2

    def run(self):
        f, b = self.form, self.b
        heads = []
        for bi in range(f.B):
            groups: dict = {}
            for h in _head_order(f, bi):
                groups.setdefault(f.kv_key(bi, h), []).append(h)
            for key, hs in groups.items():
                group = None
                if len(hs) > 1:  # dK, dV summed over the query heads that share this key/value head
                    group = []
                for n, h in enumerate(hs):
                    heads.append(_Head(bi, h, key, group, n == 0, n == len(hs) - 1))
        tiles = [_KTile(hd, s0, kw, s0 + kw >= f.S) for hd in heads for s0, kw in _chunks(f.S, self.kb)]
        self._head_dma(tiles[0].head)
        self._kv_dma(tiles[0])
        pending = None
        for n, tile in enumerate(tiles):
            hd = tile.head
            if tile.s0 == 0:
                self._head_prep(hd)
            nxt = tiles[n + 1] if n + 1 < len(tiles) else None
            if nxt is not None:
                if nxt.head is not hd:
                    self._head_dma(nxt.head)
                self._kv_dma(nxt)
            self._kv_prep(tile)
            blocks = 0
            for i, (q0, lt) in enumerate(_chunks(f.L, 128)):
                span = min(tile.kw, q0 + lt - tile.s0) if self.causal else tile.kw  # keys these queries see
                if span < tile.kw:
                    self._zero_mask_grad(hd, q0, lt, tile.s0 + max(span, 0), tile.kw - max(span, 0))
                if span <= 0:
                    continue
                front = self._front(tile, i, q0, lt, span)
                blocks += 1
                pending = self._advance(pending, (tile, front))
            if not blocks:  # causal with L < S: no query sees these keys (zero gradients)
                pending = self._drain(pending)
                self._finish_kv(tile)
                if tile.last:
                    self._finish_head(hd)
        self._drain(pending)

    def _advance(self, pending, new):
        """Three stages in flight: ``new``'s front was just issued; the previous block gets its dV,
        dK and dS^T; the one before gets dQ (whose dS^T copy is done by now)."""
        mid, old = pending if pending is not None else (None, None)
        if mid is not None:
            mid = (mid[0], mid[1], self._back(*mid))
        if old is not None:
            self._back_dq(*old)
        return new, mid

    def _drain(self, pending):
        while pending is not None and any(x is not None for x in pending):
            pending = self._advance(pending, None)
        return None

    # -- loads and per-head preparation ---------------------------------------------------------
    def _rows_of(self, view: View, meta: TensorMeta, off: int, cols: int, site: str) -> View:
        """A head's ``[L, cols]`` rows as ``[128, nL, cols]`` (query tile ``i`` in column block ``i``)."""
        b, L = self.b, self.form.L
        t = b.sbuf((128, -(-L // 128), cols), meta.device_dtype, site=site, bufs=self.hbufs)
        _dma_rows(b, t, view, off, meta.stride[2], L, cols)
        return t

    def _head_dma(self, hd: _Head) -> None:
        f, b, ins = self.form, self.b, self.ins
        bi, h, L = hd.bi, hd.h, f.L
        q_off, g_off = bi * f.q.stride[0] + h * f.q.stride[1], bi * self.g.stride[0] + h * self.g.stride[1]
        if self.pack:  # [Q | dO] rows in one tile
            hd.qgn = b.sbuf((128, -(-L // 128), f.E + f.Ev), self.pe_dt, site="attn.b.qgn", bufs=self.hbufs)
            hd.qn, hd.gn = hd.qgn[:, :, :f.E], hd.qgn[:, :, f.E:]
            _dma_rows(b, hd.qn, ins["query"], q_off, f.q.stride[2], L, f.E)
            _dma_rows(b, hd.gn, ins["grad_out"], g_off, self.g.stride[2], L, f.Ev)
        else:
            hd.qn = self._rows_of(ins["query"], f.q, q_off, f.E, "attn.b.qn")
            hd.gn = self._rows_of(ins["grad_out"], self.g, g_off, f.Ev, "attn.b.gn")
        hd.on = self._rows_of(ins["out"], self.o, bi * self.o.stride[0] + h * self.o.stride[1], f.Ev, "attn.b.on")
        nL = -(-L // 128)
        hd.lraw = b.sbuf((128, nL), "float32", site="attn.b.lraw", bufs=self.hbufs)
        base, full = (bi * f.H + h) * L, L // 128
        if full:  # one transfer: element (p, i) is query 128 i + p
            _dma(b, hd.lraw[:, :full], View(ins["logsumexp"].buffer, _ap(ins["logsumexp"], base,
                                                                              ((1, 128), (128, full))), (128, full)))
        if L % 128:
            _dma(b, hd.lraw[:L % 128, full:full + 1], _mat(ins["logsumexp"], base + full * 128, L % 128, 1, 1, 1))

    def _head_prep(self, hd: _Head) -> None:
        """Q^T and dO^T (TensorE transposes of the loaded rows), -lse and -D = -rowsum(dO * O)."""
        f, b = self.form, self.b
        L, nL = f.L, -(-f.L // 128)
        qtiles = _chunks(L, 128)
        if self.pack:  # one transpose of [Q | dO]: Q^T on partitions 0..E-1, dO^T on E..E+Ev-1
            qgt = b.sbuf((128, L), self.pe_dt, site="attn.b.qgt", bufs=self.hbufs)
            hd.qt, hd.gt = [qgt[:f.E, :]], [qgt[f.E:f.E + f.Ev, :]]
            pairs = [(hd.qgn, f.E + f.Ev, [qgt])]
        else:
            hd.qt = [b.sbuf((128, L), self.pe_dt, site=f"attn.b.qt{e}", bufs=self.hbufs) for e in range(len(self.echunks))]
            hd.gt = [b.sbuf((128, L), self.pe_dt, site=f"attn.b.gt{e}", bufs=self.hbufs) for e in range(len(self.vchunks))]
            pairs = [(hd.qn, f.E, hd.qt), (hd.gn, f.Ev, hd.gt)]
        for r0, rw in _chunks(L, 512):
            blocks = [(q0 - r0, lt) for q0, lt in qtiles if r0 <= q0 < r0 + rw]
            i0 = r0 // 128
            for rows, width, dst in pairs:
                _transpose_into(b, [rows[:, i0 + k, :] for k in range(len(blocks))], blocks, width, self.pe_dt, dst,
                                r0)
        # -lse, capped: a row whose every key is masked has lse = -inf and P = 0
        hd.neg_lse = b.sbuf((128, nL), "float32", site="attn.b.lse", bufs=self.hbufs)
        b.tensor_scalar(hd.neg_lse, hd.lraw, "multiply", -1.0, "minimum", 1e20, engine="pool")
        prod_ = b.sbuf((128, nL, f.Ev), "float32", site="attn.b.do_o", bufs=1)
        b.tensor_tensor(prod_, hd.gn, hd.on, "multiply", engine="pool")
        hd.neg_d = b.sbuf((128, nL), "float32", site="attn.b.d", bufs=self.hbufs)
        b.tensor_reduce(hd.neg_d, prod_, "add", axes=(2,), negate=True, engine="pool")
        # dQ accumulates in one PSUM bank across all key tiles when it fits (no VectorE pass per block)
        hd.dq_psum = nL * f.E * 4 <= self.b.spec.psum_bank_bytes
        if hd.dq_psum:
            hd.dq = b.psum((128, nL, f.E), "float32", site="attn.b.ps.dq", bufs=1)
        else:
            hd.dq = b.sbuf((128, nL, f.E), "float32", site="attn.b.dq", bufs=self.hbufs)
        m = self.masks
        hd.rows = m.row(hd.bi, hd.h) if m is not None and m.kind == "row" else None
        if hd.group is not None and hd.first:  # the group's dK / dV accumulators
            nS = -(-f.S // 128)
            hd.group.extend([b.sbuf((128, nS, f.E), "float32", site="attn.b.gk", bufs=1),
                             b.sbuf((128, nS, f.Ev), "float32", site="attn.b.gv", bufs=1)])

    def _kv_dma(self, tile: _KTile) -> None:
        f, ins, b = self.form, self.ins, self.b
        k_off, v_off = tile.head.key
        s0, kw = tile.s0, tile.kw
        if self.pack:  # [K | V] rows in one tile (one transpose for both)
            tile.kvn = b.sbuf((128, len(tile.subs), f.E + f.Ev), self.pe_dt, site="attn.b.kvn")
            tile.kn = tile.kvn[:, :, :f.E]
            _dma_rows(b, tile.kn, ins["key"], k_off + s0 * f.k.stride[2], f.k.stride[2], kw, f.E)
            _dma_rows(b, tile.kvn[:, :, f.E:], ins["value"], v_off + s0 * f.v.stride[2], f.v.stride[2], kw, f.Ev)
            return
        tile.kn = b.sbuf((128, len(tile.subs), f.E), self.pe_dt, site="attn.b.kn")
        _dma_rows(b, tile.kn, ins["key"], k_off + s0 * f.k.stride[2], f.k.stride[2], kw, f.E)
        tile.vrows = _load_rows(b, ins["value"], v_off + s0 * f.v.stride[2], f.v.stride[2], kw, f.Ev, self.pe_dt,
                                "attn.b.vload")

    def _kv_prep(self, tile: _KTile) -> None:
        b, f = self.b, self.form
        if self.pack:  # K^T on partitions 0..E-1, V^T on E..E+Ev-1
            ktv = b.sbuf((128, self.kb), self.pe_dt, site="attn.b.ktv")
            _transpose_into(b, [tile.kvn[:, u, :] for u in range(len(tile.subs))], tile.subs, f.E + f.Ev, self.pe_dt,
                            [ktv], 0)
            tile.kt, tile.vt = [ktv[:f.E, :]], [ktv[f.E:f.E + f.Ev, :]]
            return
        tile.kt = [b.sbuf((128, self.kb), self.pe_dt, site=f"attn.b.kt{e}") for e in range(len(self.echunks))]
        _transpose_into(b, [tile.kn[:, u, :] for u in range(len(tile.subs))], tile.subs, f.E, self.pe_dt, tile.kt, 0)
        tile.vt = [b.sbuf((128, self.kb), self.pe_dt, site=f"attn.b.vt{e}") for e in range(len(self.vchunks))]
        _transpose_groups(b, tile.vrows, f.Ev, self.pe_dt, tile.vt)

    # -- one block: 128 queries x up to one tile of keys ------------------------------------------
    def _front(self, tile: _KTile, i, q0, lt, span):
        """``S``, ``P``, ``dP`` and ``dS`` of one block (everything before its gradient matmuls)."""
        f, b, c = self.form, self.b, self.c
        hd, s0, pdt = tile.head, tile.s0, self.pe_dt
        s_ps = b.psum((128, _KB), "float32", site="attn.ps.a")
        for e, (e0, ec) in enumerate(self.echunks):
            b.matmul(s_ps[:lt, :span], hd.qt[e][:ec, q0:q0 + lt], tile.kt[e][:ec, :span], accumulate=e > 0)
        if hd.rows is not None:
            # an fp32 mask as three exact bf16 parts (one bf16 pass), else its own dtype's hi/lo rows
            rows = self.masks.row_parts(hd.bi, hd.h) if hd.rows[0].dtype == "float32" else hd.rows[0]
            n = rows.shape[0]
            b.matmul(s_ps[:lt, :span], c.like(rows.dtype).ones[:n, :lt], rows[:n, s0:s0 + span], accumulate=True)
        elif self.masks is not None:
            hi, lo = self.masks.block(hd.bi, hd.h, q0, lt, s0, span, site="attn.b.mf")
            mc = c.like(hi.dtype)
            b.matmul(s_ps[:lt, :span], mc.ident[:lt, :lt], hi, accumulate=True)
            b.matmul(s_ps[:lt, :span], mc.ident[:lt, :lt], lo, accumulate=True)
        if self.causal and s0 <= q0 < s0 + span:
            cw = min(128, s0 + span - q0)
            cx = c.exact
            b.matmul(s_ps[:lt, q0 - s0:q0 - s0 + cw], cx.ident[:lt, :lt], cx.causal[:lt, :cw], accumulate=True)
        dp_ps = b.psum((128, _KB), "float32", site="attn.b.ps.dp")
        for e, (e0, ec) in enumerate(self.vchunks):
            b.matmul(dp_ps[:lt, :span], hd.gt[e][:ec, q0:q0 + lt], tile.vt[e][:ec, :span], accumulate=e > 0)
        p = b.sbuf((128, _KB), pdt, site="attn.b.p")
        b.activation(p[:lt, :span], s_ps[:lt, :span], "exp", scale=self.scale, bias=hd.neg_lse[:lt, i:i + 1])
        t = b.sbuf((128, _KB), pdt, site="attn.b.t")
        pv = p
        if self.p:
            keep = b.sbuf((128, _KB), pdt, site="attn.b.keep")
            b.memset(keep[:lt, :span], 1.0 / (1.0 - self.p), engine="pool")
            b.dropout(keep[:lt, :span], keep[:lt, :span], self.p)
            pv = b.sbuf((128, _KB), pdt, site="attn.b.pd")
            b.tensor_tensor(pv[:lt, :span], p[:lt, :span], keep[:lt, :span], "multiply")
            dpk = b.sbuf((128, _KB), "float32", site="attn.b.dpk")
            b.tensor_tensor(dpk[:lt, :span], dp_ps[:lt, :span], keep[:lt, :span], "multiply")
            b.activation(t[:lt, :span], dpk[:lt, :span], "identity", bias=hd.neg_d[:lt, i:i + 1])
        else:  # dP - D on ScalarE (the per-partition bias), rounded once to the matmul dtype
            b.activation(t[:lt, :span], dp_ps[:lt, :span], "identity", bias=hd.neg_d[:lt, i:i + 1])
        ds = b.sbuf((128, _KB), pdt, site="attn.b.ds")
        b.tensor_tensor(ds[:lt, :span], t[:lt, :span], p[:lt, :span], "multiply")
        if "grad_attn_mask" in self.outs:
            gm, gm_meta = self.outs["grad_attn_mask"]
            st = gm_meta.stride
            src = ds
            if gm_meta.device_dtype != pdt:
                src = b.sbuf((128, _KB), gm_meta.device_dtype, site="attn.b.gm")
                b.tensor_copy(src[:lt, :span], ds[:lt, :span], engine="pool")
            _dma(b, _mat(gm, hd.bi * st[0] + hd.h * st[1] + q0 * st[2] + s0 * st[3], lt, st[2], span, st[3]),
                       src[:lt, :span])
        return i, q0, lt, span, pv, ds

    def _back(self, tile: _KTile, front):
        """dV += P^T dO, dK += dS^T Q, and dS^T (transposed on TensorE, copied out by ScalarE)."""
        f, b = self.form, self.b
        i, q0, lt, span, pv, ds = front
        hd, pdt = tile.head, self.pe_dt
        if tile.dk is None:
            nsub = len(tile.subs)
            if nsub * (f.E + f.Ev) * 4 <= b.spec.psum_bank_bytes:
                # dK and dV share one bank, and two banks rotate: the next key tile accumulates while
                # this one's gradients are scaled and stored
                kv = b.psum((128, nsub, f.E + f.Ev), "float32", site="attn.b.ps.dkv", bufs=2)
                tile.dk, tile.dv = kv[:, :, :f.E], kv[:, :, f.E:]
            else:
                tile.dk = b.psum((128, nsub, f.E), "float32", site="attn.b.ps.dk", bufs=1)
                tile.dv = b.psum((128, nsub, f.Ev), "float32", site="attn.b.ps.dv", bufs=1)
        dst_ps = b.psum((128, 4, 128), pdt, site="attn.b.ps.dst", bufs=1)
        live = [(u, u0, min(uw, span - u0)) for u, (u0, uw) in enumerate(tile.subs) if u0 < span]
        for u, u0, uw in live:
            # queries come in increasing order, so a later tile never sees keys of a sub-tile that an
            # earlier one wrote fewer rows of (the causal diagonal tile is a full 128 unless it is the last)
            b.matmul(tile.dv[:uw, u, :], pv[:lt, u0:u0 + uw], hd.gn[:lt, i, :], accumulate=tile.written[u] > 0)
            b.matmul(tile.dk[:uw, u, :], ds[:lt, u0:u0 + uw], hd.qn[:lt, i, :], accumulate=tile.written[u] > 0)
            tile.written[u] = max(tile.written[u], uw)
            b.transpose(dst_ps[:uw, u, :lt], ds[:lt, u0:u0 + uw])
        dst = b.sbuf((128, 4, 128), pdt, site="attn.b.dst")
        if all(uw == 128 for _, _, uw in live):  # one copy out of the bank
            b.tensor_copy(dst[:, :len(live), :lt], dst_ps[:, :len(live), :lt], engine="act")
        else:
            for u, _, uw in live:
                b.tensor_copy(dst[:uw, u, :lt], dst_ps[:uw, u, :lt], engine="act")
        if q0 + lt >= f.L:  # the last query tile: every dK / dV matmul of this key tile is issued
            self._finish_kv(tile)
        return dst, live

    def _back_dq(self, tile: _KTile, front, back) -> None:
        """dQ += dS K: in PSUM across all key tiles when the head's dQ fits one bank, else summed in
        SBUF; the head's dQ once its last block is done."""
        f, b = self.form, self.b
        i, q0, lt, span, pv, ds = front
        dst, live = back
        hd = tile.head
        if hd.dq_psum:
            for k_, (u, u0, uw) in enumerate(live):
                b.matmul(hd.dq[:lt, i, :], dst[:uw, u, :lt], tile.kn[:uw, u, :],
                         accumulate=tile.s0 > 0 or k_ > 0)
        else:
            dq_ps = b.psum((128, f.E), "float32", site="attn.b.ps.dq", bufs=1)
            for k_, (u, u0, uw) in enumerate(live):
                b.matmul(dq_ps[:lt, :], dst[:uw, u, :lt], tile.kn[:uw, u, :], accumulate=k_ > 0)
            if tile.s0 == 0:
                b.tensor_copy(hd.dq[:lt, i, :], dq_ps[:lt, :])
            else:
                b.tensor_tensor(hd.dq[:lt, i, :], hd.dq[:lt, i, :], dq_ps[:lt, :], "add")
        if tile.last and q0 + lt >= f.L:
            self._finish_head(hd)

    def _finish_head(self, hd: _Head) -> None:
        """dQ = scale * the sum over key tiles."""
        f, b = self.form, self.b
        gq, gq_meta = self.outs["grad_query"]
        st = gq_meta.stride
        res = b.sbuf((128, -(-f.L // 128), f.E), gq_meta.device_dtype, site="attn.b.dqo", bufs=2)
        for i, (q0, lt) in enumerate(_chunks(f.L, 128)):
            b.tensor_scalar(res[:lt, i, :], hd.dq[:lt, i, :], "multiply", self.scale,
                            engine="act" if hd.dq_psum else "pool")
        _dma_rows(b, res, gq, hd.bi * st[0] + hd.h * st[1], st[2], f.L, f.E, st[3], store=True)

    def _zero_mask_grad(self, hd: _Head, q0, lt, s0, n):
        """Masked-out (skipped) scores have a zero gradient: write it."""
        if "grad_attn_mask" not in self.outs or n <= 0:
            return
        gm, meta = self.outs["grad_attn_mask"]
        zero = self.b.sbuf((128, _KB), meta.device_dtype, site="attn.b.gmzero", bufs=1)
        self.b.memset(zero, 0.0, engine="pool")
        st = meta.stride
        for c0, cw in _chunks(n, _KB):
            _dma(self.b, _mat(gm, hd.bi * st[0] + hd.h * st[1] + q0 * st[2] + (s0 + c0) * st[3], lt, st[2], cw,
                                 st[3]), zero[:lt, :cw])

    def _finish_kv(self, tile: _KTile) -> None:
        """Scale and store this key tile's dK / dV (or add them to the group's accumulators)."""
        f, b = self.form, self.b
        hd = tile.head
        gk, gk_meta = self.outs["grad_key"]
        gv, gv_meta = self.outs["grad_value"]
        kh = f.kv_head(hd.h)
        store = hd.group is None or hd.last
        res = [b.sbuf((128, len(tile.subs), cols), meta.device_dtype, site=f"attn.b.res{gi}", bufs=2)
               for gi, (meta, cols) in enumerate(((gk_meta, f.E), (gv_meta, f.Ev)))] if store else None
        nsub = len(tile.subs)
        if hd.group is None and all(w == uw for w, (_, uw) in zip(tile.written, tile.subs)):
            # one instruction per gradient for the whole tile (a ragged last sub-tile's rows past its
            # keys are scaled too, and never stored); on VectorE, as GpSimd cannot read PSUM
            for gi, (acc, factor) in enumerate(((tile.dk, self.scale), (tile.dv, 1.0))):
                b.tensor_scalar(res[gi][:, :nsub, :], acc[:, :nsub, :], "multiply", factor)
        else:
            for u in range(nsub):
                self._finish_sub(tile, u, res)
        if store:  # one transfer per gradient for the tile's keys
            for gi, (meta, view, cols) in enumerate(((gk_meta, gk, f.E), (gv_meta, gv, f.Ev))):
                st = meta.stride
                _dma_rows(b, res[gi], view, hd.bi * st[0] + kh * st[1] + tile.s0 * st[2], st[2], tile.kw, cols,
                          st[3], store=True)

    def _finish_sub(self, tile: _KTile, u: int, res) -> None:
        """One 128-key sub-tile's dK / dV: zero-filled past the keys its queries saw (causal, L < S),
        summed over the query heads of a key/value group, scaled into ``res`` when complete."""
        f, b, hd = self.form, self.b, tile.head
        u0, uw = tile.subs[u]
        r0 = tile.s0 + u0
        for gi, (cols, factor) in enumerate(((f.E, self.scale), (f.Ev, 1.0))):
            acc = tile.dk if gi == 0 else tile.dv
            written = tile.written[u]
            if written < uw:  # keys no query sees (causal, L < S): their gradient is zero
                zero = b.sbuf((128, cols), "float32", site="attn.b.zero")
                b.memset(zero[:uw, :], 0.0, engine="pool")
                if written:
                    b.tensor_copy(zero[:written, :], acc[:written, u, :])
                src, in_psum = zero[:uw, :], False
            else:
                src, in_psum = acc[:uw, u, :], True
            if hd.group is not None:
                g = hd.group[gi][:uw, r0 // 128, :]
                if hd.first:
                    b.tensor_copy(g, src)
                else:
                    b.tensor_tensor(g, g, src, "add")
                if not hd.last:
                    continue
                src, in_psum = g, False
            # GpSimd cannot read PSUM: an accumulator still there is scaled on VectorE
            b.tensor_scalar(res[gi][:uw, u, :], src, "multiply", factor, engine="dve" if in_psum else "pool")


# ---- lowering rules ---------------------------------------------------------------------------

def _dropout(named) -> float:
    p = named.get("dropout_p", 0.0)
    return float(p) if isinstance(p, (int, float)) else 0.0


def lower_attention(call, spec):
    """``_scaled_dot_product_fused_attention_overrideable``: outputs (out, logsumexp, ...)."""
    named = call.named()
    if named.get("return_debug_mask") or len(call.outputs) < 2:
        return None
    try:
        return attention_forward(named.get("query"), named.get("key"), named.get("value"), named.get("attn_bias"),
                                 causal=bool(named.get("is_causal")), scale=named.get("scale"),
                                 dropout_p=_dropout(named), out=call.outputs[0], spec=spec, name=call.op)
    except (_Decline, ProgramError):  # outside the kernel's form, or its tiles do not fit: generic
        return None


def lower_attention_backward(call, spec):
    """``_scaled_dot_product_fused_attention_overrideable_backward``: outputs the gradients of
    query, key, value (and of a float ``attn_bias`` when ``grad_input_mask[3]``)."""
    named = call.named()
    bias = named.get("attn_bias")
    want = tuple(named.get("grad_input_mask") or (True, True, True, False))
    grad_mask = bool(len(want) > 3 and want[3] and isinstance(bias, TensorMeta) and bias.dtype != "bool")
    if len(call.outputs) != 3 + grad_mask:
        return None
    try:
        return attention_backward(named.get("grad_out"), named.get("query"), named.get("key"), named.get("value"),
                                  named.get("out"), named.get("logsumexp"), bias,
                                  causal=bool(named.get("is_causal")), scale=named.get("scale"),
                                  dropout_p=_dropout(named), grad_mask=grad_mask, grads=call.outputs[:3],
                                  spec=spec, name=call.op)
    except (_Decline, ProgramError):
        return None


def _register() -> None:
    from ._rules import Rule, add_rules

    add_rules(["_scaled_dot_product_fused_attention_overrideable"],
              Rule("fused:attention", lower_attention, "flash-style attention forward (lower/_attention.py)"))
    add_rules(["_scaled_dot_product_fused_attention_overrideable_backward"],
              Rule("fused:attention_backward", lower_attention_backward,
                   "flash-style attention backward (lower/_attention.py)"))


_register()
