"""One definition per op: every op of the shared tables, eager and compiled, agrees.

Each op of :data:`tilescope.lower._elementwise.OPS` and of the reductions the fuser takes from
:mod:`tilescope.lower._reduce` runs both ways:

* eager: the Program the device lowers for the single aten call (``lower(Call)``, numbers as
  runtime scalars, as ``tilescope.device`` does);
* compiled: the aten graph of that one call, planned and fused by the compile backend.

Both Programs must compute the op (their own numerics, numpy, equal CPU torch) and their
modeled times must agree within 5%: the two paths share the op's instructions, so only how the
work is tiled may differ.
"""

import numpy as np
import pytest
import torch

from tilescope.compile._emit import emit_segments
from tilescope.compile._plan import plan_graph
from tilescope.lower import Call, ScalarArg, lower, meta_of
from tilescope.lower._elementwise import OPS
from tilescope.compile._fusion_table import REDUCTIONS
from tilescope.sim import run_numerics, simulate

aten = torch.ops.aten
SHAPE = (256, 64)


def _rng():
    return torch.Generator().manual_seed(0)


def x(g, lo=None):
    t = torch.randn(SHAPE, generator=g)
    return t.abs() + lo if lo is not None else t


def mask(g):
    return torch.randn(SHAPE, generator=g) > 0


def special(g):
    t = torch.randn(SHAPE, generator=g)
    t[0, :4] = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0])
    return t


# op row -> (aten overload, inputs(generator) -> (args, kwargs)); numbers are Scalar arguments
SAMPLES = {
    "abs": (aten.abs.default, lambda g: ((x(g),), {})),
    "neg": (aten.neg.default, lambda g: ((x(g),), {})),
    "exp": (aten.exp.default, lambda g: ((x(g),), {})),
    "log": (aten.log.default, lambda g: ((x(g, 0.1),), {})),
    "sqrt": (aten.sqrt.default, lambda g: ((x(g, 0.1),), {})),
    "rsqrt": (aten.rsqrt.default, lambda g: ((x(g, 0.1),), {})),
    "tanh": (aten.tanh.default, lambda g: ((x(g),), {})),
    "sigmoid": (aten.sigmoid.default, lambda g: ((x(g),), {})),
    "relu": (aten.relu.default, lambda g: ((x(g),), {})),
    "sin": (aten.sin.default, lambda g: ((x(g),), {})),
    "cos": (aten.cos.default, lambda g: ((x(g),), {})),
    "erf": (aten.erf.default, lambda g: ((x(g),), {})),
    "sign": (aten.sign.default, lambda g: ((x(g),), {})),
    "sgn": (aten.sgn.default, lambda g: ((x(g),), {})),
    "reciprocal": (aten.reciprocal.default, lambda g: ((x(g, 0.5),), {})),
    "silu": (aten.silu.default, lambda g: ((x(g),), {})),
    "log1p": (aten.log1p.default, lambda g: ((x(g, 0.0),), {})),
    "exp2": (aten.exp2.default, lambda g: ((x(g),), {})),
    "log2": (aten.log2.default, lambda g: ((x(g, 0.1),), {})),
    "log10": (aten.log10.default, lambda g: ((x(g, 0.1),), {})),
    "expm1": (aten.expm1.default, lambda g: ((x(g),), {})),
    "gelu": (aten.gelu.default, lambda g: ((x(g),), {"approximate": "tanh"})),
    "softplus": (aten.softplus.default, lambda g: ((x(g), 2.0, 20.0), {})),
    "leaky_relu": (aten.leaky_relu.default, lambda g: ((x(g), 0.1), {})),
    "hardtanh": (aten.hardtanh.default, lambda g: ((x(g), -0.5, 0.5), {})),
    "elu": (aten.elu.default, lambda g: ((x(g), 0.7), {})),
    "hardsigmoid": (aten.hardsigmoid.default, lambda g: ((x(g) * 4,), {})),
    "hardswish": (aten.hardswish.default, lambda g: ((x(g) * 4,), {})),
    "mish": (aten.mish.default, lambda g: ((x(g),), {})),
    "add": (aten.add.Tensor, lambda g: ((x(g), x(g)), {"alpha": 2.0})),
    "sub": (aten.sub.Tensor, lambda g: ((x(g), x(g)), {})),
    "rsub": (aten.rsub.Tensor, lambda g: ((x(g), x(g)), {})),
    "mul": (aten.mul.Tensor, lambda g: ((x(g), x(g)), {})),
    "div": (aten.div.Tensor_mode, lambda g: ((x(g) * 5, x(g, 0.2)), {"rounding_mode": "floor"})),
    "maximum": (aten.maximum.default, lambda g: ((x(g), x(g)), {})),
    "minimum": (aten.minimum.default, lambda g: ((x(g), x(g)), {})),
    "fmod": (aten.fmod.Tensor, lambda g: ((x(g) * 5, x(g, 0.5)), {})),
    "remainder": (aten.remainder.Tensor, lambda g: ((x(g) * 5, x(g) + 0.1), {})),
    "logaddexp": (aten.logaddexp.default, lambda g: ((x(g), x(g)), {})),
    "pow": (aten.pow.Tensor_Scalar, lambda g: ((x(g, 0.1), 1.5), {})),
    "eq": (aten.eq.Tensor, lambda g: ((x(g).round(), x(g).round()), {})),
    "ne": (aten.ne.Scalar, lambda g: ((x(g).round(), 0.0), {})),
    "lt": (aten.lt.Tensor, lambda g: ((x(g), x(g)), {})),
    "le": (aten.le.Scalar, lambda g: ((x(g), 0.2), {})),
    "gt": (aten.gt.Tensor, lambda g: ((x(g), x(g)), {})),
    "ge": (aten.ge.Scalar, lambda g: ((x(g), -0.2), {})),
    "logical_and": (aten.logical_and.default, lambda g: ((mask(g), mask(g)), {})),
    "logical_or": (aten.logical_or.default, lambda g: ((mask(g), mask(g)), {})),
    "logical_xor": (aten.logical_xor.default, lambda g: ((mask(g), mask(g)), {})),
    "logical_not": (aten.logical_not.default, lambda g: ((mask(g),), {})),
    "clamp": (aten.clamp.default, lambda g: ((x(g), -0.5, 0.7), {})),
    "clamp_min": (aten.clamp_min.default, lambda g: ((x(g), 0.1), {})),
    "clamp_max": (aten.clamp_max.default, lambda g: ((x(g), 0.1), {})),
    "where": (aten.where.self, lambda g: ((mask(g), x(g), x(g)), {})),
    "masked_fill": (aten.masked_fill.Scalar, lambda g: ((x(g), mask(g), -2.5), {})),
    "addcmul": (aten.addcmul.default, lambda g: ((x(g), x(g), x(g)), {"value": 0.5})),
    "addcdiv": (aten.addcdiv.default, lambda g: ((x(g), x(g), x(g, 0.5)), {"value": -0.5})),
    "lerp": (aten.lerp.Scalar, lambda g: ((x(g), x(g), 0.3), {})),
    "fill": (aten.fill.Scalar, lambda g: ((x(g), 1.5), {})),
    "zero": (aten.zero.default, lambda g: ((x(g),), {})),
    "_to_copy": (aten._to_copy.default, lambda g: ((x(g),), {"dtype": torch.bfloat16})),
    "clone": (aten.clone.default, lambda g: ((x(g),), {})),
    "alias_copy": (aten.alias_copy.default, lambda g: ((x(g),), {})),
    "sigmoid_backward": (aten.sigmoid_backward.default, lambda g: ((x(g), x(g).sigmoid()), {})),
    "tanh_backward": (aten.tanh_backward.default, lambda g: ((x(g), x(g).tanh()), {})),
    "threshold_backward": (aten.threshold_backward.default, lambda g: ((x(g), x(g), 0.0), {})),
    "silu_backward": (aten.silu_backward.default, lambda g: ((x(g), x(g)), {})),
    "gelu_backward": (aten.gelu_backward.default, lambda g: ((x(g), x(g)), {})),
    "native_dropout_backward": (aten.native_dropout_backward.default, lambda g: ((x(g), mask(g), 2.0), {})),
    "isnan": (aten.isnan.default, lambda g: ((special(g),), {})),
    "isinf": (aten.isinf.default, lambda g: ((special(g),), {})),
    "isposinf": (aten.isposinf.default, lambda g: ((special(g),), {})),
    "isneginf": (aten.isneginf.default, lambda g: ((special(g),), {})),
    # reductions over the last dim (the fuser's reductions)
    "sum": (aten.sum.dim_IntList, lambda g: ((x(g), [-1], True), {})),
    "mean": (aten.mean.dim, lambda g: ((x(g), [-1], True), {})),
    "amax": (aten.amax.default, lambda g: ((x(g), [-1], True), {})),
    "amin": (aten.amin.default, lambda g: ((x(g), [-1], True), {})),
    "prod": (aten.prod.dim_int, lambda g: ((x(g) * 0.2 + 1, -1, True), {})),
    "all": (aten.all.dim, lambda g: ((mask(g), -1, True), {})),
    "any": (aten.any.dim, lambda g: ((mask(g), -1, True), {})),
    "var": (aten.var.correction, lambda g: ((x(g), [-1]), {"correction": 1, "keepdim": True})),
    "std": (aten.std.correction, lambda g: ((x(g), [-1]), {"correction": 0, "keepdim": True})),
    "linalg_vector_norm": (aten.linalg_vector_norm.default, lambda g: ((x(g), 2.0, [-1], True), {})),
}

# matrix products: the GEMM of both paths (lower._gemm), with the bias epilogue
MATMULS = {
    "mm": (aten.mm.default, lambda g: ((torch.randn(256, 192, generator=g), torch.randn(192, 640, generator=g)), {})),
    "addmm": (aten.addmm.default, lambda g: ((torch.randn(640, generator=g), torch.randn(256, 192, generator=g),
                                              torch.randn(192, 640, generator=g)), {})),
    "bmm": (aten.bmm.default, lambda g: ((torch.randn(3, 128, 64, generator=g), torch.randn(3, 64, 200, generator=g)),
                                         {})),
}


def test_every_op_of_the_tables_has_a_sample():
    assert set(OPS) | set(REDUCTIONS) == set(SAMPLES)


def _np(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _eager(op, args, kwargs, out):
    """The Program the device lowers for ``op(*args, **kwargs)``, and its runtime scalars."""
    from tilescope.device._dispatch import Handler, _abstract

    h = Handler(op)
    counter = [0]
    largs = tuple(_abstract(a, h.pos_flags[i] if i < len(h.pos_flags) else 0, counter) for i, a in enumerate(args))
    lkw = tuple(sorted((k, _abstract(v, h.kw_flags.get(k, 0), counter)) for k, v in kwargs.items()))
    scalars = {}
    for abstract, value in zip(list(largs) + [v for _, v in lkw], list(args) + [kwargs[k] for k, _ in lkw]):
        if isinstance(abstract, ScalarArg):
            scalars[abstract.name] = value
    low = lower(Call(h.name, largs, lkw, (meta_of(out),)))
    names = [a.name for a in op._schema.arguments]
    by_name = {f"in_{n}": v for n, v in zip(names, args)} | {f"in_{k}": v for k, v in kwargs.items()}
    if op in (aten.mm.default, aten.addmm.default, aten.bmm.default):  # the GEMM's operand names
        by_name = dict(zip(("in_a", "in_b"), [a for a in args if a.dim() > 1])) | (
            {"in_bias": args[0]} if op is aten.addmm.default else {})
    if not all(name in by_name for name in low.program.inputs):
        # a fused kernel names its inputs its own way, in argument order
        by_name = dict(zip(low.program.inputs, [a for a in args if isinstance(a, torch.Tensor)]))
    feeds = {name: _np(by_name[name]) for name in low.program.inputs}
    return low, feeds, scalars


def _compiled(op, args, kwargs):
    """The compile backend's Program of the one-op graph ``op(*args, **kwargs)``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    tensors = [a for a in args if isinstance(a, torch.Tensor)]

    def fn(*ts):
        it = iter(ts)
        return op(*(next(it) if isinstance(a, torch.Tensor) else a for a in args), **kwargs)

    gm = make_fx(fn)(*tensors)
    segments = plan_graph(gm)
    assert [s.kind for s in segments] in (["rowgroup"], ["matmul"]), [(s.kind, s.reason) for s in segments]
    prog, _ = emit_segments(segments, "agree", "trn1")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    feeds = {n.name: _np(t).reshape(prog.buffers[n.name].shape) for n, t in zip(placeholders, tensors)
             if n.name in prog.buffers}
    return prog, feeds


def _close(got: np.ndarray, expected: torch.Tensor, name: str, path: str):
    exp = _np(expected).astype(np.float64).reshape(-1)
    got = got.astype(np.float64).reshape(-1)
    tol = 2e-2 if expected.dtype == torch.bfloat16 else 1e-3 if name in MATMULS else 1e-4
    np.testing.assert_allclose(got, exp, rtol=tol, atol=tol, equal_nan=True, err_msg=f"{name}, {path}")


@pytest.mark.parametrize("name", sorted(SAMPLES) + sorted(MATMULS))
def test_eager_and_compiled_programs_agree(name):
    op, make = SAMPLES.get(name) or MATMULS[name]
    args, kwargs = make(_rng())
    expected = op(*args, **kwargs)
    low, eager_feeds, scalars = _eager(op, args, kwargs, expected)
    prog, compiled_feeds = _compiled(op, args, kwargs)
    (eager_out,) = run_numerics(low.program, eager_feeds, scalars).values()
    _close(eager_out, expected, name, "eager Program")
    (compiled_out,) = run_numerics(prog, compiled_feeds).values()
    _close(compiled_out, expected, name, "compiled Program")
    eager_ns, compiled_ns = low.modeled_ns, simulate(prog).summary.total_ns
    assert abs(compiled_ns / eager_ns - 1) <= 0.05, (
        f"{name}: eager {eager_ns:.0f} ns ({low.rule}), compiled {compiled_ns:.0f} ns (modeled)")
