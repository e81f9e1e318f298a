"""NeuronCore-v3 (Trn2 class).

Source: AWS Neuron documentation, ``nki/guides/architecture/trainium2_arch.rst`` [arch2],
and the nki.isa cost notes [isa]. Where [arch2] is silent the v2 figures are kept and say so.
"""

from .._model import CoreSpec, DmaSpec, EngineSpec
from .trn1 import TRN1

_GIB = 1 << 30

TRN2 = CoreSpec(
    name="trn2",
    generation="NeuronCore-v3",
    description="Trn2-class core (NeuronCore-v3), 8 cores per chip",
    partitions=128,  # [arch2]
    sbuf_bytes_per_partition=224 * 1024,  # [arch2] 28 MiB = 128 x 224 KiB
    psum_bytes_per_partition=16 * 1024,  # [arch2] 2 MiB
    psum_banks=8,  # [arch2]
    tensor=EngineSpec("pe", "TensorE", clock_ghz=2.4, min_ii_cycles=64, access_cycles=60),  # [arch2] 79 TFLOPS bf16
    # [arch2] clocks; the dependent-instruction overhead is the v2 figure, kept
    vector=EngineSpec("dve", "VectorE", clock_ghz=0.96, min_ii_cycles=64, access_cycles=60,
                      dependent_cycles=TRN1.vector.dependent_cycles),
    scalar=EngineSpec("act", "ScalarE", clock_ghz=1.2, min_ii_cycles=64, access_cycles=60,
                      dependent_cycles=TRN1.scalar.dependent_cycles),
    gpsimd=EngineSpec("pool", "GpSimd", clock_ghz=1.2, min_ii_cycles=150, access_cycles=60,
                      dependent_cycles=TRN1.gpsimd.dependent_cycles),
    pe_rows=128,
    pe_cols=128,
    pe_fp32_slowdown=4,  # [arch2] 20 TFLOPS fp32 vs 79 bf16
    matmul_moving_fmax=512,
    matmul_stationary_fmax=128,
    gpsimd_cores=8,  # v2 figure kept
    gpsimd_tcm_bytes=64 * 1024,  # v2 figure kept
    gpsimd_user_tcm_bytes=16 * 1024,  # v2 figure kept
    dma=DmaSpec(
        engines=16,  # [arch2] 23 B/ns x 16 = 368 GB/s per core
        bytes_per_ns_per_engine=23.0,
        fixed_ns=600.0,  # [arch2] hardware-DGE DMA instruction ~600 ns
        queues=TRN1.dma.queues,  # [dmaintro] 16 queues per engine on v2-v4
        descriptor_ns=TRN1.dma.descriptor_ns,  # assumed, as on trn1
        packet_bytes=TRN1.dma.packet_bytes,
        queue_policy=TRN1.dma.queue_policy,  # assumed, as on trn1
    ),
    hbm_bytes_per_ns=2900.0 / 8,  # [arch2] ~2.9 TB/s per chip of 8 cores
    hbm_bytes=96 * _GIB // 8,  # [arch2] 96 GiB per chip of 8 cores
    cores_per_chip=8,  # [arch2]
    # [arch2] "VectorE and GpSimdE can access SBUF in parallel", "VectorE and ScalarE can access
    # PSUM in parallel ... as long as their accesses do not collide on the same PSUM bank" (bank
    # collisions are not modeled)
    shared_ports=(),
    runtime_exec_us=TRN1.runtime_exec_us,  # assumed, as on trn1
    host_dispatch_us=TRN1.host_dispatch_us,  # assumed, as on trn1
    sources=("arch2", "isa"),
)

PRESETS = {TRN2.name: TRN2}
