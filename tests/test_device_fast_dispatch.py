"""The native dispatch fast path (``_csrc/dispatch.cpp``): repeat calls of a signature never
enter Python, and give exactly what the Python handler gives -- values, aliasing, modeled
times, errors -- and it stands aside whenever Python must see each execution."""

import pytest
import torch

import tilescope.device as dev
from tilescope.device import _dispatch, _worker

dev.register()


@pytest.fixture
def fast_path(sim_fast_dispatch):
    yield


def _fast_calls() -> int:
    return _dispatch.stats()["fast_calls"]


def _repeat(fn, times=4):
    """Call ``fn`` ``times`` times; the results of the last call (the first two teach the path)."""
    for _ in range(times - 1):
        fn()
    return fn()


OPS = {
    "add": lambda x, y, w: x + y,
    "mul by a Python scalar": lambda x, y, w: x * 1.5,
    "relu": lambda x, y, w: torch.relu(x),
    "sum over a dim": lambda x, y, w: x.sum(1),
    "matmul": lambda x, y, w: x @ w,
    "cat (a tensor list)": lambda x, y, w: torch.cat([x, y, x], 1),
    "max over a dim (two results)": lambda x, y, w: torch.max(x, 1),
    "where (three tensors)": lambda x, y, w: torch.where(x > 0, x, y),
    "softplus (numbers by value)": lambda x, y, w: torch.nn.functional.softplus(x, beta=2.0, threshold=10.0),
    "a transposed view in": lambda x, y, w: x.t() * y,
    "to(dtype)": lambda x, y, w: x.to(torch.float16),
}


@pytest.mark.parametrize("name", list(OPS))
def test_repeat_calls_take_the_fast_path_and_match_cpu(fast_path, name):
    torch.manual_seed(0)
    cpu = [torch.randn(8, 8) for _ in range(3)]
    sim = [t.to("sim") for t in cpu]
    fn = OPS[name]
    before, items = _fast_calls(), _worker.stats()["native_items"]
    got = _repeat(lambda: fn(*sim))
    torch.sim.synchronize()
    assert _fast_calls() > before, "repeat calls did not take the fast path"
    assert _worker.stats()["native_items"] > items, "their numerics did not run as native worker items"
    want = fn(*cpu)
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        assert g.device.type == "sim" and g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
        torch.testing.assert_close(g.cpu(), w)


def test_in_place_ops_return_their_argument_and_write_through_views(fast_path):
    base = torch.zeros(4, 6, device="sim")
    x = torch.ones(2, 3, device="sim")
    before = _fast_calls()
    for _ in range(4):
        out = base[1:3, ::2].add_(x, alpha=0.5)
    assert _fast_calls() > before
    assert out._base is base
    ref = torch.zeros(4, 6)
    ref[1:3, ::2] += 2.0
    torch.testing.assert_close(base.cpu(), ref)
    ts = [torch.zeros(3, device="sim") for _ in range(2)]
    for _ in range(3):
        torch._foreach_add_(ts, 1.0)  # a list in place, no results
    torch.testing.assert_close(torch.stack(ts).cpu(), torch.full((2, 3), 3.0))


def test_a_host_scalar_is_read_at_the_call(fast_path):
    """A 0-dim host tensor is an operand: its value at the call, not when the worker gets to it."""
    x = torch.ones(4, device="sim")
    s = torch.tensor(2.0)
    outs = []
    for k in range(5):
        s.fill_(float(k))
        outs.append(x * s)
    torch.testing.assert_close(torch.stack(outs).cpu(), torch.arange(5.0)[:, None].expand(5, 4))


def test_same_modeled_times_and_executions_as_the_python_handler(sim_virtual, fast_path):
    x = torch.randn(32, 32, device="sim")

    def run(fast):
        dev.configure(fast_dispatch=fast)
        torch.sim.synchronize()
        dev.reset_clocks()
        before = dev.now_ns(), torch.sim.synchronize
        counts = _dispatch.stats()["fast_calls"]
        for _ in range(20):
            y = (x @ x).relu_().sum(0) * 2.0
        torch.sim.synchronize()
        return dev.now_ns() - before[0], _dispatch.stats()["fast_calls"] - counts, y.cpu()

    old = dev.settings().fast_dispatch
    try:
        run(True)  # teach every signature
        fast_ns, fast_calls, fast_y = run(True)
        slow_ns, slow_calls, slow_y = run(False)
    finally:
        dev.configure(fast_dispatch=old)
    assert fast_calls >= 80 and slow_calls == 0
    assert fast_ns == slow_ns  # the virtual clock: host dispatch and device time, modeled alike
    torch.testing.assert_close(fast_y, slow_y)


def test_listeners_see_every_execution(fast_path):
    x = torch.randn(16, device="sim")
    _repeat(lambda: x + 1)
    with dev.recording() as execs:
        before = _fast_calls()
        for _ in range(5):
            x + 1
        torch.sim.synchronize()
    assert len([e for e in execs if e.op == "aten::add.Tensor"]) == 5
    assert _fast_calls() == before  # a listener sends every call through Python
    before = _fast_calls()
    _repeat(lambda: x + 1, times=2)
    assert _fast_calls() > before  # and back once it unsubscribed


def test_the_profiler_records_every_execution(fast_path):
    x = torch.randn(16, device="sim")
    _repeat(lambda: x * 3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.PrivateUse1]) as prof:
        for _ in range(4):
            x * 3
        torch.sim.synchronize()
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["aten::mul"].count == 4
    assert rows["aten::mul"].device_time_total > 0


def test_errors_on_the_worker_surface_at_the_next_wait(fast_path):
    x = torch.randn(4, device="sim")
    good = torch.tensor([0, 1], device="sim")
    _repeat(lambda: x.index_select(0, good))
    torch.sim.synchronize()
    before = _fast_calls()
    bad = torch.tensor([0, 10], device="sim")
    y = x.index_select(0, bad)  # a taught signature: the fast path; the worker's CPU kernel fails
    assert _fast_calls() == before + 1
    with pytest.raises(dev.DeviceExecutionError, match="aten::index_select.*out of range") as info:
        torch.sim.synchronize()
    assert isinstance(info.value.__cause__, IndexError)  # PyTorch's own exception type
    del y
    torch.sim.synchronize()  # raised once


def test_tensors_on_two_cores_are_refused_as_pytorch_does(fast_path):
    if torch.sim.device_count() < 2:
        pytest.skip("one core")
    a, b = torch.ones(3, device="sim:0"), torch.ones(3, device="sim:1")
    _repeat(lambda: a + a)
    with pytest.raises(RuntimeError, match="same device"):
        a + b


def test_out_overloads_that_resize_fall_back_to_compute_and_copy(fast_path):
    """Ops are computed straight into their outputs through their out= overload; one whose out=
    form resizes its output on the way (CPU's mse_loss.out does) is computed and copied instead,
    with the same values -- never through a view its kernel resized."""
    a = torch.randn(8, 4, device="sim", requires_grad=True)
    b = torch.randn(8, 4, device="sim")
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(a, b)
        loss.backward()
        losses.append(loss.detach())
    torch.sim.synchronize()
    ref = torch.nn.functional.mse_loss(a.detach().cpu(), b.cpu())
    torch.testing.assert_close(torch.stack(losses).cpu(), ref.expand(5))
    torch.testing.assert_close(a.grad.cpu(), 5 * 2 * (a.detach().cpu() - b.cpu()) / a.numel())
    x = torch.randn(6, 5, device="sim")
    for _ in range(4):
        vals = torch.kthvalue(x, 2, 1)
    torch.testing.assert_close(vals.values.cpu(), torch.kthvalue(x.cpu(), 2, 1).values)


@pytest.mark.parametrize("fast", [True, False])
def test_the_default_dtype_is_part_of_the_signature(fast_path, fast):
    """An integer tensor times a Python float takes the default dtype: a signature learned under
    one default must not give its dtype under another (either path)."""
    old = dev.settings().fast_dispatch
    dev.configure(fast_dispatch=fast)
    x = torch.arange(4, device="sim")
    try:
        _repeat(lambda: x * 1.5)
        torch.set_default_dtype(torch.float64)
        got = _repeat(lambda: x * 1.5)
    finally:
        torch.set_default_dtype(torch.float32)
        dev.configure(fast_dispatch=old)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got.cpu(), torch.arange(4, dtype=torch.float64) * 1.5)


def test_memory_of_finished_work_is_free_without_a_synchronize(fast_path):
    """The worker hands the native items it ran back to the host to release; what they held is
    free by the time memory statistics are read, without a synchronize."""
    import time

    x = torch.randn(256, 256, device="sim")
    _repeat(lambda: x + 1)
    torch.sim.synchronize()
    base = torch.sim.memory_allocated()
    before = _fast_calls()
    for _ in range(8):
        x + 1  # each result dropped at once: only the queued work keeps it alive
    assert _fast_calls() >= before + 8
    deadline = time.monotonic() + 30
    while _worker.stats()["pending"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert torch.sim.memory_allocated() == base
