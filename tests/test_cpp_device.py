"""C++ operators on the simulated device: one GpSimd execution per call, also under torch.compile."""

from __future__ import annotations

import re

import pytest
import torch

import tilescope.device as dev
from test_cpp_ops import GIOU, HERE, KERNELS, BUILD  # noqa: F401  (one shared build)
from giou_torch import giou_torch, make_boxes

import tilescope.cpp as cpp
from tilescope.cpp import CoverageError


@pytest.fixture(scope="module")
def lib():
    dev.register()
    lib = cpp.load("ts_test_ops", [KERNELS, GIOU / "giou.cpp"], [HERE / "ts_test_shapes.cpp", GIOU / "giou_shape.cpp"],
                   build_directory=BUILD, multicore=True)
    yield lib
    lib.register()


@pytest.fixture
def executions():
    old = dev.settings().clock
    dev.configure(clock="virtual")
    got = []
    dev.subscribe(got.append)
    yield got
    dev.unsubscribe(got.append)
    dev.configure(clock=old)


def _sim(*ts):
    out = tuple(t.to("sim") for t in ts)
    torch.sim.synchronize()
    return out


def test_giou_on_sim_is_one_gpsimd_execution_per_call(lib, executions):
    b1, b2 = make_boxes(256, 64, seed=7)
    s1, s2 = _sim(b1, b2)
    executions.clear()
    outs = [torch.ops.giou_ops.giou(s1, s2, 0.0) for _ in range(3)]
    torch.sim.synchronize()
    assert [(e.op, e.lowering) for e in executions] == [("giou_ops::giou", "cpp")] * 3
    assert len({e.program_hash for e in executions}) == 1  # the first call's Program is reused
    ref = giou_torch(b1, b2, 0.0)
    for out in outs:
        assert out.device.type == "sim"
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-6, atol=1e-6)
    prog = executions[0].program
    assert prog.summary_counts()["gpsimd_call"] == 1 and prog.meta["estimated"]
    assert executions[0].nbytes == 2 * b1.numel() * 4 + ref.numel() * 4  # accessor traffic, modeled
    est = lib["giou"].estimate(b1, b2, 0.0, preset=dev.settings().preset)
    assert est.program.hash == prog.hash and executions[0].modeled_ns == pytest.approx(est.total_ns)


def test_op_inside_torch_compile_is_one_execution(lib, executions):
    b1, b2 = make_boxes(64, 32, seed=8)
    s1, s2 = _sim(b1, b2)

    def f(a, b):
        return torch.ops.giou_ops.giou(a, b, 0.0)

    compiled = torch.compile(f, backend="tilescope")
    out = compiled(s1, s2)
    torch.sim.synchronize()
    executions.clear()
    out = compiled(s1, s2)
    torch.sim.synchronize()
    assert [(e.op, e.lowering) for e in executions] == [("giou_ops::giou", "cpp")]
    torch.testing.assert_close(out.cpu(), giou_torch(b1, b2, 0.0), rtol=1e-6, atol=1e-6)


def test_coverage_error_surfaces_at_the_first_call_on_sim(lib, executions):
    (x,) = _sim(torch.randn(1024, 256))
    with pytest.raises(CoverageError, match="`partition\\*cpu_id \\+ i\\*row_size`"):
        torch.ops.ts_test.scale_rows_bad_offset(x, 2.0)


def test_value_dependent_transfers_warn_that_the_model_used_the_first_pattern(lib, executions):
    a = torch.arange(64.0)
    a[0] = 8.0
    b = a.clone()
    b[0] = 16.0
    sa, sb = _sim(a, b)
    torch.testing.assert_close(torch.ops.ts_test.chunked_copy(sa).cpu(), a)
    with pytest.warns(RuntimeWarning, match="transfers differ from those of the first call"):
        out = torch.ops.ts_test.chunked_copy(sb)  # runs on the device worker: warns by synchronize
        torch.sim.synchronize()
    torch.testing.assert_close(out.cpu(), b)


def test_mixed_devices_are_refused(lib):
    b1, b2 = make_boxes(4, 4, seed=9)
    (s1,) = _sim(b1)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ops.giou_ops.giou(s1, b2, 0.0)


def test_the_giou_study_runs_and_reports_every_table(lib, capsys, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("giou_compare", GIOU / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    assert compare.main(["--batch", "64", "--boxes", "16", "--iters", "1", "--profile-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "all three agree with the CPU reference" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith(("torch (eager)", "tile kernel", "C++"))}
    assert set(rows) == {"torch", "tile", "C++"}
    assert "without torch.sim.synchronize()" in text and "3. profiles" in text
    # what the no-synchronize column is: host dispatch per op and per call, not a ranking claim
    assert re.search(r"measures host dispatch \(here [\d,]+ us per torch op over 30 ops; [\d,]+ us per tile kernel "
                     r"call, [\d,]+ us per C\+\+ \(8 cores\) call\)", text), text
    assert "misrank" not in compare.__doc__ and "dispatch times too" in compare.__doc__
    assert "us modeled, the same as its device execution" in text
    assert len(list(tmp_path.glob("*/*/*/manifest.json"))) == 3


def test_a_leaking_kernel_warns_once_per_call_on_sim_too(lib):
    """The first call on ``sim`` also runs the counting build (for the modeled time); only the
    user's call warns about the leak."""
    import warnings

    (x,) = _sim(torch.randn(10))
    for _ in range(2):  # the first call (counting run too) and a later one
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = torch.ops.ts_test.copy_leaky(x)
            torch.sim.synchronize()
        leaks = [str(w.message) for w in seen if issubclass(w.category, cpp.TcmLeakWarning)]
        assert len(leaks) == 1, leaks
        assert torch.equal(out.cpu(), x.cpu())
