"""The device model of one C++ operator call: a Program of DMA transfers and one GpSimd call.

What the model charges (all figures *modeled*; the compute part is also *estimated*, the
same for the same operator and inputs on every run):

* **TCM accessor traffic** -- every ``tensor_to_tcm`` / ``tcm_to_tensor`` call of every core
  becomes one ``dma_copy`` between the HBM tensor and that core's TCM, so it pays the DMA
  path's cost from the cost table: ~1.3 us to issue on its queue [dmabw], then its bytes on
  one DMA engine (a single contiguous run) [dmaintro]. Accessor copies block the calling
  core, so one core has one transfer in flight: core ``c`` issues on DMA queue ``c``
  (ASSUMED: the public documents do not say how GpSimd cores map to DMA queues).
* **Compute** -- for each core, the instructions its kernel run executes, counted in a build
  of the user's sources with a probe per basic block (:mod:`tilescope.cpp._count`): each
  instruction one GpSimd cycle (``cycles_per_instruction``, ASSUMED: no public source gives
  the cores' instructions per cycle; one is an in-order scalar core), each instruction with a
  memory operand ``tcm_access_cycles - 1`` more (the TCM's 3-cycle access latency [arch], not
  hidden by an in-order core). The code is counted as scalar x86-64 code compiled at -O2
  without auto-vectorisation (no public source says the custom-op toolchain vectorises for the
  cores' 512-bit SIMD); the probe itself is not counted, the spills it causes are. The
  slowest core bounds the GpSimd call; the cost table adds GpSimd's fixed ~150 cycles [isa]
  and the ~60-cycle access latency [arch].
* **Order** -- all input transfers, then the call, then all output transfers. On the device
  each core interleaves them, but a core is blocked during its own transfers either way,
  so for balanced cores the sum is the same; for unbalanced ones this bound is higher.

The simulator has no TCM memory kind, so each core's TCM is drawn as one partition row of
an on-chip tile per dtype (``tcm.float32`` ...): core ``c``'s row is partition ``16 c``, the
first of the 16 partitions it is wired to [arch], so its transfers use the DMA engine that
serves those partitions (cores do not queue behind one engine), and the instruction's
provenance points at the accessor call's source line. Values do not come from this Program: they come from running the compiled kernel
(as built-in ops' values come from CPU torch), so its ``gpsimd_call`` numerics refuse to
run (see :func:`_refuse_numerics`).

Sources: [dmabw] nki/deep-dives/nki-dma-bandwidth-guide.rst; [isa] "Estimated instruction
cost" notes of the nki.isa API reference; [arch] nki/guides/architecture/
trainium_inferentia2_arch.rst; neuron-customops/api-reference-guide/custom-ops-ref-guide.rst
(TCM accessors, 16 KB pool, multicore).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..dtypes import canonical, itemsize
from ..errors import ProgramError
from ..isa import AP
from ..program import Provenance, TileBuilder
from ..sim import register_gpsimd_impl
from ..spec import CoreSpec

__all__ = ["CostModel", "CoreEstimate", "build_program", "GPSIMD_IMPL"]

GPSIMD_IMPL = "tilescope.cpp"


@dataclass(frozen=True)
class CostModel:
    """How one C++ operator call becomes modeled time. Vary the assumed fields in studies.

    Attributes:
        cycles_per_instruction: ASSUMED. GpSimd cycles per executed instruction. No public
            source gives the GpSimd cores' instructions per cycle; 1.0 is a single-issue
            in-order core.
        tcm_access_cycles: [arch] the TCM's access latency (3 cycles); an instruction with a
            memory operand waits for it.
        queue_per_core: ASSUMED. Core ``c``'s transfers go to DMA queue ``c`` (one in flight per
            core, as accessor copies block); ``False`` lets the scheduler pick any free queue.
    """

    cycles_per_instruction: float = 1.0
    tcm_access_cycles: int = 3
    queue_per_core: bool = True

    def __post_init__(self) -> None:
        if self.cycles_per_instruction <= 0:
            raise ValueError(f"cycles_per_instruction must be > 0, got {self.cycles_per_instruction}")
        if self.tcm_access_cycles < 1:
            raise ValueError(f"tcm_access_cycles must be >= 1, got {self.tcm_access_cycles}")

    def cycles(self, instructions: int, memory: int) -> float:
        """GpSimd cycles of ``instructions`` executed, ``memory`` of them with a memory operand."""
        return instructions * self.cycles_per_instruction + memory * (self.tcm_access_cycles - 1)


@dataclass(frozen=True)
class CoreEstimate:
    """The estimated compute of one core: what its kernel run executed, and its GpSimd cycles."""

    core: int
    instructions: int  # executed, counted
    memory_accesses: int  # executed instructions with a memory operand
    blocks: int  # basic blocks executed
    gpsimd_cycles: float
    transfers_in: int
    transfers_out: int
    bytes_in: int
    bytes_out: int
    elements_written: int
    tcm_peak_bytes: int


def _refuse_numerics(inputs, outputs, attrs) -> None:
    a = dict(attrs) if not isinstance(attrs, dict) else attrs
    raise ProgramError(
        f"the Program of C++ operator {a.get('op', '?')} models its time only; its values come from "
        f"running the compiled kernel (call the operator on CPU or sim tensors, or CppOp.run)"
    )


register_gpsimd_impl(GPSIMD_IMPL, _refuse_numerics)


def build_program(qualname: str, arg_specs: list[tuple[str, tuple[int, ...], str] | None],
                  out_spec: tuple[tuple[int, ...], str], core_logs: list[np.ndarray], file_names: list[list[str]],
                  estimates: list[CoreEstimate], spec: CoreSpec, model: CostModel, meta: dict | None = None):
    """The Program of one call.

    ``arg_specs[k]`` is ``(name, shape, dtype)`` for a tensor argument, ``None`` for a scalar;
    ``core_logs[c]`` holds core ``c``'s accessor copies and ``file_names[c]`` the files they name.
    """
    b = TileBuilder(f"cpp.{qualname.replace('::', '.')}", spec)
    hbm: dict[int, tuple[str, str]] = {}
    for k, a in enumerate(arg_specs):
        if a is not None:
            name, shape, dtype = a
            b.input(name, shape or (1,), _device_dtype(dtype))
            hbm[k] = (name, _device_dtype(dtype))
    out_shape, out_dtype = out_spec
    b.output("out", out_shape or (1,), _device_dtype(out_dtype))
    hbm[-1] = ("out", _device_dtype(out_dtype))

    cores = len(core_logs)
    pool = spec.gpsimd_user_tcm_bytes
    dtypes = sorted({hbm[int(a)][1] for log in core_logs for a in np.unique(log["arg"])} or {hbm[-1][1]})
    # core c's window is partition c * per_core: [arch] each GpSimd core is wired to 16 partitions
    per_core = max(1, spec.partitions // max(spec.gpsimd_cores, cores))
    windows = {dt: b.sbuf((cores * per_core, max(1, pool // itemsize(dt))), dt, name=f"tcm.{dt}",
                          site=f"tcm.{dt}", bufs=1)
               for dt in dtypes}

    provs: dict[tuple, Provenance] = {}

    def emit(c: int, rec, direction: int) -> None:
        buf, dt = hbm[int(rec["arg"])]
        count = int(rec["count"])
        if count <= 0:
            return
        row = windows[dt].buffer.row_elems
        tcm = AP(windows[dt].name, dt, c * per_core * row, ((row, 1), (1, count)))
        tensor = AP(buf, dt, int(rec["offset"]), ((1, count),))
        key = (c, int(rec["file"]), int(rec["line"]))
        prov = provs.get(key)
        if prov is None:
            files = file_names[c]
            f = files[key[1]] if 0 <= key[1] < len(files) else None
            prov = provs[key] = Provenance(op=qualname, file=f, line=key[2] or None,
                                           label=f"GpSimd core {c} TCM accessor")
        b.set_provenance(prov)
        q = c % spec.dma.queues if model.queue_per_core else None
        b.dma_copy(tcm, tensor, queue=q) if direction == 0 else b.dma_copy(tensor, tcm, queue=q)

    # every operand is built here from checked accessor records (offset + count <= numel,
    # count <= the TCM pool): skip the builder's per-instruction checks, validated in tests
    b.check = False
    for c, log in enumerate(core_logs):
        for rec in log[log["dir"] == 0]:
            emit(c, rec, 0)
    slowest = max(estimates, key=lambda e: e.gpsimd_cycles)
    label = (f"estimated compute: slowest core {slowest.core}, {slowest.instructions:,} instructions counted "
             f"({model.cycles_per_instruction:g} cycle each, assumed; TCM operands {model.tcm_access_cycles} cycles)")
    tiles = [w for w in windows.values()]
    b.check = True
    with b.provenance(op=qualname, label=label):
        b.gpsimd_call(qualname, GPSIMD_IMPL, tiles, tiles, math.ceil(slowest.gpsimd_cycles),
                      attrs=(("op", qualname), ("cores", cores)))
    b.check = False
    for c, log in enumerate(core_logs):
        for rec in log[log["dir"] == 1]:
            emit(c, rec, 1)
    b.set_provenance(Provenance())
    return b.build(meta={"kind": "cpp", "op": qualname, "estimated": True, **(meta or {})})


def _device_dtype(dtype: str) -> str:
    return canonical("uint8" if dtype == "bool" else dtype)
