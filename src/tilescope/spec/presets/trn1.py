"""NeuronCore-v2 (Trn1 / Inf2 class): the default preset.

Sources (AWS Neuron documentation, repository ``aws-neuron/aws-neuron-sdk``):
  [arch]  nki/guides/architecture/trainium_inferentia2_arch.rst
  [core]  about-neuron/arch/neuron-hardware/neuron-core-v2.rst
  [perf]  nki/deep-dives/nki_perf_guide.rst
  [dmabw] nki/deep-dives/nki-dma-bandwidth-guide.rst
  [isa]   "Estimated instruction cost" notes of the nki.isa API reference
  [trn1]  about-neuron/arch/neuron-hardware/trainium.rst (chip: 2 cores, 32 GiB, 820 GB/s)
  [inf2]  about-neuron/arch/neuron-hardware/inferentia2.rst (chip: 2 cores, 32 GiB, 820 GB/s)
"""

from .._model import CoreSpec, DmaSpec, EngineSpec

_GIB = 1 << 30

TRN1 = CoreSpec(
    name="trn1",
    generation="NeuronCore-v2",
    description="Trn1-class core (NeuronCore-v2), 2 cores per chip",
    partitions=128,  # [arch] SBUF and PSUM are 2-D, 128 partitions
    sbuf_bytes_per_partition=192 * 1024,  # [arch] 24 MiB = 128 x 192 KiB
    psum_bytes_per_partition=16 * 1024,  # [arch] 2 MiB = 128 x 16 KiB
    psum_banks=8,  # [arch] 8 banks of 2 KiB per partition (512 fp32)
    # [arch] TensorE: 128x128 systolic array at 2.8 GHz (92 TFLOPS bf16, 23 fp32)
    tensor=EngineSpec("pe", "TensorE", clock_ghz=2.8, min_ii_cycles=64, access_cycles=60),
    # [arch] VectorE 1.12 GHz; [isa] MIN_II ~64 cycles; [perf] ~60 cycles fixed SBUF access
    vector=EngineSpec("dve", "VectorE", clock_ghz=1.12, min_ii_cycles=64, access_cycles=60),
    # [arch] ScalarE 1.4 GHz
    scalar=EngineSpec("act", "ScalarE", clock_ghz=1.4, min_ii_cycles=64, access_cycles=60),
    # [arch] GpSimd: 8 cores at 1.4 GHz; [isa] GpSimd ops ~150 + N cycles (fixed part below)
    gpsimd=EngineSpec("pool", "GpSimd", clock_ghz=1.4, min_ii_cycles=150, access_cycles=60),
    pe_rows=128,  # [arch] contraction over the 128 partitions
    pe_cols=128,  # [arch] stationary free size <= 128
    pe_fp32_slowdown=4,  # [arch] fp32 matmul is 4x slower than bf16 (23 vs 92 TFLOPS)
    matmul_moving_fmax=512,  # [arch] moving free <= 512 (one PSUM bank of fp32)
    matmul_stationary_fmax=128,  # [arch] stationary free <= 128
    gpsimd_cores=8,  # [arch] 8 programmable cores, each wired to 16 partitions
    gpsimd_tcm_bytes=64 * 1024,  # [arch] 64 KB TCM per core
    gpsimd_user_tcm_bytes=16 * 1024,  # neuron-customops guides: 16 KB tcm_malloc pool
    dma=DmaSpec(
        engines=16,  # [arch] 16 DMA engines per core
        # [dmabw] 17 B/ns per engine (272 GB/s per core). [arch] says 27 GiB/s per engine:
        # that figure is the preset "trn1-archdma".
        bytes_per_ns_per_engine=17.0,
        fixed_ns=1300.0,  # [dmabw] ~1.3 us fixed cost per DMA transfer
        # ASSUMED: [dmabw] says payloads >= 2 KiB (better >= 4 KiB) per partition approach
        # peak but publishes no curve. We charge each contiguous chunk at least 512 B of
        # transfer time (a 64-B-chunk transfer runs at 1/8 of peak), so small, fragmented
        # transfers are visibly slow. Vary it to see how conclusions move.
        chunk_floor_bytes=512,
    ),
    hbm_bytes_per_ns=410.0,  # [trn1] 820 GB/s per chip of 2 cores
    hbm_bytes=16 * _GIB,  # [trn1] 32 GiB per chip of 2 cores
    cores_per_chip=2,  # [trn1]
    # ASSUMED: no public figure gives the runtime's fixed cost of launching one compiled
    # executable. 10 us is the order of one kernel launch through a user-space runtime
    # on a PCIe-attached accelerator (CUDA launches cost ~3-10 us). Studies vary it.
    runtime_exec_us=10.0,
    # ASSUMED: host dispatch cost of one eager aten op in virtual-clock mode. PyTorch's
    # eager overhead per op on an out-of-tree backend is ~5-20 us; we take 10 us.
    host_dispatch_us=10.0,
    sources=("arch", "core", "perf", "dmabw", "isa", "trn1"),
)

TRN1_ARCHDMA = TRN1.replace(
    name="trn1-archdma",
    description="trn1 with the architecture guide's DMA figure (27 GiB/s per engine)",
    # [arch] 27 GiB/s per DMA engine = 28.99 B/ns
    dma=dict(bytes_per_ns_per_engine=27 * _GIB / 1e9),
)

INF2 = TRN1.replace(
    name="inf2",
    description="Inf2-class core (NeuronCore-v2), 2 cores per chip",
    # [inf2] same NeuronCore-v2; chip has 32 GiB HBM at 820 GB/s over 2 cores
)

PRESETS = {p.name: p for p in (TRN1, TRN1_ARCHDMA, INF2)}
