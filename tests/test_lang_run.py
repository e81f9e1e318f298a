"""Running tile kernels: simulate() results, write-back, caching, profiles, bench, program_for."""

import json

import numpy as np
import pytest

import tilescope
import tilescope.lang as tl
from tilescope.bench import BenchResult, bench
from tilescope.errors import KernelError


@tilescope.kernel
def scale_into(x, out, factor=2.0):
    for i in tl.affine_range(x.shape[0] // 128):
        rows = slice(i * 128, (i + 1) * 128)
        tl.store(out[rows, :], tl.load(x[rows, :]) * factor)


@tilescope.kernel
def two_outputs(x):
    s = tl.ndarray((x.shape[0], 1), x.dtype, buffer=tl.hbm, name="row_sum")
    m = tl.ndarray((x.shape[0], 1), x.dtype, buffer=tl.hbm, name="row_max")
    t = tl.load(x)
    tl.store(s, tl.sum(t, axis=1, keepdims=True))
    tl.store(m, tl.max(t, axis=1, keepdims=True))
    return {"sum": s, "max": m}


def test_store_into_an_argument_writes_the_callers_array_in_place():
    x = np.arange(256 * 8, dtype=np.float32).reshape(256, 8)
    out = np.zeros_like(x)
    r = tilescope.simulate(scale_into, x, out)
    np.testing.assert_array_equal(out, 2 * x)
    assert r.value is None and np.shares_memory(r.outputs["out"], out)
    assert r.traced.outputs[0].arg == 1


def test_write_back_into_a_non_contiguous_array():
    base = np.zeros((256, 16), np.float32)
    out = base[:, ::2]  # a strided view: written back after the run
    x = np.ones((256, 8), np.float32)
    tilescope.simulate(scale_into, x, out)
    assert (base[:, ::2] == 2).all() and (base[:, 1::2] == 0).all()


def test_returned_tensors_keep_the_return_structure():
    x = np.random.default_rng(0).standard_normal((128, 32), dtype=np.float32)
    r = tilescope.simulate(two_outputs, x)
    assert set(r.value) == {"sum", "max"}
    np.testing.assert_allclose(r.value["sum"], x.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(r.value["max"], x.max(axis=1, keepdims=True))
    assert set(r.outputs) == {"row_sum", "row_max"}
    assert {b.role for n, b in r.program.buffers.items() if n.startswith("row_")} == {"output"}


def test_warm_calls_do_not_trace_again_but_new_signatures_do():
    k = tilescope.kernel(scale_into.fn)
    x, out = np.ones((256, 8), np.float32), np.empty((256, 8), np.float32)
    r1 = tilescope.simulate(k, x, out)
    r2 = tilescope.simulate(k, x, out)
    assert k.trace_count == 1 and r2.program is r1.program and r2.timeline is r1.timeline
    tilescope.simulate(k, x, out, factor=3.0)  # a constant is part of the signature
    tilescope.simulate(k, np.ones((128, 8), np.float32), np.empty((128, 8), np.float32))
    assert k.trace_count == 3
    assert (out == 3).all()


def test_result_is_labelled_modeled_and_summarised():
    r = tilescope.simulate(scale_into, np.ones((256, 512), np.float32), np.empty((256, 512), np.float32))
    assert r.summary.modeled and r.summary.instructions == len(r.program) == 6
    assert set(r.summary.engine_busy_ns) == {"VectorE", "DMA"} and r.summary.dma_bytes == 4 * 256 * 512 * 2
    assert "modeled" in repr(r) and "out[256, 512] float32" in repr(r)
    assert len(r.timeline) == 6


def test_numerics_false_takes_shapes_only():
    spec = tl.TensorSpec((4096, 512), "float32")
    r = tilescope.simulate(scale_into, spec, spec, numerics=False)
    assert r.value is None and r.outputs == {} and r.summary.total_ns > 0


def test_profile_dir_writes_an_executable_and_instruction_trace_pair(tmp_path):
    from tilescope.profiler import read_profile

    x, out = np.ones((256, 64), np.float32), np.empty((256, 64), np.float32)
    r = tilescope.simulate(scale_into, x, out, profile_dir=tmp_path)
    assert r.profile_dir is not None and (r.profile_dir / "manifest.json").exists()
    h = r.program.hash
    exe = json.loads((r.profile_dir / "executables" / f"exec_{h}.json").read_text())
    trace = json.loads((r.profile_dir / "itraces" / f"exec_{h}.0.itrace.json").read_text())
    assert exe["hash"] == h == trace["program_hash"] and trace["modeled"] is True
    assert exe["meta"]["kernel"] == "scale_into" and any("test_lang_run.py" in f for f in exe["meta"]["sources"])
    prof = read_profile(r.profile_dir)
    assert prof is not None


def test_program_for_is_the_device_integration_entry_point():
    class FakeDtype:  # prints like torch.float32
        def __str__(self):
            return "torch.float32"

    class FakeTensor:  # anything with .shape and .dtype, like a torch tensor
        def __init__(self, shape):
            self.shape, self.dtype = shape, FakeDtype()

    t = scale_into.program_for(FakeTensor((256, 8)), FakeTensor((256, 8)))
    assert t.inputs == ("x", "out") and [o.name for o in t.outputs] == ["out"] and t.outputs[0].arg == 1
    assert scale_into.program_for(tl.TensorSpec((256, 8), "float32"), tl.TensorSpec((256, 8), "float32")) is t
    x, out = np.ones((256, 8), np.float32), np.zeros((256, 8), np.float32)
    result = t.run([x, out])
    assert (out == 2).all() and np.shares_memory(result["out"], out)


def test_call_handlers_let_other_argument_kinds_run_a_kernel():
    from tilescope.lang._kernel import _CALL_HANDLERS, register_call_handler

    def handler(kernel, args, kwargs):
        if args and isinstance(args[0], str):
            return f"ran {kernel.name} on {args[0]}"
        return NotImplemented

    register_call_handler(handler)
    try:
        assert scale_into("device tensors") == "ran scale_into on device tensors"
    finally:
        _CALL_HANDLERS.remove(handler)


def test_a_kernel_called_from_a_kernel_is_traced_inline():
    @tilescope.kernel
    def add_one(t):
        return t + 1.0

    @tilescope.kernel
    def outer(x, out):
        tl.store(out, add_one(add_one(tl.load(x))))

    x, out = np.zeros((128, 4), np.float32), np.empty((128, 4), np.float32)
    tilescope.simulate(outer, x, out)
    assert (out == 2).all()


def test_simulate_refuses_plain_functions_and_double_grids():
    with pytest.raises(KernelError, match="Decorate it with @tilescope.kernel"):
        tilescope.simulate(lambda x: x, np.zeros(4, np.float32))
    with pytest.raises(KernelError, match="already has a launch grid"):
        tilescope.simulate(scale_into[2], np.zeros((128, 4), np.float32), np.zeros((128, 4), np.float32), grid=2)


def test_bench_reports_modeled_device_percentiles_and_host_time():
    x, out = np.ones((256, 64), np.float32), np.empty((256, 64), np.float32)
    r = bench(scale_into, x, out, warmup=1, iters=4)
    assert isinstance(r, BenchResult) and r.backend == "sim" and r.device_modeled and r.iters == 4
    assert len(r.host_us) == 4 and (r.host_us > 0).all()
    modeled = tilescope.simulate(scale_into, x, out).summary.total_us
    assert r.p(0) == r.p(100) == pytest.approx(modeled)
    q = r.quantiles
    assert set(q) == {"host", "device"} and set(q["device"]) >= {"p0", "p50", "p99", "p100"}
    text = str(r)
    assert "device us (modeled)" in text and "p100" in text and "runtime's launch cost" in text
    with pytest.raises(TypeError, match="no backend"):
        bench(42)  # not callable


def test_import_tilescope_stays_light():
    import subprocess
    import sys

    code = "import sys, tilescope; print('tilescope.lang' in sys.modules, 'numpy' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.split() == ["False", "False"]


def test_a_derived_preset_is_traced_and_scheduled_with_its_own_numbers():
    from tilescope.spec import preset

    slow_dma = preset("trn1").replace(name="trn1-slowdma", dma={"bytes_per_ns_per_engine": 1.0})
    x, out = np.ones((256, 4096), np.float32), np.empty((256, 4096), np.float32)
    base = tilescope.simulate(scale_into, x, out).summary
    slow = tilescope.simulate(scale_into, x, out, preset=slow_dma).summary
    assert slow.preset == "trn1-slowdma" and slow.total_ns > 5 * base.total_ns
    assert (out == 2).all()
