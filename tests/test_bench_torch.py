"""tilescope.bench for PyTorch functions: synchronisation, fallbacks, quantiles."""

import time

import numpy as np
import pytest
import torch

import tilescope.device
from tilescope.bench import SilentFallbackError, bench, compare


@pytest.fixture(scope="module")
def sim(sim_wall):
    """The sim device, wall clock (tests/conftest.py)."""


def test_quantiles_of_a_known_sleep():
    r = bench(lambda: time.sleep(0.003), warmup=1, iters=15)
    assert r.backend == "cpu" and r.device_us is None
    assert 3000 <= r.p(50, "host") < 4500  # sleep(3 ms) plus scheduling noise
    assert r.p(0, "host") <= r.p(50, "host") <= r.p(100, "host")
    assert set(r.quantiles["host"]) == {"p0", "p1", "p10", "p25", "p50", "p75", "p90", "p99", "p100"}
    assert r.to_dict()["host_us"] == pytest.approx(r.p(50, "host"))


def test_min_time_and_adaptive_repetition():
    r = bench(lambda: time.sleep(0.001), warmup=0, iters=None, min_time=0.05)
    # repeated until the time is spent (each call takes >= 1 ms, so at most ~50 on an idle machine;
    # a loaded one stretches the sleeps, hence no exact count)
    assert 10 <= r.iters <= 50 and r.host_us.sum() / 1e6 >= 0.05
    r = bench(lambda: time.sleep(0.001), warmup=0, iters=5, rel_spread=10.0)
    assert r.iters == 5


def test_a_function_that_never_synchronises_is_timed_to_the_end_of_its_device_work(sim):
    x = torch.randn(2048, 2048, device="sim")
    f = lambda x: (x * 2).exp() + 1  # noqa: E731 - three executions, no synchronize inside
    torch.sim.synchronize()
    r = bench(f, x, warmup=1, iters=3)
    assert r.backend == "sim" and r.device_modeled
    # timed by hand: a timer around the call alone sees only dispatch
    t0 = time.perf_counter()
    f(x)
    dispatch_only = (time.perf_counter() - t0) * 1e6
    torch.sim.synchronize()
    # wall clock: synchronize waits for modeled time, so the host time covers the device time
    assert r.p(50, "host") >= r.p(50, "device") > 0
    assert r.p(50, "host") > dispatch_only
    assert any("modeled" in n for n in r.notes)


def test_silent_cpu_fallback_is_detected(sim):
    x = torch.randn(64, 64, device="sim")
    with pytest.raises(SilentFallbackError, match="inputs are on sim:0 but outputs are on cpu"):
        bench(lambda x: x.cpu() * 2, x, warmup=0, iters=1)
    r = bench(lambda x: x.cpu() * 2, x, warmup=0, iters=1, allow_fallback=True)
    assert any("fallback allowed" in n for n in r.notes)


def test_compare_prints_ratios():
    # sleeps long enough that a loaded machine's scheduling delay (a few ms) cannot swamp the 4x
    c = compare({"fast": lambda: time.sleep(0.01), "slow": lambda: time.sleep(0.04)}, warmup=1, iters=5)
    ratio = c.results["slow"].host_median_us / c.results["fast"].host_median_us
    assert 2.0 < ratio < 5.5
    text = str(c)
    assert "ratio to fast" in text and "1.00x" in text
    assert set(c.to_dict()) == {"fast", "slow"}


def test_results_serialise_to_json():
    import json

    r = bench(lambda: np.ones(10).sum(), warmup=0, iters=3)
    doc = json.loads(r.to_json())
    assert doc["backend"] == "cpu" and doc["iters"] == 3
