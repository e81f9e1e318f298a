"""Elementwise ops and copies over permuted views: modeled time against the byte bound, and
against the strided read they replaced.

An operand whose contiguous dim is not the output's is read as contiguous runs into SBUF and
transposed on TensorE into PSUM (``tilescope/lower/_transposed.py``) when the cost table says that
is faster than reading it element by element. For each case the script prints the modeled time
of the lowering, the byte bound (every byte read or written once over HBM, and once over the
DMA engines -- a copy's bytes once -- at their peaks, whichever is slower; the preset's numbers),
the ratio, and the modeled time of the same call with the transposed path switched off (the
strided read: one DMA descriptor per element).

    .venv/bin/python benchmarks/transposed_operands.py [--preset trn1] [--no-strided]

All figures are modeled.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from tilescope.lower import Call, lower, meta_of
from tilescope.spec import preset


def _view(storage, perm, dtype):
    return torch.empty(*storage, dtype=dtype).permute(*perm)


def cases(dtype):
    """(label, op, args, output)."""
    out = []
    for label, storage, perm in (
        ("[B,S,H,D] -> [B,H,S,D] (D stays innermost)", (8, 512, 12, 64), (0, 2, 1, 3)),
        ("last two dims, 16 x 1024 x 1024", (16, 1024, 1024), (0, 2, 1)),
        ("[B,S,H,D] -> [B,H,D,S] (k transposed)", (8, 512, 12, 64), (0, 2, 3, 1)),
        ("NHWC storage read as NCHW, 16x64x56x56", (16, 56, 56, 64), (0, 3, 1, 2)),
        ("NCHW storage read as NHWC, 16x64x56x56", (16, 64, 56, 56), (0, 2, 3, 1)),
        ("ViT tokens [B,N,C] -> [B,C,N], 32x197x768", (32, 197, 768), (0, 2, 1)),
    ):
        x = _view(storage, perm, dtype)
        o = torch.empty(*x.shape, dtype=dtype)  # contiguous
        out.append((f"contiguous() {label}", "tilescope::copy", (x,), o))
        out.append((f"add       {label}", "aten::add.Tensor", (x, o), o))
    # torch lays a unary op's result out as its input: the same permutation in and out
    x = _view((16, 56, 56, 64), (0, 3, 1, 2), dtype)
    out.append(("relu of a channels-last map (result channels-last)", "aten::relu", (x,),
                _view((16, 56, 56, 64), (0, 3, 1, 2), dtype)))
    return out


def bound_ns(spec, tensors, copy: bool) -> float:
    """Every byte read and written once over HBM at its peak, and once over the DMA engines at
    their aggregate peak: an elementwise op's operands each cross the DMA engines (into SBUF and
    out), a copy's bytes at least once (a DRAM-to-DRAM transfer moves them in one pass; a
    transposing copy goes on chip and back, twice -- held to the one-pass bound all the same)."""
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    moved = tensors[-1].numel() * tensors[-1].element_size() if copy else nbytes
    return max(moved / (spec.dma.engines * spec.dma.bytes_per_ns_per_engine), nbytes / spec.hbm_bytes_per_ns)


@contextlib.contextmanager
def _strided_read():
    """The lowerings with the transposed path off: what each call cost before it."""
    from tilescope.lower import _elementwise, _movement

    saved = _elementwise.transposed_plan, _movement.transposed_plan
    _elementwise.transposed_plan = _movement.transposed_plan = lambda *a: None
    try:
        yield
    finally:
        _elementwise.transposed_plan, _movement.transposed_plan = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="trn1")
    ap.add_argument("--no-strided", action="store_true", help="skip the strided read's time (faster)")
    args = ap.parse_args()
    spec = preset(args.preset)
    from tilescope.lower import _build

    print(f"preset {spec.name}; all times modeled (us)")
    head = f"{'call':58s} {'dtype':9s} {'modeled':>9s} {'bound':>8s} {'ratio':>6s}"
    print(head + ("" if args.no_strided else f" {'strided':>9s} {'ratio':>6s}"))
    t0 = time.perf_counter()
    for dtype in (torch.float32, torch.bfloat16):
        for label, op, a, o in cases(dtype):
            call = Call(op, tuple(meta_of(t) for t in a), (), (meta_of(o),))
            low = lower(call, spec)
            b = bound_ns(spec, list(a) + [o], copy=op == "tilescope::copy")
            line = (f"{label:58s} {str(dtype)[6:]:9s} {low.modeled_ns / 1e3:9.1f} {b / 1e3:8.1f} "
                    f"{low.modeled_ns / b:6.2f}")
            if not args.no_strided:
                with _strided_read():
                    old = _build(call, spec)
                line += f" {old.modeled_ns / 1e3:9.1f} {old.modeled_ns / b:6.2f}"
            print(line, flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
