"""The cost table: one row per instruction kind, each formula with its source.

Sources (AWS Neuron documentation, repository ``aws-neuron/aws-neuron-sdk``):
  [isa]   "Estimated instruction cost" notes of the nki.isa API reference
          (nki.isa.nc_matmul, tensor_tensor, tensor_scalar, activation, iota, ...)
  [arch]  nki/guides/architecture/trainium_inferentia2_arch.rst
  [dmabw] nki/deep-dives/nki-dma-bandwidth-guide.rst

Engine formulas give cycles at the engine's own clock. Every compute instruction
on VectorE / ScalarE / GpSimd also pays the fixed SBUF/PSUM access latency
(``EngineSpec.access_cycles``, ~60 cycles [arch]) once. ``N`` is the number of
elements per partition of the widest operand.

>>> from tilescope.spec import preset
>>> from tilescope.isa import AP, TensorScalar
>>> x = AP("t", "float32", 0, ((512, 128), (1, 512)))
>>> engine_cycles(TensorScalar(x, x, "multiply", 2.0), preset("trn1"))
572.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..dtypes import itemsize as _itemsize
from ..spec import CoreSpec
from ._ap import AP
from ._instructions import (
    Activation, ActivationReduce, AffineSelect, BnAggr, BnStats, DmaCopy, DmaIndirect, Dropout, GpsimdCall, Instruction,
    FindIndex8, MatchReplace8, Max8, ScalarTensorTensor,
    Iota, Matmul, Memset, Reciprocal, Select, TensorCopy, TensorReduce, TensorScalar,
    TensorScalarReduce, TensorTensor, TensorTensorScan, Transpose,
)

__all__ = [
    "CostRule", "COST_TABLE", "engine_cycles", "engine_ns", "dma_cost", "flops",
    "load_stationary_cycles", "DmaCost", "dma_engines", "dma_indirect_cost", "GENERIC_CYCLES_PER_ELEMENT",
    "generic_routine_cycles", "DGE_CYCLES_PER_DESCRIPTOR", "dge_cycles", "LOCAL_GATHER_CYCLES_PER_ELEMENT",
    "local_gather_cycles",
]

_FAST_BF16_OPS = frozenset({"add", "subtract", "multiply"})
_TWO_BYTE_FLOATS = frozenset({"bfloat16", "float16"})


def _n(instr: Instruction) -> int:
    """Elements per partition of the widest operand."""
    return max(ap.free_size for ap in instr.reads() + instr.writes())


def _strided(instr: Instruction) -> int:
    """[arch] an innermost stride over 16 bytes halves engine bandwidth: factor 2."""
    return 2 if any(ap.inner_stride_bytes() > 16 for ap in instr.reads() + instr.writes()) else 1


def _tensor_tensor_per_elem(i: TensorTensor) -> int:
    # [isa] tensor_tensor reads two SBUF tensors: 2N cycles; N for bf16/fp16 add/sub/mul
    fast = i.op in _FAST_BF16_OPS and all(ap.dtype in _TWO_BYTE_FLOATS for ap in (i.dst, i.a, i.b))
    return 1 if fast else 2


def _scalar_tensor_tensor_per_elem(i: Instruction) -> int:
    # [isa] scalar_tensor_tensor: 2N cycles; N when data and operand1 are bf16, op0 subtract,
    # op1 multiply and N is even
    assert isinstance(i, ScalarTensorTensor)
    fast = (i.op0 == "subtract" and i.op1 == "multiply" and i.src.dtype == "bfloat16" and i.b.dtype == "bfloat16"
            and i.src.free_size % 2 == 0)
    return 1 if fast else 2


@dataclass(frozen=True)
class CostRule:
    """Per-element cycles of a kind (times N), an extra fixed part, and the source."""

    # (each row's functions take its own instruction class: typed Any, the table keys them)
    per_element: Callable[[Any], float]
    extra_cycles: Callable[[Any, CoreSpec], float]
    source: str


def _none(i, spec):
    return 0


COST_TABLE: dict[type, CostRule] = {
    TensorTensor: CostRule(_tensor_tensor_per_elem, _none, "[isa] tensor_tensor: 2N cycles (N for bf16 add/sub/mul)"),
    TensorScalar: CostRule(lambda i: 1, _none, "[isa] tensor_scalar: max(MIN_II, N) cycles"),
    Activation: CostRule(
        lambda i: 8 if i.func == "reciprocal" else 1, _none,
        "[isa] activation: max(MIN_II, N); scale+bias cost nothing extra; reciprocal 8N"),
    ActivationReduce: CostRule(
        lambda i: 8 if i.func == "reciprocal" else 1, lambda i, s: s.scalar.min_ii_cycles,
        "[isa] activation_reduce: activation + MIN_II"),
    TensorReduce: CostRule(lambda i: 1, _none, "[isa] tensor_reduce: max(MIN_II, N) cycles"),
    TensorCopy: CostRule(lambda i: 1, _none, "[isa] tensor_copy: max(MIN_II, N) cycles"),
    Select: CostRule(lambda i: 2, _none, "[isa] two tensor inputs, as tensor_tensor: 2N cycles"),
    Memset: CostRule(lambda i: 1, _none, "[isa] memset: max(MIN_II, N) cycles"),
    BnStats: CostRule(lambda i: 1, _none, "[isa] bn_stats: max(MIN_II, N) cycles"),
    BnAggr: CostRule(lambda i: 1, _none, "[isa] bn_aggr: max(MIN_II, N) cycles"),
    Dropout: CostRule(lambda i: 1, _none, "[isa] dropout: max(MIN_II, N) VectorE cycles"),
    Iota: CostRule(lambda i: 1, _none, "[isa] iota (GpSimd): ~150 + N cycles"),
    GpsimdCall: CostRule(lambda i: 0, lambda i, s: i.cycles, "cycles given by the emitter + GpSimd fixed cost"),
    TensorTensorScan: CostRule(lambda i: 2, _none, "[isa] tensor_tensor_scan: max(MIN_II, 2N) cycles"),
    TensorScalarReduce: CostRule(
        lambda i: 1, lambda i, s: s.vector.min_ii_cycles, "[isa] tensor_scalar_reduce: max(MIN_II, N) + MIN_II"),
    AffineSelect: CostRule(lambda i: 1, _none, "[isa] affine_select (GpSimd): GPSIMD_START (~150) + N cycles"),
    Reciprocal: CostRule(lambda i: 8, _none, "[isa] reciprocal (VectorE): max(MIN_II, 8N) cycles"),
    Max8: CostRule(lambda i: 1, _none, "[isa] max8: N cycles, N the elements read per partition"),
    ScalarTensorTensor: CostRule(_scalar_tensor_tensor_per_elem, _none,
                                 "[isa] scalar_tensor_tensor: 2N cycles (N: bf16 subtract then multiply, N even)"),
    FindIndex8: CostRule(lambda i: 1, _none, "[isa] nc_find_index8: N cycles, N the elements of data per partition"),
    # ASSUMED: no cost note is published for nc_match_replace8; it reads the data once, as max8 does
    MatchReplace8: CostRule(lambda i: 1, _none, "assumed as max8: N cycles (one read of the data)"),
}


# ASSUMED: GpSimd cycles per element per partition of a generic routine (an aten op without a
# lowering of its own, run as one GpSimd call): an arbitrary op has no published instruction
# cost, so every element the routine reads or writes costs one cycle.
GENERIC_CYCLES_PER_ELEMENT = 1.0


def generic_routine_cycles(elements_per_partition: int) -> float:
    """[assumed] Cycles of a generic GpSimd routine over ``elements_per_partition`` operand
    elements (the ``cycles`` of its ``gpsimd_call``; the table adds GpSimd's fixed cost)."""
    return elements_per_partition * GENERIC_CYCLES_PER_ELEMENT


# ASSUMED: GpSimd cycles to write one DMA descriptor (software DGE, nki/deep-dives/nki-dge.rst:
# "consumes GpSimd Engine cycles for descriptor generation"; no figure is published). A GpSimd
# core (512-bit SIMD at 1.4 GHz) computes an address and stores a descriptor of a few words in
# a handful of cycles.
DGE_CYCLES_PER_DESCRIPTOR = 8.0
# ASSUMED: GpSimd cycles per element of a gather within each partition (nki.isa.nc_n_gather /
# local_gather publish no cost note): one per element read or written, the generic rate.
LOCAL_GATHER_CYCLES_PER_ELEMENT = 1.0


def dge_cycles(partitions: int, per_partition: int) -> float:
    """[assumed] Cycles of the GpSimd routine that writes the descriptors of ``per_partition``
    indices on each of ``partitions`` partitions: each of the 8 cores serves the 16 partitions
    wired to it, so the busiest core writes ``min(partitions, 16) * per_partition``."""
    return DGE_CYCLES_PER_DESCRIPTOR * min(partitions, 16) * per_partition


def local_gather_cycles(read: int, written: int) -> float:
    """[assumed] Cycles of a per-partition gather reading ``read`` and writing ``written`` elements
    per partition (the ``cycles`` of its ``gpsimd_call``)."""
    return LOCAL_GATHER_CYCLES_PER_ELEMENT * (read + written)


def matmul_cycles(instr: Matmul | Transpose, spec: CoreSpec) -> float:
    """[isa] nc_matmul: max(min(64, N_stationary), N_moving) cycles, x4 for fp32.

    A transpose is a matmul against identity [arch]: the source is the stationary
    operand (free size F) and the identity the moving one (P columns).
    """
    if isinstance(instr, Matmul):
        n_stationary = instr.stationary.free_size
        n_moving = instr.moving.free_size
        dtypes: tuple[str, ...] = (instr.stationary.dtype, instr.moving.dtype)
    else:
        n_stationary = instr.src.free_size
        n_moving = instr.src.partitions
        dtypes = (instr.src.dtype,)
    cycles = max(min(64, n_stationary), n_moving)
    # ASSUMED: a transpose of any 4-byte dtype (int32 as well as fp32) takes fp32's four passes
    if "float32" in dtypes or isinstance(instr, Transpose) and _itemsize(instr.src.dtype) == 4:
        cycles *= spec.pe_fp32_slowdown
    return float(cycles)


def load_stationary_cycles(instr: Matmul | Transpose) -> float:
    """[isa] LoadStationary: up to 4x faster than a matmul pass (~32 cycles for 128 columns)."""
    ap = instr.stationary if isinstance(instr, Matmul) else instr.src
    return max(ap.free_size / 4.0, 1.0)


def engine_cycles(instr: Instruction, spec: CoreSpec) -> float:
    """Cycles of a compute instruction at its engine's clock (not for DMA)."""
    if isinstance(instr, (Matmul, Transpose)):
        return matmul_cycles(instr, spec)
    rule = COST_TABLE[type(instr)]
    engine = spec.engines[instr.engine]
    work = rule.per_element(instr) * _n(instr) * _strided(instr)
    if instr.engine == "pool":
        # [isa] GpSimd: fixed ~150 cycles + N (the fixed part is EngineSpec.min_ii_cycles)
        body = engine.min_ii_cycles + work
    else:
        # [isa] VectorE / ScalarE: max(MIN_II, N)
        body = max(engine.min_ii_cycles, work)
    return float(engine.access_cycles + body + rule.extra_cycles(instr, spec))


def engine_ns(instr: Instruction, spec: CoreSpec) -> float:
    return spec.engines[instr.engine].ns(engine_cycles(instr, spec))


_ON_CHIP = frozenset({"sbuf", "psum"})


def _run_elems(ap: AP, on_chip: bool) -> int:
    """Elements of the longest run of ``ap`` that is contiguous in the device address map.

    On-chip operands never run across partitions: [arch] SBUF addresses advance along one
    partition's free dimension, then jump to the next partition, so each partition's slice
    is its own DMA buffer.
    """
    run, expected = 1, 1
    for stride, count in reversed(ap.dims[1:] if on_chip else ap.dims):
        if count == 1:
            continue
        if stride != expected:
            break
        run *= count
        expected = stride * count
    return run


@dataclass(frozen=True, slots=True)
class DmaCost:
    """What one DMA instruction costs, before the scheduler places it (see :func:`dma_cost`)."""

    fixed_ns: float  # issue cost on its queue, pipelined with the queue's previous transfer
    nbytes: int  # bytes moved
    descriptors: int  # contiguous runs (DMA buffers), each at most one packet
    partitions: int  # on-chip partitions the transfer touches (0: DRAM to DRAM)
    hbm_read: int  # bytes read from HBM
    hbm_write: int  # bytes written to HBM

    def engine_ns(self, spec: CoreSpec, first_partition: int = 0) -> float:
        """Time of each engine's piece of this transfer (see :func:`dma_engines`)."""
        return float(dma_engines(self.partitions, self.descriptors, self.nbytes, first_partition, spec)[2])


def dma_cost(instr: DmaCopy, spec: CoreSpec, src_mem: str = "hbm", dst_mem: str = "sbuf") -> DmaCost:
    """The structure of one DMA transfer [arch], [dmaintro], [dmabw]: bytes, descriptors,
    partitions (which decide the engines it spans) and HBM traffic.

    A descriptor is one contiguous run on both sides, cut into ``DmaSpec.packet_bytes``
    packets [overlap]; on-chip runs end at each partition.

    >>> from tilescope.spec import preset
    >>> x = AP("x", "bfloat16", 0, ((8192, 128), (1, 512)))  # rows of an HBM matrix
    >>> t = AP("t", "bfloat16", 0, ((512, 128), (1, 512)))   # an SBUF tile
    >>> c = dma_cost(DmaCopy(t, x), preset("trn1"), "hbm", "sbuf")
    >>> c.descriptors, c.partitions, c.hbm_read
    (128, 128, 131072)
    >>> round(c.engine_ns(preset("trn1")), 1)  # on each of 16 engines: 8 KiB at 17 B/ns + 8 x 12 ns
    577.9
    """
    nbytes = instr.dst.nbytes
    size = max(1, instr.dst.size)
    run = max(1, min(_run_elems(instr.src, src_mem in _ON_CHIP), _run_elems(instr.dst, dst_mem in _ON_CHIP)))
    run = min(run, size)
    run_bytes = run * instr.dst.itemsize
    packets = -(-run_bytes // spec.dma.packet_bytes)
    descriptors = -(-size // run) * packets
    if dst_mem in _ON_CHIP:
        partitions = instr.dst.partitions
    elif src_mem in _ON_CHIP:
        partitions = instr.src.partitions
    else:
        partitions = 0
    return DmaCost(spec.dma.fixed_ns, nbytes, descriptors, partitions,
                   nbytes if src_mem == "hbm" else 0, nbytes if dst_mem == "hbm" else 0)


def dma_engines(partitions, descriptors, nbytes, first_partition, spec: CoreSpec):
    """``(first engine, engines spanned, ns of each engine's piece)`` of transfers (numpy
    arrays or plain numbers).

    [dmaintro] each engine serves ``partitions / engines`` consecutive SBUF partitions (8 of
    128), so a transfer uses the engines of the partitions it touches; a DRAM-to-DRAM
    transfer ("each DMA transfer is by default parallelized up to 16 DMA engines") spreads
    its descriptors over all of them. Each engine moves an even share of the bytes at its
    own bandwidth [dmabw] and pays ``descriptor_ns`` per descriptor of its share.

    >>> from tilescope.spec import preset
    >>> first, count, ns = dma_engines(4, 4, 32768, 0, preset("trn1"))  # [4, 4096] bf16
    >>> int(first), int(count), round(float(ns))  # one engine: 32 KiB / 17 B/ns + 4 x 12 ns
    (0, 1, 1976)
    """
    n = spec.dma.engines
    per = spec.dma_partitions_per_engine
    partitions, descriptors = np.asarray(partitions), np.asarray(descriptors)
    first_partition = np.asarray(first_partition)
    on_chip = partitions > 0
    first = np.where(on_chip, (first_partition // per) % n, 0)
    span = (first_partition + np.maximum(partitions, 1) - 1) // per - first_partition // per + 1
    count = np.where(on_chip, np.clip(span, 1, n), np.clip(descriptors, 1, n))
    piece = (np.asarray(nbytes) / count / spec.dma.bytes_per_ns_per_engine
             + -(-descriptors // count) * spec.dma.descriptor_ns)
    return first, count, piece


def dma_indirect_cost(instr: DmaIndirect, spec: CoreSpec, src_mem: str = "hbm", dst_mem: str = "sbuf") -> DmaCost:
    """[dge] an indirect DMA moves one descriptor per index: every row is its own run.

    The structure of a plain transfer (:func:`dma_cost`) with the rows touched as its
    descriptors (each cut into packets), so a gather of a few rows costs what those rows
    cost, never the table's size. ([dge] nki/deep-dives/nki-dge.rst: software DGE writes the
    descriptors of a gather or scatter with dynamic indices.)

    >>> from tilescope.spec import preset
    >>> from tilescope.isa import DmaIndirect
    >>> table = AP("emb", "float32", 0, ((512, 1000), (1, 512)))  # 1000 rows of 2 KiB
    >>> rows = AP("t", "float32", 0, ((512, 128), (1, 512)))       # 128 of them, one per partition
    >>> idx = AP("i", "int32", 0, ((1, 128), (1, 1)))
    >>> c = dma_indirect_cost(DmaIndirect(rows, table, index=idx), preset("trn1"), "hbm", "sbuf")
    >>> c.descriptors, c.partitions, c.hbm_read
    (128, 128, 262144)
    """
    table, direct = instr.table, instr.direct
    row_elems = max(1, AP(table.buffer, table.dtype, 0, table.dims[1:] or ((1, 1),)).size)
    on_chip = (dst_mem if instr.indirect == "src" else src_mem) in _ON_CHIP
    run = max(1, min(row_elems, _run_elems(direct, on_chip)))
    packets = -(-run * direct.itemsize // spec.dma.packet_bytes)
    nbytes = direct.nbytes
    descriptors = -(-max(1, direct.size) // run) * packets
    partitions = direct.partitions if on_chip else 0
    return DmaCost(spec.dma.fixed_ns, nbytes, descriptors, partitions,
                   nbytes if src_mem == "hbm" else 0, nbytes if dst_mem == "hbm" else 0)


def flops(instr: Instruction) -> float:
    """Useful floating-point operations: 2*K*M*N for matmul, one per element per ALU op."""
    if isinstance(instr, Matmul):
        k = instr.moving.partitions
        return 2.0 * k * instr.stationary.free_size * instr.moving.free_size
    if isinstance(instr, (Transpose, DmaCopy, Memset, Iota, TensorCopy)):
        return 0.0
    if isinstance(instr, GpsimdCall):
        return float(sum(ap.size for ap in instr.outputs))
    out = instr.dst if isinstance(instr.dst, AP) else None
    n = out.size if out is not None else 0
    if isinstance(instr, TensorScalar):
        return float(n * (2 if instr.op1 else 1))
    if isinstance(instr, (TensorReduce, ActivationReduce, BnStats, Max8)):
        return float(instr.src.size)
    if isinstance(instr, FindIndex8):
        return 0.0  # comparisons, not arithmetic
    if isinstance(instr, (TensorTensorScan, TensorScalarReduce, ScalarTensorTensor)):
        return float(2 * n)
    return float(n)
