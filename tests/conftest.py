"""Fixtures shared by the tests that run on the simulated device."""

import contextlib
import os

import pytest
from hypothesis import settings

# CI runs the property tests on a fixed set of examples (HYPOTHESIS_PROFILE=ci in .ci/run), so
# that a landing depends on the change, not on the draw; local runs draw new examples each time.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


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
