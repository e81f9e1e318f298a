"""Ctrl-C with work queued on the ``sim`` device: the wait is interrupted, the queue is
cancelled and the process exits promptly (a second Ctrl-C while it stops never aborts).

Each scenario runs in a subprocess that queues far more device work than the test waits
for, then is sent SIGINT while the host waits for the result.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

QUEUE = textwrap.dedent("""
    import signal, sys, time, torch, tilescope.device
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job ignores it)
    tilescope.device.register()
    a = torch.randn(512, 512).to("sim")
    for _ in range(5000):  # minutes of device work, queued in a fraction of a second
        a = torch.tanh(a @ a)
    print("queued", flush=True)
""")


def _start(code: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)
    line = proc.stdout.readline()
    assert line.startswith("queued"), (line, proc.stderr.read() if proc.poll() is not None else "")
    time.sleep(1.0)  # the host now waits in .cpu()
    return proc


def _finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[str, str]:
    """The child's output once it ends; killed (not left running) if it does not end in time."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running {timeout} s after Ctrl-C; stderr: {err[-2000:]}") from None


def test_ctrl_c_cancels_queued_work_and_the_process_exits_promptly():
    proc = _start(QUEUE + "print(float(a.cpu().sum()))\n")
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = _finish(proc)
    took = time.monotonic() - sent
    assert proc.returncode == -signal.SIGINT, (proc.returncode, stderr[-2000:])  # the usual end of an uncaught Ctrl-C
    assert "KeyboardInterrupt" in stderr and "terminate called" not in stderr, stderr[-2000:]
    assert took < 30, took  # not the minutes the queue holds


def test_ctrl_c_then_the_next_wait_reports_the_cancelled_work():
    code = QUEUE + textwrap.dedent("""
        from tilescope.device import DeviceExecutionError
        try:
            a.cpu()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        try:
            torch.sim.synchronize()
        except DeviceExecutionError as e:
            print("reported:", str(e), flush=True)
        y = torch.arange(8.).to("sim") * 2
        print("still computes", torch.equal(y.cpu(), torch.arange(8.) * 2), flush=True)
    """)
    proc = _start(code)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = _finish(proc)
    assert proc.returncode == 0, stderr[-2000:]
    assert time.monotonic() - sent < 30
    assert "interrupted" in stdout
    assert "reported:" in stdout and "cancelled by an interrupt" in stdout and "undefined values" in stdout, stdout
    assert "still computes True" in stdout


@pytest.mark.slow
def test_a_second_ctrl_c_while_exiting_ends_the_process_without_an_abort():
    proc = _start(QUEUE + "print(float(a.cpu().sum()))\n")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = _finish(proc)
    assert proc.returncode in (-signal.SIGINT, 130), (proc.returncode, stderr[-2000:])
    assert proc.returncode != -signal.SIGABRT and "terminate called" not in stderr, stderr[-2000:]
