"""GpSimd C++ operators: numerics vs torch, multicore coverage, every check's message, the model.

One library holds every test operator and the GIoU example; it is built once into
``build/cpp-tests`` and reused across runs (an unchanged load compiles nothing).
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import tilescope.cpp as cpp
from tilescope.cpp import CompileError, CostModel, CoverageError, CppKernelError
from tilescope.spec import preset

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent / "cpp"
GIOU = ROOT / "examples" / "giou"
BUILD = ROOT / "build" / "cpp-tests"
sys.path.insert(0, str(GIOU))
from giou_torch import giou_torch, make_boxes  # noqa: E402


def _line(path: Path, needle: str) -> int:
    for k, text in enumerate(path.read_text().splitlines(), start=1):
        if needle in text:
            return k
    raise AssertionError(f"{needle!r} not in {path}")


KERNELS = HERE / "ts_test_kernels.cpp"


@pytest.fixture(scope="module")
def lib():
    lib = cpp.load("ts_test_ops", [KERNELS, GIOU / "giou.cpp"], [HERE / "ts_test_shapes.cpp", GIOU / "giou_shape.cpp"],
                   build_directory=BUILD, multicore=True)
    yield lib
    lib.register()


# ---- numerics -----------------------------------------------------------------------------

def test_giou_matches_torch_on_the_study_shape(lib):
    b1, b2 = make_boxes(1024, 256, seed=0)
    out = torch.ops.giou_ops.giou(b1, b2, 1e-7)
    ref = giou_torch(b1, b2, 1e-7)
    assert out.shape == (1024, 256) and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("shape", [(7, 13), (3,), (1, 1), (9, 1, 5)])
def test_giou_odd_shapes(lib, shape):
    b1, b2 = make_boxes(*(shape if len(shape) == 2 else (1, int(np.prod(shape)))), seed=3)
    b1, b2 = b1.reshape(*shape, 4), b2.reshape(*shape, 4)
    torch.testing.assert_close(torch.ops.giou_ops.giou(b1, b2, 1e-7), giou_torch(b1, b2), rtol=1e-6, atol=1e-6)


def test_shape_function_rejects_bad_arguments_with_its_message(lib):
    with pytest.raises(cpp.CppError, match=r"giou_shape.cpp:\d+: boxes1 and boxes2 must have the same shape"):
        torch.ops.giou_ops.giou(torch.zeros(4, 4), torch.zeros(5, 4), 1e-7)


def test_scalar_arguments_of_every_kind(lib):
    x = torch.randn(1000)
    torch.testing.assert_close(torch.ops.ts_test.axpb(x, 0.5, 3, True), x * 0.5 + 4)
    torch.testing.assert_close(torch.ops.ts_test.axpb(x, -2.0, -1, False), x * -2.0 - 1)


def test_half_and_bfloat16_conversions_match_torch(lib):
    x = torch.cat([torch.randn(3000) * 10, torch.randn(1000) * 1e-6, torch.tensor(
        [0.0, -0.0, 65504.0, 65520.0, 1e9, -1e9, 6e-8, 3e-8, 2.9802322e-08, float("inf"), float("-inf")])])
    for bf16, dt in ((False, torch.float16), (True, torch.bfloat16)):
        bits = torch.ops.ts_test.to_half_bits(x, bf16)
        assert torch.equal(bits, x.to(dt).view(torch.int16)), dt
        back = torch.ops.ts_test.from_half_bits(bits, bf16)
        assert torch.equal(back, x.to(dt).float()), dt


# ---- multicore coverage -------------------------------------------------------------------

@pytest.mark.parametrize("rows, cols", [(64, 32), (13, 7), (3, 5), (8, 1), (1, 9)])
def test_every_output_element_is_written_exactly_once(lib, rows, cols):
    x = torch.randn(rows, cols)
    out, record = lib["scale_rows"].run(x, 3.0)
    torch.testing.assert_close(out, x * 3.0)
    cov = record.coverage
    assert cov.ok and cov.cores == 8
    assert sum(cov.elements_per_core) == rows * cols
    # cores own contiguous, disjoint row ranges in order; the first rows % 8 cores take one more
    base, extra = divmod(rows, 8)
    assert list(cov.elements_per_core) == [(base + (c < extra)) * cols for c in range(8)]
    assert len({r.core for r in record.cores}) == 8


def test_the_partition_offset_mistake_is_caught_and_named(lib):
    x = torch.randn(1024, 256)
    with pytest.raises(CoverageError) as info:
        torch.ops.ts_test.scale_rows_bad_offset(x, 2.0)
    msg = str(info.value)
    line = _line(KERNELS, "out_acc.tcm_to_tensor<float>(buf, partition * cpu_id + i * row_size")
    assert "did not write its output [1024, 256] exactly once" in msg
    assert "written by more than one core" in msg
    assert "elements [128, 256) (128 elements: out[0, 128] .. out[0, 255]) by cores 0 and 1" in msg
    assert "never written" in msg and "elements [33664, 262144)" in msg
    assert "core 1: 128 writes of 256 elements at offsets 128, 384, 640" in msg
    assert "`partition*cpu_id + i*row_size`" in msg and "`(partition*cpu_id + i)*row_size`" in msg
    assert f"ts_test_kernels.cpp:{line}" in msg


def test_a_forgotten_remainder_is_reported_as_never_written(lib):
    x = torch.randn(13, 4)
    with pytest.raises(CoverageError) as info:
        torch.ops.ts_test.scale_rows_no_tail(x, 1.0)
    msg = str(info.value)
    assert "20 output elements were never written" in msg
    assert "elements [32, 52) (20 elements: out[8, 0] .. out[12, 3])" in msg
    assert "more than one core" not in msg
    assert "someone must take the remainder" in msg


def test_coverage_check_can_warn_instead(lib):
    cpp.load_library(lib.path, multicore=True, check="warn")  # re-registers the ops, warning instead
    try:
        with pytest.warns(RuntimeWarning, match="never written"):
            out = torch.ops.ts_test.scale_rows_no_tail(torch.ones(9, 2), 1.0)
        assert torch.isnan(out[8]).all() and (out[:8] == 1).all()  # unwritten output stays NaN
    finally:
        lib.register()


def test_single_core_mode_runs_the_kernel_once(lib):
    single = cpp.load_library(lib.path, multicore=False)
    try:
        x = torch.randn(13, 7)
        out, record = single["scale_rows"].run(x, 2.0)
        torch.testing.assert_close(out, x * 2.0)
        assert record.coverage.cores == 1 and len(record.cores) == 1
        torch.testing.assert_close(torch.ops.ts_test.scale_rows(x, 2.0), x * 2.0)
    finally:
        lib.register()


# ---- checks inside the kernel -----------------------------------------------------------------

def test_tcm_exhaustion_names_the_request_and_what_is_left(lib):
    with pytest.raises(CppKernelError) as info:
        torch.ops.ts_test.tcm_hog(torch.zeros(4), 10000, 8000)
    msg = str(info.value)
    line = _line(KERNELS, "the failing request")
    assert f"ts_test_kernels.cpp:{line}" in msg
    assert "GpSimd core 0 of 8" in msg
    assert "tcm_malloc(8000 bytes) failed" in msg
    assert "holds 16384 bytes and 10048 are in use by 1 live allocation" in msg
    assert "6336 bytes are free (largest free block 6336 bytes" in msg
    assert "smaller chunks (at most 6336 bytes)" in msg
    assert info.value.location.endswith(f"ts_test_kernels.cpp:{line}")
    with pytest.raises(CppKernelError) as info:  # nothing free: only freeing helps
        torch.ops.ts_test.tcm_hog(torch.zeros(4), 16384, 8)
    msg = str(info.value)
    assert "so 0 bytes are free (largest free block 0 bytes" in msg
    assert "No block is free: tcm_free buffers you no longer need" in msg and "smaller chunks" not in msg


def test_accessor_out_of_bounds_names_the_range_and_the_tensor(lib):
    with pytest.raises(CppKernelError) as info:
        torch.ops.ts_test.read_past_end(torch.zeros(100), 5)
    msg = str(info.value)
    line = _line(KERNELS, "tensor_to_tcm<float>(buf, static_cast<size_t>(x.numel()) - 8")
    assert f"ts_test_kernels.cpp:{line}" in msg
    assert "tensor_to_tcm reaches elements [92, 105) of argument 0 ('x', shape [100], 100 elements): 5 elements past the end" in msg


def test_accessor_checks_the_tcm_buffer_too(lib):
    with pytest.raises(CppKernelError, match=r"tensor_to_tcm of 100 elements \(400 bytes\) covers bytes \[0, 400\) "
                                             r"of the TCM buffer allocated at .*ts_test_kernels.cpp:\d+, which has "
                                             r"256 bytes: 144 bytes past its end. Copy at most 64 elements"):
        torch.ops.ts_test.overflow_tcm(torch.zeros(200))


def test_buffer_overrun_by_a_plain_loop_is_found_at_tcm_free(lib):
    with pytest.raises(CppKernelError, match=r"TCM buffer of 64 bytes allocated at .*:\d+ was written outside its bounds"):
        torch.ops.ts_test.overrun_buffer(torch.zeros(4))


def test_writing_an_input_is_refused(lib):
    with pytest.raises(CppKernelError, match=r"tcm_to_tensor into argument 0 \('x'\), an input: a kernel writes only its output"):
        torch.ops.ts_test.write_input(torch.zeros(4))


def test_wrong_element_type_is_refused(lib):
    with pytest.raises(CppKernelError, match=r"tensor_to_tcm<int32_t> on argument 0 \('x'\), whose dtype is float32.*"
                                             r"use tensor_to_tcm<float>"):
        torch.ops.ts_test.wrong_type(torch.zeros(4))


def test_leaked_tcm_buffers_warn(lib):
    x = torch.randn(10)
    with pytest.warns(cpp.TcmLeakWarning, match=r"core 0 returned without tcm_free of 1 TCM buffer\(s\), 40 bytes"):
        out = torch.ops.ts_test.copy_leaky(x)
    assert torch.equal(out, x)
    # shown by Python's default filters (a ResourceWarning would not be), once per call
    assert not issubclass(cpp.TcmLeakWarning, (ResourceWarning, DeprecationWarning, PendingDeprecationWarning,
                                               ImportWarning))  # the categories Python ignores by default
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.ops.ts_test.copy_leaky(x)
    assert len([w for w in seen if issubclass(w.category, cpp.TcmLeakWarning)]) == 1


def test_device_limits_on_tensor_shapes(lib):
    with pytest.raises(cpp.CppError, match=r"at most 8 dimensions of at most 65535 elements each"):
        torch.ops.ts_test.scale_rows(torch.zeros(70000, 1), 1.0)
    with pytest.raises(cpp.CppError, match=r"dtype torch.float64"):
        torch.ops.ts_test.scale_rows(torch.zeros(4, dtype=torch.float64), 1.0)


# ---- build ------------------------------------------------------------------------------------

def test_an_unchanged_load_does_not_rebuild(lib):
    t0 = time.perf_counter()
    again = cpp.load("ts_test_ops", [KERNELS, GIOU / "giou.cpp"], [HERE / "ts_test_shapes.cpp", GIOU / "giou_shape.cpp"],
                     build_directory=BUILD, multicore=True)
    elapsed = time.perf_counter() - t0
    assert again.build.cached and again.build.compiled == ()
    assert again.path == lib.path
    assert elapsed < 1.0


def test_a_changed_header_rebuilds_only_what_includes_it(tmp_path):
    (tmp_path / "k.h").write_text("#define FACTOR 2.0f\n")
    (tmp_path / "k.cpp").write_text(
        '#include <tilescope/gpsimd.h>\n#include "k.h"\nusing namespace tilescope;\n'
        "Tensor twice(const Tensor& x) {\n  Tensor out = get_dst_tensor();\n"
        "  float* b = (float*)tcm_malloc(4 * x.numel());\n  tcm_accessor(x).tensor_to_tcm<float>(b, 0, x.numel());\n"
        "  for (int64_t i = 0; i < x.numel(); ++i) b[i] *= FACTOR;\n"
        "  tcm_accessor(out).tcm_to_tensor<float>(b, 0, x.numel());\n  tcm_free(b);\n  return out;\n}\n")
    (tmp_path / "s.cpp").write_text(
        "#include <tilescope/gpsimd.h>\nusing namespace tilescope;\nTensor twice(const Tensor& x);\n"
        "Tensor twice_shape(const Tensor& x) { return empty(x.sizes(), kFloat); }\n"
        "TILESCOPE_LIBRARY(ts_hdr, m) { m.def(\"twice\", &twice_shape, &twice); }\n")
    build = BUILD / "hdr"
    first = cpp.load("ts_hdr", [tmp_path / "k.cpp"], [tmp_path / "s.cpp"], build_directory=build)
    assert torch.equal(torch.ops.ts_hdr.twice(torch.ones(3)), torch.full((3,), 2.0))
    (tmp_path / "k.h").write_text("#define FACTOR 3.0f\n")
    second = cpp.load("ts_hdr", [tmp_path / "k.cpp"], [tmp_path / "s.cpp"], build_directory=build)
    assert not second.build.cached and second.build.compiled == (str(tmp_path / "k.cpp"),)
    assert second.path != first.path
    assert torch.equal(torch.ops.ts_hdr.twice(torch.ones(3)), torch.full((3,), 3.0))


def test_compile_error_shows_the_users_file_and_line(tmp_path):
    bad = tmp_path / "bad_kernel.cpp"
    bad.write_text("#include <tilescope/gpsimd.h>\nusing namespace tilescope;\n\n"
                   "Tensor broken(const Tensor& x) {\n  return undefined_thing;\n}\n")
    with pytest.raises(CompileError) as info:
        cpp.load("ts_bad", [bad], [], build_directory=BUILD / "bad")
    msg = str(info.value)
    assert f"{bad}:5" in msg and "undefined_thing" in msg
    assert info.value.location == f"{bad}:5"


def test_mismatched_kernel_and_shape_signatures_fail_at_compile_time(tmp_path):
    src = tmp_path / "mismatch.cpp"
    src.write_text("#include <tilescope/gpsimd.h>\nusing namespace tilescope;\n"
                   "Tensor k(const Tensor& x, double a) { return get_dst_tensor(); }\n"
                   "Tensor s(const Tensor& x) { return empty(x.sizes(), kFloat); }\n"
                   "TILESCOPE_LIBRARY(ts_mm, m) { m.def(\"k\", &s, &k); }\n")
    with pytest.raises(CompileError, match="the shape function and the kernel must take the same number of arguments"):
        cpp.load("ts_mm", [src], [], build_directory=BUILD / "bad")


def test_load_library_in_another_process_uses_the_stable_name(lib):
    import subprocess

    stable = lib.path.parent / "libts_test_ops.so"
    assert stable.exists()
    code = ("import torch, tilescope.cpp as cpp\n"
            f"cpp.load_library({str(stable)!r}, multicore=True)\n"
            "x = torch.arange(12.).reshape(3, 4)\n"
            "print(torch.equal(torch.ops.ts_test.scale_rows(x, 2.0), x * 2))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr


# ---- the device model ---------------------------------------------------------------------------

def test_program_has_one_dma_per_accessor_copy_and_one_gpsimd_call(lib):
    b1, b2 = make_boxes(64, 100, seed=1)
    est = lib["giou"].estimate(b1, b2, 1e-7)
    counts = est.program.summary_counts()
    _, record = lib["giou"].run(b1, b2, 1e-7)
    copies = sum(len(r.log) for r in record.cores)
    assert counts == {"dma_copy": copies, "gpsimd_call": 1}
    est.program.validate()  # the builder's checks were skipped while emitting: all of them pass
    s = est.result.summary
    assert s.hbm_read_bytes == 2 * b1.numel() * 4 and s.hbm_write_bytes == 64 * 100 * 4
    assert s.modeled and est.total_ns > 0
    # core c's transfers run on DMA queue c: one transfer in flight per core
    lanes = {est.result.timeline.lane_name(r) for r in range(len(est.result.timeline))}
    assert {f"DMA.q{c}" for c in range(8)} <= lanes and "DMA.q8" not in lanes
    # provenance points at the accessor calls in giou.cpp
    line = _line(GIOU / "giou.cpp", "in1.tensor_to_tcm<float>")
    assert any(p.file and p.file.endswith("giou.cpp") and p.line == line for p in est.program.provenance)


def test_modeled_time_matches_a_closed_form_estimate(lib):
    """Single core, one 4 KiB transfer in and one out: the trn1 numbers by hand."""
    single = cpp.load_library(lib.path, multicore=False)
    try:
        x = torch.randn(1, 1024)
        est = single["scale_rows"].estimate(x, 2.0)
    finally:
        lib.register()
    spec = preset("trn1")
    core = est.cores[0]
    assert (core.transfers_in, core.transfers_out, core.bytes_in, core.bytes_out) == (1, 1, 4096, 4096)
    # [dmabw] 1.3 us to issue, then one contiguous run (one descriptor) on one engine at 17 B/ns
    dma = 1300.0 + 4096 / 17.0 + 12.0
    call = (60 + 150 + np.ceil(core.gpsimd_cycles)) / 1.4  # access + GpSimd fixed + estimate, at 1.4 GHz
    assert est.total_ns == pytest.approx(dma + call + dma, rel=1e-9)
    assert spec.gpsimd.clock_ghz == 1.4
    # one cycle per counted instruction (assumed), two more for each TCM operand (3-cycle TCM [arch])
    assert core.gpsimd_cycles == core.instructions + 2 * core.memory_accesses
    # scaling 1024 elements: a load, a multiply and a store each at least, not tens per element
    assert 3 * 1024 <= core.instructions <= 40 * 1024 and 2 * 1024 <= core.memory_accesses <= 8 * 1024


def test_estimate_is_cached_and_deterministic(lib):
    b1, b2 = make_boxes(256, 256, seed=2)
    op = lib["giou"]
    first = op.estimate(b1, b2, 1e-7)
    assert op.estimate(b1, b2, 1e-7).program is first.program  # same pattern: same Program
    # counted instructions, not host time: five fresh estimates give five identical modeled times
    times = [op.estimate(b1, b2, 1e-7, refresh=True).total_ns for _ in range(5)]
    assert times == [first.total_ns] * 5
    assert [c.instructions for c in op.estimate(b1, b2, 1e-7, refresh=True).cores] == [
        c.instructions for c in first.cores]


def test_counted_work_follows_the_work_done(lib):
    op = lib["giou"]
    small = op.estimate(*make_boxes(64, 128, seed=3), 1e-7)
    large = op.estimate(*make_boxes(64, 256, seed=3), 1e-7)
    per_pair = [c.instructions / (64 * 128 / 8) for c in small.cores]
    # twice the box pairs per core: about twice the instructions (the per-chunk set-up aside)
    for s, l in zip(small.cores, large.cores):
        assert 1.8 < l.instructions / s.instructions < 2.1
    # GIoU is ~30 floating-point operations per pair: tens of instructions, loads of 8 floats
    assert all(20 < n < 200 for n in per_pair)
    assert all(8 <= c.memory_accesses / (64 * 128 / 8) < 20 for c in small.cores)


def test_cost_model_scales_the_compute_part(lib):
    b1, b2 = make_boxes(64, 64, seed=4)
    for cpi, tcm in ((1.0, 3), (2.0, 5)):
        est = lib["giou"].estimate(b1, b2, 1e-7, cost_model=CostModel(cycles_per_instruction=cpi, tcm_access_cycles=tcm))
        for core in est.cores:
            assert core.gpsimd_cycles == pytest.approx(core.instructions * cpi + core.memory_accesses * (tcm - 1))
        call = next(i for i in est.program.instructions if i.KIND == "gpsimd_call")
        assert call.cycles == np.ceil(max(c.gpsimd_cycles for c in est.cores))
        assert est.model.cycles_per_instruction == cpi


def test_program_numerics_refuse_with_a_clear_message(lib):
    from tilescope.sim import run_numerics

    x = torch.randn(16, 8)
    est = lib["scale_rows"].estimate(x, 2.0)
    with pytest.raises(Exception, match="models its time only; its values come from running the compiled kernel"):
        run_numerics(est.program, {"x": x.numpy()})


# ---- torch integration -------------------------------------------------------------------------

def test_op_inside_torch_compile_on_cpu(lib):
    b1, b2 = make_boxes(16, 32, seed=5)

    def f(a, b):
        return torch.ops.giou_ops.giou(a, b, 1e-7).mean(dim=-1)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(b1, b2), giou_torch(b1, b2).mean(dim=-1))


def test_schema_and_repr(lib):
    op = lib["giou"]
    assert op.schema == "giou(Tensor boxes1, Tensor boxes2, float eps_d) -> Tensor"  # the C++ parameter names
    assert "multicore (8 cores)" in repr(op) and "giou_shape.cpp" in repr(op)


