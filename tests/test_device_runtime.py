"""The runtime: execution records, the two clocks, synchronize, numerics off the host."""

import os
import time
import warnings

import pytest
import torch

import tilescope.device as dev
from tilescope.device import _runtime
from tilescope.spec import preset

dev.register()


@pytest.fixture
def virtual():
    old = dev.settings()
    dev.configure(clock="virtual")
    yield
    dev.configure(clock=old.clock, preset=old.preset, numerics=old.numerics, blocking=old.blocking)


def record(fn):
    recs = []
    dev.subscribe(recs.append)
    try:
        out = fn()
        torch.sim.synchronize()
    finally:
        dev.unsubscribe(recs.append)
    return recs, out


def test_execution_records_carry_what_profiles_need(virtual):
    x = torch.randn(256, 256, device="sim")
    recs, _ = record(lambda: torch.relu(x @ x + 1).sum().item())
    kinds = [(r.op, r.kind) for r in recs]
    assert ("aten::mm", "kernel") in kinds and ("memcpy DtoH", "memcpy") in kinds
    flows = [r.flow_id for r in recs]
    assert flows == sorted(flows) and len(set(flows)) == len(flows)
    p = preset(None)
    for r in recs:
        assert r.program is not None and r.program_hash == r.program.hash
        assert r.core == 0 and r.stream == 0 and r.clock == "virtual"
        assert r.queued_ns == pytest.approx(r.host_submit_ns + p.runtime_exec_us * 1000)
        assert r.device_start_ns >= r.queued_ns
        assert r.device_end_ns == pytest.approx(r.device_start_ns + r.modeled_ns) and r.modeled_ns > 0
    for a, b in zip(recs, recs[1:]):  # one core executes in order
        assert b.device_start_ns >= a.device_end_ns
    mm = next(r for r in recs if r.op == "aten::mm")
    assert mm.lowering == "matmul" and mm.program.summary_counts().get("matmul", 0) > 0


def test_virtual_clock_is_deterministic_and_models_dispatch_cost(virtual):
    def run():
        _runtime.reset_clocks()
        x = torch.ones(128, 64, device="sim")
        recs, _ = record(lambda: ((x * 2).exp() + x).sum(1))
        return [(r.op, r.host_submit_ns, r.device_start_ns, r.device_end_ns) for r in recs]

    run()  # first calls of each signature are synchronous: compare steady-state runs
    a, b = run(), run()
    assert a == b
    step = preset(None).host_dispatch_us * 1000
    submits = [s for _, s, _, _ in a]
    assert all(abs((y - x) - step) < 1e-6 for x, y in zip(submits, submits[1:]))
    assert _runtime.now_ns() >= a[-1][3]  # synchronize moved the host clock to the device's end


def test_wall_clock_synchronize_waits_for_modeled_time():
    slow = preset("trn1").replace(runtime_exec_us=60_000.0)  # 60 ms per execution, assumed
    old = dev.settings()
    dev.configure(preset=slow, clock="wall")
    try:
        x = torch.ones(8, device="sim")
        y = x + 1  # first call of this signature: synchronous
        torch.sim.synchronize()
        t0 = time.perf_counter()
        y = x + 1
        t1 = time.perf_counter()
        torch.sim.synchronize()
        t2 = time.perf_counter()
        assert t1 - t0 < 0.02  # dispatch returns at once
        assert t2 - t0 >= 0.055  # synchronize waits for the modeled execution
        assert y.sum().item() == 16.0
    finally:
        dev.configure(preset=old.preset, clock=old.clock)


def test_numerics_off_skips_values_but_keeps_time(virtual):
    dev.configure(numerics=False)
    try:
        x = torch.zeros(64, device="sim")
        recs, _ = record(lambda: x + 1)
        assert [r.op for r in recs] == ["aten::add.Tensor"] and recs[0].modeled_ns > 0
    finally:
        dev.configure(numerics=True)


def test_numerics_run_on_the_worker_not_the_host(monkeypatch, sim_fast_dispatch):
    """Each execution's numerics are computed by the device's worker thread: the launching
    thread only queues them (checked by the thread that runs each queued item, not by timing).
    Through the Python handler (``fast_dispatch=False``) they are Python items; repeat calls on
    the native fast path queue native items."""
    import threading

    from tilescope.device import _worker

    x = torch.randn(2048, 2048, device="sim")
    y = x.exp()  # first call: synchronous
    torch.sim.synchronize()
    native = _worker.stats()["native_items"]
    for _ in range(4):
        y = x.exp()
    torch.sim.synchronize()
    assert _worker.stats()["native_items"] >= native + 2
    torch.testing.assert_close(y.cpu(), x.cpu().exp())
    old = dev.settings().fast_dispatch
    dev.configure(fast_dispatch=False)
    ran_on, put = [], _worker.put

    def put_tagged(work):
        fn, args, kwargs, label = work

        def run(*a, **k):
            ran_on.append(threading.get_ident())
            return fn(*a, **k)

        put((run, args, kwargs, label))

    monkeypatch.setattr(_worker, "put", put_tagged)
    try:
        for _ in range(3):
            y = x.exp()
        torch.sim.synchronize()
    finally:
        dev.configure(fast_dispatch=old)
    assert len(ran_on) == 3 and threading.get_ident() not in ran_on and len(set(ran_on)) == 1
    torch.testing.assert_close(y.cpu(), x.cpu().exp())


def test_worker_errors_surface_at_the_next_synchronisation():
    x = torch.randn(4, device="sim")
    idx = torch.tensor([0, 1], device="sim")
    x.index_select(0, idx).sum().item()  # the signature's first call (valid indices) is synchronous
    bad = torch.tensor([0, 10], device="sim")
    y = x.index_select(0, bad)  # same signature: asynchronous; the bad index fails on the worker
    with pytest.raises(dev.DeviceExecutionError, match="aten::index_select.*out of range"):
        torch.sim.synchronize()
    del y
    dev.configure(blocking=True)
    try:
        with pytest.raises(dev.DeviceExecutionError, match="out of range"):
            x.index_select(0, bad)
    finally:
        dev.configure(blocking=False)
    assert x.sum().item() == pytest.approx(float(x.cpu().sum()))  # the device keeps working


def test_launch_runs_a_program_as_one_execution():
    from tilescope.program import TileBuilder

    b = TileBuilder("scale_rows")
    xi, yo = b.input("x", (128, 32), "float32"), b.output("y", (128, 32), "float32")
    t = b.sbuf((128, 32), "float32")
    b.dma_copy(t, xi)
    b.activation(t, t, "exp")
    b.dma_copy(yo, t)
    prog = b.build()
    x = torch.randn(128, 32, device="sim")
    y = torch.empty(128, 32, device="sim")
    rec = dev.launch("demo::exp", prog, [x], [y])
    assert rec.op == "demo::exp" and rec.program_hash == prog.hash and rec.lowering == "custom"
    torch.testing.assert_close(y.cpu(), x.cpu().exp())
    z = torch.empty(128, 32, device="sim")
    dev.launch("demo::double", prog, [x], [z], lambda ins, outs: outs[0].copy_(ins[0] * 2))
    torch.testing.assert_close(z.cpu(), x.cpu() * 2)
    with pytest.raises(RuntimeError, match="must be on the sim device"):
        dev.launch("demo::exp", prog, [x.cpu()], [y])


def test_tile_kernels_run_on_device_tensors():
    import tilescope
    import tilescope.lang as tl
    from tilescope.lower.kernels import rms_norm_kernel

    @tilescope.kernel
    def scale_into(x, out):
        tl.store(out, tl.load(x) * 3.0)

    x = torch.randn(128, 16, device="sim")
    out = torch.empty(128, 16, device="sim")
    with dev.recording() as recs:
        assert scale_into(x, out) is None
    assert [(r.op, r.lowering) for r in recs] == [("kernel::scale_into", "tile_kernel")]
    torch.testing.assert_close(out.cpu(), x.cpu() * 3)
    w = torch.randn(16, device="sim")
    y, rstd = rms_norm_kernel(x, w, 1e-6)
    torch.testing.assert_close(y.cpu(), torch.rms_norm(x.cpu(), (16,), w.cpu(), 1e-6), rtol=1e-5, atol=1e-5)
    assert rstd.shape == (128, 1) and rstd.device.type == "sim"
    # kernels have no autograd formula: a tensor that requires grad gets a warning at the caller's line
    xg = x.detach().requires_grad_()
    with pytest.warns(UserWarning, match="tile kernel 'scale_into' got a tensor that requires grad") as seen:
        scale_into(xg, out)
    assert seen[0].filename == __file__
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        scale_into(xg, out)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_asks_for_its_own_thread_id():
    """The device's profiler asks for the launching thread's system id once per thread and
    keeps it; a forked child's thread has another one, so the child asks again (its profiles'
    lanes are its own)."""
    import threading

    from torch.profiler import ProfilerActivity

    def launching_threads() -> set[int]:
        kept = _runtime.keep_recorded(100)
        try:
            with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
                torch.ones(4, device="sim").add_(1)
                torch.sim.synchronize()
        finally:
            _runtime.keep_recorded(kept)
        taken = _runtime.take_device_activities(prof.profiler.kineto_results.trace_start_ns())
        return {native for _, native in taken.records.values()}

    assert launching_threads() == {threading.get_native_id()}
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if launching_threads() == {threading.get_native_id()} else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_the_device_profiler_lets_go_of_the_records_nobody_takes():
    """The device's profiler keeps a strong reference to each recorded execution's Program until
    the export takes the record; the sessions nobody exported are let go (the latest 8 are kept),
    their references released with the GIL held -- nothing leaks, nothing is released twice."""
    import sys

    from torch.profiler import ProfilerActivity

    x = torch.ones(64, device="sim")
    with _runtime.recording() as execs:
        x.add_(1)
        torch.sim.synchronize()
    program = execs[0].program
    unreferenced = sys.getrefcount(program)
    kept = _runtime.keep_recorded(100)
    starts = []
    try:
        for _ in range(10):
            with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
                x.add_(1)
                torch.sim.synchronize()
            starts.append(prof.profiler.kineto_results.trace_start_ns())
    finally:
        _runtime.keep_recorded(kept)
    _runtime.take_device_activities(0)  # no such session; releases what was let go meanwhile
    assert sys.getrefcount(program) == unreferenced + 8  # the 8 latest sessions' records
    taken = [_runtime.take_device_activities(t0) for t0 in starts[2:]]  # each finds its own (nearest start)
    assert [len(t.records) for t in taken] == [1] * 8
    assert all(rec.program is program for t in taken for rec, _ in t.records.values())
    del taken
    assert sys.getrefcount(program) == unreferenced


def test_configure_worker_threads_reaches_the_worker_thread():
    """``configure(worker_threads=N)`` sets the OpenMP threads of the worker's own CPU kernels
    (a per-thread setting: the host's stay as they were)."""
    from tilescope.device import _worker

    def on_worker() -> int:
        seen = []
        _worker.put((lambda: seen.append(torch.get_num_threads()), (), {}, "probe"))
        _worker.wait()
        return seen[0]

    old, host = dev.settings().worker_threads, torch.get_num_threads()
    (torch.ones(2, device="sim") + 1).cpu()  # the worker is running
    try:
        for n in (1, 3):
            assert dev.configure(worker_threads=n).worker_threads == n
            assert on_worker() == n
        assert torch.get_num_threads() == host
    finally:
        dev.configure(worker_threads=old)
    assert on_worker() == old
