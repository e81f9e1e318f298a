"""``torch.sim``: the device module PyTorch looks up for the simulated device.

The same surface as ``torch.cuda`` where it applies: device count and selection,
``synchronize``, seeding and RNG state, memory statistics against the preset's HBM.

>>> import torch, tilescope.device
>>> _ = tilescope.device.register()
>>> torch.sim.device_count() >= 1, torch.sim.is_available()
(True, True)
"""

from __future__ import annotations

import contextlib

import sys

import torch

from . import _runtime, _special

__all__ = [
    "is_available", "is_initialized", "device_count", "current_device", "set_device", "device",
    "synchronize", "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
    "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all", "default_generators",
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "memory_stats", "mem_get_info", "empty_cache", "get_device_name",
    "get_device_capability", "get_amp_supported_dtype", "is_bf16_supported", "current_stream",
    "default_stream", "Stream",
]


def _rt():
    from ._dispatch import _rt as rt

    return rt


def _index(dev) -> int:
    if dev is None:
        return current_device()
    if isinstance(dev, int):
        return dev
    if isinstance(dev, str):
        dev = torch.device(dev)
    if isinstance(dev, torch.device):
        return dev.index if dev.index is not None else current_device()
    raise TypeError(f"expected a device index, name or torch.device, got {dev!r}")


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def _lazy_init() -> None:
    return None


def device_count() -> int:
    """Cores of the preset's chip (``sim:0`` ... ``sim:N-1``), each with its own timeline."""
    return _runtime.settings().preset.cores_per_chip


def current_device() -> int:
    return _rt().current_device()


def set_device(dev) -> None:
    _rt().set_current_device(_index(dev))


class device:
    """Context manager that makes ``dev`` the current device, like ``torch.cuda.device``."""

    def __init__(self, dev):
        self.idx = _index(dev)
        self.prev = -1

    def __enter__(self):
        self.prev = current_device()
        set_device(self.idx)

    def __exit__(self, *exc):
        set_device(self.prev)
        return False


def synchronize(dev=None) -> None:
    """Wait until work submitted so far is done: numerics computed and, with the wall
    clock, modeled device time elapsed. ``dev`` None waits for every core."""
    # torch's profiler synchronises the device as it stops (as it does CUDA, whose synchronize
    # records nothing): not one of the user's synchronize calls in the profile's tables
    core = None if dev is None else _index(dev)
    if sys._getframe(1).f_globals.get("__name__") == "torch.autograd.profiler":
        _runtime.synchronize(core, label=None)
    else:
        _runtime.synchronize(core)


# ---- random numbers ----------------------------------------------------------------------

class _DefaultGenerators:
    def __getitem__(self, i: int):
        if not 0 <= i < device_count():
            raise IndexError(f"device index {i} out of range for {device_count()} devices")
        return _special.default_generator(i)

    def __len__(self) -> int:
        return device_count()

    def __iter__(self):
        return (self[i] for i in range(len(self)))


default_generators = _DefaultGenerators()


def manual_seed(seed: int, dev=None) -> None:
    _runtime.wait_numerics()
    default_generators[_index(dev)].manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    _runtime.wait_numerics()
    for g in default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    _runtime.wait_numerics()
    default_generators[current_device()].seed()


def seed_all() -> None:
    _runtime.wait_numerics()
    for g in default_generators:
        g.seed()


def initial_seed() -> int:
    return default_generators[current_device()].initial_seed()


def get_rng_state(dev=None) -> torch.Tensor:
    _runtime.wait_numerics()
    return default_generators[_index(dev)].get_state()


def set_rng_state(state: torch.Tensor, dev=None) -> None:
    _runtime.wait_numerics()
    default_generators[_index(dev)].set_state(state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for i, s in enumerate(states):
        set_rng_state(s, i)


# ---- memory ------------------------------------------------------------------------------

def memory_stats(dev=None) -> dict:
    """Allocator counters of one core (bytes), in ``torch.cuda.memory_stats`` key style."""
    s = _rt().memory_stats(_index(dev))
    return {
        "allocated_bytes.all.current": s["allocated_bytes"],
        "allocated_bytes.all.peak": s["peak_bytes"],
        "allocation.all.allocated": s["allocations"],
        "allocation.all.freed": s["frees"],
        "reserved_bytes.all.current": s["allocated_bytes"] + _rt().cached_bytes(),
        "inactive_split_bytes.all.current": _rt().cached_bytes(),
        "limit_bytes": s["limit_bytes"],
    }


def memory_allocated(dev=None) -> int:
    return _rt().memory_stats(_index(dev))["allocated_bytes"]


def max_memory_allocated(dev=None) -> int:
    return _rt().memory_stats(_index(dev))["peak_bytes"]


def memory_reserved(dev=None) -> int:
    """Allocated bytes plus freed blocks kept for reuse (shared by the cores)."""
    return memory_allocated(dev) + _rt().cached_bytes()


max_memory_reserved = max_memory_allocated


def reset_peak_memory_stats(dev=None) -> None:
    _rt().reset_peak(_index(dev))


def mem_get_info(dev=None) -> tuple[int, int]:
    """(free, total) bytes of one core's HBM (the preset's ``hbm_bytes``)."""
    s = _rt().memory_stats(_index(dev))
    return s["limit_bytes"] - s["allocated_bytes"], s["limit_bytes"]


def empty_cache() -> None:
    """Return freed device memory kept for reuse (it is not counted as allocated) to the host."""
    _runtime.wait_numerics()
    _rt().empty_cache()


# ---- properties ------------------------------------------------------------------------

def get_device_name(dev=None) -> str:
    p = _runtime.settings().preset
    return f"tilescope simulated {p.generation} ({p.name}), core {_index(dev)}"


def get_device_capability(dev=None) -> tuple[int, int]:
    return (2, 0) if _runtime.settings().preset.generation.endswith("v2") else (3, 0)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# ---- streams: one default stream per core -----------------------------------------------

class Stream:
    """The default stream of a core (the only one: executions on a core run in order)."""

    def __init__(self, device=None, priority: int = 0):
        self.device_index = _index(device)

    def synchronize(self) -> None:
        synchronize(self.device_index)

    def wait_stream(self, other) -> None:
        return None

    def query(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<torch.sim.Stream device=sim:{self.device_index} (default stream)>"


def current_stream(dev=None) -> Stream:
    return Stream(dev)


default_stream = current_stream


@contextlib.contextmanager
def stream(s):
    yield s
