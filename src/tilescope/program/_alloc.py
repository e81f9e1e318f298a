"""On-chip memory allocation: live ranges, addresses picked as NKI's allocator does, spills to HBM.

Every tile the builder makes is a new logical buffer, live from the first instruction
that touches it to the last. Allocation gives each tile an address for exactly that
range -- per loop iteration, not for the whole loop -- as a compiler's allocator does:

1. **Tiles in order of first use**, each at a free address range when it becomes live
   (SBUF 64-byte aligned, PSUM in whole 2 KiB banks); a tile's range frees after its last
   use. Reuse of an address orders the instructions that touch it (the dependencies are
   physical): a load into a reused address waits for the compute that read the tile
   there before.
2. **Which free range**: the modes of NKI's allocator (``nki.compiler.AllocationMode``,
   documented in the NKI API reference), in :data:`MODES`:

   ========== ===================================================================================
   ``ring``   (default) a fresh address for each tile: the next free range at or after the end
              of the last one taken, wrapping to the start of the memory only when none is
              left, so freed memory is reused only after the allocation wraps around. A
              loop's iterations then overlap as far as the memory lets them: a tile's address
              comes back after (capacity / bytes allocated per iteration) iterations, not after
              a fixed count. In PSUM it rotates through the banks.
   ``max_reuse`` the free range that fits the tile best (the smallest; lowest address on
              ties): the least memory, and the least overlap of loads and compute.
   ========== ===================================================================================

   A site (a source line, a named site) made with an explicit ``bufs=N`` instead
   rotates its tiles over N addresses of its own (NKI's ``mod_alloc`` with N free tiles),
   while they are free; a busy one is replaced by the mode's choice.
3. **Spills.** When no free range fits a tile, a live SBUF tile that is not in use at
   that instruction -- the one whose next use is furthest away -- is stored to an HBM
   scratch tensor after its last use so far and loaded back (as a new tile) just before
   its next use: two DMAs on the timeline, labelled ``spill`` / ``reload``. PSUM cannot
   spill (DMA does not reach it), and with ``spill=False`` nothing does: then a
   :class:`~tilescope.errors.CapacityError` lists the live tiles by site.

A *slot* is one address kept by one site for a run of its tiles with nothing else at
that address in between (its members); slots are what executables record.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from ..errors import CapacityError
from ..isa import DmaCopy
from ._program import Buffer, Slot

__all__ = ["allocate", "allocate_columns", "liveness", "Allocation", "SBUF_ALIGN", "MODES"]

SBUF_ALIGN = 64
MODES = ("ring", "max_reuse")  # how a tile's free range is chosen (module docs); index = native policy code


def _mode_code(mode: str) -> int:
    if mode not in MODES:
        raise ValueError(f"allocation mode {mode!r} is not one of {', '.join(MODES)}")
    return MODES.index(mode)


def liveness(instructions) -> tuple[dict[str, int], dict[str, int]]:
    """First and last instruction index touching each buffer."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, instr in enumerate(instructions):
        for ap in instr.reads() + instr.writes():
            b = ap.buffer
            if b not in first:
                first[b] = i
            last[b] = i
    return first, last


@dataclass
class Allocation:
    """The result: slots and placement, and what spilling changed (if it did)."""

    slots: list[Slot]
    placement: dict[str, str]  # tile -> slot name
    instructions: list | None = None  # with spill DMAs inserted and operands renamed (None: unchanged)
    origin: list[int] | None = None  # per new instruction: its index before, or -1-2k / -2-2k (spill k's store / reload)
    spills: list[dict] = field(default_factory=list)  # one record per spilled tile
    buffers: list[Buffer] = field(default_factory=list)  # tiles reloaded and HBM scratch of spills


@dataclass
class _Tile:
    name: str
    buf: Buffer
    memory: str
    site: str
    nbytes: int  # per partition, aligned (PSUM: whole banks)
    bufs: int
    uses: list  # positions, sorted: (instruction index, sub-position)
    addr: int = -1
    origin: str = ""  # the tile this one reloads (spilled), else its own name


class _Free:
    """Free byte ranges ``[lo, hi)`` of one memory, sorted and merged; next-fit cursor."""

    __slots__ = ("ranges", "cursor", "capacity", "align")

    def __init__(self, capacity: int, align: int):
        self.ranges = [[0, capacity]]
        self.cursor = 0
        self.capacity = capacity
        self.align = align

    def is_free(self, lo: int, n: int) -> bool:
        for a, b in self.ranges:
            if a <= lo and lo + n <= b:
                return True
            if a > lo:
                break
        return False

    def next_fit(self, n: int) -> int | None:
        for a, b in self.ranges:  # at or after the cursor
            start = max(a, self.cursor)
            if start + n <= b:
                return start
        for a, b in self.ranges:  # wrapped around
            if a + n <= b:
                return a
        return None

    def best_fit(self, n: int) -> int | None:
        """The start of the smallest free range that holds ``n`` (the lowest on ties)."""
        best, size = None, None
        for a, b in self.ranges:
            if b - a >= n and (size is None or b - a < size):
                best, size = a, b - a
        return best

    def pick(self, n: int, policy: int) -> int | None:
        return self.next_fit(n) if policy == 0 else self.best_fit(n)

    def take(self, lo: int, n: int) -> None:
        hi = lo + n
        for k, (a, b) in enumerate(self.ranges):
            if a <= lo and hi <= b:
                parts = [r for r in ([a, lo], [hi, b]) if r[1] > r[0]]
                self.ranges[k:k + 1] = parts
                self.cursor = -(-hi // self.align) * self.align
                return
        raise AssertionError(f"range [{lo}, {hi}) is not free")

    def give(self, lo: int, n: int) -> None:
        hi = lo + n
        r = self.ranges
        k = 0
        while k < len(r) and r[k][0] < lo:
            k += 1
        r.insert(k, [lo, hi])
        if k + 1 < len(r) and r[k][1] == r[k + 1][0]:  # merge right
            r[k][1] = r[k + 1][1]
            del r[k + 1]
        if k > 0 and r[k - 1][1] == r[k][0]:  # merge left
            r[k - 1][1] = r[k][1]
            del r[k]


def _after(pos):
    """A position just after ``pos`` (before the next original instruction)."""
    i, s = pos
    return (i, s + (1.0 - s) / 2)


def _before(pos):
    i, s = pos
    return (i, s - (1.0 + s) / 2)


def allocate(buffers: dict[str, Buffer], instructions, spec, *, describe_site=None, spill: bool = False,
             mode: str = "ring", shrink_rotation: bool = False, report: dict | None = None) -> Allocation:
    """Assign every used on-chip buffer an address, spilling SBUF tiles to HBM if allowed.

    ``mode`` picks free ranges (one of :data:`MODES`, module docs);
    ``describe_site(site) -> str`` words allocation sites in capacity errors.
    (``shrink_rotation`` and ``report`` are accepted for old callers: rotation is always a
    preference now.)
    """
    from ._instruction_columns import operands_of

    uses: dict[str, list] = {}
    for i, instr in enumerate(instructions):
        for ap in operands_of(instr):  # (operand order decides ties: as allocate_columns)
            lst = uses.get(ap.buffer)
            if lst is None:
                uses[ap.buffer] = [(i, 0.0)]
            elif lst[-1][0] != i:
                lst.append((i, 0.0))
    tiles = []
    for name, lst in uses.items():
        b = buffers[name]
        if b.memory == "hbm":
            continue
        nbytes = b.bytes_per_partition
        if b.memory == "psum":  # whole banks (a tile may span several)
            nbytes = -(-nbytes // spec.psum_bank_bytes) * spec.psum_bank_bytes
        else:
            nbytes = -(-nbytes // SBUF_ALIGN) * SBUF_ALIGN
        tiles.append(_Tile(name, b, b.memory, b.site or name, nbytes, max(0, b.bufs), lst, origin=name))
    tiles.sort(key=lambda t: t.uses[0])
    state = _Run(spec, describe_site, spill, _mode_code(mode))
    for memory, capacity, align in (("sbuf", spec.sbuf_bytes_per_partition, SBUF_ALIGN),
                                    ("psum", spec.psum_bytes_per_partition, spec.psum_bank_bytes)):
        state.run([t for t in tiles if t.memory == memory], memory, capacity, align)
    return state.result(instructions, buffers)


class _Run:
    """One allocation: the sweep over tiles, spills, and the slots it leaves."""

    def __init__(self, spec, describe_site, spill: bool, policy: int = 0):
        self.spec = spec
        self.policy = policy
        self.describe_site = describe_site
        self.spill = spill
        self.placed: list[_Tile] = []
        self.spills: list[tuple[_Tile, _Tile, tuple, tuple]] = []  # (victim, reloaded, store pos, reload pos)
        self.new_buffers: list[Buffer] = []
        self._names: set[str] = set()

    def run(self, tiles: list[_Tile], memory: str, capacity: int, align: int) -> None:
        free = _Free(capacity, align)
        heap = [(t.uses[0], k, t) for k, t in enumerate(tiles)]
        heapq.heapify(heap)
        seq = len(tiles)
        active: list = []  # heap of (last use, seq, tile)
        rings: dict[str, list[int]] = {}
        turn: dict[str, int] = {}
        while heap:
            start, _, t = heapq.heappop(heap)
            while active and active[0][0] < start:
                _, _, dead = heapq.heappop(active)
                free.give(dead.addr, dead.nbytes)
            addr = self._place(t, free, rings, turn, self.policy)
            while addr is None:
                victim = self._victim(active, start) if (self.spill and memory == "sbuf") else None
                if victim is None:
                    raise self._error(memory, t, [a[2] for a in active], capacity)
                reloaded = self._spill(victim, start)
                active = [a for a in active if a[2] is not victim]
                heapq.heapify(active)
                free.give(victim.addr, victim.nbytes)
                seq += 1
                heapq.heappush(heap, (reloaded.uses[0], seq, reloaded))
                addr = self._place(t, free, rings, turn, self.policy)
            t.addr = addr
            free.take(addr, t.nbytes)
            seq += 1
            heapq.heappush(active, (t.uses[-1], seq, t))
            self.placed.append(t)

    @staticmethod
    def _place(t: _Tile, free: _Free, rings: dict, turn: dict, policy: int) -> int | None:
        if t.bufs <= 0:  # no site ring: the mode's choice
            return free.pick(t.nbytes, policy)
        ring = rings.setdefault(t.site, [])
        if len(ring) >= t.bufs:
            k = turn.get(t.site, 0)
            turn[t.site] = k + 1
            want = ring[k % t.bufs]
            if free.is_free(want, t.nbytes):
                return want
            addr = free.pick(t.nbytes, policy)
            if addr is not None:
                ring[k % t.bufs] = addr
            return addr
        addr = free.pick(t.nbytes, policy)
        if addr is not None:
            ring.append(addr)
        return addr

    @staticmethod
    def _victim(active, at) -> _Tile | None:
        """The live tile not used at ``at`` whose next use is furthest away (Belady)."""
        best, best_next = None, None
        for _, _, t in active:
            nxt = None
            for u in t.uses:
                if u >= at:
                    nxt = u
                    break
            if nxt is None or nxt == at or t.uses[0] >= at:
                continue
            if best is None or nxt > best_next:
                best, best_next = t, nxt
        return best

    def _name(self, base: str) -> str:
        k = 1
        name = f"{base}.reload"
        while name in self._names:
            k += 1
            name = f"{base}.reload{k}"
        self._names.add(name)
        return name

    def _spill(self, v: _Tile, at) -> _Tile:
        before = [u for u in v.uses if u < at]
        after = [u for u in v.uses if u > at]
        store, reload = _after(before[-1]), _before(after[0])
        b = Buffer(self._name(v.name), v.buf.memory, v.buf.shape, v.buf.dtype, v.buf.role, v.buf.site, v.buf.bufs)
        self.new_buffers.append(b)
        r = _Tile(b.name, b, v.memory, v.site, v.nbytes, v.bufs, [reload] + after, origin=v.origin)
        v.uses = before + [store]
        self.spills.append((v, r, store, reload))
        return r

    def _error(self, memory: str, s: _Tile, live: list, capacity: int) -> CapacityError:
        spec = self.spec
        live = live + [s]
        need = sum(a.nbytes for a in live)
        by_site: dict[str, list] = {}
        for a in live:
            by_site.setdefault(a.site, []).append(a)
        rows = sorted(by_site.items(), key=lambda kv: -sum(a.nbytes for a in kv[1]))
        listing = "; ".join(
            f"{self.describe_site(site) if self.describe_site else site}: {len(g)} x {g[0].nbytes / 1024:g} KiB"
            for site, g in rows[:6])
        unit = "banks" if memory == "psum" else "KiB per partition"
        if memory == "psum":
            need_s, cap_s = f"{need // spec.psum_bank_bytes} {unit}", f"{capacity // spec.psum_bank_bytes} {unit}"
            fix = "fewer live PSUM tiles (accumulate, then copy out to SBUF before starting the next)"
        else:
            need_s, cap_s = f"{need / 1024:g} {unit}", f"{capacity / 1024:g} {unit}"
            fix = "smaller tiles or shorter tile lifetimes (a site given bufs=N keeps N addresses: fewer)"
            if not self.spill:
                fix += (" -- or let the allocator spill to HBM (tilescope.kernel(spill=True); nki.jit without "
                        "strict=True)")
        at = s.uses[0][0]
        err = CapacityError(
            f"{memory.upper()} capacity exceeded at instruction #{at}: live tiles need {need_s}, "
            f"the limit is {cap_s} on {spec.name}. Live tiles by allocation site: {listing}. Fix: {fix}")
        err.instruction, err.site = at, s.site
        return err

    # ---- the result --------------------------------------------------------------------------
    def result(self, instructions, buffers) -> Allocation:
        new_instructions = origin = None
        scratch: list[Buffer] = []
        records: list[dict] = []
        index_of = None
        if self.spills:
            new_instructions, origin, index_of, scratch, records = self._rewrite(instructions)
        slots, placement = self._slots(index_of)
        return Allocation(slots, placement, new_instructions, origin, records, self.new_buffers + scratch)

    def _rewrite(self, instructions):
        """The instruction list with each spill's store and reload DMAs inserted and the
        operands of later uses renamed to the reloaded tile."""
        import dataclasses

        rename: dict[tuple[int, str], str] = {}
        for t in self.placed:
            if t.name != t.origin:
                for i, s in t.uses:
                    if s == 0.0:
                        rename[(i, t.origin)] = t.name
        inserted = []  # (position, instruction, origin code: -1 - 2k store / -2 - 2k reload of spill k)
        scratch, records = [], []
        for k, (v, r, store, reload) in enumerate(self.spills):
            hb = Buffer(f"spill.{v.name}", "hbm", v.buf.shape, v.buf.dtype, "scratch")
            scratch.append(hb)
            inserted.append((store, DmaCopy(hb.full(), v.buf.full()), -1 - 2 * k))
            inserted.append((reload, DmaCopy(r.buf.full(), hb.full()), -2 - 2 * k))
            records.append({"tile": v.origin, "spilled": v.name, "reloaded_as": r.name, "site": v.site,
                            "kib_per_partition": v.nbytes / 1024})
        positions = [(i, 0.0) for i in range(len(instructions))]
        out, origin, index_of = [], [], {}
        items = sorted([(p, 0, i, None) for i, p in enumerate(positions)] +
                       [(p, 1, code, ins) for p, ins, code in inserted], key=lambda x: (x[0], x[1]))
        for pos, kind, k, ins in items:
            index_of[pos] = len(out)
            if kind == 0:
                instr = instructions[k]
                names = {ap.buffer for ap in instr.reads() + instr.writes()}
                repl = {n: rename[(k, n)] for n in names if (k, n) in rename}
                if repl:
                    instr = _renamed(instr, repl, dataclasses)
                out.append(instr)
                origin.append(k)
            else:
                out.append(ins)
                origin.append(k)
        for rec, (_v, _r, store, reload) in zip(records, self.spills):
            rec["stored_at"] = index_of[store]
            rec["reloaded_at"] = index_of[reload]
        return out, origin, index_of, scratch, records

    def _slots(self, index_of) -> tuple[list[Slot], dict[str, str]]:
        """Slots: runs of one site's tiles at one address with nothing else there in between."""
        def idx(pos):
            return index_of[pos] if index_of is not None else pos[0]

        slots: list[dict] = []
        placement: dict[str, str] = {}
        counters: dict[tuple[str, str], int] = {}
        for memory in ("sbuf", "psum"):
            tiles = sorted((t for t in self.placed if t.memory == memory), key=lambda t: t.uses[0])
            open_slots: list[dict] = []
            occupants = _Occupants()  # which slot last held each byte range
            for t in tiles:
                lo, hi = t.addr, t.addr + t.nbytes
                start, end = idx(t.uses[0]), idx(t.uses[-1])
                mine = None
                for s in open_slots:
                    if s["site"] == t.site and s["addr"] == lo and s["nbytes"] >= t.nbytes:
                        mine = s
                        break
                closed = [s for s in open_slots if s is not mine and s["addr"] < hi and lo < s["addr"] + s["nbytes"]]
                if closed:
                    open_slots = [s for s in open_slots if s not in closed]
                if mine is None:
                    key = (memory, t.site)
                    n = counters.get(key, 0)
                    counters[key] = n + 1
                    name = f"{memory}:{t.site}#{n}"
                    previous = occupants.claim(lo, hi, name)  # the slots whose bytes this one reuses
                    mine = {"name": name, "memory": memory, "addr": lo, "nbytes": t.nbytes,
                            "partitions": t.buf.shape[0], "start": start, "end": end, "site": t.site,
                            "members": [], "aliases": previous}
                    slots.append(mine)
                    open_slots.append(mine)
                mine["end"] = max(mine["end"], end)
                mine["partitions"] = max(mine["partitions"], t.buf.shape[0])
                mine["members"].append(t.name)
                placement[t.name] = mine["name"]
        return [Slot(s["name"], s["memory"], s["addr"], s["nbytes"], s["partitions"], s["start"], s["end"], s["site"],
                     tuple(s["members"]), tuple(s["aliases"])) for s in slots], placement


class _Occupants:
    """Byte ranges of one memory and the slot that last held each (for aliases)."""

    __slots__ = ("segs",)

    def __init__(self):
        self.segs: list[list] = []  # [lo, hi, slot name], sorted, disjoint

    def claim(self, lo: int, hi: int, name: str) -> list[str]:
        """Give ``[lo, hi)`` to ``name``; returns the slots that held any of it before."""
        previous, kept = [], []
        for a, b, owner in self.segs:
            if b <= lo or hi <= a:
                kept.append([a, b, owner])
                continue
            if owner not in previous:
                previous.append(owner)
            if a < lo:
                kept.append([a, lo, owner])
            if hi < b:
                kept.append([hi, b, owner])
        kept.append([lo, hi, name])
        kept.sort()
        self.segs = kept
        return previous


def _renamed(instr, repl: dict[str, str], dataclasses):
    """``instr`` with the buffers of its operands renamed (APs inside tuples too)."""
    from ..isa import AP

    changes: dict[str, object] = {}
    for f in dataclasses.fields(instr):
        v = getattr(instr, f.name)
        if v.__class__ is AP and v.buffer in repl:
            changes[f.name] = AP(repl[v.buffer], v.dtype, v.offset, v.dims)
        elif v.__class__ is tuple and any(x.__class__ is AP and x.buffer in repl for x in v):
            changes[f.name] = tuple(AP(repl[x.buffer], x.dtype, x.offset, x.dims)
                                    if x.__class__ is AP and x.buffer in repl else x for x in v)
    return dataclasses.replace(instr, **changes)


# ---- the same allocation on a Program's columns (no objects; spills fall back above) ------------

def allocate_columns(cols, spec, *, describe_site=None, spill: bool = False, mode: str = "ring"):
    """:func:`allocate` on :class:`~tilescope.program._instruction_columns.Columns`: returns
    ``(slots, slot_of)`` -- the Slot records and, per buffer id, its slot's index (-1 for HBM
    and unused buffers) -- or None when the tiles do not fit and ``spill`` asks for the
    object path (which spills). Without ``spill``, a CapacityError as :func:`allocate` raises."""
    nb = cols.n_buffers
    B = cols.buf
    mask = B >= 0
    flat_ids = B[mask]
    flat_rows = np.nonzero(mask)[0]
    occ = np.arange(len(flat_ids))
    first_occ = np.full(nb, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_occ, flat_ids, occ)
    last = np.full(nb, -1, dtype=np.int64)
    np.maximum.at(last, flat_ids, flat_rows)
    used = last >= 0
    mem_of_kind = np.array([{"hbm": 0, "sbuf": 1, "psum": 2}[k.memory] for k in cols.kinds], dtype=np.int8)
    memory = mem_of_kind[cols.kind] if nb else np.zeros(0, np.int8)
    slot_of = np.full(nb, -1, dtype=np.int64)
    slots: list = []
    ids_all = np.nonzero(used & (memory > 0))[0]
    if len(ids_all) == 0:
        return slots, slot_of
    order = ids_all[np.argsort(first_occ[ids_all], kind="stable")]
    first = flat_rows[first_occ[order]]
    kinds = cols.kinds
    kind = cols.kind[order]
    bank = spec.psum_bank_bytes
    per_kind_bytes = np.array([k.bytes_per_partition for k in kinds], dtype=np.int64)
    nbytes_raw = per_kind_bytes[kind]
    mem = memory[order]
    nbytes = np.where(mem == 2, -(-nbytes_raw // bank) * bank, -(-nbytes_raw // SBUF_ALIGN) * SBUF_ALIGN)
    site_ids: dict = {}
    kind_site = np.array([site_ids.setdefault(k.site, len(site_ids)) if k.site else -1 for k in kinds],
                         dtype=np.int64)
    site = kind_site[kind]
    for t in np.nonzero(site < 0)[0].tolist():  # a tile without a site: its own
        site[t] = site_ids.setdefault(cols.name(int(order[t])), len(site_ids))
    site_names = list(site_ids)
    bufs = np.array([max(0, k.bufs) for k in kinds], dtype=np.int64)[kind]
    policy = _mode_code(mode)
    parts = np.array([k.shape[0] for k in kinds], dtype=np.int64)[kind]
    lasts = last[order]
    addr = np.full(len(order), -1, dtype=np.int64)
    for code, name, capacity, align in ((1, "sbuf", spec.sbuf_bytes_per_partition, SBUF_ALIGN),
                                        (2, "psum", spec.psum_bytes_per_partition, bank)):
        sel = np.nonzero(mem == code)[0]
        if not len(sel):
            continue
        got, fail = place(first[sel], lasts[sel], nbytes[sel], site[sel], bufs[sel], capacity, align, policy)
        if fail is not None:
            if spill and name == "sbuf":
                return None
            t_fail, live = sel[fail[0]], sel[np.asarray(fail[1], dtype=np.int64)]
            raise _columns_error(name, t_fail, live, first, nbytes, site_names, site, capacity, spec, describe_site,
                                 spill)
        addr[sel] = got
    for code, name in ((1, "sbuf"), (2, "psum")):
        sel = np.nonzero(mem == code)[0]
        if not len(sel):
            continue
        base = len(slots)
        of, fields, aliases = slot_arrays(first[sel], lasts[sel], addr[sel], nbytes[sel], site[sel], parts[sel])
        slot_of[order[sel]] = base + of
        members = np.argsort(of, kind="stable")
        bounds = np.searchsorted(of[members], np.arange(len(fields[0]) + 1))
        st, num, ad, nb_, pa, s0, s1 = (f.tolist() for f in fields)
        for k in range(len(st)):
            sname = site_names[st[k]]
            mem_ids = order[sel[members[bounds[k]:bounds[k + 1]]]].tolist()
            slots.append(_SlotRec(f"{name}:{sname}#{num[k]}", name, ad[k], nb_[k], pa[k], s0[k], s1[k], sname,
                                  mem_ids, aliases[k]))
        names_here = [slots[base + k].name for k in range(len(st))]
        for k in range(len(st)):
            slots[base + k].aliases = [names_here[a] for a in slots[base + k].aliases]
    return slots, slot_of


def slot_arrays(first, last, addr, nbytes, site, parts):
    """:func:`group_slots` as arrays: the slot of each tile, the slots' fields (site, per-site
    number, addr, nbytes, partitions, start, end) and each slot's aliases (slot indices)."""
    from . import _fastalloc

    if _fastalloc.native is not None:
        out = _fastalloc.native.group_slots(first, last, addr, nbytes, site, parts)
        of, fields, ptr, idx = out[0], out[1:8], out[8], out[9]
        return of, fields, [idx[ptr[k]:ptr[k + 1]].tolist() for k in range(len(ptr) - 1)]
    of = np.empty(len(first), dtype=np.int64)
    recs = []
    for rec, members in group_slots(first, last, addr, nbytes, site, parts):
        of[members] = len(recs)
        recs.append(rec)
    index = {(r["site"], r["n"]): k for k, r in enumerate(recs)}
    fields = tuple(np.array([r[f] for r in recs], dtype=np.int64)
                   for f in ("site", "n", "addr", "nbytes", "partitions", "start", "end"))
    return of, fields, [[index[a] for a in r["aliases"]] for r in recs]


@dataclass
class _SlotRec:
    """A Slot with members as buffer ids and aliases as slot names, made into Slot records
    (names) by the Program when it needs them."""

    name: str
    memory: str
    addr: int
    nbytes: int
    partitions: int
    start: int
    end: int
    site: str
    members: list
    aliases: list

    def slot(self, name_of) -> Slot:
        return Slot(self.name, self.memory, self.addr, self.nbytes, self.partitions, self.start, self.end, self.site,
                    tuple(name_of(b) for b in self.members), tuple(self.aliases))


def _columns_error(memory, t, live, first, nbytes, site_names, site, capacity, spec, describe_site, spill):
    class _T:  # the fields _Run._error reads
        def __init__(self, k):
            self.nbytes, self.site, self.uses = int(nbytes[k]), site_names[site[k]], [(int(first[k]), 0.0)]

    run = _Run(spec, describe_site, spill)
    return run._error(memory, _T(t), [_T(k) for k in live], capacity)


def place(first, last, nbytes, site, bufs, capacity: int, align: int, policy: int = 0):
    """Addresses of tiles (in order of first use) as :meth:`_Run.run` gives them without spills:
    ``(addr, None)``, or ``(None, (failing tile, live tiles))``. ``bufs`` <= 0: no site ring;
    ``policy``: the index of the mode in :data:`MODES`."""
    from . import _fastalloc

    if _fastalloc.native is not None:
        return _fastalloc.native.place(first, last, nbytes, site, bufs, capacity, align, policy)
    return place_reference(first, last, nbytes, site, bufs, capacity, align, policy)


def place_reference(first, last, nbytes, site, bufs, capacity: int, align: int, policy: int = 0):
    first, last, nbytes = first.tolist(), last.tolist(), nbytes.tolist()
    site, bufs = site.tolist(), bufs.tolist()
    free = _Free(capacity, align)
    active: list = []
    rings: dict[int, list[int]] = {}
    turn: dict[int, int] = {}
    addr = [-1] * len(first)
    for t in range(len(first)):
        start = first[t]
        while active and active[0][0] < start:
            _, _, dead = heapq.heappop(active)
            free.give(addr[dead], nbytes[dead])
        st, n = site[t], nbytes[t]
        a = None
        if bufs[t] <= 0:
            a = free.pick(n, policy)
        else:
            ring = rings.setdefault(st, [])
            if len(ring) >= bufs[t]:
                k = turn.get(st, 0)
                turn[st] = k + 1
                want = ring[k % bufs[t]]
                if free.is_free(want, n):
                    a = want
                else:
                    a = free.pick(n, policy)
                    if a is not None:
                        ring[k % bufs[t]] = a
            else:
                a = free.pick(n, policy)
                if a is not None:
                    ring.append(a)
        if a is None:
            return None, (t, sorted(x[2] for x in active))
        addr[t] = a
        free.take(a, n)
        heapq.heappush(active, (last[t], t + len(first), t))
    return np.asarray(addr, dtype=np.int64), None


def group_slots(first, last, addr, nbytes, site, parts):
    """Slots of placed tiles (as :meth:`_Run._slots`): yields (record, member tile indices)."""
    first, last, addr, nbytes = first.tolist(), last.tolist(), addr.tolist(), nbytes.tolist()
    site, parts = site.tolist(), parts.tolist()
    counters: dict[int, int] = {}
    open_slots: list[dict] = []
    occupants = _Occupants()
    out = []
    for t in range(len(first)):
        lo, hi = addr[t], addr[t] + nbytes[t]
        mine = None
        for s in open_slots:
            if s["site"] == site[t] and s["addr"] == lo and s["nbytes"] >= nbytes[t]:
                mine = s
                break
        closed = [s for s in open_slots if s is not mine and s["addr"] < hi and lo < s["addr"] + s["nbytes"]]
        if closed:
            open_slots = [s for s in open_slots if s not in closed]
        if mine is None:
            k = counters.get(site[t], 0)
            counters[site[t]] = k + 1
            key = (site[t], k)
            previous = occupants.claim(lo, hi, key)
            mine = {"site": site[t], "n": k, "addr": lo, "nbytes": nbytes[t], "partitions": parts[t],
                    "start": first[t], "end": last[t], "aliases": previous, "members": []}
            out.append(mine)
            open_slots.append(mine)
        mine["end"] = max(mine["end"], last[t])
        mine["partitions"] = max(mine["partitions"], parts[t])
        mine["members"].append(t)
    for rec in out:
        yield rec, rec["members"]
