"""The model zoo (``examples/models``) at its small configs: every model trains eager and
compiled on the simulated device -- forward, loss, backward, AdamW -- with the values of the
same steps on CPU, and ``python -m examples.models.zoo`` prints its table's columns."""

from __future__ import annotations

import io
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

from examples.models import zoo  # noqa: E402

pytestmark = pytest.mark.slow

# known defects, each with the failure it causes: strict, so that each flips when fixed
KNOWN = {
    ("lstm", "compiled"): pytest.mark.xfail(
        strict=True,
        reason="torch.compile of nn.LSTM on sim: dynamo traces into the device's LSTM code; run first in a process "
               "the backend gets float64 tensor constants it cannot lay out (BackendCompilerFailed), after an "
               "eager LSTM it compiles no Program at all (the step runs op by op)"),
}

_RUNS: dict = {}


def _run(name: str, mode: str) -> zoo.ZooRun:
    key = (name, mode)
    if key not in _RUNS:
        _RUNS[key] = zoo.run_model(name, mode, "small")
    return _RUNS[key]


@pytest.mark.parametrize("name, mode", [pytest.param(n, m, marks=KNOWN.get((n, m), ()))
                                        for n in zoo.MODELS for m in ("eager", "compiled")])
def test_a_training_step_matches_cpu_and_is_modeled(sim_virtual, name, mode):
    r = _run(name, mode)
    assert r.parameters[0] == r.parameters[1], f"{r.parameters[0]} Parameters on CPU, {r.parameters[1]} on sim"
    tol = zoo.TOLERANCE["small"]
    bad = {k: v for k, v in r.max_rel_diff.items() if v > tol[k]}
    assert not bad and r.matches_cpu, f"{name} {mode} differs from CPU: {bad} (tolerances {tol})"
    assert r.executions > 0 and 0 < r.kernel_ns <= r.step_ns
    assert r.flops > 0 and 0 < r.mfu < 1
    generic = sum(o.modeled_ns for o in r.generic_ops)
    assert 0 <= r.generic_share <= 1 and generic <= r.generic_share * r.kernel_ns * (1 + 1e-9)
    assert r.ops and all(o.bound_ns > 0 and 0 < o.share <= 1 for o in r.ops)
    assert (r.lowerings.get("compiled", 0) > 0) == (mode == "compiled")  # fused Programs ran, compiled only
    # TensorE efficiency never exceeds what the same ops reach at their roofline bounds
    assert set(r.tensor_ceiling) == set(r.tensor_efficiency)
    assert all(0 <= r.tensor_efficiency[k] <= r.tensor_ceiling[k] * (1 + 1e-9) for k in r.tensor_ceiling)


def test_the_table_has_its_columns(sim_virtual):
    from rich.console import Console

    runs = [_run("llama", "eager"), _run("llama", "compiled"), _run("bert", "eager")]
    out = io.StringIO()
    zoo.print_table(runs, Console(file=out, width=250))
    text = out.getvalue()
    for col in ("model", "step eager", "step compiled", "MFU eager / compiled", "generic eager / compiled",
                "vs CPU", "top ops", "of bound", "modeled"):
        assert col in text, col
    llama = runs[0]
    assert f"{100 * llama.generic_share:.1f}%" in text and llama.ops[0].op in text
    assert "bert" in text and "llama" in text


def test_the_command_line_names_an_unknown_model():
    with pytest.raises(SystemExit):
        zoo.main(["--models", "gpt5"])
