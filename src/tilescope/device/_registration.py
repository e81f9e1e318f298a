"""Registering the simulated device with PyTorch (PrivateUse1), once per process.

Steps, in the order PyTorch needs them:

1. name the PrivateUse1 backend (``"sim"``; ``register(name)`` or
   ``$TILESCOPE_DEVICE_NAME`` choose another, once per process);
2. load the native runtime (allocator, device guard for the preset's cores,
   generators, pinned memory, metadata-only kernels) and tell it the core count and
   each core's HBM size;
3. generate ``Tensor.sim()`` / ``is_sim`` / ``Module.sim()`` and register ``torch.sim``;
4. register the kernels: the native device kernel (``_csrc/dispatch.cpp``, a fast path in
   front of the Python handlers of ``_dispatch``) as the backend fallback for every op and
   directly for ops that would otherwise reach it in pieces (structured ops PyTorch would
   split into ``empty`` + ``op.out``; ``_foreach_*`` loops; composite kernels such as
   ``native_layer_norm`` where CPU has its own); Python kernels for the ops with their own
   semantics (copies, ``.item()``, ``resize_``) and the fused built-ins.
"""

from __future__ import annotations

import os
import sys
import threading

import torch

from .._env import flag
from . import _settings, _dispatch, _module, _special

__all__ = ["register", "is_registered", "device_name"]

_LOCK = threading.Lock()
_NAME: str | None = None
_LIBS: list = []  # keep torch.library registrations alive


def device_name() -> str | None:
    """The registered device's name, or None before :func:`register`."""
    return _NAME


def is_registered() -> bool:
    return _NAME is not None


def register(name: str | None = None) -> str:
    """Register the simulated device (idempotent); returns its name (default ``"sim"``)."""
    global _NAME
    if _NAME is not None:
        if name is not None and name != _NAME:
            raise RuntimeError(
                f"the simulated device is already registered as {_NAME!r} in this process; PyTorch "
                f"allows one PrivateUse1 name per process, so it cannot also be {name!r}. Use "
                f"{_NAME!r}, or start a new process (TILESCOPE_DEVICE_NAME={name} sets it at start-up)."
            )
        return _NAME
    with _LOCK:
        if _NAME is not None:
            return _NAME
        name = name or os.environ.get("TILESCOPE_DEVICE_NAME") or "sim"
        current = torch._C._get_privateuse1_backend_name()
        if current != "privateuseone" and current != name:
            raise RuntimeError(
                f"PyTorch's PrivateUse1 backend is already named {current!r} in this process (another "
                f"extension registered it), so tilescope cannot register {name!r}. Use a separate process."
            )
        if current != name:
            torch.utils.rename_privateuse1_backend(name)
        s = _settings.settings()
        from ._native_runtime import load

        rt = load()
        rt.initialize(name, s.preset.cores_per_chip)
        _apply_limits(rt, s)
        from . import _runtime

        _runtime.attach(rt)
        # torch.profiler records device executions itself, through the device's Kineto profiler
        _runtime.use_device_profiler(rt, flag("TILESCOPE_DEVICE_PROFILER", True))
        # torch.accelerator.synchronize() / stream.synchronize() reach the runtime through the guard
        rt.set_sync_callback(lambda index: _runtime.synchronize(index if index >= 0 else None))
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
        torch._register_device_module(name, _module)
        _dispatch.init(name)
        _register_kernels(rt)
        if s.gil_switch_interval_s is not None:
            sys.setswitchinterval(s.gil_switch_interval_s)
        _settings.on_change(lambda old, new: _on_change(rt, old, new))
        _NAME = name
        return name


def _apply_limits(rt, s) -> None:
    for core in range(s.preset.cores_per_chip):
        rt.set_limit(core, int(s.preset.hbm_bytes))


def _on_change(rt, old, new) -> None:
    if old.preset.cores_per_chip != new.preset.cores_per_chip:
        rt.initialize(_NAME, new.preset.cores_per_chip)
    _apply_limits(rt, new)
    if new.gil_switch_interval_s is not None:
        sys.setswitchinterval(new.gil_switch_interval_s)


# ---- kernels ---------------------------------------------------------------------------------

# ops with their own semantics (see _special)
_SPECIAL = {
    "_copy_from": _special.copy_from,
    "_copy_from_and_resize": _special.copy_from_and_resize,
    "_local_scalar_dense": _special.local_scalar_dense,
    "resize_": _special.resize_,
    "record_stream": _special.record_stream,
    "new_empty_strided": _special.new_empty_strided,
}

# ops whose CompositeExplicitAutograd kernel would loop per tensor: one execution instead
_FOREACH_PREFIX = "_foreach_"


class _Library(torch.library.Library):
    """A library whose Python kernels Dynamo never traces (see :func:`_untraced`)."""

    def impl(self, op_name, fn, dispatch_key="", *args, **kwargs):
        _untraced(fn)
        return super().impl(op_name, fn, dispatch_key, *args, **kwargs)


def _untraced(fn) -> None:
    """Keep Dynamo out of ``fn`` (a device kernel the dispatcher calls) and all it calls.

    Code around a graph break (``loss.backward()`` inside a compiled step: autograd's
    ``ones_like`` of the loss) runs eagerly with Dynamo's frame hook on, and the hook compiles
    every frame it does not skip as user code. Skipping modules by file misses generated code
    (a dataclass's ``__init__`` is file ``"<string>"``): the simulator's timeline, a dataclass
    of numpy columns, then failed inside Dynamo ("Expected np.nditer base"). A recursive skip
    on the kernel's own code turns the hook off for everything beneath it, at no cost per call.
    """
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:  # a torch without Dynamo: nothing to keep out
        return
    # a function, or a callable object (a Handler): the code of its class's __call__
    code = getattr(fn, "__code__", None) or getattr(type(fn).__call__, "__code__", None)
    if code is not None:
        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))


def _register_kernels(rt) -> None:
    lib = _Library("aten", "IMPL")
    _LIBS.append(lib)
    for name, fn in _SPECIAL.items():
        lib.impl(name, fn, "PrivateUse1")
    # ops the native kernel is registered for directly; copy_ is handled by _special.copy_ (through
    # the kernel, which repeats device-to-device copies on its own)
    names = ["copy_"]
    _dispatch.use_handler(torch.ops.aten.copy_.default, _special.CopyHandler())
    done = set(_SPECIAL) | {"copy_"}
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        name = qualified[6:]
        base = name.split(".", 1)[0]
        if base in done or name in done:
            continue
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        direct = has(qualified, "CompositeExplicitAutogradNonFunctional")
        if not direct and has(qualified, "CompositeExplicitAutograd"):
            # a composite kernel other backends get (native_layer_norm through batch norm, foreach
            # loops) where CPU has a kernel of its own: one device execution instead
            direct = base.startswith(_FOREACH_PREFIX) or has(qualified, "CPU")
        if not direct:
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "PrivateUse1"):
            continue
        names.append(name)
    # the native kernel, for these and (as the backend fallback) every op without a kernel
    _untraced(_dispatch.handle)
    rt.fast_register(names, _dispatch.handle)
    from . import _composite_ops, _kernels, _rnn

    _composite_ops.register(lib)
    _rnn.register(lib)
    _kernels.install()
