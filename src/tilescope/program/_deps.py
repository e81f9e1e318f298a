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

__all__ = ["compute_dependencies", "access_box", "access_boxes", "sweep_reference"]

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
            pools: tuple[list, ...] | list[list] = (self.wide, pool) if pool else (self.wide,)
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


def _template_boxes(cols, t: int, instr, n_keys_slot):
    """Per operand slot of template ``t``: (row_elems, rspan, cspan, itemsize or 0 for HBM,
    reads, writes)."""
    from ._instruction_columns import operands_of

    ops = operands_of(instr)
    reads = {id(ap) for ap in instr.reads()}
    writes = {id(ap) for ap in instr.writes()}
    out = []
    for ap in ops:
        b = cols.kinds[cols.kind[cols.id_of(ap.buffer)]]
        row = b.row_elems or 1
        rspan = cspan = 0
        for stride, count in ap.dims:
            if count > 1 and stride:
                ext = stride * (count - 1)
                if stride % row == 0:
                    rspan += ext // row
                else:
                    cspan += ext
        out.append((row, rspan, cspan, itemsize(b.dtype) if b.memory != "hbm" else 0,
                    id(ap) in reads, id(ap) in writes))
    return out


def access_boxes(program):
    """Every operand's box as arrays ``[n, K]``: key (on-chip: its slot's index; HBM: the
    number of slots + buffer id; -1 past a template's operands), r0, r1, c0, c1 (exclusive
    ends; bytes on chip, elements in HBM), is-read, is-write -- and each slot's aliases."""
    cols = program.columns
    n, width = cols.buf.shape[0], cols.buf.shape[1]
    slot_of, slot_names, aliases = _slots_of(program)
    n_slots = len(slot_names)
    T = len(cols.templates)
    row = np.ones((T, width), dtype=np.int64)
    rsp = np.zeros((T, width), dtype=np.int64)
    csp = np.zeros((T, width), dtype=np.int64)
    isz = np.zeros((T, width), dtype=np.int64)
    rd = np.zeros((T, width), dtype=bool)
    wr = np.zeros((T, width), dtype=bool)
    for t, instr in enumerate(cols.templates):
        for j, (a, b, c, d, e, f) in enumerate(_template_boxes(cols, t, instr, n_slots)):
            row[t, j], rsp[t, j], csp[t, j], isz[t, j], rd[t, j], wr[t, j] = a, b, c, d, e, f
    tm = cols.tmpl[:n]
    B = cols.buf[:n].astype(np.int64)
    O = cols.off[:n]
    R, RS, CS, IS = row[tm], rsp[tm], csp[tm], isz[tm]
    valid = B >= 0
    r0, c0 = np.divmod(O, R)
    wide = (c0 + CS) >= R
    hi = O + RS * R + CS
    r1 = np.where(wide, hi // R + 1, r0 + RS + 1)
    c1 = np.where(wide, R, c0 + CS + 1)
    c0 = np.where(wide, 0, c0)
    onchip = IS > 0
    c0 = np.where(onchip, c0 * IS, c0)
    c1 = np.where(onchip, c1 * IS, c1)
    bsafe = np.where(valid, B, 0)
    key = np.where(onchip, slot_of[bsafe], n_slots + bsafe)
    key = np.where(valid, key, -1)
    return key, r0, r1, c0, c1, rd[tm] & valid, wr[tm] & valid, aliases


def _slots_of(program):
    """Per buffer id its slot index (-1 for HBM); slot names; per slot its aliases' indices."""
    cols = program.columns
    if getattr(program, "_slot_of", None) is not None:
        recs = program._slot_records
        names = [r.name for r in recs]
        index = {nm: k for k, nm in enumerate(names)}
        aliases = [[index[a] for a in r.aliases if a in index] for r in recs]
        return np.asarray(program._slot_of, dtype=np.int64), names, aliases
    slots = list(program.slots.values())
    names = [sl.name for sl in slots]
    index = {nm: k for k, nm in enumerate(names)}
    placement = program.placement
    slot_of = np.array([index.get(placement.get(cols.name(b)), -1) for b in range(cols.n_buffers)], dtype=np.int64)
    aliases = [[index[a] for a in sl.aliases if a in index] for sl in slots]
    return slot_of, names, aliases


def compute_dependencies(program) -> tuple[np.ndarray, np.ndarray]:
    key, r0, r1, c0, c1, rd, wr, aliases = access_boxes(program)
    from . import _fastalloc

    if _fastalloc.native is not None:
        return _fastalloc.native.dependencies(key, r0, r1, c0, c1, rd, wr, aliases)
    return sweep_reference(key, r0, r1, c0, c1, rd, wr, aliases)


def sweep_reference(key, r0, r1, c0, c1, rd, wr, aliases) -> tuple[np.ndarray, np.ndarray]:
    """The dependency sweep over access boxes (the reference of the native one): reads
    depend on live overlapping writes; writes on live overlapping writes and reads, and
    kill the records they cover; a slot's first access depends on every live access of the
    slots whose bytes it reuses."""
    n, width = key.shape
    key_l, r0_l, r1_l, c0_l, c1_l = key.tolist(), r0.tolist(), r1.tolist(), c0.tolist(), c1.tolist()
    rd_l, wr_l = rd.tolist(), wr.tolist()
    writes: dict[int, _Index] = {}
    reads: dict[int, _Index] = {}
    seen: set[int] = set()
    indptr = np.zeros(n + 1, dtype=np.int64)
    flat: list[int] = []
    for i in range(n):
        deps: list[int] = []
        kr, rbox, wbox = key_l[i], [], []
        for j in range(width):
            k = kr[j]
            if k < 0:
                continue
            bx = (k, r0_l[i][j], r1_l[i][j], c0_l[i][j], c1_l[i][j])
            if k not in seen:
                seen.add(k)
                if k < len(aliases):
                    for a in aliases[k]:
                        for index in (writes.get(a), reads.get(a)):
                            if index is not None:
                                deps.extend(rec[4] for rec in index.all if rec[5])
            if rd_l[i][j]:
                rbox.append(bx)
            if wr_l[i][j]:
                wbox.append(bx)
        for k, a, b, c, d in rbox:
            w = writes.get(k)
            if w is not None:
                w.query(a, b, c, d, deps, False)
        for k, a, b, c, d in wbox:
            w = writes.get(k)
            if w is not None:
                w.query(a, b, c, d, deps, True)
            r = reads.get(k)
            if r is not None:
                r.query(a, b, c, d, deps, True)
        for k, a, b, c, d in rbox:
            index = reads.get(k)
            if index is None:
                index = reads[k] = _Index(a, b, c, d)
            index.add([a, b, c, d, i, True])
        for k, a, b, c, d in wbox:
            index = writes.get(k)
            if index is None:
                index = writes[k] = _Index(a, b, c, d)
            index.add([a, b, c, d, i, True])
        if deps:
            if len(deps) > 1:
                deps = sorted(set(deps))
            if deps[-1] == i:
                deps.pop()
            flat.extend(deps)
        indptr[i + 1] = len(flat)
    return indptr, np.asarray(flat, dtype=np.int32)
