"""Indirect-DMA, cross-entropy, scan and top-k lowerings at model-sized shapes: modeled time
against the roofline bound of the work, and against the generic lowering they replace.

For each call the script prints the rule that lowered it, its *modeled* time on the preset,
the bound (the largest of: the bytes that must cross the DMA engines at their aggregate peak,
the bytes that must cross HBM at its peak, the elementwise work of the busiest engine at one
element per lane per cycle -- all from the preset's numbers), the ratio, which term bounds it,
and the modeled time of the generic lowering of the same call (what it cost before).

    .venv/bin/python benchmarks/index_lowering.py [--preset trn1] [--no-generic]

Shapes: GPT-2 (vocabulary 50257, width 768), Llama-3 (vocabulary 128256), 1024 tokens of
training or one token of a decode step. All figures are modeled.
"""

from __future__ import annotations

import argparse
import time

from tilescope.lower import Call, TensorMeta, contiguous_strides, lower
from tilescope.lower._generic import lower_generic
from tilescope.sim import simulate
from tilescope.spec import preset


def meta(shape, dtype="float32"):
    return TensorMeta(tuple(shape), contiguous_strides(shape), dtype)


def _isz(dtype):
    return {"float32": 4, "bfloat16": 2, "int64": 8}[dtype]


def cases():
    """(label, op, args, outputs, kwargs, work) -- ``work``: dma bytes, hbm bytes, (engine, elements)."""
    V, D, T = 50257, 768, 1024
    L = 128256
    out = []
    for n, label in ((1, "decode step"), (T, f"{T} tokens")):
        rows = n * D * 4
        out.append((f"GPT-2 embedding, {label}", "aten::index_select", (meta((V, D)), 0, meta((n,), "int64")),
                    (meta((n, D)),), (), dict(dma=rows + n * 8, hbm=2 * rows + n * 8)))
    rows = T * D * 4
    out.append(("GPT-2 embedding backward, 1024 tokens", "aten::embedding_dense_backward",
                (meta((T, D)), meta((T,), "int64"), V, -1, False), (meta((V, D)),), (),
                dict(dma=V * D * 4 + rows + T * 8)))
    out.append(("index_add_ of 1024 rows into 50257 x 768", "aten::index_add_",
                (meta((V, D)), 0, meta((T,), "int64"), meta((T, D))), (meta((V, D)),), (),
                dict(dma=3 * rows + T * 8, engine=("dve", T * D))))
    for vocab, dt in ((V, "float32"), (L, "bfloat16")):
        x = meta((T, vocab), dt)
        X = T * vocab * _isz(dt)
        out.append((f"log_softmax {T} x {vocab} {dt}", "aten::_log_softmax", (x, -1, False), (x,), (),
                    dict(dma=2 * X, engine=("act", 2 * T * vocab))))
        out.append((f"log_softmax backward {T} x {vocab} {dt}", "aten::_log_softmax_backward_data",
                    (x, x, -1, dt), (x,), (), dict(dma=3 * X, engine=("act", 2 * T * vocab))))
        out.append((f"nll_loss {T} x {vocab} (mean)", "aten::nll_loss_forward",
                    (x, meta((T,), "int64"), None, 1, -100), (meta(()), meta(())), (),
                    dict(dma=T * (8 + _isz(dt)))))
        out.append((f"nll_loss backward {T} x {vocab}", "aten::nll_loss_backward",
                    (meta(()), x, meta((T,), "int64"), None, 1, -100, meta(())), (x,), (), dict(dma=X + T * 8)))
    out.append((f"softmax of one row of {V} (decode)", "aten::_softmax", (meta((1, V)), -1, False),
                (meta((1, V)),), (), dict(dma=2 * V * 4)))
    for n, k in ((1, 50), (T, 50)):
        out.append((f"topk k={k} over {n} x {V}", "aten::topk", (meta((n, V)), k), (meta((n, k)), meta((n, k), "int64")),
                    (), dict(dma=n * V * 4, engine=("dve", 2 * -(-k // 8) * n * V))))
    out.append(("cumsum of an attention mask 8 x 2048 (int64)", "aten::cumsum", (meta((8, 2048), "int64"), -1),
                (meta((8, 2048), "int64"),), (), dict(dma=2 * 8 * 2048 * 8)))
    for shape, dim in (((4096, 4096), 1), ((4096, 4096), 0), ((64, V), 1)):
        out.append((f"cumsum {shape[0]} x {shape[1]} along dim {dim}", "aten::cumsum", (meta(shape), dim),
                    (meta(shape),), (), dict(dma=2 * shape[0] * shape[1] * 4)))
    for rows, n in ((128, 4096), (1, V)):
        m = 1 << (n - 1).bit_length()
        stages = (m.bit_length() - 1) * m.bit_length() // 2  # bitonic: every stage rewrites keys and ranks
        out.append((f"sort {rows} x {n}", "aten::sort", (meta((rows, n)), -1, False),
                    (meta((rows, n)), meta((rows, n), "int64")), (), dict(dma=rows * n * 16,
                                                                          engine=("dve", rows * stages * 2 * m * 2))))
    return out


def bound_ns(spec, work) -> tuple[float, str]:
    dma_peak = spec.dma.engines * spec.dma.bytes_per_ns_per_engine
    terms = {"DMA": work["dma"] / dma_peak, "HBM": work.get("hbm", work["dma"]) / spec.hbm_bytes_per_ns}
    if "engine" in work:
        eng, elems = work["engine"]
        e = spec.engines[eng]
        terms[e.display if hasattr(e, "display") else eng] = elems / (spec.partitions * e.clock_ghz)
    kind = max(terms, key=terms.get)
    return terms[kind], kind


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="trn1")
    ap.add_argument("--no-generic", action="store_true", help="skip the generic lowering's time (faster)")
    args = ap.parse_args()
    spec = preset(args.preset)
    print(f"preset {spec.name}; all times modeled (us)")
    head = f"{'call':48s} {'rule':12s} {'modeled':>10s} {'bound':>9s} {'ratio':>6s} {'bound by':>8s}"
    print(head + ("" if args.no_generic else f" {'generic':>10s} {'speed-up':>8s}"))
    t0 = time.perf_counter()
    for label, op, a, outs, kw, work in cases():
        call = Call(op, a, kw, outs)
        low = lower(call, spec)
        b, kind = bound_ns(spec, work)
        line = f"{label:48s} {low.rule:12s} {low.modeled_ns / 1e3:10.1f} {b / 1e3:9.1f} {low.modeled_ns / b:6.2f} {kind:>8s}"
        if not args.no_generic:
            prog, _ = lower_generic(call, spec)
            g = simulate(prog, spec).summary.total_ns
            line += f" {g / 1e3:10.1f} {g / low.modeled_ns:8.1f}x"
        print(line, flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
