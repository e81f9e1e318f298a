"""tilescope's environment variables: one rule for switches and one for counts, everywhere.

A value that is neither is an error naming the variable, its value and what to write instead
-- never silently read as on (``TILESCOPE_NUMERICS=fasle``) or off.

>>> flag("TILESCOPE_EXAMPLE", False, {"TILESCOPE_EXAMPLE": " Yes "})
True
>>> flag("TILESCOPE_EXAMPLE", True, {"TILESCOPE_EXAMPLE": ""})  # set but empty: the default
True
>>> flag("TILESCOPE_EXAMPLE", False, {"TILESCOPE_EXAMPLE": "sometimes"})
Traceback (most recent call last):
...
ValueError: TILESCOPE_EXAMPLE='sometimes' is neither on nor off; use 1 (or true, yes, on) or 0 (or false, no, off)
>>> count("TILESCOPE_EXAMPLE", None, {"TILESCOPE_EXAMPLE": "4"}, minimum=1)
4
>>> count("TILESCOPE_EXAMPLE", None, {"TILESCOPE_EXAMPLE": "0"}, minimum=1)
Traceback (most recent call last):
...
ValueError: TILESCOPE_EXAMPLE='0' is below its minimum of 1; use an integer of at least 1
"""

from __future__ import annotations

import os
from typing import Mapping

__all__ = ["flag", "count"]

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def flag(name: str, default: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """An on/off variable; ``default`` when unset or empty."""
    value = environ.get(name)
    word = (value or "").strip().lower()
    if not word:
        return default
    if word in ON:
        return True
    if word in OFF:
        return False
    raise ValueError(f"{name}={value!r} is neither on nor off; use 1 (or {', '.join(ON[1:])}) "
                     f"or 0 (or {', '.join(OFF[1:])})")


def count(name: str, default: int | None, environ: Mapping[str, str] = os.environ, *, minimum: int = 0) -> int | None:
    """A whole number of at least ``minimum``; ``default`` when unset or empty."""
    value = environ.get(name)
    if value is None or not value.strip():
        return default
    try:
        number = int(value.strip())
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer; use an integer of at least {minimum}") from None
    if number < minimum:
        raise ValueError(f"{name}={value!r} is below its minimum of {minimum}; use an integer of at least {minimum}")
    return number
