"""Ops with their own device semantics: copies, scalar reads, resize, random numbers.

* Host <-> device copies are DMA executions (``kind="memcpy"``). A blocking copy
  waits for the device, as ``copy_`` does on an accelerator (the host sees the data
  when it returns); ``non_blocking=True`` returns at once -- from pinned host memory
  the source is read when the copy runs, from pageable memory it is staged first.
* ``.item()`` is a small device-to-host copy the host waits for.
* ``resize_`` that grows a storage waits for pending work (growing copies the contents).
* Random ops draw from the device's generators (``torch.Generator(device="sim")``
  or the per-core default ones ``manual_seed`` sets) on the worker, in submission order.
"""

from __future__ import annotations

import torch

from .. import lower as _lower
from . import _dispatch, _runtime

__all__ = ["copy_from", "copy_", "copy_from_and_resize", "local_scalar_dense", "resize_",
           "run_with_generator", "default_generator", "record_stream", "new_empty_strided"]

_Tensor = torch.Tensor
_COPY_CHECKED: set = set()


def _rt():
    return _dispatch._rt


def _is_dev(t) -> bool:
    return t.device.type == _dispatch._DEVICE_TYPE


def _copy_lowered(src, dst, op: str):
    call = _lower.Call(op, (_lower.meta_of(src),), (), (_lower.meta_of(dst),))
    with _dispatch._hidden:
        return _lower.lower(call, _runtime.settings().preset)


def _check_broadcast(src, dst) -> None:
    key = (src.shape, dst.shape)
    if key in _COPY_CHECKED:
        return
    with _dispatch._hidden:
        torch.empty(dst.shape, device="meta").copy_(torch.empty(src.shape, device="meta"))
    _COPY_CHECKED.add(key)


def _copy_work(dst_cpu, src_cpu):
    dst_cpu.copy_(src_cpu)


def copy_from(src, dst, non_blocking: bool = False):
    """``aten::_copy_from(self=src, dst)``: any copy with a device tensor on either side."""
    if src.numel() == 0 and dst.numel() == 0:
        return dst
    _check_broadcast(src, dst)
    rt = _rt()
    if _is_dev(src) and _is_dev(dst):
        core = dst.device.index
        low = _copy_lowered(src, dst, "tilescope::copy")
        wait = src.device.index if src.device.index != core else None
        if wait is None:  # a copy on one core: the native kernel may repeat it on its own
            rt.fast_learn("aten::copy_", [], True, low.modeled_ns)
        _runtime.submit(core, "aten::copy_", "memcpy" if wait is not None else "kernel", low.rule, low.program,
                        low.modeled_ns, (_copy_work, (rt.cpu_view(dst), rt.cpu_view(src)), {}, "aten::copy_"),
                        dst.numel() * dst.element_size(), "DtoD", extra_wait_core=wait)
        return dst
    if _is_dev(dst):  # host -> device
        core = dst.device.index
        staged = src
        if non_blocking and not src.is_pinned():
            staged = src.detach().clone()
        low = _copy_lowered(src, dst, "tilescope::memcpy_htod")
        end = _runtime.submit(core, "memcpy HtoD", "memcpy", low.rule, low.program, low.modeled_ns,
                              (_copy_work, (rt.cpu_view(dst), staged), {}, "memcpy HtoD"),
                              dst.numel() * dst.element_size(), "HtoD")
        if not non_blocking:
            _runtime.wait_until(end)
        return dst
    # device -> host
    core = src.device.index
    low = _copy_lowered(src, dst, "tilescope::memcpy_dtoh")
    end = _runtime.submit(core, "memcpy DtoH", "memcpy", low.rule, low.program, low.modeled_ns,
                          (_copy_work, (dst, rt.cpu_view(src)), {}, "memcpy DtoH"),
                          src.numel() * src.element_size(), "DtoH")
    if not non_blocking:
        _runtime.wait_until(end)
    return dst


def copy_(self, src, non_blocking: bool = False):
    """``aten::copy_``: route to :func:`copy_from` (``self`` is the destination)."""
    return copy_from(src, self, non_blocking)


class CopyHandler:
    """``aten::copy_`` through the native kernel: :func:`copy_`, and the kernel told that it is an
    in-place op returning its destination, whose device-to-device copies on one core it may
    repeat itself (the numerics: the CPU ``copy_`` on views, as :func:`copy_from` queues)."""

    def __init__(self):
        op = torch.ops.aten.copy_.default
        schema = op._schema
        # flags: tensors (2), non_blocking by value (0)
        flags = [2 if str(a.type) == "Tensor" else 0 for a in schema.arguments]
        _rt().fast_describe(schema.name, schema.overload_name, 3, flags, [0], 1, False, "")

    def __call__(self, self_, src, non_blocking=False):
        return copy_(self_, src, non_blocking)


def copy_from_and_resize(src, dst):
    if tuple(dst.shape) != tuple(src.shape):
        dst.resize_(src.shape)
    return copy_from(src, dst, False)


def local_scalar_dense(self):
    """``.item()``: a one-element device-to-host copy the host waits for."""
    box: list = []
    rt = _rt()
    view = rt.cpu_view(self)
    low = _copy_lowered(self, self, "tilescope::memcpy_dtoh")
    end = _runtime.submit(self.device.index, "memcpy DtoH", "memcpy", low.rule, low.program, low.modeled_ns,
                          (_item_work, (view, box), {}, "aten::_local_scalar_dense"),
                          self.element_size(), "DtoH")
    if not _runtime.settings().numerics:  # no numerics: still read (undefined) memory, never hang
        from . import _worker

        _worker.put((_item_work, (view, box), {}, "aten::_local_scalar_dense"))
    _runtime.wait_until(end)
    return box[0]


def _item_work(view, box):
    box.append(view.item())


def resize_(self, size, memory_format=None):
    """``resize_``: metadata only when the storage is big enough, else wait and grow."""
    rt = _rt()
    numel = 1
    for n in size:
        numel *= n
    need = (self.storage_offset() + numel) * self.element_size()
    if need > rt.storage_nbytes(self):
        _runtime.wait_numerics()
    rt.resize(self, list(size), memory_format)
    return self


def record_stream(self, stream):
    return None


def new_empty_strided(self, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    """An allocation, not an execution (``new_empty_strided`` would otherwise reach the kernels)."""
    dtype = dtype or self.dtype
    if device is not None and device.type != _dispatch._DEVICE_TYPE:
        return torch.empty_strided(size, stride, dtype=dtype, device=device, pin_memory=bool(pin_memory))
    core = device.index if device is not None and device.index is not None else self.get_device()
    return _rt().empty(list(size), list(stride), dtype, core)


# ---- random numbers -----------------------------------------------------------------

_SHADOW: dict = {}


def default_generator(core: int):
    return _rt().default_generator(core)


def run_with_generator(work, container, key, gen, core):
    """Worker side of a random op: draw from the device generator's state on a CPU twin.

    ``container[key]`` is where the op's CPU arguments hold the generator.
    """
    sim_gen = gen if gen is not None else default_generator(core)
    cpu_gen = _SHADOW.get(core)
    if cpu_gen is None:
        cpu_gen = _SHADOW[core] = torch.Generator()
    cpu_gen.set_state(sim_gen.get_state())
    container[key] = cpu_gen
    fn, args, kwargs, _ = work
    fn(*args, **kwargs)
    sim_gen.set_state(cpu_gen.get_state())
