"""Real model code through torch.compile(backend="tilescope"): GPT-2 and Llama training steps at
their real vocabularies, a compiled ResNet-18 training step against eager, HF-style KV caches.
Values are checked against CPU; explain() must work wherever the backend does."""

import copy

import pytest
import torch

import tilescope.device
from tilescope.compile import explain

from compile_models import GPT2, Llama, ResNet18, batch


@pytest.fixture(scope="module", autouse=True)
def sim(sim_virtual):
    """Every test here runs on the sim device, virtual clock (tests/conftest.py)."""


def _count_executions(fn, *args, warm: int = 2):
    recs = []
    for _ in range(warm):
        fn(*args)
    torch.sim.synchronize()
    tilescope.device.subscribe(recs.append)
    try:
        out = fn(*args)
        torch.sim.synchronize()
    finally:
        tilescope.device.unsubscribe(recs.append)
    return out, recs


def _resnet_step(model, opt):
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


@pytest.mark.slow
def test_compiled_resnet18_training_step_runs_no_more_executions_than_eager():
    """BatchNorm statistics updated in place, the optimizer's foreach ops one Program, the
    counters batched: fewer executions than eager (the model compiled, or the whole step), the
    same values."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = ResNet18(width=16).train()
    x, y = torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))
    results = {}
    for mode in ("eager", "model", "step"):
        model = copy.deepcopy(base).to("sim")
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        step = _resnet_step(torch.compile(model, backend="tilescope") if mode == "model" else model, opt)
        if mode == "step":
            step = torch.compile(step, backend="tilescope")
        loss, recs = _count_executions(step, x.to("sim"), y.to("sim"))
        results[mode] = (loss.item(), len(recs), {k: v.cpu() for k, v in model.state_dict().items()})
    eager_loss, eager_n, eager_state = results["eager"]
    for mode in ("model", "step"):
        loss, n, state = results[mode]
        assert n <= eager_n, f"compiled ({mode}) {n} executions, eager {eager_n}"
        assert loss == pytest.approx(eager_loss, rel=1e-4, abs=1e-5)
        for k, v in eager_state.items():
            torch.testing.assert_close(state[k], v, rtol=1e-3, atol=1e-4, msg=f"{mode}: {k}")


def _train_step_matches_cpu(cls, vocab: int):
    torch._dynamo.reset()
    torch.manual_seed(0)
    cpu = cls(vocab=vocab)
    sim = copy.deepcopy(cpu).to("sim")
    idx, tgt = batch(vocab, b=2, t=16)
    ref = cpu(idx, tgt)
    ref.backward()
    loss = torch.compile(sim, backend="tilescope")(idx.to("sim"), tgt.to("sim"))
    loss.backward()
    torch.testing.assert_close(loss.cpu(), ref.detach(), rtol=1e-4, atol=1e-4)
    grads = dict(sim.named_parameters())
    for name, p in cpu.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[name].grad.cpu(), p.grad, rtol=1e-3, atol=1e-5, msg=name)

    def fwd_bwd(idx, tgt):
        loss = sim(idx, tgt)
        loss.backward()
        return loss

    e = explain(fwd_bwd, idx.to("sim"), tgt.to("sim"))
    assert e.graphs == 2 and e.fused
    # the vocabulary-wide log-softmax is one fused group streaming the rows in column chunks
    assert any("amax" in " ".join(f.fx_nodes) for f in e.fused)


@pytest.mark.slow
def test_gpt2_training_step_at_its_real_vocabulary():
    _train_step_matches_cpu(GPT2, 50257)


@pytest.mark.slow
def test_llama_training_step_at_its_real_vocabulary():
    _train_step_matches_cpu(Llama, 128256)


def test_hf_style_kv_cache_compiles_and_explains():
    """GPT-2 code as HF writes it: each block's cache starts as torch.tensor([]) on the device and
    grows by torch.cat."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    cpu = GPT2(vocab=512).eval()
    sim = copy.deepcopy(cpu).to("sim")
    idx, _ = batch(512, b=2, t=8)
    with torch.no_grad():
        ref, ref_cache = cpu(idx, use_cache=True)
        e = explain(lambda i: sim(i, use_cache=True), idx.to("sim"))
        got, cache = torch.compile(sim, backend="tilescope")(idx.to("sim"), use_cache=True)
    assert e.fused and any(u.op == "cat" for u in e.unfused)
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cache[0][0].cpu(), ref_cache[0][0], rtol=1e-4, atol=1e-4)
