"""Ops tilescope adds to PyTorch (``torch.ops.tilescope``): schemas, CPU reference kernels,
meta kernels and autograd formulas. The simulated device registers its kernels for them.

* ``tilescope::rms_norm(input, normalized_shape, weight=None, eps=None) -> (out, rstd)``:
  RMSNorm that also returns the per-row ``rstd`` its backward needs (statistics in float32).
* ``tilescope::rms_norm_backward(grad, input, normalized_shape, rstd, weight, output_mask)
  -> (grad_input, grad_weight)``.

>>> import torch
>>> from tilescope.lower import _custom_ops
>>> _custom_ops.define()
>>> y, rstd = torch.ops.tilescope.rms_norm(torch.ones(2, 4), [4], None, 1e-6)
>>> y.shape, rstd.shape
(torch.Size([2, 4]), torch.Size([2, 1]))
"""

from __future__ import annotations

import threading

import torch

__all__ = ["define"]

_LIBS: list = []
_LOCK = threading.Lock()


def _dims(normalized_shape) -> tuple[int, ...]:
    return tuple(range(-len(normalized_shape), 0))


def _eps(x, eps):
    return torch.finfo(x.dtype).eps if eps is None else eps


def _rms_norm_ref(x, normalized_shape, weight=None, eps=None):
    """Reference numerics (CPU): ``(x * rstd * weight, rstd)``, statistics in float32."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(_dims(normalized_shape), keepdim=True) + _eps(x, eps))
    y = xf * rstd
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype).contiguous(), rstd


def _rms_norm_meta(x, normalized_shape, weight=None, eps=None):
    # contiguous, whatever the input's layout: what aten::rms_norm gives on CPU
    k = len(normalized_shape)
    stat = tuple(x.shape[:x.dim() - k]) + (1,) * k
    return x.new_empty(x.shape), x.new_empty(stat, dtype=torch.float32)


def _rms_norm_backward_ref(grad, x, normalized_shape, rstd, weight, output_mask):
    dims = _dims(normalized_shape)
    xf, gf = x.float(), grad.float()
    xhat = xf * rstd
    gw = gf * weight.float() if weight is not None else gf
    dx = rstd * (gw - xhat * (gw * xhat).mean(dims, keepdim=True)) if output_mask[0] else None
    dw = None
    if weight is not None and output_mask[1]:
        batch = tuple(range(x.dim() - len(normalized_shape)))
        dw = (gf * xhat).sum(batch) if batch else gf * xhat
    return (dx.to(x.dtype) if dx is not None else torch.zeros_like(x),
            dw.to(weight.dtype) if dw is not None else (torch.zeros_like(weight) if weight is not None
                                                          else x.new_empty(0)))


def _rms_norm_backward_meta(grad, x, normalized_shape, rstd, weight, output_mask):
    return torch.empty_like(x), (torch.empty_like(weight) if weight is not None else x.new_empty(0))


def _setup(ctx, inputs, output):
    x, normalized_shape, weight, eps = inputs
    ctx.save_for_backward(x, output[1], weight)
    ctx.normalized_shape = normalized_shape


def _backward(ctx, grad_y, grad_rstd):
    x, rstd, weight = ctx.saved_tensors
    mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[2]]
    dx, dw = torch.ops.tilescope.rms_norm_backward(grad_y, x, ctx.normalized_shape, rstd, weight, mask)
    return (dx if mask[0] else None), None, (dw if mask[1] else None), None



def define() -> None:
    """Define the ``tilescope`` ops once per process (idempotent)."""
    with _LOCK:
        if _LIBS:
            return
        lib = torch.library.Library("tilescope", "DEF")
        _LIBS.append(lib)
        lib.define("rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) "
                   "-> (Tensor, Tensor)")
        lib.define("rms_norm_backward(Tensor grad, Tensor input, SymInt[] normalized_shape, Tensor rstd, "
                   "Tensor? weight, bool[2] output_mask) -> (Tensor, Tensor)")
        lib.impl("rms_norm", _rms_norm_ref, "CPU")
        lib.impl("rms_norm", _rms_norm_meta, "Meta")
        lib.impl("rms_norm_backward", _rms_norm_backward_ref, "CPU")
        lib.impl("rms_norm_backward", _rms_norm_backward_meta, "Meta")
        torch.library.register_autograd("tilescope::rms_norm", _backward, setup_context=_setup, lib=lib)
