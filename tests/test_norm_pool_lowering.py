"""Batch norm, group norm, pooling and upsampling lowerings: each Program performs its op (its
own numerics equal CPU torch, running statistics updated in place included) and its modeled
time sits at or above the bytes-at-DMA-peak bound computed from the preset (these ops are
memory-bound), and near it at large shapes.
"""

import pytest
import torch

from test_lowering import as_torch, buffer_of, check, rnd
from tilescope.lower import Call, TensorMeta, contiguous_strides, lower, meta_of
from tilescope.sim import run_numerics
from tilescope.spec import preset

A = torch.ops.aten
SPEC = preset("trn1")


def meta(*shape, dtype="float32"):
    return TensorMeta(shape, contiguous_strides(shape), dtype)


def bytes_bound_ns(nbytes: float) -> float:
    return nbytes / SPEC.dma_bytes_per_ns


# ---- batch norm ---------------------------------------------------------------------------------

BN_SHAPES = [(4, 8, 5, 6), (2, 200, 3, 3), (1, 16, 40, 40), (6, 32), (3, 10, 70)]


@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
def test_batch_norm_training_updates_running_stats_in_place(shape):
    C = shape[1]
    x, w, b = rnd(*shape) * 2 + 0.5, rnd(C), rnd(C)
    rm, rv = rnd(C) * 0.1, rnd(C).abs() + 0.5
    new_rm, new_rv = rm.clone(), rv.clone()
    out, save_mean, save_invstd = torch.native_batch_norm(x, w, b, new_rm, new_rv, True, 0.1, 1e-5)
    args = (x, w, b, rm, rv, True, 0.1, 1e-5)
    call = Call("aten::native_batch_norm", tuple(meta_of(a) if isinstance(a, torch.Tensor) else a for a in args), (),
                (meta_of(out), meta_of(save_mean), meta_of(save_invstd)))
    low = lower(call)
    assert low.rule == "batch_norm"
    got = run_numerics(low.program, {k: buffer_of(v) for k, v in
                                     {"in_input": x, "in_weight": w, "in_bias": b, "in_running_mean": rm,
                                      "in_running_var": rv}.items()})
    for name, want in (("out", out), ("save_mean", save_mean), ("save_invstd", save_invstd),
                       ("in_running_mean", new_rm), ("in_running_var", new_rv)):
        torch.testing.assert_close(as_torch(got[name], want), want, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
def test_batch_norm_eval_and_backward(shape):
    C = shape[1]
    x, w, b = rnd(*shape) * 2 + 0.5, rnd(C), rnd(C)
    rm, rv = rnd(C) * 0.1, rnd(C).abs() + 0.5
    out = torch.native_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5)[0]
    check("aten::native_batch_norm", (x, w, b, rm, rv, False, 0.1, 1e-5), {}, {"out": out},
          {"in_input": x, "in_weight": w, "in_bias": b, "in_running_mean": rm, "in_running_var": rv},
          rule="batch_norm", tol=1e-4)
    _, sm, si = torch.native_batch_norm(x, w, b, rm.clone(), rv.clone(), True, 0.1, 1e-5)
    dy = rnd(*shape)
    for train in (True, False):
        gi, gw, gb = A.native_batch_norm_backward(dy, x, w, rm, rv, sm, si, train, 1e-5, [True] * 3)
        stats = {"in_save_mean": sm, "in_save_invstd": si} if train else {"in_running_mean": rm, "in_running_var": rv}
        check("aten::native_batch_norm_backward", (dy, x, w, rm, rv, sm, si, train, 1e-5, [True] * 3), {},
              {"grad_input": gi, "grad_weight": gw, "grad_bias": gb},
              {"in_grad_out": dy, "in_input": x, "in_weight": w} | stats, rule="batch_norm_backward", tol=2e-4)


def _input_bytes_read(program, name) -> int:
    return sum(i.dst.nbytes for i in program.instructions if type(i).__name__ == "DmaCopy" and i.src.buffer == name)


def test_batch_norm_reads_its_input_once_when_it_fits_in_sbuf():
    """At ResNet's 64x56x56 (batch 8, 50 KB per partition and tensor) both passes work from
    one read of x (forward) and of x and dy (backward)."""
    (fwd, _), (bwd, _) = _bn(64, 56), _bn_bwd(64, 56)
    nbytes = 8 * 64 * 56 * 56 * 4
    f, g = lower(fwd, SPEC).program, lower(bwd, SPEC).program
    assert _input_bytes_read(f, "in_input") == nbytes
    assert _input_bytes_read(g, "in_input") == nbytes and _input_bytes_read(g, "in_grad_out") == nbytes


def test_batch_norm_keeps_what_sbuf_holds_and_reads_the_rest_again():
    """With a 160 KiB SBUF the leading chunks stay on chip between the passes and the others
    are read again; values still match CPU."""
    import dataclasses

    small = dataclasses.replace(SPEC, sbuf_bytes_per_partition=160 * 1024)
    shape, C = (2, 8, 200, 200), 8
    x, w, b = rnd(*shape) * 2 + 0.5, rnd(C), rnd(C)
    rm, rv = rnd(C) * 0.1, rnd(C).abs() + 0.5
    out, sm, si = torch.native_batch_norm(x, w, b, rm.clone(), rv.clone(), True, 0.1, 1e-5)
    call = Call("aten::native_batch_norm", tuple(meta_of(a) if isinstance(a, torch.Tensor) else a
                                                 for a in (x, w, b, rm, rv, True, 0.1, 1e-5)), (),
                (meta_of(out), meta_of(sm), meta_of(si)))
    prog = lower(call, small).program
    assert x.numel() * 4 < _input_bytes_read(prog, "in_input") < 2 * x.numel() * 4  # some chunks read twice
    got = run_numerics(prog, {k: buffer_of(v) for k, v in {"in_input": x, "in_weight": w, "in_bias": b,
                                                           "in_running_mean": rm, "in_running_var": rv}.items()})
    torch.testing.assert_close(as_torch(got["out"], out), out, rtol=1e-4, atol=1e-4)
    dy = rnd(*shape)
    gi, gw, gb = A.native_batch_norm_backward(dy, x, w, rm, rv, sm, si, True, 1e-5, [True] * 3)
    args = (dy, x, w, rm, rv, sm, si, True, 1e-5, (True, True, True))
    call = Call("aten::native_batch_norm_backward", tuple(meta_of(a) if isinstance(a, torch.Tensor) else a
                                                          for a in args), (), (meta_of(gi), meta_of(gw), meta_of(gb)))
    prog = lower(call, small).program
    assert x.numel() * 4 < _input_bytes_read(prog, "in_input") < 2 * x.numel() * 4
    got = run_numerics(prog, {"in_grad_out": buffer_of(dy), "in_input": buffer_of(x), "in_weight": buffer_of(w),
                              "in_save_mean": buffer_of(sm), "in_save_invstd": buffer_of(si)})
    for name, want in (("grad_input", gi), ("grad_weight", gw), ("grad_bias", gb)):
        torch.testing.assert_close(as_torch(got[name], want), want, rtol=2e-4, atol=2e-4, msg=name)


@pytest.mark.parametrize("shape,groups", [((2, 8, 5, 6), 2), ((3, 64, 4, 4), 32), ((2, 12, 300), 3),
                                          ((5, 6, 20, 20), 6)], ids=str)
def test_group_norm_forward_and_backward(shape, groups):
    N, C = shape[:2]
    S = 1
    for d in shape[2:]:
        S *= d
    x, w, b = rnd(*shape) * 2 + 0.5, rnd(C), rnd(C)
    out, mean, rstd = A.native_group_norm(x, w, b, N, C, S, groups, 1e-5)
    check("aten::native_group_norm", (x, w, b, N, C, S, groups, 1e-5), {}, {"out": out, "mean": mean, "rstd": rstd},
          {"in_input": x, "in_weight": w, "in_bias": b}, rule="group_norm", tol=1e-4)
    dy = rnd(*shape)
    gi, gw, gb = A.native_group_norm_backward(dy, x, mean, rstd, w, N, C, S, groups, [True] * 3)
    check("aten::native_group_norm_backward", (dy, x, mean, rstd, w, N, C, S, groups, [True] * 3), {},
          {"grad_input": gi, "grad_weight": gw, "grad_bias": gb},
          {"in_grad_out": dy, "in_input": x, "in_mean": mean, "in_rstd": rstd, "in_weight": w},
          rule="group_norm_backward", tol=2e-4)


# ---- pooling ------------------------------------------------------------------------------------

POOLS = [((2, 3, 11, 13), (3, 3), (2, 2), (1, 1), (1, 1), False),
         ((1, 4, 8, 8), (2, 2), (2, 2), (0, 0), (1, 1), False),    # windows tile the input
         ((2, 2, 9, 7), (3, 2), (2, 1), (1, 0), (2, 1), True),     # dilation, ceil_mode
         ((2, 3, 7, 7), (2, 2), (2, 2), (0, 0), (1, 1), False),    # a column no window reaches
         ((1, 2, 112, 112), (3, 3), (2, 2), (1, 1), (1, 1), False),  # row blocks with halos
         ((2, 2, 10, 10), (2, 2), (3, 3), (0, 0), (1, 1), False),  # stride over kernel: rows and columns skipped
         ((1, 3, 9, 9), (3, 3), (1, 1), (1, 1), (1, 1), False)]    # stride 1: every tap past the first overlaps


@pytest.mark.parametrize("shape,k,s,p,d,ceil", POOLS, ids=str)
def test_max_pool_with_indices_forward_and_backward(shape, k, s, p, d, ceil):
    x = rnd(*shape)
    out, idx = A.max_pool2d_with_indices(x, k, s, p, d, ceil)
    check("aten::max_pool2d_with_indices", (x, k, s, p, d, ceil), {}, {"out": out, "indices": idx}, {"in_self": x},
          rule="pool")
    dy = rnd(*out.shape)
    gi = A.max_pool2d_with_indices_backward(dy, x, k, s, p, d, ceil, idx)
    check("aten::max_pool2d_with_indices_backward", (dy, x, k, s, p, d, ceil, idx), {}, {"grad_input": gi},
          {"in_grad_output": dy, "in_indices": idx}, rule="pool_backward", tol=1e-5)


def test_max_pool_ties_take_the_first_index_as_on_cpu():
    x = torch.zeros(1, 2, 6, 6)  # after a ReLU: many equal maxima
    x[0, 0, 1, 1] = 1.0
    out, idx = A.max_pool2d_with_indices(x, (3, 3), (2, 2), (1, 1), (1, 1), False)
    check("aten::max_pool2d_with_indices", (x, (3, 3), (2, 2), (1, 1), (1, 1), False), {},
          {"out": out, "indices": idx}, {"in_self": x}, rule="pool")


@pytest.mark.parametrize("shape,k,s,p,d,ceil", [c for c in POOLS if c[4] == (1, 1)], ids=str)
@pytest.mark.parametrize("include_pad,divisor", [(True, None), (False, None), (True, 5)])
def test_avg_pool_forward_and_backward(shape, k, s, p, d, ceil, include_pad, divisor):
    x = rnd(*shape)
    out = A.avg_pool2d(x, k, s, p, ceil, include_pad, divisor)
    check("aten::avg_pool2d", (x, k, s, p, ceil, include_pad, divisor), {}, {"out": out}, {"in_self": x},
          rule="pool", tol=1e-5)
    dy = rnd(*out.shape)
    gi = A.avg_pool2d_backward(dy, x, k, s, p, ceil, include_pad, divisor)
    check("aten::avg_pool2d_backward", (dy, x, k, s, p, ceil, include_pad, divisor), {}, {"grad_input": gi},
          {"in_grad_output": dy}, rule="pool_backward", tol=1e-5)


@pytest.mark.parametrize("shape,size", [((2, 3, 10, 10), (5, 5)), ((2, 3, 10, 9), (3, 4)), ((1, 5, 7, 7), (7, 7)),
                                        ((2, 2, 13, 5), (1, 2))], ids=str)
def test_adaptive_avg_pool_forward_and_backward(shape, size):
    x = rnd(*shape)
    out = A._adaptive_avg_pool2d(x, size)
    check("aten::_adaptive_avg_pool2d", (x, size), {}, {"out": out}, {"in_self": x}, rule="pool", tol=1e-5)
    dy = rnd(*out.shape)
    check("aten::_adaptive_avg_pool2d_backward", (dy, x), {}, {"grad_input": A._adaptive_avg_pool2d_backward(dy, x)},
          {"in_grad_output": dy}, rule="pool_backward", tol=1e-5)


# ---- upsampling ---------------------------------------------------------------------------------

UPSAMPLES = [((2, 3, 5, 6), (10, 12), (None, None)), ((1, 2, 4, 5), (7, 11), (None, None)),
             ((1, 2, 6, 6), (4, 3), (None, None)), ((1, 2, 5, 5), (12, 13), (2.5, 2.7)),
             ((1, 2, 9, 9), (3, 3), (None, None))]  # sources no output reads (gradient 0)


@pytest.mark.parametrize("shape,size,scales", UPSAMPLES, ids=str)
def test_upsample_nearest_and_bilinear_forward_and_backward(shape, size, scales):
    x = rnd(*shape)
    check("aten::upsample_nearest2d", (x, size, *scales), {}, {"out": A.upsample_nearest2d(x, size, *scales)},
          {"in_self": x}, rule="upsample")
    dy = rnd(shape[0], shape[1], *size)
    check("aten::upsample_nearest2d_backward", (dy, size, list(shape), *scales), {},
          {"grad_input": A.upsample_nearest2d_backward(dy, size, list(shape), *scales)}, {"in_grad_output": dy},
          rule="upsample_backward", tol=1e-5)
    for align in (False, True):
        check("aten::upsample_bilinear2d", (x, size, align, *scales), {},
              {"out": A.upsample_bilinear2d(x, size, align, *scales)}, {"in_self": x}, rule="upsample", tol=1e-5)
        check("aten::upsample_bilinear2d_backward", (dy, size, list(shape), align, *scales), {},
              {"grad_input": A.upsample_bilinear2d_backward(dy, size, list(shape), align, *scales)},
              {"in_grad_output": dy}, rule="upsample_backward", tol=1e-5)


def test_upsample_1d():
    x = rnd(2, 3, 10)
    check("aten::upsample_nearest1d", (x, (20,), None), {}, {"out": A.upsample_nearest1d(x, (20,), None)},
          {"in_self": x}, rule="upsample")
    check("aten::upsample_linear1d", (x, (25,), False, None), {}, {"out": A.upsample_linear1d(x, (25,), False, None)},
          {"in_self": x}, rule="upsample", tol=1e-5)


# ---- time against the bound at ResNet / UNet-sized shapes (batch 8, fp32) ---------------------------------

def _bn(c, hw):
    x, v = meta(8, c, hw, hw), meta(c)
    return Call("aten::native_batch_norm", (x, v, v, v, v, True, 0.1, 1e-5), (), (x, v, v)), 2 * x.numel * 4


def _bn_bwd(c, hw):
    x, v = meta(8, c, hw, hw), meta(c)
    return (Call("aten::native_batch_norm_backward", (x, x, v, v, v, v, v, True, 1e-5, (True, True, True)), (),
                 (x, v, v)), 3 * x.numel * 4)


def _gn(c, hw, g):
    x, v, st = meta(8, c, hw, hw), meta(c), meta(8, g)
    return Call("aten::native_group_norm", (x, v, v, 8, c, hw * hw, g, 1e-5), (), (x, st, st)), 2 * x.numel * 4


def _gn_bwd(c, hw, g):
    x, v, st = meta(8, c, hw, hw), meta(c), meta(8, g)
    return (Call("aten::native_group_norm_backward", (x, x, st, st, v, 8, c, hw * hw, g, (True, True, True)), (),
                 (x, v, v)), 3 * x.numel * 4)


def _maxpool():
    x, y, i = meta(8, 64, 112, 112), meta(8, 64, 56, 56), meta(8, 64, 56, 56, dtype="int64")
    return Call("aten::max_pool2d_with_indices", (x, (3, 3), (2, 2), (1, 1)), (), (y, i)), (x.numel + y.numel) * 4 + \
        i.numel * 8


def _maxpool_backward():
    call, nbytes = _maxpool()
    (x, _, s, p), (y, i) = call.args, call.outputs
    return Call("aten::max_pool2d_with_indices_backward", (y, x, (3, 3), s, p, (1, 1), False, i), (), (x,)), nbytes


def _avgpool():
    x, y = meta(8, 256, 28, 28), meta(8, 256, 14, 14)
    return Call("aten::avg_pool2d", (x, (2, 2), (2, 2), (0, 0)), (), (y,)), (x.numel + y.numel) * 4


def _upsample(mode):
    x, y = meta(8, 128, 32, 32), meta(8, 128, 64, 64)
    if mode == "nearest":
        call = Call("aten::upsample_nearest2d", (x, (64, 64), None, None), (), (y,))
    else:
        call = Call("aten::upsample_bilinear2d", (x, (64, 64), False, None, None), (), (y,))
    return call, (x.numel + y.numel) * 4


def _bilinear_backward():
    x, y = meta(8, 128, 32, 32), meta(8, 128, 64, 64)
    call = Call("aten::upsample_bilinear2d_backward", (y, (64, 64), (8, 128, 32, 32), False, None, None), (), (x,))
    return call, (x.numel + y.numel) * 4


LARGE = [("bn 64x56", lambda: _bn(64, 56), 1.5), ("bn 128x28", lambda: _bn(128, 28), 1.6),
         ("bn 64x112", lambda: _bn(64, 112), 1.6),  # 200 KB per partition: about two thirds kept on chip
         ("bn backward 64x56", lambda: _bn_bwd(64, 56), 1.6), ("gn 64x56 g32", lambda: _gn(64, 56, 32), 1.5),
         ("gn backward 64x56 g32", lambda: _gn_bwd(64, 56, 32), 2.0),
         ("max pool 3x3/2", _maxpool, 3.5),  # VectorE finds the indices tap by tap
         ("max pool 3x3/2 backward", _maxpool_backward, 3.0),  # VectorE: a masked product per tap
         ("avg pool 2x2/2", _avgpool, 1.5), ("nearest x2", lambda: _upsample("nearest"), 1.3),
         ("bilinear x2", lambda: _upsample("bilinear"), 3.0),
         ("bilinear x2 backward", _bilinear_backward, 2.5)]  # VectorE: one add per contribution past the first


@pytest.mark.parametrize("name,make,max_ratio", LARGE, ids=[c[0] for c in LARGE])
def test_time_vs_bound_at_large_shapes(name, make, max_ratio):
    call, nbytes = make()
    low = lower(call, SPEC)
    assert low.rule != "generic"
    bound = bytes_bound_ns(nbytes)
    assert bound <= low.modeled_ns <= max_ratio * bound, (name, low.modeled_ns / bound)
