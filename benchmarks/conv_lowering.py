"""ResNet-18's convolutions (224x224 input) as lowered Programs: modeled time against the roofline.

For each layer and pass (forward, grad_input, grad_weight), one process prints the
*modeled* time of its Program, its roofline bound computed from the preset alone
(the multiply-adds the layer needs -- taps that land in the zero padding need none -- at
TensorE's peak for the dtype, bytes -- each operand read or written once -- at the DMA/HBM
peak), their ratio, the modeled TFLOP/s (the usual count, padding taps included) and the %
of TensorE peak, and the form the lowering chose. Then the same for the layers around them (batch norm, max pool).

Run: .venv/bin/python benchmarks/conv_lowering.py [--batch 8] [--dtype float32] [--passes fwd,gi,gw]
"""

from __future__ import annotations

import argparse
import time

from tilescope.lower import Call, TensorMeta, contiguous_strides, lower
from tilescope.spec import preset

# ResNet-18 on 224x224: (name, in channels, out channels, input size, kernel, stride, padding, count in the net)
LAYERS = [
    ("conv1 7x7/2", 3, 64, 224, 7, 2, 3, 1),
    ("layer1 3x3 64", 64, 64, 56, 3, 1, 1, 4),
    ("layer2.0 3x3/2", 64, 128, 56, 3, 2, 1, 1),
    ("layer2 down 1x1/2", 64, 128, 56, 1, 2, 0, 1),
    ("layer2 3x3 128", 128, 128, 28, 3, 1, 1, 3),
    ("layer3.0 3x3/2", 128, 256, 28, 3, 2, 1, 1),
    ("layer3 down 1x1/2", 128, 256, 28, 1, 2, 0, 1),
    ("layer3 3x3 256", 256, 256, 14, 3, 1, 1, 3),
    ("layer4.0 3x3/2", 256, 512, 14, 3, 2, 1, 1),
    ("layer4 down 1x1/2", 256, 512, 14, 1, 2, 0, 1),
    ("layer4 3x3 512", 512, 512, 7, 3, 1, 1, 3),
]


def _t(shape, dtype):
    return TensorMeta(tuple(shape), contiguous_strides(shape), dtype)


def conv_call(n, cin, cout, hw, k, s, p, dtype, which):
    oh = (hw + 2 * p - k) // s + 1
    x, w, y = _t((n, cin, hw, hw), dtype), _t((cout, cin, k, k), dtype), _t((n, cout, oh, oh), dtype)
    args = ((s, s), (p, p), (1, 1), False, (0, 0), 1)
    if which == "fwd":
        call = Call("aten::convolution_overrideable", (x, w, None) + args, (), (y,))
        moved = x.numel + w.numel + y.numel
    else:
        mask = (which == "gi", which == "gw", False)
        out = x if which == "gi" else w
        call = Call("aten::convolution_backward_overrideable", (y, x, w) + args + (mask,), (), (out,))
        moved = y.numel + (w.numel if which == "gi" else x.numel) + out.numel
    flops = 2 * n * oh * oh * cout * cin * k * k  # the usual count (padding taps included)
    work = 2 * n * cout * cin * valid_taps(hw, oh, k, s, p) ** 2  # what the bound charges
    return call, flops, work, moved


def valid_taps(size: int, out: int, k: int, s: int, p: int, d: int = 1) -> int:
    """(output position, kernel tap) pairs along one axis whose input lies inside the image: the
    multiply-adds a convolution must do (taps that land in the zero padding need none)."""
    return sum(1 for o in range(out) for t in range(k) if 0 <= o * s + t * d - p < size)


def bound_ns(spec, flops: float, nbytes: float, dtype: str) -> float:
    """Roofline bound from the preset: FLOPs at TensorE's peak, bytes at the DMA/HBM peak."""
    return max(flops / spec.peak_flops(dtype) * 1e9, nbytes / spec.dma_bytes_per_ns)


def others(spec, n: int, dtype: str, isz: int) -> None:
    """Batch norm and max pooling at ResNet-18's shapes: memory-bound, so the bound is bytes."""
    print(f"\nbatch norm (training) and max pool\n{'op':34s} {'modeled us':>11s} {'bound us':>9s} {'ratio':>6s}  rule")
    rows = []
    for c, hw in ((64, 112), (64, 56), (128, 28), (256, 14), (512, 7)):
        x, v = _t((n, c, hw, hw), dtype), _t((c,), "float32")
        rows.append((f"batch_norm {c}x{hw}x{hw}", Call("aten::native_batch_norm", (x, v, v, v, v, True, 0.1, 1e-5), (),
                                                       (x, v, v)), 2 * x.numel * isz))
        rows.append((f"batch_norm_backward {c}x{hw}x{hw}",
                     Call("aten::native_batch_norm_backward", (x, x, v, v, v, v, v, True, 1e-5, (True, True, True)),
                          (), (x, v, v)), 3 * x.numel * isz))
    x, y, i = _t((n, 64, 112, 112), dtype), _t((n, 64, 56, 56), dtype), _t((n, 64, 56, 56), "int64")
    moved = x.numel * isz + y.numel * isz + i.numel * 8
    rows.append(("max_pool 3x3/2 64x112x112", Call("aten::max_pool2d_with_indices", (x, (3, 3), (2, 2), (1, 1)), (),
                                                    (y, i)), moved))
    rows.append(("max_pool backward", Call("aten::max_pool2d_with_indices_backward",
                                           (y, x, (3, 3), (2, 2), (1, 1), (1, 1), False, i), (), (x,)), moved))
    for name, call, nbytes in rows:
        low = lower(call, spec)
        bound = nbytes / spec.dma_bytes_per_ns
        print(f"{name:34s} {low.modeled_ns / 1e3:11.1f} {bound / 1e3:9.1f} {low.modeled_ns / bound:6.2f}  {low.rule}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--passes", default="fwd,gi,gw")
    ap.add_argument("--preset", default="trn1")
    args = ap.parse_args()
    spec = preset(args.preset)
    isz = 2 if args.dtype == "bfloat16" else 4
    peak = spec.peak_flops(args.dtype)
    print(f"ResNet-18 convolutions, batch {args.batch}, {args.dtype}, preset {spec.name} "
          f"(TensorE peak {peak / 1e12:.1f} TFLOP/s, DMA {spec.dma_bytes_per_ns:.0f} GB/s); all times modeled")
    header = (f"{'layer':20s} {'pass':4s} {'modeled us':>11s} {'bound us':>9s} {'ratio':>6s} {'TFLOP/s':>8s} "
              f"{'% peak':>7s}  form")
    names = {"fwd": "forward", "gi": "grad_input", "gw": "grad_weight"}
    totals: dict[str, list[float]] = {}
    for which in args.passes.split(","):
        print(f"\n{names[which]}\n{header}")
        for name, cin, cout, hw, k, s, p, count in LAYERS:
            if which == "gi" and cin == 3:
                continue  # the network input needs no gradient
            call, flops, work, moved = conv_call(args.batch, cin, cout, hw, k, s, p, args.dtype, which)
            t0 = time.perf_counter()
            low = lower(call, spec)
            build_s = time.perf_counter() - t0
            bound = bound_ns(spec, work, moved * isz, args.dtype)
            tflops = flops / low.modeled_ns / 1e3
            form = low.program.meta.get("mapping") or low.program.meta.get("forms") or low.rule
            print(f"{name:20s} {which:4s} {low.modeled_ns / 1e3:11.1f} {bound / 1e3:9.1f} "
                  f"{low.modeled_ns / bound:6.2f} {tflops:8.2f} {100 * tflops * 1e12 / peak:6.1f}%  {form}"
                  f"  (build {build_s:.1f} s)")
            t = totals.setdefault(which, [0.0, 0.0, 0.0])
            t[0] += count * low.modeled_ns
            t[1] += count * bound
            t[2] += count * flops
    others(spec, args.batch, args.dtype, isz)
    print("\nwhole network convolutions (each layer times its count)")
    for which, (modeled, bound, flops) in totals.items():
        print(f"  {names[which]:12s} modeled {modeled / 1e3:9.1f} us  bound {bound / 1e3:9.1f} us  "
              f"ratio {modeled / bound:5.2f}  {flops / modeled / 1e3:6.2f} TFLOP/s "
              f"({100 * flops / modeled * 1e9 / peak:4.1f}% of peak)")


if __name__ == "__main__":
    main()
