"""Recurrent layers on the device: ``nn.LSTM`` / ``nn.GRU`` / ``nn.LSTMCell`` / ``nn.GRUCell``
reach PyTorch's fused cell ops (``_thnn_fused_lstm_cell``, ``_thnn_fused_gru_cell`` and their
backward ops) on an accelerator; outputs, states and every gradient match CPU."""

import collections

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import tilescope.device as dev
from tilescope.device import _rnn

dev.register()

CASES = {
    "LSTMCell": (lambda: nn.LSTMCell(5, 4), (3, 5)),
    "LSTMCell no bias": (lambda: nn.LSTMCell(5, 4, bias=False), (3, 5)),
    "LSTMCell unbatched": (lambda: nn.LSTMCell(5, 4), (5,)),
    "GRUCell": (lambda: nn.GRUCell(5, 4), (3, 5)),
    "GRUCell no bias": (lambda: nn.GRUCell(5, 4, bias=False), (3, 5)),
    "LSTM": (lambda: nn.LSTM(5, 4), (6, 3, 5)),
    "LSTM 2 layers bidirectional batch_first": (
        lambda: nn.LSTM(5, 4, num_layers=2, bidirectional=True, batch_first=True), (3, 6, 5)),
    "LSTM proj_size": (lambda: nn.LSTM(5, 4, proj_size=2), (6, 3, 5)),
    "GRU 2 layers bidirectional": (lambda: nn.GRU(5, 4, num_layers=2, bidirectional=True), (6, 3, 5)),
    "GRU no bias batch_first": (lambda: nn.GRU(5, 4, bias=False, batch_first=True), (3, 6, 5)),
}


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flat(o)]


def _pair(make):
    torch.manual_seed(0)
    cpu = make()
    sim = make()
    sim.load_state_dict(cpu.state_dict())
    return cpu, sim.to("sim")


def _fused_ops(execs):
    return collections.Counter(e.op for e in execs if "_thnn_fused" in e.op)


@pytest.mark.parametrize("case", list(CASES))
def test_recurrent_layer_matches_cpu_forward_and_backward(case):
    make, shape = CASES[case]
    cpu, sim = _pair(make)
    x = torch.randn(shape)
    xc, xs = x.clone().requires_grad_(), x.to("sim").requires_grad_()
    with dev.recording() as execs:
        outs_c, outs_s = _flat(cpu(xc)), _flat(sim(xs))
        sum((o * o).sum() for o in outs_c).backward()
        sum((o * o).sum() for o in outs_s).backward()
        torch.sim.synchronize()
    for a, b in zip(outs_c, outs_s):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xs.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(cpu.named_parameters(), sim.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-6, msg=name)
    fused = _fused_ops(execs)
    kind = "lstm" if "LSTM" in case else "gru"
    backward = "_backward_impl" if kind == "lstm" else "_backward"
    steps = 1 if len(shape) < 3 else shape[1] if "batch_first" in case else shape[0]
    assert fused[f"aten::_thnn_fused_{kind}_cell"] >= steps
    assert fused[f"aten::_thnn_fused_{kind}_cell{backward}"] == fused[f"aten::_thnn_fused_{kind}_cell"]


@pytest.mark.parametrize("make", [lambda: nn.LSTM(5, 4, num_layers=2, bidirectional=True, batch_first=True),
                                  lambda: nn.GRU(5, 4, batch_first=True)], ids=["LSTM", "GRU"])
def test_packed_sequences_match_cpu(make):
    cpu, sim = _pair(make)
    x, lengths = torch.randn(3, 6, 5), torch.tensor([6, 4, 1])
    h0 = torch.randn(4 if isinstance(cpu, nn.LSTM) else 1, 3, 4)
    state_c = (h0, h0.clone()) if isinstance(cpu, nn.LSTM) else h0
    state_s = (h0.to("sim"), h0.to("sim")) if isinstance(cpu, nn.LSTM) else h0.to("sim")
    out_c, _ = cpu(pack_padded_sequence(x, lengths, batch_first=True), state_c)
    out_s, _ = sim(pack_padded_sequence(x.to("sim"), lengths, batch_first=True), state_s)
    a, la = pad_packed_sequence(out_c, batch_first=True)
    b, lb = pad_packed_sequence(out_s, batch_first=True)
    torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-5, atol=1e-6)
    assert la.tolist() == lb.tolist()
    a.pow(2).sum().backward()
    b.pow(2).sum().backward()
    for (name, p), q in zip(cpu.named_parameters(), sim.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_half_precision_cells_are_computed_in_float32_like_cuda():
    cpu, sim = _pair(lambda: nn.LSTM(5, 4))
    x = torch.randn(6, 3, 5)
    ref = cpu(x)[0]
    got = sim.half()(x.to("sim", torch.float16))[0]
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float().cpu(), ref.detach(), rtol=2e-3, atol=2e-3)


def test_double_backward_through_a_cell_matches_cpu():
    cpu, sim = _pair(lambda: nn.GRUCell(5, 4))
    x = torch.randn(3, 5)
    grads = []
    for m, xx in ((cpu, x.clone().requires_grad_()), (sim, x.to("sim").requires_grad_())):
        (g,) = torch.autograd.grad(m(xx).pow(2).sum(), xx, create_graph=True)
        (gg,) = torch.autograd.grad(g.pow(2).sum(), xx)
        grads.append(gg.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)


def test_cell_workspaces_use_cuda_layouts():
    gi, gh, h = torch.randn(2, 12), torch.randn(2, 12), torch.randn(2, 4)
    hy, ws = _rnn.gru_cell(gi, gh, h, torch.randn(12), torch.randn(12))
    assert ws.shape == (2, 20)
    torch.testing.assert_close(ws[:, 12:16], h)  # [r, z, n, hx, hn]
    hy, cy, ws = _rnn.lstm_cell(gi[:, :12], gh, h[:, :3])
    assert ws.shape == (2, 12)
    i, f, g, o = ws.chunk(4, 1)
    torch.testing.assert_close(cy, f * h[:, :3] + i * g)
    assert _rnn.lstm_cell_backward(None, None, h, h, ws, True) == (None, None, None)
