"""Reductions over any dims: on VectorE along the free axis, or on TensorE across partitions.

Two forms, chosen by the input's layout:

* **row form** (the reduced elements are the free axis): each partition holds ``k``
  output elements' worth of input (``[P, k, N]``), one ``tensor_reduce`` per tile; a
  reduction longer than the free budget is chunked and combined. Reducing a
  non-innermost dim this way reads strided memory (DMA pays for the small chunks).
* **column form** for sums and means whose kept elements are contiguous (a reduction
  over rows, e.g. ``x.sum(0)``): rows go on the partitions and TensorE accumulates
  ``ones[K, 1].T @ x[K, N]`` into PSUM over row tiles -- the standard way to reduce
  across partitions.

``var`` / ``std`` take two passes over the same tile (mean, then squared deviations).
"""

from __future__ import annotations

from itertools import product
from math import prod

from ..isa import AP, RuntimeScalar
from ..program import TileBuilder, View
from ._call import Call, ScalarArg, TensorMeta
from ._layout import TilePlan, coalesce, hbm_input, hbm_output
from ._rules import Rule, add_rules

__all__ = ["lower_reduction", "REDUCTIONS", "reduce_chunk", "finish_reduction", "bn_stats_tile", "bn_stats_into",
           "variance_from_stats", "variance_two_pass"]

_FREE = 4096  # input elements per partition per tile
_COLS = 512  # TensorE moving free size (one PSUM bank of fp32)

# op name -> (engine reduce op, post-processing)
REDUCTIONS = {
    "sum": ("add", None), "mean": ("add", "mean"), "amax": ("max", None), "amin": ("min", None),
    "prod": ("multiply", None), "max": ("max", None), "min": ("min", None),
    "all": ("min", "nonzero"), "any": ("max", "nonzero"),
    "var": ("add", "var"), "std": ("add", "std"),
    "linalg_vector_norm": ("add", "norm"), "norm": ("add", "norm"),
}


def _dims(call: Call, ndim: int):
    """The reduced dims (sorted, non-negative), or None when the call is not a plain reduction."""
    named = call.named()
    dim = named.get("dim", None)
    if dim is None:  # sum.default, mean.default, ...: every dim
        dims = list(range(ndim))
    elif isinstance(dim, int):
        dims = [dim]
    else:
        dims = list(dim)
        if not dims:
            dims = list(range(ndim))
    out = sorted({d + ndim if d < 0 else d for d in dims})
    if any(not 0 <= d < ndim for d in out):
        return None
    return out


def _correction(call: Call):
    """The variance's correction: a number, or a RuntimeScalar (``correction=`` is a Scalar)."""
    named = call.named()
    c = named.get("correction", None)
    if c is None:
        unbiased = named.get("unbiased", True)
        return 1 if unbiased is not False else 0
    if isinstance(c, ScalarArg):
        return RuntimeScalar(c.name)
    return c


def lower_reduction(call: Call, spec):
    base = call.packet
    row = REDUCTIONS.get(base)
    if row is None or len(call.outputs) != 1:
        return None
    if base in ("max", "min") and call.overload != "default":
        return None  # max.dim returns (values, indices): generic
    x = next((v for v in call.args[:1] if isinstance(v, TensorMeta)), None)
    out = call.outputs[0]
    if x is None or x.numel == 0 or out.numel == 0 or x.is_complex or out.is_complex:
        return None
    if x.ndim == 0:  # a reduction of a scalar reads its one element
        x, out, dims = TensorMeta((1,), (1,), x.dtype), TensorMeta((1,), (1,), out.dtype), [0]
    else:
        dims = _dims(call, x.ndim)
    if dims is None:
        return None
    red_op, post = row
    correction = _correction(call) if post in ("var", "std") else 0
    if correction is None:
        return None
    if post == "norm":
        named = call.named()
        order = named.get("ord", named.get("p", 2))
        order = 2 if order is None else order
        if isinstance(order, ScalarArg):
            return None  # the order decides the Program: the device keys it by value
        red_op, post = _NORMS.get(order, ("add", "pnorm"))
        correction = float(order)
    kept = [d for d in range(x.ndim) if d not in dims]
    # output strides of the kept dims (keepdim outputs carry size-1 reduced dims)
    if out.ndim == x.ndim:
        out_kept = [out.stride[d] for d in kept]
    else:
        out_kept = list(out.stride)
    kshape = tuple(x.shape[d] for d in kept)
    (kshape_c, (kin, kout)) = coalesce(kshape or (1,), [tuple(x.stride[d] for d in kept) or (0,),
                                                         tuple(out_kept) or (0,)])
    rshape, (rin,) = coalesce(tuple(x.shape[d] for d in dims), [tuple(x.stride[d] for d in dims)])
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xin = hbm_input(b, "in_self", x)
        yout = hbm_output(b, "out", out)
        column = (post in (None, "mean") and red_op == "add" and kin[-1] in (1, 0) and len(rshape) == 1
                  and rin[0] > 1 and kshape_c[-1] > 1)
        if column and _slices_cheaper(spec, rshape[0], prod(kshape_c)):
            _slices(b, spec, x, out, xin, yout, kshape_c, kin, kout, rshape[0], rin[0], post)
        elif column:
            _column(b, spec, x, out, xin, yout, kshape_c, kin, kout, rshape[0], rin[0], post)
        else:
            if _rows(b, spec, x, out, xin, yout, kshape_c, kin, kout, rshape, rin, red_op, post, correction) is False:
                return None
    return b.build(meta={"lowering": "reduction"})


# vector norm order -> (reduction, post-processing)
_NORMS = {2: ("add", "norm2"), 2.0: ("add", "norm2"), 1: ("add", "norm1"), 1.0: ("add", "norm1"),
          float("inf"): ("max", "normabs"), float("-inf"): ("min", "normabs"), 0: ("add", "norm0"),
          0.0: ("add", "norm0")}


def _sb(view_like, shape3):
    """[P, k, n] view of a [P, k*n] SBUF tile."""
    ap = view_like.ap
    p, k, n = shape3
    return View(view_like.buffer, AP(ap.buffer, ap.dtype, ap.offset, ((k * n, p), (n, k), (1, n))), (p, k, n))


def _row_blocks(kshape, kin, kout, k_max: int, partitions: int):
    """The kept rows in blocks of ``p`` partitions x ``k`` consecutive rows of the last kept dim
    (k <= k_max), for every index of the outer kept dims: yields (input offset, output offset, p, k)."""
    last, ks_in, ks_out = kshape[-1], kin[-1], kout[-1]
    for outer in product(*(range(n) for n in kshape[:-1])):
        base_in = sum(i * s for i, s in zip(outer, kin[:-1]))
        base_out = sum(i * s for i, s in zip(outer, kout[:-1]))
        r = 0
        while r < last:
            left = last - r
            k = min(k_max, -(-left // partitions))
            p = min(partitions, left // k)
            yield base_in + r * ks_in, base_out + r * ks_out, p, k
            r += p * k


def _rows(b, spec, x, out, xin, yout, kshape, kin, kout, rshape, rin, red_op, post, correction):
    n_red = prod(rshape)
    chunked = n_red > _FREE
    if chunked and len(rshape) != 1:
        return False
    chunk = min(n_red, _FREE)
    ks_in, ks_out = kin[-1], kout[-1]
    for in_off, out_off, p, k in _row_blocks(kshape, kin, kout, max(1, _FREE // chunk), spec.partitions):
        acc = b.sbuf((p, k), "float32", site="red.acc")
        stats = bn_stats_tile(b, p, n_red, site="red") if post in ("var", "std") and k == 1 else None
        for c0 in range(0, n_red, chunk):
            cw = min(chunk, n_red - c0)
            t = b.sbuf((p, k * cw), x.device_dtype, site="red.in")
            if chunked:
                red_dims = ((rin[0], cw),)
                off = c0 * rin[0]
            else:
                red_dims = tuple(zip(rin, rshape))
                off = 0
            src = AP(xin.ap.buffer, xin.ap.dtype, xin.ap.offset + in_off + off,
                     ((k * ks_in, p), (ks_in, k)) + red_dims)
            b.dma_copy(t, View(xin.buffer, src, (p, k, cw)))
            if stats is not None:
                bn_stats_into(b, stats, t, c0)
            elif post in ("var", "std"):
                variance_two_pass(b, acc, t, (p, k, cw), n_red, correction, post)
            else:
                reduce_chunk(b, acc, t, (p, k, cw), red_op, post, correction, first=c0 == 0)
        if stats is not None:
            variance_from_stats(b, acc, stats, n_red, correction, post)
        res = finish_reduction(b, acc, post, n_red, correction, out.device_dtype)
        dst = AP(yout.ap.buffer, yout.ap.dtype, yout.ap.offset + out_off, ((k * ks_out, p), (ks_out, k)))
        b.dma_copy(View(yout.buffer, dst, (p, k)), res)
    return None


# ---- one tile's reduction along its last free axis: shared with the compiler's fusion ------------

_COMBINE = {"add": "add", "max": "maximum", "min": "minimum", "multiply": "multiply"}
_PRE = ("nonzero", "norm0", "norm1", "norm2", "normabs", "pnorm")


def reduce_chunk(b, acc, t, shape3, red_op: str, post, order=None, *, first: bool = True, site: str = "red"):
    """Reduce tile ``t`` ([p, k * n], seen as [p, k, n]) along its last axis into ``acc`` [p, k]
    (float32), by a row of :data:`REDUCTIONS`: the element step some reductions take first
    (``x != 0`` for any/all, ``|x|`` or ``x^2`` for norms), then ``tensor_reduce``; a chunk after
    the ``first`` is reduced apart and combined with what ``acc`` holds."""
    p, k, n = shape3
    tv = _sb(t, shape3)
    if post in _PRE:
        nz = b.sbuf((p, k * n), "float32", site=f"{site}.nz")
        if post in ("nonzero", "norm0"):
            b.tensor_scalar(nz, t, "not_equal", 0.0)
        elif post == "norm2":
            b.activation(nz, t, "square")
        else:
            b.activation(nz, t, "abs")
            if post == "pnorm":
                b.tensor_scalar(nz, nz, "power", order)
        tv = _sb(nz, shape3)
    if first:
        b.tensor_reduce(acc, tv, red_op, axes=(2,))
        return
    part = b.sbuf((p, k), "float32", site=f"{site}.part")
    b.tensor_reduce(part, tv, red_op, axes=(2,))
    b.tensor_tensor(acc, acc, part, _COMBINE[red_op])


def finish_reduction(b, acc, post, n: int, order, out_dtype: str, *, site: str = "red"):
    """The reduction's last step on ``acc`` [p, k] (a mean's 1/n, a norm's root) and the cast to
    ``out_dtype``; returns the tile holding the result."""
    p, k = acc.shape
    if post == "norm2":
        b.activation(acc, acc, "sqrt")
    elif post == "pnorm":
        b.tensor_scalar(acc, acc, "power", 1.0 / order)
    if post == "mean":
        res = b.sbuf((p, k), out_dtype, site=f"{site}.res")
        b.tensor_scalar(res, acc, "multiply", 1.0 / n)
        return res
    if out_dtype != "float32":
        res = b.sbuf((p, k), out_dtype, site=f"{site}.res")
        b.tensor_copy(res, acc)
        return res
    return acc


_BN_FMAX = 512  # [isa] bn_stats reads at most 512 elements per partition


def bn_stats_tile(b, p: int, n: int, *, site: str):
    """The [p, 6 * groups] statistics tile ``bn_stats`` fills for rows of ``n`` elements."""
    return b.sbuf((p, 6 * -(-n // _BN_FMAX)), "float32", site=f"{site}.bnstats")


def bn_stats_into(b, stats, t, col0: int) -> None:
    """Statistics of tile ``t`` [p, n] (columns ``col0``.. of the row, one row per partition) into
    their groups of ``stats``, 512 elements per ``bn_stats``."""
    n = t.shape[-1]
    for c in range(0, n, _BN_FMAX):
        g = (col0 + c) // _BN_FMAX
        b.bn_stats(stats[:, 6 * g:6 * g + 6], t[:, c:min(n, c + _BN_FMAX)])


def variance_from_stats(b, dst, stats, n: int, correction, post) -> None:
    """``bn_aggr`` of the row's statistics into ``dst`` [p, 1]: the population variance, rescaled by
    torch's ``correction`` (a number or a runtime scalar); its root for ``std``."""
    p = dst.shape[0]
    mv = b.sbuf((p, 2), "float32", site="red.mv")
    b.bn_aggr(mv, stats)
    if isinstance(correction, RuntimeScalar):
        denom = b.sbuf((p, 1), "float32", site="red.denom")
        b.memset(denom, float(n))
        b.tensor_scalar(denom, denom, "subtract", correction)
        b.tensor_scalar(dst, mv[:, 1:2], "multiply", float(n), "divide", denom)
    else:
        b.tensor_scalar(dst, mv[:, 1:2], "multiply", n / (n - correction) if n - correction > 0 else float("nan"))
    if post == "std":
        b.activation(dst, dst, "sqrt")


def variance_two_pass(b, acc, t, shape3, n, correction, post):
    """Variance of each of a tile's ``k`` rows per partition ([p, k, n]): the mean, then the mean
    of squared deviations (``bn_stats`` sums over a whole partition, so it serves k = 1 only)."""
    p, k, cw = shape3
    tv = _sb(t, shape3)
    mean = b.sbuf((p, k), "float32", site="red.mean")
    b.tensor_reduce(mean, tv, "add", axes=(2,))
    b.tensor_scalar(mean, mean, "multiply", 1.0 / n)
    dev = b.sbuf((p, k * cw), "float32", site="red.dev")
    devv = _sb(dev, shape3)
    mb = View(mean.buffer, AP(mean.ap.buffer, mean.ap.dtype, mean.ap.offset, ((k, p), (1, k), (0, cw))), shape3)
    b.tensor_tensor(devv, tv, mb, "subtract")
    b.activation(dev, dev, "square")
    b.tensor_reduce(acc, devv, "add", axes=(2,))
    if isinstance(correction, RuntimeScalar):
        # divide by (n - correction), computed on the engine from the runtime scalar
        denom = b.sbuf((p, 1), "float32", site="red.denom")
        b.memset(denom, float(n))
        b.tensor_scalar(denom, denom, "subtract", correction)
        b.tensor_scalar(acc, acc, "divide", denom)
    else:
        b.tensor_scalar(acc, acc, "multiply", 1.0 / (n - correction) if n - correction > 0 else float("nan"))
    if post == "std":
        b.activation(acc, acc, "sqrt")


def _column(b, spec, x, out, xin, yout, kshape, kin, kout, n_rows, row_stride, post):
    """Sum over rows on TensorE: PSUM[1, N] += ones[K, 1].T @ x[K, N] per row tile."""
    ones = b.sbuf((spec.partitions, 1), x.device_dtype if x.device_dtype in ("float32", "bfloat16", "float16") else "float32",
                  site="red.ones", bufs=1)
    b.memset(ones, 1.0)
    cols, cs_in, cs_out = kshape[-1], kin[-1], kout[-1]
    scale = 1.0 / n_rows if post == "mean" else 1.0
    for outer in product(*(range(n) for n in kshape[:-1])):
        base_in = sum(i * s for i, s in zip(outer, kin[:-1]))
        base_out = sum(i * s for i, s in zip(outer, kout[:-1]))
        for c0 in range(0, cols, _COLS):
            cw = min(_COLS, cols - c0)
            acc = b.psum((1, cw), "float32", site="red.psum")
            for r0 in range(0, n_rows, spec.partitions):
                rows = min(spec.partitions, n_rows - r0)
                t = b.sbuf((rows, cw), x.device_dtype, site="red.rows")
                src = AP(xin.ap.buffer, xin.ap.dtype, xin.ap.offset + base_in + r0 * row_stride + c0 * cs_in,
                         ((row_stride, rows), (cs_in, cw)))
                b.dma_copy(t, View(xin.buffer, src, (rows, cw)))
                mv = t
                if x.device_dtype not in ("float32", "bfloat16", "float16"):
                    mv = b.sbuf((rows, cw), "float32", site="red.cast")
                    b.tensor_copy(mv, t)
                b.matmul(acc, ones[:rows, :], mv, accumulate=r0 > 0)
            res = b.sbuf((1, cw), out.device_dtype, site="red.res")
            b.activation(res, acc, "copy", scale=scale)
            dst = AP(yout.ap.buffer, yout.ap.dtype, yout.ap.offset + base_out + c0 * cs_out, ((cw * cs_out, 1), (cs_out, cw)))
            b.dma_copy(View(yout.buffer, dst, (1, cw)), res)


def _slices_cheaper(spec, n_rows: int, kept: int) -> bool:
    """Whether summing ``n_rows`` slices of ``kept`` elements is cheaper as VectorE adds of whole
    slices spread over every partition than as TensorE ``ones.T @ x`` over row tiles: few rows
    (a batch of two, a positional embedding's gradient) leave the PE array's rows idle while it
    still pays one pass per 512 columns. Compared with the cost table's own figures."""
    from ..isa import Matmul, TensorTensor, engine_ns

    P = spec.partitions
    free = min(_FREE, -(-kept // P))
    tile = AP("t", "float32", 0, ((free, P), (1, free)))
    add_ns = engine_ns(TensorTensor(tile, tile, tile, "add"), spec) * -(-kept // (P * free))
    rows = min(n_rows, P)
    cols = min(_COLS, kept)
    mm = Matmul(AP("p", "float32", 0, ((cols, 1), (1, cols))), AP("o", "float32", 0, ((1, rows), (1, 1))),
                AP("x", "float32", 0, ((cols, rows), (1, cols))))
    mm_ns = engine_ns(mm, spec) * -(-n_rows // P) * -(-kept // cols)
    return (n_rows - 1) * add_ns < mm_ns


def _slices(b, spec, x, out, xin, yout, kshape, kin, kout, n_rows, row_stride, post):
    """Sum over rows as slices: each tile of the kept elements ([P, k, cols], over every
    partition) is loaded for ``g`` rows at a time (one transfer, within the free budget) and
    each row added on VectorE into a float32 accumulator."""
    plan = TilePlan(kshape, max_free=_FREE, partitions=spec.partitions)
    scale = 1.0 / n_rows if post == "mean" else 1.0
    for tile in plan.tiles:
        p, k, cols = tile.partitions, tile.rows_per_partition, tile.cols
        shape = (p, k, cols)
        acc = b.sbuf(shape, "float32", site="red.sl.acc")
        rows_src = plan.operand_ap(xin, tuple(kin), tile).ap
        g = max(1, min(n_rows, _FREE // (k * cols)))
        for r0 in range(0, n_rows, g):
            gn = min(g, n_rows - r0)
            t = b.sbuf((p, gn, k, cols), x.device_dtype, site="red.sl.in")
            src = AP(rows_src.buffer, rows_src.dtype, rows_src.offset + r0 * row_stride,
                     (rows_src.dims[0], (row_stride, gn)) + rows_src.dims[1:])
            b.dma_copy(t, View(xin.buffer, src, (p, gn, k, cols)))
            for j in range(gn):
                row = View(t.buffer, AP(t.ap.buffer, t.ap.dtype, t.ap.offset + j * k * cols,
                                        ((gn * k * cols, p), (cols, k), (1, cols))), shape)
                if r0 + j == 0:
                    b.tensor_copy(acc, row)
                else:
                    b.tensor_tensor(acc, acc, row, "add")
        res = b.sbuf(shape, out.device_dtype, site="red.sl.out")
        b.activation(res, acc, "copy", scale=scale)
        b.dma_copy(plan.operand_ap(yout, tuple(kout), tile), res)


def lower_softmax_any_dim(call: Call, spec):
    """``_softmax`` / ``_log_softmax`` over any dim: the row form with the softmax dim as the free
    axis -- max, ``exp(x - max)`` with its sum, then divide (or subtract the log-sum)."""
    named = call.named()
    x, out = named.get("self"), call.outputs[0] if len(call.outputs) == 1 else None
    if not isinstance(x, TensorMeta) or out is None or x.numel == 0 or x.is_complex or named.get("half_to_float"):
        return None
    if x.ndim == 0:
        x, out, dim = TensorMeta((1,), (1,), x.dtype), TensorMeta((1,), (1,), out.dtype), 0
    else:
        dim = named.get("dim", -1) % x.ndim
    n = x.shape[dim]
    if n > _FREE:
        return None
    kept = [d for d in range(x.ndim) if d != dim]
    kshape, (kin, kout) = coalesce(tuple(x.shape[d] for d in kept) or (1,),
                                   [tuple(x.stride[d] for d in kept) or (0,), tuple(out.stride[d] for d in kept) or (0,)])
    log = call.packet == "_log_softmax"
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xin, yout = hbm_input(b, "in_self", x), hbm_output(b, "out", out)
        ks_in, ks_out = kin[-1], kout[-1]
        for in_off, out_off, p, k in _row_blocks(kshape, kin, kout, max(1, _FREE // n), spec.partitions):
            t = b.sbuf((p, k * n), x.device_dtype, site="sm.in")
            src = AP(xin.ap.buffer, xin.ap.dtype, xin.ap.offset + in_off,
                     ((k * ks_in, p), (ks_in, k), (x.stride[dim], n)))
            b.dma_copy(t, View(xin.buffer, src, (p, k, n)))
            stat = b.sbuf((p, k), "float32", site="sm.stat")
            b.tensor_reduce(stat, _sb(t, (p, k, n)), "max", axes=(2,))
            e = b.sbuf((p, k * n), "float32", site="sm.e")
            ev = _sb(e, (p, k, n))
            b.tensor_tensor(ev, _sb(t, (p, k, n)), _bcast(stat, (p, k, n)), "subtract")
            if log:
                ex = b.sbuf((p, k * n), "float32", site="sm.exp")
                b.activation(ex, e, "exp")
                b.tensor_reduce(stat, _sb(ex, (p, k, n)), "add", axes=(2,))
                b.activation(stat, stat, "log")
                o = b.sbuf((p, k * n), out.device_dtype, site="sm.out")
                b.tensor_tensor(_sb(o, (p, k, n)), ev, _bcast(stat, (p, k, n)), "subtract")
            else:
                b.activation(e, e, "exp")
                b.tensor_reduce(stat, ev, "add", axes=(2,))
                o = b.sbuf((p, k * n), out.device_dtype, site="sm.out")
                b.tensor_tensor(_sb(o, (p, k, n)), ev, _bcast(stat, (p, k, n)), "divide")
            dst = AP(yout.ap.buffer, yout.ap.dtype, yout.ap.offset + out_off,
                     ((k * ks_out, p), (ks_out, k), (out.stride[dim], n)))
            b.dma_copy(View(yout.buffer, dst, (p, k, n)), o)
    return b.build(meta={"lowering": "reduction"})


def _bcast(stat, shape3):
    """A [P, k] per-row statistic seen as [P, k, n] (stride 0 along the reduced axis)."""
    p, k, n = shape3
    ap = stat.ap
    return View(stat.buffer, AP(ap.buffer, ap.dtype, ap.offset, ((k, p), (1, k), (0, n))), shape3)


_NAMES = list(REDUCTIONS)
add_rules(_NAMES, Rule("reduction", lower_reduction, __doc__.splitlines()[0]))
add_rules(["_softmax", "_log_softmax"], Rule("reduction", lower_softmax_any_dim,
                                            "softmax over any dim in the row form"))
