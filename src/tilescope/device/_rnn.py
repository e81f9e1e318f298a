"""The fused recurrent cells PyTorch calls on an accelerator: ``_thnn_fused_lstm_cell`` /
``_thnn_fused_gru_cell`` and their backward ops.

On CPU, ``lstm_cell`` / ``gru_cell`` (behind ``nn.LSTM``, ``nn.GRU``, ``nn.LSTMCell``,
``nn.GRUCell``) compute their gates with separate ops; on CUDA and on a PrivateUse1 device
PyTorch instead adds the two gate matmuls' results with one fused elementwise kernel, which
only CUDA implements. These are the CPU definitions the device worker computes them with,
in the layout CUDA's kernels use (``aten/src/ATen/native/cuda/RNN.cu``): the same outputs,
and the same *workspace* -- the activated gates the forward saves for its backward:

* LSTM: workspace ``(B, 4H)`` = ``[i, f, g, o]`` after their activations;
* GRU: workspace ``(B, 5H)`` = ``[r, z, n, hx, hn]`` (``hn``: the hidden side of the new
  gate, with its bias).

Half-precision inputs are computed in float32 and rounded once, as CUDA's kernels do
(their accumulation type).

>>> import torch
>>> gi, gh, cx = torch.randn(2, 12), torch.randn(2, 12), torch.randn(2, 3)
>>> hy, cy, ws = lstm_cell(gi, gh, cx)
>>> i, f, g, o = (gi + gh).chunk(4, 1)
>>> c = f.sigmoid() * cx + i.sigmoid() * g.tanh()
>>> torch.allclose(cy, c), torch.allclose(hy, o.sigmoid() * c.tanh()), tuple(ws.shape)
(True, True, (2, 12))
"""

from __future__ import annotations

import torch

__all__ = ["lstm_cell", "lstm_cell_backward", "gru_cell", "gru_cell_backward", "register"]

_LOW = (torch.float16, torch.bfloat16)


def _acc(t):
    """The tensor in its accumulation dtype (float32 for half types, as CUDA's kernels)."""
    return t.float() if t is not None and t.dtype in _LOW else t


def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    g = _acc(input_gates) + _acc(hidden_gates)
    if input_bias is not None:
        g = g + _acc(input_bias) + _acc(hidden_bias)
    return g


def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """``aten::_thnn_fused_lstm_cell`` -> ``(hy, cy, workspace)``."""
    i, f, g, o = _gates(input_gates, hidden_gates, input_bias, hidden_bias).chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * _acc(cx) + i * g
    hy = o * cy.tanh()
    dt = input_gates.dtype
    return hy.to(dt), cy.to(dt), torch.cat((i, f, g, o), 1).to(dt)


def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """``aten::_thnn_fused_lstm_cell_backward_impl`` -> ``(grad_gates, grad_cx, grad_bias)``."""
    if grad_hy is None and grad_cy is None:
        return None, None, None
    dt = workspace.dtype
    i, f, g, o = _acc(workspace).chunk(4, 1)
    cx, cy = _acc(cx), _acc(cy)
    ghy = _acc(grad_hy) if grad_hy is not None else torch.zeros_like(cy)
    gcy = _acc(grad_cy) if grad_cy is not None else torch.zeros_like(cy)
    tcy = cy.tanh()
    gc = ghy * o * (1 - tcy * tcy) + gcy  # gradient reaching the cell state
    gi = gc * g * (1 - i) * i
    gf = gc * cx * (1 - f) * f
    gg = gc * i * (1 - g * g)
    go = ghy * tcy * (1 - o) * o
    grad_gates = torch.cat((gi, gf, gg, go), 1).to(dt)
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, (gc * f).to(dt), grad_bias


def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """``aten::_thnn_fused_gru_cell`` -> ``(hy, workspace)``."""
    ir, ii, in_ = _acc(input_gates).chunk(3, 1)
    hr, hi, hn = _acc(hidden_gates).chunk(3, 1)
    if input_bias is not None:
        br, bi, bn = _acc(input_bias).chunk(3, 0)
        cr, ci, cn = _acc(hidden_bias).chunk(3, 0)
        ir, ii, in_, hr, hi, hn = ir + br, ii + bi, in_ + bn, hr + cr, hi + ci, hn + cn
    r = (ir + hr).sigmoid()
    z = (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    h = _acc(hx)
    hy = n + z * (h - n)
    dt = hx.dtype
    return hy.to(dt), torch.cat((r, z, n, h, hn), 1).to(dt)


def gru_cell_backward(grad_hy, workspace, has_bias):
    """``aten::_thnn_fused_gru_cell_backward`` -> ``(grad_input_gates, grad_hidden_gates,
    grad_hx, grad_input_bias, grad_hidden_bias)``."""
    dt = workspace.dtype
    r, z, n, hx, hn = _acc(workspace).chunk(5, 1)
    go = _acc(grad_hy)
    gz = go * (hx - n) * (1 - z) * z
    ghx = go * z
    gn = go * (1 - z) * (1 - n * n)
    gr = gn * hn * (1 - r) * r
    grad_input = torch.cat((gr, gz, gn), 1).to(dt)
    grad_hidden = torch.cat((gr, gz, gn * r), 1).to(dt)
    if has_bias:
        return grad_input, grad_hidden, ghx.to(dt), grad_input.sum(0), grad_hidden.sum(0)
    return grad_input, grad_hidden, ghx.to(dt), None, None


_CPU = {
    "aten::_thnn_fused_lstm_cell": lstm_cell,
    "aten::_thnn_fused_lstm_cell_backward_impl": lstm_cell_backward,
    "aten::_thnn_fused_gru_cell": gru_cell,
    "aten::_thnn_fused_gru_cell_backward": gru_cell_backward,
}


def register(aten_lib) -> None:
    """Run the fused cells on the device: the worker computes them with the functions above
    (PyTorch has no CPU kernel for them)."""
    from . import _dispatch

    for label, fn in _CPU.items():
        _dispatch._CPU_SUBSTITUTES[label] = fn
        name = label.split("::", 1)[1]
        aten_lib.impl(name, _dispatch.handler_for(getattr(torch.ops.aten, name).default), "PrivateUse1")
