"""Property tests on random shapes: elementwise ops (with broadcasting), reductions, and
matmul tiling (ragged edges) agree with numpy."""

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilescope
import tilescope.lang as tl

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BF16 = ml_dtypes.bfloat16
OPS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
       "minimum": np.minimum, "divide": np.divide}


@tilescope.kernel
def ew(x, y, out, op, scalar):
    a, b = tl.load(x), tl.load(y)
    r = getattr(tl, op)(a, b)
    if scalar is not None:
        r = getattr(tl, op)(r, scalar)
    tl.store(out, tl.copy(r, dtype=out.dtype) if r.dtype != out.dtype else r)


@st.composite
def ew_case(draw):
    p = draw(st.integers(1, 128))
    free = tuple(draw(st.lists(st.integers(1, 16), min_size=1, max_size=3)))  # <= 16 KiB per partition
    # y broadcasts: each free dim of y is 1 or full; sometimes a per-partition scalar
    kind = draw(st.sampled_from(["same", "free_broadcast", "per_partition"]))
    if kind == "same":
        yfree = free
    elif kind == "per_partition":
        yfree = (1,)
    else:
        yfree = tuple(draw(st.sampled_from([1, n])) for n in free)
    dtype = draw(st.sampled_from([np.float32, BF16]))
    op = draw(st.sampled_from(sorted(OPS)))
    scalar = draw(st.sampled_from([None, 0.5, -3.0]))
    return p, free, yfree, dtype, op, scalar


@SETTINGS
@given(ew_case(), st.integers(0, 2**31))
def test_elementwise_with_broadcasting(case, seed):
    p, free, yfree, dtype, op, scalar = case
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 2.0, (p,) + free).astype(dtype)
    y = rng.uniform(0.5, 2.0, (p,) + yfree).astype(dtype)
    # the partition dim stays axis 0; free dims broadcast right-aligned (numpy, after axis 0)
    y_np = y.astype(np.float32).reshape((p,) + (1,) * (len(free) - len(yfree)) + yfree)
    ref = OPS[op](x.astype(np.float32), y_np)
    if scalar is not None:
        ref = OPS[op](ref, np.float32(scalar))
    out = np.empty((p,) + free, dtype)
    tilescope.simulate(ew, x, y, out, op, scalar)
    if dtype is BF16:  # results round to bf16 after every instruction
        np.testing.assert_allclose(out.astype(np.float32), ref, rtol=2e-2, atol=1e-2)
    else:
        np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


@tilescope.kernel
def red(x, out, op, axes, keepdims):
    tl.store(out, getattr(tl, op)(tl.load(x), axis=axes, keepdims=keepdims))


@SETTINGS
@given(st.integers(1, 128), st.lists(st.integers(1, 16), min_size=1, max_size=3),
       st.sampled_from(["sum", "max", "min", "mean", "var"]), st.booleans(), st.data())
def test_reductions_over_random_free_axes(p, free, op, keepdims, data):
    ndim = 1 + len(free)
    axes = tuple(sorted(data.draw(st.sets(st.integers(1, ndim - 1), min_size=1))))
    if not keepdims and len(axes) == ndim - 1:
        keepdims = True  # keep a free dim so the output is a plain [P, ...] array
    x = np.random.default_rng(p).standard_normal((p,) + tuple(free)).astype(np.float32)
    ref = getattr(np, op)(x.astype(np.float64), axis=axes, keepdims=keepdims)
    out = np.empty(ref.shape, np.float32)
    tilescope.simulate(red, x, out, op, axes, keepdims)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


@tilescope.kernel
def tiled_matmul(lhsT, rhs, out):
    """out[M, N] = lhsT[K, M].T @ rhs[K, N], any sizes: ragged edge tiles by slicing."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    TM, TK, TN = tl.tile_size.gemm_stationary_fmax, tl.tile_size.pmax, tl.tile_size.gemm_moving_fmax
    for m0 in range(0, M, TM):
        for n0 in range(0, N, TN):
            mm, nn = min(TM, M - m0), min(TN, N - n0)
            acc = tl.zeros((mm, nn), tl.float32, buffer=tl.psum)
            for k0 in range(0, K, TK):
                kk = min(TK, K - k0)
                a = tl.load(lhsT[k0:k0 + kk, m0:m0 + mm])
                b = tl.load(rhs[k0:k0 + kk, n0:n0 + nn])
                acc += tl.matmul(a, b, transpose_x=True)
            tl.store(out[m0:m0 + mm, n0:n0 + nn], tl.copy(acc, dtype=out.dtype))


@SETTINGS
@given(st.integers(1, 300), st.integers(1, 300), st.integers(1, 700), st.sampled_from([np.float32, BF16]))
def test_matmul_tiling_with_ragged_edges(k, m, n, dtype):
    rng = np.random.default_rng(k * 1000 + m)
    lhsT = rng.standard_normal((k, m)).astype(dtype)
    rhs = rng.standard_normal((k, n)).astype(dtype)
    out = np.empty((m, n), np.float32)
    r = tilescope.simulate(tiled_matmul, lhsT, rhs, out)
    ref = lhsT.astype(np.float64).T @ rhs.astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3 * np.sqrt(k))
    k_tiles, m_tiles, n_tiles = -(-k // 128), -(-m // 128), -(-n // 512)
    assert r.program.summary_counts()["matmul"] == k_tiles * m_tiles * n_tiles
    assert "memset" not in r.program.summary_counts()  # accumulation starts on the zeros


@tilescope.kernel
def masked_rows(x, out, tile):
    rows, cols = x.shape
    i_p, i_f = tl.mgrid[0:tile, 0:cols]
    for t in tl.affine_range((rows + tile - 1) // tile):
        r = t * tile + i_p
        v = tl.load(x[r, i_f], mask=(r < rows))
        tl.store(out[r, i_f], v * 3.0 - 1.0, mask=(r < rows))


@SETTINGS
@given(st.integers(1, 700), st.integers(1, 64), st.sampled_from([32, 64, 128]))
def test_masked_tiles_cover_any_row_count(rows, cols, tile):
    x = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
    out = np.full_like(x, np.nan)
    tilescope.simulate(masked_rows, x, out, tile)
    np.testing.assert_allclose(out, x * 3 - 1, rtol=1e-6, atol=1e-6)
