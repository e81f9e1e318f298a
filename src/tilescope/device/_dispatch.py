"""Every aten op that reaches the device: metadata, lowering, submission, numerics.

One :class:`Handler` per op overload, made on its first call from the op's schema.
A call:

1. scans its arguments once: a signature key (tensor shapes/strides/dtypes, number
   arguments by type, everything else by value), the CPU views the worker will
   compute on (zero-copy aliases of device memory) and the device;
2. looks the key up: a hit gives the output metadata and the lowered Program at
   once; a miss runs the op on meta tensors for the output metadata (errors surface
   here, at the call, like PyTorch's own checks) and lowers the call
   (:func:`tilescope.lower.lower`);
3. allocates outputs, submits one execution to the runtime (modeled time) and
   queues the numerics (CPU torch on the views) for the device worker; returns.

Ops whose results the host needs now (``.item()``, data-dependent shapes,
non-tensor results) wait for the device instead (``_sync_call``).
"""

from __future__ import annotations

import threading

import torch

from .. import lower as _lower
from . import _runtime, _worker
from ._native import load as _load_native

__all__ = ["Handler", "handler_for", "handle", "op_label", "stats"]

_Tensor = torch.Tensor
_rt = None  # the native module, set by init()
_meta = torch.device("meta")
_NUMBER_KINDS = ("number", "Optional[number]", "List[number]", "float", "Optional[float]", "List[float]",
                 "Optional[List[float]]")
_enable_rf = torch._C._autograd._enable_record_function
_STATS = {"calls": 0, "meta_misses": 0, "sync_calls": 0}
_DEVICE_TYPE = "privateuseone"


def init(device_type: str) -> None:
    global _rt, _DEVICE_TYPE
    _rt = _load_native()
    _DEVICE_TYPE = device_type


def stats() -> dict:
    return dict(_STATS)


def op_label(op) -> str:
    """``"aten::add.Tensor"`` (``"aten::exp"`` for a default overload)."""
    return op._name


class _Hidden:
    """Hide tilescope's own aten calls on the host thread from the profiler."""

    __slots__ = ()

    def __enter__(self):
        _enable_rf(False)

    def __exit__(self, *exc):
        _enable_rf(True)


_hidden = _Hidden()


def same_device_error(a, b) -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {a} and {b}! "
        f"Move them to one device first, e.g. with .to({str(a)!r})."
    )


# ---- argument scanning ------------------------------------------------------------

class _Scan:
    """Result of one pass over the arguments."""

    __slots__ = ("key", "cpu_args", "cpu_kwargs", "device", "tensors")


def _scan_value(v, number: bool, key: list, tensors: list, ctx: list):
    """Key part and CPU form of one argument value. ctx = [device index or None, cpu_devices]."""
    c = v.__class__
    if c is _Tensor or isinstance(v, _Tensor):
        if v.device.type == _DEVICE_TYPE:
            idx = v.device.index
            if ctx[0] is None:
                ctx[0] = idx
            elif ctx[0] != idx:
                raise same_device_error(torch.device(_DEVICE_TYPE, ctx[0]), v.device)
            key.append((v.shape, v.stride(), v.dtype, idx))
            tensors.append(v)
            return _rt.cpu_view(v)
        # a host tensor: only 0-dim ones (scalars) may be mixed in, read now
        if v.dim() != 0:
            ctx[1].append(v)
        key.append((v.shape, v.stride(), v.dtype, -1))
        tensors.append(v)
        return v.detach().clone() if v.dim() == 0 else v
    if c is list or c is tuple:
        sub: list = []
        out = [_scan_value(x, number, sub, tensors, ctx) for x in v]
        key.append(tuple(sub))
        return out
    if number:
        key.append(c)
        return v
    if c is torch.Generator:
        key.append("gen")
        return v
    key.append(v)
    return v


def scan(args, kwargs, numbers_pos, numbers_kw) -> _Scan:
    key: list = []
    tensors: list = []
    ctx: list = [None, []]
    cpu_args = [_scan_value(a, i in numbers_pos, key, tensors, ctx) for i, a in enumerate(args)]
    cpu_kwargs = {}
    for k, v in kwargs.items():
        key.append(k)
        cpu_kwargs[k] = _scan_value(v, k in numbers_kw, key, tensors, ctx)
    s = _Scan()
    s.key = tuple(key)
    s.cpu_args = cpu_args
    s.cpu_kwargs = cpu_kwargs
    s.device = ctx[0]
    s.tensors = tensors
    if ctx[1] and ctx[0] is not None:
        s.device = ctx[0]
        s._cpu = ctx[1]  # type: ignore[attr-defined]
    return s


# ---- meta inference -------------------------------------------------------------

def _to_meta(v):
    if isinstance(v, torch.Generator):
        return None
    if isinstance(v, _Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=_meta)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_meta(x) for x in v)
    return v


def _flat_tensors(result) -> list:
    if isinstance(result, _Tensor):
        return [result]
    if isinstance(result, (list, tuple)):
        out = []
        for r in result:
            out.extend(_flat_tensors(r))
        return out
    return []


def _abstract(v, numbers: bool, counter: list):
    """Lowering form of an argument: TensorMeta / ScalarArg / hashable values."""
    if isinstance(v, _Tensor):
        return _lower.meta_of(v)
    if isinstance(v, (list, tuple)):
        return tuple(_abstract(x, numbers, counter) for x in v)
    if numbers and isinstance(v, (bool, int, float)):
        name = f"s{counter[0]}"
        counter[0] += 1
        return _lower.ScalarArg(name, type(v))
    if isinstance(v, torch.Generator):
        return None
    return v


# ---- handlers ------------------------------------------------------------------------

class Entry:
    """What a signature key maps to: output metadata and the lowered Program."""

    __slots__ = ("outs", "lowered", "nbytes")

    def __init__(self, outs, lowered):
        self.outs = outs  # list of (shape, stride, dtype)
        self.lowered = lowered


class Handler:
    """The device kernel of one op overload."""

    def __init__(self, op):
        self.op = op
        self.name = op_label(op)
        schema = op._schema
        self.schema = schema
        args = schema.arguments
        self.arg_names = [a.name for a in args]
        self.numbers_pos = frozenset(i for i, a in enumerate(args) if not a.kwarg_only and str(a.type) in _NUMBER_KINDS)
        self.numbers_kw = frozenset(a.name for a in args if str(a.type) in _NUMBER_KINDS)
        self.write_pos = [i for i, a in enumerate(args) if not a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
        self.out_kw = [a.name for a in args if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
        rets = schema.returns
        self.returns_alias = [r.alias_info is not None for r in rets]
        ret_types = [str(r.type) for r in rets]
        self.tensor_returns = all(t in ("Tensor", "List[Tensor]", "Optional[Tensor]") for t in ret_types)
        self.dynamic = torch.Tag.dynamic_output_shape in op.tags or torch.Tag.data_dependent_output in op.tags
        self.mutating = bool(self.write_pos) or bool(self.out_kw)
        gens = [(i, a) for i, a in enumerate(args) if "Generator" in str(a.type)]
        self.gen = (gens[0][0], gens[0][1].name, gens[0][1].kwarg_only) if gens else None
        self.cache: dict = {}
        self.out_op = None if self.mutating else _find_out_overload(op)
        self.lock = threading.Lock()
        if any(r.alias_info is not None and not r.alias_info.is_write for r in rets):
            self.kind = "view"
        elif not self.tensor_returns or self.dynamic:
            self.kind = "sync"
        elif self.out_kw:
            self.kind = "out"
        elif self.write_pos and all(self.returns_alias) and rets:
            self.kind = "inplace"
        elif self.write_pos:
            self.kind = "mutating"  # writes some arguments and returns fresh tensors
        else:
            self.kind = "functional"

    # -- the hot path ------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        _STATS["calls"] += 1
        kind = self.kind
        if kind == "view":
            return self.op.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **kwargs)
        if kind == "sync":
            return self._sync_call(args, kwargs)
        s = scan(args, kwargs, self.numbers_pos, self.numbers_kw)
        if s.device is None:
            s.device = _device_of_factory(kwargs)
        if hasattr(s, "_cpu"):
            raise same_device_error(torch.device(_DEVICE_TYPE, s.device), s._cpu[0].device)
        entry = self.cache.get(s.key)
        if entry is None:
            entry = self._miss(s, args, kwargs)
            if entry is None:  # the op cannot be described by meta tensors: run it synchronously
                return self._sync_call(args, kwargs)
        core = s.device
        if kind == "functional":
            rt_empty = _rt.empty
            outs = [rt_empty(shape, stride, dtype, core) for shape, stride, dtype in entry.outs]
            cpu_outs = [_rt.cpu_view(o) for o in outs]
            if self.out_op is not None:
                kw = s.cpu_kwargs
                for name, o in zip(self.out_names, cpu_outs):
                    kw[name] = o
                work = (self.out_op, s.cpu_args, kw, self.name)
            else:
                work = (_run_and_copy, (self.op, s.cpu_args, s.cpu_kwargs, cpu_outs), {}, self.name)
            if any(o.numel() for o in outs):
                self._submit(core, entry, work, s)
            return self._pack(outs)
        # in-place / out= / mutating: the CPU views alias the device memory that is written
        if kind == "out":
            self._resize_outs(entry, kwargs)
            for name in self.out_kw:
                s.cpu_kwargs[name] = _cpu_tree(kwargs[name])
            work = (self.op, s.cpu_args, s.cpu_kwargs, self.name)
            self._submit(core, entry, work, s)
            results = [kwargs[n] for n in self.out_kw]
            return results[0] if len(results) == 1 else tuple(results)
        if kind == "inplace":
            work = (self.op, s.cpu_args, s.cpu_kwargs, self.name)
            self._submit(core, entry, work, s)
            results = [args[i] for i in self.write_pos[:len(self.returns_alias)]]
            return results[0] if len(results) == 1 else tuple(results)
        # mutating with fresh results (e.g. batch norm updating running stats)
        outs = [_rt.empty(shape, stride, dtype, core) for shape, stride, dtype in entry.outs]
        work = (_run_and_copy, (self.op, s.cpu_args, s.cpu_kwargs, [_rt.cpu_view(o) for o in outs]), {}, self.name)
        self._submit(core, entry, work, s)
        return self._pack(outs)

    def _pack(self, outs):
        rets = self.schema.returns
        if len(rets) == 1:
            if str(rets[0].type) == "List[Tensor]":
                return outs
            return outs[0]
        return tuple(outs)

    def _submit(self, core, entry, work, s):
        low = entry.lowered
        if self.gen is not None:
            work = _with_generator(self.gen, work, s, core)
        _runtime.submit(core, self.name, "kernel", low.rule, low.program, low.modeled_ns, work, low.hbm_bytes)

    def _resize_outs(self, entry, kwargs):
        i = 0
        for name in self.out_kw:
            vals = kwargs[name]
            for t in (vals if isinstance(vals, (list, tuple)) else [vals]):
                shape, stride, _ = entry.outs[i]
                i += 1
                if tuple(t.shape) != tuple(shape):
                    if t.numel() != 0:
                        import warnings

                        warnings.warn(
                            f"An output with one or more elements was resized since it had shape "
                            f"{list(t.shape)}, which does not match the required output shape {list(shape)}. "
                            f"This behavior is deprecated, and in a future PyTorch release outputs will not "
                            f"be resized unless they have zero elements. You can explicitly reuse an out "
                            f"tensor t by resizing it, inplace, to zero elements with t.resize_(0).",
                            UserWarning, stacklevel=3)
                    t.resize_(shape)

    # -- a new signature ------------------------------------------------------------------
    def _miss(self, s: _Scan, args, kwargs):
        _STATS["meta_misses"] += 1
        meta_args = [_to_meta(a) for a in args]
        meta_kwargs = {k: _to_meta(v) for k, v in kwargs.items()}
        with _hidden:
            try:
                result = self.op(*meta_args, **meta_kwargs)
            except NotImplementedError:
                return None
            except RuntimeError as e:
                if "meta" in str(e).lower() and ("not implemented" in str(e).lower() or "does not support" in str(e).lower()):
                    return None
                raise
        if self.kind == "out":
            written = []
            for n in self.out_kw:
                written += _flat_tensors(meta_kwargs[n])
        elif self.kind == "inplace":
            written = [meta_args[i] for i in self.write_pos]
            written = _flat_tensors(written)
        else:
            written = _flat_tensors(result)
        outs = [(tuple(t.shape), tuple(t.stride()), t.dtype) for t in written]
        entry = Entry(outs, self._lower(args, kwargs, written))
        self.cache[s.key] = entry
        return entry

    def _lower(self, args, kwargs, written):
        counter = [0]
        largs = tuple(_abstract(a, i in self.numbers_pos, counter) for i, a in enumerate(args))
        lkw = []
        k_out = 0
        for k in sorted(kwargs):
            if k in self.out_kw:
                n = len(_flat_tensors(kwargs[k]))
                ref = tuple(_lower.OutputRef(k_out + j) for j in range(n))
                lkw.append((k, ref[0] if not isinstance(kwargs[k], (list, tuple)) else ref))
                k_out += n
            else:
                lkw.append((k, _abstract(kwargs[k], k in self.numbers_kw, counter)))
        outputs = tuple(_lower.meta_of(t) for t in written)
        call = _lower.Call(self.name, largs, tuple(lkw), outputs)
        with _hidden:
            return _lower.lower(call, _runtime.settings().preset)

    # -- ops the host must wait for ------------------------------------------------------
    def _sync_call(self, args, kwargs):
        _STATS["sync_calls"] += 1
        s = scan(args, kwargs, self.numbers_pos, self.numbers_kw)
        core = s.device if s.device is not None else _device_of_factory(kwargs)
        if hasattr(s, "_cpu") and self.name not in _HOST_TENSORS_OK:
            raise same_device_error(torch.device(_DEVICE_TYPE, core), s._cpu[0].device)
        box: list = []
        work = (_run_into, (self.op, s.cpu_args, s.cpu_kwargs, box, core), {}, self.name)
        low = self._sync_lowered(args, kwargs)
        end = _runtime.submit(core, self.name, "kernel", low.rule, low.program, low.modeled_ns, work, low.hbm_bytes)
        if not _runtime.settings().numerics:
            _worker.put(work)
        _runtime.wait_until(end)
        if not box:
            _worker.raise_pending()
            raise RuntimeError(f"sim device: {self.name} produced no result")
        return _wrap_results(box[0], args, kwargs, self)

    def _sync_lowered(self, args, kwargs):
        key = ("sync",) + tuple((tuple(a.shape), a.dtype) if isinstance(a, _Tensor) else _hashable(a)
                                for a in args)
        hit = self.cache.get(key)
        if hit is not None:
            return hit.lowered
        ins = [t for t in _flat_tensors(list(args) + list(kwargs.values()))]
        counter = [0]
        largs = tuple(_abstract(a, i in self.numbers_pos, counter) for i, a in enumerate(args))
        lkw = tuple((k, _abstract(v, k in self.numbers_kw, counter)) for k, v in sorted(kwargs.items()))
        # outputs of a data-dependent op are unknown until it runs: model it as reading its inputs
        call = _lower.Call(self.name, largs, lkw, tuple(_lower.meta_of(t) for t in ins[:1]))
        with _hidden:
            low = _lower.lower(call, _runtime.settings().preset)
        self.cache[key] = Entry([], low)
        return low


def _with_generator(gen_spec, work, s, core):
    from ._special import run_with_generator

    pos, name, kwarg_only = gen_spec
    if not kwarg_only and pos < len(s.cpu_args):
        container, key = s.cpu_args, pos
    else:
        container, key = s.cpu_kwargs, name
    gen = container[key] if (key in container if isinstance(container, dict) else True) else None
    if gen is not None and gen.device.type != _DEVICE_TYPE:
        raise RuntimeError(
            f"Expected a '{_DEVICE_TYPE}' device type for generator but found '{gen.device.type}'. "
            f"Create it with torch.Generator(device={_DEVICE_TYPE!r})."
        )
    # the op's CPU call must see the generator in the container it was given in
    if isinstance(container, dict):
        container[key] = None
    return (run_with_generator, (work, container, key, gen, core), {}, work[3])


_HOST_TENSORS_OK = {"aten::_local_scalar_dense", "aten::equal"}


def _hashable(v):
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)


def _device_of_factory(kwargs) -> int:
    d = kwargs.get("device")
    if d is not None and d.index is not None:
        return d.index
    return _rt.current_device()


def _cpu_tree(v):
    if isinstance(v, _Tensor):
        return _rt.cpu_view(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_cpu_tree(x) for x in v)
    return v


# ---- worker-side functions (keep them short: they hold the GIL) ----------------------------

def _run_and_copy(op, args, kwargs, outs):
    result = op(*args, **kwargs)
    if outs:
        for o, r in zip(outs, _flat_tensors(result)):
            o.copy_(r)


def _run_into(op, args, kwargs, box, core):
    box.append(op(*args, **kwargs))


def _wrap_results(result, args, kwargs, handler):
    """Device tensors holding a synchronously computed CPU result."""
    if isinstance(result, _Tensor):
        # results aliasing an argument (in-place) are returned as the argument itself
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, _Tensor) and a.device.type == _DEVICE_TYPE and _same_memory(a, result):
                return a
        core = next((a.device.index for a in _flat_tensors(list(args) + list(kwargs.values()))
                     if a.device.type == _DEVICE_TYPE), _rt.current_device())
        out = _rt.empty(list(result.shape), list(result.stride()), result.dtype, core)
        _rt.cpu_view(out).copy_(result)
        return out
    if isinstance(result, (list, tuple)):
        items = [_wrap_results(r, args, kwargs, handler) for r in result]
        return type(result)(items) if isinstance(result, tuple) else items
    return result


def _same_memory(dev, cpu) -> bool:
    try:
        return _rt.cpu_view(dev).data_ptr() == cpu.data_ptr() and dev.shape == cpu.shape
    except Exception:  # noqa: BLE001
        return False


def _find_out_overload(op):
    """The ``out=`` overload matching a functional overload, if any."""
    schema = op._schema
    rets = schema.returns
    if not rets or any(str(r.type) != "Tensor" for r in rets):
        return None
    names = [a.name for a in schema.arguments]
    packet = op.overloadpacket
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        cs = cand._schema
        outs = [a for a in cs.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
        if len(outs) != len(rets):
            continue
        rest = [a for a in cs.arguments if a not in outs]
        if [a.name for a in rest] != names or [str(a.type) for a in rest] != [str(a.type) for a in schema.arguments]:
            continue
        cand_names = [a.name for a in outs]
        cand.__dict__.setdefault("_ts_out_names", cand_names)
        return _OutOp(cand, cand_names)
    return None


class _OutOp:
    """An out= overload called with keyword outputs (the worker's fast path)."""

    __slots__ = ("op", "names")

    def __init__(self, op, names):
        self.op = op
        self.names = names

    def __call__(self, *args, **kwargs):
        return self.op(*args, **kwargs)


_HANDLERS: dict = {}


def handler_for(op) -> Handler:
    h = _HANDLERS.get(op)
    if h is None:
        h = _HANDLERS[op] = Handler(op)
        if h.out_op is not None:
            h.out_names = h.out_op.names
            h.out_op = h.out_op.op
    return h


def handle(op, *args, **kwargs):
    """The backend fallback: route ``op`` to its handler."""
    h = _HANDLERS.get(op)
    if h is None:
        h = handler_for(op)
    return h(*args, **kwargs)
