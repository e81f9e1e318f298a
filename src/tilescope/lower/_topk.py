"""``topk`` on VectorE's top-8 instructions: ``max8`` finds a partition's 8 largest values,
``nc_match_replace8`` knocks them out (writing where they were), so each round of two passes
over the data yields 8 more (nki.isa.max8, nki.isa.nc_match_replace8).

Rows go on partitions; a row is split into ``f`` pieces on neighbouring partitions when rows are
few (a decode step's one row of 50257 logits uses all 128 lanes), and a piece longer than the
16384 elements ``max8`` reads is taken in segments. Each piece keeps its ``8 * ceil(k / 8)``
best candidates (values and row positions); the candidates of a row then merge in a tree --
a DMA gathers the candidates of ``G`` pieces onto one partition, the same rounds pick the
best, and GpSimd looks up the picked candidates' positions (a per-partition gather,
``nc_n_gather``) -- until one partition holds the row's top ``k``.

``largest=False`` negates the data on the way in (and the values on the way out).
"""

from __future__ import annotations

import numpy as np

from ..isa import AP, local_gather_cycles
from ..program import TileBuilder, View
from ..sim import register_gpsimd_impl
from ._call import Call, TensorMeta
from ._layout import hbm_input, hbm_output
from ._indirect import fits_or_declines
from ._rules import Rule, add_rules
from ._vocab import RowSplit, rows_form

__all__ = ["lower_topk", "gather_positions"]

_MAX8 = 16384  # elements max8 reads per partition at most (nki.isa.max8)
_SEG = 8192  # elements per partition of one segment (32 KiB of float32: two in flight fit SBUF)
_MERGE = 2048  # candidates one partition merges per level of the tree
_FLOATS = ("float32", "bfloat16", "float16")


def _local_gather(inputs, outputs, attrs) -> None:
    src, pos = inputs
    out = outputs[0]
    p = out.shape[0]
    s = src.reshape(p, -1)
    i = pos.reshape(p, -1).astype(np.int64)
    out[...] = np.take_along_axis(s, i, axis=1).reshape(out.shape)

register_gpsimd_impl("local_gather", _local_gather)


def _rounds(b: TileBuilder, data: View, p: int, rounds: int, site: str):
    """``rounds`` rounds of (max8, match_replace8) over ``data`` [p, n] (destroyed): the best
    ``8 * rounds`` values, descending, and their positions in ``data``."""
    vals = b.sbuf((p, 8 * rounds), "float32", site=f"{site}.v")
    pos = b.sbuf((p, 8 * rounds), "int32", site=f"{site}.i")
    for r in range(rounds):
        v8 = vals[:, 8 * r:8 * r + 8]
        b.max8(v8, data)
        b.match_replace8(data, data, v8, float("-inf"), dst_idx=pos[:, 8 * r:8 * r + 8])
    return vals, pos


def gather_positions(b: TileBuilder, src: View, pos: View, p: int, n: int, site: str, out: View | None = None) -> View:
    """``out[q, c] = src[q, pos[q, c]]`` on GpSimd (a gather within each partition, nc_n_gather)."""
    if out is None:
        out = b.sbuf((p, n), src.dtype, site=f"{site}.g")
    b.gpsimd_call("local_gather", "local_gather", [src, pos], [out], local_gather_cycles(src.shape[1], n),
                  (("what", site),))
    return out


def lower_topk(call: Call, spec):
    """``topk(self, k, dim=-1, largest, sorted)`` over the last dim -> (values, indices), sorted."""
    named = call.named()
    x = named.get("self")
    if not isinstance(x, TensorMeta) or len(call.outputs) != 2 or x.dtype not in _FLOATS:
        return None
    vout, iout = call.outputs
    k, dim = named.get("k"), named.get("dim", -1)
    if not isinstance(k, int) or k < 1 or vout.numel == 0:
        return None
    fx, fv, fi = rows_form(x, dim), rows_form(vout, dim), rows_form(iout, dim)
    if fx is None or fv is None or fi is None:
        return None
    R, V, xrs = fx
    rounds = -(-k // 8)
    K8 = 8 * rounds
    if V < max(8, K8) or K8 > _MERGE // 2:
        return None
    largest = bool(named.get("largest", True))
    P = spec.partitions
    f = RowSplit(R, V, 1, 1 << 30, P).f  # as many pieces as fill the lanes ...
    while f > 1 and (-(-V // f) < 2 * K8 or f * K8 > _MAX8 or V - (f - 1) * -(-V // f) < 1):
        f //= 2  # ... each with room for its candidates
    split = RowSplit(R, V, 1, 1 << 30, P, pieces=f)
    w = split.w
    segs = [(c0, min(_SEG, w - c0)) for c0 in range(0, w, _SEG)]
    if any(sw < 8 for _, sw in segs):
        return None
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        xv = hbm_input(b, "in_self", x)
        vo, io = hbm_output(b, "values", vout), hbm_output(b, "indices", iout)
        pad = b.sbuf((P, max(sw for _, sw in segs)), x.device_dtype, site="topk.pad", bufs=1) if split.wl < w else None
        if pad is not None:
            b.memset(pad, float("-inf") if largest else float("inf"))
        for r0, nr, p in split.tiles(R):
            # each partition's first position in its row: piece j = q // nr starts at j * w
            start = b.sbuf((p, 1), "float32", site="topk.start")
            b.iota(start, partition_step=1, steps=(0,))
            m = b.sbuf((p, 1), "float32", site="topk.mod")
            b.tensor_scalar(m, start, "mod", float(nr))
            b.tensor_tensor(start, start, m, "subtract")
            b.tensor_scalar(start, start, "divide", float(nr), "multiply", float(w))
            cv = b.sbuf((p, len(segs) * K8), "float32", site="topk.cv")
            ci = b.sbuf((p, len(segs) * K8), "float32", site="topk.ci")
            for s, (c0, sw) in enumerate(segs):
                t = b.sbuf((p, sw), x.device_dtype, site="topk.in", bufs=2)
                split.load(b, t, 0, xv, xrs, r0, nr, c0, sw, pad)
                d = t
                if not (largest and t.dtype == "float32"):
                    d = b.sbuf((p, sw), "float32", site="topk.data", bufs=2)
                    b.tensor_scalar(d, t, "multiply", 1.0 if largest else -1.0)
                vals, pos = _rounds(b, d, p, rounds, "topk.seg")
                b.tensor_copy(cv[:, s * K8:(s + 1) * K8], vals)
                b.tensor_scalar(ci[:, s * K8:(s + 1) * K8], pos, "add", float(c0), "add", start)
            if len(segs) > 1:  # the segments of a piece: one more set of rounds on its candidates
                vals, pos = _rounds(b, cv, p, rounds, "topk.segm")
                ci = gather_positions(b, ci, pos, p, K8, "topk.segm")
                cv = vals
            pieces = f
            while pieces > 1:  # the tree: G pieces' candidates onto one partition, then rounds
                G = max(2, min(pieces, _MERGE // K8))
                G = 1 << (G.bit_length() - 1)
                nxt = pieces // G
                pn = nxt * nr
                mv = b.sbuf((pn, G * K8), "float32", site="topk.mv")
                mi = b.sbuf((pn, G * K8), "float32", site="topk.mi")
                for j in range(nxt):  # pieces j*G .. j*G+G-1 of every row -> partitions j*nr + r
                    for src, dst in ((cv, mv), (ci, mi)):
                        s_ap = AP(src.ap.buffer, "float32", src.ap.offset + j * G * nr * K8,
                                  ((K8, nr), (nr * K8, G), (1, K8)))
                        d_ap = AP(dst.ap.buffer, "float32", dst.ap.offset + j * nr * G * K8, ((G * K8, nr), (1, G * K8)))
                        b.dma_copy(View(dst.buffer, d_ap, (nr, G * K8)), View(src.buffer, s_ap, (nr, G, K8)))
                vals, pos = _rounds(b, mv, pn, rounds, "topk.tree")
                ci = gather_positions(b, mi, pos, pn, K8, "topk.tree")
                cv, pieces = vals, nxt
            res = b.sbuf((nr, k), vout.device_dtype, site="topk.vals")
            b.tensor_scalar(res, cv[:nr, 0:k], "multiply", 1.0 if largest else -1.0)
            idx = b.sbuf((nr, k), "int64", site="topk.idx")
            b.tensor_copy(idx, ci[:nr, 0:k])
            for out, view, rs, t in ((vout, vo, fv[2], res), (iout, io, fi[2], idx)):
                dst = AP(view.ap.buffer, view.ap.dtype, view.ap.offset + r0 * rs, ((rs, nr), (1, k)))
                b.dma_copy(View(view.buffer, dst, (nr, k)), t)
    return b.build(meta={"lowering": "topk8"})


add_rules(["topk"], Rule("topk8", fits_or_declines(lower_topk), "topk: VectorE max8 / match_replace8 rounds, merged in a tree"))
