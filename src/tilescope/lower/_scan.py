"""``cumsum`` and ``cumprod``: VectorE's scan along a row, TensorE's triangular matmul across rows.

* The scanned dim is the innermost one (``x.cumsum(-1)``, position ids from an attention mask):
  rows go on the partitions and VectorE's ``tensor_tensor_scan`` runs along each row
  (``dst[i] = a[i] * dst[i-1] + x[i]``, nki.isa.tensor_tensor_scan). Short rows share a
  partition: ``a`` is 0 where a row starts, so the running sum restarts there. A long row is
  scanned in chunks, each starting from the previous chunk's last value. Few long rows are split
  over partitions: each piece scanned, then TensorE adds the totals of the earlier pieces.
* The scanned dim has neighbours inside it (``x.cumsum(0)`` of a ``[N, D]``): the scanned dim
  goes on the partitions and TensorE sums ``U.T @ x`` with the upper-triangular ones ``U``
  (``U[k, m] = k <= m``) per 128 rows, and accumulates every block's column totals on all rows
  of a PSUM tile (``ones.T @ x``); VectorE adds the two -- two matmuls per 128 x 512 block.

``cumprod`` along an inner dim has no matmul form and is left to the generic lowering.
"""

from __future__ import annotations

from itertools import product

from ..isa import AP, TensorTensorScan
from ..program import TileBuilder, View
from ._call import Call, TensorMeta
from ._indirect import fits_or_declines, row_blocks, sb
from ._layout import coalesce, hbm_input, hbm_output
from ._rules import Rule, add_rules
from ._vocab import RowSplit

__all__ = ["lower_cumulative"]

_FREE = 4096  # elements per partition of one scan tile
_COLS = 512  # columns of one TensorE block (one PSUM bank of float32)
_PE_DTYPES = ("float32", "bfloat16", "float16")
_SPLIT_BYTES = 48 * 1024  # bytes per partition of a row piece, its scan and its result (two in flight)


def _scan(b: TileBuilder, dst, a, x, initial, op: str) -> None:
    """One scan instruction: ``dst[i] = a[i] * dst[i-1] + x[i]`` (rows sharing a partition, ``a`` 0
    where a row starts), ``x[i] + dst[i-1]`` (one row per partition) or ``x[i] * dst[i-1]``."""
    initial = initial.ap if isinstance(initial, View) else float(initial)
    if a is not None:
        b.emit(TensorTensorScan(dst.ap, a.ap, x.ap, initial, "multiply", "add"))
    else:
        b.emit(TensorTensorScan(dst.ap, x.ap, x.ap, initial, "add" if op == "sum" else "multiply", "bypass"))


def lower_cumulative(call: Call, spec):
    """``cumsum`` / ``cumprod`` (and their ``out=`` / in-place forms) over any dim."""
    named = call.named()
    x = named.get("self")
    out = call.outputs[0] if len(call.outputs) == 1 else None
    if not isinstance(x, TensorMeta) or out is None or out.numel == 0 or x.is_complex or out.shape != x.shape:
        return None
    op = "sum" if call.packet.startswith("cumsum") else "prod"
    if x.ndim == 0:
        x, out, dim = TensorMeta((1,), (1,), x.dtype), TensorMeta((1,), (1,), out.dtype), 0
    else:
        dim = named.get("dim", 0) % x.ndim
    n = x.shape[dim]
    inner = [d for d in range(dim + 1, x.ndim)]
    ishape, (ix, io) = coalesce(tuple(x.shape[d] for d in inner) or (1,),
                                [tuple(x.stride[d] for d in inner) or (1,), tuple(out.stride[d] for d in inner) or (1,)])
    outer = list(range(dim))
    oshape, (ox, oo) = coalesce(tuple(x.shape[d] for d in outer) or (1,),
                                [tuple(x.stride[d] for d in outer) or (0,), tuple(out.stride[d] for d in outer) or (0,)])
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xv, ov = hbm_input(b, "in_self", x), hbm_output(b, "out", out)
        if ishape == (1,) and op == "sum" and len(oshape) == 1 and x.stride[dim] == 1 and out.stride[dim] == 1 \
                and _split_rows(b, spec, x, out, xv, ov, oshape[0], n, ox[0], oo[0]):
            pass
        elif ishape == (1,):
            _along_rows(b, spec, x, out, xv, ov, n, x.stride[dim], out.stride[dim], oshape, ox, oo, op)
        elif op == "sum" and len(ishape) == 1 and out.device_dtype in _PE_DTYPES:
            _across_rows(b, spec, x, out, xv, ov, n, x.stride[dim], out.stride[dim], oshape, ox, oo,
                         ishape[0], ix[0], io[0])
        else:
            return None
    return b.build(meta={"lowering": "scan"})


def _along_rows(b, spec, x, out, xv, ov, n, xs, os_, oshape, ox, oo, op) -> None:
    """The scanned dim innermost: rows (the outer positions) on partitions, VectorE scans."""
    rows_shape, row_x, row_o = (oshape[-1], ox[-1], oo[-1])
    loops = list(product(*(range(m) for m in oshape[:-1])))
    chunk = min(n, _FREE)
    k_max = max(1, _FREE // n) if op == "sum" and n <= _FREE else 1
    P = spec.partitions
    masks: dict = {}
    for pos in loops:
        bx = sum(i * s for i, s in zip(pos, ox[:-1]))
        bo = sum(i * s for i, s in zip(pos, oo[:-1]))
        for r0, p, k in row_blocks(rows_shape, k_max, P):
            carry = 0.0 if op == "sum" else 1.0
            for c0 in range(0, n, chunk):
                cw = min(chunk, n - c0)
                t = b.sbuf((p, k * cw), x.device_dtype, site="scan.in")
                src = AP(xv.ap.buffer, xv.ap.dtype, xv.ap.offset + bx + r0 * row_x + c0 * xs,
                         ((k * row_x, p), (row_x, k), (xs, cw)))
                b.dma_copy(sb(t, (p, k, cw)), View(xv.buffer, src, (p, k, cw)))
                a = None
                if k > 1:  # (one chunk per row then)
                    a = masks.get((p, k, cw))
                    if a is None:  # 0 where a row starts (the scan restarts), else 1
                        a = b.sbuf((p, k * cw), "float32", site=f"scan.mask{len(masks)}", bufs=1)
                        b.iota(sb(a, (p, k, cw)), steps=(0, 1))
                        b.tensor_scalar(a, a, "not_equal", 0.0)
                        masks[(p, k, cw)] = a
                o = b.sbuf((p, k * cw), out.device_dtype, site="scan.out")
                _scan(b, o, a, t, carry, op)
                carry = o[:, k * cw - 1:k * cw]
                dst = AP(ov.ap.buffer, ov.ap.dtype, ov.ap.offset + bo + r0 * row_o + c0 * os_,
                         ((k * row_o, p), (row_o, k), (os_, cw)))
                b.dma_copy(View(ov.buffer, dst, (p, k, cw)), sb(o, (p, k, cw)))


def _split_rows(b, spec, x, out, xv, ov, rows, n, xrs, ors) -> bool:
    """Few long rows: each split over neighbouring partitions (so DMA and VectorE use the lanes),
    every piece scanned on VectorE, then TensorE adds the totals of each row's earlier pieces
    (``L.T @ totals``, ``L[k, m] = 1`` for an earlier piece of the same row). False: not this form."""
    P = spec.partitions
    split = RowSplit(rows, n, x.itemsize + 4 + out.itemsize, _SPLIT_BYTES, P)
    if split.f == 1 or not split.resident:
        return False
    w = split.w
    earlier: dict = {}
    pad = None
    if split.wl < w:  # the last pieces' tail adds nothing: zeros, DMA'd in beside the data
        pad = b.sbuf((P, w - split.wl), x.device_dtype, site="scan.pad", bufs=1)
        b.memset(pad, 0.0)
    for r0, nr, p in split.tiles(rows):
        t = b.sbuf((p, w), x.device_dtype, site="scan.piece", bufs=2)
        split.load(b, t, 0, xv, xrs, r0, nr, 0, w, pad)
        o = b.sbuf((p, w), "float32", site="scan.local", bufs=2)
        _scan(b, o, None, t, 0.0, "sum")
        low = earlier.get(nr)
        if low is None:
            cols = b.sbuf((p, p), "float32", site="scan.cols", bufs=1)
            b.iota(cols, steps=(1,))
            rws = b.sbuf((p, p), "float32", site="scan.rws", bufs=1)
            b.iota(rws, partition_step=1, steps=(0,))
            low = b.sbuf((p, p), "float32", site=f"scan.earlier{nr}", bufs=1)
            b.tensor_tensor(low, rws, cols, "less")  # an earlier partition ...
            b.tensor_scalar(cols, cols, "mod", float(nr))
            b.tensor_scalar(rws, rws, "mod", float(nr))
            b.tensor_tensor(cols, cols, rws, "equal")  # ... holding a piece of the same row
            b.tensor_tensor(low, low, cols, "multiply")
            earlier[nr] = low
        ps = b.psum((p, 1), "float32", site="scan.carry_ps")
        b.matmul(ps, low, o[:, w - 1:w])
        carry = b.sbuf((p, 1), "float32", site="scan.carry")
        b.tensor_copy(carry, ps)
        res = b.sbuf((p, w), out.device_dtype, site="scan.res", bufs=2)
        b.tensor_scalar(res, o, "add", carry)
        split.store(b, ov, ors, res, r0, nr, 0, w)
    return True


def _across_rows(b, spec, x, out, xv, ov, n, xs, os_, oshape, ox, oo, cols, cx, co) -> None:
    """The scanned dim has neighbours inside: scanned rows on partitions. Per block of 128 rows
    TensorE gives ``U.T @ x`` (the block's own running sums) and accumulates ``J.T @ x`` (``J`` all
    ones: every row gets the block's column totals) into a PSUM tile that so holds, on every row,
    the totals of all rows so far; VectorE adds the two on the way out of PSUM."""
    P = spec.partitions
    # 16-bit floats go through TensorE as they are (0/1 matrices are exact; PSUM accumulates in fp32)
    mdt = x.device_dtype if x.device_dtype in _PE_DTYPES else "float32"
    tri = b.sbuf((P, P), mdt, site="scan.tri", bufs=1)
    b.iota(tri, base=0, partition_step=-1, steps=(1,))  # m - k
    b.tensor_scalar(tri, tri, "greater_equal", 0.0)  # U[k, m] = (k <= m)
    ones = b.sbuf((P, P), mdt, site="scan.ones", bufs=1)
    b.memset(ones, 1.0)
    for pos in product(*(range(m) for m in oshape)):
        bx = sum(i * s for i, s in zip(pos, ox))
        bo = sum(i * s for i, s in zip(pos, oo))
        for c0 in range(0, cols, _COLS):
            cw = min(_COLS, cols - c0)
            totals = None
            for r0 in range(0, n, P):
                p = min(P, n - r0)
                t = b.sbuf((p, cw), x.device_dtype, site="scan.rows")
                b.dma_copy(t, View(xv.buffer, AP(xv.ap.buffer, xv.ap.dtype, xv.ap.offset + bx + r0 * xs + c0 * cx,
                                                 ((xs, p), (cx, cw))), (p, cw)))
                mv = t
                if x.device_dtype != mdt:
                    mv = b.sbuf((p, cw), mdt, site="scan.cast")
                    b.tensor_copy(mv, t)
                ps = b.psum((p, cw), "float32", site="scan.ps")
                b.matmul(ps, tri[:p, :p], mv)
                o = b.sbuf((p, cw), out.device_dtype, site="scan.out")
                if totals is None:
                    b.tensor_copy(o, ps)
                else:
                    b.tensor_tensor(o, ps, totals[:p, :], "add")
                if r0 + p < n:
                    if totals is None:
                        totals = b.psum((P, cw), "float32", site="scan.totals", bufs=1)
                    b.matmul(totals[:P, :], ones[:p, :P], mv, accumulate=r0 > 0)
                b.dma_copy(View(ov.buffer, AP(ov.ap.buffer, ov.ap.dtype, ov.ap.offset + bo + r0 * os_ + c0 * co,
                                              ((os_, p), (co, cw))), (p, cw)), o)


add_rules(["cumsum", "cumsum_", "cumprod", "cumprod_"], Rule("scan", fits_or_declines(lower_cumulative),
                                                            "cumulative sums/products: VectorE scan or TensorE"))
