"""The one benchmark API: warm-up, timed iterations, latency percentiles.

``bench(fn, *args, warmup=, iters=)`` picks a *backend* for ``fn`` from a table
(first match wins) and returns a :class:`BenchResult`. Each iteration records the
host's wall time and, where the backend has one, the device's time:

==========  ===================================  =====================================================
backend     runs                                 device time
==========  ===================================  =====================================================
``sim``     tile kernels (``@tilescope.kernel``)  the kernel's modeled duration (device model)
==========  ===================================  =====================================================

More backends (PyTorch functions on CPU / CUDA / the simulated device) register with
:func:`register_backend`. The modeled time of a kernel does not vary between runs, so its
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

__all__ = ["bench", "BenchResult", "Backend", "register_backend", "PERCENTILES"]

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
                "notes": list(self.notes)}

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
        from rich.console import Console

        console = Console(width=100, record=True, file=_Null())
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
    from .lang._kernel import Kernel, KernelLaunch

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


def bench(fn, *args, warmup: int = 3, iters: int = 20, **kwargs) -> BenchResult:
    """Benchmark ``fn(*args, **kwargs)``: ``warmup`` untimed runs, then ``iters`` timed ones.

    For a tile kernel, ``kwargs`` may hold ``grid=`` / ``preset=`` as for ``tilescope.simulate``.
    """
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}")
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
    for _ in range(iters):
        t0 = time.perf_counter()
        d = run()
        host.append((time.perf_counter() - t0) * 1e6)
        device.append(d)
    name, preset, notes, summary = describe()
    dev = None if any(d is None for d in device) else np.asarray(device, dtype=np.float64)
    return BenchResult(name, backend.name, warmup, iters, np.asarray(host), dev, backend.device_modeled,
                       preset, tuple(notes), summary)
