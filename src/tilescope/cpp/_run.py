"""Run a kernel on CPU tensors as the GpSimd cores would: once per core, then check the output.

With ``cores = 8`` the kernel runs eight times, one after another, each time seeing its
own ``get_cpu_id()``, its own empty TCM pool and the same output tensor, which starts
filled with NaN (the most negative value for integers). Afterwards every core's writes
are checked (:mod:`._coverage`). On a library built for counting, ``count=True`` also
records the basic blocks each core executed (the device model's compute estimate).
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ._abi import Arg, DTYPE_CODES, MAX_DIMS, ROLE_INPUT, ROLE_META, ROLE_OUTPUT, NativeLibrary, NativeOp, TensorDesc
from ._coverage import CoverageReport, check_coverage, coverage_message
from ._errors import CoverageError, CppError, CppKernelError, TcmLeakWarning

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
        what = f"argument {k} ({names[k]!r}) of {op.qualname}"
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
    try:
        d = lib.shape(op, packed)
    except CppError as e:
        raise CppError(show(str(e))) from None
    if d.ndim < 0 or d.ndim > MAX_DIMS:
        raise CppError(f"shape function of {op.qualname} returned a tensor with {d.ndim} dimensions")
    if d.dtype not in _FROM_CODE:
        raise CppError(f"shape function of {op.qualname} returned dtype code {d.dtype}, which is not a dtype")
    return tuple(int(d.sizes[k]) for k in range(d.ndim)), _FROM_CODE[d.dtype]


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_FROM_NAME[name]


def execute(lib: NativeLibrary, op: NativeOp, args: tuple, names: list[str], *, cores: int, tcm_bytes: int,
            check: str = "raise", count: bool = False, show=lambda s: s,
            out: torch.Tensor | None = None) -> tuple[torch.Tensor, CallRecord]:
    """Run ``op`` on ``cores`` emulated GpSimd cores; returns the output and the call record.

    ``check``: ``"raise"`` (default), ``"warn"`` or ``"off"`` for the coverage check.
    ``count``: record each core's executed blocks (``lib`` must be a counting build).
    ``show`` rewrites file paths in messages the way the user wrote them.
    """
    shape, dtype = out_from_shape(lib, op, args, names, show)
    if out is None:
        out = torch.empty(shape, dtype=torch_dtype(dtype))
    _poison(out)
    packed, keep = pack_args(op, args, names)
    dst = _desc(out, ROLE_OUTPUT, -1, f"the output of {op.qualname}")
    failed, msg, stats = lib.run(op, packed, dst, cores, tcm_bytes, log=True, count=count)
    if failed is not None:
        where = f" (GpSimd core {failed} of {cores})" if cores > 1 and "GpSimd core" not in msg else ""
        raise CppKernelError(f"{op.qualname}{where}: {show(msg)}")
    log, files = lib.take_log()
    files = [show(f) for f in files]
    runs: list[CoreRun] = []
    leaks = []
    for c, st in enumerate(stats):
        run = CoreRun(c, log[log["core"] == c], files, counts=lib.take_counts(c) if count else None,
                      tcm_peak=int(st.tcm_peak), dst_requested=bool(st.dst_requested))
        if st.leaks:
            leaks.append(f"GpSimd core {c} returned without tcm_free of {st.leaks} TCM buffer(s), "
                         f"{st.tcm_leaked} bytes ({show(lib.note(c))})")
        runs.append(run)
    if leaks:  # one warning per call, every core's leaks in it
        warnings.warn(f"{op.qualname}: {'; '.join(leaks)}; tcm_free what you tcm_malloc", TcmLeakWarning, stacklevel=3)
    arg_specs = [(names[k], tuple(a.shape), _TORCH_DTYPES[a.dtype]) if kind == "t" else None
                 for k, (kind, a) in enumerate(zip(op.kinds, args))]
    report = check_coverage([r.log for r in runs], tuple(shape))
    record = CallRecord(op, arg_specs, (tuple(shape), dtype), runs, report)
    if not report.ok and check != "off":
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
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    del keep
    return out, record
