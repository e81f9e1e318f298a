"""Build (once, cached) and load the device's small native runtime.

PyTorch needs a few pieces of a backend in C++: the memory allocator that
``torch.UntypedStorage(n, device="sim")``, ``copy.deepcopy`` and ``torch.load`` reach,
a device guard that knows several cores, generators, pinned host memory, and the
metadata-only kernels (``empty``, ``view``, ``as_strided``, ``set_``). They live in
``_csrc/runtime.cpp``; ``_csrc/profiler.cpp`` is the device's activity profiler for Kineto,
through which torch.profiler records device executions itself; ``_csrc/worker.cpp`` the device
worker and the modeled clock, ``_csrc/dispatch.cpp`` the device's kernel (a native fast path in
front of the Python handlers). They are
built with ``torch.utils.cpp_extension`` the first time the device is registered and cached
under ``$TILESCOPE_CACHE_DIR`` (default ``~/.cache/tilescope``), keyed by the sources, torch
and Python versions. A cold build takes about 30 s; a cached load a few milliseconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
from pathlib import Path

import torch

__all__ = ["load", "cache_dir"]

_SOURCES = tuple(Path(__file__).with_name("_csrc") / name
                 for name in ("runtime.cpp", "profiler.cpp", "worker.cpp", "dispatch.cpp"))
_HEADERS = (Path(__file__).with_name("_csrc") / "sim.h",)
_MODULE = None


def cache_dir() -> Path:
    root = os.environ.get("TILESCOPE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tilescope")
    return Path(root)


def _build_dir() -> tuple[Path, str]:
    src = b"".join(path.read_bytes() for path in _SOURCES + _HEADERS)
    tag = hashlib.sha256(src + torch.__version__.encode() + sys.version.encode()).hexdigest()[:12]
    name = f"tilescope_sim_runtime_{tag}"
    return cache_dir() / "native" / name, name


@contextlib.contextmanager
def _lock(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _import(so: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load():
    """The native runtime module, built first if no cached build matches."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    build, name = _build_dir()
    so = build / f"{name}.so"
    if not so.exists():
        with _lock(build.parent / f"{name}.lock"):
            if not so.exists():
                _MODULE = _compile(build, name)
                return _MODULE
    _MODULE = _import(so, name)
    return _MODULE


def _compile(build: Path, name: str):
    from torch.utils import cpp_extension

    build.mkdir(parents=True, exist_ok=True)
    print(f"tilescope: building the sim device's native runtime once (about 30 s) into {build}",
          file=sys.stderr)
    try:
        return cpp_extension.load(name, [str(p) for p in _SOURCES], extra_cflags=["-O2", *_kineto_flags()],
                                  build_directory=str(build), verbose=False)
    except Exception as e:  # the compiler's output is in the exception text
        raise RuntimeError(
            f"could not build the sim device's native runtime ({', '.join(p.name for p in _SOURCES)}) with "
            f"torch.utils.cpp_extension: {e}. It needs a C++17 compiler (g++ or clang++) and ninja; "
            f"install them (e.g. apt-get install g++ ninja-build, or pip install ninja) and retry. "
            f"Build files: {build}"
        ) from e


def _kineto_flags() -> list[str]:
    """The device's activity profiler is compiled in when torch has Kineto (its headers ship
    with torch under ``include/kineto``)."""
    kineto = Path(torch.__file__).parent / "include" / "kineto"
    if torch.autograd.kineto_available() and (kineto / "IActivityProfiler.h").exists():
        return ["-DUSE_KINETO", f"-I{kineto}"]
    return []
