"""What tilescope's other packages use of the profiler beyond its public API (:mod:`tilescope.profiler`).

The analysis engine and the explorer apply the doctor's generic-share threshold and say where
the profiles under a folder are; the CLI collects the profiler's sub-commands. They import
these from here, never from the profiler's private modules. No stability promise.
"""

from __future__ import annotations

from ._lowering_stats import GENERIC_SHARE_LIMIT
from ._profile_cli import register as register_cli
from ._reader import profiles_inside

__all__ = ["GENERIC_SHARE_LIMIT", "profiles_inside", "register_cli"]
