"""``ProfileConfig``: what the profiler captures, validated once.

It subclasses torch's experimental profiler config, so it is passed as
``torch.profiler.profile(..., experimental_config=cfg)`` and torch keeps it on the
profile object, where the exporter finds it.

>>> cfg = ProfileConfig(output_dir="out", capture_cores="0,2-3")
>>> sorted(cfg.cores)
[0, 2, 3]
>>> [m.name for m in cfg.modes]
['DEVICE', 'RUNTIME']
"""

from __future__ import annotations

import enum
import operator
import os

from torch._C._profiler import _ExperimentalConfig

__all__ = ["ProfileConfig", "ProfileMode", "parse_cores", "mode_of"]


class ProfileMode(enum.Enum):
    DEVICE = "device"  # per-instruction traces of every device execution (executable + itrace pairs)
    RUNTIME = "runtime"  # runtime and hardware lanes in the system trace
    HOST_CPU = "host_cpu"  # host CPU utilisation samples
    HOST_MEMORY = "host_memory"  # host memory (torch profile_memory)


def parse_cores(spec: str | None) -> frozenset[int] | None:
    """``"0,1,2-5"`` -> {0, 1, 2, 3, 4, 5}; None or "" or "all" -> None (every core)."""
    if spec is None or str(spec).strip() in ("", "all"):
        return None
    cores: set[int] = set()
    for part in str(spec).split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise OverflowError  # (a reversed range: its own message below)
                cores.update(range(lo, hi + 1))
            else:
                cores.add(int(part))
        except OverflowError:
            raise ValueError(f"capture_cores {spec!r}: the range {part!r} runs backwards; write it "
                             f"low-high ({part.split('-')[1].strip()}-{part.split('-')[0].strip()})") from None
        except ValueError:
            raise ValueError(
                f"capture_cores {spec!r}: cannot read {part!r}; use core ids and ranges like \"0,1,2-5\""
            ) from None
    if any(c < 0 for c in cores):
        raise ValueError(f"capture_cores {spec!r}: core ids must be >= 0")
    return frozenset(cores)


def mode_of(value) -> ProfileMode:
    """A mode from itself, its name (``"DEVICE"``, as manifests write it) or its value (``"device"``).

    >>> mode_of("DEVICE"), mode_of("host_cpu")
    (<ProfileMode.DEVICE: 'device'>, <ProfileMode.HOST_CPU: 'host_cpu'>)
    """
    if isinstance(value, ProfileMode):
        return value
    text = str(value).strip()
    for mode in ProfileMode:
        if text.upper() == mode.name:
            return mode
    raise ValueError(f"unknown profile mode {value!r}; use one of {', '.join(m.name for m in ProfileMode)}")


class ProfileConfig(_ExperimentalConfig):
    """The profile configuration (also torch's ``experimental_config``).

    Args:
        modes: data streams (default device instruction traces + runtime lanes).
        capture_cores: cores to capture, e.g. ``"0,1,2-5"`` (default all).
        output_dir: where profile directories are written.
        max_events_per_core: instruction events kept per core (a ring buffer; drops are
            counted and reported in the manifest and by the doctor).
        correlate_device_time: put modeled device time into ``key_averages()``.
        executable_cache_dir: also keep every executable here (shared across profiles).
        device_profile: ``"first"`` -- instruction traces for the first run of each Program;
            ``"session"`` -- for every run.
        profile_all_threads: torch records the ops of every thread, not only of the one that
            started the profiler (torch's own option, off by default): device work launched
            from other threads is then linked to its ops. Without it, that work is still in the
            profile, on a lane of its launching thread with no ops.
    """

    def __init__(self, *, modes=(ProfileMode.DEVICE, ProfileMode.RUNTIME), capture_cores: str | None = None,
                 output_dir: str | os.PathLike = "profile_out", max_events_per_core: int = 1_000_000,
                 correlate_device_time: bool = True, executable_cache_dir: str | os.PathLike | None = None,
                 device_profile: str = "first", profile_all_threads: bool = False):
        super().__init__(profile_all_threads=bool(profile_all_threads))
        modes = tuple(mode_of(m) for m in ([modes] if isinstance(modes, (str, ProfileMode)) else modes))
        if not modes:
            raise ValueError("modes is empty; pick at least one of " + ", ".join(m.name for m in ProfileMode))
        try:
            events = operator.index(max_events_per_core)  # whole numbers only: not 1.5, not "abc"
        except TypeError:
            events = 0
        if isinstance(max_events_per_core, bool) or events < 1:
            raise ValueError(f"max_events_per_core must be a whole number >= 1 (instruction events kept per "
                             f"core), got {max_events_per_core!r}; the default keeps 1,000,000")
        if device_profile not in ("first", "session"):
            raise ValueError(f"device_profile must be 'first' or 'session', got {device_profile!r}")
        self.modes = modes
        self.capture_cores = capture_cores
        self.cores = parse_cores(capture_cores)
        self.output_dir = os.fspath(output_dir)
        if os.path.exists(self.output_dir) and not os.path.isdir(self.output_dir):
            raise ValueError(f"output_dir {self.output_dir!r} is a file; profiles are directories written "
                             f"under it: pass a directory (it is created if missing)")
        self.max_events_per_core = events
        self.correlate_device_time = bool(correlate_device_time)
        self.executable_cache_dir = os.fspath(executable_cache_dir) if executable_cache_dir else None
        self.device_profile = device_profile
        self.profile_all_threads = bool(profile_all_threads)

    def has(self, mode: ProfileMode) -> bool:
        return mode in self.modes

    def captures(self, core: int) -> bool:
        return self.cores is None or core in self.cores

    def to_dict(self) -> dict:
        return {
            "modes": [m.name for m in self.modes],
            "capture_cores": self.capture_cores,
            "output_dir": self.output_dir,
            "max_events_per_core": self.max_events_per_core,
            "correlate_device_time": self.correlate_device_time,
            "executable_cache_dir": self.executable_cache_dir,
            "device_profile": self.device_profile,
            "profile_all_threads": self.profile_all_threads,
        }

    def __repr__(self) -> str:
        return "ProfileConfig(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"
