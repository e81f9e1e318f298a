"""Tile kernels called on device tensors: one device execution per call.

``kernel(x, y)`` with tensors of the simulated device traces the kernel for their
shapes and dtypes (cached, :meth:`tilescope.lang.Kernel.program_for`), allocates the
tensors it returns on the same core, and launches the traced Program
(:func:`~tilescope.device.launch`): the modeled time is the Program's, the values come
from the Program's own numerics on the worker. Arguments the kernel stores into are
updated in place.

>>> import torch, tilescope, tilescope.device as dev
>>> import tilescope.lang as tl
>>> _ = dev.register()
>>> @tilescope.kernel
... def double(x):
...     out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm)
...     tl.store(out, tl.load(x) * 2.0)
...     return out
>>> y = double(torch.ones(128, 8, device="sim"))
>>> y.device.type, float(y.sum())
('sim', 2048.0)
"""

from __future__ import annotations

import torch

from . import _dispatch, _runtime
from ._launch import _core_of, launch

__all__ = ["install"]


def _flat(v, out: list) -> list:
    if isinstance(v, torch.Tensor):
        out.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _flat(x, out)
    elif isinstance(v, dict):
        for x in v.values():
            _flat(x, out)
    return out


def _numerics(traced, order, ins, outs, written):
    from ..lower._generic import _to_numpy, _to_torch

    arrays = {name: _to_numpy(t, str(t.dtype)[6:]) for name, t in zip(order, ins)}
    result = traced.run(arrays, print_values=True)
    for spec, t in zip(written, outs):
        t.copy_(_to_torch(result[spec.name], str(t.dtype)[6:], tuple(t.shape)))


def _call(kernel_or_launch, args, kwargs):
    from ..lang._kernel import KernelLaunch

    tensors = _flat([args, kwargs], [])
    name = _dispatch._DEVICE_TYPE
    if not any(t.device.type == name for t in tensors):
        return NotImplemented
    if isinstance(kernel_or_launch, KernelLaunch):
        kernel, grid = kernel_or_launch.kernel, kernel_or_launch.grid
    else:
        kernel, grid = kernel_or_launch, None
    traced = kernel.program_for(*args, grid=grid, preset=_runtime.settings().preset, **kwargs)
    _, _, arrays, order = kernel.bind(args, kwargs)
    ins = [arrays[n] for n in order]
    core = _core_of([t for t in ins if isinstance(t, torch.Tensor)])
    outs, values = [], {}
    for spec in traced.outputs:
        if spec.arg is not None:
            t = ins[spec.arg]  # an argument the kernel stores into: updated in place
        else:
            dtype = getattr(torch, {"float8_e4m3": "float8_e4m3fn"}.get(spec.dtype, spec.dtype))
            t = torch.empty(spec.shape, dtype=dtype, device=torch.device(name, core))
        outs.append(t)
        values[spec.name] = t
    launch(f"kernel::{kernel.name}", traced.program, ins, outs,
           lambda i, o: _numerics(traced, order, i, o, traced.outputs), lowering="tile_kernel")
    return traced.value(values)


def install() -> None:
    """Let tile kernels run on device tensors (called by ``register``)."""
    from ..lang._kernel import register_call_handler

    register_call_handler(_call)
