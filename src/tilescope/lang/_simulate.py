"""``tilescope.simulate``: run a tile kernel on numpy arrays -- values and a modeled timeline.

>>> import numpy as np, tilescope
>>> from tilescope import lang as tl
>>> @tilescope.kernel
... def scale(x, out):
...     for i in tl.affine_range(x.shape[0] // 128):
...         t = tl.load(x[i * 128:(i + 1) * 128, :])
...         tl.store(out[i * 128:(i + 1) * 128, :], tl.exp(t) * 2.0)
>>> x = np.zeros((256, 512), np.float32)
>>> out = np.empty_like(x)
>>> r = tilescope.simulate(scale, x, out)
>>> float(out[0, 0]), r.summary.modeled, r.summary.instructions
(2.0, True, 8)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import sim as _sim
from ..errors import KernelError, TilescopeError
from ..program import Program
from ._frames import filter_traceback
from ._kernel import Kernel, KernelLaunch, Traced

__all__ = ["simulate", "KernelResult"]


@dataclass(frozen=True)
class KernelResult:
    """One simulated kernel run.

    ``value`` is what the kernel returned, with numpy arrays in place of its HBM
    tensors; ``outputs`` holds every output by name (returned tensors and arguments
    the kernel stored into). ``timeline`` and ``summary`` are *modeled* by the
    device model.
    """

    kernel: str
    value: Any
    outputs: dict[str, np.ndarray]
    program: Program
    timeline: Any  # tilescope.sim.Timeline
    summary: Any  # tilescope.sim.Summary
    traced: Traced
    profile_dir: Path | None = None

    def __repr__(self) -> str:
        outs = ", ".join(f"{k}{list(v.shape)} {v.dtype}" for k, v in self.outputs.items()) or "none"
        return (f"KernelResult({self.kernel!r}: {self.summary.total_us:,.2f} us modeled, "
                f"{self.summary.instructions} instructions, outputs: {outs})")


def simulate(kernel, *args, grid=None, preset=None, profile_dir=None, numerics: bool = True,
             **kwargs) -> KernelResult:
    """Run ``kernel`` on the simulator: its values (numpy interpreter) and its modeled timeline.

    Args:
        kernel: a ``@tilescope.kernel`` function (or ``kernel[grid]``).
        *args, **kwargs: the kernel's arguments. numpy arrays are HBM tensors (a store into one
            writes into the caller's array); other values are constants of the trace.
        grid: launch grid (int or tuple): the kernel runs once per point, reading
            ``tl.program_id(axis)``. The programs run one after another on one modeled core.
        preset: hardware preset (default: the kernel's, ``$TILESCOPE_PRESET`` or ``trn1``).
        profile_dir: also write a profile directory (executable + instruction trace) there.
        numerics: ``False`` skips the values (arrays may then be anything with ``.shape`` and
            ``.dtype``): for modeled timing of large shapes.

    The trace is cached per signature: a second call with the same shapes, dtypes and
    constants only runs the numerics (and looks the modeled timeline up by Program hash).
    """
    try:
        if isinstance(kernel, KernelLaunch):
            if grid is not None:
                raise KernelError(f"{kernel!r} already has a launch grid; do not pass grid= as well")
            kernel, grid = kernel.kernel, kernel.grid
        if not isinstance(kernel, Kernel):
            what = getattr(kernel, "__name__", type(kernel).__name__)
            raise KernelError(f"simulate() runs tile kernels; {what!r} is not one. Decorate it with @tilescope.kernel")
        traced, arrays = kernel._traced(args, kwargs, grid, preset)
        result = _sim.simulate(traced.program, traced.spec)
        outputs = traced.run(arrays) if numerics else {}
        written = None
        if profile_dir is not None:
            from ..profiler import write_kernel_profile

            written = write_kernel_profile(profile_dir, traced.program, result, name=kernel.name,
                                           config={"source": "tilescope.simulate", "kernel": kernel.name,
                                                   "grid": list(traced.grid)})
    except TilescopeError as e:
        raise e.with_traceback(filter_traceback(e.__traceback__))
    return KernelResult(kernel.name, traced.value(outputs) if numerics else None, outputs, traced.program,
                        result.timeline, result.summary, traced, written)
