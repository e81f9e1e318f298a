"""The system-level profiler and the profile directory format it writes.

The format is documented in ``docs/profile-format.md``.
"""

from ._format import (
    FORMAT, FORMAT_VERSION, ProfileWriter, executable_name, itrace_json, itrace_name,
    write_kernel_profile,
)
from ._auto import config_from_env, run_script, start_from_env
from ._config import ProfileConfig, ProfileMode, parse_cores
from ._export import Profiler
from ._session import profile
from ._doctor import RULES, Finding, diagnose
from ._reader import IncompleteProfileError, Profile, ProfileFormatError, find_profiles, read_profile

__all__ = [
    "ProfileConfig", "ProfileMode", "Profiler", "profile", "config_from_env", "parse_cores", "load",
    "start_from_env", "run_script", "share",
    "ProfileWriter", "write_kernel_profile", "read_profile", "find_profiles", "Profile",
    "IncompleteProfileError", "ProfileFormatError", "FORMAT", "FORMAT_VERSION",
    "executable_name", "itrace_name", "itrace_json", "diagnose", "Finding", "RULES",
]


def load(path) -> Profile:
    """Read and validate a profile directory; raises IncompleteProfileError if it is not complete."""
    return read_profile(path).require_complete()


from ._share import share  # noqa: E402
