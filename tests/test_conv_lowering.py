"""Convolution lowerings: each Program performs its op (its own numerics equal CPU torch), reads
the weights once, and its modeled time sits at or above the roofline bound computed from the
preset alone -- near it, with TensorE busy, at ResNet-sized shapes.

The bound: FLOPs at TensorE's peak for the dtype, bytes (every operand read or written once)
at the DMA/HBM peak. The ratios asserted at large shapes are what the lowerings reach (see
``benchmarks/conv_lowering.py`` for every ResNet-18 layer).
"""

import pytest
import torch

from test_lowering import check, rnd
from tilescope.lower import Call, TensorMeta, contiguous_strides, lower
from tilescope.spec import preset

F = torch.nn.functional
SPEC = preset("trn1")


def bound_ns(flops: float, nbytes: float, dtype: str) -> float:
    return max(flops / SPEC.peak_flops(dtype) * 1e9, nbytes / SPEC.dma_bytes_per_ns)


def valid_taps(size: int, out: int, k: int, s: int, p: int) -> int:
    """(output position, tap) pairs of one axis reading inside the image: the work the layer needs."""
    return sum(1 for o in range(out) for t in range(k) if 0 <= o * s + t - p < size)


def meta(*shape, dtype="float32"):
    return TensorMeta(shape, contiguous_strides(shape), dtype)


# (N, Cin, H, W, Cout, kernel, stride, padding, dilation, groups, bias, dtype)
FORWARD = [
    (2, 5, 13, 11, 7, 3, 2, 1, 1, 1, True, torch.float32),       # strided, odd sizes
    (2, 16, 10, 10, 8, 3, 1, 1, 1, 1, True, torch.float32),      # few output channels: pixels stationary
    (2, 64, 9, 9, 64, 3, 1, 1, 1, 1, False, torch.float32),      # kernel-row replicas (64 channels)
    (2, 40, 9, 9, 160, 3, 1, 1, 1, 1, True, torch.float32),      # two output-channel blocks
    (2, 3, 20, 20, 16, 7, 2, 3, 1, 1, False, torch.float32),     # a stem: kernel columns packed too
    (3, 8, 7, 7, 8, 3, 1, 1, 1, 8, True, torch.float32),         # depthwise
    (2, 8, 9, 9, 16, 3, 2, 1, 1, 8, False, torch.float32),       # depthwise, multiplier 2, strided
    (2, 6, 9, 8, 4, 3, 1, 1, 1, 2, True, torch.float32),         # two groups
    (2, 130, 5, 5, 20, 3, 1, 2, 2, 1, True, torch.float32),      # dilated, > 128 input channels
    (4, 20, 4, 4, 40, 3, 1, 1, 1, 1, False, torch.float32),      # several images per PSUM tile
    (1, 8, 3, 700, 16, 3, 1, 1, 1, 1, False, torch.float32),     # rows wider than a PSUM bank
    (2, 64, 9, 9, 128, 3, 2, 1, 1, 1, True, torch.bfloat16),
]


@pytest.mark.parametrize("case", FORWARD, ids=[str(c[:10]) for c in FORWARD])
def test_forward_values(case):
    N, Cin, H, W, Cout, k, s, p, d, groups, has_bias, dt = case
    x, w = rnd(N, Cin, H, W, dtype=dt), rnd(Cout, Cin // groups, k, k, dtype=dt)
    bias = rnd(Cout, dtype=dt) if has_bias else None
    ref = F.conv2d(x.float(), w.float(), None if bias is None else bias.float(), stride=s, padding=p, dilation=d,
                   groups=groups).to(dt)
    feeds = {"in_input": x, "in_weight": w} | ({"in_bias": bias} if has_bias else {})
    check("aten::convolution_overrideable", (x, w, bias, [s, s], [p, p], [d, d], False, [0, 0], groups), {},
          {"out": ref}, feeds, rule="conv", tol=1e-4 if dt == torch.float32 else 2e-2)


def test_conv1d_values():
    x, w = rnd(3, 4, 20), rnd(5, 4, 3)
    check("aten::convolution_overrideable", (x, w, None, [2], [2], [2], False, [0], 1), {},
          {"out": F.conv1d(x, w, None, stride=2, padding=2, dilation=2)}, {"in_input": x, "in_weight": w},
          rule="conv", tol=1e-4)
    dy = rnd(3, 5, 10)
    gi, gw, gb = torch.ops.aten.convolution_backward(dy, x, w, [5], [2], [2], [2], False, [0], 1, [True] * 3)
    check("aten::convolution_backward_overrideable", (dy, x, w, [2], [2], [2], False, [0], 1, [True] * 3), {},
          {"grad_input": gi, "grad_weight": gw, "grad_bias": gb},
          {"in_grad_output": dy, "in_input": x, "in_weight": w}, rule="conv_backward", tol=2e-4)


BACKWARD = [
    (2, 5, 13, 11, 7, 3, 2, 1, 1, 1, (True, True, True)),      # strided: grad_input scattered by tap
    (2, 16, 10, 10, 8, 3, 1, 1, 1, 1, (True, True, True)),     # stride 1: grad_input as a flipped forward
    (2, 64, 9, 9, 64, 3, 1, 1, 1, 1, (True, True, False)),
    (2, 3, 20, 20, 16, 7, 2, 3, 1, 1, (False, True, False)),   # a stem: only grad_weight
    (3, 8, 7, 7, 8, 3, 1, 1, 1, 8, (True, True, True)),        # depthwise
    (2, 8, 9, 9, 16, 3, 2, 1, 1, 8, (True, True, False)),
    (2, 130, 5, 5, 20, 3, 1, 2, 2, 1, (True, True, True)),
    (2, 12, 8, 8, 24, 1, 2, 0, 1, 1, (True, True, False)),     # 1x1 strided (a downsample)
    (3, 136, 6, 6, 130, 3, 2, 1, 1, 1, (True, False, False)),  # strided, two chunks and two units, images grouped
    (4, 64, 7, 7, 72, 3, 1, 1, 1, 1, (False, True, False)),    # small images: pixels transposed to partitions
    (130, 2, 5, 5, 3, 3, 1, 1, 1, 1, (True, True, True)),      # more images than partitions
    (2, 2, 24, 24, 8, 12, 12, 0, 1, 1, (False, True, True)),   # 144 taps (a ViT patch embedding): kernel-row bands
    (2, 2, 21, 21, 6, 12, 3, 0, 1, 1, (False, True, False)),   # 144 overlapping taps
]


@pytest.mark.parametrize("case", BACKWARD, ids=[str(c) for c in BACKWARD])
def test_backward_values(case):
    N, Cin, H, W, Cout, k, s, p, d, groups, mask = case
    x, w = rnd(N, Cin, H, W), rnd(Cout, Cin // groups, k, k)
    dy = rnd(*F.conv2d(x, w, None, stride=s, padding=p, dilation=d, groups=groups).shape)
    gi, gw, gb = torch.ops.aten.convolution_backward(dy, x, w, [Cout], [s, s], [p, p], [d, d], False, [0, 0],
                                                     groups, list(mask))
    outs = {name: t for name, t, on in zip(("grad_input", "grad_weight", "grad_bias"), (gi, gw, gb), mask) if on}
    check("aten::convolution_backward_overrideable", (dy, x, w, [s, s], [p, p], [d, d], False, [0, 0], groups,
                                                      list(mask)), {},
          outs, {"in_grad_output": dy, "in_input": x, "in_weight": w}, rule="conv_backward", tol=5e-4)


def _conv(n, cin, cout, hw, k, s, p, dtype="float32", which="fwd"):
    oh = (hw + 2 * p - k) // s + 1
    x, w, y = meta(n, cin, hw, hw, dtype=dtype), meta(cout, cin, k, k, dtype=dtype), meta(n, cout, oh, oh, dtype=dtype)
    args = ((s, s), (p, p), (1, 1), False, (0, 0), 1)
    isz = 2 if dtype == "bfloat16" else 4
    # the bound charges the multiply-adds the layer needs: taps in the zero padding need none
    flops = 2 * n * cout * cin * valid_taps(hw, oh, k, s, p) ** 2
    if which == "fwd":
        call = Call("aten::convolution_overrideable", (x, w, None) + args, (), (y,))
        nbytes = (x.numel + w.numel + y.numel) * isz
    else:
        out = x if which == "gi" else w
        call = Call("aten::convolution_backward_overrideable", (y, x, w) + args + ((which == "gi", which == "gw", False),),
                    (), (out,))
        nbytes = (y.numel + (w.numel if which == "gi" else x.numel) + out.numel) * isz
    return call, flops, nbytes


# ResNet-18 layers at batch 8 (224x224 input): (cin, cout, size, kernel, stride, pad, pass, max ratio to the
# bound, min % of TensorE peak as usually counted)
RESNET = [
    (64, 64, 56, 3, 1, 1, "fwd", 2.4, 40),
    (64, 128, 56, 3, 2, 1, "fwd", 2.0, 50),
    (128, 128, 28, 3, 1, 1, "fwd", 1.3, 80),
    (256, 512, 14, 3, 2, 1, "fwd", 2.0, 55),
    (512, 512, 7, 3, 1, 1, "fwd", 1.8, 65),
    (128, 128, 28, 3, 1, 1, "gi", 1.3, 80),
    (512, 512, 7, 3, 1, 1, "gi", 2.5, 50),
    (128, 256, 28, 3, 2, 1, "gi", 2.5, 40),
    (256, 512, 14, 3, 2, 1, "gi", 2.5, 40),
    (256, 512, 14, 1, 2, 0, "gi", 2.5, 15),  # the downsample: dy read once for both units, images grouped
    (128, 128, 28, 3, 1, 1, "gw", 2.5, 40),
    (512, 512, 7, 3, 1, 1, "gw", 3.0, 40),
]


@pytest.mark.parametrize("case", RESNET, ids=[f"{c[6]}-{c[0]}to{c[1]}@{c[2]}s{c[4]}" for c in RESNET])
def test_resnet_layers_time_vs_bound(case):
    cin, cout, hw, k, s, p, which, max_ratio, min_peak = case
    call, flops, nbytes = _conv(8, cin, cout, hw, k, s, p, which=which)
    low = lower(call, SPEC)
    bound = bound_ns(flops, nbytes, "float32")
    assert low.modeled_ns >= bound, (low.modeled_ns, bound)
    assert low.modeled_ns <= max_ratio * bound, (low.modeled_ns / bound, low.program.meta)
    oh = (hw + 2 * p - k) // s + 1
    usual = 2 * 8 * oh * oh * cout * cin * k * k  # TFLOP/s as usually counted (padding taps included)
    pct = 100 * usual / (low.modeled_ns * 1e-9) / SPEC.peak_flops("float32")
    assert pct >= min_peak, (pct, low.program.meta)


def test_bfloat16_runs_at_the_bfloat16_rate_and_never_under_the_bound():
    call, flops, nbytes = _conv(8, 128, 128, 28, 3, 1, 1, dtype="bfloat16")
    low = lower(call, SPEC)
    bound = bound_ns(flops, nbytes, "bfloat16")
    fp32 = lower(_conv(8, 128, 128, 28, 3, 1, 1)[0], SPEC)
    assert bound <= low.modeled_ns <= 1.5 * bound
    assert low.modeled_ns < fp32.modeled_ns / 3  # TensorE's bf16 rate is 4x fp32's


def test_the_stem_stays_above_its_bound():
    # 3 input channels: the contraction is packed from replicated input rows, whose loads use
    # the few DMA engines of the few partitions they fill -- far from the bound (a known gap)
    call, flops, nbytes = _conv(8, 3, 64, 224, 7, 2, 3)
    low = lower(call, SPEC)
    bound = bound_ns(flops, nbytes, "float32")
    assert bound <= low.modeled_ns <= 8 * bound


def test_weights_are_read_once_in_large_runs():
    call, _, _ = _conv(8, 256, 256, 14, 3, 1, 1)
    prog = lower(call, SPEC).program
    reads = [i for i in prog.instructions if i.KIND == "dma_copy" and i.src.buffer == "in_weight"]
    assert sum(i.src.nbytes for i in reads) == 256 * 256 * 9 * 4  # every weight once
    assert len(reads) <= 4 and min(i.src.contiguous_bytes() for i in reads) >= 128 * 9 * 4


@pytest.mark.parametrize("case", [(2, 6, 5, 7, 4, 3, 2, 1, 1, 1, 1, True), (2, 8, 6, 6, 16, 2, 2, 0, 0, 1, 1, True),
                                  (1, 4, 5, 5, 6, 3, 1, 1, 0, 1, 2, False), (2, 3, 10, 8, 5, 3, 1, 0, 0, 2, 1, True)],
                         ids=str)
def test_transposed_convolution_forward_and_backward(case):
    # a transposed convolution is the grad_input of the convolution sharing its weight
    N, Cin, H, W, Cout, k, s, p, op, d, g, has_bias = case
    x, w = rnd(N, Cin, H, W), rnd(Cin, Cout // g, k, k)
    bias = rnd(Cout) if has_bias else None
    y = F.conv_transpose2d(x, w, bias, stride=s, padding=p, output_padding=op, groups=g, dilation=d)
    args = (x, w, bias, [s, s], [p, p], [d, d], True, [op, op], g)
    check("aten::convolution_overrideable", args, {}, {"out": y},
          {"in_input": x, "in_weight": w} | ({"in_bias": bias} if has_bias else {}), rule="conv", tol=1e-4)
    dy = rnd(*y.shape)
    mask = [True, True, has_bias]
    gi, gw, gb = torch.ops.aten.convolution_backward(dy, x, w, [Cout], [s, s], [p, p], [d, d], True, [op, op], g, mask)
    check("aten::convolution_backward_overrideable", (dy, x, w, [s, s], [p, p], [d, d], True, [op, op], g, mask), {},
          {"grad_input": gi, "grad_weight": gw} | ({"grad_bias": gb} if has_bias else {}),
          {"in_grad_output": dy, "in_input": x, "in_weight": w}, rule="conv_backward", tol=5e-4)


def test_outside_the_forms_the_generic_lowering_takes_over_labelled():
    x3, w3 = meta(1, 2, 4, 4, 4), meta(3, 2, 3, 3, 3)  # 3-D
    call = Call("aten::convolution_overrideable", (x3, w3, None, (1, 1, 1), (1, 1, 1), (1, 1, 1), False, (0, 0, 0), 1),
                (), (meta(1, 3, 4, 4, 4),))
    assert lower(call).rule == "generic"


def test_a_cnn_on_the_device_runs_every_conv_and_norm_op_on_its_rule():
    import tilescope.device as dev

    dev.register()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), torch.nn.GroupNorm(2, 8),
        torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(32, 4))
    x = torch.randn(2, 3, 16, 16)
    ref = model(x)
    ref.sum().backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    sim = model.to("sim")
    with dev.recording() as recs:
        out = sim(x.to("sim"))
        out.sum().backward()
    torch.sim.synchronize()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)
    for p, g in zip(sim.parameters(), ref_grads):
        torch.testing.assert_close(p.grad.cpu(), g, rtol=1e-4, atol=1e-4)
    rules = {r.op: r.lowering for r in recs}
    for op, rule in (("aten::convolution_overrideable", "conv"),
                     ("aten::convolution_backward_overrideable", "conv_backward"),
                     ("aten::native_batch_norm", "batch_norm"),
                     ("aten::native_batch_norm_backward", "batch_norm_backward"),
                     ("aten::max_pool2d_with_indices", "pool"),
                     ("aten::max_pool2d_with_indices_backward", "pool_backward"),
                     ("aten::native_group_norm", "group_norm"),
                     ("aten::native_group_norm_backward", "group_norm_backward"),
                     ("aten::_adaptive_avg_pool2d", "pool"),
                     ("aten::_adaptive_avg_pool2d_backward", "pool_backward")):
        assert rules.get(op) == rule, (op, rules.get(op))


def test_few_contraction_rows_put_each_image_in_its_own_partition_quarter(monkeypatch):
    # with <= 32 contraction rows, each image's tile (and a copy of the weights) sits in its own
    # partition quarter so that its loads use that quarter's DMA engines; values are unchanged
    import tilescope.lower._conv as conv

    original = conv._Forward._candidates

    def kernel_rows_only(self, mapping):
        if mapping == "A":
            yield from original(self, mapping)
        else:
            yield lambda cs: (self.g.kh, 1, self.g.sh > 1)
    monkeypatch.setattr(conv._Forward, "_candidates", kernel_rows_only)
    monkeypatch.setattr(conv._Forward, "_estimate", lambda self, mapping, units: 0.0 if mapping == "B" else 1.0)
    x, w, bias = rnd(6, 4, 10, 10), rnd(8, 4, 3, 3), rnd(8)
    low = check("aten::convolution_overrideable", (x, w, bias, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {},
                {"out": F.conv2d(x, w, bias, padding=1)}, {"in_input": x, "in_weight": w, "in_bias": bias},
                rule="conv", tol=1e-4)
    prog = low.program
    starts = {i.moving.offset // prog.buffers[i.moving.buffer].row_elems for i in prog.instructions
              if i.KIND == "matmul"}
    assert low.program.meta["mapping"] == "pixels-stationary" and starts == {0, 32, 64, 96}


def test_up_to_64_contraction_rows_alternate_images_between_partition_halves():
    # a stem-like conv (3 channels x 7 kernel rows x column replicas: 33..64 rows) puts every
    # other image's tile in the upper half, so its loads use the other 8 DMA engines
    x, w = rnd(3, 3, 40, 40), rnd(64, 3, 7, 7)
    low = check("aten::convolution_overrideable", (x, w, None, [2, 2], [3, 3], [1, 1], False, [0, 0], 1), {},
                {"out": F.conv2d(x, w, None, 2, 3)}, {"in_input": x, "in_weight": w}, rule="conv", tol=1e-4)
    prog = low.program
    starts = {i.moving.offset // prog.buffers[i.moving.buffer].row_elems for i in prog.instructions
              if i.KIND == "matmul"}
    assert low.program.meta["mapping"] == "pixels-stationary" and starts == {0, 64}


def test_weights_stationary_blocks_alternate_partition_halves_up_to_64_rows():
    # a 1x1 stride-2 downsample: consecutive blocks' inputs sit in alternate partition halves
    x, w = rnd(4, 16, 40, 40), rnd(32, 16, 1, 1)
    low = check("aten::convolution_overrideable", (x, w, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1), {},
                {"out": F.conv2d(x, w, None, 2)}, {"in_input": x, "in_weight": w}, rule="conv", tol=1e-4)
    prog = low.program
    starts = {i.moving.offset // prog.buffers[i.moving.buffer].row_elems for i in prog.instructions
              if i.KIND == "matmul"}
    assert low.program.meta["mapping"] == "weights-stationary" and starts == {0, 64}


def test_patch_embedding_grad_weight_against_the_bound():
    # ViT-tiny's 16x16 patches (256 taps, more than the partitions): the patch matmul (one patch per
    # partition) beats the kernel-row bands (each reads dy in short runs); DMA-bound either way
    from tilescope.lower import _conv as conv
    from tilescope.sim import simulate

    call, flops, nbytes = _conv(4, 3, 192, 224, 16, 16, 0, which="gw")
    low = lower(call, SPEC)
    bound = bound_ns(flops, nbytes, "float32")
    bands = conv._backward_program(call, SPEC, "blocks")
    assert "bands" in bands.meta["forms"] and bound <= simulate(bands).summary.total_ns <= 8 * bound
    assert low.rule == "conv_backward" and "patch-matmul" in low.program.meta["forms"]
    assert bound <= low.modeled_ns <= simulate(bands).summary.total_ns, (low.modeled_ns, bound)
    # the same dy with its channels innermost (as a ViT's tokens leave it): the patch matmul reads
    # it as [patches, co] rows (the banded form would read an element per descriptor)
    y = call.args[0]
    cl = TensorMeta(y.shape, (y.shape[1] * y.shape[2] * y.shape[3], 1, y.shape[3] * y.shape[1], y.shape[1]), y.dtype)
    low = lower(Call(call.op, (cl,) + call.args[1:], call.kwargs, call.outputs), SPEC)
    assert low.rule == "conv_backward" and "patch-matmul" in low.program.meta["forms"]
    assert bound <= low.modeled_ns <= 5 * bound, (low.modeled_ns, bound)


def _channels_last(t: torch.Tensor, token: bool = False) -> torch.Tensor:
    """``t`` in (n, h, w, c) memory, NCHW shape; ``token``: as a ViT's patch tokens after its class
    token, ``tokens[:, 1:]`` of (n, 1 + h*w, c) (images further apart than their pixels)."""
    n, c, h, w = t.shape
    if token:
        tokens = torch.cat([torch.zeros(n, 1, c, dtype=t.dtype), t.flatten(2).transpose(1, 2)], 1)
        return tokens[:, 1:].transpose(1, 2).unflatten(2, (h, w))
    return t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


# (N, Cin, H, W, Cout, kernel, bias, dy channels innermost, dtype): stride == kernel, no padding
PATCH = [
    (2, 3, 24, 20, 20, 4, True, False, torch.float32),     # rows of 5 patches, 2 images in a block
    (3, 2, 18, 12, 130, 3, False, True, torch.float32),    # > 128 output channels, channels-last dy
    (1, 3, 4, 520, 8, 2, True, False, torch.float32),      # a row of 260 patches: split over blocks
    (2, 5, 16, 16, 24, 8, False, True, torch.float32),     # K = 320: three chunks of the contraction
    (3, 3, 12, 12, 16, 3, False, "token", torch.float32),  # dy: a ViT's patch tokens after its class token
    (1, 20, 64, 8, 8, 2, True, False, torch.float32),      # 20 channels x 32 rows: an image over several tiles
    (2, 3, 16, 16, 16, 4, True, True, torch.bfloat16),
]


@pytest.mark.parametrize("case", PATCH, ids=[str(c[:8]) for c in PATCH])
def test_patch_matmul_form_values(case):
    # stride == kernel: the convolution is a matmul over the patches; the form is built directly
    # (the rule keeps it only where the simulator times it shorter than the sliding forms)
    from test_lowering import as_torch, buffer_of
    from tilescope.lower import _conv as conv
    from tilescope.lower import meta_of
    from tilescope.sim import run_numerics

    N, Cin, H, W, Cout, k, has_bias, cl, dt = case
    x, w = rnd(N, Cin, H, W, dtype=dt), rnd(Cout, Cin, k, k, dtype=dt)
    bias = rnd(Cout, dtype=dt) if has_bias else None
    y = F.conv2d(x.float(), w.float(), None if bias is None else bias.float(), stride=k).to(dt)
    tol = 1e-4 if dt == torch.float32 else 3e-2
    args = ([k, k], [0, 0], [1, 1], False, [0, 0], 1)
    fwd = Call("aten::convolution_overrideable", (meta_of(x), meta_of(w), None if bias is None else meta_of(bias))
               + args, (), (meta_of(y),))
    g, x2, w2 = conv.conv_geometry(meta_of(x), meta_of(w), [k, k], [0, 0], [1, 1], 1)
    feeds = {"in_input": x, "in_weight": w} | ({"in_bias": bias} if has_bias else {})
    for form, mapping in (("patch", "patch-matmul"), ("patch-rows", "patch-matmul:rows")):
        prog = conv._forward_program(fwd, SPEC, form, g, meta_of(x), x2, meta_of(w), w2, meta_of(y), meta_of(y),
                                     None if bias is None else meta_of(bias), str(dt).replace("torch.", ""))
        assert prog.meta["mapping"] == mapping
        got = run_numerics(prog, {n: buffer_of(v) for n, v in feeds.items()}, {})
        torch.testing.assert_close(as_torch(got["out"], y).float(), y.float(), rtol=tol, atol=tol, msg=form)

    dy = rnd(*y.shape, dtype=dt)
    dy = _channels_last(dy, cl == "token") if cl else dy
    _, gw, gb = torch.ops.aten.convolution_backward(dy.float(), x.float(), w.float(), [Cout], [k, k], [0, 0],
                                                    [1, 1], False, [0, 0], 1, [False, True, True])
    bwd = Call("aten::convolution_backward_overrideable", (meta_of(dy), meta_of(x), meta_of(w)) + args
               + ((False, True, True),), (), (meta_of(w), meta_of(gb.to(dt))))
    prog = conv._backward_program(bwd, SPEC, "patch")
    assert "grad_weight=patch-matmul" in prog.meta["forms"]
    got = run_numerics(prog, {"in_grad_output": buffer_of(dy), "in_input": buffer_of(x), "in_weight": buffer_of(w)},
                       {})
    torch.testing.assert_close(as_torch(got["grad_weight"], w).float(), gw, rtol=tol * 5, atol=tol * 5)
    # grad_bias: a channels-last dy is summed over its pixel rows on TensorE
    torch.testing.assert_close(as_torch(got["grad_bias"], gb.to(dt)).float(), gb, rtol=tol * 5, atol=tol * 5)


@pytest.mark.parametrize("case", [(2, 130, 6, 6, 20, 3, 1, 1), (3, 16, 7, 7, 140, 3, 2, 1)], ids=str)
def test_pixels_transposed_grad_weight_values(case):
    # the form built directly (the rule keeps whichever form the simulator times shorter): 130
    # channels make a PSUM group holding runs of taps of two channel chunks
    from test_lowering import as_torch, buffer_of
    from tilescope.lower import _conv as conv
    from tilescope.lower import meta_of
    from tilescope.sim import run_numerics

    N, Cin, H, W, Cout, k, s, p = case
    x, w = rnd(N, Cin, H, W), rnd(Cout, Cin, k, k)
    dy = rnd(*F.conv2d(x, w, None, stride=s, padding=p).shape)
    _, gw, _ = torch.ops.aten.convolution_backward(dy, x, w, [Cout], [s, s], [p, p], [1, 1], False, [0, 0], 1,
                                                   [False, True, False])
    call = Call("aten::convolution_backward_overrideable", (meta_of(dy), meta_of(x), meta_of(w), [s, s], [p, p],
                                                            [1, 1], False, [0, 0], 1, (False, True, False)),
                (), (meta_of(w),))
    prog = conv._backward_program(call, SPEC, "transposed")
    assert "pixels-transposed" in prog.meta["forms"]
    got = run_numerics(prog, {"in_grad_output": buffer_of(dy), "in_input": buffer_of(x), "in_weight": buffer_of(w)},
                       {})
    torch.testing.assert_close(as_torch(got["grad_weight"], w), gw, rtol=5e-4, atol=5e-4)
