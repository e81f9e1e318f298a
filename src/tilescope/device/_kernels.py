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

import sys
import warnings

import torch

from ..errors import TilescopeError
from ..lang.internal import filter_traceback
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
    from ..lower.internal import to_numpy as _to_numpy, to_torch as _to_torch

    arrays = {name: _to_numpy(t, str(t.dtype)[6:]) for name, t in zip(order, ins)}
    result = traced.run(arrays, print_values=True)
    for spec, t in zip(written, outs):
        t.copy_(_to_torch(result[spec.name], str(t.dtype)[6:], tuple(t.shape)))


# ---- inside torch.compile: a functional custom op the graph can hold -----------------------
#
# ``tilescope_kernels::call(key, inputs) -> outputs`` runs one kernel as one device execution.
# It is functional: an argument the kernel stores into comes back as a new tensor (a copy of
# the argument, then written by the kernel), and the caller copies it back in place -- which
# AOT autograd's functionalization turns into ordinary graph ops.

_LIB = None


def _kernel_and_grid(key: str):
    from ..lang.internal import KERNELS

    name, _, grid = key.partition("|")
    kernel = KERNELS[name]
    return (kernel[tuple(int(g) for g in grid.split(","))] if grid else kernel), kernel


def _traced_for(key: str, shapes_dtypes):
    from ..lang import TensorSpec

    launch_or_kernel, kernel = _kernel_and_grid(key)
    grid = getattr(launch_or_kernel, "grid", None)
    specs = [TensorSpec(tuple(s), d) for s, d in shapes_dtypes]
    return kernel.program_for(*specs, grid=grid, preset=_runtime.settings().preset)


def _dtype_name(t) -> str:
    return {"float8_e4m3fn": "float8_e4m3"}.get(str(t.dtype)[6:], str(t.dtype)[6:])


def _torch_dtype(name: str):
    return getattr(torch, {"float8_e4m3": "float8_e4m3fn"}.get(name, name))


def _ensure_op() -> None:
    global _LIB
    if _LIB is not None:
        return
    lib = torch.library.Library("tilescope_kernels", "DEF")
    lib.define("call(str key, Tensor[] inputs) -> Tensor[]")

    def device_impl(key, inputs):
        kernel_or_launch, _ = _kernel_and_grid(key)
        traced = _traced_for(key, [(tuple(t.shape), _dtype_name(t)) for t in inputs])
        args = [t.clone() if any(spec.arg == k for spec in traced.outputs) else t for k, t in enumerate(inputs)]
        values = _run(kernel_or_launch, traced, args)
        return [values[spec.name] for spec in traced.outputs]

    def fake_impl(key, inputs):
        traced = _traced_for(key, [(tuple(t.shape), _dtype_name(t)) for t in inputs])
        return [inputs[0].new_empty(spec.shape, dtype=_torch_dtype(spec.dtype)) for spec in traced.outputs]

    lib.impl("call", device_impl, "PrivateUse1")
    torch.library.register_fake("tilescope_kernels::call", fake_impl, lib=lib)
    _LIB = lib


@torch._dynamo.assume_constant_result
def _layout(key: str, shapes_dtypes: tuple) -> tuple:
    """(output index -> argument position it is written back into; -1 if returned), decided when
    the graph is traced (shapes are static there)."""
    traced = _traced_for(key, shapes_dtypes)
    return tuple(-1 if spec.arg is None else spec.arg for spec in traced.outputs)


def _compiled_call(kernel_or_launch, args):
    from ..lang.internal import KernelLaunch

    kernel = kernel_or_launch.kernel if isinstance(kernel_or_launch, KernelLaunch) else kernel_or_launch
    grid = kernel_or_launch.grid if isinstance(kernel_or_launch, KernelLaunch) else ()
    key = kernel.key + ("|" + ",".join(str(g) for g in grid) if grid else "")
    layout = _layout(key, tuple((tuple(t.shape), _dtype_name(t)) for t in args))
    results = torch.ops.tilescope_kernels.call(key, list(args))
    returned = []
    for res, arg in zip(results, layout):
        if arg >= 0:
            args[arg].copy_(res)  # the kernel stored into this argument
        else:
            returned.append(res)
    if not returned:
        return None
    return returned[0] if len(returned) == 1 else tuple(returned)


def _call(kernel_or_launch, args, kwargs):
    tensors = _flat([args, kwargs], [])
    name = _dispatch._DEVICE_TYPE
    if not any(t.device.type == name for t in tensors):
        return NotImplemented
    if torch.compiler.is_compiling() and not kwargs and all(isinstance(a, torch.Tensor) for a in args):
        return _compiled_call(kernel_or_launch, args)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        kernel = getattr(kernel_or_launch, "kernel", kernel_or_launch)
        warnings.warn(f"tile kernel {kernel.name!r} got a tensor that requires grad; kernels have no autograd "
                      f"formula, so its results are not part of the autograd graph (gradients do not reach "
                      f"its inputs). Give it one with a torch.autograd.Function, or call it under "
                      f"torch.no_grad() for inference", stacklevel=_user_stacklevel())
    try:
        return _eager(kernel_or_launch, args, kwargs)
    except TilescopeError as e:  # as simulate() does: the traceback ends at the user's kernel line
        raise e.with_traceback(filter_traceback(e.__traceback__)) from None


def _user_stacklevel() -> int:
    """``warnings.warn``'s stacklevel for the caller's caller's first frame outside tilescope
    (the user's line that called the kernel)."""
    level, frame = 2, sys._getframe(2)  # (level 1: the frame that warns)
    while frame is not None and (frame.f_globals.get("__name__") or "").startswith("tilescope"):
        frame, level = frame.f_back, level + 1
    return level


def _run(kernel_or_launch, traced, args):
    """Launch an already traced kernel on ``args``; returns the output tensors by name."""
    from ..lang.internal import KernelLaunch

    kernel = kernel_or_launch.kernel if isinstance(kernel_or_launch, KernelLaunch) else kernel_or_launch
    _, _, arrays, order = kernel.bind(tuple(args), {})
    ins = [arrays[n] for n in order] + list(traced.constants.values())  # program.inputs order
    name = _dispatch._DEVICE_TYPE
    core = _core_of([t for t in ins if isinstance(t, torch.Tensor)])
    outs, values = [], {}
    for spec in traced.outputs:
        t = ins[spec.arg] if spec.arg is not None else torch.empty(
            spec.shape, dtype=_torch_dtype(spec.dtype), device=torch.device(name, core))
        outs.append(t)
        values[spec.name] = t
    launch(f"kernel::{kernel.name}", traced.program, ins, outs,
           lambda i, o: _numerics(traced, order, i, o, traced.outputs), lowering="tile_kernel")
    return values


def _eager(kernel_or_launch, args, kwargs):
    from ..lang.internal import KernelLaunch

    name = _dispatch._DEVICE_TYPE
    if isinstance(kernel_or_launch, KernelLaunch):
        kernel, grid = kernel_or_launch.kernel, kernel_or_launch.grid
    else:
        kernel, grid = kernel_or_launch, None
    traced = kernel.program_for(*args, grid=grid, preset=_runtime.settings().preset, **kwargs)
    _, _, arrays, order = kernel.bind(args, kwargs)
    ins = [arrays[n] for n in order] + list(traced.constants.values())  # program.inputs order
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
    from ..lang.internal import register_call_handler

    _ensure_op()
    register_call_handler(_call)
