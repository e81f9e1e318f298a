"""The C ABI of a built operator library, through ctypes.

Struct layouts mirror ``tilescope/gpsimd.h`` and the runtime source; :class:`NativeLibrary`
checks the ABI version and the struct sizes when it opens a library, so a mismatch is a
clear error rather than corrupted memory.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._errors import CppError

__all__ = ["NativeLibrary", "NativeOp", "TensorDesc", "Arg", "RunStats", "Stop", "LOG_DTYPE", "COUNT_DTYPE",
           "DTYPE_CODES", "ABI_VERSION", "interrupt_all", "MAX_DIMS", "STOP_NONE", "STOP_FAULT", "STOP_TIMEOUT", "STOP_INTERRUPTED",
           "STOP_CANCELLED"]

ABI_VERSION = 4
MAX_DIMS = 8

# tilescope dtype name -> code of tilescope::ScalarType (gpsimd.h)
DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2, "int32": 3, "int16": 4, "int8": 5, "uint8": 6, "bool": 7}
ROLE_INPUT, ROLE_OUTPUT, ROLE_META = 0, 1, 2


class TensorDesc(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("sizes", ctypes.c_int64 * MAX_DIMS),
        ("numel", ctypes.c_int64),
        ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("role", ctypes.c_int32),
        ("index", ctypes.c_int32),
    ]


class Arg(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("f", ctypes.c_double),
        ("i", ctypes.c_int64),
        ("t", TensorDesc),
    ]


class RunStats(ctypes.Structure):
    _fields_ = [
        ("blocks", ctypes.c_int64),  # distinct basic blocks counted (counting builds)
        ("executed", ctypes.c_int64),  # basic blocks executed (counting builds)
        ("tcm_peak", ctypes.c_int64),
        ("tcm_leaked", ctypes.c_int64),
        ("leaks", ctypes.c_int32),
        ("dst_requested", ctypes.c_int32),
    ]


# executions of one basic block (counting builds): its probe's return address, relative to the
# library's load base, and how often the block ran
COUNT_DTYPE = np.dtype([("offset", np.uint64), ("count", np.uint64)])

# one record per accessor copy: direction 0 = tensor -> TCM, 1 = TCM -> tensor
LOG_DTYPE = np.dtype([
    ("dir", np.int32), ("arg", np.int32), ("file", np.int32), ("line", np.int32),
    ("core", np.int32), ("elem_size", np.int32), ("offset", np.int64), ("count", np.int64),
])

_ERR_LEN = 8192
_MAX_FRAMES = 24

# how a failed run stopped (runtime/fault_guard.h, guard::Outcome)
STOP_NONE, STOP_FAULT, STOP_TIMEOUT, STOP_INTERRUPTED, STOP_CANCELLED = 0, 2, 3, 4, 5


@dataclass(frozen=True)
class Stop:
    """How a failed run stopped: ``outcome`` (a ``STOP_*`` code; ``STOP_NONE`` when a check
    failed or the kernel threw) and the stopped code's frames as offsets in the library
    (the stopped instruction first, then return addresses; None for one in another object)."""

    outcome: int
    frames: tuple[int | None, ...] = ()


@dataclass(frozen=True)
class NativeOp:
    """One ``m.def`` of a library: where it was defined and its argument kinds."""

    index: int
    lib: str
    name: str
    kinds: str  # one letter per argument: t (Tensor), f (double), i (int64_t), b (bool)
    file: str
    line: int

    @property
    def qualname(self) -> str:
        return f"{self.lib}::{self.name}"


_OPENED: "weakref.WeakSet[NativeLibrary]" = weakref.WeakSet()


def interrupt_all() -> int:
    """Stop every C++ kernel running on any thread, in every opened library (the device's
    queued work being cancelled); returns how many were asked to stop."""
    for lib in list(_OPENED):  # they share one fault guard (_share_guard): any one reaches every kernel
        return lib.interrupt()
    return 0


_GUARD_LOCK = threading.Lock()
_GUARD: list[tuple[int, int]] = []  # the fault guard state of the first library opened: (address, size)


def _share_guard(dll) -> None:
    """One fault guard for every library in the process (runtime/fault_guard.h, ``Shared``):
    the first library's state is adopted by the later ones (each links its own copy)."""
    dll.ts_guard_state.restype = ctypes.c_void_p
    dll.ts_guard_state.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    dll.ts_guard_adopt.restype = ctypes.c_int
    dll.ts_guard_adopt.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    with _GUARD_LOCK:
        if not _GUARD:
            size = ctypes.c_int64()
            _GUARD.append((dll.ts_guard_state(ctypes.byref(size)), size.value))
            return
        address, size = _GUARD[0]
        if not dll.ts_guard_adopt(address, size):
            raise CppError(f"C++ operator libraries of different tilescope versions in one process "
                           f"(fault guard of {size} bytes expected); rebuild them with tilescope.cpp.load(...)")


class NativeLibrary:
    """An opened operator library (``dlopen``) and its operator table."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            dll = ctypes.CDLL(str(self.path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as e:
            raise CppError(f"cannot load C++ operator library {str(self.path)!r}: {e}") from None
        self._dll = dll
        try:
            dll.ts_abi_version.restype = ctypes.c_int
        except AttributeError:
            raise CppError(
                f"{self.path} is not a tilescope C++ operator library (no ts_abi_version symbol); build "
                f"libraries with tilescope.cpp.load(...)"
            ) from None
        version = dll.ts_abi_version()
        if version != ABI_VERSION:
            raise CppError(
                f"{self.path} was built against C++ operator ABI {version}, but this tilescope speaks ABI "
                f"{ABI_VERSION}; rebuild it with tilescope.cpp.load(...)"
            )
        sizes = (ctypes.c_int64 * 4)()
        dll.ts_abi_sizes(sizes)
        want = (ctypes.sizeof(TensorDesc), ctypes.sizeof(Arg), LOG_DTYPE.itemsize, ctypes.sizeof(RunStats))
        if tuple(sizes) != want:
            raise CppError(f"{self.path}: struct sizes {tuple(sizes)} differ from tilescope's {want}; rebuild it")
        for fname in ("ts_registration_error", "ts_op_lib", "ts_op_name", "ts_op_kinds", "ts_op_file",
                      "ts_note", "ts_log_file"):
            getattr(dll, fname).restype = ctypes.c_char_p
        dll.ts_op_line.restype = ctypes.c_int
        dll.ts_op_count.restype = ctypes.c_int
        dll.ts_shape.argtypes = [ctypes.c_int, ctypes.POINTER(Arg), ctypes.c_int, ctypes.POINTER(TensorDesc),
                                 ctypes.c_char_p, ctypes.c_int]
        dll.ts_run.argtypes = [ctypes.c_int, ctypes.POINTER(Arg), ctypes.c_int, ctypes.POINTER(TensorDesc),
                               ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int64, ctypes.c_int32,
                               ctypes.POINTER(RunStats), ctypes.c_char_p, ctypes.c_int, ctypes.c_double]
        dll.ts_stop_info.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
        dll.ts_interrupt.restype = ctypes.c_int
        dll.ts_build_cores.restype = ctypes.c_int
        dll.ts_note.argtypes = [ctypes.c_int]
        dll.ts_log_size.restype = ctypes.c_int64
        dll.ts_log_data.restype = ctypes.c_void_p
        dll.ts_log_file_count.restype = ctypes.c_int
        dll.ts_count_size.restype = ctypes.c_int64
        dll.ts_count_size.argtypes = [ctypes.c_int]
        dll.ts_count_data.restype = ctypes.c_void_p
        dll.ts_count_data.argtypes = [ctypes.c_int]
        err = dll.ts_registration_error().decode()
        if err:
            raise CppError(err)
        self.ops = [
            NativeOp(i, dll.ts_op_lib(i).decode(), dll.ts_op_name(i).decode(), dll.ts_op_kinds(i).decode(),
                     dll.ts_op_file(i).decode(), dll.ts_op_line(i))
            for i in range(dll.ts_op_count())
        ]
        _share_guard(dll)
        _OPENED.add(self)

    @property
    def built_cores(self) -> int | None:
        """The cores the library was built to run on (1, or the GpSimd cores for a multicore
        build); None for a build that did not record it."""
        return self._dll.ts_build_cores() or None

    def shape(self, op: NativeOp, args) -> tuple[TensorDesc | None, str, Stop]:
        """Run the shape function: (the output's description, or None and the error message,
        and how it stopped)."""
        out = TensorDesc()
        err = ctypes.create_string_buffer(_ERR_LEN)
        if self._dll.ts_shape(op.index, args, len(args), ctypes.byref(out), err, _ERR_LEN):
            return None, err.value.decode(errors="replace"), self._stop()
        return out, "", Stop(STOP_NONE)

    def run(self, op: NativeOp, args, dst: TensorDesc, cores: int, tcm_bytes: int, log: bool,
            count: bool = False, timeout_s: float | None = None,
            guard: bool = True) -> tuple[int | None, str, list[RunStats], Stop]:
        """Run the kernel as cores 0 .. cores-1, one after another, in one native call.

        ``count``: count the basic blocks each core executes (libraries built for counting).
        ``timeout_s``: stop the call after that long (None or 0: no limit). ``guard=False`` runs
        without the fault guard (a fault then ends the process): only to measure its cost.
        Returns (index of the failing core or None, its error message, stats per core run,
        how it stopped).
        """
        stats = (RunStats * cores)()
        err = ctypes.create_string_buffer(_ERR_LEN)
        flags = (1 if log else 0) | (4 if count else 0) | (0 if guard else 8)
        rc = self._dll.ts_run(op.index, args, len(args), ctypes.byref(dst), 0, cores, cores, tcm_bytes, flags,
                              stats, err, _ERR_LEN, float(timeout_s or 0.0))
        failed = rc - 1 if rc else None
        stop = self._stop() if rc else Stop(STOP_NONE)
        return failed, err.value.decode(errors="replace"), list(stats), stop

    def _stop(self) -> Stop:
        out = (ctypes.c_uint64 * (_MAX_FRAMES + 2))()
        self._dll.ts_stop_info(out, len(out))
        frames = tuple(None if f == 2**64 - 1 else int(f) for f in out[2:2 + int(out[1])])
        return Stop(int(out[0]), frames)

    def interrupt(self) -> int:
        """Stop every kernel of this library running on any thread; returns how many."""
        return int(self._dll.ts_interrupt())

    def take_log(self) -> tuple[np.ndarray, list[str]]:
        """The accessor copies of the last :meth:`run` on this thread (all cores, with a ``core``
        field), and the source files they name."""
        n = self._dll.ts_log_size()
        if n == 0:
            records = np.zeros(0, LOG_DTYPE)
        else:
            buf = (ctypes.c_char * (n * LOG_DTYPE.itemsize)).from_address(self._dll.ts_log_data())
            records = np.frombuffer(buf, LOG_DTYPE).copy()
        files = [self._dll.ts_log_file(k).decode() for k in range(self._dll.ts_log_file_count())]
        return records, files

    def note(self, k: int) -> str:
        """Live TCM allocations when core run ``k`` of the last :meth:`run` returned (leaks)."""
        return self._dll.ts_note(k).decode(errors="replace")

    def take_counts(self, k: int) -> np.ndarray:
        """Executed blocks of core run ``k`` of the last counting :meth:`run` on this thread."""
        n = self._dll.ts_count_size(k)
        if n == 0:
            return np.zeros(0, COUNT_DTYPE)
        buf = (ctypes.c_char * (n * COUNT_DTYPE.itemsize)).from_address(self._dll.ts_count_data(k))
        return np.frombuffer(buf, COUNT_DTYPE).copy()
