"""Run a Program-backed op on device tensors as one device execution (the hook for
custom operators: C++ GpSimd ops, tile kernels, anything that comes with a Program).

>>> import torch, numpy as np, tilescope.device as dev
>>> from tilescope.program import TileBuilder
>>> _ = dev.register()
>>> b = TileBuilder("double")
>>> x, y = b.input("x", (128, 64), "float32"), b.output("y", (128, 64), "float32")
>>> t = b.sbuf((128, 64), "float32")
>>> _ = b.dma_copy(t, x), b.tensor_scalar(t, t, "multiply", 2.0), b.dma_copy(y, t)
>>> prog = b.build()
>>> a = torch.ones(128, 64, device="sim")
>>> out = torch.empty(128, 64, device="sim")
>>> rec = dev.launch("demo::double", prog, [a], [out])   # values from the Program itself
>>> float(out.sum()), rec.lowering, rec.modeled_ns > 0
(16384.0, 'custom', True)
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..sim import run_numerics, simulate
from . import _dispatch, _runtime

__all__ = ["launch"]

_RecordFunctionFast = torch._C._profiler._RecordFunctionFast


def _core_of(tensors) -> int:
    name = _dispatch._DEVICE_TYPE
    core = None
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if t.device.type != name:
            raise RuntimeError(
                f"launch: every tensor must be on the {name} device; got a tensor on {t.device}. "
                f"Move it with .to({name!r})."
            )
        if core is None:
            core = t.device.index
        elif core != t.device.index:
            raise _dispatch.same_device_error(torch.device(name, core), t.device)
    if core is None:
        raise ValueError("launch needs at least one device tensor (an input or an output)")
    return core


def _program_numerics(program, names_in, names_out, ins, outs, scalars):
    from ..lower.internal import to_numpy as _to_numpy, to_torch as _to_torch

    arrays = {}
    for name, t in zip(names_in, ins):
        arrays[name] = _to_numpy(t, str(t.dtype)[6:])
    result = run_numerics(program, arrays, scalars)
    for name, t in zip(names_out, outs):
        t.copy_(_to_torch(result[name], str(t.dtype)[6:], tuple(t.shape)))


def launch(op: str, program, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
           numerics: Callable | None = None, *, scalars: dict | None = None, lowering: str = "custom"):
    """Submit ``program`` as one device execution named ``op`` and queue its numerics.

    Args:
        op: the name executions and profiles show (``"mylib::giou"``).
        program: the Program that models the execution (its modeled duration comes from
            the simulator, cached by the Program's hash).
        inputs, outputs: device tensors, in the order of ``program.inputs`` /
            ``program.outputs`` when ``numerics`` is None; the caller allocates outputs.
        numerics: ``fn(input_views, output_views)`` run on the device worker with
            zero-copy CPU views (write results into the output views). None runs the
            Program's own numerics interpreter (``tilescope.sim.run_numerics``).
        scalars: runtime scalar values of the Program (for its own numerics).
        lowering: the label the execution record carries.

    Returns the :class:`~tilescope.device.Execution` record.
    """
    core = _core_of(list(inputs) + list(outputs))
    rt = _dispatch._rt
    in_views = [rt.cpu_view(t) if isinstance(t, torch.Tensor) else t for t in inputs]
    out_views = [rt.cpu_view(t) for t in outputs]
    if numerics is None:
        if len(program.inputs) != len(in_views) or len(program.outputs) != len(out_views):
            raise ValueError(
                f"launch: program {program.name!r} has {len(program.inputs)} inputs and {len(program.outputs)} "
                f"outputs; got {len(in_views)} and {len(out_views)} tensors. Pass them in Program order, or "
                f"give numerics=fn(input_views, output_views)."
            )
        work = (_program_numerics, (program, program.inputs, program.outputs, in_views, out_views, scalars or {}),
                {}, op)
    else:
        work = (numerics, (in_views, out_views), {}, op)
    summary = simulate(program, _runtime.settings().preset).summary
    if torch.autograd.profiler._is_profiler_enabled:
        # a range named after the execution, which torch records as its launching op: a tile
        # kernel launched outside any op has one then (else its execution has none on the
        # framework lanes); inside an op of the same name (a custom op's own) torch merges the two
        with _RecordFunctionFast(op):
            return _submit(core, op, lowering, program, summary, work)
    return _submit(core, op, lowering, program, summary, work)


def _submit(core, op, lowering, program, summary, work):
    return _runtime.submit(core, op, "kernel", lowering, program, float(summary.total_ns), work,
                           int(summary.hbm_bytes), want_record=True)
