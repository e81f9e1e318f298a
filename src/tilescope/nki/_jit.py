"""NKI's decorators and runners on tilescope: ``jit``, ``baremetal``, ``simulate_kernel``,
``simulate``, ``benchmark``, ``profile``.

Every launch runs in tilescope's simulator: the values come from the numpy
interpreter and the time from the device model (*modeled*, never measured). A kernel
called with numpy arrays (or CPU torch tensors) returns its outputs like NKI's
simulator does; ``kernel[gx, gy](...)`` launches a grid (its programs run one after
another on one modeled core); tensors of the simulated PyTorch device run as device
work. While :func:`recording` is active (``tilescope nki run``) each launch is kept
for the run's profile.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import TilescopeError
from ..lang.internal import maybe_current
from ..lang.internal import filter_traceback
from ..lang import Kernel, TensorSpec
from ..lang.internal import launch_grid as _grid
from ..lang import KernelResult, simulate as _simulate

__all__ = [
    "NkiKernel", "jit", "baremetal", "simulate_kernel", "simulate", "benchmark", "profile", "Launch",
    "recording", "BenchmarkResult",
]


@dataclass
class Launch:
    """One kernel launch of a run: its result (values, *modeled* timeline) and host seconds."""

    kernel: str
    result: KernelResult
    host_s: float
    grid: tuple[int, ...] = ()


_RECORDERS: list[list[Launch]] = []


@contextlib.contextmanager
def recording():
    """Collect every launch made inside the block (a list of :class:`Launch`)."""
    launches: list[Launch] = []
    _RECORDERS.append(launches)
    try:
        yield launches
    finally:
        _RECORDERS.remove(launches)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "device")


def _on_sim_device(args) -> bool:
    from ..device.internal import device_type

    name = device_type()
    return any(_is_torch(a) and a.device.type == name for a in args)


def _to_numpy(x):
    if _is_torch(x):
        import torch

        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()
    return x


def _back(value, like_torch: bool):
    if not like_torch or value is None:
        return value
    import torch

    if isinstance(value, np.ndarray):
        if value.dtype.name == "bfloat16":
            return torch.from_numpy(value.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, dict):
        return {k: _back(v, True) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_back(v, True) for v in value)
    return value


def _user_errors(fn):
    """A tilescope error leaving ``fn`` keeps only the user's frames (the kernel line last)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TilescopeError as e:
            raise e.with_traceback(filter_traceback(e.__traceback__))

    return wrapper


def run(kernel: "NkiKernel", args, kwargs, *, profile_dir=None) -> KernelResult:
    """Simulate one launch; record it; returns the KernelResult."""
    args = tuple(_to_numpy(a) for a in args)
    kwargs = {k: _to_numpy(v) for k, v in kwargs.items()}
    data = [a for a in list(args) + list(kwargs.values()) if isinstance(a, (np.ndarray, TensorSpec))]
    numerics = not any(isinstance(a, TensorSpec) for a in data)
    t0 = time.perf_counter()
    r = _simulate(kernel.kernel, *args, grid=kernel.grid or None, numerics=numerics, profile_dir=profile_dir,
                  **kwargs)
    launch = Launch(kernel.kernel.name, r, time.perf_counter() - t0, kernel.grid)
    for rec in _RECORDERS:
        rec.append(launch)
    return r


class NkiKernel:
    """A kernel made by ``@nki.jit`` (and NKI's other decorators): call it to run it.

    ``kernel[gx, gy]`` is the same kernel with a launch grid. ``.kernel`` is the
    underlying :class:`tilescope.lang.Kernel` (for ``tilescope.simulate`` and the device).
    """

    def __init__(self, fn: Callable, *, grid: tuple[int, ...] = (), kernel: Kernel | None = None,
                 options: dict | None = None):
        while isinstance(fn, NkiKernel):
            fn, kernel = fn.fn, kernel or fn.kernel
        self.fn = fn
        opts = dict(options or {})
        if kernel is None:
            from .compiler import allocation_of

            kernel = Kernel(fn, spill=not opts.get("strict", False),
                            allocation=allocation_of(opts.get("compile_config")))
        self.kernel = kernel
        self.grid = grid
        self.options = dict(options or {})
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        grid = f"[{', '.join(map(str, self.grid))}]" if self.grid else ""
        return f"<NKI kernel {self.kernel.name}{grid} (tilescope)>"

    def __getitem__(self, grid) -> "NkiKernel":
        return type(self)(self.fn, grid=_grid(grid), kernel=self.kernel, options=self.options)

    @_user_errors
    def __call__(self, *args, **kwargs):
        if maybe_current() is not None:  # called from another kernel: traced inline
            return self.fn(*args, **kwargs)
        if _on_sim_device(list(args) + list(kwargs.values())):
            launch = self.kernel[self.grid] if self.grid else self.kernel
            return launch(*args, **kwargs)
        like_torch = any(_is_torch(a) for a in list(args) + list(kwargs.values()))
        r = self._run(args, kwargs)
        return _back(r.value, like_torch)

    def _run(self, args, kwargs) -> KernelResult:
        return run(self, args, kwargs)


def jit(func=None, mode: str = "auto", **kwargs):
    """``@nki.jit`` / ``@nki.jit(mode=...)``: the function becomes an :class:`NkiKernel`.

    Options of hardware NKI are accepted; of them only ``compile_config``'s
    ``experimental_allocation_mode`` has an effect (how tiles get addresses: ``docs/nki.md``).
    ``strict=True`` (tilescope's) makes SBUF overflow a ``CapacityError`` instead of spills.
    """
    if func is None:
        return lambda f: NkiKernel(f, options=dict(kwargs, mode=mode))
    return NkiKernel(func, options=dict(kwargs, mode=mode))


def baremetal(kernel=None, **kwargs):
    """``@nki.baremetal(...)``: called with numpy arrays, the kernel runs (here: simulated)."""
    return jit(kernel, **kwargs)


@_user_errors
def simulate_kernel(kernel, *args, **kwargs):
    """Run ``kernel`` on numpy arrays in the simulator; returns what the kernel returns."""
    k = kernel if isinstance(kernel, NkiKernel) else NkiKernel(kernel)
    return k._run(args, kwargs).value


def simulate(kernel) -> Callable:
    """``nki.simulate(kernel)(*arrays)``: a callable running the kernel in the simulator."""
    k = kernel if isinstance(kernel, NkiKernel) else NkiKernel(kernel)

    @_user_errors
    def call(*args, **kwargs):
        like_torch = any(_is_torch(a) for a in list(args) + list(kwargs.values()))
        return _back(k._run(args, kwargs).value, like_torch)

    return call


@dataclass(frozen=True)
class Latency:
    """Per-iteration latencies in microseconds (*modeled*: every iteration takes the same time)."""

    values_us: tuple[float, ...]

    def get_latency_percentile(self, p: float) -> float:
        return float(np.percentile(np.asarray(self.values_us), p))


@dataclass(frozen=True)
class BenchmarkResult:
    """``kernel.benchmark_result``: ``nc_latency`` as NKI's benchmark reports it (microseconds,
    *modeled* device time of one launch; the preset's runtime cost per execution is not in it)."""

    nc_latency: Latency
    summary: Any = field(default=None, repr=False)


class BenchmarkKernel(NkiKernel):
    """``nki.benchmark(warmup=, iters=)(kernel)``: each call simulates one launch and sets
    ``benchmark_result``; the modeled time does not vary, so warm-up and iterations repeat it."""

    benchmark_result: BenchmarkResult | None = None

    def _run(self, args, kwargs) -> KernelResult:
        r = run(self, args, kwargs)
        iters = int(self.options.get("iters", 1) or 1)
        us = r.summary.total_us
        self.benchmark_result = BenchmarkResult(Latency((us,) * max(1, iters)), r.summary)
        print(f"tilescope: {self.kernel.name}: {us:,.2f} us per launch (modeled by the device model, "
              f"{r.summary.preset}; bound by {r.summary.bound_by})", flush=True)
        return r


def benchmark(kernel=None, **kwargs):
    """``@nki.benchmark(warmup=, iters=, ...)``: run the kernel and report its modeled latency."""
    if kernel is None:
        return lambda k: BenchmarkKernel(k, options=kwargs)
    return BenchmarkKernel(kernel, options=kwargs)


class ProfiledKernel(NkiKernel):
    """``nki.profile(working_directory=...)(kernel)``: each call also writes a tilescope profile
    (executable + modeled instruction trace) under ``working_directory``; open it with
    ``tilescope explore DIR``."""

    def _run(self, args, kwargs) -> KernelResult:
        out = self.options.get("working_directory") or os.path.join(os.getcwd(), "profile_out")
        r = run(self, args, kwargs, profile_dir=out)
        print(f"tilescope: {self.kernel.name}: profile written to {r.profile_dir} "
              f"(modeled; open with: tilescope explore {r.profile_dir})", flush=True)
        return r


def profile(func=None, **kwargs):
    """``@nki.profile(working_directory=..., ...)``: run the kernel and write a profile of it."""
    if func is None:
        return lambda f: ProfiledKernel(f, options=kwargs)
    return ProfiledKernel(func, options=kwargs)
