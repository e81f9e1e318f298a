"""On-chip memory allocation: rotating slots per site, then liveness-based addresses.

Every tile the builder makes is a new logical buffer. Allocation maps them to
physical *slots* and slots to addresses in two steps:

1. **Rotation per allocation site.** Tiles made at one site (a source line, a
   named site) take a ring of at least ``bufs`` slots in turn, so iteration ``i+1``
   never waits for iteration ``i``'s tile to die. A slot is reused only once its
   previous tile is dead (its last use comes earlier in program order); the
   write-after-read edge that reuse creates is a real dependency. A site whose
   tiles are all alive at once (a list of tiles kept by the kernel) simply gets more
   slots: reuse never changes what a kernel computes.
2. **Addresses by liveness.** Slots whose lifetimes do not overlap may share
   addresses (next fit around the memory, SBUF 64-byte aligned, PSUM one bank each). When the live slots do not
   fit, a :class:`~tilescope.errors.CapacityError` lists them with their sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import CapacityError
from ._program import Buffer, Slot

__all__ = ["allocate", "liveness"]

SBUF_ALIGN = 64


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
class _SlotState:
    name: str
    memory: str
    site: str
    start: int
    end: int
    nbytes: int
    partitions: int
    members: list[str] = field(default_factory=list)
    addr: int = -1
    aliases: list[str] = field(default_factory=list)


def allocate(buffers: dict[str, Buffer], instructions, spec, *, describe_site=None,
             shrink_rotation: bool = False, report: dict | None = None) -> tuple[list[Slot], dict[str, str]]:
    """Assign every used on-chip buffer a slot and every slot an address.

    With ``shrink_rotation``, a site's rotation depth (``bufs``) is a preference, as in a
    compiler: when the live tiles do not fit, the site whose extra rotating buffers hold
    the most memory gets one buffer fewer and allocation is tried again, until it fits
    or no site can give up a buffer (then the CapacityError of the last attempt is
    raised). ``report`` (a dict) receives ``{site: depth}`` for every site shrunk.
    """
    first, last = liveness(instructions)
    tiles = [b for b in buffers.values() if b.memory != "hbm" and b.name in first]
    tiles.sort(key=lambda b: first[b.name])
    depth: dict[tuple[str, str], int] = {}
    while True:
        slots, placement = _rings(tiles, first, last, spec, depth)
        try:
            for memory, capacity, align in (
                ("sbuf", spec.sbuf_bytes_per_partition, SBUF_ALIGN),
                ("psum", spec.psum_bytes_per_partition, spec.psum_bank_bytes),
            ):
                _assign_addresses([s for s in slots if s.memory == memory], memory, capacity, align, spec,
                                  describe_site)
        except CapacityError as e:
            key = _shrinkable(e, depth) if shrink_rotation else None
            if key is None:
                raise
            depth[key[0]] = key[1]
            if report is not None:
                report[key[0][1]] = key[1]
            continue
        break

    return [
        Slot(s.name, s.memory, s.addr, s.nbytes, s.partitions, s.start, s.end, s.site,
             tuple(s.members), tuple(s.aliases))
        for s in slots
    ], placement


def _rings(tiles, first, last, spec, depth) -> tuple[list[_SlotState], dict[str, str]]:
    """Rotation per allocation site (step 1 of the module docs)."""
    rings: dict[tuple[str, str], list[_SlotState]] = {}
    slots: list[_SlotState] = []
    placement: dict[str, str] = {}
    for t in tiles:
        site = t.site or t.name
        key = (t.memory, site)
        ring = rings.setdefault(key, [])
        start, end = first[t.name], last[t.name]
        free = [s for s in ring if s.end < start]
        nbytes = t.bytes_per_partition
        if t.memory == "psum":  # whole banks (a tile may span several)
            nbytes = -(-nbytes // spec.psum_bank_bytes) * spec.psum_bank_bytes
        else:
            nbytes = -(-nbytes // SBUF_ALIGN) * SBUF_ALIGN
        if len(ring) < max(1, depth.get(key, t.bufs)) or not free:
            slot = _SlotState(
                name=f"{t.memory}:{site}#{len(ring)}", memory=t.memory, site=site,
                start=start, end=end, nbytes=nbytes, partitions=t.shape[0],
            )
            ring.append(slot)
            slots.append(slot)
        else:
            slot = min(free, key=lambda s: s.end)
            slot.end = end
            slot.nbytes = max(slot.nbytes, nbytes)
            slot.partitions = max(slot.partitions, t.shape[0])
        slot.members.append(t.name)
        placement[t.name] = slot.name
    return slots, placement


def _shrinkable(err: CapacityError, depth: dict) -> tuple[tuple[str, str], int] | None:
    """The site (and its new depth) whose extra live rotating buffers free the most memory."""
    groups: dict[tuple[str, str], list[_SlotState]] = {}
    for s in getattr(err, "_live", ()):
        groups.setdefault((s.memory, s.site), []).append(s)
    best = None
    for key, group in groups.items():
        n = len(group)
        new = n - 1
        if new < 1 or depth.get(key, n + 1) <= new:
            continue
        freed = max(s.nbytes for s in group)
        if best is None or (freed, key) > (best[0], best[1]):
            best = (freed, key, new)
    return None if best is None else (best[1], best[2])


def _assign_addresses(slots: list[_SlotState], memory: str, capacity: int, align: int, spec, describe_site) -> None:
    """Next-fit around a ring: each slot goes to the first free range at or after the
    end of the previous one, wrapping to the start. Freed memory is reused only once
    the allocation cursor comes round again, so instructions that are independent but
    close in program order rarely meet through a reused address (which would serialise
    them); memory is still shared by liveness when it runs short.
    """
    slots.sort(key=lambda s: (s.start, s.name))
    active: list[_SlotState] = []
    expired: list[_SlotState] = []
    cursor = 0
    for s in slots:
        still = []
        for a in active:
            (expired if a.end < s.start else still).append(a)
        active = still
        gaps = []  # free [lo, hi) ranges between live slots
        lo = 0
        for a in sorted(active, key=lambda a: a.addr):
            if a.addr > lo:
                gaps.append((lo, a.addr))
            lo = max(lo, -(-(a.addr + a.nbytes) // align) * align)
        if lo < capacity:
            gaps.append((lo, capacity))
        addr = None
        for g0, g1 in gaps:  # first fit at or after the cursor
            start = max(g0, cursor)
            if start + s.nbytes <= g1:
                addr = start
                break
        if addr is None:
            for g0, g1 in gaps:  # wrap around
                if g0 + s.nbytes <= g1:
                    addr = g0
                    break
        if addr is None:
            raise _capacity_error(memory, s, active, capacity, spec, describe_site)
        s.addr = addr
        cursor = -(-(addr + s.nbytes) // align) * align
        s.aliases = [e.name for e in expired if e.addr < addr + s.nbytes and addr < e.addr + e.nbytes]
        active.append(s)


def _capacity_error(memory, s, active, capacity, spec, describe_site) -> CapacityError:
    live = active + [s]
    need = sum(a.nbytes for a in live)
    by_site: dict[str, list[_SlotState]] = {}
    for a in live:
        by_site.setdefault(a.site, []).append(a)
    rows = sorted(by_site.items(), key=lambda kv: -sum(a.nbytes for a in kv[1]))
    listing = "; ".join(
        f"{describe_site(site) if describe_site else site}: {len(group)} x {group[0].nbytes / 1024:g} KiB"
        for site, group in rows[:6]
    )
    unit = "banks" if memory == "psum" else "KiB per partition"
    if memory == "psum":
        need_s, cap_s = f"{need // spec.psum_bank_bytes} {unit}", f"{capacity // spec.psum_bank_bytes} {unit}"
        fix = "fewer live PSUM tiles (accumulate, then copy out to SBUF before starting the next)"
    else:
        need_s, cap_s = f"{need / 1024:g} {unit}", f"{capacity / 1024:g} {unit}"
        fix = "smaller tiles, fewer rotating buffers per site (bufs=), or shorter tile lifetimes"
    err = CapacityError(
        f"{memory.upper()} capacity exceeded at instruction #{s.start}: live tiles need {need_s}, "
        f"the limit is {cap_s} on {spec.name}. Live tiles by allocation site: {listing}. Fix: {fix}"
    )
    err.instruction, err.site = s.start, s.site
    err._live = live
    return err
