"""Fused built-ins that PyTorch would otherwise decompose: one device execution each.

Most fused built-ins are single aten ops already (``_softmax``, ``_log_softmax``,
``native_layer_norm``, ``gelu``, ``silu``); their lowering rules give them a tile-kernel
Program (:mod:`tilescope.lower.kernels`). Three need registrations here:

* ``torch.rms_norm`` is a composite op (pow, mean, add, rsqrt, mul) for a backend without
  its own kernel. On this device it calls ``tilescope::rms_norm`` (output and ``rstd``, one
  execution; defined in :mod:`tilescope.lower._ops`) whose backward is
  ``tilescope::rms_norm_backward`` (one more execution, also a tile kernel). Under tracing
  (``torch.compile``'s fake or functional tensors) it decomposes as usual, so the
  compiler sees the plain graph.
* ``layer_norm`` would go through ``batch_norm`` on a backend without its own kernel: it
  calls ``native_layer_norm`` (one execution; its backward ``native_layer_norm_backward``
  another, both tile kernels), as on CPU.
* ``scaled_dot_product_attention``: the native runtime picks PyTorch's "overrideable"
  fused-attention backend for this device (4-D inputs, no dropout, no grouped-query
  expansion); forward and backward are one execution each. Numerics use PyTorch's math
  formulation on the worker.
"""

from __future__ import annotations

import torch

from .. import lower as _lower
from ..lower import _ops
from . import _runtime
from ._launch import launch

__all__ = ["register"]

_LIBS: list = []


def _traced(t) -> bool:
    return t is not None and type(t) not in (torch.Tensor, torch.nn.Parameter)


def _aten_rms_norm(x, normalized_shape, weight=None, eps=None):
    if _traced(x) or _traced(weight):
        return torch.ops.aten.rms_norm.default.decompose(x, normalized_shape, weight, eps)
    return torch.ops.tilescope.rms_norm(x, normalized_shape, weight, eps)[0]


def _aten_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    # for a backend without its own kernel PyTorch lowers layer_norm through batch_norm;
    # native_layer_norm (one op, with its own backward) is what CPU and CUDA run
    if _traced(x) or _traced(weight) or _traced(bias):
        return torch.ops.aten.layer_norm.default.decompose(x, normalized_shape, weight, bias, eps, cudnn_enable)
    return torch.ops.aten.native_layer_norm.default(x, normalized_shape, weight, bias, eps)[0]


# ---- scaled dot-product attention -------------------------------------------------------------

def _scale(q, scale):
    return scale if scale is not None else 1.0 / (q.shape[-1] ** 0.5)


def _scores(q, k, bias, is_causal, scale):
    s = (q.float() @ k.float().transpose(-2, -1)) * _scale(q, scale)
    if is_causal:
        L, S = s.shape[-2], s.shape[-1]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if bias is not None:
        s = s.masked_fill(~bias, float("-inf")) if bias.dtype == torch.bool else s + bias.float()
    return s


def _sdpa_numerics(ins, outs, has_bias, is_causal, scale):
    q, k, v = ins[:3]
    bias = ins[3] if has_bias else None
    out = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, bias, 0.0, is_causal, scale=scale)[0]
    outs[0].copy_(out)
    outs[1].copy_(torch.logsumexp(_scores(q, k, bias, is_causal, scale), -1))


def _sdpa_backward_numerics(ins, outs, has_bias, is_causal, scale, mask):
    grad, q, k, v = ins[:4]
    bias = ins[4] if has_bias else None
    with torch.enable_grad():
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        b = bias.detach().clone().requires_grad_(bias.is_floating_point()) if bias is not None else None
        out = torch.ops.aten._scaled_dot_product_attention_math(*leaves, b, 0.0, is_causal, scale=scale)[0]
        wrt = leaves + ([b] if b is not None and b.requires_grad else [])
        grads = torch.autograd.grad(out, wrt, grad, allow_unused=True)
    for o, g in zip(outs, grads):
        if o.numel() and g is not None:
            o.copy_(g.sum_to_size(o.shape) if g.shape != o.shape else g)


def _matching_layout(query, shape):
    """The attention output as torch lays it out on CPU (and in its meta function): in the
    query's dimension order -- ``(B, L, H, E)`` in memory for the usual split of one qkv
    projection, so that ``out.transpose(1, 2).view(B, L, H * E)`` works as it does there."""
    if tuple(query.shape) == tuple(shape):
        return torch.empty_like(query)
    order = sorted(range(query.dim()), key=lambda d: query.stride(d), reverse=True)
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d], step = step, step * shape[d]
    return torch.empty_strided(shape, strides, dtype=query.dtype, device=query.device)


def _lowered(op, inputs, outputs, **consts):
    args = tuple(_lower.meta_of(t) if isinstance(t, torch.Tensor) else t for t in inputs)
    call = _lower.Call(op, args, tuple(sorted(consts.items())), tuple(_lower.meta_of(t) for t in outputs))
    return _lower.lower(call, _runtime.settings().preset)


def _sdpa_forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                  *, scale=None):
    B, H, L, _ = query.shape
    S, Ev = key.shape[2], value.shape[3]
    dev = query.device
    out = _matching_layout(query, (B, H, L, Ev))
    lse = torch.empty((B, H, L), dtype=torch.float32, device=dev)
    ins = [query, key, value] + ([attn_bias] if attn_bias is not None else [])
    low = _lowered("aten::_scaled_dot_product_fused_attention_overrideable", [query, key, value, attn_bias],
                   [out, lse], dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    launch("aten::_scaled_dot_product_fused_attention_overrideable", low.program, ins, [out, lse],
           lambda i, o: _sdpa_numerics(i, o, attn_bias is not None, is_causal, scale), lowering=low.rule)
    empty = torch.empty(0, dtype=torch.int64, device=dev)
    seed = torch.empty((), dtype=torch.int64, device=dev)
    return out, lse, empty, empty, L, S, seed, seed, torch.empty(0, dtype=query.dtype, device=dev)


def _sdpa_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k,
                   max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    has_bias = attn_bias is not None and attn_bias.numel() > 0
    grads = [torch.empty_like(query), torch.empty_like(key), torch.empty_like(value),
             torch.empty_like(attn_bias) if has_bias and attn_bias.is_floating_point() else
             torch.empty(0, dtype=query.dtype, device=query.device)]
    ins = [grad_out, query, key, value] + ([attn_bias] if has_bias else [])
    outs = [g for g in grads if g.numel()]
    low = _lowered("aten::_scaled_dot_product_fused_attention_overrideable_backward", ins, outs,
                   is_causal=is_causal, scale=scale)
    launch("aten::_scaled_dot_product_fused_attention_overrideable_backward", low.program, ins, outs,
           lambda i, o: _sdpa_backward_numerics(i, o, has_bias, is_causal, scale, grad_input_mask),
           lowering=low.rule)
    return tuple(grads)


# ---- convolution: PyTorch routes this device's convolutions to the "overrideable" ops ------------

def _conv_backward_cpu(grad_output, input, weight, stride, padding, dilation, transposed, output_padding, groups,
                       output_mask):
    bias_sizes = [weight.shape[1] * groups] if transposed else [weight.shape[0]]
    return torch.ops.aten.convolution_backward.default(grad_output, input, weight, bias_sizes, stride, padding,
                                                       dilation, transposed, output_padding, groups, output_mask)


# ---- registration ----------------------------------------------------------------------------

def register(aten_lib) -> None:
    from . import _dispatch

    _dispatch._CPU_SUBSTITUTES["aten::convolution_overrideable"] = torch.ops.aten.convolution.default
    _dispatch._CPU_SUBSTITUTES["aten::convolution_backward_overrideable"] = _conv_backward_cpu
    for name in ("convolution_overrideable", "convolution_backward_overrideable"):
        # these have a default kernel that raises "not implemented": register the device's explicitly
        aten_lib.impl(name, _dispatch.handler_for(getattr(torch.ops.aten, name).default), "PrivateUse1")
    _ops.define()
    aten_lib.impl("rms_norm", _aten_rms_norm, "AutogradPrivateUse1")
    aten_lib.impl("rms_norm", _aten_rms_norm, "PrivateUse1")
    aten_lib.impl("layer_norm", _aten_layer_norm, "AutogradPrivateUse1")
    aten_lib.impl("layer_norm", _aten_layer_norm, "PrivateUse1")
    aten_lib.impl("_scaled_dot_product_fused_attention_overrideable", _sdpa_forward, "PrivateUse1")
    aten_lib.impl("_scaled_dot_product_fused_attention_overrideable_backward", _sdpa_backward, "PrivateUse1")
