"""The device model of one C++ operator call: a Program of DMA transfers and one GpSimd call.

What the model charges (all figures *modeled*; the compute part is also *estimated*):

* **TCM accessor traffic** -- every ``tensor_to_tcm`` / ``tcm_to_tensor`` call of every core
  becomes one ``dma_copy`` between the HBM tensor and that core's TCM, so it pays the DMA
  path's cost from the cost table: ~1.3 us fixed per transfer, bytes at the DMA engines'
  bandwidth shared by all transfers in flight [dmabw]. Accessor copies block the calling
  core, so one core has one transfer in flight: core ``c`` issues on DMA queue ``c``
  (ASSUMED: the public documents do not say how GpSimd cores map to DMA queues).
* **Compute** -- for each core, the host thread CPU time of the kernel with the time inside
  runtime calls (accessor copies, ``tcm_malloc``/``tcm_free``) taken out, best of
  ``repeats`` runs (cores run one after another during measurement), times the host clock
  (measured with a chain of dependent adds, one per cycle), times
  ``gpsimd_cycles_per_host_cycle`` (ASSUMED, see :class:`CostModel`). The slowest core
  bounds the GpSimd call; the cost table adds GpSimd's fixed ~150 cycles [isa] and the
  ~60-cycle access latency [arch].
* **Order** -- all input transfers, then the call, then all output transfers. On the device
  each core interleaves them, but a core is blocked during its own transfers either way,
  so for balanced cores the sum is the same; for unbalanced ones this bound is higher.

The simulator has no TCM memory kind, so each core's TCM is drawn as one partition row of
an on-chip tile per dtype (``tcm.float32`` ...): the DMA cost does not depend on where on
chip the bytes land, and the instruction's provenance points at the accessor call's source
line. Values do not come from this Program: they come from running the compiled kernel
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
        gpsimd_cycles_per_host_cycle: ASSUMED. GpSimd core cycles per host core cycle for the
            same C++ code. No public source gives the GpSimd cores' instructions per cycle;
            an out-of-order x86-64 server core sustains about 2 instructions per cycle on
            scalar loops, an in-order core with one integer pipeline about 1, hence 2.0.
        repeats: fewest timed runs per core; the best is taken (thread CPU time is noisy, its
            minimum much less so). Runs continue, up to 4x as many, while the best improves.
        host_ghz: host cycles per ns; ``None`` measures it once per process.
        queue_per_core: ASSUMED. Core ``c``'s transfers go to DMA queue ``c`` (one in flight per
            core, as accessor copies block); ``False`` lets the scheduler pick any free queue.
    """

    gpsimd_cycles_per_host_cycle: float = 2.0
    repeats: int = 7
    host_ghz: float | None = None
    queue_per_core: bool = True

    def __post_init__(self) -> None:
        if self.gpsimd_cycles_per_host_cycle <= 0:
            raise ValueError(f"gpsimd_cycles_per_host_cycle must be > 0, got {self.gpsimd_cycles_per_host_cycle}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.host_ghz is not None and self.host_ghz <= 0:
            raise ValueError(f"host_ghz must be > 0 (or None to measure it), got {self.host_ghz}")


@dataclass(frozen=True)
class CoreEstimate:
    """The estimated compute of one core (host figures measured, GpSimd figures *estimated*)."""

    core: int
    host_compute_ns: float  # best of the runs, runtime calls excluded
    host_compute_ns_median: float
    gpsimd_cycles: float
    transfers_in: int
    transfers_out: int
    bytes_in: int
    bytes_out: int
    elements_written: int
    tcm_peak_bytes: int

    @property
    def spread(self) -> float:
        """(median - best) / best of the measured runs: the measurement's uncertainty."""
        return (self.host_compute_ns_median - self.host_compute_ns) / self.host_compute_ns if self.host_compute_ns else 0.0


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
    windows = {dt: b.sbuf((cores, max(1, pool // itemsize(dt))), dt, name=f"tcm.{dt}", site=f"tcm.{dt}", bufs=1)
               for dt in dtypes}

    provs: dict[tuple, Provenance] = {}

    def emit(c: int, rec, direction: int) -> None:
        buf, dt = hbm[int(rec["arg"])]
        count = int(rec["count"])
        if count <= 0:
            return
        row = windows[dt].buffer.row_elems
        tcm = AP(windows[dt].name, dt, c * row, ((row, 1), (1, count)))
        tensor = AP(buf, dt, int(rec["offset"]), ((1, count),))
        key = (c, int(rec["file"]), int(rec["line"]))
        prov = provs.get(key)
        if prov is None:
            files = file_names[c]
            f = files[key[1]] if 0 <= key[1] < len(files) else None
            prov = provs[key] = Provenance(op=qualname, file=f, line=key[2] or None,
                                           label=f"GpSimd core {c} TCM accessor")
        b.set_provenance(prov)
        q = c % spec.dma.engines if model.queue_per_core else None
        b.dma_copy(tcm, tensor, queue=q) if direction == 0 else b.dma_copy(tensor, tcm, queue=q)

    # every operand is built here from checked accessor records (offset + count <= numel,
    # count <= the TCM pool): skip the builder's per-instruction checks, validated in tests
    b.check = False
    for c, log in enumerate(core_logs):
        for rec in log[log["dir"] == 0]:
            emit(c, rec, 0)
    slowest = max(estimates, key=lambda e: e.gpsimd_cycles)
    spread = max(e.spread for e in estimates)
    label = (f"estimated compute: slowest core {slowest.core}, +-{spread:.0%} measured spread; "
             f"x{model.gpsimd_cycles_per_host_cycle:g} GpSimd/host cycles (assumed)")
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
