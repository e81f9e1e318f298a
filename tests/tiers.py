"""Test tiers: every test gets one of the markers ``unit``, ``device`` or ``browser`` (pyproject.toml).

- ``unit``: the library alone -- specs, cost tables, the builder, the scheduler, lowerings called as
  functions, tile kernels on the CPU simulator, trace analysis of files on disk;
- ``device``: the simulated PyTorch device ("sim") and its toolchains: eager ops, torch.compile,
  the profiler around them, examples and studies run end to end (each module registers the device
  and its native runtime), GpSimd C++ operators built with the compiler;
- ``browser``: the explorer driven through Chromium (Playwright).

A module's tier comes from ``OVERRIDES`` when listed there, else from what its source uses (the
``sim`` device, Playwright). ``slow`` is separate and stays explicit on the tests it names.
``make test`` runs every tier; ``make test-fast`` runs ``unit and not slow``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

TIERS = ("unit", "device", "browser")

# modules whose source does not say what they run on: why each is in the tier it is
OVERRIDES = {
    "test_device_opinfo.py": "device",  # runs benchmarks/opinfo_sweep.py, PyTorch's OpInfo database on the device
    "test_cpu_path.py": "device",  # profiles a study end to end (the profiler and torch.profiler)
    "test_lang_examples.py": "device",  # runs the examples/ scripts in subprocesses
    "test_nki_run.py": "device",  # `tilescope nki run` in subprocesses, profiles written
    "test_fidelity.py": "device",  # the fidelity harness over every published figure
    "test_cpp_ops.py": "device",  # builds GpSimd C++ operators with g++ (seconds per build)
}

_DEVICE = re.compile(r"""device\s*=\s*["']sim|["']sim["']|tilescope\.device|sim_virtual|sim_wall|documented_loop""")


@functools.cache
def _module_tier(path: str) -> str:
    name = Path(path).name
    if name in OVERRIDES:
        return OVERRIDES[name]
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    if "playwright" in text:
        return "browser"
    return "device" if _DEVICE.search(text) else "unit"


def assign_tier(item):
    """The marker for one collected test: an explicit tier marker wins, else its module's."""
    import pytest

    for tier in TIERS:
        if item.get_closest_marker(tier) is not None:
            return getattr(pytest.mark, tier)
    return getattr(pytest.mark, _module_tier(str(item.fspath)))
