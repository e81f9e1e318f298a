"""NeuronCore-v2 (Trn1 / Inf2 class): the default preset.

Sources (AWS Neuron documentation, repository ``aws-neuron/aws-neuron-sdk``):
  [arch]  nki/guides/architecture/trainium_inferentia2_arch.rst
  [core]  about-neuron/arch/neuron-hardware/neuron-core-v2.rst
  [perf]  nki/deep-dives/nki_perf_guide.rst
  [dmabw] nki/deep-dives/nki-dma-bandwidth-guide.rst
  [dmaintro] nki/get-started/about/nki-dma-overview.rst (engines, queues, partitions per engine)
  [overlap] neuron-runtime/explore/compute-comm-overlap.rst (DMA rings, 4 KiB packets)
  [schema] tools/neuron-explorer/profile-schema-reference.rst (DMA queues per engine and data kind)
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
    # [arch] TensorE: 128x128 systolic array at 2.8 GHz (92 TFLOPS bf16, 23 fp32)
    tensor=EngineSpec("pe", "TensorE", clock_ghz=2.8, min_ii_cycles=64, access_cycles=60),
    # [arch] VectorE 1.12 GHz; [isa] MIN_II ~64 cycles; [arch] ~60 cycles fixed SBUF access;
    # [arch] "static instruction overhead of 100 engine cycles" for an instruction that
    # depends on the output of the previous one
    vector=EngineSpec("dve", "VectorE", clock_ghz=1.12, min_ii_cycles=64, access_cycles=60, dependent_cycles=100),
    # [arch] ScalarE 1.4 GHz; [perf] Opt #5a: "static instruction overhead in the order of ~100 cycles"
    scalar=EngineSpec("act", "ScalarE", clock_ghz=1.4, min_ii_cycles=64, access_cycles=60, dependent_cycles=100),
    # [arch] GpSimd: 8 cores at 1.4 GHz; [isa] GpSimd ops ~150 + N cycles (fixed part below).
    # ASSUMED: the same ~100-cycle dependent-instruction overhead as VectorE / ScalarE.
    gpsimd=EngineSpec("pool", "GpSimd", clock_ghz=1.4, min_ii_cycles=150, access_cycles=60, dependent_cycles=100),
    pe_rows=128,  # [arch] contraction over the 128 partitions
    pe_cols=128,  # [arch] stationary free size <= 128
    pe_fp32_slowdown=4,  # [arch] fp32 matmul is 4x slower than bf16 (23 vs 92 TFLOPS)
    matmul_moving_fmax=512,  # [arch] moving free <= 512 (one PSUM bank of fp32)
    matmul_stationary_fmax=128,  # [arch] stationary free <= 128
    gpsimd_cores=8,  # [arch] 8 programmable cores, each wired to 16 partitions
    gpsimd_tcm_bytes=64 * 1024,  # [arch] 64 KB TCM per core
    gpsimd_user_tcm_bytes=16 * 1024,  # neuron-customops guides: 16 KB tcm_malloc pool
    dma=DmaSpec(
        # [arch] 16 DMA engines per core, each processing one transfer at a time;
        # [dmaintro] each engine moves the data of 8 SBUF partitions (128 / 16)
        engines=16,
        # [dmabw] 17 B/ns per engine (272 GB/s per core). [arch] says 27 GiB/s per engine:
        # that figure is the preset "trn1-archdma".
        bytes_per_ns_per_engine=17.0,
        # [dmabw] every DMA transfer incurs descriptor setup, synchronization and
        # semaphore-to-start latency, ~1300 ns; [dmaintro] a queue's transfers run in order
        fixed_ns=1300.0,
        queues=16,  # [dmaintro] 16 DMA queues per engine; a transfer uses one queue id on all engines
        # ASSUMED: the cost of one descriptor (one contiguous run, a "DMA buffer"). [arch]
        # says there is overhead per DMA buffer without a figure; [overlap] calls 4 KiB "the
        # empirically determined minimum for DMA/HBM efficiency". We charge a descriptor
        # 5% of a 4 KiB packet's time on one engine (0.05 x 4096 / 17 = 12 ns), so a run
        # of 4 KiB moves at 95% of peak and a 4-byte element run at 2% of it.
        descriptor_ns=12.0,
        packet_bytes=4096,  # [overlap] the runtime's default DMA packet size, 4 KiB
        # ASSUMED: [schema] queues exist per trigger engine and data kind, and [dmaintro] a
        # queue's transfers run in order; which queue a DMA uses is the compiler's choice
        # and unpublished. We give each DMA site -- the HBM tensor it moves (the destination
        # for on-chip copies) and whether it loads, stores or copies -- one queue, sites
        # dealt round-robin over the 16 queue ids. "free" (any queue that frees first) is
        # the alternative; the fidelity harness shows how each moves the figures.
        queue_policy="site",
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
    sources=("arch", "core", "perf", "dmabw", "dmaintro", "overlap", "schema", "isa", "trn1"),
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
