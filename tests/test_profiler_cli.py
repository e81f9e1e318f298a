"""Zero-code capture, `tilescope profile`, `tilescope doctor`, `tilescope share --redact`."""

import json
import os
import socket
import subprocess
import sys
import textwrap

from tilescope.profiler import find_profiles, load

SCRIPT = textwrap.dedent("""
    import sys, torch, tilescope.device
    tilescope.device.register()
    x = torch.randn(128, 256).to("sim")  # (made on the host: a random fill on the device is modeled generically)
    y = (x * 2).exp().sum(-1)
    print("ran", y.shape[0], sys.argv[1:])
""")


def _run(args, env=None, cwd=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, env=full_env, cwd=cwd, timeout=300)


def test_env_var_capture_profiles_a_script_without_code_change(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import tilescope\n" + SCRIPT)
    out = tmp_path / "out"
    proc = _run([sys.executable, str(script)], env={"TILESCOPE_PROFILE": "1", "TILESCOPE_PROFILE_DIR": str(out),
                                                   "TILESCOPE_PROFILE_MODE": "DEVICE,RUNTIME"})
    assert proc.returncode == 0, proc.stderr
    assert "ran 128" in proc.stdout and "profile written to" in proc.stderr
    (prof,) = find_profiles(out)
    p = load(prof.path)
    assert p.manifest["stats"]["executions"] >= 3 and p.executables()


def test_cli_profile_doctor_and_redacted_share(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    tilescope = [sys.executable, "-m", "tilescope"]
    proc = _run(tilescope + ["profile", "--out", str(out), str(script), "a", "b"])
    assert proc.returncode == 0, proc.stderr
    assert "ran 128 ['a', 'b']" in proc.stdout
    (prof,) = find_profiles(out)
    doctor = _run(tilescope + ["doctor", str(prof.path)])
    # a whole-run profile holds the first iteration: the only finding is that it is cold
    assert doctor.returncode == 0, doctor.stdout
    assert "cold-start" in doctor.stdout and "[error]" not in doctor.stdout
    assert doctor.stdout.count("[warning]") == 1

    shared = _run(tilescope + ["share", str(prof.path), "--out", str(tmp_path / "shared")])
    assert shared.returncode == 0, shared.stderr
    (copy,) = find_profiles(tmp_path / "shared")
    copy = load(copy.path)  # complete, checksums verified
    assert copy.path.parent.name == "host_pid_0"
    host = socket.gethostname().split(".")[0]
    for f in copy.manifest["files"]:
        text = (copy.path / f["path"]).read_text()
        assert str(tmp_path) not in text and "Call stack" not in text
        assert "src/tilescope" not in text, f["path"]  # no absolute path, executables' names included
        if len(host) > 3:
            assert host not in text
    for h, _, trace in copy.itraces():  # pairs renamed consistently
        assert copy.load_itrace(trace)["program_hash"] == h
    assert "platform" not in json.loads((copy.path / "manifest.json").read_text())


def test_zero_code_capture_can_record_every_threads_ops(monkeypatch):
    """``TILESCOPE_PROFILE_ALL_THREADS`` and ``tilescope profile --all-threads`` reach
    ``ProfileConfig(profile_all_threads=...)``; a value that is neither on nor off is named."""
    import argparse

    import pytest

    from tilescope.profiler import _auto, _profile_cli

    on = {"TILESCOPE_PROFILE": "1"}
    assert _auto.config_from_env(on).profile_all_threads is False
    assert _auto.config_from_env({**on, "TILESCOPE_PROFILE_ALL_THREADS": "1"}).profile_all_threads is True
    assert _auto.config_from_env({**on, "TILESCOPE_PROFILE_ALL_THREADS": "off"}).profile_all_threads is False
    with pytest.raises(ValueError, match="TILESCOPE_PROFILE_ALL_THREADS='sometimes'"):
        _auto.config_from_env({**on, "TILESCOPE_PROFILE_ALL_THREADS": "sometimes"})
    with pytest.raises(ValueError, match="TILESCOPE_PROFILE='yse' is neither on nor off"):
        _auto.config_from_env({"TILESCOPE_PROFILE": "yse"})  # never silently off
    assert _auto.config_from_env({**on, "TILESCOPE_PROFILE_MAX_EVENTS": "64"}).max_events_per_core == 64
    with pytest.raises(ValueError, match="TILESCOPE_PROFILE_MAX_EVENTS='0' is below its minimum of 1"):
        _auto.config_from_env({**on, "TILESCOPE_PROFILE_MAX_EVENTS": "0"})

    seen = []

    class Ran:
        path = "profile"

    monkeypatch.setattr(_auto, "run_script", lambda script, args, cfg, device: (seen.append(cfg), Ran())[1])
    parser = argparse.ArgumentParser()
    _profile_cli.register(parser.add_subparsers())
    for argv, expected in ((["profile", "--all-threads", "x.py"], True), (["profile", "x.py"], False)):
        args = parser.parse_args(argv)
        assert args.func(args) == 0
        assert seen[-1].profile_all_threads is expected and seen[-1].to_dict()["profile_all_threads"] is expected


def test_a_cpu_script_profiled_without_code_change_is_a_cpu_profile(tmp_path, monkeypatch):
    """``tilescope profile --device cpu script.py`` (``TILESCOPE_PROFILE_DEVICE=cpu`` for the
    variable's route): a script that never touches the simulated device gives a CPU profile,
    with no "no device activity" error from the doctor."""
    import pytest

    from tilescope.profiler import _auto, diagnose, read_profile

    script = tmp_path / "cpu_script.py"
    script.write_text("import torch\nx = torch.randn(64, 64)\nprint((x @ x).sum().item() != 0)\n")
    exporter = _auto.run_script(str(script), [], _auto.ProfileConfig(output_dir=str(tmp_path / "out")), device="cpu")
    prof = read_profile(exporter.path).require_complete()
    assert prof.device["kind"] == "cpu" and prof.executables() == {}
    assert [f.code for f in diagnose(exporter.path) if f.severity == "error"] == []
    assert _auto.device_from_env({"TILESCOPE_PROFILE_DEVICE": "CPU"}) == "cpu"
    assert _auto.device_from_env({}) == "sim"
    with pytest.raises(ValueError, match="TILESCOPE_PROFILE_DEVICE='tpu': use one of sim, cuda, cpu"):
        _auto.device_from_env({"TILESCOPE_PROFILE_DEVICE": "tpu"})


def test_redaction_replaces_the_host_name_as_a_name_only():
    from tilescope.profiler._share import _redactor

    redact = _redactor("vm")
    assert redact({"name": "llvm_vmap_pass", "lane": "vm/pid:1", "at": "vm.local"}) == {
        "name": "llvm_vmap_pass", "lane": "host/pid:1", "at": "host.local"}
    assert redact("sbuf:/home/someone/venv/lib/kernels.py:12") == "sbuf:kernels.py:12"


def test_modules_torch_imports_as_a_profile_starts_are_imported_before():
    """Imported inside a with_stack window, their frames broke torch's parse (UnicodeDecodeError,
    the profile lost) in about 1 fresh process of 4; tilescope's profiler imports them first."""
    import subprocess
    import sys

    code = "import sys, tilescope.profiler._export; print(sorted(m for m in ('torch.profiler._cupti_monitor', " \
           "'torch.profiler.python_tracer') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert "torch.profiler._cupti_monitor" in out and "torch.profiler.python_tracer" in out
