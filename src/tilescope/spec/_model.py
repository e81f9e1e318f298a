"""Frozen dataclasses that describe one accelerator core.

A preset is pure data: every number in it cites a public source in the preset
file, and every number that no public source gives is a field whose name or
doc says *assumed*, so studies can vary it with :meth:`CoreSpec.replace`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property

__all__ = ["EngineSpec", "DmaSpec", "CoreSpec"]


@dataclass(frozen=True)
class EngineSpec:
    """One compute engine of a core.

    Attributes:
        name: short engine id used in traces (``"pe"``, ``"act"``, ``"dve"``, ``"pool"``).
        display: the name users see (``"TensorE"``, ...).
        clock_ghz: the engine's own clock; instruction costs are cycles at this clock.
        lanes: elements processed per cycle per partition row (128 partitions in parallel).
        min_ii_cycles: minimum initiation interval of one instruction (fixed overhead).
        access_cycles: fixed SBUF/PSUM access latency paid per instruction.
        dependent_cycles: static overhead of an instruction that reads the output of the
            instruction just before it on the same engine (the pipeline drains first).
    """

    name: str
    display: str
    clock_ghz: float
    lanes: int = 128
    min_ii_cycles: int = 64
    access_cycles: int = 60
    dependent_cycles: int = 0

    def __post_init__(self) -> None:
        if self.clock_ghz <= 0:
            raise ValueError(f"engine {self.name!r}: clock_ghz must be > 0, got {self.clock_ghz}")

    def ns(self, cycles: float) -> float:
        """Convert engine cycles to nanoseconds."""
        return cycles / self.clock_ghz


QUEUE_POLICIES = ("site", "free")


@dataclass(frozen=True)
class DmaSpec:
    """The DMA subsystem of one core: engines, queues and the costs of a transfer.

    A DMA instruction is issued on one *queue*; the queue id exists on every engine and
    a queue's transfers run in order. Issuing costs ``fixed_ns`` on the queue (descriptor
    setup, synchronisation, semaphore-to-start), pipelined with the data movement of the
    queue's previous transfer. The data then moves on the *engines* the transfer spans
    (each engine serves ``partitions / engines`` SBUF partitions; a DRAM-to-DRAM copy is
    cut into ``packet_bytes`` packets dealt to all engines): each engine moves its share
    at ``bytes_per_ns_per_engine`` plus ``descriptor_ns`` per contiguous run (DMA buffer).

    Attributes:
        engines: DMA engines per core.
        bytes_per_ns_per_engine: sustained bandwidth of one engine (GB/s == B/ns).
        fixed_ns: fixed cost of one DMA instruction on its queue.
        queues: queue ids per engine.
        descriptor_ns: *assumed*. Cost of one descriptor (one contiguous run). See the preset.
        packet_bytes: size DRAM-to-DRAM transfers are cut into across engines.
        queue_policy: *assumed*. Which queue an instruction that names none lands on:
            ``"site"`` -- each DMA site (the HBM tensor moved and the direction) keeps one
            queue, sites dealt round-robin; ``"free"`` -- the queue that frees first.
    """

    engines: int
    bytes_per_ns_per_engine: float
    fixed_ns: float
    queues: int = 16
    descriptor_ns: float = 12.0
    packet_bytes: int = 4096
    queue_policy: str = "site"

    def __post_init__(self) -> None:
        if self.engines < 1 or self.queues < 1:
            raise ValueError(f"DMA engines and queues must be >= 1, got {self.engines} and {self.queues}")
        if self.bytes_per_ns_per_engine <= 0:
            raise ValueError(f"bytes_per_ns_per_engine must be > 0, got {self.bytes_per_ns_per_engine}")
        if self.fixed_ns < 0 or self.descriptor_ns < 0:
            raise ValueError(f"fixed_ns and descriptor_ns must be >= 0, got {self.fixed_ns}, {self.descriptor_ns}")
        if self.packet_bytes < 1:
            raise ValueError(f"packet_bytes must be >= 1, got {self.packet_bytes}")
        if self.queue_policy not in QUEUE_POLICIES:
            raise ValueError(f"queue_policy must be one of {QUEUE_POLICIES}, got {self.queue_policy!r}")

    @property
    def bytes_per_ns(self) -> float:
        """Aggregate bandwidth of all engines of one core (B/ns == GB/s)."""
        return self.engines * self.bytes_per_ns_per_engine


@dataclass(frozen=True)
class CoreSpec:
    """A NeuronCore-class core, as data.

    Build one from a preset and derive variants::

        >>> from tilescope.spec import preset
        >>> trn1 = preset("trn1")
        >>> trn1.partitions
        128
        >>> slower = trn1.replace(runtime_exec_us=50.0)
        >>> slower.runtime_exec_us
        50.0
    """

    name: str
    generation: str
    description: str
    partitions: int
    sbuf_bytes_per_partition: int
    psum_bytes_per_partition: int
    psum_banks: int
    # engines
    tensor: EngineSpec
    vector: EngineSpec
    scalar: EngineSpec
    gpsimd: EngineSpec
    pe_rows: int  # systolic array contraction size
    pe_cols: int  # systolic array output columns
    pe_fp32_slowdown: int  # fp32 matmul passes cost this many times a bf16 pass
    matmul_moving_fmax: int  # max moving free size (one PSUM bank of fp32)
    matmul_stationary_fmax: int  # max stationary free size
    gpsimd_cores: int
    gpsimd_tcm_bytes: int  # TCM per GpSimd core
    gpsimd_user_tcm_bytes: int  # pool that user C++ code gets from tcm_malloc
    dma: DmaSpec
    hbm_bytes_per_ns: float  # HBM bandwidth available to one core
    hbm_bytes: int  # HBM capacity available to one core
    cores_per_chip: int
    # on-chip memories whose port two engines share, so their accesses serialize [arch]:
    # "sbuf" (VectorE and GpSimd), "psum" (VectorE and ScalarE). NeuronCore-v2 shares both;
    # NeuronCore-v3 lifts both restrictions [arch2]
    shared_ports: tuple[str, ...] = ("sbuf", "psum")
    # assumed figures: no public source gives them; see the preset for the reasoning
    runtime_exec_us: float = 15.0
    host_dispatch_us: float = 10.0
    sources: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= 128:
            raise ValueError(f"partitions must be in [1, 128], got {self.partitions}")
        if self.psum_bytes_per_partition % self.psum_banks:
            raise ValueError(
                f"psum_bytes_per_partition ({self.psum_bytes_per_partition}) must divide "
                f"evenly into psum_banks ({self.psum_banks})"
            )

    # ---- derived figures -------------------------------------------------
    @property
    def sbuf_bytes(self) -> int:
        return self.sbuf_bytes_per_partition * self.partitions

    @property
    def psum_bytes(self) -> int:
        return self.psum_bytes_per_partition * self.partitions

    @property
    def psum_bank_bytes(self) -> int:
        """Bytes of one PSUM bank in one partition (2 KiB = 512 fp32 on v2)."""
        return self.psum_bytes_per_partition // self.psum_banks

    @property
    def engines(self) -> dict[str, EngineSpec]:
        return {e.name: e for e in (self.tensor, self.vector, self.scalar, self.gpsimd)}

    def peak_flops(self, dtype: str = "bfloat16") -> float:
        """Peak TensorE FLOP/s for ``dtype`` (2 FLOPs per MAC)."""
        per_cycle = 2 * self.pe_rows * self.pe_cols
        slow = self.pe_fp32_slowdown if dtype == "float32" else 1
        return per_cycle * self.tensor.clock_ghz * 1e9 / slow

    @property
    def dma_partitions_per_engine(self) -> int:
        """SBUF partitions one DMA engine serves (128 / 16 = 8 on v2 and v3)."""
        return max(1, -(-self.partitions // self.dma.engines))

    @property
    def dma_bytes_per_ns(self) -> float:
        """Bandwidth of a transfer touching HBM: DMA engines, capped by HBM."""
        return min(self.dma.bytes_per_ns, self.hbm_bytes_per_ns)

    # ---- variants and identity -------------------------------------------
    def replace(self, **changes) -> "CoreSpec":
        """A copy with some fields changed (nested specs accept dicts)."""
        for key in ("tensor", "vector", "scalar", "gpsimd", "dma"):
            if isinstance(changes.get(key), dict):
                changes[key] = dataclasses.replace(getattr(self, key), **changes[key])
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(
                f"CoreSpec has no field(s) {sorted(unknown)}; "
                f"valid fields: {[f.name for f in dataclasses.fields(self)]}"
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("sources", None)
        return d

    @cached_property
    def fingerprint(self) -> str:
        """A short stable hash of every number in the preset (cache keys, manifests)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
