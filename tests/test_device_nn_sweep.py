"""Every module class in ``torch.nn`` runs on the device, forward and backward, matching CPU
(``benchmarks/nn_module_sweep.py`` holds the table of constructors and inputs; it runs in a
subprocess so that a crash fails the test instead of killing the suite)."""

import importlib.util
import pathlib
import sys

import pytest
import torch

SWEEP = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "nn_module_sweep.py"


def _sweep_module():
    spec = importlib.util.spec_from_file_location("nn_module_sweep", SWEEP)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks its module up)
    spec.loader.exec_module(module)
    return module


def test_every_nn_module_class_is_a_case_or_an_explained_exclusion():
    sweep = _sweep_module()
    assert sweep.unlisted() == []
    assert not set(sweep.EXCLUDED) & {name.split(" (")[0] for name in sweep.CASES}
    assert all(len(reason) > 20 for reason in sweep.EXCLUDED.values())


def test_nn_modules_match_cpu_forward_and_backward():
    sweep = _sweep_module()
    results = sweep.sweep()
    bad = [(r["case"], r["status"], r["reason"]) for r in results if r["status"] != "pass"]
    assert not bad, bad
    for r in results:
        case = sweep.CASES[r["case"]]
        assert r["checked"]["outputs"] >= 1, r
        if case.backward:
            assert r["checked"]["grads"] >= 1, r  # something was differentiated and compared
        assert r["rules"], r  # it ran on the device (device executions were recorded)


@pytest.mark.skipif(torch.cuda.is_available(), reason="DataParallel picks CUDA devices when there are any")
def test_data_parallel_fails_loudly_naming_the_missing_op():
    import tilescope.device as dev

    dev.register()
    model = torch.nn.DataParallel(torch.nn.Linear(5, 4)).to("sim")
    with pytest.raises(AttributeError, match="_scatter"):
        model(torch.randn(4, 5, device="sim"))
