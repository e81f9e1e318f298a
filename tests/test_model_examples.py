"""The model examples (``examples/models``) run as scripts: a training step profiled on the
simulated device after its warm-up, with nothing for the doctor to warn about."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tilescope.profiler import read_profile

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"


@pytest.mark.parametrize("script, top_op", [("cnn.py", "convolution"), ("nanogpt.py", "mm")])
def test_model_example_profiles_a_warm_step(tmp_path, script, top_op):
    proc = subprocess.run([sys.executable, str(MODELS / script), "--out", str(tmp_path / "prof")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # warm: no cold start, nothing pending at export (the generic share has its own finding, and
    # tests: it says how much of the modeled time is an estimate, not a profiling mistake)
    told = [ln for ln in proc.stderr.splitlines() if ln.startswith("tilescope doctor:") and "generic-share" not in ln]
    assert not told, told
    (path,) = re.findall(r"^profile: (.+)$", proc.stdout, flags=re.M)
    prof = read_profile(path).require_complete()
    assert prof.device["kind"] == "sim" and prof.manifest["stats"]["cold_executions"] == 0
    assert top_op in proc.stdout and "modeled" in proc.stdout
