"""A tile kernel whose Python loop never ends stops at an instruction limit, with an error at
the loop's line, instead of growing memory for ever."""

import numpy as np
import pytest

import tilescope
import tilescope.lang as tl
from tilescope.errors import KernelError


@tilescope.kernel
def runaway(x):
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm)
    t = tl.load(x)
    while True:  # forgot the exit
        t = t + 1.0  # RUNAWAY
    tl.store(out, t)
    return out


def test_a_loop_that_never_ends_stops_at_the_instruction_limit(monkeypatch):
    monkeypatch.setenv("TILESCOPE_MAX_INSTRUCTIONS", "2000")
    with pytest.raises(KernelError, match=r"traced more than 2,000 instructions, the limit \(TILESCOPE_MAX_INSTRUCTIONS") as info:
        tilescope.simulate(runaway, np.zeros((128, 64), np.float32))
    line = next(k for k, text in enumerate(open(__file__).read().splitlines(), 1) if "# RUNAWAY" in text)
    assert f"test_lang_instruction_limit.py:{line} in runaway" in str(info.value)


def test_the_limit_is_checked_as_a_count(monkeypatch):
    monkeypatch.setenv("TILESCOPE_MAX_INSTRUCTIONS", "lots")
    with pytest.raises(ValueError, match="TILESCOPE_MAX_INSTRUCTIONS='lots'"):
        tilescope.simulate(runaway, np.zeros((128, 64), np.float32))
