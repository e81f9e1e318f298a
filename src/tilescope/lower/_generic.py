"""The generic lowering: DMA every input in, one GpSimd routine, DMA every output out.

Ops without a specific rule still become real Programs, labelled ``generic``:

* when every operand fits in SBUF together (each as one ``[P, n / P]`` tile), the
  Program loads them, runs one ``gpsimd_call`` whose numerics are the aten op itself
  (impl ``"aten"``: the call is encoded in the instruction's hashed attributes, number
  arguments as runtime scalars), and stores the results -- the Program really performs
  the op, so ``run_numerics`` reproduces it;
* otherwise the operands stream through SBUF in ``[128, F]`` chunks, one GpSimd call per
  chunk (impl ``"aten.model_only"``): the time is modeled, the values come from CPU torch
  on the device worker, and ``run_numerics`` says so.

GpSimd cost of the routine comes from the cost table (``isa.generic_routine_cycles``, an
assumption: an arbitrary op has no published instruction cost).
"""

from __future__ import annotations

from math import prod

import numpy as np
import torch

from ..errors import ProgramError
from ..isa import GENERIC_CYCLES_PER_ELEMENT, RuntimeScalar, generic_routine_cycles
from ..program import TileBuilder
from ..sim import register_gpsimd_impl
from ._call import Call, OutputRef, ScalarArg, TensorMeta
from ._layout import hbm_input, hbm_output

__all__ = ["lower_generic", "GENERIC_CYCLES_PER_ELEMENT"]

# per-partition SBUF bytes the one-shot form may use (of 192 KiB on trn1)
_SBUF_BUDGET = 160 * 1024
_CHUNK_FREE = 2048


def _partition_split(n: int, limit: int = 128) -> tuple[int, int]:
    """(P, F) with P * F == n and P the largest divisor of n not above ``limit``."""
    if n <= 0:
        return 1, 1
    for p in range(min(limit, n), 0, -1):
        if n % p == 0:
            return p, n // p
    return 1, n


def _encode(value, tensors: list[TensorMeta], index: dict):
    """Hashable, JSON-able form of an argument: tensors by index, numbers as runtime scalars."""
    if isinstance(value, TensorMeta):
        k = index[id(value)] if id(value) in index else None
        if k is None:
            k = len(tensors)
            tensors.append(value)
            index[id(value)] = k
        return ("T", k)
    if isinstance(value, ScalarArg):
        return ("S", RuntimeScalar(value.name), value.kind.__name__)
    if isinstance(value, OutputRef):
        return ("O", value.index)
    if isinstance(value, tuple):
        return ("L",) + tuple(_encode(v, tensors, index) for v in value)
    if isinstance(value, torch.dtype):
        return ("dtype", str(value).replace("torch.", ""))
    if isinstance(value, torch.device):
        return ("device", str(value))
    if isinstance(value, (torch.memory_format, torch.layout)):
        return ("enum", str(value).replace("torch.", ""))
    if isinstance(value, torch.Generator):
        return ("generator",)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return ("repr", repr(value))


def lower_generic(call: Call, spec) -> "tuple":
    """Build the generic Program of ``call``; returns (program, faithful)."""
    inputs: list[TensorMeta] = []
    index: dict = {}
    args = tuple(_encode(v, inputs, index) for v in call.args)
    kwargs = tuple((k, _encode(v, inputs, index)) for k, v in call.kwargs)
    outputs = list(call.outputs)
    b = TileBuilder(call.op, spec, bufs=1)
    with b.provenance(op=call.op, label="generic"):
        in_views = [hbm_input(b, f"in{i}", m) for i, m in enumerate(inputs)]
        out_views = [hbm_output(b, f"out{j}", m) for j, m in enumerate(outputs)]
        operands = [m for m in inputs + outputs if m.numel > 0]
        per_part = sum(_partition_split(m.numel)[1] * m.itemsize for m in operands)
        if per_part <= _SBUF_BUDGET and operands:
            _one_shot(b, call, inputs, outputs, in_views, out_views, args, kwargs)
            faithful = True
        else:
            _streamed(b, call, inputs, outputs, in_views, out_views)
            faithful = False
    # the operands' shapes: what the profile names when it says which generic ops hold time
    prog = b.build(meta={"lowering": "generic", "faithful_numerics": faithful,
                         "shapes": [list(m.shape) for m in inputs]})
    return prog, faithful


def _one_shot(b, call, inputs, outputs, in_views, out_views, args, kwargs) -> None:
    in_tiles, out_tiles = [], []
    cycles = 0.0
    for i, (m, v) in enumerate(zip(inputs, in_views)):
        if m.numel == 0:
            in_tiles.append(None)
            continue
        p, f = _partition_split(m.numel)
        t = b.sbuf((p, f), m.device_dtype, site=f"generic.in{i}")
        b.dma_copy(t, v)
        in_tiles.append(t)
        cycles += f
    for j, m in enumerate(outputs):
        if m.numel == 0:
            out_tiles.append(None)
            continue
        p, f = _partition_split(m.numel)
        out_tiles.append(b.sbuf((p, f), m.device_dtype, site=f"generic.out{j}"))
        cycles += f
    attrs = (
        ("op", call.op),
        ("args", args),
        ("kwargs", kwargs),
        ("in_shapes", tuple(tuple(m.shape) for m in inputs)),
        ("in_dtypes", tuple(m.dtype for m in inputs)),
        ("in_present", tuple(t is not None for t in in_tiles)),
        ("out_shapes", tuple(tuple(m.shape) for m in outputs)),
        ("out_dtypes", tuple(m.dtype for m in outputs)),
    )
    present_in = [t for t in in_tiles if t is not None]
    present_out = [t for t in out_tiles if t is not None]
    b.gpsimd_call(call.op, "aten", present_in, present_out, generic_routine_cycles(cycles), attrs)
    for t, v in zip(out_tiles, out_views):
        if t is not None:
            b.dma_copy(v, t)
    if not present_out:  # nothing to write (e.g. an in-place op on an empty tensor)
        return


def _streamed(b, call, inputs, outputs, in_views, out_views) -> None:
    """Stream each operand through rotating [128, F] tiles; one GpSimd call per chunk."""
    for role, metas, views in (("in", inputs, in_views), ("out", outputs, out_views)):
        for i, (m, v) in enumerate(zip(metas, views)):
            n = m.numel
            if n == 0:
                continue
            flat = _flat_chunks(m, v)
            for ap, (p, f) in flat:
                t = b.sbuf((p, f), m.device_dtype, site=f"generic.{role}{i}", bufs=2)
                if role == "in":
                    b.dma_copy(t, ap)
                    b.gpsimd_call(call.op, "aten.model_only", [t], [], generic_routine_cycles(f),
                                  (("op", call.op), ("part", "read")))
                else:
                    b.gpsimd_call(call.op, "aten.model_only", [], [t], generic_routine_cycles(f),
                                  (("op", call.op), ("part", "write")))
                    b.dma_copy(ap, t)


def _flat_chunks(m: TensorMeta, view):
    """Chunks of the tensor in logical order: a multi-dim HBM AP per chunk + tile shape."""
    from ._layout import TilePlan, coalesce

    shape, (strides,) = coalesce(tuple(m.shape), [tuple(m.stride)])
    plan = TilePlan(shape, max_free=_CHUNK_FREE)
    for t in plan.tiles:
        yield plan.operand_ap(view, strides, t), (t.partitions, t.free)


# ---- numerics of the generic routine ------------------------------------------------

def _to_torch(arr: np.ndarray, dtype: str, shape) -> torch.Tensor:
    """A torch tensor of torch dtype name ``dtype`` from a Program array."""
    arr = np.ascontiguousarray(arr)
    if dtype in ("complex64", "complex128", "complex32"):
        real = torch.from_numpy(arr.astype(np.float32)).reshape(shape)
        return torch.view_as_complex(real.contiguous()).to(getattr(torch, dtype))
    if dtype == "bfloat16":
        t = torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    elif dtype == "float8_e4m3fn":
        t = torch.from_numpy(arr.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    else:
        t = torch.from_numpy(arr.copy()).to(getattr(torch, dtype))
    return t.reshape(shape)


def _to_numpy(t: torch.Tensor, dtype: str) -> np.ndarray:
    t = t.detach().contiguous()
    if t.is_complex():
        return torch.view_as_real(t.to(torch.complex64)).numpy()
    if dtype == "bfloat16":
        import ml_dtypes

        return t.to(torch.bfloat16).view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if dtype in ("float8_e4m3", "float8_e4m3fn"):
        import ml_dtypes

        return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    if t.dtype == torch.bool:
        return t.to(torch.uint8).numpy()
    return t.numpy()


def _decode(v, tensors):
    if isinstance(v, tuple) and v:
        tag = v[0]
        if tag == "T":
            return tensors[v[1]]
        if tag == "O":
            return None  # filled below: out= arguments get fresh tensors
        if tag == "S":
            value = v[1]
            kind = {"int": int, "float": float, "bool": bool}.get(v[2], float)
            return kind(value)
        if tag == "L":
            return [_decode(x, tensors) for x in v[1:]]
        if tag == "dtype":
            return getattr(torch, v[1])
        if tag == "device":
            return torch.device("cpu")
        if tag == "enum":
            return getattr(torch, v[1])
        if tag == "generator":
            return None
    return v


def _resolve_op(name: str):
    ns, rest = name.split("::", 1)
    packet, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), packet), overload or "default")


def _aten_numerics(inputs, outputs, attrs) -> None:
    a = dict(attrs)
    present = iter(inputs)
    tensors = []
    for shape, dtype, here in zip(a["in_shapes"], a["in_dtypes"], a["in_present"]):
        if here:
            tensors.append(_to_torch(next(present), dtype, shape))
        else:
            tensors.append(torch.empty(shape, dtype=getattr(torch, dtype)))
    outs = [torch.empty(s[:-1] if d.startswith("complex") else s, dtype=getattr(torch, d))
            for s, d in zip(a["out_shapes"], a["out_dtypes"])]
    args = [_decode(v, tensors) for v in a["args"]]
    kwargs = {k: (outs[v[1]] if isinstance(v, tuple) and v[:1] == ("O",) else _decode(v, tensors))
              for k, v in a["kwargs"]}
    result = _resolve_op(a["op"])(*args, **kwargs)
    flat = _flatten(result)
    out_iter = iter(outputs)
    for t, shape, dtype in zip(flat, a["out_shapes"], a["out_dtypes"]):
        if prod(shape) == 0:
            continue
        dst = next(out_iter)
        dst[...] = _to_numpy(t, dtype).reshape(dst.shape)


def _flatten(result) -> list:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        out = []
        for r in result:
            out.extend(_flatten(r))
        return out
    return []


def _model_only(inputs, outputs, attrs) -> None:
    op = dict(attrs).get("op")
    raise ProgramError(
        f"the generic Program of {op} streams its operands through SBUF in chunks: it models time "
        f"only, and its values come from CPU torch on the device worker, so run_numerics cannot "
        f"reproduce them (operands that fit in SBUF together get a Program that can)"
    )


register_gpsimd_impl("aten", _aten_numerics)
register_gpsimd_impl("aten.model_only", _model_only)
