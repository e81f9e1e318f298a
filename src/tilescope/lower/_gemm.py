"""``C = A @ B`` on TensorE, tiled to fit SBUF and PSUM whatever the sizes.

The one GEMM of both the eager matmul lowering and the compiler's matmul segments.
``PSUM[m, n] (+)= stationary[k, m].T @ moving[k, n]``: K on the 128 partitions, at most
128 stationary columns (an M block) and 512 moving columns (one PSUM bank of fp32, an N
block), accumulated over K tiles. Operands come in whichever orientation their memory
layout allows cheaply: ``A`` row-major is loaded as ``[M, K]`` blocks and transposed on
TensorE (a matmul against identity); ``A`` that is a transposed view is loaded as ``A.T``
directly; ``B`` likewise (a ``Linear`` weight ``W`` is ``B = W.T``, transposed 128 rows at a
time into ``[K, 512]`` panels).

How the blocks are kept on chip is chosen from their sizes (:func:`gemm_plan`):

* ``a_resident``: all of ``A.T`` fits half the budget (a batch of tokens against a vocabulary
  projection): it is prepared once, and each ``[K, 512]`` panel of ``B`` is loaded once and
  used for every M block -- each operand crosses HBM once;
* ``b_resident``: all of ``B`` fits: kept, and ``A.T`` prepared per M block;
* ``a_blocked``: neither fits, one M block's ``A.T`` does: M super-blocks of what fits, the
  ``B`` panels read once per super-block;
* ``k_stream``: not even one M block's ``A.T`` fits (a contraction over a whole vocabulary):
  ``A.T`` and ``B`` tiles stream along K into a few PSUM accumulators at once.

Each finished ``[m, n]`` block is handed to the caller's ``block(acc, m0, ms, n0, ns)``,
which evacuates PSUM (the eager epilogue, or a fused group's ops) and stores it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import itemsize
from ..isa import AP
from ..program import TileBuilder, View

__all__ = ["Gemm", "GemmPlan", "gemm_plan", "PE_DTYPES"]

PE_DTYPES = ("float32", "bfloat16", "float16")
_ACC_GROUP = 2  # PSUM accumulators kept at once when streaming K (with rotation: 4 of 8 banks)


@dataclass(frozen=True)
class GemmPlan:
    """How a GEMM keeps its operands on chip (see the module docstring)."""

    kind: str  # a_resident | b_resident | a_blocked | k_stream
    m_super: int  # rows of A whose A.T is prepared at once


def gemm_plan(M: int, K: int, N: int, dtype: str, budget: int, partitions: int = 128) -> GemmPlan:
    """The residency plan of an ``[M, K] @ [K, N]`` product in ``budget`` bytes per partition.

    >>> gemm_plan(1024, 768, 50257, "float32", 80 * 1024).kind   # a vocabulary projection
    'a_resident'
    >>> gemm_plan(1024, 50257, 768, "float32", 80 * 1024).kind   # its input gradient
    'k_stream'
    """
    isz = itemsize(dtype if dtype in PE_DTYPES else "float32")
    kt = -(-K // partitions)
    per_col = kt * isz  # bytes per partition of one column of A.T (or of B)
    panel = 2 * min(N, 512) * per_col  # a double-buffered [K, 512] panel of B
    a_block = 2 * min(M, partitions) * per_col  # a double-buffered [K, 128] block of A.T
    if M * per_col + panel <= budget:
        return GemmPlan("a_resident", M)
    if N * per_col + a_block <= budget:
        return GemmPlan("b_resident", partitions)
    fit = (budget - panel) // per_col // partitions * partitions
    if fit >= partitions:
        return GemmPlan("a_blocked", min(M, fit))
    return GemmPlan("k_stream", partitions)


def _mat(view: View, offset: int, rows: int, row_stride: int, cols: int, col_stride: int) -> View:
    ap = view.ap
    return View(view.buffer, AP(ap.buffer, ap.dtype, ap.offset + offset, ((row_stride, rows), (col_stride, cols))),
                (rows, cols))


class Gemm:
    """Emits ``A @ B`` block by block (A: M x K, B: K x N, given by element strides)."""

    def __init__(self, b: TileBuilder, budget: int | None = None, load=None):
        self.b = b
        spec = b.spec
        self.P = spec.partitions
        self.ncols = spec.matmul_moving_fmax
        self.mcols = spec.matmul_stationary_fmax
        self.budget = budget if budget is not None else int(spec.sbuf_bytes_per_partition * 0.4)
        if load is None:
            from ._elementwise import EngineLoad

            load = EngineLoad(b)
        self.load = load

    # ---- operand tiles ---------------------------------------------------------------------------
    def _evacuate(self, dst, src) -> None:
        """PSUM -> SBUF copy on whichever of VectorE / ScalarE frees up first (cost table)."""
        from ._elementwise import balanced_copy

        balanced_copy(self.b, self.load, dst, src)

    def _load(self, src: View, rows: int, cols: int, site: str, dtype: str, bufs: int) -> View:
        t = self.b.sbuf((rows, cols), dtype, site=site, bufs=bufs)
        self.b.dma_copy(t, src)
        if dtype not in PE_DTYPES:
            c = self.b.sbuf((rows, cols), "float32", site=site + ".cast", bufs=bufs)
            self.b.tensor_copy(c, t)
            return c
        return t

    def _transpose_into(self, dst: View, src: View, rows: int, cols: int, site: str, dtype: str) -> None:
        """Load ``src`` [rows, cols] (each <= 128) and write its transpose into ``dst`` [cols, rows]."""
        t = self._load(src, rows, cols, site + ".rows", dtype, 2)
        ps = self.b.psum((cols, rows), "float32", site=site + ".ps")
        self.b.transpose(ps, t)
        self._evacuate(dst, ps)

    def _a_t(self, A, a_off, a_rs, a_cs, k0, ks, m0, ms, dtype, site, bufs) -> View:
        """The stationary tile ``A.T[k0:k0+ks, m0:m0+ms]``."""
        transposed_view = a_rs == 1 and a_cs != 1  # A = X.T with X row-major: A.T rows contiguous
        if transposed_view or a_cs != 1:  # (or neither orientation contiguous: a strided load)
            return self._load(_mat(A, a_off + k0 * a_cs + m0 * a_rs, ks, a_cs, ms, a_rs), ks, ms, site, dtype, bufs)
        out = self.b.sbuf((ks, ms), dtype if dtype in PE_DTYPES else "float32", site=site, bufs=bufs)
        self._transpose_into(out, _mat(A, a_off + m0 * a_rs + k0 * a_cs, ms, a_rs, ks, a_cs), ms, ks,
                             site, dtype)
        return out

    def _b_panel(self, B, b_off, b_rs, b_cs, k0, ks, n0, ns, dtype, site, bufs) -> View:
        """The moving tile ``B[k0:k0+ks, n0:n0+ns]`` (a ``W.T`` view transposed 128 rows at a time)."""
        if not (b_rs == 1 and b_cs != 1):
            return self._load(_mat(B, b_off + k0 * b_rs + n0 * b_cs, ks, b_rs, ns, b_cs), ks, ns, site, dtype, bufs)
        out = self.b.sbuf((ks, ns), dtype if dtype in PE_DTYPES else "float32", site=site, bufs=bufs)
        for r0 in range(0, ns, self.mcols):
            rn = min(self.mcols, ns - r0)
            self._transpose_into(out[:, r0:r0 + rn], _mat(B, b_off + (n0 + r0) * b_cs + k0 * b_rs, rn, b_cs, ks, b_rs),
                                 rn, ks, site + ".w", dtype)
        return out

    def _row_groups(self, x_rs, x_cs, ktiles, dtype: str) -> list | None:
        """K tiles grouped so that each group's slice of 128 rows of a row-major ``[rows, K]``
        operand is loaded in one transfer (runs of the group's width, instead of one transfer
        per K tile of 128-element runs: each transfer costs its queue the fixed issue time),
        a double-buffered slice within an eighth of the budget; None where the operand's rows
        are not contiguous along K."""
        if x_cs != 1 or x_rs == 1:
            return None
        per_tile = 2 * self.P * itemsize(dtype)
        n = max(1, self.budget // 8 // per_tile)
        return [ktiles[i:i + n] for i in range(0, len(ktiles), n)]

    def _transposes(self, X, x_off, x_rs, r0: int, rn: int, group, dtype: str, site: str, outs) -> None:
        """Rows ``r0 .. r0 + rn`` of a row-major ``X`` [rows, K] over a group of K tiles, loaded
        at once; each K tile's slice transposed into ``outs[j]`` ``[ks, rn]``."""
        c0, width = group[0][0], group[-1][0] + group[-1][1] - group[0][0]
        t = self._load(_mat(X, x_off + r0 * x_rs + c0, rn, x_rs, width, 1), rn, width, site + ".rows", dtype, 2)
        for (k0, ks), dst in zip(group, outs):
            ps = self.b.psum((ks, rn), "float32", site=site + ".ps")
            self.b.transpose(ps, t[:, k0 - c0:k0 - c0 + ks])
            self._evacuate(dst, ps)

    def _a_ts(self, A, a_off, a_rs, a_cs, ktiles, m0, ms, dtype, site, bufs) -> list:
        """The stationary tiles ``A.T[k0:k0+ks, m0:m0+ms]`` of every K tile (``site(k0)``)."""
        groups = self._row_groups(a_rs, a_cs, ktiles, dtype)
        if groups is None or len(ktiles) == 1:
            return [self._a_t(A, a_off, a_rs, a_cs, k0, ks, m0, ms, dtype, site(k0), bufs) for k0, ks in ktiles]
        pe = dtype if dtype in PE_DTYPES else "float32"
        outs = [self.b.sbuf((ks, ms), pe, site=site(k0), bufs=bufs) for k0, ks in ktiles]
        j = 0
        for g in groups:
            self._transposes(A, a_off, a_rs, m0, ms, g, dtype, site(0) + ".a", outs[j:j + len(g)])
            j += len(g)
        return outs

    def _b_panels(self, B, b_off, b_rs, b_cs, ktiles, n0, ns, dtype, site, bufs) -> list:
        """The moving tiles ``B[k0:k0+ks, n0:n0+ns]`` of every K tile (``site(k0)``); a ``W.T``
        view's rows read a group of K tiles at a time, 128 rows at a time."""
        groups = self._row_groups(b_cs, b_rs, ktiles, dtype)
        if groups is None or len(ktiles) == 1:
            return [self._b_panel(B, b_off, b_rs, b_cs, k0, ks, n0, ns, dtype, site(k0), bufs) for k0, ks in ktiles]
        pe = dtype if dtype in PE_DTYPES else "float32"
        outs = [self.b.sbuf((ks, ns), pe, site=site(k0), bufs=bufs) for k0, ks in ktiles]
        for r0 in range(0, ns, self.mcols):
            rn = min(self.mcols, ns - r0)
            j = 0
            for g in groups:
                self._transposes(B, b_off, b_cs, n0 + r0, rn, g, dtype, site(0) + ".w",
                                 [o[:, r0:r0 + rn] for o in outs[j:j + len(g)]])
                j += len(g)
        return outs

    # ---- the product -----------------------------------------------------------------------------
    def emit(self, A: View, a_off: int, a_rs: int, a_cs: int, B: View, b_off: int, b_rs: int, b_cs: int,
             M: int, K: int, N: int, a_dtype: str, b_dtype: str, block) -> GemmPlan:
        """Emit the product; ``block(acc, m0, ms, n0, ns)`` consumes each finished PSUM block."""
        P = self.P
        plan = gemm_plan(M, K, N, a_dtype, self.budget, P)
        ktiles = [(k0, min(P, K - k0)) for k0 in range(0, K, P)]
        nblocks = [(n0, min(self.ncols, N - n0)) for n0 in range(0, N, self.ncols)]
        A_args = (A, a_off, a_rs, a_cs)
        B_args = (B, b_off, b_rs, b_cs)
        b = self.b

        def accumulate(acc, ats, bts):
            for j, (at, bt) in enumerate(zip(ats, bts)):
                b.matmul(acc, at, bt, accumulate=j > 0)

        if plan.kind == "k_stream":
            for m0 in range(0, M, self.mcols):
                ms = min(self.mcols, M - m0)
                for g0 in range(0, len(nblocks), _ACC_GROUP):
                    group = nblocks[g0:g0 + _ACC_GROUP]
                    accs = [b.psum((ms, ns), "float32", site=f"gemm.acc{j}") for j, (_, ns) in enumerate(group)]
                    for j, (k0, ks) in enumerate(ktiles):
                        at = self._a_t(*A_args, k0, ks, m0, ms, a_dtype, "gemm.at", 2)
                        for acc, (n0, ns) in zip(accs, group):
                            bt = self._b_panel(*B_args, k0, ks, n0, ns, b_dtype, "gemm.b", 2)
                            b.matmul(acc, at, bt, accumulate=j > 0)
                    for acc, (n0, ns) in zip(accs, group):
                        block(acc, m0, ms, n0, ns)
            return plan

        if plan.kind == "b_resident":
            panels = {}
            for n0, ns in nblocks:
                tiles = self._b_panels(*B_args, ktiles, n0, ns, b_dtype, lambda k0, n0=n0: f"gemm.b{n0}.{k0}", 1)
                panels.update({(n0, k0): t for (k0, _), t in zip(ktiles, tiles)})
            for m0 in range(0, M, self.mcols):
                ms = min(self.mcols, M - m0)
                ats = self._a_ts(*A_args, ktiles, m0, ms, a_dtype, lambda k0: f"gemm.at{k0}", 2)
                for n0, ns in nblocks:
                    acc = b.psum((ms, ns), "float32", site="gemm.acc")
                    accumulate(acc, ats, [panels[n0, k0] for k0, _ in ktiles])
                    block(acc, m0, ms, n0, ns)
            return plan

        # a_resident / a_blocked: A.T of a super-block of rows kept, B streamed in [K, 512] panels
        for s0 in range(0, M, plan.m_super):
            mblocks = [(m0, min(self.mcols, min(M, s0 + plan.m_super) - m0))
                       for m0 in range(s0, min(M, s0 + plan.m_super), self.mcols)]
            ats = {}
            for m0, ms in mblocks:
                tiles = self._a_ts(*A_args, ktiles, m0, ms, a_dtype, lambda k0, m=m0 - s0: f"gemm.at{m}.{k0}", 1)
                ats.update({(m0, k0): t for (k0, _), t in zip(ktiles, tiles)})
            for n0, ns in nblocks:
                panel = self._b_panels(*B_args, ktiles, n0, ns, b_dtype, lambda k0: f"gemm.b{k0}", 2)
                for m0, ms in mblocks:
                    acc = b.psum((ms, ns), "float32", site="gemm.acc")
                    accumulate(acc, [ats[m0, k0] for k0, _ in ktiles], panel)
                    block(acc, m0, ms, n0, ns)
        return plan
