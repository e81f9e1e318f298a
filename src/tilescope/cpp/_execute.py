"""Run a kernel on CPU tensors as the GpSimd cores would: once per core, then check the output.

With ``cores = 8`` the kernel runs eight times, one after another, each time seeing its
own ``get_cpu_id()``, its own empty TCM pool and the same output tensor, which starts
filled with NaN (the most negative value for integers). Afterwards every core's writes
are checked (:mod:`._coverage`). On a library built for counting, ``count=True`` also
records the basic blocks each core executed (the device model's compute estimate).
"""

from __future__ import annotations

import hashlib
import re
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ._abi import (Arg, DTYPE_CODES, MAX_DIMS, ROLE_INPUT, ROLE_META, ROLE_OUTPUT, STOP_INTERRUPTED, STOP_NONE,
                   NativeLibrary, NativeOp, Stop, TensorDesc)
from ._coverage import CoverageReport, check_coverage, coverage_message
from ._errors import CoverageError, CppError, CppKernelError, TcmLeakWarning
from ._where import user_line

__all__ = ["CoreRun", "CallRecord", "execute", "MAX_DIM_SIZE"]

MAX_DIM_SIZE = 65535  # neuron-customops devguide: up to 8 dims of at most 65535 each

_TORCH_DTYPES = {
    torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.int32: "int32",
    torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
}
_FROM_CODE = {v: k for k, v in DTYPE_CODES.items()}
_TORCH_FROM_NAME = {v: k for k, v in _TORCH_DTYPES.items()}


@dataclass
class CoreRun:
    """What one core did in one call."""

    core: int
    log: np.ndarray  # accessor copies (see _abi.LOG_DTYPE)
    files: list[str]
    counts: np.ndarray | None = None  # executed blocks (see _abi.COUNT_DTYPE), counting runs only
    tcm_peak: int = 0
    dst_requested: bool = False


@dataclass
class CallRecord:
    """One call of an operator: arguments, output, and each core's run."""

    op: NativeOp
    arg_specs: list  # per argument: (name, shape, dtype) for tensors, None for scalars
    out_spec: tuple  # (shape, dtype)
    cores: list[CoreRun]
    coverage: CoverageReport

    def digest(self) -> str:
        """Identifies the transfer pattern (what the modeled Program depends on)."""
        h = hashlib.sha256(repr((self.arg_specs, self.out_spec)).encode())
        for run in self.cores:
            h.update(run.log[["dir", "arg", "offset", "count", "line"]].tobytes())
            h.update(repr(run.files).encode())
        return h.hexdigest()[:24]


def _poison(t: torch.Tensor) -> None:
    if t.dtype.is_floating_point:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).min)


def _desc(t: torch.Tensor, role: int, index: int, what: str, meta: bool = False) -> TensorDesc:
    name = _TORCH_DTYPES.get(t.dtype)
    if name is None:
        raise CppError(
            f"{what} has dtype {t.dtype}; C++ operators accept "
            f"{', '.join(str(d) for d in _TORCH_DTYPES)} (the simulated device's types): cast it first"
        )
    if t.dim() > MAX_DIMS or any(n > MAX_DIM_SIZE for n in t.shape):
        raise CppError(
            f"{what} has shape {tuple(t.shape)}: C++ operator tensors have at most {MAX_DIMS} dimensions of at "
            f"most {MAX_DIM_SIZE} elements each (as on the device); reshape it, e.g. split a long dimension"
        )
    d = TensorDesc()
    d.data = t.data_ptr() if t.numel() and not meta else None
    for k, n in enumerate(t.shape):
        d.sizes[k] = n
    d.numel = t.numel()
    d.ndim = t.dim()
    d.dtype = DTYPE_CODES[name]
    d.role = role
    d.index = index
    return d


def pack_args(op: NativeOp, args: tuple, names: list[str], meta: bool = False) -> tuple:
    """ctypes argument array (and the CPU tensors it points at, kept alive by the caller)."""
    if len(args) != len(op.kinds):
        raise CppError(f"{op.qualname} takes {len(op.kinds)} arguments ({', '.join(names)}), got {len(args)}")
    packed = (Arg * max(1, len(args)))()
    keep = []
    for k, (kind, a) in enumerate(zip(op.kinds, args)):
        p = packed[k]
        p.kind = ord(kind)
        what = f"argument {k} ({names[k]!r}) of {op.qualname}"  # (the C++ parameter's name)
        if kind == "t":
            if not isinstance(a, torch.Tensor):
                raise CppError(f"{what} must be a Tensor, got {type(a).__name__}")
            if not meta:
                a = a.detach()
                if a.device.type != "cpu":
                    a = a.cpu()
                a = a.contiguous()
                keep.append(a)
            p.t = _desc(a, ROLE_META if meta else ROLE_INPUT, k, what, meta=meta)
        elif kind == "f":
            p.f = float(a)
        elif kind == "i":
            p.i = int(a)
        else:
            p.i = 1 if a else 0
    return packed, keep


def out_from_shape(lib: NativeLibrary, op: NativeOp, args: tuple, names: list[str],
                   show=lambda s: s) -> tuple[tuple, str]:
    """(shape, dtype name) of the output, from the operator's shape function."""
    packed, _ = pack_args(op, args, names, meta=True)
    d, msg, stop = lib.shape(op, packed)
    if d is None:
        if stop.outcome == STOP_INTERRUPTED:
            raise KeyboardInterrupt(f"{op.qualname}: {msg}")
        if stop.outcome != STOP_NONE:  # it faulted or ran past the limit
            raise CppKernelError(f"{op.qualname}: {_with_line(lib, stop, show(msg), show)}")
        raise CppError(f"shape function of {op.qualname}: {show(_named(msg, names))}")
    if d.ndim < 0 or d.ndim > MAX_DIMS:
        raise CppError(f"shape function of {op.qualname} returned a tensor with {d.ndim} dimensions")
    if d.dtype not in _FROM_CODE:
        raise CppError(f"shape function of {op.qualname} returned dtype code {d.dtype}, which is not a dtype")
    return tuple(int(d.sizes[k]) for k in range(d.ndim)), _FROM_CODE[d.dtype]


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_FROM_NAME[name]


def _named(msg: str, names: list[str]) -> str:
    """``argument 1`` in a runtime message gains the C++ parameter's name.

    >>> _named("into argument 1, an input; argument 0 (shape [4])", ["x", "y"])
    "into argument 1 ('y'), an input; argument 0 ('x', shape [4])"
    """
    def name(m):
        k = int(m.group(1))
        if k >= len(names):
            return m.group(0)
        return f"argument {k} ({names[k]!r}, " if m.group(2) else f"argument {k} ({names[k]!r})"

    return re.sub(r"\bargument (\d+)\b(?! \(')( \()?", name, msg)


def _with_line(lib: NativeLibrary, stop: Stop, msg: str, show) -> str:
    """A stopped kernel's message, led by the user's line (from its frames) when one is known."""
    if stop.outcome == STOP_NONE or not stop.frames:
        return msg
    at = user_line(lib.path, stop.frames)
    if at is None:
        return msg
    func = f" (in {at.function})" if at.function else ""
    text = at.text
    shown = f"\n    {at.line} | {text.strip()}" if text.strip() else ""
    return f"{show(at.file)}:{at.line}: {msg}{func}{shown}"


def _leak_message(qualname: str, leaks: list[tuple[int, int, int, str]]) -> str:
    """One short line for a call's leaks: cores that leaked the same buffers are named once.

    >>> _leak_message("m::op", [(c, 1, 40, "40 B at k.cpp:9") for c in range(8)])
    'm::op: GpSimd cores 0-7 each returned without tcm_free of 1 TCM buffer(s), 40 bytes (40 B at k.cpp:9); tcm_free what you tcm_malloc'
    """
    groups: dict[tuple, list[int]] = {}
    for core, n, nbytes, note in leaks:
        groups.setdefault((n, nbytes, note), []).append(core)
    parts = []
    for (n, nbytes, note), cores in groups.items():
        who = f"GpSimd core {cores[0]}" if len(cores) == 1 else f"GpSimd cores {_ranges(cores)} each"
        parts.append(f"{who} returned without tcm_free of {n} TCM buffer(s), {nbytes} bytes ({note})")
    return f"{qualname}: {'; '.join(parts)}; tcm_free what you tcm_malloc"


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out, start = [], None
    for k, v in enumerate(values):
        if start is None:
            start = v
        if k + 1 == len(values) or values[k + 1] != v + 1:
            out.append(f"{start}-{v}" if v > start else f"{v}")
            start = None
    return ", ".join(out)


def execute(lib: NativeLibrary, op: NativeOp, args: tuple, names: list[str], *, cores: int, tcm_bytes: int,
            check: str = "raise", count: bool = False, show=lambda s: s,
            out: torch.Tensor | None = None, timeout_s: float | None = None,
            warn_leaks: bool = True) -> tuple[torch.Tensor, CallRecord]:
    """Run ``op`` on ``cores`` emulated GpSimd cores; returns the output and the call record.

    ``check``: ``"raise"`` (default), ``"warn"`` or ``"off"`` for the coverage check.
    ``count``: record each core's executed blocks (``lib`` must be a counting build).
    ``show`` rewrites file paths in messages the way the user wrote them.
    ``timeout_s``: stop a kernel that runs longer (a ``CppKernelError``); None: no limit.
    ``warn_leaks``: warn (``TcmLeakWarning``) about TCM buffers the kernel did not free.
    A kernel that faults, or is stopped, raises ``CppKernelError`` naming the core and, where
    its line tables tell, the source line; Ctrl-C inside it raises ``KeyboardInterrupt``.
    """
    shape, dtype = out_from_shape(lib, op, args, names, show)
    if out is None:
        out = torch.empty(shape, dtype=torch_dtype(dtype))
    _poison(out)
    packed, keep = pack_args(op, args, names)
    dst = _desc(out, ROLE_OUTPUT, -1, f"the output of {op.qualname}")
    failed, msg, stats, stop = lib.run(op, packed, dst, cores, tcm_bytes, log=True, count=count,
                                       timeout_s=timeout_s)
    if failed is not None:
        _raise_failed(lib, op, names, failed, cores, msg, stop, show)
    log, files = lib.take_log()
    files = [show(f) for f in files]
    runs: list[CoreRun] = []
    leaks = []
    for c, st in enumerate(stats):
        run = CoreRun(c, log[log["core"] == c], files, counts=lib.take_counts(c) if count else None,
                      tcm_peak=int(st.tcm_peak), dst_requested=bool(st.dst_requested))
        if st.leaks:
            leaks.append((c, int(st.leaks), int(st.tcm_leaked), show(lib.note(c))))
        runs.append(run)
    if leaks and warn_leaks:  # one short warning per call, every core's leaks in it
        warnings.warn(_leak_message(op.qualname, leaks), TcmLeakWarning, stacklevel=3)
    arg_specs = [(names[k], tuple(a.shape), _TORCH_DTYPES[a.dtype]) if kind == "t" else None
                 for k, (kind, a) in enumerate(zip(op.kinds, args))]
    report = check_coverage([r.log for r in runs], tuple(shape))
    record = CallRecord(op, arg_specs, (tuple(shape), dtype), runs, report)
    if not report.ok and check != "off":
        _report_coverage(op, runs, report, check)
    del keep
    return out, record


def _raise_failed(lib: NativeLibrary, op: NativeOp, names: list[str], failed: int, cores: int, msg: str,
                  stop: Stop, show) -> None:
    """Raise the error of a run that failed on core ``failed``: ``KeyboardInterrupt`` for Ctrl-C,
    else ``CppKernelError`` naming the core and, where known, the user's line."""
    if stop.outcome == STOP_INTERRUPTED:
        raise KeyboardInterrupt(f"{op.qualname}: {msg}")
    msg = show(_named(msg, names))
    if stop.outcome != STOP_NONE and "GpSimd core" not in msg:
        msg = f"on GpSimd core {failed} of {cores}: {msg}"
    where = f" (GpSimd core {failed} of {cores})" if cores > 1 and "GpSimd core" not in msg else ""
    raise CppKernelError(f"{op.qualname}{where}: {_with_line(lib, stop, msg, show)}")


def _report_coverage(op: NativeOp, runs: list[CoreRun], report: CoverageReport, check: str) -> None:
    """Raise (``check="raise"``) or warn about output elements written twice or never."""
    where = []
    for r in runs:
        w = r.log[(r.log["dir"] == 1) & (r.log["arg"] == -1)]
        lines = sorted({(r.files[f] if 0 <= f < len(r.files) else "?", int(ln))
                        for f, ln in zip(w["file"], w["line"])})
        where.append(" at " + ", ".join(f"{f}:{ln}" for f, ln in lines[:3]) if lines else "")
    message = coverage_message(report, [r.log for r in runs], op.qualname, where)
    if not any(r.dst_requested for r in runs):
        message += "\nHint: the kernel never called get_dst_tensor(), the only tensor a kernel can write."
    if check == "raise":
        raise CoverageError(message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)
