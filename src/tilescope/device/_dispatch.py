"""Every aten op that reaches the device: signature, lowering, submission, numerics.

One :class:`Handler` per op overload, made on its first call from the op's schema.
A call:

1. scans its arguments once (:func:`scan`): a signature key (tensor shapes, strides,
   dtypes; ``Scalar`` arguments by type, everything else by value), the zero-copy CPU
   views the worker computes on, and the device;
2. looks the key up. The **first call** of a signature runs synchronously: the worker
   computes it with CPU torch (the host waits), which gives the exact output metadata
   PyTorch's CPU kernels produce (shapes, strides, dtypes) and raises PyTorch's own
   errors at the call; the call is then lowered (:func:`tilescope.lower.lower`) and
   the pair cached. Every **later call** with that signature is asynchronous:
   allocate outputs, submit one execution (modeled time), queue the numerics, return;
3. ops whose results the host needs (``.item()``-like non-tensor results, data-dependent
   shapes such as ``nonzero``) always take the synchronous path.

Metadata-only ops (views, ``squeeze_``-like in-place view ops) run PyTorch's CPU
kernels on the device tensors themselves: no execution, true views.

The device's kernel itself is native (``_csrc/dispatch.cpp``): each handler describes its op
to it once (:meth:`Handler.describe`) and teaches it every cached signature; later calls of
that signature run there without entering Python (the same outputs, execution and numerics),
unless a listener or a profiler watches each execution.
"""

from __future__ import annotations

import torch

from .. import lower as _lower
from . import _runtime, _worker
from ._native_runtime import load as _load_native

__all__ = ["Handler", "handler_for", "handle", "op_label", "stats", "same_device_error"]

_Tensor = torch.Tensor
_rt = None  # the native module, set by init()
_CPU_KS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
# Scalar-typed arguments are runtime operands (by type in cache keys): optimizer step
# sizes and other per-call numbers. float-typed ones (eps, p, scale) are constants.
_NUMBER_KINDS = frozenset(("number", "Optional[number]", "List[number]"))
# a Python number in a Tensor-typed position is a wrapped number (``x * 2``): a runtime operand
_TENSOR_KINDS = frozenset(("Tensor", "Optional[Tensor]"))
_enable_rf = torch._C._autograd._enable_record_function
_default_dtype = torch.get_default_dtype
_STATS = {"calls": 0, "first_calls": 0, "sync_calls": 0}
_DEVICE_TYPE = "privateuseone"
_PLAIN, _NUMBER, _WRAPPED = 0, 1, 2
# Scalar arguments that change what a Program does (not just a value it uses): keyed by value
_STRUCTURAL_NUMBERS = {"aten::linalg_vector_norm": ("ord",), "aten::norm.ScalarOpt_dim": ("p",),
                       "aten::norm.Scalar": ("p",), "aten::norm.ScalarOpt_dtype": ("p",),
                       # a variance's correction (0 or 1 in practice) is a constant of its formula
                       "aten::var.correction": ("correction",), "aten::std.correction": ("correction",)}
_SIGNATURES_PER_OP = 4096


def init(device_type: str) -> None:
    global _rt, _DEVICE_TYPE
    _rt = _load_native()
    _DEVICE_TYPE = device_type


def stats() -> dict:
    """Calls handled (``fast_calls`` of them by the native fast path), first calls of a
    signature (synchronous) and calls that always wait."""
    out = dict(_STATS)
    out["fast_calls"] = _rt.fast_calls() if _rt is not None else 0
    out["calls"] += out["fast_calls"]
    return out


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


# ---- argument scanning ------------------------------------------------------------------

_WRAP_CACHE: dict = {}


def _wrapped(v):
    """A 0-dim CPU tensor standing for a wrapped Python number (PyTorch's promotion rules
    treat it like the number: floats take the default dtype)."""
    key = (v.__class__, v, _default_dtype())  # (the dtype a float or complex takes)
    t = _WRAP_CACHE.get(key)
    if t is None:
        if v.__class__ is float:
            t = torch.tensor(v, dtype=torch.get_default_dtype())
        else:
            t = torch.tensor(v)
        if len(_WRAP_CACHE) < 512:
            _WRAP_CACHE[key] = t
    return t


_SCALAR_CACHE: dict = {}


def _host_scalar(v):
    """A private copy of a 0-dim host tensor (shared by equal values: the worker only reads it)."""
    val = v.item()
    if not val:  # 0 and -0.0 compare equal but differ: no sharing
        return v.detach().clone()
    key = (v.dtype, val)
    t = _SCALAR_CACHE.get(key)
    if t is None:
        t = v.detach().clone()
        if len(_SCALAR_CACHE) < 512:
            _SCALAR_CACHE[key] = t
    return t


class _Scan:
    """Result of one pass over the arguments."""

    __slots__ = ("key", "cpu_args", "cpu_kwargs", "device", "host")


def _scan_value(v, flag: int, key: list, s: _Scan):
    c = v.__class__
    if c is _Tensor or isinstance(v, _Tensor):
        d = v.get_device()
        if d >= 0:
            if s.device is None:
                s.device = d
            elif s.device != d:
                raise same_device_error(torch.device(_DEVICE_TYPE, s.device), v.device)
            key.append((v.shape, v.stride(), v.dtype, d))
            return _rt.cpu_view(v)
        # a host tensor: 0-dim ones are scalars, read at dispatch (later host changes do not leak in)
        key.append((v.shape, v.stride(), v.dtype, -1))
        if v.dim() == 0:
            return _host_scalar(v)
        s.host = v  # an error unless the op takes host tensors (CPU indices): read it now
        return v.clone()
    if c is list or c is tuple:
        sub: list = []
        out = [_scan_value(x, flag, sub, s) for x in v]
        key.append(tuple(sub))
        return out
    if flag and (c is float or c is int or c is bool or c is complex):
        key.append(c)
        return _wrapped(v) if flag == _WRAPPED else v
    if c is torch.Generator:
        key.append("gen")
        return v
    key.append(v)
    return v


def scan(args, kwargs, pos_flags, kw_flags) -> _Scan:
    """Signature key, CPU arguments and device of one call."""
    s = _Scan()
    s.device = None
    s.host = None
    key: list = [_default_dtype()]  # it decides a result's dtype (an integer tensor times a Python float)
    n = len(pos_flags)
    s.cpu_args = [_scan_value(a, pos_flags[i] if i < n else 0, key, s) for i, a in enumerate(args)]
    cpu_kwargs = {}
    for k, v in kwargs.items():
        key.append(k)
        cpu_kwargs[k] = _scan_value(v, kw_flags.get(k, 0), key, s)
    s.cpu_kwargs = cpu_kwargs
    s.key = tuple(key)
    return s


def _flat_tensors(result) -> list:
    if isinstance(result, _Tensor):
        return [result]
    if isinstance(result, (list, tuple)):
        out = []
        for r in result:
            out.extend(_flat_tensors(r))
        return out
    return []


def _abstract(v, flag: int, counter: list):
    """Lowering form of an argument: TensorMeta / ScalarArg / hashable values."""
    if isinstance(v, _Tensor):
        return _lower.meta_of(v)
    if isinstance(v, (list, tuple)):
        return tuple(_abstract(x, flag, counter) for x in v)
    if flag and isinstance(v, (bool, int, float)):
        name = f"s{counter[0]}"
        counter[0] += 1
        return _lower.ScalarArg(name, type(v))
    if isinstance(v, torch.Generator):
        return None
    return v


# ---- handlers ------------------------------------------------------------------------------

class Entry:
    """What a signature key maps to: output metadata and the lowered Program (None: nothing to run)."""

    __slots__ = ("outs", "lowered")

    def __init__(self, outs, lowered):
        self.outs = outs  # (shape, stride, dtype) per result (None for an undefined one), or per out= tensor
        self.lowered = lowered


def _arg_flag(a) -> int:
    t = str(a.type)
    if t in _NUMBER_KINDS:
        return _NUMBER
    if t in _TENSOR_KINDS:
        return _WRAPPED
    return _PLAIN


class Handler:
    """The device kernel of one op overload."""

    def __init__(self, op, cpu_fn=None):
        self.op = op
        self.name = op_label(op)
        schema = op._schema
        self.schema = schema
        args = schema.arguments
        self.pos_flags = tuple(_arg_flag(a) for a in args if not a.kwarg_only)
        self.kw_flags = {a.name: _arg_flag(a) for a in args}
        for name in _STRUCTURAL_NUMBERS.get(self.name, ()):
            names = [a.name for a in args if not a.kwarg_only]
            if name in names:
                flags = list(self.pos_flags)
                flags[names.index(name)] = _PLAIN
                self.pos_flags = tuple(flags)
            self.kw_flags[name] = _PLAIN
        if not any(str(a.type) in _TENSOR_KINDS or str(a.type).startswith("List[")
                   for a in args if not (a.alias_info is not None and a.alias_info.is_write)):
            # no tensor input (arange.start_out, linspace.out): the numbers decide the output's
            # shape, so they are part of the signature by value
            self.pos_flags = tuple(_PLAIN for _ in self.pos_flags)
            self.kw_flags = {k: _PLAIN for k in self.kw_flags}
        self.write_pos = [i for i, a in enumerate(args) if not a.kwarg_only and a.alias_info is not None
                          and a.alias_info.is_write]
        self.out_kw = [a.name for a in args if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
        rets = schema.returns
        self.n_returns = len(rets)
        self.list_return = len(rets) == 1 and str(rets[0].type) == "List[Tensor]"
        tensor_returns = all(str(r.type) in ("Tensor", "List[Tensor]") for r in rets)
        self.returns_alias = [r.alias_info is not None for r in rets]
        tags = op.tags
        dynamic = torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags
        gens = [(i, a) for i, a in enumerate(args) if "Generator" in str(a.type)]
        self.gen = (gens[0][0], gens[0][1].name, gens[0][1].kwarg_only) if gens else None
        self.fn = cpu_fn or op
        self.out_fn = None
        self.out_names: list[str] = []
        self.cache: dict = {}
        # what the call does to its arguments and results
        if torch.Tag.inplace_view in tags or any(r.alias_info is not None and not r.alias_info.is_write for r in rets):
            self.kind = "meta"  # views and in-place view ops: metadata only
        elif self.out_kw:
            self.kind = "out"
        elif self.write_pos and all(self.returns_alias):  # (no returns: _foreach_add_ and friends)
            self.kind = "inplace"
        else:
            self.kind = "functional"  # fresh results (possibly also writing some arguments)
        self.cacheable = not dynamic and self.kind != "meta" and (
            (tensor_returns and bool(rets)) or (self.kind == "inplace" and not rets))
        if self.kind == "functional" and not self.write_pos and cpu_fn is None:
            found = _find_out_overload(op)
            if found is not None:
                self.out_fn, self.out_names = found
        # the native kernel may repeat its cached signatures: those whose numerics are the op's
        # own CPU kernel, with no generator to draw from
        self.native = self.kind == "meta" or (
            self.cacheable and cpu_fn is None and self.gen is None and self.kind in ("functional", "inplace"))
        if _rt is not None:
            self.describe()

    def describe(self) -> None:
        """Tell the native kernel what it may do with this op on its own (see the module doc)."""
        code = {"meta": 1, "functional": 2, "inplace": 3}[self.kind] if self.native else 0
        args = self.schema.arguments
        _rt.fast_describe(self.schema.name, self.schema.overload_name, code, [self.kw_flags[a.name] for a in args],
                          list(self.write_pos), self.n_returns, self.list_return,
                          self.out_fn._schema.overload_name if self.out_fn is not None else "")

    def _teach(self, entry) -> None:
        """Teach the native kernel the signature of the call in progress (if it keyed one)."""
        if self.kind == "functional":
            _rt.fast_learn(self.name, entry.outs, entry.lowered is not None,
                           entry.lowered.modeled_ns if entry.lowered is not None else 0.0)
        else:
            _rt.fast_learn(self.name, [], entry.lowered is not None,
                           entry.lowered.modeled_ns if entry.lowered is not None else 0.0)

    # -- the hot path ------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        _STATS["calls"] += 1
        if self.kind == "meta":
            return self.op.redispatch(_CPU_KS, *args, **kwargs)
        s = scan(args, kwargs, self.pos_flags, self.kw_flags)
        if s.device is None:
            s.device = _factory_device(kwargs)
        if s.host is not None and self.name not in _HOST_TENSORS_OK:
            raise same_device_error(torch.device(_DEVICE_TYPE, s.device), s.host.device)
        entry = self.cache.get(s.key) if self.cacheable else None
        if entry is None:
            return self._first(s, args, kwargs)
        if self.native:
            self._teach(entry)
        core = s.device
        kind = self.kind
        if kind == "functional":
            rt = _rt
            outs = [None if sp is None else rt.empty(sp[0], sp[1], sp[2], core) for sp in entry.outs]
            if entry.lowered is not None:
                cpu_outs = [rt.cpu_view(o) for o in outs if o is not None]
                if self.out_fn is not None:
                    work = (_run_out, (self, s.cpu_args, s.cpu_kwargs, cpu_outs), {}, self.name)
                else:
                    work = (_run_and_copy, (self.fn, s.cpu_args, s.cpu_kwargs, cpu_outs), {}, self.name)
                self._submit(core, entry.lowered, work, s)
            if self.list_return:
                return outs
            return outs[0] if self.n_returns == 1 else tuple(outs)
        # in-place and out=: the CPU views alias the device memory that is written
        if kind == "out":
            self._resize_outs(entry, kwargs)
            for name in self.out_kw:
                s.cpu_kwargs[name] = _cpu_tree(kwargs[name])
        if entry.lowered is not None:
            self._submit(core, entry.lowered, (self.fn, s.cpu_args, s.cpu_kwargs, self.name), s)
        return self._aliased_results(args, kwargs)

    def _aliased_results(self, args, kwargs):
        if self.kind == "out":
            results = [kwargs[n] for n in self.out_kw]
        else:
            if not self.n_returns:
                return None
            results = [args[i] for i in self.write_pos[:self.n_returns]]
        return results[0] if len(results) == 1 else tuple(results)

    def _submit(self, core, low, work, s):
        if self.gen is not None:
            work = _with_generator(self.gen, work, s, core)
        _runtime.submit(core, self.name, "kernel", low.rule, low.program, low.modeled_ns, work, low.hbm_bytes)

    def _resize_outs(self, entry, kwargs):
        i = 0
        for name in self.out_kw:
            vals = kwargs[name]
            for t in (vals if isinstance(vals, (list, tuple)) else [vals]):
                shape = entry.outs[i][0]
                i += 1
                if tuple(t.shape) != tuple(shape):
                    t.resize_(shape)

    # -- the first call of a signature: synchronous, on the worker ----------------------------
    def _first(self, s: _Scan, args, kwargs):
        _STATS["first_calls" if self.cacheable else "sync_calls"] += 1
        core = s.device
        box: list = []
        fresh = {}
        if self.kind == "out":
            # fresh host outputs: the CPU kernel may resize them; device outputs follow below
            for name in self.out_kw:
                fresh[name] = s.cpu_kwargs[name] = _fresh_like(kwargs[name])
        work = (_capture, (self.fn, s.cpu_args, s.cpu_kwargs, box), {}, self.name)
        if self.gen is not None:
            work = _with_generator(self.gen, work, s, core)
        _worker.put(work)
        _worker.wait()
        if not box:
            raise RuntimeError(f"sim device: {self.name} did not run")
        ok, result = box[0]
        if not ok:
            raise result
        copies: list = []
        if self.kind == "functional":
            value, written = _to_device(result, core, copies, args, kwargs)
        elif self.kind == "out":
            written = _settle_outs(self.out_kw, kwargs, fresh, copies)
            value = self._aliased_results(args, kwargs)
        else:
            value = self._aliased_results(args, kwargs)
            written = _flat_tensors([args[i] for i in self.write_pos if i < len(args)])
        if self.kind == "functional":
            tops = value if self.list_return or self.n_returns > 1 else [value]
            outs = [(tuple(t.shape), tuple(t.stride()), t.dtype) if isinstance(t, _Tensor) else None for t in tops]
        else:
            outs = [(tuple(t.shape), tuple(t.stride()), t.dtype) for t in written]
        lowered = self._lower(args, kwargs, written) if any(t.numel() for t in written) or not written else None
        if lowered is not None:
            copy_work = (_copy_pairs, (copies,), {}, self.name) if copies else None
            end = _runtime.submit(core, self.name, "kernel", lowered.rule, lowered.program, lowered.modeled_ns,
                                  copy_work, lowered.hbm_bytes)
            if not self.cacheable:
                _runtime.wait_until(end)  # the host waits for what it reads
        elif copies:
            _worker.put((_copy_pairs, (copies,), {}, self.name))
        if self.cacheable:
            if len(self.cache) >= _SIGNATURES_PER_OP:
                self.cache.clear()  # a workload of ever-new shapes: start over rather than grow
            entry = self.cache[s.key] = Entry(outs, lowered)
            if self.native and s.host is None:
                self._teach(entry)
        return value

    def _lower(self, args, kwargs, written):
        counter = [0]
        n = len(self.pos_flags)
        largs = tuple(_abstract(a, self.pos_flags[i] if i < n else 0, counter) for i, a in enumerate(args))
        lkw = []
        k_out = 0
        for k in sorted(kwargs):
            if k in self.out_kw:
                m = len(_flat_tensors(kwargs[k]))
                refs = tuple(_lower.OutputRef(k_out + j) for j in range(m))
                lkw.append((k, refs if isinstance(kwargs[k], (list, tuple)) else refs[0]))
                k_out += m
            else:
                lkw.append((k, _abstract(kwargs[k], self.kw_flags.get(k, 0), counter)))
        if written:
            outputs = tuple(_lower.meta_of(t) for t in written)
        else:  # nothing written (a non-tensor result): model it as reading its first input
            ins = [t for t in _flat_tensors(list(args) + list(kwargs.values())) if t.numel()]
            if not ins:
                return None
            outputs = (_lower.meta_of(ins[0]),)
        call = _lower.Call(self.name, largs, tuple(lkw), outputs)
        with _hidden:
            return _lower.lower(call, _runtime.settings().preset)


_HOST_TENSORS_OK = {"aten::_local_scalar_dense", "aten::equal", "aten::index.Tensor", "aten::index_put_",
                    "aten::_index_put_impl_", "aten::index_put"}


def _fresh_like(v):
    if isinstance(v, _Tensor):
        return torch.empty(v.shape, dtype=v.dtype)
    if isinstance(v, (list, tuple)):
        return type(v)(_fresh_like(x) for x in v)
    return v


def _settle_outs(out_kw, kwargs, fresh, copies) -> list:
    """After a synchronous out= call on fresh host outputs: size the device outputs like
    the results (``resize_``) and queue the copies into them."""
    written = []
    for name in out_kw:
        devs = _flat_tensors(kwargs[name])
        for t, r in zip(devs, _flat_tensors(fresh[name])):
            if tuple(t.shape) != tuple(r.shape):
                t.resize_(r.shape)
            copies.append((_rt.cpu_view(t), r))
            written.append(t)
    return written


def _factory_device(kwargs) -> int:
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


def _to_device(result, core, copies, args, kwargs):
    """Device tensors for a CPU result: its memory when nothing else holds it (no copy into fresh
    pages, the bulk of a large first call), else a copy queued as a (dst view, src) pair; results
    that alias a device argument (returned inputs) are that argument."""
    written: list = []

    def convert(r):
        if isinstance(r, _Tensor):
            for a in _flat_tensors(list(args) + list(kwargs.values())):
                if a.get_device() >= 0 and _same_memory(a, r):
                    return a
            # a fresh result becomes device memory as it is; a shared one is copied
            out = _rt.adopt(r, core)
            if out is None:
                out = _rt.empty(list(r.shape), list(r.stride()), r.dtype, core)
                copies.append((_rt.cpu_view(out), r))
            written.append(out)
            return out
        if isinstance(r, (list, tuple)):
            items = [convert(x) for x in r]
            return tuple(items) if isinstance(r, tuple) else items
        return r

    return convert(result), written


def _same_memory(dev, cpu) -> bool:
    """Whether a CPU result is the device argument ``dev`` itself (an op that returns its input)."""
    if cpu.numel() == 0 or dev.dtype != cpu.dtype:
        return False
    try:
        view = _rt.cpu_view(dev)
        return view.data_ptr() == cpu.data_ptr() and view.shape == cpu.shape and view.stride() == cpu.stride()
    except RuntimeError:
        return False


# ---- worker-side functions (keep them short: they hold the GIL) -----------------------------

def _capture(fn, args, kwargs, box):
    try:
        box.append((True, fn(*args, **kwargs)))
    except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
        box.append((False, e))


def _run_and_copy(fn, args, kwargs, outs):
    result = fn(*args, **kwargs)
    for o, r in zip(outs, _flat_tensors(result)):
        o.copy_(r)


def _run_out(handler, args, kwargs, outs):
    if handler.out_fn is not None:
        kw = dict(kwargs)
        for name, o in zip(handler.out_names, outs):
            # a separate view: a kernel that fails to resize its output leaves that view's sizes
            # changed (larger than the memory behind it), so the fallback below must not use it
            kw[name] = o.as_strided(o.shape, o.stride(), o.storage_offset())
        try:
            handler.out_fn(*args, **kw)
            if all(kw[n].shape == o.shape and kw[n].stride() == o.stride() for n, o in zip(handler.out_names, outs)):
                return
        except RuntimeError as e:
            if "resize" not in str(e):
                raise
        handler.out_fn = None  # this op's out= form resizes its output internally: compute then copy
    _run_and_copy(handler.fn, args, kwargs, outs)


def _copy_pairs(pairs):
    for dst, src in pairs:
        dst.copy_(src)


def _with_generator(gen_spec, work, s, core):
    from ._special import run_with_generator

    pos, name, kwarg_only = gen_spec
    if not kwarg_only and pos < len(s.cpu_args):
        container, key = s.cpu_args, pos
    else:
        container, key = s.cpu_kwargs, name
    gen = container.get(key) if isinstance(container, dict) else container[key]
    if gen is not None and gen.device.type != _DEVICE_TYPE:
        raise RuntimeError(
            f"Expected a '{_DEVICE_TYPE}' device type for generator but found '{gen.device.type}'. "
            f"Create it with torch.Generator(device={_DEVICE_TYPE!r})."
        )
    if isinstance(container, dict):
        container[key] = None
    return (run_with_generator, (work, container, key, gen, core), {}, work[3])


def _find_out_overload(op):
    """(out= overload, its output argument names) matching a functional overload, if any."""
    schema = op._schema
    rets = schema.returns
    if not rets or any(str(r.type) != "Tensor" for r in rets):
        return None
    names = [a.name for a in schema.arguments]
    types = [str(a.type) for a in schema.arguments]
    packet = op.overloadpacket
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        cs = cand._schema
        outs = [a for a in cs.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
        if len(outs) != len(rets):
            continue
        rest = [a for a in cs.arguments if a not in outs]
        if [a.name for a in rest] != names or [str(a.type) for a in rest] != types:
            continue
        return cand, [a.name for a in outs]
    return None


_HANDLERS: dict = {}
# device ops with no CPU kernel: the CPU function that computes them
_CPU_SUBSTITUTES: dict = {}


def use_handler(op, handler) -> None:
    """Handle ``op`` with ``handler`` (a callable taking the op's arguments) instead of a
    :class:`Handler` (ops with their own semantics reached through the native kernel)."""
    _HANDLERS[op] = handler


def handler_for(op) -> Handler:
    h = _HANDLERS.get(op)
    if h is None:
        h = _HANDLERS[op] = Handler(op, _CPU_SUBSTITUTES.get(op_label(op)))
    return h


def handle(op, *args, **kwargs):
    """The backend fallback: route ``op`` to its handler."""
    h = _HANDLERS.get(op)
    if h is None:
        h = handler_for(op)
    return h(*args, **kwargs)
