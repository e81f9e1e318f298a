"""Fused built-ins that PyTorch would otherwise decompose: one device execution each.

Most fused built-ins are single aten ops already (``_softmax``, ``_log_softmax``,
``native_layer_norm``, ``gelu``, ``silu``); their lowering rules give them a tile-kernel
Program (:mod:`tilescope.lower.kernels`). Three need registrations here:

* ``torch.rms_norm`` is a composite op (pow, mean, add, rsqrt, mul) for a backend without
  its own kernel. On this device it calls ``tilescope::rms_norm`` (output and ``rstd``, one
  execution; defined in :mod:`tilescope.lower._custom_ops`) whose backward is
  ``tilescope::rms_norm_backward`` (one more execution, also a tile kernel). Under tracing
  (``torch.compile``'s fake or functional tensors) it decomposes as usual, so the
  compiler sees the plain graph.
* ``layer_norm`` would go through ``batch_norm`` on a backend without its own kernel: it
  calls ``native_layer_norm`` (one execution; its backward ``native_layer_norm_backward``
  another, both tile kernels), as on CPU.
* ``scaled_dot_product_attention``: the native runtime picks PyTorch's "overrideable"
  fused-attention backend for this device (3-D/4-D inputs, masks, dropout, query heads
  sharing key/value heads); forward and backward are one execution each, modeled by the
  flash-style Programs of :mod:`tilescope.lower._attention`. Values are CPU torch's, dropout
  drawn from the device generator as every random op of this device.
"""

from __future__ import annotations

import torch

from .. import lower as _lower
from ..lower.internal import define_custom_ops
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
# The native runtime picks PyTorch's "overrideable" fused backend for this device whenever the
# kernel takes the call (see _csrc/runtime.cpp): one execution forward, one backward. Values are
# computed as CPU computes them: the same torch call on the worker, and with dropout the same
# draws (the device generator's state on a CPU twin, as every random op of this device), so a
# seeded run matches CPU. The twin's state before the draws travels to the backward in the
# ``philox_seed`` output (what CUDA's kernels keep there: how to replay the mask).

def _scale(q, scale):
    return scale if scale is not None else 1.0 / (q.shape[-1] ** 0.5)


def _gqa(q, k, v):
    """Keys and values repeated for the query heads that share them (torch's enable_gqa)."""
    rep = q.shape[-3] // k.shape[-3]
    if rep == 1:
        return k, v
    return k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)


def _scores(q, k, bias, is_causal, scale):
    """``scale * q @ k^T`` with the masks added, in float32 (float64 stays float64)."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    k, _ = _gqa(q, k, k)
    s = (q.to(acc) @ k.to(acc).transpose(-2, -1)) * _scale(q, scale)
    if is_causal:
        L, S = s.shape[-2], s.shape[-1]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if bias is not None:
        s = s.masked_fill(~bias, float("-inf")) if bias.dtype == torch.bool else s + bias.to(acc)
    return s


def _dropout_attention(q, k, v, bias, p, is_causal, scale, generator):
    """CPU's math path with dropout (``_scaled_dot_product_attention_math``): softmax in float32,
    then ``dropout``'s ``empty_like(attn).bernoulli_(1 - p) / (1 - p)`` drawn from ``generator``."""
    s = _scores(q, k, bias, is_causal, scale)
    attn = torch.ops.aten._safe_softmax(s, -1)
    noise = torch.empty_like(attn).bernoulli_(1 - p, generator=generator).div_(1 - p)
    _, v = _gqa(q, v, v)
    return ((attn * noise) @ v.to(attn.dtype)).to(q.dtype)


def _with_twin_generator(core, fn, state=None):
    """Run ``fn(generator)`` on the worker with the device generator's CPU twin (or a generator
    restored to ``state``: a replay that leaves the device generator alone)."""
    from . import _special

    if state is not None:
        gen = torch.Generator()
        gen.set_state(state)
        return fn(gen)
    box = {"generator": None}
    result = []
    _special.run_with_generator((lambda: result.append(fn(box["generator"])), (), {}, "sdpa"), box,
                                "generator", None, core)
    return result[0]


def _sdpa_numerics(ins, outs, has_bias, dropout_p, is_causal, scale, core):
    q, k, v = ins[:3]
    bias = ins[3] if has_bias else None
    out, lse = outs[0], outs[1]
    if dropout_p:
        def run(gen):
            outs[2].copy_(gen.get_state())  # philox_seed: the state the mask is drawn from
            return _dropout_attention(q, k, v, bias, dropout_p, is_causal, scale, gen)
        out.copy_(_with_twin_generator(core, run))
    else:
        out.copy_(torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, is_causal=is_causal, scale=scale, enable_gqa=q.shape[-3] != k.shape[-3]))
    lse.copy_(torch.logsumexp(_scores(q, k, bias, is_causal, scale), -1).reshape(lse.shape))


def _sdpa_backward_numerics(ins, outs, has_bias, want_bias, dropout_p, is_causal, scale, state):
    grad, q, k, v = ins[:4]
    bias = ins[4] if has_bias else None
    with torch.enable_grad():
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        b = bias.detach().clone().requires_grad_(want_bias) if bias is not None else None
        if dropout_p:
            seed = ins[-1]
            out = _with_twin_generator(None, lambda gen: _dropout_attention(*leaves, b, dropout_p, is_causal, scale,
                                                                            gen), state=seed.clone())
        else:
            out = torch.nn.functional.scaled_dot_product_attention(
                *leaves, attn_mask=b, is_causal=is_causal, scale=scale, enable_gqa=q.shape[-3] != k.shape[-3])
        wrt = leaves + ([b] if want_bias else [])
        grads = torch.autograd.grad(out, wrt, grad, allow_unused=True)
    for o, g in zip(outs, grads):
        if o.numel():
            o.copy_(torch.zeros_like(o) if g is None else g.sum_to_size(o.shape) if g.shape != o.shape else g)


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


def _lowered(op, args, outputs, **consts):
    def meta(t):
        if isinstance(t, torch.Tensor):
            return _lower.meta_of(t)
        return tuple(t) if isinstance(t, list) else t

    call = _lower.Call(op, tuple(meta(t) for t in args), tuple(sorted(consts.items())),
                       tuple(_lower.meta_of(t) for t in outputs))
    return _lower.lower(call, _runtime.settings().preset)


_SDPA = "aten::_scaled_dot_product_fused_attention_overrideable"


def _sdpa_forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                  *, scale=None):
    L, Ev = query.shape[-2], value.shape[-1]
    H = query.shape[-3]
    B = query.shape[0] if query.dim() == 4 else 1
    dev = query.device
    out = _matching_layout(query, tuple(query.shape[:-1]) + (Ev,))
    lse = torch.empty((B, H, L), dtype=torch.float32, device=dev)
    dropout_p = float(dropout_p)
    if dropout_p:  # the generator state the dropout mask is drawn from (replayed by the backward)
        seed = torch.empty(torch.Generator().get_state().numel(), dtype=torch.uint8, device=dev)
    else:
        seed = torch.empty((), dtype=torch.int64, device=dev)
    ins = [query, key, value] + ([attn_bias] if attn_bias is not None else [])
    outs = [out, lse] + ([seed] if dropout_p else [])
    low = _lowered(_SDPA, [query, key, value, attn_bias], [out, lse], dropout_p=dropout_p, is_causal=is_causal,
                   scale=scale)
    core = dev.index
    launch(_SDPA, low.program, ins, outs,
           lambda i, o: _sdpa_numerics(i, o, attn_bias is not None, dropout_p, is_causal, scale, core),
           lowering=low.rule)
    empty = torch.empty(0, dtype=torch.int64, device=dev)
    offset = torch.empty((), dtype=torch.int64, device=dev)
    return out, lse, empty, empty, L, key.shape[-2], seed, offset, torch.empty(0, dtype=query.dtype, device=dev)


def _sdpa_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k,
                   max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    has_bias = attn_bias is not None and attn_bias.numel() > 0
    want_bias = bool(has_bias and attn_bias.is_floating_point() and len(grad_input_mask) > 3 and grad_input_mask[3])
    grads = [torch.empty_like(query), torch.empty_like(key), torch.empty_like(value),
             torch.empty_like(attn_bias) if want_bias else torch.empty(0, dtype=query.dtype, device=query.device)]
    dropout_p = float(dropout_p)
    ins = [grad_out, query, key, value] + ([attn_bias] if has_bias else []) + ([philox_seed] if dropout_p else [])
    outs = [g for g in grads if g.numel()]
    low = _lowered(_SDPA + "_backward",
                   [grad_out, query, key, value, attn_bias if has_bias else None, list(grad_input_mask), out,
                    logsumexp], outs, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    launch(_SDPA + "_backward", low.program, ins, outs,
           lambda i, o: _sdpa_backward_numerics(i, o, has_bias, want_bias, dropout_p, is_causal, scale, None),
           lowering=low.rule)
    return tuple(grads)


# ---- nn.TransformerEncoderLayer's inference fast path --------------------------------------------
# torch takes it for this device too (its list of supported devices names PrivateUse1): one op
# whose CPU kernel would run as one generic execution. On this device it runs as the CPU kernel
# is written -- the same ops in the same order (aten/src/ATen/native/transformers/transformer.cpp)
# -- each with its own lowering: the attention through _native_multi_head_attention (projections,
# fused attention), layer norms, the feed-forward's two linears and activation.

def _encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                       norm_first, layer_norm_eps, layer_norm_weight_1, layer_norm_bias_1, layer_norm_weight_2,
                       layer_norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                       mask_type=None):
    from . import _dispatch

    if src.is_nested or src.numel() == 0:  # nested tensors: the CPU kernel, labelled generic
        return _dispatch.handler_for(torch.ops.aten._transformer_encoder_layer_fwd.default)(
            src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first,
            layer_norm_eps, layer_norm_weight_1, layer_norm_bias_1, layer_norm_weight_2, layer_norm_bias_2,
            ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask, mask_type)
    F = torch.nn.functional

    def norm(x, w, b):
        return F.layer_norm(x, (embed_dim,), w, b, layer_norm_eps)

    x = norm(src, layer_norm_weight_1, layer_norm_bias_1) if norm_first else src
    x = _self_attention(x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type)
    x = x + src
    if not norm_first:
        x = norm(x, layer_norm_weight_1, layer_norm_bias_1)
    res = x
    if norm_first:
        x = norm(x, layer_norm_weight_2, layer_norm_bias_2)
    h = F.linear(x, ffn_weight_1, ffn_bias_1)
    x = F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2) + res
    if not norm_first:
        x = norm(x, layer_norm_weight_2, layer_norm_bias_2)
    return x


def _self_attention(x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type):
    """``_native_multi_head_attention(x, x, x, ..., need_weights=False)``: one projection to q, k, v,
    the fused attention, the output projection. The fast path hands masks over in additive form
    (``F._canonical_mask``): ``mask_type`` 0 is ``[L, L]``, 1 a key padding ``[B, L]``, 2 ``[B, H, L, L]``."""
    F = torch.nn.functional
    batched = x.dim() == 3
    if not batched:
        x = x.unsqueeze(0)
    B, L, _ = x.shape
    d = embed_dim // num_heads
    q, k, v = (t.view(B, L, num_heads, d).transpose(1, 2)
               for t in F.linear(x, qkv_weight, qkv_bias).split(embed_dim, -1))
    if mask is not None and mask_type == 1:
        mask = mask.view(B, 1, 1, L)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    y = F.linear(y.transpose(1, 2).reshape(B, L, embed_dim), proj_weight, proj_bias)
    return y if batched else y.squeeze(0)


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
    define_custom_ops()
    aten_lib.impl("rms_norm", _aten_rms_norm, "AutogradPrivateUse1")
    aten_lib.impl("rms_norm", _aten_rms_norm, "PrivateUse1")
    aten_lib.impl("layer_norm", _aten_layer_norm, "AutogradPrivateUse1")
    aten_lib.impl("layer_norm", _aten_layer_norm, "PrivateUse1")
    aten_lib.impl("_scaled_dot_product_fused_attention_overrideable", _sdpa_forward, "PrivateUse1")
    aten_lib.impl("_scaled_dot_product_fused_attention_overrideable_backward", _sdpa_backward, "PrivateUse1")
    aten_lib.impl("_transformer_encoder_layer_fwd", _encoder_layer_fwd, "PrivateUse1")
