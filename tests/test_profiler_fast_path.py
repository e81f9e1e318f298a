"""A tilescope profiler listens to the device only while it is open: once its profile stops, the
device's native dispatch fast path is back (a subscribed listener sends every call through
Python). Nested and overlapping profilers share the listener; the last one to close removes it."""

import pytest
import torch
from torch.profiler import ProfilerActivity

import tilescope
import tilescope.device as dev
from tilescope.device import _dispatch, _runtime
from tilescope.profiler import ProfileConfig, Profiler
from tilescope.profiler._capture import capture

dev.register()


@pytest.fixture
def fast(sim_fast_dispatch):
    assert not _listening()
    yield


def _listening() -> bool:
    return capture.on_execution in _runtime._S.listeners


def _takes_fast_path() -> bool:
    """Whether repeat calls of a signature run natively (the first ones teach it)."""
    x = torch.ones(8, 8, device="sim")
    for _ in range(3):
        x * 2.0
    before = _dispatch.stats()["fast_calls"]
    for _ in range(3):
        x * 2.0
    torch.sim.synchronize()
    return _dispatch.stats()["fast_calls"] > before


def _work():
    x = torch.randn(32, 32, device="sim")
    (x * x).sum()
    torch.sim.synchronize()


def test_the_fast_path_is_back_after_a_profile_block(fast, tmp_path):
    assert _takes_fast_path()
    with tilescope.profile(str(tmp_path)) as prof:
        assert _listening()
        _work()
    assert prof.profile_dir is not None and (prof.profile_dir / "manifest.json").exists()
    assert not _listening() and capture.holders == 0
    assert _takes_fast_path()


def test_a_scheduled_torch_profile_closes_its_exporter_when_it_stops(fast, tmp_path):
    """The README's pattern: the exporter lives on in the profile the user keeps, exported from a
    ``step`` (the profile goes on, the listener stays), closed by the profile's ``stop``."""
    cfg = ProfileConfig(output_dir=str(tmp_path))
    exporter = Profiler(cfg)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                schedule=torch.profiler.schedule(wait=1, warmup=1, active=1),
                                experimental_config=cfg, on_trace_ready=exporter.export_trace) as prof:
        for step in range(4):
            _work()
            prof.step()
            if step == 2:  # the first window was exported by this step: the profile goes on
                assert len(exporter.paths) == 1 and _listening()
    assert not _listening() and exporter.closed
    assert _takes_fast_path()
    assert len(exporter.paths) == 1  # a closed exporter keeps what it wrote


def test_a_profile_exported_from_its_stop_closes_its_exporter(fast, tmp_path):
    cfg = ProfileConfig(output_dir=str(tmp_path))
    exporter = Profiler(cfg)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                experimental_config=cfg, on_trace_ready=exporter.export_trace):
        _work()
        assert _listening()
    assert exporter.path is not None and not _listening()


def test_overlapping_profilers_share_the_listener(fast, tmp_path):
    outer = Profiler(ProfileConfig(output_dir=str(tmp_path / "outer")))
    assert _listening() and capture.holders == 1
    with Profiler(ProfileConfig(output_dir=str(tmp_path / "inner"))) as inner:
        assert capture.holders == 2
        with tilescope.profile(str(tmp_path / "block")):
            _work()
        assert _listening() and capture.holders == 2  # the block's profiler closed; two still open
    assert inner.closed and _listening() and capture.holders == 1
    outer.close()
    outer.close()  # idempotent
    assert not _listening() and capture.holders == 0
    assert _takes_fast_path()


def test_a_dropped_profiler_lets_go(fast, tmp_path):
    Profiler(ProfileConfig(output_dir=str(tmp_path)))  # garbage at once: nothing left listening
    assert not _listening() and capture.holders == 0
