"""``@tilescope.kernel``: a Python function traced into a Program, once per signature.

Tracing runs the function with HBM :class:`~tilescope.lang.Tensor` handles in place
of its array arguments; every language call emits instructions through one
TileBuilder. The result, a :class:`Traced` (Program + how to call it), is cached
by (argument shapes and dtypes, constant arguments, launch grid, preset), so a
second call with the same signature does not trace again.

Array arguments become Program inputs named after their parameters. A kernel
returns ``None``, an HBM tensor, or a tuple/list/dict of them (made with
``tl.ndarray(..., buffer=tl.hbm)``); those become outputs, and so does every
argument the kernel stores into (its new values are written back into the
caller's array). Other arguments (ints, floats, strings, tuples) are constants
of the trace.

The simulated PyTorch device runs kernels through :meth:`Kernel.program_for`
(a cached :class:`Traced` for tensors' shapes and dtypes) and
:meth:`Traced.run`; it plugs in with :func:`register_call_handler`.

>>> import numpy as np, tilescope
>>> from tilescope import lang as tl
>>> @tilescope.kernel
... def double(x):
...     out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm)
...     tl.store(out, tl.load(x) * 2.0)
...     return out
>>> traced = double.program_for(tl.TensorSpec((128, 64), "float32"))
>>> [o.name for o in traced.outputs], len(traced.program)
(['ndarray@3'], 3)
>>> double.program_for(np.zeros((128, 64), np.float32)) is traced   # cached
True
"""

from __future__ import annotations

import functools
import inspect
import itertools
import linecache
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..dtypes import canonical
from ..errors import CapacityError, DtypeError, KernelError
from ..program import Handle, Program, TileBuilder
from ..sim import run_numerics
from ..spec import CoreSpec, preset as _preset
from ._context import KernelContext, active, maybe_current
from ._values import Tensor, Tile

__all__ = [
    "Kernel", "KernelLaunch", "Traced", "TensorSpec", "OutputSpec", "kernel", "register_call_handler",
]

# fn(kernel, args, kwargs) -> result or NotImplemented; the simulated device registers one
_CALL_HANDLERS: list[Callable] = []

# key -> Kernel: every kernel gets a stable key, so a compiled graph can name it in a custom op
KERNELS: dict[str, "Kernel"] = {}


def register_call_handler(fn: Callable) -> Callable:
    """Let ``kernel(*args)`` run on other argument kinds (e.g. tensors of the simulated device).

    ``fn(kernel, args, kwargs)`` returns the call's result, or ``NotImplemented`` to pass.
    """
    if fn not in _CALL_HANDLERS:
        _CALL_HANDLERS.append(fn)
    return fn


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of an array argument (what a trace depends on)."""

    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class OutputSpec:
    """One Program output: its name, shape, dtype, and the array argument it is
    written back into (``arg``, a position among the array arguments) or None if returned."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    arg: int | None


class _Out:
    """Placeholder for an output inside the kernel's return structure."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<output {self.name!r}>"


def _fill(plan, values: dict):
    if plan is None:
        return None
    if isinstance(plan, _Out):
        return values.get(plan.name)
    if isinstance(plan, dict):
        return {k: _fill(v, values) for k, v in plan.items()}
    return type(plan)(_fill(v, values) for v in plan)


@dataclass(frozen=True)
class Traced:
    """A kernel traced for one signature: its Program and how to call it."""

    kernel: str
    program: Program
    inputs: tuple[str, ...]  # Program input names, in the order of the array arguments
    input_specs: tuple[TensorSpec, ...]
    outputs: tuple[OutputSpec, ...]
    returns: Any  # the return structure, outputs as placeholders
    grid: tuple[int, ...]
    spec: CoreSpec | None = field(default=None, repr=False)  # the preset it was traced for
    hooks: dict = field(default_factory=dict, repr=False)  # device_print: instruction -> [fn(read)]
    constants: dict = field(default_factory=dict, repr=False)  # input name -> values (shared_constant)

    def run(self, arrays, *, print_values: bool = True) -> dict[str, np.ndarray]:
        """Numerics: execute the Program on ``arrays`` (in argument order, or a dict by input name).

        Arguments the kernel stores into are updated in place (or written back).
        Returns every output by name.
        """
        if not isinstance(arrays, dict):
            arrays = dict(zip(self.inputs, arrays))
        written = {o.name for o in self.outputs if o.arg is not None}
        feed, back = {}, []
        for name, spec in zip(self.inputs, self.input_specs):
            arr = arrays[name]
            if not isinstance(arr, np.ndarray):
                if type(arr).__module__.startswith("torch"):  # a torch tensor (CPU or sim)
                    raise KernelError(
                        f"argument {name!r} is a torch tensor on {getattr(arr, 'device', '?')}; simulate() takes "
                        f"numpy arrays: pass {name}.cpu().numpy() -- or call the kernel itself on sim "
                        f"tensors (kernel(x, ...)), which runs it on the device")
                raise KernelError(f"argument {name!r} has no data ({type(arr).__name__}); pass a numpy array "
                                  f"(or run with numerics=False)")
            if name in written and not (arr.flags.writeable and arr.flags.c_contiguous):
                back.append((name, arr))
                arr = np.ascontiguousarray(arr).copy()
            feed[name] = arr
        feed.update(self.constants)
        hooks = {i: _chain(fns) for i, fns in self.hooks.items()} if print_values else None
        out = run_numerics(self.program, feed, hooks=hooks, copy_inputs=False)
        for name, arr in back:
            arr[...] = out[name].reshape(arr.shape)
            out[name] = arr
        return out

    def value(self, outputs: dict):
        """The kernel's return value with output arrays in place of its HBM tensors."""
        return _fill(self.returns, outputs)


def _chain(fns):
    if len(fns) == 1:
        return fns[0]
    return lambda read: [f(read) for f in fns]


def _is_array(v) -> bool:
    if isinstance(v, (np.ndarray, TensorSpec)):
        return True
    if isinstance(v, (str, bytes, int, float, complex, bool, np.generic)) or v is None:
        return False
    return hasattr(v, "shape") and hasattr(v, "dtype")


def _spec_of(v, name: str) -> TensorSpec:
    if isinstance(v, TensorSpec):
        return v
    try:
        dtype = canonical(v.dtype)
    except TypeError:
        cast = f"{name}.float()" if type(v).__module__.startswith("torch") else f"{name}.astype(np.float32)"
        raise DtypeError(
            f"argument {name!r} has dtype {v.dtype}, which the device does not support; pass float32, "
            f"bfloat16, float16 or int32 (e.g. {cast})") from None
    shape = tuple(int(n) for n in v.shape)
    if not shape:
        raise KernelError(f"argument {name!r} is 0-dimensional; pass scalars as Python numbers")
    return TensorSpec(shape, dtype)


class KernelLaunch:
    """``kernel[grid]``: a kernel with its launch grid, for ``tilescope.simulate``."""

    def __init__(self, kernel: "Kernel", grid: tuple[int, ...]):
        self.kernel = kernel
        self.grid = grid

    def __repr__(self) -> str:
        return f"{self.kernel.name}[{', '.join(map(str, self.grid))}]"

    def __call__(self, *args, **kwargs):
        return self.kernel._call(args, kwargs, self.grid)


def _grid(grid) -> tuple[int, ...]:
    if grid is None:
        return ()
    if isinstance(grid, (int, np.integer)):
        grid = (grid,)
    grid = tuple(int(g) for g in grid)
    if any(g < 1 for g in grid):
        raise KernelError(f"launch grid {grid} must have sizes >= 1")
    return grid


class Kernel:
    """A tile kernel (see the module docs). Make one with ``@tilescope.kernel``."""

    def __init__(self, fn: Callable, *, name: str | None = None, bufs: int | None = None, preset: str | None = None,
                 spill: bool = True, allocation: str = "ring"):
        from ..program import ALLOCATION_MODES

        if allocation not in ALLOCATION_MODES:
            raise KernelError(f"allocation={allocation!r} is not an allocation mode; use one of "
                              f"{', '.join(ALLOCATION_MODES)}")
        if bufs is not None and (not isinstance(bufs, int) or bufs < 1):
            raise KernelError(f"bufs={bufs!r}: give a rotation depth >= 1, or None to let the allocation mode place "
                              f"each tile")
        if isinstance(fn, Kernel):
            fn = fn.fn
        self.fn: Callable = fn
        self.name = name or fn.__name__
        self.bufs = bufs
        self.preset = preset
        self.spill = spill
        self.allocation = allocation
        self.signature = inspect.signature(fn)
        self.trace_count = 0
        self._cache: dict[tuple, Traced] = {}
        self.key = f"{self.name}#{len(KERNELS)}"
        KERNELS[self.key] = self
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<tile kernel {self.name!r}>"

    def __getitem__(self, grid) -> KernelLaunch:
        return KernelLaunch(self, _grid(grid))

    def __call__(self, *args, **kwargs):
        if maybe_current() is not None:
            return self.fn(*args, **kwargs)  # called from another kernel: traced inline
        return self._call(args, kwargs, None)

    def _call(self, args, kwargs, grid):
        for handler in _CALL_HANDLERS:
            result = handler(self, args, kwargs) if grid is None else handler(self[grid], args, kwargs)
            if result is not NotImplemented:
                return result
        raise KernelError(
            f"kernel {self.name!r} was called directly; run it on numpy arrays with "
            f"tilescope.simulate({self.name}, *arrays) (results, .timeline, .summary), or call it on tensors "
            f"of the simulated PyTorch device")

    # ---- signatures and tracing ------------------------------------------------
    def bind(self, args, kwargs) -> tuple[tuple, inspect.BoundArguments, dict[str, Any], list[str]]:
        """(cache key part, call arguments with arrays named, arrays by input name, input order)."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise KernelError(f"kernel {self.name!r}: {e}") from None
        bound.apply_defaults()
        key: list[tuple[str, Any]] = []
        arrays: dict[str, Any] = {}
        order: list[str] = []
        params = self.signature.parameters
        for name, value in bound.arguments.items():
            kind = params[name].kind
            items = (list(enumerate(value)) if kind is inspect.Parameter.VAR_POSITIONAL
                     else list(value.items()) if kind is inspect.Parameter.VAR_KEYWORD else [(None, value)])
            for sub, v in items:
                arg_name = name if sub is None else f"{name}{sub}" if isinstance(sub, int) else str(sub)
                if _is_array(v):
                    spec = _spec_of(v, arg_name)
                    key.append((arg_name, spec))
                    arrays[arg_name] = v
                    order.append(arg_name)
                else:
                    try:
                        hash(v)
                    except TypeError:
                        raise KernelError(
                            f"argument {arg_name!r} of kernel {self.name!r} is a {type(v).__name__}: pass arrays, "
                            f"or hashable constants (numbers, strings, tuples)") from None
                    key.append((arg_name, ("const", type(v).__name__, v)))
        return tuple(key), bound, arrays, order

    def program_for(self, *args, grid=None, preset: str | CoreSpec | None = None, **kwargs) -> Traced:
        """The cached :class:`Traced` for these arguments: arrays, tensors (anything with
        ``.shape`` and ``.dtype``), ``(shape, dtype)`` pairs, or constants."""
        return self._traced(args, kwargs, grid, preset)[0]

    def _traced(self, args, kwargs, grid, preset) -> tuple[Traced, dict]:
        key, bound, arrays, order = self.bind(args, kwargs)
        spec = _preset(preset if preset is not None else self.preset)
        grid = _grid(grid)
        full_key = (key, grid, spec.fingerprint)
        hit = self._cache.get(full_key)
        if hit is None:
            hit = self._cache[full_key] = self._trace(bound, arrays, order, grid, spec)
        return hit, arrays

    def _trace(self, bound, arrays, order, grid, spec, fail_at=None, fail_exc=None) -> Traced:
        self.trace_count += 1
        b = TileBuilder(self.name, spec, bufs=self.bufs)
        ctx = KernelContext(b, self.name, grid, fail_at=fail_at, fail_exc=fail_exc)
        handles: dict[str, Tensor] = {}
        for name in order:
            s = _spec_of(arrays[name], name)
            h = b.input(name, s.shape, s.dtype)
            handles[name] = Tensor(h.buffer, 0, h.ap.dims)
        call_args, call_kwargs = _substitute(bound, handles, self.signature)
        rets = []
        with active(ctx):
            pids = list(itertools.product(*(range(g) for g in grid)))
            for k, pid in enumerate(pids):
                ctx.instance, ctx.hbm_cursor = k, 0
                ctx.launch.program_id = pid
                rets.append(self.fn(*call_args, **call_kwargs))
        plan = _plan(rets[0], b, self.name)
        for k, r in enumerate(rets[1:], start=1):
            if repr(_plan(r, None, self.name)) != repr(plan):
                raise KernelError(f"program {pids[k]} of kernel {self.name!r} returns something else than program "
                                  f"{pids[0]}; every program of a launch grid must return the same tensors")
        for name in order:
            if name in ctx.written_hbm:
                b.mark_output(Handle(handles[name].buffer))
        if b.instruction_count == 0:
            raise KernelError(f"kernel {self.name!r} emitted no instructions (it loads, computes and stores nothing)")
        meta = {"kind": "tile_kernel", "kernel": self.name, "grid": list(grid), "bufs": self.bufs,
                "allocation": self.allocation, "sources": _sources(ctx), "traced_loops": _loop_report(ctx)}
        try:
            program = b.build(meta, describe_site=ctx.describe_site, spill=self.spill, allocation=self.allocation)
        except CapacityError as e:
            if fail_at is None and e.instruction is not None:
                # trace again and raise when the tile that did not fit is first used, so the
                # error (and its traceback) points at that kernel line
                self._trace(bound, arrays, order, grid, spec, fail_at=e.instruction, fail_exc=e)
            raise
        outs = []
        for name in program.outputs:
            buf = program.buffer(name)
            outs.append(OutputSpec(name, buf.shape, buf.dtype, order.index(name) if name in handles else None))
        return Traced(self.name, program, tuple(order), tuple(_spec_of(arrays[n], n) for n in order),
                      tuple(outs), plan, grid, spec, dict(ctx.hooks), dict(ctx.constants))

    def cache_clear(self) -> None:
        self._cache.clear()


def _substitute(bound, handles: dict[str, Tensor], signature) -> tuple[list, dict]:
    args: list = []
    kwargs: dict = {}
    params = signature.parameters
    for name, value in bound.arguments.items():
        kind = params[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            args.extend(handles.get(f"{name}{i}", v) for i, v in enumerate(value))
        elif kind is inspect.Parameter.VAR_KEYWORD:
            kwargs.update({k: handles.get(str(k), v) for k, v in value.items()})
        elif kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[name] = handles.get(name, value)
        else:
            args.append(handles.get(name, value))
    return args, kwargs


def _plan(ret, b: TileBuilder | None, kernel: str):
    if ret is None:
        return None
    if isinstance(ret, Tensor):
        if not ret.is_whole():
            raise KernelError(f"kernel {kernel!r} returns a view of HBM tensor {ret.buffer.name!r}; return the "
                              f"whole tensor")
        if b is not None:
            b.mark_output(Handle(ret.buffer))
        return _Out(ret.buffer.name)
    if isinstance(ret, Tile):
        raise KernelError(
            f"kernel {kernel!r} returns {ret.describe()}; a kernel returns HBM tensors: make one with "
            f"tl.ndarray(shape, dtype, buffer=tl.hbm), tl.store the tile into it and return that")
    if isinstance(ret, dict):
        return {k: _plan(v, b, kernel) for k, v in ret.items()}
    if isinstance(ret, (tuple, list)):
        return type(ret)(_plan(v, b, kernel) for v in ret)
    raise KernelError(f"kernel {kernel!r} returns a {type(ret).__name__}; return HBM tensors (or None)")


def _loop_report(ctx: KernelContext) -> list[dict]:
    """Per language loop of the kernel: iterations, how many were replicated rather than traced,
    and why not all (see tilescope.lang._loops)."""
    from ._frames import display_path

    return [{"file": display_path(f), "line": line, "loop": label, "iterations": n, "replicated": rep,
             "why_not": why} for (f, line), (label, n, rep, why) in ctx.loop_stats.items()]


def _sources(ctx: KernelContext) -> dict[str, str]:
    """Source text of every file the kernel's instructions came from (for code views)."""
    from ._frames import display_path

    files = {key[0] for key in ctx._prov}
    return {display_path(f): "".join(linecache.getlines(f)) for f in sorted(files) if linecache.getlines(f)}


def kernel(fn: Callable | None = None, *, name: str | None = None, bufs: int | None = None,
           preset: str | None = None, spill: bool = True, allocation: str = "ring"):
    """Make a tile kernel: ``@tilescope.kernel`` or ``@tilescope.kernel(allocation="max_reuse")``.

    ``allocation`` is how each tile gets its SBUF/PSUM address, as NKI's allocation modes:
    ``"ring"`` (a fresh address per tile, freed memory reused only after the allocation
    wraps around, so a loop's iterations overlap as far as the memory allows) or
    ``"max_reuse"`` (the best-fitting freed range: least memory, least overlap).
    ``bufs=N`` makes every SBUF allocation site rotate over N addresses instead. ``preset``
    is the hardware preset to trace for (default: ``$TILESCOPE_PRESET`` or ``trn1``).
    When live tiles do not fit in SBUF, the allocator spills some to HBM (two DMAs each,
    labelled on the timeline, listed in ``program.meta["spills"]``); ``spill=False`` is the
    strict mode: a ``CapacityError`` instead.
    """
    if fn is None:
        return lambda f: Kernel(f, name=name, bufs=bufs, preset=preset, spill=spill, allocation=allocation)
    return Kernel(fn, name=name, bufs=bufs, preset=preset, spill=spill, allocation=allocation)
