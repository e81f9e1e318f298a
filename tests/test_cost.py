"""Cost-formula pins: each row of the cost table, computed by hand from the docs.

trn1 clocks: TensorE 2.8 GHz, VectorE 1.12 GHz, ScalarE 1.4 GHz, GpSimd 1.4 GHz;
MIN_II 64 cycles; 60 cycles of fixed SBUF/PSUM access per compute instruction.
"""

import pytest

from tilescope.isa import (
    AP, Activation, ActivationReduce, BnStats, DmaCopy, GpsimdCall, Iota, Matmul, Memset,
    Select, TensorCopy, TensorReduce, TensorScalar, TensorTensor, Transpose, dma_cost,
    dma_engines, engine_cycles, engine_ns, flops, load_stationary_cycles,
)
from tilescope.spec import preset

TRN1 = preset("trn1")


def tile(p, n, dtype="float32", name="t", stride=1):
    return AP(name, dtype, 0, ((n * stride, p), (stride, n)))


def test_tensor_tensor_fp32_is_2n_plus_access():
    t = tile(128, 512)
    assert engine_cycles(TensorTensor(t, t, t, "add"), TRN1) == 60 + 2 * 512


def test_tensor_tensor_bf16_add_is_n():
    t = tile(128, 512, "bfloat16")
    assert engine_cycles(TensorTensor(t, t, t, "add"), TRN1) == 60 + 512
    # max is not on the fast path
    assert engine_cycles(TensorTensor(t, t, t, "maximum"), TRN1) == 60 + 2 * 512


def test_small_ops_pay_min_ii():
    t = tile(128, 8)
    assert engine_cycles(TensorScalar(t, t, "add", 1.0), TRN1) == 60 + 64


def test_tensor_scalar_activation_copy_reduce_are_n():
    t, r = tile(128, 1000), tile(128, 1)
    assert engine_cycles(TensorScalar(t, t, "multiply", 3.0, "add", 1.0), TRN1) == 60 + 1000
    assert engine_cycles(Activation(t, t, "exp", scale=2.0, bias=1.0), TRN1) == 60 + 1000
    assert engine_cycles(TensorCopy(t, t), TRN1) == 60 + 1000
    assert engine_cycles(TensorReduce(r, t, "add"), TRN1) == 60 + 1000
    assert engine_cycles(Memset(t, 0.0), TRN1) == 60 + 1000
    assert engine_cycles(BnStats(tile(128, 6), tile(128, 512)), TRN1) == 60 + 512


def test_reciprocal_is_8n_and_activation_reduce_adds_min_ii():
    t, r = tile(128, 256), tile(128, 1)
    assert engine_cycles(Activation(t, t, "reciprocal"), TRN1) == 60 + 8 * 256
    assert engine_cycles(ActivationReduce(t, t, "exp", r), TRN1) == 60 + 256 + 64


def test_select_is_two_input_cost():
    t = tile(128, 300)
    assert engine_cycles(Select(t, t, t, 0.0), TRN1) == 60 + 600


def test_gpsimd_is_150_plus_n():
    t = tile(128, 512, "int32")
    assert engine_cycles(Iota(t, steps=(1,)), TRN1) == 60 + 150 + 512
    call = GpsimdCall("op", "impl", (t,), (t,), cycles=1000.0)
    assert engine_cycles(call, TRN1) == 60 + 150 + 1000


def test_strided_inner_access_halves_bandwidth():
    t = tile(128, 512, stride=8)  # 32-byte inner stride
    assert engine_cycles(TensorScalar(t, t, "add", 1.0), TRN1) == 60 + 2 * 512


def test_matmul_bf16_and_fp32():
    st = AP("a", "bfloat16", 0, ((128, 128), (1, 128)))
    mv = AP("b", "bfloat16", 0, ((512, 128), (1, 512)))
    out = AP("c", "float32", 0, ((512, 128), (1, 512)))
    mm = Matmul(out, st, mv)
    assert engine_cycles(mm, TRN1) == 512  # max(min(64, 128), 512)
    assert engine_ns(mm, TRN1) == pytest.approx(512 / 2.8)
    st32 = AP("a", "float32", 0, ((128, 128), (1, 128)))
    mv32 = AP("b", "float32", 0, ((512, 128), (1, 512)))
    assert engine_cycles(Matmul(out, st32, mv32), TRN1) == 4 * 512
    small = AP("b", "bfloat16", 0, ((16, 128), (1, 16)))
    assert engine_cycles(Matmul(AP("c", "float32", 0, ((16, 128), (1, 16))), st, small), TRN1) == 64
    assert load_stationary_cycles(mm) == 32  # 128 columns / 4
    assert flops(mm) == 2 * 128 * 128 * 512


def test_transpose_costs_a_matmul_against_identity():
    src = AP("s", "bfloat16", 0, ((64, 128), (1, 64)))
    dst = AP("d", "float32", 0, ((128, 64), (1, 128)))
    assert engine_cycles(Transpose(dst, src), TRN1) == 128  # max(min(64, 64), 128)


def test_dma_cost_large_transfer():
    # [128, 512] fp32 rows of an HBM matrix into an SBUF tile: one 2 KiB descriptor per partition
    src = AP("x", "float32", 0, ((512, 128), (1, 512)))
    dst = AP("t", "float32", 0, ((512, 128), (1, 512)))
    c = dma_cost(DmaCopy(dst, src), TRN1, "hbm", "sbuf")
    assert c.fixed_ns == 1300.0  # [dmabw] per DMA instruction, on its queue
    assert (c.nbytes, c.descriptors, c.partitions) == (128 * 512 * 4, 128, 128)
    assert (c.hbm_read, c.hbm_write) == (c.nbytes, 0)
    first, count, piece = dma_engines(c.partitions, c.descriptors, c.nbytes, 0, TRN1)
    assert (first, count) == (0, 16)  # [dmaintro] 8 partitions per engine
    # each engine: its 8 rows of 2 KiB at 17 B/ns, plus 12 ns per descriptor
    assert piece == pytest.approx(8 * 2048 / 17 + 8 * 12)


def test_sbuf_partitions_are_never_one_contiguous_run():
    # a tile whose rows happen to be adjacent in the flat buffer still has one run per partition
    x = AP("x", "float32", 0, ((2048, 128), (1, 2048)))
    t = AP("t", "float32", 0, ((2048, 128), (1, 2048)))
    assert dma_cost(DmaCopy(t, x), TRN1, "hbm", "sbuf").descriptors == 128 * 2  # 8 KiB rows: 2 packets
    # DRAM to DRAM, one contiguous MiB: 4 KiB packets [overlap] dealt to all 16 engines
    a = AP("a", "float32", 0, ((1, 262144),))
    c = dma_cost(DmaCopy(a, a), TRN1, "hbm", "hbm")
    assert (c.descriptors, c.partitions, c.hbm_read, c.hbm_write) == (256, 0, 1 << 20, 1 << 20)
    assert dma_engines(c.partitions, c.descriptors, c.nbytes, 0, TRN1)[1] == 16


def test_dma_small_chunks_pay_per_descriptor():
    # 4-byte chunks: a column of a row-major matrix, one descriptor per element
    src = AP("x", "float32", 0, ((1000, 128), (1, 1)))
    dst = AP("t", "float32", 0, ((1, 128), (1, 1)))
    c = dma_cost(DmaCopy(dst, src), TRN1, "hbm", "sbuf")
    assert c.descriptors == 128
    piece = dma_engines(c.partitions, c.descriptors, c.nbytes, 0, TRN1)[2]
    assert piece == pytest.approx(8 * 4 / 17 + 8 * 12)  # the descriptors dominate


def test_dma_engines_follow_the_partitions_touched():
    # [dmaintro] Example 1: A[4, 4096] into partitions 0..3 -- one engine
    assert tuple(map(int, dma_engines(4, 4, 32768, 0, TRN1)[:2])) == (0, 1)
    # 8 partitions starting at partition 60 straddle engines 7 and 8
    assert tuple(map(int, dma_engines(8, 8, 8192, 60, TRN1)[:2])) == (7, 2)
    # trn2: one engine moves 32 KiB at 23 B/ns (+ 8 descriptors of 4 KiB): [dmaintro] measured 1416 ns
    trn2 = preset("trn2")
    assert float(dma_engines(4, 8, 32768, 0, trn2)[2]) == pytest.approx(32768 / 23 + 8 * 12)


def test_generic_routine_cost_is_a_cost_table_row():
    """The generic lowering's GpSimd routine is priced by the cost table (an assumed one cycle
    per element per partition of its operands), not by the lowering."""
    from tilescope.isa import GENERIC_CYCLES_PER_ELEMENT, generic_routine_cycles

    assert GENERIC_CYCLES_PER_ELEMENT == 1.0
    assert generic_routine_cycles(2048) == 2048.0
