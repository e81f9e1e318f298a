"""``nn.Module.to("sim")`` and the moves back keep each Parameter (identity, weight tying,
its gradient), as they do for CUDA: PyTorch moves a Parameter in place when
``torch._has_compatible_shallow_copy_type`` says the two tensors' kinds allow it, which the
device answers like CUDA (``_csrc/runtime.cpp``)."""

import pytest
import torch
from torch import nn

import tilescope.device as dev

dev.register()


class TinyGPT(nn.Module):
    """GPT-2's shape of weight tying: the output projection is the token embedding."""

    def __init__(self, vocab=37, d=16):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(8, d)
        self.ln = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        h = self.wte(idx) + self.wpe(pos)
        h = h + self.mlp(self.ln(h))
        return self.lm_head(h)


def _tied(m):
    return m.lm_head.weight is m.wte.weight


def test_shallow_copy_compatibility_is_answered_as_for_cuda():
    ask = torch._has_compatible_shallow_copy_type
    c, s = torch.zeros(2), torch.zeros(2, device="sim")
    assert ask(c, s) and ask(s, c) and ask(s, s) and ask(s, s.half())
    # sparse and dense tensors stay incompatible, as they are for CPU
    assert not ask(c.to_sparse(), s) and not ask(s, c.to_sparse())


def test_to_device_keeps_tied_parameters_and_their_identity():
    torch.manual_seed(0)
    m = TinyGPT()
    before = list(m.parameters())
    assert m.to("sim") is m
    after = list(m.parameters())
    assert len(after) == len(before) and all(a is b for a, b in zip(after, before))
    assert _tied(m) and m.wte.weight.device.type == "sim"
    for move in (lambda: m.half(), lambda: m.float(), lambda: m.to(torch.bfloat16), lambda: m.cpu(),
                 lambda: m.to("sim", torch.float32), lambda: m.sim()):
        move()
        assert _tied(m) and [p is q for p, q in zip(m.parameters(), before)] == [True] * len(before)
    assert m.wte.weight.device.type == "sim" and m.wte.weight.dtype == torch.float32


def test_gradients_move_with_their_parameters():
    m = nn.Linear(3, 2)
    m(torch.randn(4, 3)).sum().backward()
    grad = m.weight.grad.clone()
    m.to("sim")
    assert m.weight.grad.device.type == "sim"
    torch.testing.assert_close(m.weight.grad.cpu(), grad)
    m.cpu()
    assert m.weight.grad.device.type == "cpu"


@pytest.mark.parametrize("optimizer_before_move", [False, True])
def test_tied_training_matches_cpu(optimizer_before_move):
    torch.manual_seed(0)
    cpu = TinyGPT()
    sim = TinyGPT()
    sim.load_state_dict(cpu.state_dict())
    opt_c = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    if optimizer_before_move:  # as on CUDA: the optimizer holds the Parameters that move
        opt_s = torch.optim.AdamW(sim.parameters(), lr=1e-2)
        sim.to("sim")
    else:
        sim.to("sim")
        opt_s = torch.optim.AdamW(sim.parameters(), lr=1e-2)
    assert len(opt_s.param_groups[0]["params"]) == len(opt_c.param_groups[0]["params"])
    idx = torch.randint(0, 37, (2, 8))
    for _ in range(3):
        for model, opt, x in ((cpu, opt_c, idx), (sim, opt_s, idx.to("sim"))):
            opt.zero_grad()
            logits = model(x)
            nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
            opt.step()
    assert _tied(sim)
    for (name, p), q in zip(cpu.named_parameters(), sim.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5, msg=name)


def test_swap_tensors_on_conversion_keeps_ties_too():
    old = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        m = TinyGPT()
        w = m.wte.weight
        m.to("sim")
        assert _tied(m) and m.wte.weight is w and w.device.type == "sim"
        m.cpu()
        assert _tied(m) and w.device.type == "cpu"
    finally:
        torch.__future__.set_swap_module_params_on_conversion(old)
