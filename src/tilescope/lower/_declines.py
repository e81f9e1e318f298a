"""Why lowering rules declined calls: counted per (rule, reason), shown by :func:`tilescope.lower.declines`.

A rule that cannot take a call returns None and the next rule (in the end the generic lowering)
takes it, so a decline changes which Program prices the op. A decline that is counted and shown
is a decline a user can question ("why is my softmax generic?"); one that is silent is a slower,
or rougher, model nobody notices. A rule that knows why it declines says so with :func:`note`
just before returning None; any other decline counts as outside the rule's form.

Counts are per distinct call (lowerings are cached: a call seen again is not lowered again).
"""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["OUTSIDE_FORM", "note", "count", "declines", "clear"]

OUTSIDE_FORM = "outside the rule's form"  # shape, stride, dtype or argument the rule does not take

_COUNTS: Counter = Counter()  # (rule, reason) -> distinct calls declined
_PENDING = threading.local()  # the reason a rule noted for the decline it is about to return


def note(reason: str) -> None:
    """Say why the rule running on this thread is about to decline (return None)."""
    _PENDING.reason = reason


def count(rule: str) -> None:
    """``rule`` declined the call being lowered: count it under the reason it noted."""
    reason = getattr(_PENDING, "reason", None) or OUTSIDE_FORM
    _PENDING.reason = None
    _COUNTS[rule, reason] += 1


def declines() -> list[tuple[str, str, int]]:
    """``(rule, reason, calls)`` for every decline since the cache was last cleared, most first."""
    return sorted(((rule, reason, n) for (rule, reason), n in _COUNTS.items()), key=lambda r: (-r[2], r[0], r[1]))


def clear() -> None:
    _COUNTS.clear()
    _PENDING.reason = None
