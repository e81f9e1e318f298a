"""Data dependencies of a Program: RAW, WAR and WAW edges on overlapping regions.

Each access becomes a box over its buffer's 2-D view (rows x columns: partitions x
bytes for on-chip slots, rows x elements of the last dimension for HBM tensors).
A strided access is covered by its bounding box, which is conservative: it may add
an edge, never lose one. On-chip regions are keyed by physical slot, so reusing a
rotating buffer yields the write-after-read edge the hardware must honour; a slot
that reuses the address range of an earlier, dead slot depends on that slot's
last accesses.

The result is computed once per Program and stored as CSR arrays, so the
scheduler's inner loop only reads integers.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import itemsize

__all__ = ["compute_dependencies", "access_box"]

_MAX_BINS = 16


def access_box(ap, buffer, slot_name: str | None) -> tuple:
    """``(key, r0, r1, c0, c1)`` with exclusive upper bounds."""
    cols = buffer.row_elems or 1
    r0, c0 = divmod(ap.offset, cols)
    rspan = cspan = 0
    for stride, count in ap.dims:
        if count > 1 and stride:
            ext = stride * (count - 1)
            if stride % cols == 0:
                rspan += ext // cols
            else:
                cspan += ext
    if c0 + cspan >= cols:
        hi = ap.offset + rspan * cols + cspan
        r1, c0, c1 = hi // cols + 1, 0, cols
    else:
        r1, c1 = r0 + rspan + 1, c0 + cspan + 1
    if slot_name is not None:
        isz = itemsize(buffer.dtype)
        return (slot_name, r0, r1, c0 * isz, c1 * isz)
    return (ap.buffer, r0, r1, c0, c1)


class _Index:
    """Records ``[r0, r1, c0, c1, idx, alive]`` on one key, binned on a coarse grid.

    The grid's cell is the first access's box, so the tiles of a tiled loop land
    one per cell and a query looks at a handful of records.
    """

    __slots__ = ("bins", "br", "bc", "wide", "all", "dead")

    def __init__(self, r0, r1, c0, c1):
        self.br = max(1, r1 - r0)
        self.bc = max(1, c1 - c0)
        self.bins: dict[tuple[int, int], list] = {}
        self.wide: list = []
        self.all: list = []
        self.dead = 0

    def add(self, rec) -> None:
        self.all.append(rec)
        br, bc = self.br, self.bc
        a, b = rec[0] // br, (rec[1] - 1) // br
        c, d = rec[2] // bc, (rec[3] - 1) // bc
        if a == b and c == d:
            pool = self.bins.get((a, c))
            if pool is None:
                self.bins[(a, c)] = [rec]
            else:
                pool.append(rec)
        elif (b - a + 1) * (d - c + 1) > _MAX_BINS:
            self.wide.append(rec)
        else:
            for x in range(a, b + 1):
                for y in range(c, d + 1):
                    self.bins.setdefault((x, y), []).append(rec)

    def query(self, r0, r1, c0, c1, out: list, kill: bool) -> None:
        """Append the index of every live record overlapping the box to ``out``.

        With ``kill`` (the box is a write), records it fully covers die: later
        accesses overlapping them overlap this write and depend on it, hence
        transitively on them.
        """
        br, bc = self.br, self.bc
        a, b = r0 // br, (r1 - 1) // br
        c, d = c0 // bc, (c1 - 1) // bc
        if a == b and c == d:
            pool = self.bins.get((a, c))
            pools = (self.wide, pool) if pool else (self.wide,)
        elif (b - a + 1) * (d - c + 1) > _MAX_BINS:
            pools = (self.all,)
        else:
            pools = [self.wide] + [self.bins[(x, y)] for x in range(a, b + 1)
                                   for y in range(c, d + 1) if (x, y) in self.bins]
        for pool in pools:
            dead = 0
            for rec in pool:
                if not rec[5]:
                    dead += 1
                elif rec[0] < r1 and r0 < rec[1] and rec[2] < c1 and c0 < rec[3]:
                    out.append(rec[4])
                    if kill and r0 <= rec[0] and rec[1] <= r1 and c0 <= rec[2] and rec[3] <= c1:
                        rec[5] = False
                        self.dead += 1
            if dead > 8 and dead * 2 > len(pool):
                pool[:] = [r for r in pool if r[5]]
        if self.dead > 32 and self.dead * 2 > len(self.all):
            self.all = [r for r in self.all if r[5]]
            self.dead = 0


def compute_dependencies(program) -> tuple[np.ndarray, np.ndarray]:
    buffers = program.buffers
    placement = program.placement
    slots = program.slots
    box_cache: dict[int, tuple] = {}
    writes: dict[str, _Index] = {}
    reads: dict[str, _Index] = {}
    seen_keys: set[str] = set()

    def boxes(aps):
        out = []
        for ap in aps:
            b = box_cache.get(id(ap))  # instructions keep their APs alive: ids are stable here
            if b is None:
                b = box_cache[id(ap)] = access_box(ap, buffers[ap.buffer], placement.get(ap.buffer))
            out.append(b)
        return out

    indptr = np.zeros(len(program.instructions) + 1, dtype=np.int64)
    flat: list[int] = []
    for i, instr in enumerate(program.instructions):
        deps: list[int] = []
        rboxes = boxes(instr.reads())
        wboxes = boxes(instr.writes())
        for bx in rboxes + wboxes:
            key = bx[0]
            if key not in seen_keys:
                seen_keys.add(key)
                slot = slots.get(key)
                if slot is not None:
                    for alias in slot.aliases:
                        for index in (writes.get(alias), reads.get(alias)):
                            if index is not None:
                                deps.extend(rec[4] for rec in index.all if rec[5])
        for key, r0, r1, c0, c1 in rboxes:
            w = writes.get(key)
            if w is not None:
                w.query(r0, r1, c0, c1, deps, False)
        for key, r0, r1, c0, c1 in wboxes:
            w = writes.get(key)
            if w is not None:
                w.query(r0, r1, c0, c1, deps, True)
            r = reads.get(key)
            if r is not None:
                r.query(r0, r1, c0, c1, deps, True)
        for key, r0, r1, c0, c1 in rboxes:
            index = reads.get(key)
            if index is None:
                index = reads[key] = _Index(r0, r1, c0, c1)
            index.add([r0, r1, c0, c1, i, True])
        for key, r0, r1, c0, c1 in wboxes:
            index = writes.get(key)
            if index is None:
                index = writes[key] = _Index(r0, r1, c0, c1)
            index.add([r0, r1, c0, c1, i, True])
        if deps:
            if len(deps) > 1:
                deps = sorted(set(deps))
            if deps[-1] == i:
                deps.pop()
            flat.extend(deps)
        indptr[i + 1] = len(flat)
    return indptr, np.asarray(flat, dtype=np.int32)
