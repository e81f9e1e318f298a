"""Fixtures shared by the tests that run on the simulated device."""

import contextlib
import os

import pytest
from hypothesis import settings

from tiers import assign_tier

# CI runs the property tests on a fixed set of examples (HYPOTHESIS_PROFILE=ci in .ci/run), so
# that a landing depends on the change, not on the draw; local runs draw new examples each time.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# CI (.ci/run) requires every optional C extension to be built: a test that would skip because one
# "is not built" fails there instead (tests/test_native_extensions.py names the missing one).
REQUIRE_NATIVE = os.environ.get("TILESCOPE_REQUIRE_NATIVE") == "1"


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(assign_tier(item))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_NATIVE and report.skipped and "not built" in str(report.longrepr):
        report.outcome = "failed"
        report.longrepr = f"TILESCOPE_REQUIRE_NATIVE=1 but a native extension is missing: {report.longrepr}"


@contextlib.contextmanager
def _sim_clock(clock: str):
    import tilescope.device

    tilescope.device.register()
    old = tilescope.device.settings().clock
    tilescope.device.configure(clock=clock)
    try:
        yield
    finally:
        tilescope.device.configure(clock=old)


@contextlib.contextmanager
def device_profiler(on: bool):
    """torch.profiler records device activities through the device's Kineto profiler (``on``),
    or tilescope's profiler marks each launch instead (torch without Kineto, CPU-only sessions)."""
    from tilescope.device import _runtime

    was = _runtime._S.device_profiler is not None
    _runtime.use_device_profiler(_runtime._S.native, on)
    try:
        yield
    finally:
        _runtime.use_device_profiler(_runtime._S.native, was)


@pytest.fixture(params=["torch", "markers"])
def device_recorder(request, sim_virtual):
    """Each test runs twice: with device activities recorded by torch itself, and with markers."""
    from tilescope.device import _runtime

    if request.param == "torch" and not _runtime._S.native.profiler_available():
        pytest.skip("this torch has no Kineto: the device cannot hand torch its activities")
    with device_profiler(request.param == "torch"):
        yield request.param


@pytest.fixture(scope="module")
def module_cache_dir(tmp_path_factory):
    """A cache directory of the module's own (TILESCOPE_CACHE_DIR), so cached trace indexes and
    Programs from other tests or earlier runs are never what a test reads."""
    with pytest.MonkeyPatch.context() as mp:
        d = tmp_path_factory.mktemp("cache")
        mp.setenv("TILESCOPE_CACHE_DIR", str(d))
        yield d


@pytest.fixture(scope="module")
def sim_virtual():
    """The sim device on the virtual clock (deterministic modeled times) for one test module."""
    with _sim_clock("virtual"):
        yield


@pytest.fixture(scope="module")
def sim_wall():
    """The sim device on the wall clock (synchronize waits for modeled time) for one test module."""
    with _sim_clock("wall"):
        yield


@pytest.fixture
def sim_fast_dispatch():
    """The device's native dispatch fast path on, with no listener in the way: a tilescope
    profiler another test left open keeps its capture subscribed (each execution then goes
    through Python), so its listeners are set aside for the test and restored after."""
    import tilescope.device as dev
    from tilescope.device import _runtime

    dev.register()
    listeners, recorded = _runtime._S.listeners, _runtime._S.recorded_listeners
    for fn in listeners:
        dev.unsubscribe(fn)
    old = dev.settings().fast_dispatch
    dev.configure(fast_dispatch=True)
    try:
        yield
    finally:
        dev.configure(fast_dispatch=old)
        for fn in listeners:
            dev.subscribe(fn, recorded=fn in recorded)
