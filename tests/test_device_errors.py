"""Errors users see on the device read like PyTorch's own: the values, the limit, the fix."""

import re

import pytest
import torch

import tilescope.device as dev
from tilescope.spec import preset

dev.register()


def test_tensors_on_two_devices():
    a = torch.ones(3, device="sim")
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, but found at "
                                           r"least two devices, sim:0 and cpu!"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match=r"sim:0 and sim:1"):
        a + torch.ones(3, device="sim:1")
    with pytest.raises(RuntimeError, match="same device"):
        torch.nn.functional.linear(a, torch.ones(2, 3))
    # a CPU scalar (0-dim) mixes in, as with CUDA
    assert (a * torch.tensor(2.0)).sum().item() == 6.0


@pytest.mark.parametrize("dtype", [torch.float8_e5m2, torch.uint16])
def test_unsupported_dtype(dtype):
    with pytest.raises(TypeError, match=rf"the sim device does not support {dtype} tensors.*Supported dtypes: "
                                        r"float32, bfloat16.*Fix: convert first"):
        torch.zeros(4, dtype=dtype, device="sim")
    with pytest.raises(TypeError, match="does not support"):
        torch.zeros(4).to(dtype).to("sim")


def test_out_of_memory_against_the_presets_hbm():
    old = dev.settings().preset
    dev.configure(preset=old.replace(hbm_bytes=64 << 20))  # a 64 MiB core
    try:
        keep = torch.empty(40 << 20, dtype=torch.uint8, device="sim")
        with pytest.raises(torch.OutOfMemoryError) as e:
            torch.empty(30 << 20, dtype=torch.uint8, device="sim")
        msg = str(e.value)
        assert "sim out of memory. Tried to allocate 30.00 MiB" in msg
        assert "64.00 MiB total capacity" in msg and "already allocated" in msg and "free" in msg
        assert "Free tensors you no longer need" in msg
        del keep
        torch.empty(30 << 20, dtype=torch.uint8, device="sim")  # fits once the first is freed
    finally:
        dev.configure(preset=old)
    assert torch.sim.mem_get_info()[1] == preset(None).hbm_bytes


def test_invalid_device_index():
    n = torch.sim.device_count()
    with pytest.raises(RuntimeError, match=f"sim:{n} does not exist"):
        torch.empty(2, device=f"sim:{n}")


def test_errors_of_bad_calls_come_from_pytorch_at_the_call():
    a = torch.ones(2, 3, device="sim")
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(2x3 and 2x3\)"):
        a @ a
    with pytest.raises(RuntimeError, match="The size of tensor a"):
        a + torch.ones(4, device="sim")
    with pytest.raises(RuntimeError, match="output with shape"):
        torch.ones(3, device="sim").add_(a)


@pytest.mark.parametrize("name, value, says", [
    ("TILESCOPE_NUMERICS", "fasle", "TILESCOPE_NUMERICS='fasle' is neither on nor off; use 1"),
    ("TILESCOPE_LAUNCH_BLOCKING", "2", "TILESCOPE_LAUNCH_BLOCKING='2' is neither on nor off; use 1"),
    ("TILESCOPE_WORKER_THREADS", "two", "TILESCOPE_WORKER_THREADS='two' is not an integer; use an integer of at least 1"),
    ("TILESCOPE_WORKER_THREADS", "0", "TILESCOPE_WORKER_THREADS='0' is below its minimum of 1"),
])
def test_bad_settings_in_the_environment_are_named(monkeypatch, name, value, says):
    """The device's settings from the environment: a misspelt switch is an error, never read
    as on (or off)."""
    from tilescope.device import _settings

    monkeypatch.setattr(_settings, "_SETTINGS", None)  # read afresh (restored after the test)
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(says)):
        _settings.settings()
    monkeypatch.setenv(name, "off" if name != "TILESCOPE_WORKER_THREADS" else "3")
    monkeypatch.setattr(_settings, "_SETTINGS", None)
    s = _settings.settings()
    assert (s.worker_threads == 3) if name == "TILESCOPE_WORKER_THREADS" else (
        getattr(s, name.removeprefix("TILESCOPE_").removeprefix("LAUNCH_").lower()) is False)


@pytest.mark.parametrize("value, in_use", [("off", False), ("bad", None)])
def test_the_device_profiler_switch_reads_like_every_other(value, in_use):
    """``TILESCOPE_DEVICE_PROFILER`` (read at registration, so in a fresh process) takes the
    words every switch takes; anything else is an error naming it."""
    import subprocess
    import sys

    code = ("import tilescope.device as d; d.register(); from tilescope.device import _runtime; "
            "print('in use:', _runtime._S.device_profiler is not None)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "TILESCOPE_DEVICE_PROFILER": value})
    if in_use is None:
        assert proc.returncode != 0 and "TILESCOPE_DEVICE_PROFILER='bad' is neither on nor off" in proc.stderr
    else:
        assert proc.returncode == 0 and f"in use: {in_use}" in proc.stdout, proc.stderr
