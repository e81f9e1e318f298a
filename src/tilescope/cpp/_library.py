"""Operators of a loaded library: ``torch.ops.<lib>.<op>`` registration, runs and estimates."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from ..spec import CoreSpec, preset
from ._abi import NativeLibrary, NativeOp
from ._build import build_counting
from ._count import block_costs, count_work
from ._errors import CppError
from ._cost_model import CoreEstimate, CostModel, build_program
from ._params import parameter_names
from ._execute import CallRecord, execute, out_from_shape, torch_dtype

__all__ = ["CppLibrary", "CppOp", "Estimate"]

_SCHEMA_TYPES = {"t": "Tensor", "f": "float", "i": "int", "b": "bool"}
_RESERVED = {"aten", "prim", "prims", "torch", "_", "tilescope"}
_LOCK = threading.Lock()
_LIBRARIES: dict[str, "CppLibrary"] = {}  # torch namespace -> the library registered there


@dataclass(frozen=True)
class Estimate:
    """The modeled time of one call: its Program, the simulator's result and each core's estimate.

    Every time here is *modeled*; the compute part is *estimated* from the instructions each
    core's run executed (see :class:`tilescope.cpp.CostModel`): the same operator on the same
    inputs gives the same estimate on every run.
    """

    program: object
    result: object  # tilescope.sim.SimResult
    cores: tuple[CoreEstimate, ...]
    model: CostModel

    @property
    def total_ns(self) -> float:
        return self.result.summary.total_ns

    def text(self) -> str:
        s = self.result.summary
        lines = [
            f"{self.program.name}: {s.total_us:,.2f} us modeled on {s.preset} (compute estimated from counted "
            f"instructions: {self.model.cycles_per_instruction:g} GpSimd cycle each, assumed; TCM operands "
            f"{self.model.tcm_access_cycles} cycles)",
            f"{'core':>4} {'instructions':>13} {'TCM operands':>13} {'GpSimd cycles':>14} {'transfers in/out':>17} "
            f"{'bytes in/out':>19} {'elements out':>13} {'TCM peak':>9}",
        ]
        for c in self.cores:
            lines.append(
                f"{c.core:>4} {c.instructions:>13,} {c.memory_accesses:>13,} {c.gpsimd_cycles:>14,.0f} "
                f"{c.transfers_in:>8,}/{c.transfers_out:<8,} {c.bytes_in:>9,}/{c.bytes_out:<9,} "
                f"{c.elements_written:>13,} {c.tcm_peak_bytes:>8,}B"
            )
        lines.append(str(s))
        return "\n".join(lines)


class CppOp:
    """One operator of a loaded library; calling it is calling ``torch.ops.<lib>.<op>``."""

    def __init__(self, library: "CppLibrary", native: NativeOp, names: list[str]):
        self.library = library
        self.native = native
        self.arg_names = names
        self._programs: dict[tuple, tuple] = {}

    @property
    def name(self) -> str:
        return self.native.name

    @property
    def qualname(self) -> str:
        return self.native.qualname

    @property
    def schema(self) -> str:
        args = ", ".join(f"{_SCHEMA_TYPES[k]} {n}" for k, n in zip(self.native.kinds, self.arg_names))
        return f"{self.name}({args}) -> Tensor"

    @property
    def torch_op(self):
        return getattr(getattr(torch.ops, self.native.lib), self.name)

    def __call__(self, *args):
        return self.torch_op(*args)

    def __repr__(self) -> str:
        mode = f"multicore ({self.library.cores} cores)" if self.library.multicore else "single core"
        return f"<C++ operator torch.ops.{self.native.lib}.{self.schema}, {mode}, from {self.native.file}:{self.native.line}>"

    # ---- execution ----------------------------------------------------------------------
    def run(self, *args, out: torch.Tensor | None = None) -> tuple[torch.Tensor, CallRecord]:
        """Run the kernel on CPU tensors with every check; returns the output and the call record."""
        lib = self.library
        return execute(lib.native, self.native, args, self.arg_names, cores=lib.cores, tcm_bytes=lib.tcm_bytes,
                       check=lib.check, show=lib.show, out=out, timeout_s=lib.timeout_s)

    def count(self, *args) -> CallRecord:
        """Run the kernel in the library's counting build: the call record with each core's
        executed blocks (builds the counting library the first time)."""
        lib = self.library
        counting = lib.counting_native()
        native = next((o for o in counting.ops if o.qualname == self.qualname), None)
        if native is None:
            raise CppError(f"the counting build of {lib.path.name} has no operator {self.qualname}")
        # (the run that came before warned about leaks already: the counting build's are the same)
        _, record = execute(counting, native, args, self.arg_names, cores=lib.cores, tcm_bytes=lib.tcm_bytes,
                            check="off", count=True, show=lib.show, timeout_s=lib.timeout_s, warn_leaks=False)
        return record

    def output_spec(self, *args) -> tuple[tuple[int, ...], torch.dtype]:
        """(shape, dtype) of the output for these arguments, from the shape function."""
        shape, dtype = out_from_shape(self.library.native, self.native, args, self.arg_names, self.library.show)
        return shape, torch_dtype(dtype)

    def estimate(self, *args, preset: str | CoreSpec | None = None, cost_model: CostModel | None = None,
                 refresh: bool = False) -> Estimate:
        """Run once with the checks, then model the call: Program, simulated timeline, per-core table.

        The compute estimate counts the instructions each core executes (in the library's
        counting build), once per (argument shapes, transfer pattern, preset, cost model); it
        is reused, and ``refresh=True`` counts again -- with the same result for the same inputs.
        """
        out, record = self.run(*args)
        return self.estimate_from(record, args, preset=preset, cost_model=cost_model, refresh=refresh)

    def estimate_from(self, record: CallRecord, args, *, preset=None, cost_model=None, refresh=False) -> Estimate:
        """The Estimate of a call already run (counting its instructions if not cached)."""
        from ..sim import simulate

        spec = _preset(preset)
        model = cost_model or self.library.cost_model
        key = (record.digest(), spec.fingerprint, model)
        hit = None if refresh else self._programs.get(key)
        if hit is None:
            counted = self.count(*args)
            costs = block_costs(self.library.counting_native().path)
            cores = tuple(_core_estimate(r, costs, model) for r in counted.cores)
            program = build_program(self.qualname, record.arg_specs, record.out_spec,
                                    [r.log for r in record.cores], [r.files for r in record.cores], list(cores),
                                    spec, model, meta={"cores": len(cores)})
            hit = (program, cores)
            with _LOCK:
                self._programs[key] = hit
        program, cores = hit
        return Estimate(program, simulate(program, spec), cores, model)


def _core_estimate(run, costs, model: CostModel) -> CoreEstimate:
    instructions, memory = count_work(run.counts, costs)
    log = run.log
    ins, outs = log[log["dir"] == 0], log[log["dir"] == 1]
    to_out = outs[outs["arg"] == -1]
    return CoreEstimate(
        core=run.core,
        instructions=instructions,
        memory_accesses=memory,
        blocks=int(run.counts["count"].sum()),
        gpsimd_cycles=model.cycles(instructions, memory),
        transfers_in=len(ins),
        transfers_out=len(outs),
        bytes_in=int((ins["count"] * ins["elem_size"]).sum()),
        bytes_out=int((outs["count"] * outs["elem_size"]).sum()),
        elements_written=int(to_out["count"].sum()),
        tcm_peak_bytes=run.tcm_peak,
    )


def _preset(p) -> CoreSpec:
    return preset(p)


def _manifest_sources(path: Path) -> list[str]:
    """The sources a library was built from, from its build manifest (none if it has none)."""
    import json

    try:
        return list(json.loads(Path(path).resolve().with_suffix(".json").read_text()).get("sources", []))
    except (OSError, ValueError, AttributeError):
        return []


class CppLibrary:
    """A loaded operator library: its ops (``.ops[name]``), mode and where it was built."""

    def __init__(self, native: NativeLibrary, *, multicore: bool, check: str = "raise",
                 cost_model: CostModel | None = None, sources: dict[str, str] | None = None,
                 spec: str | CoreSpec | None = None, build=None, timeout_s: float | None = 60.0):
        if check not in ("raise", "warn", "off"):
            raise ValueError(f"check must be 'raise', 'warn' or 'off', got {check!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds (or None: no limit), got {timeout_s!r}")
        self.timeout_s = timeout_s
        self.native = native
        self._counting: NativeLibrary | None = None
        self.multicore = bool(multicore)
        self.check = check
        self.cost_model = cost_model or CostModel()
        self.build = build
        self._sources = dict(sources or {})
        self.spec = preset(spec)
        self.ops: dict[str, CppOp] = {}
        self._torch_libs: dict[str, torch.library.Library] = {}
        sources_read = list(self._sources) or _manifest_sources(native.path)
        for nop in native.ops:
            self.ops[nop.name] = CppOp(self, nop, parameter_names(nop, sources_read))

    @property
    def path(self) -> Path:
        return self.native.path

    @property
    def cores(self) -> int:
        return self.spec.gpsimd_cores if self.multicore else 1

    @property
    def tcm_bytes(self) -> int:
        return self.spec.gpsimd_user_tcm_bytes

    def counting_native(self) -> NativeLibrary:
        """The library's counting build (its sources with a probe per basic block), opened
        once; built from the library's manifest the first time (cached by content)."""
        with _LOCK:
            if self._counting is None:
                self._counting = NativeLibrary(build_counting(self.path).path)
            return self._counting

    @property
    def namespaces(self) -> list[str]:
        return sorted({op.native.lib for op in self.ops.values()})

    def show(self, text: str) -> str:
        for absolute, shown in self._sources.items():
            text = text.replace(absolute, shown)
        return text

    def __getitem__(self, name: str) -> CppOp:
        try:
            return self.ops[name]
        except KeyError:
            raise KeyError(f"library {self.path.name} has no operator {name!r}; it has {sorted(self.ops)}") from None

    def __repr__(self) -> str:
        mode = f"multicore ({self.cores} GpSimd cores)" if self.multicore else "single core"
        ops = ", ".join(f"{o.native.lib}.{o.name}" for o in self.ops.values())
        return f"<CppLibrary {self.path.name}: {ops}; {mode}>"

    # ---- torch registration -------------------------------------------------------------
    def register(self) -> "CppLibrary":
        """Define ``torch.ops.<lib>.<op>`` for every operator (replacing an earlier load of the same lib)."""
        for ns in self.namespaces:
            if ns in _RESERVED or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ns):
                raise CppError(f"library name {ns!r} in TILESCOPE_LIBRARY is reserved or not an identifier; "
                               f"choose another (e.g. my_ops)")
        with _LOCK:
            for ns in self.namespaces:
                old = _LIBRARIES.pop(ns, None)
                if old is not None:
                    old._unregister(ns)
                tlib = torch.library.Library(ns, "FRAGMENT")
                try:
                    for op in self.ops.values():
                        if op.native.lib == ns:
                            self._define(tlib, op)
                except Exception:
                    tlib._destroy()
                    raise
                self._torch_libs[ns] = tlib
                _LIBRARIES[ns] = self
        return self

    def _unregister(self, ns: str) -> None:
        tlib = self._torch_libs.pop(ns, None)
        if tlib is not None:
            tlib._destroy()

    def _define(self, tlib, op: CppOp) -> None:
        try:
            tlib.define(op.schema)
        except RuntimeError as e:
            raise CppError(
                f"cannot define torch.ops.{op.native.lib}.{op.name}: {e}. Another library (not loaded by "
                f"tilescope.cpp) already defines it; pick another library name in TILESCOPE_LIBRARY"
            ) from None

        def cpu_kernel(*args):
            out, _ = op.run(*args)
            return out

        def fake_kernel(*args):
            shape, dtype = op.output_spec(*args)
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
            return torch.empty(shape, dtype=dtype, device=device)

        tlib.impl(op.name, cpu_kernel, "CPU")
        torch.library.register_fake(f"{op.native.lib}::{op.name}", fake_kernel, lib=tlib)
        from ._sim_kernel import register_device_kernel

        register_device_kernel(tlib, op)  # the sim device (PrivateUse1): one execution per call
