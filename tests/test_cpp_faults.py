"""A C++ kernel's bugs stop the kernel, not Python: faults, overruns, infinite loops, Ctrl-C.

Each scenario runs in a subprocess (a regression would take the test process down): the
kernels of ``tests/cpp/ts_faults.cpp`` fault in the ways users' kernels do, and each must
raise ``CppKernelError`` naming the core and the line (marked ``FAULT:`` in the source),
after which the same process keeps computing correctly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ROOT / "tests" / "cpp" / "ts_faults.cpp"
BUILD = ROOT / "build" / "cpp-tests" / "faults"

LOAD = textwrap.dedent(f"""
    import json, signal, sys, time, torch, tilescope.cpp as cpp
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job ignores it)
    lib = cpp.load("ts_faults", [{str(FAULTS)!r}], [], build_directory={str(BUILD)!r}, multicore=True,
                   timeout_s=float(sys.argv[1]) if sys.argv[1] != "none" else None)
""")


def _line(marker: str) -> int:
    for k, text in enumerate(FAULTS.read_text().splitlines(), start=1):
        if f"FAULT: {marker}" in text:
            return k
    raise AssertionError(marker)


def _python(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)


def _until(proc: subprocess.Popen, marker: str, timeout: float = 300) -> list[str]:
    """Lines of the child's stdout up to the one holding ``marker``."""
    seen = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line.rstrip("\n"))
        if marker in line or time.monotonic() > deadline:
            break
    assert seen and marker in seen[-1], (seen, proc.stderr.read() if proc.poll() is not None else "")
    return seen


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """The child's output once it ends; killed (not left running) if it does not end in time."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running after {timeout} s; stdout: {out[-2000:]} stderr: {err[-2000:]}") from None


def test_faulting_kernels_raise_a_kernel_error_naming_core_and_line():
    code = LOAD + textwrap.dedent("""
        x = torch.arange(1000.)
        out = {}
        for mode in (1, 2, 3, 4, 5, 6, 7, 8):
            t0 = time.perf_counter()
            try:
                torch.ops.ts_faults.faulty(x, mode, 0)
                out[mode] = None
            except cpp.CppKernelError as e:
                out[mode] = [e.location, str(e), time.perf_counter() - t0]
        print(json.dumps(out))
        print("schema", lib["faulty"].schema)
        print("still computes", torch.equal(torch.ops.ts_faults.faulty(x, 0, 0), x))
    """)
    proc = _python(code, "2")
    stdout, stderr = _finish(proc, 600)
    assert proc.returncode == 0, stderr[-3000:]
    lines = stdout.splitlines()
    got = {int(k): v for k, v in json.loads(lines[0]).items()}
    assert lines[-1] == "still computes True"  # the process, its worker state and the library all survive
    assert lines[-2] == "schema faulty(Tensor x, int mode, int zero) -> Tensor"  # the C++ parameter names

    def check(mode, marker, *words, core=0):
        location, message, _ = got[mode]
        assert location == f"{FAULTS}:{_line(marker)}", message
        assert f"on GpSimd core {core} of 8" in message, message
        for w in words:
            assert w in message, (w, message)

    check(1, "null write", "SIGSEGV, a write to address 0x0: a null pointer dereference", "*p = 1.0f;")
    # 1 KB past a 256-byte buffer, inside the 16 KB pool: found by the guard bytes, the host heap untouched
    assert "double free" not in stderr and "corruption" not in stderr
    location, message, _ = got[2]
    assert "TCM buffer of 256 bytes" in message and "written outside its bounds" in message
    check(3, "overrun past pool", "past this core's TCM pool")
    check(4, "division", "SIGFPE: an integer division by zero")
    location, message, _ = got[5]
    assert location in (f"{FAULTS}:{_line('recursion') - 1}",
                        f"{FAULTS}:{_line('recursion')}"), message
    assert "a stack overflow" in message and "(in deep)" in message
    check(6, "assert", "SIGABRT", "failed assert()")
    check(7, "infinite loop", "ran longer than the 2 s limit", "timeout_s")
    assert 1.5 < got[7][2] < 30
    check(8, "null read on core 3", "a read of address 0x0", core=3)


def test_ctrl_c_interrupts_an_infinite_loop_on_the_host():
    code = LOAD + textwrap.dedent("""
        x = torch.arange(1000.)  # x[0] = 0: the kernel loops forever
        print("looping", flush=True)
        t0 = time.perf_counter()
        try:
            torch.ops.ts_faults.faulty(x, 7, 0)
        except KeyboardInterrupt as e:
            print("interrupted", round(time.perf_counter() - t0, 2), e, flush=True)
        print("still computes", torch.equal(torch.ops.ts_faults.faulty(x + 1, 0, 0), x + 1), flush=True)
    """)
    proc = _python(code, "none")
    _until(proc, "looping")
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = _finish(proc, 120)
    assert proc.returncode == 0, stderr[-3000:]
    assert "interrupted" in stdout and "the kernel was interrupted (Ctrl-C)" in stdout, stdout + stderr[-2000:]
    assert "still computes True" in stdout
    assert time.monotonic() - sent < 60


@pytest.mark.slow
def test_ctrl_c_stops_a_kernel_looping_on_the_device_worker():
    """On ``sim`` a later call runs on the device worker: Ctrl-C in ``synchronize`` cancels
    the queue and stops the kernel there; the next wait says what was lost."""
    code = LOAD + textwrap.dedent("""
        import tilescope.device
        from tilescope.device import DeviceExecutionError
        tilescope.device.register()
        first = (torch.arange(1000.) - 1).to("sim")  # x[0] = -1: no loop (the call that learns the Program)
        torch.ops.ts_faults.faulty(first, 7, 0)
        torch.sim.synchronize()
        torch.ops.ts_faults.faulty(torch.arange(1000.).to("sim"), 7, 0)  # on the worker: loops forever
        print("queued", flush=True)
        try:
            torch.sim.synchronize()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        try:
            torch.sim.synchronize()
        except DeviceExecutionError as e:
            print("reported:", str(e).splitlines()[0], flush=True)
        y = torch.arange(8.).to("sim") * 2
        print("still computes", torch.equal(y.cpu(), torch.arange(8.) * 2), flush=True)
    """)
    proc = _python(code, "none")
    _until(proc, "queued")
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = _finish(proc, 120)
    assert proc.returncode == 0, stderr[-3000:]
    assert "interrupted" in stdout, stdout + stderr[-2000:]
    assert "reported:" in stdout and "queued work was cancelled" in stdout, stdout
    assert "still computes True" in stdout


def test_load_library_runs_in_the_mode_the_library_was_built_for(tmp_path):
    """The seed's flow: build with multicore=True, then load_library("lib....so") without
    saying the mode: the classic partition-offset bug must still be caught."""
    import torch

    import tilescope.cpp as cpp

    kernels = ROOT / "tests" / "cpp" / "ts_test_kernels.cpp"
    shapes = ROOT / "tests" / "cpp" / "ts_test_shapes.cpp"
    built = cpp.load("ts_test_ops", [kernels, ROOT / "examples/giou/giou.cpp"],
                     [shapes, ROOT / "examples/giou/giou_shape.cpp"], build_directory=ROOT / "build/cpp-tests",
                     multicore=True)
    try:
        again = cpp.load_library(built.path.parent / "libts_test_ops.so")
        assert again.multicore and again.cores == 8 and again.native.built_cores == 8
        with pytest.raises(cpp.CoverageError, match="written by more than one core"):
            torch.ops.ts_test.scale_rows_bad_offset(torch.randn(1024, 256), 2.0)
        assert not cpp.load_library(built.path, multicore=False).multicore  # an explicit mode still wins
    finally:
        built.register()


def test_a_header_static_assert_is_reported_at_the_users_line(tmp_path):
    import tilescope.cpp as cpp

    src = tmp_path / "writes_input.cpp"
    src.write_text("#include <tilescope/gpsimd.h>\nusing namespace tilescope;\n\n"
                   "Tensor k(const Tensor& x) {\n    float* b = (float*)tcm_malloc(16);\n"
                   "    tcm_accessor(x).tcm_to_tensor<float>(b, 0, 4);\n    return get_dst_tensor();\n}\n")
    with pytest.raises(cpp.CompileError) as info:
        cpp.load("ts_sa", [src], [], build_directory=BUILD / "sa")
    assert info.value.location == f"{src}:6"
    first = str(info.value).splitlines()[0]
    assert first.startswith(f"building {src} failed: {src}:6:") and "needs a writable accessor" in first
