"""Every tile-language op against numpy, and the instructions (and engines) it maps to."""

import math

import ml_dtypes
import numpy as np
import pytest

import tilescope
import tilescope.errors
import tilescope.isa as nisa
import tilescope.lang as tl
from tilescope.lang._context import current

RNG = np.random.default_rng(0)
BF16 = ml_dtypes.bfloat16


def rand(*shape, lo=-2.0, hi=2.0, dtype=np.float32):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def kinds(result) -> dict:
    return result.program.summary_counts()


def engines(result, kind: str) -> set:
    return {i.engine for i in result.program.instructions if i.KIND == kind}


# ---- elementwise binary ------------------------------------------------------------------

BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "power": np.power,
}
COMPARE = {
    "equal": np.equal, "not_equal": np.not_equal, "greater": np.greater, "greater_equal": np.greater_equal,
    "less": np.less, "less_equal": np.less_equal,
}


@tilescope.kernel
def binary_tt(x, y, out, op):
    tl.store(out, getattr(tl, op)(tl.load(x), tl.load(y)))


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_tile_tile(op):
    x, y = rand(128, 96, lo=0.5), rand(128, 96, lo=0.5)
    out = np.empty_like(x)
    r = tilescope.simulate(binary_tt, x, y, out, op)
    np.testing.assert_allclose(out, BINARY[op](x, y), rtol=1e-6)
    assert kinds(r) == {"dma_copy": 3, "tensor_tensor": 1} and engines(r, "tensor_tensor") == {"dve"}


@pytest.mark.parametrize("op", sorted(COMPARE))
def test_comparisons_give_uint8(op):
    x = RNG.integers(0, 3, (128, 40)).astype(np.float32)
    y = RNG.integers(0, 3, (128, 40)).astype(np.float32)
    out = np.empty((128, 40), np.uint8)
    tilescope.simulate(binary_tt, x, y, out, op)
    np.testing.assert_array_equal(out, COMPARE[op](x, y).astype(np.uint8))


@tilescope.kernel
def operators(x, y, s, outs):
    a, b, p = tl.load(x), tl.load(y), tl.load(s)
    results = [a + b, a - b, a * b, a / b, -a, abs(a), a ** 2.0, 2.0 - a, 1.0 / b, a * p, p - a,
               3.0 + a, a / 4.0]
    for k, v in enumerate(results):
        tl.store(outs[k], v)


def test_operators_scalars_and_per_partition_operands():
    x, y = rand(128, 64), rand(128, 64, lo=0.5)
    s = rand(128, 1)
    outs = np.empty((13, 128, 64), np.float32)
    r = tilescope.simulate(operators, x, y, s, outs)
    expect = [x + y, x - y, x * y, x / y, -x, np.abs(x), x ** 2, 2 - x, 1 / y, x * s, s - x, 3 + x, x / 4]
    for k, e in enumerate(expect):
        np.testing.assert_allclose(outs[k], e, rtol=1e-6, err_msg=f"result {k}")
    # numbers and [P, 1] tiles go through tensor_scalar (one pass over the wide operand)
    assert kinds(r)["tensor_tensor"] == 4 and kinds(r)["tensor_scalar"] == 9


@tilescope.kernel
def logic(x, y, out):
    a, b = tl.load(x), tl.load(y)
    tl.store(out[0], (a > 0) & (b > 0))
    tl.store(out[1], (a > 0) | (b > 0))
    tl.store(out[2], (a > 0) ^ (b > 0))


def test_logical_operators():
    x, y = rand(128, 32), rand(128, 32)
    out = np.empty((3, 128, 32), np.uint8)
    tilescope.simulate(logic, x, y, out)
    a, b = x > 0, y > 0
    np.testing.assert_array_equal(out, np.stack([a & b, a | b, a ^ b]).astype(np.uint8))


@tilescope.kernel
def broadcast3d(x, y, out):
    a = tl.load(x)  # [128, 4, 32]
    b = tl.load(y)  # [128, 1, 32]
    tl.store(out, a * b)


def test_free_dim_broadcasting_uses_a_stride_0_view():
    x, y = rand(128, 4, 32), rand(128, 1, 32)
    out = np.empty_like(x)
    r = tilescope.simulate(broadcast3d, x, y, out)
    np.testing.assert_allclose(out, x * y, rtol=1e-6)
    assert kinds(r)["tensor_tensor"] == 1 and "tensor_copy" not in kinds(r)


@tilescope.kernel
def promote(x, y, out):
    z = tl.load(x) + tl.load(y)
    assert z.dtype == tl.float32
    tl.store(out, z)


def test_dtype_promotion_bf16_with_fp32_is_fp32():
    x, y = rand(128, 16).astype(BF16), rand(128, 16)
    out = np.empty((128, 16), np.float32)
    tilescope.simulate(promote, x, y, out)
    np.testing.assert_allclose(out, x.astype(np.float32) + y, rtol=1e-6)


# ---- activation functions (ScalarE) ---------------------------------------------------------

_erf = np.vectorize(math.erf)
UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v), "tanh": np.tanh,
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "relu": lambda v: np.maximum(v, 0),
    "gelu": lambda v: 0.5 * v * (1 + _erf(v / math.sqrt(2))),
    "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))),
    "silu": lambda v: v / (1 + np.exp(-v)), "softplus": lambda v: np.log1p(np.exp(v)), "erf": _erf,
    "square": np.square, "sin": np.sin, "cos": np.cos, "sign": np.sign,
}
POSITIVE = {"log", "sqrt", "rsqrt"}


@tilescope.kernel
def unary(x, out, op):
    tl.store(out, getattr(tl, op)(tl.load(x)))


@pytest.mark.parametrize("op", sorted(UNARY))
def test_activation_functions_on_scalar_engine(op):
    x = rand(128, 64, lo=0.1 if op in POSITIVE else -3.0, hi=3.0)
    out = np.empty_like(x)
    r = tilescope.simulate(unary, x, out, op)
    np.testing.assert_allclose(out, UNARY[op](x.astype(np.float64)), rtol=2e-6, atol=2e-6)
    assert kinds(r) == {"dma_copy": 2, "activation": 1} and engines(r, "activation") == {"act"}


@pytest.mark.parametrize("op,ref", [("negative", np.negative), ("abs", np.abs), ("reciprocal", lambda v: 1 / v)])
def test_vector_engine_unary_ops(op, ref):
    x = rand(128, 64, lo=0.5)
    out = np.empty_like(x)
    r = tilescope.simulate(unary, x, out, op)
    np.testing.assert_allclose(out, ref(x), rtol=1e-6)
    assert kinds(r) == {"dma_copy": 2, "tensor_scalar": 1} and engines(r, "tensor_scalar") == {"dve"}


def test_bf16_results_round_to_bf16():
    x = rand(128, 64).astype(BF16)
    out = np.empty_like(x)
    tilescope.simulate(unary, x, out, "exp")
    np.testing.assert_array_equal(out, np.exp(x.astype(np.float32)).astype(BF16))


# ---- reductions ------------------------------------------------------------------------------------

@tilescope.kernel
def reduce_k(x, out, op, axis, keepdims):
    tl.store(out, getattr(tl, op)(tl.load(x), axis=axis, keepdims=keepdims))


@pytest.mark.parametrize("op,ref", [("sum", np.sum), ("max", np.max), ("min", np.min), ("mean", np.mean),
                                    ("var", np.var)])
@pytest.mark.parametrize("shape,axis", [((128, 300), 1), ((64, 6, 40), (1, 2)), ((128, 6, 40), 2),
                                        ((128, 6, 40), 1)])
def test_reductions_over_free_axes(op, ref, shape, axis):
    x = rand(*shape)
    expect = ref(x.astype(np.float64), axis=axis, keepdims=True)
    out = np.empty(expect.shape, np.float32)
    tilescope.simulate(reduce_k, x, out, op, axis, True)
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-5)


def test_reduction_without_keepdims_is_a_per_partition_vector():
    x = rand(128, 64)
    out = np.empty((128,), np.float32)
    tilescope.simulate(reduce_k, x, out, "sum", 1, False)
    np.testing.assert_allclose(out, x.sum(axis=1), rtol=1e-5)


def test_var_of_a_2d_tile_uses_bn_stats_in_512_chunks():
    x = rand(128, 1200) * 3 + 1
    out = np.empty((128, 1), np.float32)
    r = tilescope.simulate(reduce_k, x, out, "var", 1, True)
    np.testing.assert_allclose(out, x.var(axis=1, keepdims=True), rtol=1e-5)
    assert kinds(r)["bn_stats"] == 3 and kinds(r)["bn_aggr"] == 1


# ---- TensorE -------------------------------------------------------------------------------------------

@tilescope.kernel
def mm(a, b, out, transpose_x):
    tl.store(out, tl.copy(tl.matmul(tl.load(a), tl.load(b), transpose_x=transpose_x)))


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_matmul_with_transposed_stationary(dtype):
    a, b = rand(128, 96).astype(dtype), rand(128, 200).astype(dtype)  # a is [K, M]
    out = np.empty((96, 200), np.float32)
    r = tilescope.simulate(mm, a, b, out, True)
    np.testing.assert_allclose(out, a.astype(np.float32).T @ b.astype(np.float32), rtol=1e-5, atol=1e-4)
    assert kinds(r)["matmul"] == 1 and "transpose" not in kinds(r)


def test_matmul_transposes_x_on_tensor_engine_when_asked_for_x_at_y():
    a, b = rand(64, 128), rand(128, 100)  # a is [M, K]
    out = np.empty((64, 100), np.float32)
    r = tilescope.simulate(mm, a, b, out, False)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)
    assert kinds(r)["transpose"] == 1 and kinds(r)["matmul"] == 1


@tilescope.kernel
def k_accumulate(a, b, out):
    K = a.shape[0]
    acc = tl.zeros((a.shape[1], b.shape[1]), tl.float32, buffer=tl.psum)
    for k in tl.affine_range(K // 128):
        acc += tl.matmul(tl.load(a[k * 128:(k + 1) * 128, :]), tl.load(b[k * 128:(k + 1) * 128, :]),
                         transpose_x=True)
    tl.store(out, tl.copy(acc))


def test_psum_accumulation_starts_on_zeros_without_a_memset():
    a, b = rand(512, 128), rand(512, 256)
    out = np.empty((128, 256), np.float32)
    r = tilescope.simulate(k_accumulate, a, b, out)
    np.testing.assert_allclose(out, a.T @ b, rtol=1e-4, atol=1e-3)
    mms = [i for i in r.program.instructions if i.KIND == "matmul"]
    assert [m.accumulate for m in mms] == [False, True, True, True]
    assert "memset" not in kinds(r)


@tilescope.kernel
def tr(x, out):
    tl.store(out, tl.copy(tl.transpose(tl.load(x))))


def test_transpose():
    x = rand(96, 128)
    out = np.empty((128, 96), np.float32)
    r = tilescope.simulate(tr, x, out)
    np.testing.assert_array_equal(out, x.T)
    assert kinds(r)["transpose"] == 1 and engines(r, "transpose") == {"pe"}


# ---- where, copy, fills, assignment -------------------------------------------------------------------

@tilescope.kernel
def where_k(c, x, y, out):
    cond, a, b = tl.load(c) > 0, tl.load(x), tl.load(y)
    tl.store(out[0], tl.where(cond, a, b))
    tl.store(out[1], tl.where(cond, 5.0, b))
    tl.store(out[2], tl.where(cond, a, -1.0))
    tl.store(out[3], tl.where(cond, 2.0, -3.0))


def test_where_with_tiles_and_numbers():
    c, x, y = rand(128, 48), rand(128, 48), rand(128, 48)
    out = np.empty((4, 128, 48), np.float32)
    tilescope.simulate(where_k, c, x, y, out)
    m = c > 0
    np.testing.assert_array_equal(out[0], np.where(m, x, y))
    np.testing.assert_array_equal(out[1], np.where(m, 5.0, y))
    np.testing.assert_array_equal(out[2], np.where(m, x, -1.0))
    np.testing.assert_array_equal(out[3], np.where(m, 2.0, -3.0))


@tilescope.kernel
def casts(x, out_bf16, out_i32):
    t = tl.load(x)
    tl.store(out_bf16, tl.copy(t, dtype=tl.bfloat16))
    tl.store(out_i32, tl.load(x, dtype=tl.int32))


def test_copy_and_load_cast():
    x = rand(128, 32, lo=-100, hi=100)
    ob, oi = np.empty((128, 32), BF16), np.empty((128, 32), np.int32)
    tilescope.simulate(casts, x, ob, oi)
    np.testing.assert_array_equal(ob, x.astype(BF16))
    np.testing.assert_array_equal(oi, np.rint(x).astype(np.int32))


@tilescope.kernel
def fills(out):
    tl.store(out[0], tl.zeros((128, 16), tl.float32))
    tl.store(out[1], tl.ones((128, 16), tl.float32))
    tl.store(out[2], tl.full((128, 16), 2.5, tl.float32))
    t = tl.ndarray((128, 16), tl.float32)
    t[0:64, :] = 7.0  # only the first half is ever written
    tl.store(out[3], t)


def test_fills_and_never_written_sbuf_reads_nan():
    out = np.zeros((4, 128, 16), np.float32)
    r = tilescope.simulate(fills, out)
    assert (out[0] == 0).all() and (out[1] == 1).all() and (out[2] == 2.5).all()
    assert (out[3, :64] == 7).all() and np.isnan(out[3, 64:]).all()
    assert kinds(r)["memset"] == 4


@tilescope.kernel
def assigns(x, y, out):
    t = tl.ndarray((128, 64), tl.float32)
    t[...] = tl.load(x)                   # a fresh value: the DMA writes t directly
    tl.store(out[0], t)
    named = tl.load(y)
    u = tl.ndarray((128, 64), tl.float32)
    u[...] = named                        # a named value: a copy (it may be read again)
    named[0:1, :] = 0.0
    tl.store(out[1], u)
    tl.store(out[2], named)


def test_assignment_of_fresh_values_needs_no_copy():
    x, y = rand(128, 64), rand(128, 64)
    out = np.empty((3, 128, 64), np.float32)
    r = tilescope.simulate(assigns, x, y, out)
    np.testing.assert_array_equal(out[0], x)
    np.testing.assert_array_equal(out[1], y)
    np.testing.assert_array_equal(out[2, 1:], y[1:])
    assert (out[2, 0] == 0).all()
    assert kinds(r)["tensor_copy"] == 1


@tilescope.kernel
def inplace(x, out):
    t = tl.load(x)
    t += 1.0
    t *= 2.0
    t -= tl.load(x)
    t[0:64, :] /= 4.0
    tl.store(out, t)


def test_in_place_operators():
    x = rand(128, 32)
    out = np.empty_like(x)
    tilescope.simulate(inplace, x, out)
    expect = (x + 1) * 2 - x
    expect[:64] /= 4
    np.testing.assert_allclose(out, expect, rtol=1e-6)


# ---- layouts and indexing ---------------------------------------------------------------------------------

@tilescope.kernel
def blocks(x, out):
    n = x.shape[0] // 128
    tiles = tl.ndarray((n, tl.par_dim(128), x.shape[1]), tl.float32)
    for k in tl.affine_range(n):
        tiles[k] = tl.load(x[k * 128:(k + 1) * 128, :])
    total = tl.zeros((128, x.shape[1]), tl.float32)
    for k in tl.sequential_range(n):
        total += tiles[k]
    tl.store(out, total)


def test_block_dimensions_before_the_partition_dim():
    x = rand(4 * 128, 48)
    out = np.empty((128, 48), np.float32)
    r = tilescope.simulate(blocks, x, out)
    np.testing.assert_allclose(out, x.reshape(4, 128, 48).sum(axis=0), rtol=1e-5)
    buf = [b for b in r.program.buffers.values() if b.name.startswith("ndarray")]
    assert buf and buf[0].shape == (128, 4, 48)  # stored partition-major


@tilescope.kernel
def strided(boxes, out_hbm_strided, out_sbuf_strided):
    n = boxes.shape[1] // 4
    i_p = tl.arange(128)[:, None]
    i = tl.arange(n)[None, :]
    x2 = tl.load(boxes[i_p, 4 * i + 2])          # strided HBM access: every 4th element from 2
    tl.store(out_hbm_strided, x2)
    t = tl.load(boxes)
    tl.store(out_sbuf_strided, t[i_p, 4 * i + 3])  # strided SBUF view


def test_strided_4i_plus_k_indexing_in_hbm_and_sbuf():
    b = rand(128, 4 * 50)
    o1, o2 = np.empty((128, 50), np.float32), np.empty((128, 50), np.float32)
    r = tilescope.simulate(strided, b, o1, o2)
    np.testing.assert_array_equal(o1, b[:, 2::4])
    np.testing.assert_array_equal(o2, b[:, 3::4])
    load = r.program.instructions[0]
    assert load.src.dims == ((200, 128), (4, 50)) and load.src.offset == 2


@tilescope.kernel
def masked(x, out):
    i_p, i_f = tl.mgrid[0:128, 0:64]
    t = tl.load(x[i_p, i_f], mask=(i_f < 40))
    y = tl.exp(t, mask=(i_p >= 64) & (i_p < 96) & (i_f < 40))  # 32 partitions may start at 64
    tl.store(out[i_p, i_f], y, mask=(i_p >= 64) & (i_p < 96) & (i_f < 40))


def test_masks_narrow_every_access():
    x = rand(128, 64)
    out = np.zeros_like(x)
    r = tilescope.simulate(masked, x, out)
    np.testing.assert_allclose(out[64:96, :40], np.exp(x[64:96, :40]), rtol=1e-6)
    assert (out[:64] == 0).all() and (out[96:] == 0).all() and (out[:, 40:] == 0).all()
    act = next(i for i in r.program.instructions if i.KIND == "activation")
    assert act.src.partitions == 32 and act.src.free_size == 40 and act.src.offset == 64 * 64


@tilescope.kernel
def hbm_views(g, out):
    d = g.shape[0]
    rows = tl.load(g.reshape((1, d)).broadcast_to((128, d)))   # one row into every partition
    out[...] = rows                                            # setitem on HBM = store


def test_broadcast_hbm_view_and_store_by_assignment():
    g = rand(40)
    out = np.empty((128, 40), np.float32)
    tilescope.simulate(hbm_views, g, out)
    np.testing.assert_array_equal(out, np.broadcast_to(g, (128, 40)))


# ---- grids, printing, isa -------------------------------------------------------------------------------------

@tilescope.kernel
def per_program(x):
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.shared_hbm)
    i = tl.program_id(0)
    n = tl.num_programs(0)
    rows = x.shape[0] // n
    t = tl.load(x[i * rows:(i + 1) * rows, :])
    tl.store(out[i * rows:(i + 1) * rows, :], t * float(i + 1))
    return out


def test_launch_grid_program_ids_share_hbm_outputs():
    x = rand(4 * 128, 16)
    r = tilescope.simulate(per_program, x, grid=4)
    expect = x * np.repeat(np.arange(1, 5, dtype=np.float32), 128)[:, None]
    np.testing.assert_allclose(r.value, expect, rtol=1e-6)
    r2 = tilescope.simulate(per_program[4], x)
    assert r2.program is r.program


@tilescope.kernel
def prints(x):
    t = tl.load(x)
    tl.device_print("t =", t[0:2, :])
    t[...] = t * 10.0
    tl.device_print("after:", t[0:1, :])
    tl.store(x, t)


def test_device_print_shows_values_at_that_point(capsys):
    x = np.arange(128 * 3, dtype=np.float32).reshape(128, 3)
    tilescope.simulate(prints, x.copy())
    text = capsys.readouterr().out
    assert "t = [[0. 1. 2.]\n [3. 4. 5.]]" in text
    assert "after: [[ 0. 10. 20.]]" in text


COUNTS: list[int] = []


@tilescope.kernel
def isa_calls(x):
    ctx = current()
    t = tl.load(x)
    s = tl.ndarray((128, 1), tl.float32)
    calls = [
        lambda: nisa.activation(tl.exp, t, scale=0.5, bias=1.0),
        lambda: nisa.activation_reduce(np.exp, t, reduce_op=np.add, reduce_res=s),
        lambda: nisa.tensor_tensor(t, t, np.multiply),
        lambda: nisa.tensor_scalar(t, np.multiply, 2.0, op1=np.add, operand1=s),
        lambda: nisa.tensor_reduce(np.max, t, axis=1, negate=True),
        lambda: nisa.tensor_copy(t, dtype=tl.bfloat16, engine="scalar"),
        lambda: nisa.iota(tl.arange(128)[:, None] * 4 + tl.arange(8)[None, :], tl.int32),
        lambda: nisa.memset((128, 8), 3.0, tl.float32, engine="gpsimd"),
        lambda: nisa.bn_stats(t),
        lambda: nisa.bn_aggr(nisa.bn_stats(t)),
        lambda: nisa.select(t > 0, t, 0.0),
        lambda: nisa.nc_matmul(t[:, 0:64], t),
        lambda: nisa.nc_transpose(t),
        lambda: nisa.dma_copy(dst=x[0:64, :], src=t[0:64, :]),
    ]
    for call in calls:
        before = ctx.b.instruction_count
        call()
        COUNTS.append(ctx.b.instruction_count - before)


def test_each_isa_call_emits_exactly_one_instruction():
    COUNTS.clear()
    tilescope.simulate(isa_calls, rand(128, 128))
    # bn_aggr(bn_stats(t)) is two calls; select(t > 0, ...) computes t > 0 first
    assert COUNTS == [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 1, 1, 1]


@tilescope.kernel
def isa_values(x, out):
    t = tl.load(x)
    s = tl.ndarray((128, 1), tl.float32)
    e = nisa.activation_reduce(tl.exp, t, reduce_op=np.add, reduce_res=s, scale=0.5)
    tl.store(out[0], e)
    tl.store(out[1], nisa.tensor_scalar(t, np.subtract, s, reverse0=True))
    tl.store(out[2], nisa.iota(tl.arange(128)[:, None] * 2 + tl.arange(16)[None, :] * 3 + 1, tl.float32))
    tl.store(out[3], nisa.tensor_reduce(np.max, t, axis=1, negate=True, keepdims=True).broadcast_to((128, 16)))


def test_isa_call_values():
    x = rand(128, 16)
    out = np.empty((4, 128, 16), np.float32)
    tilescope.simulate(isa_values, x, out)
    e = np.exp(0.5 * x)
    np.testing.assert_allclose(out[0], e, rtol=1e-6)
    np.testing.assert_allclose(out[1], e.sum(axis=1, keepdims=True) - x, rtol=1e-5)
    np.testing.assert_array_equal(out[2], np.arange(128)[:, None] * 2 + np.arange(16)[None, :] * 3 + 1)
    np.testing.assert_array_equal(out[3], np.broadcast_to(-x.max(axis=1, keepdims=True), (128, 16)))


def test_provenance_is_the_kernel_line():
    r = tilescope.simulate(unary, rand(128, 8), np.empty((128, 8), np.float32), "exp")
    act = next(k for k, i in enumerate(r.program.instructions) if i.KIND == "activation")
    prov = r.program.prov_of(act)
    assert prov.file.endswith("test_lang_ops.py") and prov.label == "tl.exp" and prov.op == "unary"
    import inspect

    lines, start = inspect.getsourcelines(unary.fn)
    assert prov.line == start + 2


@tilescope.kernel
def mixed_dtypes(h, i, out_h, out_i):
    a = tl.load(h)                          # float16
    tl.store(out_h, tl.sigmoid(a) * 2.0)    # stays float16
    n = tl.load(i)                          # int32
    tl.store(out_i, n * 3 + 1)              # integer arithmetic, int32 result


def test_float16_and_int32_tiles():
    h = rand(128, 40).astype(np.float16)
    i = RNG.integers(-1000, 1000, (128, 40)).astype(np.int32)
    out_h, out_i = np.empty_like(h), np.empty_like(i)
    tilescope.simulate(mixed_dtypes, h, i, out_h, out_i)
    expect = (1 / (1 + np.exp(-h.astype(np.float32)))).astype(np.float16).astype(np.float32) * 2
    np.testing.assert_allclose(out_h.astype(np.float32), expect, rtol=2e-3)
    np.testing.assert_array_equal(out_i, i * 3 + 1)


@tilescope.kernel
def isa_engines(x):
    t = tl.load(x)
    nisa.tensor_scalar(t, np.add, 1.0, engine="scalar")
    nisa.tensor_tensor(t, t, "maximum", engine="gpsimd")
    nisa.tensor_copy(t, engine=nisa.engine.gpsimd)
    nisa.tensor_reduce("add", t, axis=1)
    tl.store(x, t)


def test_isa_calls_run_on_the_named_engine():
    r = tilescope.simulate(isa_engines, rand(128, 32))
    got = [(i.KIND, i.engine) for i in r.program.instructions if i.KIND != "dma_copy"]
    assert got == [("tensor_scalar", "act"), ("tensor_tensor", "pool"), ("tensor_copy", "pool"),
                   ("tensor_reduce", "dve")]
    with pytest.raises(tilescope.errors.KernelError, match="runs on vector, gpsimd; got engine='tensor'"):
        tilescope.simulate(tilescope.kernel(lambda x: nisa.tensor_tensor(tl.load(x), tl.load(x), np.add,
                                                                         engine="tensor")), rand(128, 4))


def _same(t):
    return t


@tilescope.kernel
def function_returns_a_named_tile(x, out):
    u = tl.exp(tl.load(x))
    t = tl.ndarray(u.shape, u.dtype)
    t[...] = _same(u)          # a call, but its value is the named tile u: copied, u stays valid
    tl.store(out[0], t)
    tl.store(out[1], u)


def test_assigning_a_call_that_returns_an_existing_tile_copies():
    x = rand(128, 16)
    out = np.empty((2, 128, 16), np.float32)
    r = tilescope.simulate(function_returns_a_named_tile, x, out)
    np.testing.assert_allclose(out[0], np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(out[1], np.exp(x), rtol=1e-6)
    assert kinds(r)["tensor_copy"] == 1


@tilescope.kernel
def masked_mean(x, out):
    i_p, i_f = tl.mgrid[0:128, 0:64]
    tl.store(out, tl.mean(tl.load(x), axis=1, keepdims=True, mask=(i_f < 40)))


def test_mean_under_a_mask_divides_by_the_masked_count():
    x = rand(128, 64)
    out = np.empty((128, 1), np.float32)
    tilescope.simulate(masked_mean, x, out)
    np.testing.assert_allclose(out, x[:, :40].mean(axis=1, keepdims=True), rtol=1e-5)
