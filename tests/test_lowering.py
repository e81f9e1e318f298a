"""Lowerings are faithful: each Program really performs its op.

The device computes values with CPU torch, and a Program's modeled time is only
meaningful if the Program does the op's work. So for a sample of calls of every rule,
the Program's own numerics (``run_numerics``, numpy) must equal CPU torch.
"""

import ml_dtypes
import numpy as np
import pytest
import torch

from tilescope.lower import Call, OutputRef, ScalarArg, cache_info, lower, meta_of
from tilescope.sim import run_numerics

rng = torch.Generator().manual_seed(0)


def rnd(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=rng).to(dtype)


def buffer_of(t: torch.Tensor) -> np.ndarray:
    """The HBM buffer a lowering declares for ``t``: its shape when contiguous, else the flat extent."""
    t = t.detach()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    if t.is_contiguous():
        arr = t
    else:
        extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
        arr = torch.as_strided(t, (extent,), (1,), t.storage_offset())
    if arr.dtype == torch.bfloat16:
        return arr.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return arr.contiguous().numpy()


def as_torch(arr: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    if arr.dtype == ml_dtypes.bfloat16:
        arr = arr.astype(np.float32)
    t = torch.from_numpy(np.ascontiguousarray(arr))
    if like.is_contiguous():
        return t.reshape(like.shape)
    return torch.as_strided(t.reshape(-1), like.shape, like.stride())


def check(op, args, kwargs, outputs, feeds, scalars=None, rule=None, tol=1e-5):
    """Lower ``op(*args, **kwargs)`` (tensors as metadata), run the Program on ``feeds``
    (input name -> tensor), compare every output with ``outputs`` (name -> expected)."""
    def abstract(v):
        if isinstance(v, torch.Tensor):
            return meta_of(v)
        if isinstance(v, (list, tuple)):
            return tuple(abstract(x) for x in v)
        return v

    call = Call(op, tuple(abstract(a) for a in args), tuple(sorted((k, abstract(v)) for k, v in kwargs.items())),
                tuple(meta_of(t) for t in outputs.values()))
    low = lower(call)
    if rule is not None:
        assert low.rule == rule, (op, low.rule)
    got = run_numerics(low.program, {k: buffer_of(v) for k, v in feeds.items()}, scalars or {})
    for name, expected in outputs.items():
        actual = as_torch(got[name], expected)
        torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol, msg=f"{op}: {name}")
    return low


# ---- elementwise ------------------------------------------------------------------------------

def test_elementwise_with_broadcast_and_runtime_scalars():
    x, y = rnd(64, 300), rnd(300)
    check("aten::add.Tensor", (x, y), {"alpha": ScalarArg("s0", float)}, {"out": x + 2.5 * y},
          {"in_self": x, "in_other": y}, {"s0": 2.5}, rule="elementwise")
    check("aten::mul.Tensor", (x, ScalarArg("s0", float)), {}, {"out": x * -3.0}, {"in_self": x}, {"s0": -3.0})
    xt = rnd(300, 64).t()  # a transposed view: strided access, no copy
    check("aten::sub.Tensor", (xt, x), {}, {"out": xt - x}, {"in_self": xt, "in_other": x})


@pytest.mark.parametrize("op,fn", [
    ("aten::exp", torch.exp), ("aten::sigmoid", torch.sigmoid), ("aten::tanh", torch.tanh),
    ("aten::relu", torch.relu), ("aten::neg", torch.neg), ("aten::abs", torch.abs),
    ("aten::log1p", lambda t: torch.log1p(t.abs())), ("aten::erf", torch.erf),
])
def test_unary_activations(op, fn):
    x = rnd(130, 17)
    if op == "aten::log1p":
        x = x.abs()
    check(op, (x,), {}, {"out": fn(x)}, {"in_self": x}, rule="elementwise", tol=2e-5)


def test_division_rounding_modes():
    x, y = rnd(60, 40) * 5, rnd(40) + 0.1
    for mode in ("trunc", "floor"):
        check("aten::div.Tensor_mode", (x, y), {"rounding_mode": mode},
              {"out": torch.div(x, y, rounding_mode=mode)}, {"in_self": x, "in_other": y}, rule="elementwise",
              tol=1e-4)


def test_where_clamp_compare_and_backward_formulas():
    c, x, y = rnd(40, 50) > 0, rnd(40, 50), rnd(50)
    check("aten::where.self", (c, x, y), {}, {"out": torch.where(c, x, y)},
          {"in_condition": c, "in_self": x, "in_other": y})
    check("aten::clamp", (x, ScalarArg("s0", float), ScalarArg("s1", float)), {}, {"out": x.clamp(-0.5, 0.7)},
          {"in_self": x}, {"s0": -0.5, "s1": 0.7})
    check("aten::lt.Tensor", (x, y), {}, {"out": x < y}, {"in_self": x, "in_other": y})
    g, out = rnd(40, 50), torch.sigmoid(x)
    check("aten::sigmoid_backward", (g, out), {}, {"out": g * out * (1 - out)},
          {"in_grad_output": g, "in_output": out})
    check("aten::gelu_backward", (g, x), {}, {"out": torch.ops.aten.gelu_backward(g, x)},
          {"in_grad_output": g, "in_self": x}, tol=1e-4)


# ---- reductions ------------------------------------------------------------------------------

@pytest.mark.parametrize("op,args,fn", [
    ("aten::sum.dim_IntList", ([1],), lambda t: t.sum(1)),
    ("aten::sum.dim_IntList", ([0],), lambda t: t.sum(0)),  # across partitions: TensorE ones-matmul
    ("aten::mean.dim", ([0, 2],), lambda t: t.mean((0, 2))),
    ("aten::amax", ([-1],), lambda t: t.amax(-1)),
    ("aten::var.correction", ([1],), lambda t: t.var(1)),
    ("aten::prod.dim_int", (1,), lambda t: t.prod(1)),
])
def test_reductions(op, args, fn):
    if op == "aten::var.correction":
        args = args + (ScalarArg("s0", int),)
    x = rnd(6, 200, 9) if op == "aten::mean.dim" else rnd(300, 24) * 0.3 + (1 if "prod" in op else 0)
    scalars = {"s0": 1} if op == "aten::var.correction" else {}
    low = check(op, (x,) + args, {}, {"out": fn(x)}, {"in_self": x}, scalars, rule="reduction", tol=1e-4)
    if args == ([0],):
        assert low.program.summary_counts().get("matmul", 0) > 0


# ---- TensorE ---------------------------------------------------------------------------------

def test_matmul_forms():
    a, b = rnd(200, 150), rnd(330, 150)  # b used transposed, like a Linear weight
    low = check("aten::mm", (a, b.t()), {}, {"out": a @ b.t()}, {"in_a": a, "in_b": b.t()}, rule="matmul", tol=1e-4)
    assert low.program.summary_counts()["transpose"] > 0
    bias = rnd(330)
    check("aten::addmm", (bias, a, b.t()), {"alpha": ScalarArg("s1", float), "beta": ScalarArg("s0", float)},
          {"out": torch.addmm(bias, a, b.t(), beta=0.5, alpha=2.0)},
          {"in_a": a, "in_b": b.t(), "in_bias": bias}, {"s0": 0.5, "s1": 2.0}, tol=1e-4)
    x, y = rnd(3, 70, 40), rnd(3, 40, 90)
    check("aten::bmm", (x, y), {}, {"out": x @ y}, {"in_a": x, "in_b": y}, tol=1e-4)
    v = rnd(150)
    check("aten::mv", (a, v), {}, {"out": a @ v}, {"in_a": a, "in_b": v}, tol=1e-4)
    w = rnd(150)
    check("aten::dot", (v, w), {}, {"out": torch.dot(v, w)}, {"in_a": v, "in_b": w}, rule="matmul", tol=1e-4)


def test_convolutions_with_padding_stride_groups():
    x, w, bias = rnd(2, 5, 13, 11), rnd(7, 5, 3, 3), rnd(7)
    ref = torch.nn.functional.conv2d(x, w, bias, stride=2, padding=1)
    check("aten::convolution_overrideable", (x, w, bias, [2, 2], [1, 1], [1, 1], False, [0, 0], 1), {},
          {"out": ref}, {"in_input": x, "in_weight": w, "in_bias": bias}, rule="conv", tol=1e-4)
    xg, wg, bg = rnd(2, 6, 9, 8), rnd(4, 3, 3, 3), rnd(4)  # two groups
    check("aten::convolution_overrideable", (xg, wg, bg, [1, 1], [1, 1], [1, 1], False, [0, 0], 2), {},
          {"out": torch.nn.functional.conv2d(xg, wg, bg, padding=1, groups=2)},
          {"in_input": xg, "in_weight": wg, "in_bias": bg}, rule="conv", tol=1e-4)
    x1, w1 = rnd(3, 4, 20), rnd(5, 4, 3)  # 1-D, strided and dilated
    check("aten::convolution_overrideable", (x1, w1, None, [2], [2], [2], False, [0], 1), {},
          {"out": torch.nn.functional.conv1d(x1, w1, None, stride=2, padding=2, dilation=2)},
          {"in_input": x1, "in_weight": w1}, rule="conv", tol=1e-4)


# ---- movement --------------------------------------------------------------------------------

def test_view_backwards_and_classification():
    g = rnd(5, 7)
    check("aten::select_backward", (g, [5, 3, 7], 1, 2), {},
          {"out": torch.ops.aten.select_backward(g, [5, 3, 7], 1, 2)}, {"grad": g}, rule="dma")
    gs = rnd(4, 3, 7)
    check("aten::slice_backward", (gs, [4, 9, 7], 1, 1, 8, 3), {},
          {"out": torch.ops.aten.slice_backward(gs, [4, 9, 7], 1, 1, 8, 3)}, {"grad": gs}, rule="dma")
    x = torch.tensor([1.0, float("inf"), float("-inf"), float("nan"), -2.0])
    for name, fn in (("isnan", torch.isnan), ("isinf", torch.isinf), ("isneginf", torch.isneginf)):
        check(f"aten::{name}", (x,), {}, {"out": fn(x)}, {"in_self": x}, rule="elementwise")
    grad, mask = rnd(6, 5), rnd(6, 5) > 0
    check("aten::native_dropout_backward", (grad, mask, 2.0), {},
          {"out": torch.ops.aten.native_dropout_backward(grad, mask, 2.0)},
          {"in_grad_output": grad, "in_mask": mask}, rule="elementwise")


def test_layout_changes_ranges_and_more_elementwise():
    x = rnd(6, 9, 5)
    check("aten::flip", (x, [0, 2]), {}, {"out": torch.flip(x, [0, 2])}, {"in_self": x}, rule="dma")
    check("aten::roll", (x, [4], [1]), {}, {"out": torch.roll(x, 4, 1)}, {"in_self": x}, rule="dma")
    check("aten::roll", (x, [-7], []), {}, {"out": torch.roll(x, -7)}, {"in_self": x}, rule="dma")
    out = torch.empty(300)
    check("aten::linspace.out", (-2.0, 5.0, 300), {"out": OutputRef(0)}, {"out": torch.linspace(-2, 5, 300)}, {},
          rule="iota", tol=1e-5)
    check("aten::arange.start_out", (3, 300, 2), {"out": OutputRef(0)}, {"out": torch.arange(3, 300, 2.0)}, {},
          rule="iota")
    del out
    a, b = rnd(50, 20) * 4, rnd(20) * 2
    check("aten::remainder.Tensor", (a, b), {}, {"out": torch.remainder(a, b)}, {"in_self": a, "in_other": b},
          rule="elementwise", tol=1e-5)
    check("aten::logaddexp", (a, b), {}, {"out": torch.logaddexp(a, b)}, {"in_self": a, "in_other": b},
          rule="elementwise", tol=1e-5)
    for o in (2, 1, float("inf"), 3.0):
        check("aten::linalg_vector_norm", (x, o, [1]), {}, {"out": torch.linalg.vector_norm(x, o, [1])},
              {"in_self": x}, rule="reduction", tol=1e-4)
    for d in (0, 1):
        check("aten::_softmax", (x, d, False), {}, {"out": torch.softmax(x, d)}, {"in_self": x}, rule="reduction")


def test_copies_cat_and_padding():
    x = rnd(100, 70)
    low = check("tilescope::copy", (x.t(),), {}, {"dst": x.t().contiguous()}, {"src": x.t()}, rule="dma")
    assert low.program.summary_counts()["transpose"] > 0  # a layout transpose goes through TensorE
    y = rnd(3, 130, 40)
    check("tilescope::copy", (y.transpose(1, 2),), {}, {"dst": y.transpose(1, 2).contiguous()},
          {"src": y.transpose(1, 2)}, rule="dma")
    check("tilescope::copy", (x,), {}, {"dst": x.to(torch.bfloat16)}, {"src": x}, tol=1e-2)
    y = rnd(100, 30)
    check("aten::cat", ([x, y], 1), {}, {"out": torch.cat([x, y], 1)}, {"in0": x, "in1": y}, rule="dma")
    check("aten::constant_pad_nd", (y, [1, 2, 3, 0], ScalarArg("s0", float)), {},
          {"out": torch.nn.functional.pad(y, (1, 2, 3, 0), value=1.5)}, {"in": y}, {"s0": 1.5})


# ---- fused built-ins (tile kernels) ----------------------------------------------------------------

def test_fused_kernels():
    x, w, b = rnd(150, 96), rnd(96), rnd(96)
    check("aten::_softmax", (x, -1, False), {}, {"out": torch.softmax(x, -1)}, {"x": x}, rule="fused:softmax")
    check("aten::_log_softmax", (x, -1, False), {}, {"out": torch.log_softmax(x, -1)}, {"x": x})
    out, mean, rstd = torch.native_layer_norm(x, (96,), w, b, 1e-5)
    check("aten::native_layer_norm", (x, [96], w, b, 1e-5), {},
          {"out": out, "mean": mean, "rstd": rstd},
          {"x": x, "weight": w, "bias": b}, rule="fused:layer_norm")
    g = rnd(150, 96)
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(g, x, [96], mean, rstd, w, b, [True, True, True])
    check("aten::native_layer_norm_backward", (g, x, [96], mean, rstd, w, b, [True, True, True]), {},
          {"grad_input": dx, "grad_weight": dw.reshape(1, 96), "grad_bias": db.reshape(1, 96)},
          {"grad": g, "x": x, "mean": mean, "rstd": rstd, "weight": w}, rule="fused:layer_norm_backward",
          tol=1e-4)
    y = torch.rms_norm(x, (96,), w, 1e-6)
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    check("tilescope::rms_norm", (x, [96], w, 1e-6), {}, {"out": y, "rstd": rstd}, {"x": x, "weight": w},
          rule="fused:rms_norm")
    dx, dw = torch.ops.tilescope.rms_norm_backward(g, x, [96], rstd, w, [True, True])
    check("tilescope::rms_norm_backward", (g, x, [96], rstd, w, [True, True]), {},
          {"grad_input": dx, "grad_weight": dw.reshape(1, 96)}, {"grad": g, "x": x, "rstd": rstd, "weight": w},
          rule="fused:rms_norm_backward", tol=1e-4)
    g, y = rnd(150, 96), torch.softmax(x, -1)
    check("aten::_softmax_backward_data", (g, y, -1, torch.float32), {},
          {"out": torch.ops.aten._softmax_backward_data(g, y, -1, torch.float32)}, {"grad": g, "y": y},
          rule="fused:softmax_backward")
    ly = torch.log_softmax(x, -1)
    check("aten::_log_softmax_backward_data", (g, ly, -1, torch.float32), {},
          {"out": torch.ops.aten._log_softmax_backward_data(g, ly, -1, torch.float32)}, {"grad": g, "y": ly},
          rule="fused:log_softmax_backward", tol=1e-4)
    q, k, v = rnd(2, 3, 100, 32), rnd(2, 3, 200, 32), rnd(2, 3, 200, 24)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    s = (q @ k.transpose(-2, -1)) / 32 ** 0.5
    s = s.masked_fill(~torch.ones(100, 200, dtype=torch.bool).tril(), float("-inf"))
    check("aten::_scaled_dot_product_fused_attention_overrideable", (q, k, v), {"is_causal": True},
          {"out": ref, "logsumexp": torch.logsumexp(s, -1)}, {"query": q, "key": k, "value": v},
          rule="fused:attention", tol=1e-4)


def test_generic_lowering_performs_the_op():
    x = rnd(50, 40)
    values, indices = torch.kthvalue(x, 5)
    low = check("aten::kthvalue", (x, 5), {}, {"out0": values, "out1": indices}, {"in0": x}, rule="generic")
    assert "gpsimd_call" in low.program.summary_counts()
    cs = torch.logcumsumexp(x, 1)
    check("aten::logcumsumexp", (x, 1), {}, {"out0": cs}, {"in0": x}, rule="generic", tol=1e-5)


# ---- Programs are compiled once: step-dependent numbers are runtime operands -------------------

def test_adam_compiles_each_program_once():
    import tilescope.device as dev

    dev.register()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to("sim")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(16, 32, device="sim"), torch.randn(16, 8, device="sim")
    misses = []
    for step in range(50):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        misses.append(cache_info()["misses"])
    torch.sim.synchronize()
    # the second step differs from the first (Adam's state appears); from then on no new Program
    assert misses[2] == misses[-1], misses
    ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    ropt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for step in range(50):
        ropt.zero_grad()
        torch.nn.functional.mse_loss(ref(x.cpu()), y.cpu()).backward()
        ropt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5)




def test_foreach_ops_are_one_program_over_the_list():
    ps, t1s, t2s = [rnd(30, 7), rnd(100)], [rnd(30, 7), rnd(100)], [rnd(30, 7).abs() + 1, rnd(100).abs() + 1]
    feeds = {}
    for i, (p, a, b) in enumerate(zip(ps, t1s, t2s)):
        feeds.update({f"t{i}_in_self": p, f"t{i}_in_tensor1": a, f"t{i}_in_tensor2": b})
    expected = {f"t{i}_out": p + v * a / b for i, (p, a, b, v) in enumerate(zip(ps, t1s, t2s, (-0.5, 0.25)))}
    check("aten::_foreach_addcdiv_.ScalarList", (tuple(ps), tuple(t1s), tuple(t2s),
                                                 (ScalarArg("s0", float), ScalarArg("s1", float))), {},
          expected, feeds, {"s0": -0.5, "s1": 0.25}, rule="elementwise")


def test_a_per_row_operand_is_loaded_once_per_row_not_per_element():
    # x * rstd with rstd [rows, 1]: the naive RMSNorm's broadcast multiply. Reading the same
    # element for every output element would be charged per 4-byte DMA chunk; one value per row
    # is loaded and widened on chip instead.
    x, r = rnd(2048, 1024), rnd(2048, 1)
    low = check("aten::mul.Tensor", (x, r), {}, {"out": x * r}, {"in_self": x, "in_other": r}, rule="elementwise")
    same_shape = lower(Call("aten::mul.Tensor", (meta_of(x), meta_of(x)), (), (meta_of(x),)))
    assert low.modeled_ns < 1.2 * same_shape.modeled_ns, (low.modeled_ns, same_shape.modeled_ns)
