"""The system-level profiler and the profile directory format it writes.

The format is documented in ``docs/profile-format.md``. Reading profiles (``read_profile``,
``load``, ``diagnose``, ``share``) does not import torch; the capture side (``ProfileConfig``,
``Profiler``, ``profile``, ...) does, on first use.
"""

from ._doctor import RULES, Finding, diagnose
from ._itrace import executable_name, itrace_json, itrace_name
from ._profile_writer import FORMAT, FORMAT_VERSION, ProfileWriter, write_kernel_profile
from ._reader import IncompleteProfileError, Profile, ProfileFormatError, find_profiles, read_profile
from ._share import share

__all__ = [
    "ProfileConfig", "ProfileMode", "Profiler", "profile", "config_from_env", "parse_cores", "load",
    "start_from_env", "run_script", "share",
    "ProfileWriter", "write_kernel_profile", "read_profile", "find_profiles", "Profile",
    "IncompleteProfileError", "ProfileFormatError", "FORMAT", "FORMAT_VERSION",
    "executable_name", "itrace_name", "itrace_json", "diagnose", "Finding", "RULES",
]

# name -> module of the capture side (these import torch)
_LAZY = {
    "ProfileConfig": "._config", "ProfileMode": "._config", "parse_cores": "._config",
    "Profiler": "._export", "profile": "._profile_block",
    "config_from_env": "._auto", "run_script": "._auto", "start_from_env": "._auto",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tilescope.profiler' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def load(path) -> Profile:
    """Read and validate a profile directory; raises IncompleteProfileError if it is not complete."""
    return read_profile(path).require_complete()
