"""Fused built-ins: calls whose Program is traced from a tile kernel (:mod:`.kernels`).

Each rule reshapes the call into the kernel's ``[rows, d]`` form (the op's last dim
is ``d``) and asks the kernel for its cached Program (``Kernel.program_for``); calls
outside a kernel's form (a softmax over another dim, a strided input) are declined and
take the elementwise or generic lowering. Attention has its own module (:mod:`._attention`).
"""

from __future__ import annotations

from math import prod

from ..errors import CapacityError, TileLimitError
from ._call import Call, TensorMeta
from ._declines import note
from ._rules import Rule, add_rules

__all__ = ["FUSED"]

_KERNEL_DTYPES = ("float32", "bfloat16", "float16")
_MAX_D = 16384  # elements of the last dim a kernel tile holds per partition


def _spec(shape, dtype):
    from ..lang import TensorSpec

    return TensorSpec(tuple(shape), dtype)


def _rows_d(x: TensorMeta, d: int):
    if not x.is_contiguous or x.numel == 0 or x.dtype not in _KERNEL_DTYPES or d <= 0 or x.numel % d:
        return None
    if d > _MAX_D:
        return None
    return x.numel // d, d


def _norm_rows(x, named) -> tuple[int, int] | None:
    """(rows, d) of a norm's input over its ``normalized_shape`` (None: not the kernel's form)."""
    shape = tuple(named.get("normalized_shape") or ())
    if not isinstance(x, TensorMeta) or not shape:
        return None
    return _rows_d(x, prod(shape))


def _affine_ok(p, x: TensorMeta) -> bool:
    """An optional weight or bias the kernel reads as [d]: absent, or contiguous in x's dtype."""
    return p is None or (isinstance(p, TensorMeta) and p.is_contiguous and p.dtype == x.dtype)


def _program(kernel, spec, *args):
    try:
        return kernel.program_for(*args, preset=spec).program
    except (TileLimitError, CapacityError) as e:  # the shape's tiles do not fit this kernel's form: the
        note(f"tiles do not fit the kernel ({type(e).__name__})")  # next rule takes the call. Any other
        return None  # error is a bug in the kernel and surfaces.


def _last_dim(call: Call, named):
    x = named.get("self")
    if not isinstance(x, TensorMeta):
        return None, None
    if x.ndim == 0:
        return x, 1
    dim = named.get("dim", -1)
    if dim is not None and dim % x.ndim != x.ndim - 1:
        return x, None
    return x, x.shape[-1]


def _softmax_like(kernel_name):
    def build(call: Call, spec):
        from . import kernels

        named = call.named()
        if named.get("half_to_float"):
            return None
        x, d = _last_dim(call, named)
        if d is None or call.outputs[0].dtype != x.dtype:
            return None
        rd = _rows_d(x, d)
        if rd is None:
            return None
        return _program(getattr(kernels, kernel_name), spec, _spec(rd, x.dtype))
    return build


def _softmax_backward(kernel_name):
    def build(call: Call, spec):
        from . import kernels

        named = call.named()
        g, y = named.get("grad_output"), named.get("output")
        if not isinstance(g, TensorMeta) or not isinstance(y, TensorMeta) or g.shape != y.shape or g.dtype != y.dtype:
            return None
        dim = named.get("dim", -1)
        if y.ndim and dim % y.ndim != y.ndim - 1:
            return None
        d = y.shape[-1] if y.ndim else 1
        rd = _rows_d(y, d)
        if rd is None or not g.is_contiguous or call.outputs[0].dtype != y.dtype:
            return None
        return _program(getattr(kernels, kernel_name), spec, _spec(rd, g.dtype), _spec(rd, y.dtype))
    return build


def _layer_norm(call: Call, spec):
    from . import kernels

    named = call.named()
    x, w, b = named.get("input"), named.get("weight"), named.get("bias")
    rd = _norm_rows(x, named)
    if rd is None or not (_affine_ok(w, x) and _affine_ok(b, x)):
        return None
    d = rd[1]
    eps = named.get("eps", 1e-5)
    return _program(kernels.layer_norm_kernel, spec, _spec(rd, x.dtype),
                    None if w is None else _spec((d,), w.dtype), None if b is None else _spec((d,), b.dtype),
                    float(eps))


def _layer_norm_backward(call: Call, spec):
    from . import kernels

    named = call.named()
    g, x, mean, rstd, w = (named.get(k) for k in ("grad_out", "input", "mean", "rstd", "weight"))
    if not all(isinstance(t, TensorMeta) for t in (g, x, mean, rstd)):
        return None
    rd = _norm_rows(x, named)
    if rd is None or not g.is_contiguous or g.dtype != x.dtype or not mean.is_contiguous or not rstd.is_contiguous:
        return None
    if not _affine_ok(w, x):
        return None
    d = rd[1]
    stat = _spec((rd[0], 1), mean.dtype)
    return _program(kernels.layer_norm_backward_kernel, spec, _spec(rd, g.dtype), _spec(rd, x.dtype), stat,
                    _spec((rd[0], 1), rstd.dtype), None if w is None else _spec((d,), w.dtype))


def _rms_norm_backward(call: Call, spec):
    from . import kernels

    named = call.named()
    g, x, rstd, w = (named.get(k) for k in ("grad", "input", "rstd", "weight"))
    if not all(isinstance(t, TensorMeta) for t in (g, x, rstd)):
        return None
    rd = _norm_rows(x, named)
    if rd is None or not g.is_contiguous or g.dtype != x.dtype or not rstd.is_contiguous or not _affine_ok(w, x):
        return None
    d = rd[1]
    return _program(kernels.rms_norm_backward_kernel, spec, _spec(rd, g.dtype), _spec(rd, x.dtype),
                    _spec((rd[0], 1), rstd.dtype), None if w is None else _spec((d,), w.dtype))


def _rms_norm(call: Call, spec):
    from . import kernels

    named = call.named()
    x, w = named.get("input"), named.get("weight")
    rd = _norm_rows(x, named)
    if rd is None or not _affine_ok(w, x):
        return None
    d = rd[1]
    eps = named.get("eps")
    if eps is None:
        import torch

        eps = float(torch.finfo(getattr(torch, x.dtype)).eps)
    return _program(kernels.rms_norm_kernel, spec, _spec(rd, x.dtype),
                    None if w is None else _spec((d,), w.dtype), float(eps))


FUSED = {
    "_softmax": Rule("fused:softmax", _softmax_like("softmax_kernel"), "softmax_kernel"),
    "_log_softmax": Rule("fused:log_softmax", _softmax_like("log_softmax_kernel"), "log_softmax_kernel"),
    "native_layer_norm": Rule("fused:layer_norm", _layer_norm, "layer_norm_kernel"),
    "native_layer_norm_backward": Rule("fused:layer_norm_backward", _layer_norm_backward,
                                       "layer_norm_backward_kernel"),
    "_softmax_backward_data": Rule("fused:softmax_backward", _softmax_backward("softmax_backward_kernel"),
                                   "softmax_backward_kernel"),
    "_log_softmax_backward_data": Rule("fused:log_softmax_backward",
                                       _softmax_backward("log_softmax_backward_kernel"),
                                       "log_softmax_backward_kernel"),
    "tilescope::rms_norm": Rule("fused:rms_norm", _rms_norm, "rms_norm_kernel"),
    "tilescope::rms_norm_backward": Rule("fused:rms_norm_backward", _rms_norm_backward, "rms_norm_backward_kernel"),
}

for _name, _rule in FUSED.items():
    add_rules([_name], _rule)
