"""The native hot loops of building a Program, if built (else ``native`` is None).

``native`` wraps the C extension ``tilescope.program._native`` when it is built: the same
allocation sweep (:func:`tilescope.program._alloc.place_reference`) and dependency sweep
(:func:`tilescope.program._deps.sweep_reference`) as the Python references, which the
tests compare it with. ``TILESCOPE_NATIVE=0`` uses the references, as does a build older than
the source (``VERSION``).
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["native"]


class _Native:
    def __init__(self, c):
        self.c = c

    def place(self, first, last, nbytes, site, bufs, capacity: int, align: int, policy: int = 0):
        a = [np.ascontiguousarray(x, dtype=np.int64) for x in (first, last, nbytes, site, bufs)]
        addr, fail = self.c.place(*a, int(capacity), int(align), int(policy))
        if fail is not None:
            return None, (fail[0], sorted(fail[1]))
        return np.frombuffer(addr, dtype=np.int64).copy(), None

    def group_slots(self, first, last, addr, nbytes, site, parts):
        """As :func:`tilescope.program._alloc.group_slots`, in arrays: (slot of each tile,
        slot fields (site, per-site number, addr, nbytes, partitions, start, end), alias CSR)."""
        a = [np.ascontiguousarray(x, dtype=np.int64) for x in (first, last, addr, nbytes, site, parts)]
        out = self.c.group_slots(*a)
        return tuple(np.frombuffer(x, dtype=np.int64) for x in out)

    def dependencies(self, key, r0, r1, c0, c1, rd, wr, aliases):
        n, width = key.shape
        nkeys = int(key.max()) + 1 if key.size else 0
        nkeys = max(nkeys, len(aliases))
        ptr = np.zeros(len(aliases) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(a) for a in aliases]) if aliases else []
        idx = np.asarray([x for a in aliases for x in a], dtype=np.int64)
        arrs = [np.ascontiguousarray(x, dtype=np.int64) for x in (key, r0, r1, c0, c1)]
        bools = [np.ascontiguousarray(x, dtype=np.bool_) for x in (rd, wr)]
        indptr, indices = self.c.dependencies(n, width, nkeys, *arrs, *bools, ptr, idx)
        return np.frombuffer(indptr, dtype=np.int64).copy(), np.frombuffer(indices, dtype=np.int32).copy()


native: _Native | None
try:
    if os.environ.get("TILESCOPE_NATIVE", "1") == "0":
        raise ImportError
    from . import _native as _c

    if getattr(_c, "VERSION", 1) < 2:  # built from an older source: its place() differs
        raise ImportError
    native = _Native(_c)
except ImportError:  # not built (no compiler at install time), or switched off
    native = None
