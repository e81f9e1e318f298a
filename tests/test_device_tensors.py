"""Real device tensors on the simulated device: the PyTorch surface users rely on.

Every value is checked against the same computation on CPU.
"""

import copy

import numpy as np
import pytest
import torch

import tilescope.device as dev

dev.register()


def close(a, b, **kw):
    torch.testing.assert_close(a.cpu() if isinstance(a, torch.Tensor) else a,
                               b.cpu() if isinstance(b, torch.Tensor) else b, **kw)


def test_register_is_idempotent_and_names_the_device():
    assert dev.register() == "sim" == dev.device_name()
    with pytest.raises(RuntimeError, match="already registered as 'sim'"):
        dev.register("other")
    assert torch.sim.is_available() and torch.sim.device_count() == dev.settings().preset.cores_per_chip


def test_factories_copies_and_printing():
    x = torch.arange(12, dtype=torch.float32, device="sim").reshape(3, 4)
    assert x.device == torch.device("sim", 0) and x.is_sim
    close(x, torch.arange(12.0).reshape(3, 4))
    close(torch.zeros(2, 3, device="sim"), torch.zeros(2, 3))
    close(torch.full((2, 2), 7.0, device="sim"), torch.full((2, 2), 7.0))
    close(torch.eye(3, device="sim"), torch.eye(3))
    close(torch.tensor([1.5, 2.5], device="sim"), torch.tensor([1.5, 2.5]))
    assert "device='sim:0'" in repr(x) and "11." in repr(x)
    c = torch.randn(5, 6)
    close(c.to("sim").cpu(), c)
    close(c.sim().cpu(), c)
    assert x.sum().item() == 66.0 and x[1, 2].item() == 6.0 and x.tolist()[2] == [8.0, 9.0, 10.0, 11.0]


def test_views_share_memory_and_in_place_writes_reach_the_base():
    base = torch.zeros(4, 6, device="sim")
    v = base[1:3, ::2]
    assert v._base is base and v.stride() == (6, 2)
    v.add_(5)
    t = base.t()
    t[0, 3] = 9.0
    ref = torch.zeros(4, 6)
    ref[1:3, ::2] += 5
    ref.t()[0, 3] = 9.0
    close(base, ref)
    close(base.view(24)[:7], ref.view(24)[:7])
    close(base.reshape(6, 4).permute(1, 0).contiguous(), ref.reshape(6, 4).permute(1, 0).contiguous())
    s = base.unsqueeze(0).squeeze_(0)
    assert s.shape == (4, 6)


def test_out_and_in_place_forms():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    sa, sb = a.to("sim"), b.to("sim")
    out = torch.empty(3, 4, device="sim")
    r = torch.add(sa, sb, alpha=2, out=out)
    assert r is out
    close(out, a + 2 * b)
    wrong = torch.empty(0, device="sim")
    torch.mul(sa, sb, out=wrong)
    close(wrong, a * b)
    sa.mul_(3).sub_(sb)
    close(sa, a * 3 - b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64])
def test_dtype_casts(dtype):
    x = torch.randn(4, 5) * 10
    s = x.to("sim").to(dtype)
    assert s.dtype == dtype and s.device.type == "sim"
    close(s, x.to(dtype))
    close(s.float() * 2, x.to(dtype).float() * 2)
    close(x.to("sim", dtype), x.to(dtype))


def test_module_autograd_and_optimizer_match_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    sim = copy.deepcopy(model).to("sim")
    assert all(p.device.type == "sim" for p in sim.parameters())
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    opt_c = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt_s = torch.optim.SGD(sim.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        for m, opt, xx, yy in ((model, opt_c, x, y), (sim, opt_s, x.to("sim"), y.to("sim"))):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(xx), yy)
            loss.backward()
            opt.step()
    for pc, ps in zip(model.parameters(), sim.parameters()):
        close(ps, pc, rtol=1e-5, atol=1e-5)
        close(ps.grad, pc.grad, rtol=1e-5, atol=1e-5)


def test_fused_builtins_are_one_execution_each_with_autograd():
    x = torch.randn(6, 32)
    w = torch.randn(32)
    cases = {
        "rms_norm": lambda t, w: torch.rms_norm(t, (32,), w, 1e-6),
        "layer_norm": lambda t, w: torch.nn.functional.layer_norm(t, (32,), w, None, 1e-5),
        "softmax": lambda t, w: torch.softmax(t * w, -1),
        "log_softmax": lambda t, w: torch.log_softmax(t * w, -1),
        "gelu": lambda t, w: torch.nn.functional.gelu(t * w),
        "silu": lambda t, w: torch.nn.functional.silu(t * w),
    }
    for name, fn in cases.items():
        xs = x.to("sim").requires_grad_()
        ws = w.to("sim").requires_grad_()
        xc = x.clone().requires_grad_()
        wc = w.clone().requires_grad_()
        recs = []
        dev.subscribe(recs.append)
        try:
            ys = fn(xs, ws)
        finally:
            dev.unsubscribe(recs.append)
        # the built-in itself (not the `t * w` that feeds some cases) is one execution, never generic
        builtin = [r for r in recs if r.op != "aten::mul.Tensor"]
        assert len(builtin) == 1 and builtin[0].lowering != "generic", (name, [(r.op, r.lowering) for r in recs])
        yc = fn(xc, wc)
        close(ys, yc, rtol=1e-5, atol=1e-5)
        g = torch.randn_like(yc)
        ys.backward(g.to("sim"))
        yc.backward(g)
        close(xs.grad, xc.grad, rtol=1e-4, atol=1e-5)
        close(ws.grad, wc.grad, rtol=1e-4, atol=1e-5)


def test_attention_is_one_execution_with_autograd():
    q, k, v = (torch.randn(2, 3, 40, 16) for _ in range(3))
    qs, ks, vs = (t.to("sim").requires_grad_() for t in (q, k, v))
    recs = []
    dev.subscribe(recs.append)
    try:
        out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    finally:
        dev.unsubscribe(recs.append)
    assert [r.lowering for r in recs] == ["fused:attention"]
    qc, kc, vc = (t.clone().requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
    close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    out.backward(g.to("sim"))
    ref.backward(g)
    for a, b in ((qs, qc), (ks, kc), (vs, vc)):
        close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_fused_builtins_lay_out_their_outputs_as_cpu_does():
    """Code written against CPU's strides keeps working: attention's output follows the query's
    dimension order (the usual split of one qkv projection, then ``transpose(1, 2).view``),
    rms_norm's output is contiguous whatever its input's layout."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    qkv = torch.randn(2, 32, 3 * 64)

    def attention(qkv):
        q, k, v = qkv.view(2, 32, 3, 4, 16).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y, y.transpose(1, 2).view(2, 32, 64)

    (y_cpu, z_cpu), (y_sim, z_sim) = attention(qkv), attention(qkv.to("sim"))
    assert y_sim.stride() == y_cpu.stride() == (2048, 16, 64, 1)
    torch.testing.assert_close(z_sim.cpu(), z_cpu)
    xt = torch.randn(8, 16).t()
    out = F.rms_norm(xt.to("sim"), (8,))
    assert out.stride() == F.rms_norm(xt, (8,)).stride() == (8, 1)
    torch.testing.assert_close(out.view(-1).cpu(), F.rms_norm(xt, (8,)).view(-1))


def test_seeded_rng_and_generators():
    torch.manual_seed(123)
    a = torch.randn(100, device="sim")
    torch.manual_seed(123)
    b = torch.randn(100, device="sim")
    close(a, b)
    g = torch.Generator(device="sim").manual_seed(7)
    c = torch.rand(50, device="sim", generator=g)
    g.manual_seed(7)
    d = torch.rand(50, device="sim", generator=g)
    close(c, d)
    assert 0 <= float(c.min()) and float(c.max()) < 1
    state = torch.sim.get_rng_state()
    e = torch.randn(10, device="sim")
    torch.sim.set_rng_state(state)
    close(torch.randn(10, device="sim"), e)
    drop = torch.nn.functional.dropout(torch.ones(1000, device="sim"), 0.5)
    assert 300 < int((drop == 0).sum()) < 700


def test_several_cores_have_their_own_timelines():
    n = torch.sim.device_count()
    assert n >= 2
    recs = []
    dev.subscribe(recs.append)
    try:
        a = torch.ones(64, device="sim:1")
        b = (a * 2).sum()
        with torch.sim.device(1):
            c = torch.zeros(3, device="sim")
        moved = a.to("sim:0")
    finally:
        dev.unsubscribe(recs.append)
    assert a.device.index == 1 and c.device.index == 1 and moved.device.index == 0
    assert b.item() == 128.0
    cores = {r.op: r.core for r in recs}
    assert cores["aten::mul.Tensor"] == 1 and cores["aten::copy_"] == 0
    x = torch.randn(5, device="sim:1", requires_grad=True)
    (x * x).sum().backward()
    close(x.grad, 2 * x.detach())


def test_save_load_and_deepcopy_in_process(tmp_path):
    m = torch.nn.Linear(4, 3).to("sim")
    path = tmp_path / "m.pt"
    torch.save(m.state_dict(), path)
    sd = torch.load(path, map_location="sim")
    assert sd["weight"].device.type == "sim"
    close(sd["weight"], m.weight.detach())
    m2 = copy.deepcopy(m)
    close(m2.weight, m.weight)
    assert m2.weight.data_ptr() != m.weight.data_ptr()


def test_memory_statistics_follow_allocations():
    torch.sim.synchronize()
    before = torch.sim.memory_allocated()
    x = torch.empty(1024, 1024, device="sim")
    assert torch.sim.memory_allocated() - before == 4 * 1024 * 1024
    assert torch.sim.max_memory_allocated() >= torch.sim.memory_allocated()
    free, total = torch.sim.mem_get_info()
    assert total == dev.settings().preset.hbm_bytes and free <= total
    del x
    assert torch.sim.memory_allocated() == before


def test_a_fresh_cpu_result_becomes_device_memory_without_a_copy():
    from tilescope.device import _dispatch

    rt = _dispatch._rt
    torch.sim.synchronize()
    before = torch.sim.memory_allocated()
    cpu = torch.empty_strided((3, 2), (1, 3))  # strides kept as they are
    cpu.copy_(torch.tensor([[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]))
    ptr = cpu.data_ptr()
    d = rt.adopt(cpu, 0)
    assert d.device.type == "sim" and d.data_ptr() == ptr and d.stride() == (1, 3)
    assert torch.sim.memory_allocated() - before == 6 * 4  # counted as device memory
    # shared storage is never adopted: the caller copies
    assert rt.adopt(cpu, 0) is None and rt.adopt(rt.cpu_view(d), 0) is None
    assert rt.adopt(torch.ones(6).reshape(2, 3), 0) is None  # a view: its base holds the storage too
    assert rt.adopt(torch.from_numpy(np.ones(4, np.float32)), 0) is None  # memory numpy owns
    del cpu  # the device tensor keeps the memory alive
    assert d.cpu().tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    del d
    assert torch.sim.memory_allocated() == before
    # memory of CPU's default allocator is taken over: freed, it is cached for reuse like any block
    cached = torch.sim.memory_reserved() - torch.sim.memory_allocated()
    d = rt.adopt(torch.randn(1024), 0)
    del d
    assert torch.sim.memory_reserved() - torch.sim.memory_allocated() - cached == 4096


def test_a_signatures_first_call_copies_no_fresh_result(monkeypatch):
    from tilescope.device import _dispatch

    copied = []
    monkeypatch.setattr(_dispatch, "_copy_pairs", lambda pairs: copied.extend(pairs))
    x = torch.randn(3, 517)
    y = torch.exp(x.to("sim") * 1.75)  # shapes no earlier test used: first calls of both ops
    torch.sim.synchronize()
    assert copied == []
    close(y, torch.exp(x * 1.75))


def test_autocast_and_accelerator_api():
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    with torch.autocast(device_type="sim", dtype=torch.bfloat16):
        y = x.to("sim") @ w.to("sim")
        p = torch.softmax(y, -1)
    assert y.dtype == torch.bfloat16 and p.dtype == torch.float32  # CUDA's op lists and policies
    close(y.float(), (x.bfloat16() @ w.bfloat16()).float(), rtol=1e-2, atol=1e-2)
    assert torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "sim"
    torch.accelerator.synchronize()  # reaches the runtime's synchronize through the device guard
