"""Fusion choices of the compile backend, each beside its reference, in one process. All times
are *modeled* (trn1 preset).

* strided inputs: a row group reading a transposed input where it is (ViT's head merge, its qkv
  gradient) against the same group on a contiguous input (the reference: ratio 1.0 is free);
* a projection and its log-softmax: the two fused plans (online log-sum-exp per output block;
  the second pass reading the logits the first wrote once -- "keep" -- or making the product
  again -- "remake") against the plain one (matmul, then a two-pass row group over the
  product in HBM: the reference); the backend keeps the shortest.

    .venv/bin/python benchmarks/compile_fusion.py [--quick]
"""

from __future__ import annotations

import argparse
import sys

import torch

from tilescope.compile._emit import emit_segments
from tilescope.compile._graph import trace_aten
from tilescope.compile._plan import plan_graph
from tilescope.sim import simulate


def _modeled(fn, *args, reductions: bool = False, keep: bool = False):
    segs = [s for s in plan_graph(trace_aten(fn, *args), reductions=reductions) if s.kind in ("rowgroup", "matmul")]
    for seg in segs:
        seg.keep_product = keep
    prog, _ = emit_segments(segs, "bench", "trn1")
    s = simulate(prog).summary
    return s.total_ns / 1e3, (s.hbm_read_bytes + s.hbm_write_bytes) / 1e6, [x.kind for x in segs]


def strided(quick: bool) -> None:
    print("strided inputs read where they are (modeled us; ratio to the contiguous input)")
    for shape, perm, what in [((4, 3, 197, 64), (0, 2, 1, 3), "ViT head merge [b,h,n,hd]->[b,n,h,hd]"),
                              ((3, 4, 3, 197, 64), (1, 3, 0, 2, 4), "ViT qkv gradient [3,b,h,n,hd]->[b,n,3,h,hd]")]:
        x = torch.randn(shape)
        got, _, _ = _modeled(lambda t: t.permute(perm) * 2.0, x)  # noqa: B023
        ref, _, _ = _modeled(lambda t: t * 2.0, x.permute(perm).contiguous())
        print(f"  {what:45s} {got:8.1f} us vs contiguous {ref:8.1f} us: {got / ref:.2f}x")


def projection(quick: bool) -> None:
    print("projection + log_softmax (modeled us, HBM MB; ratio to plain; the backend keeps the shortest)")
    shapes = [(200, 96, 5000, False), (200, 96, 5000, True)]
    if not quick:
        shapes += [(1024, 768, 8192, False)]  # the zoo's large GPT-2 head
    for t, d, v, bias in shapes:
        g = torch.Generator().manual_seed(0)
        args = [torch.randn(t, d, generator=g), torch.randn(v, d, generator=g) * 0.05]
        if bias:
            args.append(torch.randn(v, generator=g))
        fn = lambda h, w, *b: torch.log_softmax(torch.nn.functional.linear(h, w, *b), -1)  # noqa: E731
        keep, kb, _ = _modeled(fn, *args, reductions=True, keep=True)
        remake, rb, _ = _modeled(fn, *args, reductions=True)
        plain, pb, _ = _modeled(fn, *args)
        kept = min((keep, "keep"), (remake, "remake"), (plain, "plain"))[1]
        print(f"  {t}x{d} @ {v}{' + bias' if bias else ''}: keep {keep:8.1f} us ({kb:6.1f} MB) {keep / plain:.2f}x, "
              f"remake {remake:8.1f} us ({rb:6.1f} MB) {remake / plain:.2f}x, plain {plain:8.1f} us ({pb:6.1f} MB)"
              f" -> {kept}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shapes only")
    args = p.parse_args()
    strided(args.quick)
    projection(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
