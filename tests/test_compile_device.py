"""torch.compile(backend="tilescope") on the simulated device."""

import copy

import pytest
import torch

import tilescope.device
from tilescope.compile import STATS, explain


@pytest.fixture(scope="module", autouse=True)
def sim(sim_virtual):
    """Every test here runs on the sim device, virtual clock (tests/conftest.py)."""


@pytest.fixture
def executions():
    recs = []
    tilescope.device.subscribe(recs.append)
    yield recs
    tilescope.device.unsubscribe(recs.append)


def rmsnorm(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def layernorm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)


def softmax(x):
    return torch.softmax(x * 0.5, dim=-1)


def gelu_mlp(x, w1, b1, w2):
    return torch.nn.functional.gelu(x @ w1 + b1) @ w2


def attention(q, k, v):
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    return torch.softmax(scores, dim=-1) @ v


def masked_softmax(x):  # a Python number in the graph: a scalar_tensor node inside the fused group
    return torch.softmax(torch.where(x > 0, x, float("-inf")), dim=-1)


def clamp_by_tensor(x):  # clamp.Tensor, its bound a tensor the graph holds (a lifted constant)
    return x.clamp(min=torch.tensor(-0.5, device=x.device)) * torch.tensor(2.0, device=x.device)


def assign_then_scale(x, y):  # in-place ops and an assignment through a slice
    x = x.clone()
    x.add_(y)
    x[:, 0] = -1
    return x * 2


CASES = {
    "rmsnorm": (rmsnorm, lambda: (torch.randn(4, 96, 256), torch.randn(256))),
    "layernorm": (layernorm, lambda: (torch.randn(200, 384), torch.randn(384), torch.randn(384))),
    "softmax": (softmax, lambda: (torch.randn(300, 512),)),
    "gelu_mlp": (gelu_mlp, lambda: (torch.randn(128, 256), torch.randn(256, 512) * 0.05, torch.randn(512),
                                    torch.randn(512, 256) * 0.05)),
    "attention": (attention, lambda: (torch.randn(2, 128, 64), torch.randn(2, 128, 64), torch.randn(2, 128, 64))),
    "masked_softmax": (masked_softmax, lambda: (torch.randn(300, 512),)),
    "clamp_by_tensor": (clamp_by_tensor, lambda: (torch.randn(64, 256),)),
    "assign_then_scale": (assign_then_scale, lambda: (torch.randn(64, 256), torch.randn(64, 256))),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_equals_eager(name, dtype):
    fn, make = CASES[name]
    torch._dynamo.reset()
    args = [a.to(dtype) for a in make()]
    expected = fn(*args).float()
    compiled = torch.compile(fn, backend="tilescope")
    got = compiled(*[a.to("sim") for a in args]).cpu().float()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=4e-2, atol=4e-2)
    torch.testing.assert_close(got, expected, **tol)


def test_compiled_rmsnorm_is_one_device_execution_per_call(executions):
    torch._dynamo.reset()
    x, w = torch.randn(4, 96, 256, device="sim"), torch.randn(256, device="sim")
    f = torch.compile(rmsnorm, backend="tilescope")
    f(x, w)
    torch.sim.synchronize()
    executions.clear()
    for _ in range(3):
        f(x, w)
    torch.sim.synchronize()
    assert len(executions) == 3
    assert all(r.lowering == "compiled" and "mul" in r.op and "rsqrt" in r.op for r in executions)


def test_matmul_epilogue_is_one_execution_with_a_tensore_stage(executions):
    torch._dynamo.reset()
    f = torch.compile(lambda x, w, b: torch.relu(x @ w + b), backend="tilescope")
    x, w, b = (torch.randn(256, 128, device="sim"), torch.randn(128, 512, device="sim"), torch.randn(512, device="sim"))
    f(x, w, b)
    torch.sim.synchronize()
    executions.clear()
    f(x, w, b)
    torch.sim.synchronize()
    (rec,) = executions
    assert any(i.KIND == "matmul" for i in rec.program.instructions)


def test_recompiles_on_shape_and_dtype_change():
    torch._dynamo.reset()
    f = torch.compile(softmax, backend="tilescope")
    before = STATS["plans"]
    for shape, dtype in (((64, 128), torch.float32), ((64, 256), torch.float32), ((64, 256), torch.bfloat16)):
        x = torch.randn(shape, dtype=dtype)
        torch.testing.assert_close(f(x.to("sim")).cpu(), softmax(x), rtol=2e-2, atol=2e-2)
    assert STATS["plans"] - before >= 3


def test_dynamic_shapes_plan_per_concrete_shape():
    torch._dynamo.reset()
    f = torch.compile(rmsnorm, backend="tilescope", dynamic=True)
    w = torch.randn(128)
    for rows in (16, 40, 200):
        x = torch.randn(rows, 128)
        torch.testing.assert_close(f(x.to("sim"), w.to("sim")).cpu(), rmsnorm(x, w), rtol=1e-4, atol=1e-4)


def test_backward_graph_is_compiled_too():
    torch._dynamo.reset()
    x = torch.randn(64, 128, requires_grad=True)
    w = torch.randn(128, requires_grad=True)
    rmsnorm(x, w).sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    xs = x.detach().to("sim").requires_grad_()
    ws = w.detach().to("sim").requires_grad_()
    graphs = STATS["graphs"]
    torch.compile(rmsnorm, backend="tilescope")(xs, ws).sum().backward()
    assert STATS["graphs"] - graphs >= 2  # forward and backward
    torch.testing.assert_close(xs.grad.cpu(), gx, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ws.grad.cpu(), gw, rtol=1e-4, atol=1e-4)


def test_explain_reports_spills_and_unfused_ops():
    def wide(x):
        vals = [x * float(k + 1) for k in range(32)]  # too many live values for the SBUF budget
        out = vals[0]
        for v in vals[1:]:
            out = out + v.exp()
        return out.sum(0)  # a cross-partition reduction stays apart

    e = explain(wide, torch.randn(128, 1024))
    assert e.fused and e.fused[0].spilled and e.fused[0].spill_bytes > 0
    assert e.unfused[0].op == "sum" and "cross-partition" in e.unfused[0].reason
    assert e.unfused[0].bytes_saved_if_fused > 0
    assert "spills" in str(e) and "fusing it would save" in str(e)


def test_buffers_changed_in_place_cost_no_copies(executions):
    """BatchNorm's running statistics and batch counter, changed in place by training: the
    compiled graph updates them where they are (BatchNorm as its in-place variant, the counter
    written by the Program that computes it), so a compiled call runs no copy_ and no more
    executions than eager -- and explain's count is exactly what it runs."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).train()
    reference = copy.deepcopy(block)
    x = torch.randn(2, 3, 16, 16)
    e = explain(copy.deepcopy(block).to("sim"), x.to("sim"))
    assert e.input_writebacks == 0 and len(e.in_place) == 1  # the counter; the statistics in BatchNorm
    block = block.to("sim")
    compiled = torch.compile(block, backend="tilescope")
    xs = x.to("sim")
    for _ in range(2):
        out = compiled(xs)
        expected = reference(x)
    torch.sim.synchronize()
    executions.clear()
    compiled(xs)
    reference(x)
    torch.sim.synchronize()
    assert "aten::copy_" not in [r.op for r in executions]
    assert len(executions) == e.executions_per_call == 4  # counter, conv, batch norm, relu (as eager)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)
    for name, buf in reference.named_buffers():
        torch.testing.assert_close(dict(block.named_buffers())[name].cpu(), buf, rtol=1e-5, atol=1e-6)


def test_a_step_calling_backward_inside_runs_the_device_untraced():
    """``loss.backward()`` inside the compiled function is a graph break: autograd's ``ones_like``
    of the loss runs eagerly with Dynamo's frame hook on. The device's dispatch, lowering and
    simulator beneath it (dataclasses of numpy columns, generated ``__init__``s Dynamo cannot
    skip by file) must run untraced; Dynamo once failed there ("Expected np.nditer base")."""
    from torch._dynamo.convert_frame import input_codes

    from tilescope import lower, sim

    def step(x):
        loss = (x * 2).sum().reshape(1, 1, 1, 1, 1)  # a shape of its own: its ones_like is lowered afresh
        loss.backward()
        return loss

    for run in ("backend", "explain"):
        torch._dynamo.reset()
        lower.clear_cache()
        sim.clear_cache()
        x = torch.randn(8, 16, device="sim", requires_grad=True)
        if run == "backend":
            loss = torch.compile(step, backend="tilescope")(x)
            traced = {c().co_filename for c in input_codes.seen if c() is not None}
            assert not [f for f in traced if "tilescope" in f], traced
            assert loss.item() == pytest.approx(2 * x.detach().cpu().sum().item(), rel=1e-5)
        else:
            e = explain(step, x)
            assert e.graphs == 2 and e.fused
        torch.testing.assert_close(x.grad.cpu(), torch.full((8, 16), 2.0))


def test_explain_works_where_the_graph_holds_device_tensors():
    """HF GPT-2 starts its KV cache as ``torch.tensor([], device=x.device)`` and concatenates
    onto it: the graph holds a tensor on the device, and explain re-plans it beside the inputs."""
    def f(x):
        return torch.cat([torch.tensor([], dtype=x.dtype, device=x.device), x], -2) * 2

    x = torch.randn(2, 2, 4, 8, device="sim")
    e = explain(f, x)
    assert e.fused and any(u.op == "cat" for u in e.unfused)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, backend="tilescope")(x).cpu(), f(x.cpu()))


def test_programs_come_back_from_the_disk_cache_whole(tmp_path, monkeypatch, executions):
    """A second compile of the same graph reads its Programs from the disk cache: same hash,
    same instructions and modeled time, same values; a damaged file is rebuilt, not trusted."""
    from tilescope.compile._backend import _load_cached

    monkeypatch.setenv("TILESCOPE_CACHE_DIR", str(tmp_path))
    x, w = torch.randn(4, 96, 256), torch.randn(256)
    xs, ws = x.to("sim"), w.to("sim")

    def run():
        torch._dynamo.reset()
        executions.clear()
        out = torch.compile(rmsnorm, backend="tilescope")(xs, ws)
        torch.sim.synchronize()
        compiled = [r for r in executions if r.lowering == "compiled"]
        return out.cpu(), compiled

    built, read = STATS["programs_built"], STATS["programs_from_disk"]
    first, (cold,) = run()
    assert STATS["programs_built"] == built + 1 and STATS["programs_from_disk"] == read
    files = list(tmp_path.rglob("*.pkl"))
    assert len(files) == 1
    second, (warm,) = run()
    assert STATS["programs_from_disk"] == read + 1 and STATS["programs_built"] == built + 1
    torch.testing.assert_close(second, first)
    torch.testing.assert_close(first, rmsnorm(x, w), rtol=1e-4, atol=1e-4)
    assert warm.program.hash == cold.program.hash and warm.modeled_ns == cold.modeled_ns
    assert [i.key() for i in warm.program.instructions] == [i.key() for i in cold.program.instructions]
    assert warm.program.buffers == cold.program.buffers
    blob = files[0].read_bytes()
    files[0].write_bytes(blob[:-10] + bytes(10))  # a torn or damaged file
    assert _load_cached(files[0]) is None
    run()
    assert STATS["programs_built"] == built + 2


def test_transposed_and_periodic_inputs_cost_no_copies(executions):
    """RoPE on heads moved before the sequence: the groups read the transposed projection by its
    strides and the [T, hd] tables by their period -- no copy_ before them, values as CPU."""
    def rope(x, w, cos, sin):
        b, t, _ = x.shape
        q = (x @ w).view(b, t, 4, 16).transpose(1, 2)
        a, c = q.chunk(2, dim=-1)
        return q * cos + torch.cat([-c, a], dim=-1) * sin

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(2, 32, 64, generator=g), torch.randn(64, 64, generator=g),
            torch.randn(32, 16, generator=g), torch.randn(32, 16, generator=g)]
    f = torch.compile(rope, backend="tilescope")
    f(*[a.to("sim") for a in args])
    torch.sim.synchronize()
    executions.clear()
    got = f(*[a.to("sim") for a in args])
    torch.sim.synchronize()
    torch.testing.assert_close(got.cpu(), rope(*args), rtol=1e-4, atol=1e-4)
    ops = [r.op for r in executions if r.kind != "memcpy"]
    assert "aten::copy_" not in ops and sum(o.startswith("tilescope::fused") for o in ops) == 3, ops


@pytest.mark.parametrize("bias", [False, True])
def test_a_projection_with_its_log_softmax_keeps_the_plan_the_simulator_times_shorter(bias, monkeypatch):
    """The backend builds the projection + log-softmax three ways -- fused with the logits
    written once for the second pass, fused with the product made again per pass, and as a
    matmul then a row group -- and keeps the one the simulator times shortest: here the logits
    written once, with or without a bias (held whole on chip). The choice is counted, and
    explain shows it. Values as CPU."""
    from tilescope.compile._backend import CompiledGraph, _modeled_ns
    from tilescope.compile._graph import trace_aten

    g = torch.Generator().manual_seed(0)
    h, w, b = torch.randn(200, 96, generator=g), torch.randn(5000, 96, generator=g) * 0.05, torch.randn(5000, generator=g)
    args = (h, w, b) if bias else (h, w)
    fn = lambda h, w, *b: torch.log_softmax(torch.nn.functional.linear(h, w, *b), -1)  # noqa: E731
    before = dict(STATS)
    gm = trace_aten(fn, *args)
    compiled = CompiledGraph(gm, list(args), "ce")
    (steps,) = compiled._plans.values()
    (program,) = [st for st in steps if st.kind == "program"]
    assert [seg.kind for seg in program.segments] == ["matmul"] and program.stats.kept_values
    choice = gm.meta["tilescope_reduction_fusion"]
    assert choice["chosen"] == "keep" and set(choice["modeled_ns"]) == {"plain", "keep", "remake"}
    assert min(choice["modeled_ns"].values()) == choice["modeled_ns"]["keep"]
    assert STATS["reduction_fusions"] == before["reduction_fusions"] + 1
    # the choice is stored beside the Programs: compiled again, only the chosen plan is built
    import tilescope.compile._backend as backend

    built = []
    plan_and_build = backend._plan_and_build
    monkeypatch.setattr(backend, "_plan_and_build", lambda *a, **k: built.append(k) or plan_and_build(*a, **k))
    again = CompiledGraph(gm, list(args), "ce")
    assert built == [{"reductions": "keep"}] and gm.meta["tilescope_reduction_fusion"] == choice
    (program,) = [st for st in next(iter(again._plans.values())) if st.kind == "program"]
    assert [seg.kind for seg in program.segments] == ["matmul"] and program.stats.kept_values
    got = torch.compile(fn, backend="tilescope")(*(a.to("sim") for a in args))
    torch.testing.assert_close(got.cpu(), fn(*args), rtol=1e-4, atol=1e-4)
    assert all("modeled_ns" in st.program.meta for st in steps if st.kind == "program")
    assert _modeled_ns(steps, compiled.spec) > 0
    e = explain(fn, *args)
    assert [r["chosen"] for r in e.reduction_fusion] == ["keep"] and "chose  keep" in str(e)
    assert e.fused[0].kept and "once for its later passes" in str(e)
