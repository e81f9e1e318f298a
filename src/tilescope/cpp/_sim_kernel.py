"""The ``sim`` device kernel of C++ operators: one device execution on GpSimd per call.

A call on ``sim`` tensors becomes one execution through the device's custom-op hook
(:func:`tilescope.device.launch`) with the operator's modeled Program (see
:mod:`._cost_model`); the kernel itself computes the values on the device worker, with the
same checks as on CPU.

The Program depends on the kernel's transfer pattern and on its measured compute, so
the **first call of each signature** (argument shapes, dtypes and scalar values, preset)
learns them from a run on the real inputs: it waits for the inputs (a ``synchronize``,
as a data-dependent op does), runs the kernel on the host with every check, measures
it and builds the Program -- the analogue of compiling the operator at first use. Later
calls reuse that Program and run the kernel on the device worker; if a run's transfers
differ from the modeled ones (a kernel whose accessor calls depend on input values),
a warning says the modeled time of that call used the first call's pattern.
"""

from __future__ import annotations

import threading
import warnings

import torch

__all__ = ["register_device_kernel", "run_on_device"]

_LOCK = threading.Lock()


def register_device_kernel(tlib, op) -> None:
    """Register ``op``'s kernel for the PrivateUse1 key (the ``sim`` device) on ``tlib``."""
    from ..device.internal import on_cancel
    from ._abi import interrupt_all

    on_cancel(interrupt_all)  # Ctrl-C while the device worker runs a kernel stops it

    def device_kernel(*args):
        return run_on_device(op, args)

    tlib.impl(op.name, device_kernel, "PrivateUse1")


def _device_api():
    from .. import device

    launch = getattr(device, "launch", None)
    if launch is None:  # the hook exists but is not re-exported by this version
        from ..device import launch
    return device, launch


def _cpu_view(t: torch.Tensor) -> torch.Tensor:
    """A zero-copy CPU view of a ``sim`` tensor (the same views launch gives numerics)."""
    from ..device.internal import cpu_view

    return cpu_view(t)


def _signature(args) -> tuple:
    return tuple((tuple(a.shape), a.dtype, a.stride()) if isinstance(a, torch.Tensor) else ("s", a) for a in args)


def run_on_device(op, args):
    device, launch = _device_api()
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors:
        raise ValueError(f"{op.qualname} on the sim device needs at least one tensor argument")
    where = {t.device for t in tensors}
    if len(where) > 1:
        a, b = sorted(where, key=str)[:2]
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, {a} and {b}! "
            f"Move the arguments of {op.qualname} to one device first, e.g. with .to({str(tensors[0].device)!r})."
        )
    spec = device.settings().preset
    key = (_signature(args), spec.fingerprint, op.library.cost_model, op.library.cores)
    cache = op.__dict__.setdefault("_device_cache", {})
    entry = cache.get(key)
    if entry is None:
        with _LOCK:
            entry = cache.get(key)
            if entry is None:
                shape, dtype = op.output_spec(*args)
                out = torch.empty(shape, dtype=dtype, device=tensors[0].device)
                program, digest = _first_call(op, args, out, spec)
                cache[key] = (program, digest, shape, dtype)
                return _submit(launch, op, program, args, out, _values_already_written)
    program, digest, shape, dtype = entry
    out = torch.empty(shape, dtype=dtype, device=tensors[0].device)
    return _submit(launch, op, program, args, out, _worker_numerics(op, digest))


def _submit(launch, op, program, args, out, numerics):
    launch(op.qualname, program, list(args), [out], numerics=numerics, lowering="cpp")
    return out


def _first_call(op, args, out, spec):
    """Wait for the inputs, run the kernel on the host (values + transfer pattern), model it."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    getattr(torch, tensors[0].device.type).synchronize()
    cpu_args = tuple(_cpu_view(a) if isinstance(a, torch.Tensor) else a for a in args)
    _, record = op.run(*cpu_args, out=_cpu_view(out))
    estimate = op.estimate_from(record, cpu_args, preset=spec)
    return estimate.program, record.digest()


def _values_already_written(inputs, outputs) -> None:
    """Numerics of a first call: the host run already wrote the output."""


def _worker_numerics(op, digest: str):
    def numerics(inputs, outputs):
        _, record = op.run(*inputs, out=outputs[0])
        if record.digest() != digest:
            warnings.warn(
                f"{op.qualname}: this call's accessor transfers differ from those of the first call with "
                f"the same argument shapes, so its modeled time (from the first call) is off: the kernel's "
                f"transfers depend on input values",
                RuntimeWarning, stacklevel=2,
            )

    return numerics
