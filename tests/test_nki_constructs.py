"""Each NKI construct tilescope.nki provides, in a small kernel written in NKI's documented
style, checked against numpy -- and, where it matters, against the instructions and engines
it must emit (every one priced by the device model)."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import tilescope
import tilescope.nki as nki
import tilescope.nki.compiler as ncc
import tilescope.nki.isa as nisa
import tilescope.nki.language as nl
import tilescope.nki.typing as nt
from tilescope.errors import CapacityError, KernelError

HERE = os.path.basename(__file__)
RNG = np.random.default_rng(0)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def program(kernel, *args, **kwargs):
    """The traced Program of an NKI kernel (to look at the instructions it emits)."""
    return tilescope.simulate(kernel.kernel, *args, **kwargs).program


def kinds(prog) -> list[tuple[str, str]]:
    return [(i.KIND, i.engine) for i in prog.instructions]


def line_of(fn, marker: str = "# <- error") -> int:
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(k for k, text in enumerate(lines) if marker in text)


# ---- indexing and data movement -------------------------------------------------------------

@nki.jit
def ds_rows(x):
    out = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out[nl.ds(0, 64), :], nl.load(x[nl.ds(64, 64), :]))
    nl.store(out[nl.ds(64, 64), :], nl.load(x[nl.ds(0, 64), :]))
    return out


def test_ds_is_a_start_and_size_slice():
    x = f32(128, 16)
    np.testing.assert_array_equal(ds_rows(x), np.concatenate([x[64:], x[:64]]))


@nki.jit
def transpose_by_dma(x):
    F, P = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load_transpose2d(x))
    return out


@nki.jit
def copy_by_dma(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


def test_load_transpose2d_transposes_on_the_dma_and_pays_per_element():
    x = f32(64, 128)
    np.testing.assert_array_equal(transpose_by_dma(x), x.T)
    t = tilescope.simulate(transpose_by_dma.kernel, x).summary.total_ns
    plain = tilescope.simulate(copy_by_dma.kernel, x.T.copy()).summary.total_ns
    assert t > 2 * plain  # 4-byte chunks cost the DMA far more than 256-byte rows (modeled)


@nki.jit
def store_psum_as_bf16(a, b):
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    acc = nisa.nc_matmul(nl.load(a), nl.load(b))   # fp32 in PSUM
    nl.store(out, acc)                               # PSUM -> SBUF copy, then a casting DMA
    return out


def test_store_from_psum_copies_to_sbuf_and_casts():
    a, b = f32(128, 32), f32(128, 64)
    got = store_psum_as_bf16(a, b)
    assert got.dtype == ml_dtypes.bfloat16
    ref = (a.T @ b).astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=1e-2, atol=1e-2)
    k = kinds(program(store_psum_as_bf16, a, b))
    assert ("tensor_copy", "dve") in k and k[-1] == ("dma_copy", "dma")


@nki.jit
def store_cast(x):
    out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


def test_store_casts_on_the_dma():
    x = f32(128, 32)
    np.testing.assert_array_equal(store_cast(x), x.astype(ml_dtypes.bfloat16))
    assert kinds(program(store_cast, x)) == [("dma_copy", "dma"), ("dma_copy", "dma")]


@nki.jit
def dma_cast_dst(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)                       # current API: the DMA converts
    nisa.dma_copy(dst=out, src=t)
    return out


def test_dma_copy_converts_dtypes():
    x = f32(128, 16)
    np.testing.assert_array_equal(dma_cast_dst(x), x.astype(ml_dtypes.bfloat16).astype(np.float32))


@nki.jit
def const_add(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    c = nl.shared_constant(np.arange(x.shape[1], dtype=np.float32).reshape(1, -1).repeat(128, 0))
    nl.store(out, nl.add(nl.load(x), nl.load(c)))
    return out


def test_shared_constant_is_an_hbm_tensor_with_its_values():
    x = f32(128, 8)
    np.testing.assert_array_equal(const_add(x), x + np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal(const_add(x), x + np.arange(8, dtype=np.float32))  # cached trace: fed again


# ---- broadcasting, views, PSUM blocks ----------------------------------------------------------

@nki.jit
def add_row(x, row):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    r = nl.load(row)                                  # (1, n)
    nl.store(out, nl.add(nl.load(x), r))              # broadcast across partitions
    out2 = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out2, nl.broadcast_to(r, shape=x.shape))
    return out, out2


def test_a_one_partition_tile_broadcasts_across_partitions_on_tensore():
    x, row = f32(128, 700), f32(1, 700)
    a, b = add_row(x, row)
    np.testing.assert_array_equal(a, x + row)
    np.testing.assert_array_equal(b, np.broadcast_to(row, x.shape))
    k = kinds(program(add_row, x, row))
    assert k.count(("matmul", "pe")) == 4  # 700 columns: two 512-wide passes per broadcast


@nki.jit
def reduce_into_columns(x):
    out = nl.ndarray((x.shape[0], 3), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    cols = nl.ndarray((x.shape[0], 3), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=cols[:, 0:1], op=nl.add, data=t, axis=1)     # current form into a view
    cols[:, 1] = nl.max(t, axis=1)                                      # assignment into a (P, 1) view
    cols[:, 2:3] = nisa.tensor_reduce(np.min, t, axis=1, keepdims=True)
    nl.store(out, cols)
    return out


def test_reductions_write_into_p1_views():
    x = f32(128, 40)
    got = reduce_into_columns(x)
    np.testing.assert_allclose(got, np.stack([x.sum(1), x.max(1), x.min(1)], axis=1), rtol=1e-5, atol=1e-5)
    assert [k for k, _ in kinds(program(reduce_into_columns, x))].count("tensor_copy") == 0  # no copies


@nki.jit
def psum_banks(a, b):
    out = nl.ndarray((128, 8, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    at, bt = nl.load(a), nl.load(b)
    acc = nl.ndarray((128, 8, 512), dtype=nl.float32, buffer=nl.psum)    # all eight banks
    for k in nl.affine_range(8):
        nisa.nc_matmul(dst=acc[:, k, :], stationary=at, moving=nl.multiply(bt, float(k + 1)))
    nl.store(out, acc)
    return out


def test_a_psum_tensor_may_span_banks():
    a, b = f32(64, 128), f32(64, 512)
    got = psum_banks(a, b)
    for k in range(8):
        np.testing.assert_allclose(got[:, k, :], (k + 1) * (a.T @ b), rtol=1e-4, atol=1e-3)
    prog = program(psum_banks, a, b)
    (slot,) = [s for s in prog.slots.values() if s.memory == "psum"]
    assert slot.nbytes == 8 * 2048


@nki.jit
def two_full_psum(a, b):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    at, bt = nl.load(a), nl.load(b)
    p1 = nl.ndarray((128, 8, 512), dtype=nl.float32, buffer=nl.psum)
    p2 = nl.ndarray((128, 8, 512), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=p1[:, 0, :], stationary=at, moving=bt)
    nisa.nc_matmul(dst=p2[:, 0, :], stationary=at, moving=bt)
    nl.store(out, nl.add(p1[:, 0, :], p2[:, 0, :]))
    return out


def test_psum_over_eight_banks_fails_with_the_banks_counted():
    with pytest.raises(CapacityError, match="live tiles need 16 banks, the limit is 8 banks"):
        two_full_psum(f32(64, 128), f32(64, 512))


@nki.jit
def matmul_accumulate(a, b):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(a.shape[0] // 128):
        nisa.nc_matmul(dst=acc, stationary=nl.load(a[k * 128:(k + 1) * 128, :]),
                       moving=nl.load(b[k * 128:(k + 1) * 128, :]))             # accumulates after the first
    first = nl.copy(acc)
    nisa.nc_matmul(dst=acc, stationary=nl.load(a[0:128, :]), moving=nl.load(b[0:128, :]))  # read since: overwrites
    nl.store(out, nl.add(first, acc))
    return out


def test_nc_matmul_dst_infers_accumulation_groups():
    a, b = f32(384, 128), f32(384, 512)
    np.testing.assert_allclose(matmul_accumulate(a, b), a.T @ b + a[:128].T @ b[:128], rtol=1e-4, atol=1e-3)
    flags = [i.accumulate for i in program(matmul_accumulate, a, b).instructions if i.KIND == "matmul"]
    assert flags == [False, True, True, False]


# ---- ISA instructions ------------------------------------------------------------------------------

@nki.jit
def causal_old(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:x.shape[0], 0:x.shape[1]]
    nl.store(out, nisa.affine_select(pred=(i_p - i_f >= 0), on_true_tile=nl.load(x), on_false_value=-1.0))
    return out


@nki.jit
def causal_new(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    # keep where p - i >= 0: offset 0, channel_multiplier 1, pattern [[-1, n]]
    nisa.affine_select(dst=r, pattern=[[-1, x.shape[1]]], channel_multiplier=1, on_true_tile=t,
                       on_false_value=-1.0, cmp_op=nl.greater_equal)
    nl.store(out, r)
    return out


def test_affine_select_both_forms_on_gpsimd():
    x = f32(128, 96)
    ref = np.where(np.tril(np.ones((128, 96), bool)), x, -1.0)
    np.testing.assert_array_equal(causal_old(x), ref)
    np.testing.assert_array_equal(causal_new(x), ref)
    assert ("affine_select", "pool") in kinds(program(causal_old, x))


def scan_ref(a, b, init):
    out, prev = np.empty_like(a), init
    for i in range(a.shape[1]):
        prev = a[:, i] * prev + b[:, i]
        out[:, i] = prev
    return out


@nki.jit
def scan_both(a, b, init):
    out1 = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    out2 = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    at, bt, it = nl.load(a), nl.load(b), nl.load(init)
    nl.store(out1, nisa.tensor_tensor_scan(at, bt, it, np.multiply, np.add))          # neuronxcc form
    r = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor_scan(dst=r, data0=at, data1=bt, initial=0.0, op0=nl.multiply, op1=nl.add)
    nl.store(out2, r)
    return out1, out2


def test_tensor_tensor_scan_both_forms():
    a, b, init = RNG.uniform(0.5, 1.0, (128, 50)).astype(np.float32), f32(128, 50), f32(128, 1)
    o1, o2 = scan_both(a, b, init)
    np.testing.assert_allclose(o1, scan_ref(a, b, init[:, 0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o2, scan_ref(a, b, np.zeros(128, np.float32)), rtol=1e-5, atol=1e-5)
    assert ("tensor_tensor_scan", "dve") in kinds(program(scan_both, a, b, init))


@nki.jit
def scalar_reduce(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    sums = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    s = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
    y = nisa.tensor_scalar_reduce(data=t, op0=np.multiply, operand0=2.0, reduce_op=np.add, reduce_res=s[:, 0:1])
    z = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst=z, data=y, op0=nl.add, operand0=1.0, reduce_op=nl.max, reduce_res=s[:, 1:2])
    nl.store(out, z)
    nl.store(sums, s)
    return out, sums


def test_tensor_scalar_reduce_both_forms():
    x = f32(128, 30)
    out, sums = scalar_reduce(x)
    np.testing.assert_allclose(out, 2 * x + 1, rtol=1e-6)
    np.testing.assert_allclose(sums[:, 0], (2 * x).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sums[:, 1], (2 * x + 1).max(1), rtol=1e-6)


@nki.jit
def recip(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    r = nisa.reciprocal(t)
    nisa.reciprocal(dst=r, data=r)
    nl.store(out, nisa.reciprocal(r))
    return out


def test_reciprocal_on_vectore_at_eight_cycles_per_element():
    x = RNG.uniform(1, 2, (128, 1024)).astype(np.float32)
    np.testing.assert_allclose(recip(x), 1 / x, rtol=1e-6)
    prog = program(recip, x)
    assert kinds(prog)[1:4] == [("reciprocal", "dve")] * 3
    from tilescope.isa import engine_cycles
    from tilescope.spec import preset

    assert engine_cycles(prog.instructions[1], preset("trn1")) >= 8 * 1024


@nki.jit
def reduce_registers(x):
    out = nl.ndarray((x.shape[0], 3), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    res = nl.ndarray((x.shape[0], 3), dtype=nl.float32, buffer=nl.sbuf)
    e = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    half = x.shape[1] // 2
    nisa.activation(dst=e[:, :half], op=nl.exp, data=t[:, :half], reduce_op=nl.add,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)                    # registers = sum(first half)
    nisa.activation(dst=e[:, half:], op=nl.exp, data=t[:, half:], reduce_op=nl.add,
                    reduce_res=res[:, 0:1], reduce_cmd=nisa.reduce_cmd.reduce)  # += second half, read out
    nisa.activation(dst=e, op=nl.copy, data=t, reduce_res=res[:, 1:2], reduce_cmd=nisa.reduce_cmd.idle)
    nisa.activation(dst=e, op=nl.copy, data=t, reduce_res=res[:, 2:3], reduce_cmd=nisa.reduce_cmd.reset)
    nl.store(out, res)
    return out


def test_activation_reduce_cmd_keeps_scalare_registers_across_instructions():
    x = f32(128, 64)
    got = reduce_registers(x)
    total = np.exp(x).sum(1)
    np.testing.assert_allclose(got[:, 0], total, rtol=1e-5)
    np.testing.assert_allclose(got[:, 1], total, rtol=1e-5)  # idle: unchanged
    np.testing.assert_array_equal(got[:, 2], 0.0)  # reset
    k = kinds(program(reduce_registers, x))
    assert k.count(("activation_reduce", "act")) == 2 and ("tensor_copy", "act") in k


@nki.jit
def activation_reduce_old(x):
    out = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    s = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(np.square, nl.load(x), reduce_op=np.add, reduce_res=s)
    nl.store(out, s)
    return out


def test_activation_with_reduce_op_old_form():
    x = f32(128, 20)
    np.testing.assert_allclose(activation_reduce_old(x)[:, 0], (x * x).sum(1), rtol=1e-5)


@nki.jit
def engines(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    a = nisa.tensor_scalar(t, np.add, 1.0, engine=nisa.gpsimd_engine)
    b = nisa.tensor_scalar(a, np.multiply, 2.0, engine=nisa.engine.scalar)
    c = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=c, data1=a, data2=b, op=nl.subtract, engine=nisa.vector_engine)
    nl.store(out, c)
    return out


def test_engine_selectors_pick_the_engine():
    x = f32(128, 16)
    np.testing.assert_allclose(engines(x), (x + 1) - 2 * (x + 1), rtol=1e-6)
    assert [e for _, e in kinds(program(engines, x))][1:4] == ["pool", "act", "dve"]


@nki.jit
def iota_pattern(x):
    out = nl.ndarray((128, 6), dtype=nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 6), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(t, pattern=[[10, 2], [1, 3]], offset=5, channel_multiplier=100)
    nl.store(out, t)
    return out


def test_iota_current_form():
    got = iota_pattern(f32(1, 1))
    ref = 5 + 100 * np.arange(128)[:, None] + (10 * np.arange(2)[:, None] + np.arange(3)[None, :]).reshape(1, 6)
    np.testing.assert_array_equal(got, ref)


# ---- dtypes, grids, decorators ---------------------------------------------------------------------

@nki.jit
def dtype_checks(x):
    assert x.dtype == np.float32 and x.dtype == nl.float32 and nl.float32 == "float32"
    out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    m = nl.full(x.shape, nl.fp32.min, dtype=nl.float32)
    nl.store(out, nl.maximum(nl.load(x), m))
    return out


def test_dtype_aliases():
    x = f32(128, 8)
    np.testing.assert_array_equal(dtype_checks(x), x.astype(ml_dtypes.bfloat16))
    assert nl.fp32.min == np.finfo(np.float32).min and nisa.fp32.max == np.finfo(np.float32).max


@nki.jit
def grid_rows(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i, j = nl.program_id(0), nl.program_id(axis=1)
    n = nl.num_programs(1)
    tile = nl.load(x[i * 128:(i + 1) * 128, j * 16:(j + 1) * 16])
    nl.store(out[i * 128:(i + 1) * 128, j * 16:(j + 1) * 16], nl.add(tile, float(i * n + j)))
    assert nl.program_ndim() == 2
    return out


def test_spmd_grid_called_directly():
    x = f32(256, 48)
    ref = x + (np.arange(2)[:, None] * 3 + np.arange(3)[None, :]).repeat(128, 0).repeat(16, 1).astype(np.float32)
    np.testing.assert_array_equal(grid_rows[2, 3](x), ref)
    np.testing.assert_array_equal(grid_rows[nl.nc(2), nl.spmd_dim(3)](x), ref)


def test_decorators_and_runners():
    x = f32(128, 8)

    @nki.benchmark(warmup=2, iters=5)
    def bench_me(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.exp(nl.load(a)))
        return out

    bench_me(x)
    us = tilescope.simulate(bench_me.kernel, x).summary.total_us
    assert bench_me.benchmark_result.nc_latency.get_latency_percentile(99) == pytest.approx(us)
    # nt.tensor placeholders: timed (modeled) without values
    bench_me(nt.tensor[[128, 8], nl.float32])
    assert bench_me.benchmark_result.nc_latency.get_latency_percentile(50) == pytest.approx(us)

    raw = bench_me.fn
    np.testing.assert_allclose(nki.simulate_kernel(raw, x), np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(nki.simulate(nki.jit(raw))(x), np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(nki.baremetal(raw)(x), np.exp(x), rtol=1e-6)
    import torch

    t = nki.jit(raw)(torch.from_numpy(x))
    assert isinstance(t, torch.Tensor) and torch.allclose(t, torch.exp(torch.from_numpy(x)))


def test_profile_decorator_writes_a_profile(tmp_path):
    from tilescope.profiler import read_profile

    @nki.profile(working_directory=str(tmp_path), save_neff_name="file.neff")
    def prof(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out

    prof(f32(128, 8))
    (found,) = list(tmp_path.glob("*/*/manifest.json"))
    read_profile(found.parent).require_complete()


@ncc.skip_middle_end_transformations
@nki.jit
def manual_alloc(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,)))
    t[...] = nl.load(x)
    nl.store(out, t)
    return out


def test_compiler_directives_are_accepted():
    x = f32(128, 8)
    np.testing.assert_array_equal(manual_alloc(x), x)
    assert nt.tensor[128, 512].shape == (128, 512)


# ---- the top-8 search (max8, nc_find_index8, nc_match_replace8) and scalar_tensor_tensor -----------

@nki.jit
def top8_neuronxcc(x):
    vals = nl.ndarray((x.shape[0], 8), dtype=x.dtype, buffer=nl.shared_hbm)
    idx = nl.ndarray((x.shape[0], 8), dtype=nl.uint32, buffer=nl.shared_hbm)
    t = nl.load(x)
    m = nisa.max8(src=t)
    nl.store(vals, m)
    nl.store(idx, nisa.nc_find_index8(data=t, vals=m))
    return vals, idx


@nki.jit
def top16_current(x):
    vals = nl.ndarray((x.shape[0], 16), dtype=x.dtype, buffer=nl.shared_hbm)
    idx = nl.ndarray((x.shape[0], 16), dtype=nl.uint32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    v = nl.ndarray((x.shape[0], 16), dtype=x.dtype, buffer=nl.sbuf)
    i = nl.ndarray((x.shape[0], 16), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    for r in nl.static_range(2):  # 8 at a time: find them, then knock them out
        nisa.max8(dst=v[:, r * 8:(r + 1) * 8], src=t)
        nisa.nc_match_replace8(dst=t, data=t, vals=v[:, r * 8:(r + 1) * 8], imm=-np.inf,
                               dst_idx=i[:, r * 8:(r + 1) * 8])
    nisa.dma_copy(dst=vals, src=v)
    nisa.dma_copy(dst=idx, src=i)
    return vals, idx


def test_max8_and_find_index8_give_the_top_8_and_their_positions():
    x = f32(128, 1000)
    v, i = top8_neuronxcc(x)
    order = np.argsort(-x, axis=1, kind="stable")
    np.testing.assert_array_equal(v, np.take_along_axis(x, order[:, :8], axis=1))
    assert i.dtype == np.uint32
    np.testing.assert_array_equal(i, order[:, :8])
    prog = program(top8_neuronxcc, x)
    assert [k for k in kinds(prog) if k[0] != "dma_copy"] == [("max8", "dve"), ("find_index8", "dve")]
    # [isa] each reads the data once: N = 1000 VectorE cycles (plus the engine's access bubble)
    from tilescope.isa import engine_cycles

    spec = tilescope.spec.preset("trn1")
    assert [engine_cycles(i, spec) for i in prog.instructions if i.engine == "dve"] == \
        [spec.vector.access_cycles + 1000] * 2


def test_match_replace8_rounds_give_the_top_16():
    x = f32(64, 300)
    v, i = top16_current(x)
    order = np.argsort(-x, axis=1, kind="stable")
    np.testing.assert_array_equal(v, np.take_along_axis(x, order[:, :16], axis=1))
    np.testing.assert_array_equal(np.take_along_axis(x, i.astype(np.int64), axis=1), v)


@nki.jit
def find_absent(x, probes):
    out = nl.ndarray((x.shape[0], 8), dtype=nl.uint32, buffer=nl.shared_hbm)
    nl.store(out, nisa.nc_find_index8(data=nl.load(x), vals=nl.load(probes)))
    return out


def test_find_index8_first_occurrence_and_the_sentinel_for_an_absent_value():
    x = np.tile(np.arange(16, dtype=np.float32), (128, 2))  # every value twice
    probes = np.tile(np.array([3, 15, 0, 7, 99, 3, 1, 2], np.float32), (128, 1))
    got = find_absent(x, probes)
    np.testing.assert_array_equal(got[0], [3, 15, 0, 7, 0xFFFFFFFF, 3, 1, 2])


@nki.jit
def stt_neuronxcc(x, y, s):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    r = nisa.scalar_tensor_tensor(data=nl.load(x), op0=np.subtract, operand0=nl.load(s), op1=np.multiply,
                                  operand1=nl.load(y))
    nl.store(out, r)
    return out


@nki.jit
def stt_current(x, y):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    nisa.dma_copy(dst=b, src=y)
    nisa.scalar_tensor_tensor(dst=r, data=a, op0=nl.multiply, operand0=2.0, op1=nl.subtract, operand1=b,
                              reverse1=True)
    nisa.dma_copy(dst=out, src=r)
    return out


@pytest.mark.parametrize("dtype, per_element", [(np.float32, 2), (ml_dtypes.bfloat16, 1)])
def test_scalar_tensor_tensor_is_one_vector_instruction(dtype, per_element):
    x, y, s = f32(128, 512), f32(128, 512), f32(128, 1)
    np.testing.assert_allclose(stt_neuronxcc(x, y, s), (x - s) * y, rtol=1e-6)
    np.testing.assert_allclose(stt_current(x, y), y - 2 * x, rtol=1e-6)
    prog = program(stt_neuronxcc, x.astype(dtype), y.astype(dtype), s)
    (stt,) = [i for i in prog.instructions if i.KIND != "dma_copy"]
    assert stt.KIND == "scalar_tensor_tensor" and stt.engine == "dve"
    # [isa] 2N cycles; N for bf16 data and operand1 with subtract then multiply (N even)
    from tilescope.isa import engine_cycles

    spec = tilescope.spec.preset("trn1")
    assert engine_cycles(stt, spec) == spec.vector.access_cycles + per_element * 512


def test_scalar_tensor_tensor_refuses_a_per_partition_operand1():
    with pytest.raises(KernelError, match="operand1 .* must have data's shape"):
        stt_neuronxcc(f32(128, 512), f32(128, 1), f32(128, 1))


@nki.jit
def dma_transpose_neuronxcc(x):
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nisa.dma_transpose(x))
    return out


@nki.jit
def dma_transpose_current(x):
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def dma_transpose_on_chip(x):
    t = nl.load(x)
    return nisa.dma_transpose(t)  # <- error


def test_dma_transpose_of_an_hbm_matrix_is_one_dma_in_both_forms():
    x = f32(256, 128)
    for k in (dma_transpose_neuronxcc, dma_transpose_current):
        np.testing.assert_array_equal(k(x), x.T)
        assert [kind for kind, _ in kinds(program(k, x))] == ["dma_copy", "dma_copy"]
    with pytest.raises(KernelError, match="nc_transpose") as e:
        dma_transpose_on_chip(f32(128, 64))
    assert f"{HERE}:{line_of(dma_transpose_on_chip)}" in str(e.value)


def _streaming(mode):
    def body(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(x.shape[0] // 128):
            t = nl.load(x[i * 128:(i + 1) * 128, :])
            nl.store(out[i * 128:(i + 1) * 128, :], nl.multiply(t, 2.0))
        return out

    config = None if mode is None else ncc.CompileConfig(experimental_allocation_mode=mode)
    return nki.jit(body, compile_config=config) if config else nki.jit(body)


@pytest.mark.parametrize("mode, addresses", [(None, 12), (ncc.AllocationMode.RING, 12),
                                             (ncc.AllocationMode.MAX_REUSE, 1), (ncc.AllocationMode.FAST, 1)])
def test_compile_config_allocation_mode_decides_tile_addresses(mode, addresses):
    """RING (the default): a fresh address per tile until SBUF wraps (192 KiB / 16 KiB an
    iteration = 12); MAX_REUSE (and FAST, modeled as it): the best-fitting freed range."""
    x = f32(16 * 128, 2048)
    k = _streaming(mode)
    np.testing.assert_array_equal(k(x), x * 2)
    prog = program(k, x)
    sites: dict = {}
    for slot in prog.slots.values():
        sites.setdefault(slot.site, set()).add(slot.addr)
    assert {len(a) for a in sites.values()} == {addresses}


def test_compile_config_refuses_a_mode_that_is_not_an_allocation_mode():
    with pytest.raises(TypeError, match="AllocationMode"):
        ncc.CompileConfig(experimental_allocation_mode="RING")


# ---- what tilescope lacks: clear errors at the kernel line ------------------------------------------

@nki.jit
def uses_gather(x):
    t = nl.load(x)
    g = nl.gather_flattened(t, t)  # <- error
    return g


@nki.jit
def uses_shuffle(x):
    t = nl.load(x)
    s = nisa.nc_stream_shuffle(t, t, [0] * 32)  # <- error
    return s


@nki.jit
def uses_permute(x):
    t = nl.load(x)
    p = t.permute((1, 0))  # <- error
    return p


@nki.jit
def uses_typo(x):
    t = nl.load(x)
    return nl.exponent(t)  # <- error


@pytest.mark.parametrize("kernel, words", [
    (uses_gather, ["nl.gather_flattened is not supported by tilescope", "nl.load"]),
    (uses_shuffle, ["nisa.nc_stream_shuffle is not supported by tilescope", "nl.broadcast_to"]),
    (uses_permute, ["permute() is not supported by tilescope", "nl.mgrid"]),
    (uses_typo, ["nl.exponent is not an NKI name", "did you mean nl.exp"]),
])
def test_missing_constructs_raise_at_the_kernel_line(kernel, words):
    with pytest.raises(KernelError) as e:
        kernel(f32(128, 8))
    msg = str(e.value)
    for w in words:
        assert w in msg, msg
    assert f"{HERE}:{line_of(kernel.fn)}" in msg
    tb = e.tb
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert os.path.basename(tb.tb_frame.f_code.co_filename) == HERE and tb.tb_lineno == line_of(kernel.fn)
    assert isinstance(e.value, AttributeError)  # hasattr() still works on NKI objects


def test_composite_language_functions():
    @nki.jit
    def composites(x, w):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, nl.softmax(t, axis=1))
        nl.store(out2, nl.rms_norm(t, nl.load(w).broadcast_to(x.shape), axis=1, n=x.shape[1]))
        return out, out2

    x, w = f32(128, 32), f32(1, 32)
    sm, rn = composites(x, w)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rn, x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6) * w, rtol=1e-4, atol=1e-5)
