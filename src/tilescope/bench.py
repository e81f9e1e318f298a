"""The one benchmark API: warm-up, timed iterations, latency percentiles.

``bench(fn, *args, warmup=, iters=)`` picks a *backend* for ``fn`` from a table
(first match wins) and returns a :class:`BenchResult`. Each iteration records the
host's wall time and, where the backend has one, the device's time:

==========  ===================================  =====================================================
backend     runs                                 device time
==========  ===================================  =====================================================
``sim``     tile kernels (``@tilescope.kernel``)  the kernel's modeled duration (device model)
``torch``   PyTorch functions on the ``sim``     sim: the modeled span of the device work launched;
            device, ``cuda`` or ``cpu``          cuda: CUDA events around the call; cpu: none
==========  ===================================  =====================================================

More backends register with :func:`register_backend`. A PyTorch function is synchronised
after every iteration (through ``torch.accelerator``), so a function that never
synchronises is still timed to the end of its device work; ``bench`` also refuses a
*silent fallback* -- outputs on another device than the inputs -- unless
``allow_fallback=True``. The modeled time of a kernel does not vary between runs, so its
percentiles are equal; it excludes the runtime's fixed launch cost (an *assumed* preset
field, ``runtime_exec_us``), which the result reports beside it.

>>> import numpy as np, tilescope
>>> from tilescope import lang as tl
>>> from tilescope.bench import bench
>>> @tilescope.kernel
... def inc(x, out):
...     tl.store(out, tl.load(x) + 1.0)
>>> r = bench(inc, np.zeros((128, 512), np.float32), np.empty((128, 512), np.float32), warmup=1, iters=3)
>>> r.backend, r.iters, r.device_modeled, r.p(50) == r.p(100)
('sim', 3, True, True)
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

__all__ = ["bench", "compare", "BenchResult", "Comparison", "Backend", "register_backend", "PERCENTILES",
           "SilentFallbackError"]

PERCENTILES = (0, 1, 10, 25, 50, 75, 90, 99, 100)


@dataclass(frozen=True)
class BenchResult:
    """Per-iteration times (microseconds) of one benchmark and their percentiles.

    ``device_us`` is None when the backend has no device clock; ``device_modeled``
    says the device times come from the device model (the ``sim`` backend).
    """

    name: str
    backend: str
    warmup: int
    iters: int
    host_us: np.ndarray
    device_us: np.ndarray | None
    device_modeled: bool = False
    preset: str | None = None
    notes: tuple[str, ...] = ()
    summary: object = field(default=None, repr=False)  # the modeled Summary (sim backend)

    def p(self, q: float, which: str = "device") -> float:
        """The ``q``-th percentile (0..100) of ``which``: ``"device"`` or ``"host"``."""
        data = self.device_us if which == "device" else self.host_us
        if data is None:
            raise ValueError(f"backend {self.backend!r} has no device times; use which='host'")
        return float(np.percentile(data, q))

    @property
    def quantiles(self) -> dict[str, dict[str, float]]:
        """``{"host": {"p0": ..., ...}, "device": {...}}`` at :data:`PERCENTILES`."""
        out = {"host": {f"p{q}": self.p(q, "host") for q in PERCENTILES}}
        if self.device_us is not None:
            out["device"] = {f"p{q}": self.p(q, "device") for q in PERCENTILES}
        return out

    @property
    def host_median_us(self) -> float:
        return float(statistics.median(self.host_us))

    @property
    def device_median_us(self) -> float | None:
        return None if self.device_us is None else float(statistics.median(self.device_us))

    def to_dict(self) -> dict:
        return {"name": self.name, "backend": self.backend, "warmup": self.warmup, "iters": self.iters,
                "preset": self.preset, "device_modeled": self.device_modeled, "quantiles": self.quantiles,
                "host_us": self.host_median_us, "device_us": self.device_median_us,
                "notes": list(self.notes)}

    def to_json(self) -> str:
        import json

        return json.dumps(self.to_dict())

    def table(self):
        """A rich Table: percentiles of host and device time."""
        from rich.markup import escape
        from rich.table import Table

        device_label = "device us (modeled)" if self.device_modeled else "device us"
        title = f"{self.name} on {self.backend}" + (f" ({self.preset})" if self.preset else "")
        t = Table(title=escape(f"{title}: {self.iters} iterations after {self.warmup} warm-up"))
        t.add_column("percentile")
        t.add_column("host us", justify="right")
        if self.device_us is not None:
            t.add_column(device_label, justify="right")
        for q in PERCENTILES:
            row = [f"p{q}", f"{self.p(q, 'host'):,.1f}"]
            if self.device_us is not None:
                row.append(f"{self.p(q):,.2f}")
            t.add_row(*row)
        return t

    def lines(self) -> list[str]:
        """The notes under the table (modeled utilisation first, for the sim backend)."""
        s = self.summary
        out = []
        if s is not None:
            out.append(f"modeled: TensorE {s.mfu:.1%} of peak, HBM {s.achieved_gbps:,.0f} GB/s "
                       f"(MBU {s.mbu:.0%}), bound by {s.bound_by}")
        return out + list(self.notes)

    def __rich__(self):
        from rich.console import Group
        from rich.text import Text

        return Group(self.table(), *(Text(line) for line in self.lines()))

    def __str__(self) -> str:
        from ._console import console as _console

        console = _console(width=100, record=True, file=_Null())
        console.print(self)
        return console.export_text().rstrip()


class _Null:
    def write(self, s):
        return len(s)

    def flush(self):
        pass


@dataclass(frozen=True)
class Backend:
    """How to benchmark one kind of callable.

    ``prepare(fn, args, kwargs) -> run`` returns a zero-argument function that runs
    one iteration and returns ``(device_us or None, extra)``; ``describe(run)`` gives
    ``(name, preset, notes, summary)`` for the result.
    """

    name: str
    matches: Callable[[object], bool]
    prepare: Callable
    device_modeled: bool = False


_BACKENDS: list[Backend] = []


def register_backend(backend: Backend) -> Backend:
    """Add a backend (tried in registration order)."""
    _BACKENDS.append(backend)
    return backend


def _is_kernel(fn) -> bool:
    from .lang import Kernel
    from .lang.internal import KernelLaunch

    return isinstance(fn, (Kernel, KernelLaunch))


def _prepare_sim(fn, args, kwargs):
    from .lang import simulate
    from .spec import preset as _preset

    state = {}

    def run():
        r = simulate(fn, *args, **kwargs)
        state["summary"] = r.summary
        return r.summary.total_us

    def describe():
        s = state["summary"]
        spec = _preset(kwargs.get("preset"))
        kernel = fn.kernel if hasattr(fn, "kernel") else fn
        notes = (f"Device time is the kernel's modeled duration; the runtime's launch cost "
                 f"(assumed {spec.runtime_exec_us:g} us per execution) is not included.",
                 "Host time is the simulator's (tracing cached, numerics run every iteration).")
        return kernel.name, s.preset, notes, s

    return run, describe


register_backend(Backend("sim", _is_kernel, _prepare_sim, device_modeled=True))


class SilentFallbackError(RuntimeError):
    """A benchmarked function computed on another device than its inputs are on."""


def bench(fn, *args, warmup: int = 3, iters: int | None = 20, min_time: float | None = None,
          max_iters: int = 1000, rel_spread: float | None = None, **kwargs) -> BenchResult:
    """Benchmark ``fn(*args, **kwargs)``: ``warmup`` untimed runs, then timed ones.

    Repetition: ``iters`` runs; with ``min_time`` (seconds), at least that much timed work;
    with ``rel_spread``, more runs (up to ``max_iters``) until the spread of the middle 80%
    ``(p90 - p10) / p50`` is at most that. For a tile kernel, ``kwargs`` may hold ``grid=`` /
    ``preset=`` as for ``tilescope.simulate``; for a PyTorch function, ``allow_fallback=True``
    and ``flush_l2=True`` (CUDA) are options, the rest are passed to ``fn``.
    """
    if (iters is not None and iters < 1) or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}")
    if iters is None and min_time is None:
        raise ValueError("give iters= or min_time= (or both)")
    for backend in _BACKENDS:
        if backend.matches(fn):
            break
    else:
        raise TypeError(
            f"bench() has no backend for {type(fn).__name__} {getattr(fn, '__name__', fn)!r}; "
            f"backends: {', '.join(b.name for b in _BACKENDS)} (tile kernels: decorate with @tilescope.kernel)")
    run, describe = backend.prepare(fn, args, kwargs)
    for _ in range(warmup):
        run()
    host, device = [], []
    spent = 0.0
    target = iters or 1
    while True:
        t0 = time.perf_counter()
        d = run()
        elapsed = time.perf_counter() - t0
        spent += elapsed
        host.append(elapsed * 1e6)
        device.append(d)
        n = len(host)
        if n >= max_iters:
            break
        if n < target or (min_time is not None and spent < min_time):
            continue
        if rel_spread is not None and n >= 5:
            data = np.asarray([x for x in device] if device[0] is not None else host, dtype=np.float64)
            p10, p50, p90 = np.percentile(data, (10, 50, 90))
            if p50 > 0 and (p90 - p10) / p50 > rel_spread:
                continue
        break
    name, preset, notes, summary = describe()
    dev = None if any(d is None for d in device) else np.asarray(device, dtype=np.float64)
    if backend.name == "torch":  # name the device it ran on: sim, cuda or cpu
        return BenchResult(name, _device_of(args).type, warmup, len(host), np.asarray(host), dev,
                           _torch_modeled(args), preset, tuple(notes), summary)
    return BenchResult(name, backend.name, warmup, len(host), np.asarray(host), dev, backend.device_modeled,
                       preset, tuple(notes), summary)


def _torch_modeled(args) -> bool:
    return _device_of(args).type not in ("cpu", "cuda", "meta")


# ---- PyTorch functions ----------------------------------------------------------------

def _tensors(x):
    import torch

    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)


def _device_of(args):
    import torch

    for t in _tensors(args):
        return t.device
    return torch.device("cpu")


def _is_torch_fn(fn) -> bool:
    return callable(fn) and not _is_kernel(fn)


def _synchronizer(device):
    import torch

    if device.type == "cpu":
        return lambda: None
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    module = getattr(torch, device.type, None)
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "synchronize"):
        try:
            acc.synchronize(device)
            return lambda: acc.synchronize(device)
        except RuntimeError:  # a backend whose hooks cannot synchronise through torch.accelerator
            pass
    if module is None or not hasattr(module, "synchronize"):
        raise RuntimeError(f"cannot synchronise device {device}: neither torch.accelerator nor torch.{device.type} can")
    return module.synchronize


def _prepare_torch(fn, args, kwargs):
    import torch

    allow_fallback = kwargs.pop("allow_fallback", False)
    flush_l2 = kwargs.pop("flush_l2", False)
    device = _device_of(args)
    sync = _synchronizer(device)
    name = getattr(fn, "__name__", type(fn).__name__)
    notes = []
    state = {"checked": False}
    flush_buf = None
    if flush_l2 and device.type == "cuda":
        flush_buf = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device=device)
        notes.append("L2 flushed before each iteration (256 MB write)")

    def check(out):
        other = sorted({str(t.device) for t in _tensors(out)} - {str(device)})
        if other and not allow_fallback:
            raise SilentFallbackError(
                f"{name}: inputs are on {device} but outputs are on {', '.join(other)}: the work did not run "
                f"(only) on {device}. Pass allow_fallback=True to time it anyway.")
        if other:
            notes.append(f"outputs on {', '.join(other)} while inputs are on {device} (fallback allowed)")
        state["checked"] = True

    if device.type == "cuda":
        def run():
            if flush_buf is not None:
                flush_buf.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            sync()
            if not state["checked"]:
                check(out)
            return start.elapsed_time(end) * 1000.0
    elif device.type == "cpu":
        def run():
            out = fn(*args, **kwargs)
            if not state["checked"]:
                check(out)
            return None
    else:  # the simulated device: the modeled span of the device work this call launched
        from .device import now_ns
        from .device.internal import core_end_ns

        core = device.index or 0

        def run():
            before = max(now_ns(), core_end_ns(core))
            out = fn(*args, **kwargs)
            sync()
            after = core_end_ns(core)
            if not state["checked"]:
                check(out)
            return max(0.0, after - before) / 1000.0
        from .device import settings as _settings

        s = _settings()
        notes.append(f"device time: modeled span of the device work of each call on {s.preset.name} "
                     f"({s.clock} clock), including the assumed runtime cost "
                     f"({s.preset.runtime_exec_us:g} us per execution)"
                     + ("; with the wall clock the span also holds the time the device waited for this "
                        "machine's host to dispatch the next op (it varies between runs; "
                        "tilescope.device.configure(clock='virtual') models the host's dispatch instead)"
                        if s.clock == "wall" else ""))

    def describe():
        preset = None
        if device.type not in ("cpu", "cuda"):
            from .device import settings as _settings

            preset = _settings().preset.name
        measured = {"cuda": f"measured with CUDA events on {torch.cuda.get_device_name(device)}"
                    if device.type == "cuda" else None, "cpu": "host time measured on this CPU"}.get(device.type)
        return name, preset, tuple(notes) + ((measured,) if measured else ()), None

    return run, describe


register_backend(Backend("torch", _is_torch_fn, _prepare_torch))


@dataclass(frozen=True)
class Comparison:
    """Several benchmarks of one input, printed side by side with ratios to the first."""

    results: dict[str, BenchResult]

    def table(self):
        from rich.markup import escape
        from rich.table import Table

        first = next(iter(self.results.values()))
        use_device = all(r.device_us is not None for r in self.results.values())
        base = first.device_median_us if use_device else first.host_median_us
        modeled = any(r.device_modeled for r in self.results.values())
        t = Table(title="comparison (" + ("device time, modeled" if modeled and use_device else
                                          "device time" if use_device else "host time") + ")")
        for col in ("name", "backend", "iters", "host p50 us", "device p50 us", f"ratio to {first.name}"):
            t.add_column(escape(col), justify="left" if col in ("name", "backend") else "right")
        for name, r in self.results.items():
            value = r.device_median_us if use_device else r.host_median_us
            t.add_row(escape(name), r.backend, str(r.iters), f"{r.host_median_us:,.1f}",
                      "-" if r.device_us is None else f"{r.device_median_us:,.2f}",
                      f"{value / base:.2f}x" if base else "-")
        return t

    def to_dict(self) -> dict:
        return {name: r.to_dict() for name, r in self.results.items()}

    def __rich__(self):
        return self.table()

    def __str__(self) -> str:
        from ._console import console as _console

        console = _console(width=110, record=True, file=_Null())
        console.print(self.table())
        return console.export_text().rstrip()


def compare(fns: dict, *args, **kwargs) -> Comparison:
    """``bench`` each of ``{name: fn}`` on the same arguments; the first is the reference."""
    results = {}
    for name, fn in fns.items():
        r = bench(fn, *args, **kwargs)
        results[name] = BenchResult(name, r.backend, r.warmup, r.iters, r.host_us, r.device_us, r.device_modeled,
                                    r.preset, r.notes, r.summary)
    return Comparison(results)
