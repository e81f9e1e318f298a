"""``sort`` / ``argsort`` along the last dim as a bitonic sorting network on VectorE.

NKI's ISA has no sort instruction; a sorting network is what its elementwise engines can run:
each of the ``log2(N) * (log2(N) + 1) / 2`` stages compares ``N / 2`` pairs at once. A pair's
two positions are two access patterns over the row (the bitonic directions fold into the
patterns' strides, so every pair sorts "ascending" into its own slots), and one stage is nine
VectorE instructions over ``N / 2`` elements: the swap mask from (value, index) compared
lexicographically -- so equal values keep their original order, as a stable sort does, and the
padding (``+inf``, or ``-inf`` descending) always lands after the row's own infinities and NaNs
-- and a select per output for the values and for the indices, into the other of two ping-pong
tiles. (Without the index, a tie between padding and a real infinity could put a padding slot
among the first ``n``: five instructions a stage would not be exact.)

Rows go on partitions, padded to a power of two with values that sort last. NaN sorts as the
largest value (as torch does): the network compares ``+inf`` in its place, and the output
values are gathered from the input by the sorted indices (GpSimd). A row longer than 4096
(whose tiles would not fit SBUF) is left to the generic lowering.
"""

from __future__ import annotations

from ..isa import AP
from ..program import TileBuilder, View
from ._call import Call, TensorMeta
from ._layout import hbm_input, hbm_output
from ._indirect import fits_or_declines
from ._rules import Rule, add_rules
from ._topk import gather_positions
from ._vocab import rows_form

__all__ = ["lower_sort", "bitonic_stages"]

_MAX_N = 4096
_FLOATS = ("float32", "bfloat16", "float16")


def bitonic_stages(n: int):
    """``(k, j)`` per stage of the bitonic network on ``n`` (a power of two) elements.

    >>> list(bitonic_stages(8))
    [(2, 1), (4, 2), (4, 1), (8, 4), (8, 2), (8, 1)]
    """
    k = 2
    while k <= n:
        j = k // 2
        while j >= 1:
            yield k, j
            j //= 2
        k *= 2


def _pair_views(t: View, p: int, n: int, k: int, j: int):
    """(first, second): the slots that receive the smaller and the larger of each pair of stage
    ``(k, j)``. Pairs in a descending block swap roles: the direction is a stride."""
    ap = t.ap
    if 2 * k <= n:
        free_a = ((2 * k, n // (2 * k)), (k + j, 2), (2 * j, k // (2 * j)), (1, j))
        free_b = ((2 * k, n // (2 * k)), (k - j, 2), (2 * j, k // (2 * j)), (1, j))
    else:  # the last merge: one ascending block
        free_a = free_b = ((2 * j, n // (2 * j)), (1, j))
    shape = (p,) + tuple(c for _, c in free_a)
    a = View(t.buffer, AP(ap.buffer, ap.dtype, ap.offset, ((n, p),) + free_a), shape)
    b = View(t.buffer, AP(ap.buffer, ap.dtype, ap.offset + j, ((n, p),) + free_b), shape)
    return a, b


def lower_sort(call: Call, spec):
    """``sort(self, dim=-1, descending)`` / ``sort.stable`` (and ``argsort``) over the last dim."""
    named = call.named()
    x = named.get("self")
    if not isinstance(x, TensorMeta) or x.dtype not in _FLOATS or not call.outputs:
        return None
    outs = call.outputs
    if call.packet == "argsort":
        vout, iout = None, outs[0]
    elif len(outs) == 2:
        vout, iout = outs
    else:
        return None
    dim = named.get("dim", -1)
    fx, fi = rows_form(x, dim), rows_form(iout, dim)
    fv = rows_form(vout, dim) if vout is not None else None
    if fx is None or fi is None or (vout is not None and fv is None) or iout.numel == 0:
        return None
    R, n, xrs = fx
    N = 1 << max(1, (n - 1).bit_length())
    if N > _MAX_N:
        return None
    desc = bool(named.get("descending", False))
    P = spec.partitions
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xv = hbm_input(b, "in_self", x)
        vo = hbm_output(b, "values", vout) if vout is not None else None
        io = hbm_output(b, "indices" if vout is not None else "out", iout)
        for r0 in range(0, R, P):
            p = min(P, R - r0)
            raw = b.sbuf((p, N), x.device_dtype, site="sort.raw", bufs=1)
            b.memset(raw, float("-inf") if desc else float("inf"))  # padding sorts last
            b.dma_copy(raw[:, 0:n], View(xv.buffer, AP(xv.ap.buffer, xv.ap.dtype, xv.ap.offset + r0 * xrs,
                                                       ((xrs, p), (1, n))), (p, n)))
            key = b.sbuf((p, N), "float32", site="sort.key", bufs=2)
            num = b.sbuf((p, N), "float32", site="sort.num", bufs=1)
            b.tensor_tensor(num, raw, raw, "equal")  # 0 for NaN (NaN != NaN)
            b.select(key, num, raw, float("inf"))  # NaN compares as +inf (the largest)
            idx = b.sbuf((p, N), "float32", site="sort.idx", bufs=2)
            b.iota(idx, steps=(1,))
            for k, j in bitonic_stages(N):
                a, bb = _pair_views(key, p, N, k, j)
                ia, ib = _pair_views(idx, p, N, k, j)
                shape = a.shape
                half = N // 2
                m = b.sbuf((p, half), "float32", site="sort.gt", bufs=1)
                e = b.sbuf((p, half), "float32", site="sort.eq", bufs=1)
                mv, ev = _flat_as(m, shape), _flat_as(e, shape)
                b.tensor_tensor(mv, a, bb, "less" if desc else "greater")
                b.tensor_tensor(ev, a, bb, "equal")
                t = b.sbuf((p, half), "float32", site="sort.tie", bufs=1)
                tv = _flat_as(t, shape)
                b.tensor_tensor(tv, ia, ib, "greater")  # equal values: the lower index first
                b.tensor_tensor(ev, ev, tv, "multiply")
                b.tensor_tensor(mv, mv, ev, "maximum")  # swap where the pair is out of order
                nkey = b.sbuf((p, N), "float32", site="sort.key", bufs=2)  # ping-pong
                nidx = b.sbuf((p, N), "float32", site="sort.idx", bufs=2)
                na, nb = _pair_views(nkey, p, N, k, j)
                nia, nib = _pair_views(nidx, p, N, k, j)
                b.select(na, mv, bb, a)
                b.select(nb, mv, a, bb)
                b.select(nia, mv, ib, ia)
                b.select(nib, mv, ia, ib)
                key, idx = nkey, nidx
            ii = b.sbuf((p, n), "int64", site="sort.out_idx", bufs=1)
            b.tensor_copy(ii, idx[:, 0:n])
            b.dma_copy(View(io.buffer, AP(io.ap.buffer, io.ap.dtype, io.ap.offset + r0 * fi[2], ((fi[2], p), (1, n))),
                            (p, n)), ii)
            if vo is not None:  # the values themselves (NaN included), by the sorted indices
                vals = b.sbuf((p, n), vout.device_dtype, site="sort.vals", bufs=1)
                gather_positions(b, raw, idx[:, 0:n], p, n, "sort.values", out=vals)
                b.dma_copy(View(vo.buffer, AP(vo.ap.buffer, vo.ap.dtype, vo.ap.offset + r0 * fv[2],
                                              ((fv[2], p), (1, n))), (p, n)), vals)
    return b.build(meta={"lowering": "bitonic"})


def _flat_as(t: View, shape) -> View:
    """A contiguous [p, m] tile seen with ``shape`` (row-major)."""
    dims, step = [], 1
    for c in reversed(shape[1:]):
        dims.append((step, c))
        step *= c
    ap = t.ap
    return View(t.buffer, AP(ap.buffer, ap.dtype, ap.offset, ((step, shape[0]),) + tuple(reversed(dims))), tuple(shape))


add_rules(["sort", "argsort"], Rule("bitonic", fits_or_declines(lower_sort), "sort: a bitonic network on VectorE"))
