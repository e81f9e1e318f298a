"""The tile builder: the one way Programs are made.

Tile kernels, the eager lowerings of aten ops and the compiler's fusion all build
Programs through :class:`TileBuilder`: HBM tensors and on-chip tiles, loops over
tiles (plain Python loops, unrolled at build time), one method per engine
instruction, provenance on every instruction, tile-limit checks at emission, and
on-chip allocation with rotating buffers at :meth:`TileBuilder.build`.

>>> from tilescope.program import TileBuilder
>>> b = TileBuilder("double")
>>> x = b.input("x", (256, 512), "float32")
>>> y = b.output("y", (256, 512), "float32")
>>> for r0, rows in b.tiles(256, 128):
...     t = b.sbuf((rows, 512), "float32", site="x")
...     load = b.dma_copy(t, x[r0:r0 + rows, :])      # each call returns the
...     mul = b.tensor_scalar(t, t, "multiply", 2.0)  # instruction's index
...     store = b.dma_copy(y[r0:r0 + rows, :], t)
>>> prog = b.build()
>>> len(prog), prog.summary_counts()["dma_copy"]
(6, 4)
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
from typing import Iterator

import numpy as np

from ..dtypes import canonical
from ..errors import IndexRangeError, ProgramError
from ..isa import (
    AP, Activation, ActivationReduce, BnAggr, BnStats, DmaCopy, DmaIndirect, Dropout, GpsimdCall, Instruction,
    MatchReplace8, Max8,
    Iota, Matmul, Memset, RuntimeScalar, Select, TensorCopy, TensorReduce, TensorScalar,
    TensorTensor, Transpose,
)
from ..isa import field_access
from ..spec import CoreSpec, preset
from ._alloc import allocate, allocate_columns
from ._checks import check_buffer, check_instruction
from ._instruction_columns import Columns, operand_slots as _slots, operands_of
from ._program import Buffer, Program, Provenance

__all__ = ["TileBuilder", "Handle", "View", "as_ap"]

_REPLICA = re.compile(r"~r(\d+)$")  # replica buffers are named "<source>~r<id>"


def _moved(tmpl, names: list[str], offsets: list[int]):
    """``tmpl`` with its operands (in slot order) at other buffers and offsets."""
    from ._instruction_columns import operand_slots

    changes: dict = {}
    for (field, sub), name, off in zip(operand_slots(tmpl), names, offsets):
        ap = getattr(tmpl, field) if sub is None else getattr(tmpl, field)[sub]
        if ap.buffer == name and ap.offset == off:
            continue
        new = AP(name, ap.dtype, off, ap.dims)
        if sub is None:
            changes[field] = new
        else:
            lst = changes.get(field)
            if lst is None:
                lst = changes[field] = list(getattr(tmpl, field))
            lst[sub] = new
    for k, v in list(changes.items()):
        if isinstance(v, list):
            changes[k] = tuple(v)
    return dataclasses.replace(tmpl, **changes) if changes else tmpl


class View:
    """A region of a buffer with a logical shape; index it further or pass it to an op."""

    __slots__ = ("buffer", "ap", "shape")

    def __init__(self, buffer: Buffer, ap: AP, shape: tuple[int, ...]):
        self.buffer = buffer
        self.ap = ap
        self.shape = shape

    @property
    def dtype(self) -> str:
        return self.buffer.dtype

    @property
    def memory(self) -> str:
        return self.buffer.memory

    @property
    def name(self) -> str:
        return self.buffer.name

    def __getitem__(self, index) -> "View":
        return _index(self, index)

    def __repr__(self) -> str:
        return f"<{self.buffer.memory} view of {self.buffer.name!r} shape={self.shape} {self.dtype}>"


class Handle(View):
    """A whole buffer (HBM tensor or on-chip tile)."""

    __slots__ = ()

    def __init__(self, buffer: Buffer):
        super().__init__(buffer, buffer.full(), buffer.shape)


def as_ap(x) -> AP:
    if isinstance(x, View):
        return x.ap
    if isinstance(x, AP):
        return x
    raise ProgramError(f"expected a tile, tensor view or AP, got {type(x).__name__}: {x!r}")


def _index(view: View, index) -> View:
    if not isinstance(index, tuple):
        index = (index,)
    if Ellipsis in index:
        k = index.index(Ellipsis)
        fill = len(view.shape) - (len(index) - 1)
        index = index[:k] + (slice(None),) * fill + index[k + 1:]
    if len(index) > len(view.shape):
        raise IndexRangeError(f"too many indices ({len(index)}) for {view.buffer.name!r} of shape {view.shape}")
    index = index + (slice(None),) * (len(view.shape) - len(index))
    offset = view.ap.offset
    dims, shape = [], []
    keep_unit = view.buffer.memory != "hbm"
    for k, (ix, (stride, size)) in enumerate(zip(index, view.ap.dims)):
        if isinstance(ix, slice):
            start, step, count = _slice_of(ix, size, k, view)
            offset += start * stride
            dims.append((stride * step, count))
            shape.append(count)
        else:
            offset += _position(ix, size, k, view) * stride
            if keep_unit and k == 0:
                dims.append((stride, 1))
                shape.append(1)
    if not dims:
        dims, shape = [(1, 1)], [1]
    return View(view.buffer, AP(view.ap.buffer, view.ap.dtype, offset, tuple(dims)), tuple(shape))


def _slice_of(ix: slice, size: int, k: int, view: View) -> tuple[int, int, int]:
    """(start, step, count) of slice ``ix`` on dim ``k`` (of ``size``), checked."""
    start, stop, step = ix.indices(size)
    if step <= 0:
        raise IndexRangeError(f"negative slice steps are not supported (dim {k} of {view.buffer.name!r})")
    if ix.stop is not None and ix.stop > size:
        raise IndexRangeError(
            f"index range [{start}, {ix.stop - 1}] exceeds dimension size {size} "
            f"(dim {k} of {view.buffer.name!r}, shape {view.shape})"
        )
    count = max(0, -(-(stop - start) // step))
    if count == 0:
        raise IndexRangeError(f"empty slice {ix} on dim {k} of {view.buffer.name!r} (size {size})")
    return start, step, count


def _position(ix, size: int, k: int, view: View) -> int:
    """Integer index ``ix`` on dim ``k`` (of ``size``), negative ones from the end, checked."""
    i = int(ix)
    if i < 0:
        i += size
    if not 0 <= i < size:
        raise IndexRangeError(
            f"index {int(ix)} is out of range for dimension size {size} "
            f"(dim {k} of {view.buffer.name!r}, shape {view.shape})"
        )
    return i


def _template_limits(instr) -> list[tuple]:
    """Per operand slot of ``instr``: lowest and highest element offset relative to the
    operand's offset; partitions; whether it is an engine operand; whether it is a TensorE
    result; within-row lowest/highest; itemsize (what the offset checks of a template need)."""
    engine_op = not isinstance(instr, (DmaCopy, DmaIndirect)) and instr.engine != "dma"
    pe_dst = isinstance(instr, (Matmul, Transpose))
    out = []
    for name, sub in _slots(instr):
        ap = getattr(instr, name) if sub is None else getattr(instr, name)[sub]
        lo = hi = flo = fhi = 0
        for k, (stride, c) in enumerate(ap.dims):
            ext = stride * (c - 1)
            lo, hi = (lo + ext, hi) if ext < 0 else (lo, hi + ext)
            if k:
                flo, fhi = (flo + ext, fhi) if ext < 0 else (flo, fhi + ext)
        out.append((lo, hi, ap.partitions, int(engine_op), int(pe_dst and name == "dst"), flo, fhi, ap.itemsize))
    return out


def _exact(v):
    """``v`` as a key part equal only to the same value of the same type (0.0 and -0.0, 1 and
    1.0 and True differ); objects other than numbers, strings and tuples by identity."""
    c = v.__class__
    if v is None or c is str or c is int or c is bool:
        return (c, v)
    if c is float:
        return (c, v.hex())  # (NaN and the zeros exactly)
    if c is tuple:
        return (c, tuple(_exact(x) for x in v))
    return ("id", id(v))


def _caller_site(depth: int = 3) -> str:
    try:
        f = sys._getframe(depth)
    except ValueError:  # called from the top level of a script
        f = sys._getframe(depth - 1)
    return f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno}"


class _Rows:
    """The instructions emitted so far, as growing arrays (see :mod:`._instruction_columns`)."""

    __slots__ = ("n", "tmpl", "prov", "buf", "off")

    def __init__(self, width: int = 4, capacity: int = 256):
        self.n = 0
        self.tmpl = np.empty(capacity, dtype=np.int32)
        self.prov = np.empty(capacity, dtype=np.int32)
        self.buf = np.full((capacity, width), -1, dtype=np.int32)
        self.off = np.zeros((capacity, width), dtype=np.int64)

    def _grow(self, need: int, width: int) -> None:
        cap = len(self.tmpl)
        w = self.buf.shape[1]
        if need <= cap and width <= w:
            return
        cap2 = max(need, cap * 2)
        w2 = max(width, w)
        tmpl = np.empty(cap2, dtype=np.int32)
        prov = np.empty(cap2, dtype=np.int32)
        buf = np.full((cap2, w2), -1, dtype=np.int32)
        off = np.zeros((cap2, w2), dtype=np.int64)
        n = self.n
        tmpl[:n], prov[:n] = self.tmpl[:n], self.prov[:n]
        buf[:n, :w], off[:n, :w] = self.buf[:n], self.off[:n]
        self.tmpl, self.prov, self.buf, self.off = tmpl, prov, buf, off

    def append(self, t: int, prov: int, bufs: list, offs: list) -> int:
        i = self.n
        self._grow(i + 1, len(bufs))
        self.tmpl[i] = t
        self.prov[i] = prov
        k = len(bufs)
        if k:
            self.buf[i, :k] = bufs
            self.off[i, :k] = offs
        self.buf[i, k:] = -1
        self.off[i, k:] = 0
        self.n = i + 1
        return i

    def set(self, i: int, t: int, bufs: list, offs: list) -> None:
        self._grow(self.n, len(bufs))
        self.tmpl[i] = t
        k = len(bufs)
        self.buf[i, :k] = bufs
        self.off[i, :k] = offs
        self.buf[i, k:] = -1
        self.off[i, k:] = 0

    def extend(self, tmpl, prov, buf, off) -> None:
        m = len(tmpl)
        i = self.n
        self._grow(i + m, buf.shape[1])
        self.tmpl[i:i + m] = tmpl
        self.prov[i:i + m] = prov
        w = buf.shape[1]
        self.buf[i:i + m, :w] = buf
        self.buf[i:i + m, w:] = -1
        self.off[i:i + m, :w] = off
        self.off[i:i + m, w:] = 0
        self.n = i + m


class _Buffers(dict):
    """name -> Buffer; a replica buffer (named ``base~rN``) is made on first lookup."""

    __slots__ = ("builder",)
    builder: "TileBuilder"

    def __missing__(self, name: str) -> Buffer:
        b = self.builder._replica_buffer(name)
        if b is None:
            raise KeyError(name)
        return b

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name) -> bool:
        return self.get(name) is not None


class TileBuilder:
    """Builds one Program.

    Args:
        name: the Program's name (an aten op, a kernel, a fused region).
        spec: hardware preset (name or CoreSpec); limits and capacities come from it.
        bufs: a rotation depth for every SBUF allocation site (None: no fixed depth -- the
            allocation mode of :meth:`build` places each tile, see
            :mod:`tilescope.program._alloc`).

    Instructions and buffers are kept as columns (:mod:`tilescope.program._instruction_columns`):
    an emitted instruction is a template row; loop replication appends rows in bulk.
    """

    def __init__(self, name: str, spec: str | CoreSpec | None = None, *, bufs: int | None = None):
        self.name = name
        self.spec = preset(spec)
        self.default_bufs = bufs or 0
        self._buffers: _Buffers = _Buffers()
        self._buffers.builder = self
        self._ids: dict[str, int] = {}  # buffer name -> id
        self._kind: list[int] = []  # buffer id -> record index
        self._kinds: list[Buffer] = []  # buffer records (a replica shares its source's)
        self._names: list[str | None] = []  # buffer id -> name (None: a replica, named from its record)
        self._templates: list[Instruction] = []
        self._template_ids: dict[tuple, int] = {}  # a template's key (see _template_key) -> its index
        self._tmpl_limits: dict[int, list] = {}  # template id -> its offset checks' facts (_offsets_ok)
        self._kind_facts: dict[int, tuple] = {}  # buffer record index -> (size, row length, on chip, in PSUM)
        self._last: tuple = (-1, None)  # the instruction emitted (or replaced) last, and its index
        self._rows = _Rows()
        self._prov_index: dict[Provenance, int] = {Provenance(): 0}
        self._prov_list: list[Provenance] = [Provenance()]
        self._prov: Provenance = Provenance()
        self._inputs: list[str] = []
        self._outputs: list[str] = []
        self._counter = 0
        self.check = True

    # ---- buffers ---------------------------------------------------------
    def _register(self, b: Buffer) -> int:
        k = len(self._kind)
        self._ids[b.name] = k
        self._kind.append(len(self._kinds))
        self._kinds.append(b)
        self._names.append(b.name)
        dict.__setitem__(self._buffers, b.name, b)
        return k

    def _new_buffer(self, name: str | None, prefix: str, **kw) -> Buffer:
        if name is None or name in self._ids or _REPLICA.search(name):
            base = name or prefix
            while True:
                self._counter += 1
                candidate = f"{base}.{self._counter}" if name else f"{base}{self._counter}"
                if candidate not in self._ids:
                    name = candidate
                    break
        kw["shape"] = tuple(int(n) for n in kw["shape"])
        kw["dtype"] = canonical(kw["dtype"])
        b = Buffer(name=name, **kw)
        check_buffer(b, self.spec)
        self._register(b)
        return b

    def add_buffer(self, b: Buffer) -> None:
        """Add a buffer made elsewhere (a spill's reloaded tile or HBM scratch)."""
        if b.name in self._ids:
            raise ProgramError(f"a buffer named {b.name!r} already exists in {self.name!r}")
        self._register(b)

    @property
    def buffer_count(self) -> int:
        """Buffers made so far (ids are given in order)."""
        return len(self._kind)

    def buffer_id(self, name: str) -> int:
        i = self._ids.get(name)
        if i is None:
            m = _REPLICA.search(name)
            if m is None:
                raise KeyError(name)
            i = int(m.group(1))
        return i

    def buffer_name(self, i: int) -> str:
        n = self._names[i]
        return n if n is not None else f"{self._kinds[self._kind[i]].name}~r{i}"

    def _replica_buffer(self, name: str) -> Buffer | None:
        m = _REPLICA.search(name)
        if m is None:
            return None
        i = int(m.group(1))
        if i >= len(self._kind) or self._names[i] is not None or self.buffer_name(i) != name:
            return None
        b = dataclasses.replace(self._kinds[self._kind[i]], name=name)
        dict.__setitem__(self._buffers, name, b)
        return b

    def add_replica_buffers(self, sources: list[int], count: int) -> int:
        """``count`` copies of buffers ``sources`` (ids), in blocks of ``len(sources)``: the
        buffers loop replication makes. Returns the first new id."""
        first = len(self._kind)
        kinds = [self._kind[s] for s in sources]
        for _ in range(count):
            self._kind.extend(kinds)
        self._names.extend([None] * (count * len(sources)))
        return first

    def input(self, name: str, shape, dtype) -> Handle:
        """An HBM tensor the caller provides."""
        b = self._new_buffer(name, "in", memory="hbm", shape=shape, dtype=dtype, role="input")
        if b.name != name:
            raise ProgramError(f"an input named {name!r} already exists in {self.name!r}")
        self._inputs.append(name)
        return Handle(b)

    def output(self, name: str, shape, dtype) -> Handle:
        """An HBM tensor the Program produces."""
        b = self._new_buffer(name, "out", memory="hbm", shape=shape, dtype=dtype, role="output")
        if b.name != name:
            raise ProgramError(f"an output named {name!r} already exists in {self.name!r}")
        self._outputs.append(name)
        return Handle(b)

    def mark_output(self, handle: View) -> None:
        """Make an existing HBM tensor (e.g. an input written in place) an output too.

        A scratch tensor marked as an output becomes an output tensor (role ``output``).
        """
        name = handle.buffer.name
        b = self._buffers[name]
        if b.memory != "hbm":
            raise ProgramError(f"only HBM tensors can be outputs; {name!r} is in {b.memory.upper()}")
        if b.role == "scratch":
            new = dataclasses.replace(b, role="output")
            dict.__setitem__(self._buffers, name, new)
            self._kind[self._ids[name]] = len(self._kinds)  # its own record (others may share the old)
            self._kinds.append(new)
            self.__dict__.pop("_kind_np", None)
        if name not in self._outputs:
            self._outputs.append(name)

    def scratch(self, shape, dtype, *, name: str | None = None) -> Handle:
        """A private HBM tensor (spills, intermediates that do not fit on chip)."""
        return Handle(self._new_buffer(name, "hbm", memory="hbm", shape=shape, dtype=dtype, role="scratch"))

    def sbuf(self, shape, dtype, *, site: str | None = None, bufs: int | None = None,
             name: str | None = None) -> Handle:
        """A new SBUF tile ``(partitions, *free)``; with ``bufs``, tiles of one ``site`` rotate over
        that many addresses (else the allocation mode places each)."""
        site = site or _caller_site()
        return Handle(self._new_buffer(name, "sb", memory="sbuf", shape=shape, dtype=dtype,
                                       site=site, bufs=bufs if bufs is not None else self.default_bufs))

    def psum(self, shape, dtype="float32", *, site: str | None = None, bufs: int | None = None,
             name: str | None = None) -> Handle:
        """A new PSUM tile: whole 2 KiB banks per partition (a TensorE result stays in one bank);
        ``bufs`` as :meth:`sbuf` (the builder's default depth is for SBUF only)."""
        site = site or _caller_site()
        return Handle(self._new_buffer(name, "ps", memory="psum", shape=shape, dtype=dtype,
                                       site=site, bufs=bufs or 0))

    @staticmethod
    def tiles(total: int, size: int) -> Iterator[tuple[int, int]]:
        """``(start, length)`` of each tile of ``size`` covering ``range(total)``."""
        if size <= 0:
            raise ProgramError(f"tile size must be >= 1, got {size}")
        for start in range(0, total, size):
            yield start, min(size, total - start)

    # ---- provenance --------------------------------------------------------
    @contextlib.contextmanager
    def provenance(self, **fields):
        """Instructions emitted inside carry this provenance (fields merge with the outer one)."""
        outer = self._prov
        merged = {k: getattr(outer, k) for k in ("op", "fx_node", "file", "line", "label")}
        merged.update(fields)
        self._prov = Provenance(**merged)
        try:
            yield
        finally:
            self._prov = outer

    def set_provenance(self, prov: Provenance) -> None:
        self._prov = prov

    @property
    def current_provenance(self) -> Provenance:
        """The provenance the next emitted instruction gets."""
        return self._prov

    def buffer(self, name: str) -> Buffer:
        """The buffer named ``name``."""
        return self._buffers[name]

    # ---- emission ----------------------------------------------------------
    def _row(self, ops) -> tuple[list, list]:
        """Buffer ids and offsets of operands ``ops`` (APs)."""
        ids = self._ids
        bufs, offs = [], []
        for ap in ops:
            i = ids.get(ap.buffer)
            bufs.append(i if i is not None else self.buffer_id(ap.buffer))
            offs.append(ap.offset)
        return bufs, offs

    def emit(self, instr: Instruction) -> int:
        """Append one instruction (checked against the tile limits); returns its index."""
        t, bufs, offs = self._checked(instr)
        idx = self._prov_index.get(self._prov)
        if idx is None:
            idx = self._prov_index[self._prov] = len(self._prov_list)
            self._prov_list.append(self._prov)
        i = self._rows.append(t, idx, bufs, offs)
        self._last = (i, instr)  # (the tile language often reads back what it just emitted)
        return i

    def _checked(self, instr: Instruction) -> tuple[int, list, list]:
        """``instr`` checked against the tile limits: its template id, buffer ids and offsets.
        Its template is an earlier instruction that differs only in which buffers (of the same
        memory, shape and dtype) and offsets it touches, else ``instr`` itself, appended.
        An instruction of a template already checked differs from it only in buffers of the
        same records and offsets, so only what offsets decide is checked again (bounds,
        start partitions, PSUM banks: :meth:`_offsets_ok`); the full check runs otherwise,
        and whenever that quick one fails (for its error)."""
        try:
            key, ops = self._template_key(instr)
            bufs, offs = self._row(ops)
        except KeyError:  # (an unknown buffer: the full check names it)
            if self.check:
                check_instruction(instr, self._buffers, self.spec)
            raise
        t = self._template_ids.get(key)
        if t is not None:
            if self.check and not self._offsets_ok(t, bufs, offs):
                check_instruction(instr, self._buffers, self.spec)
            return t, bufs, offs
        if self.check:
            check_instruction(instr, self._buffers, self.spec)
        t = len(self._templates)
        self._templates.append(instr)
        self._template_ids[key] = t
        return t, bufs, offs

    def _offsets_ok(self, t: int, bufs: list, offs: list) -> bool:
        """Do operands of template ``t`` over buffers ``bufs`` at offsets ``offs`` stay in their
        buffers, start at partitions their engine can, and keep a TensorE result in one PSUM
        bank? (The scalar form of :meth:`_violations`.)"""
        lims = self._tmpl_limits.get(t)
        if lims is None:
            lims = self._tmpl_limits[t] = _template_limits(self._templates[t])
        facts, kind, kinds = self._kind_facts, self._kind, self._kinds
        for (lo, hi, parts, engine_op, pe_dst, flo, fhi, isz), b, o in zip(lims, bufs, offs):
            k = kind[b]
            f = facts.get(k)
            if f is None:
                rec = kinds[k]
                f = facts[k] = (rec.size, max(1, rec.row_elems), rec.memory != "hbm", rec.memory == "psum")
            size, row_el, onchip, psum = f
            if o + lo < 0 or o + hi >= size:
                return False
            if engine_op and onchip:
                sp = o // row_el
                if not (sp == 0 if parts > 64 else sp in (0, 64) if parts > 32 else sp in (0, 32, 64, 96)):
                    return False
            if pe_dst and psum:
                w = o % row_el
                bank = self.spec.psum_bank_bytes
                if (w + flo) * isz // bank != ((w + fhi + 1) * isz - 1) // bank:
                    return False
        return True

    def _template_key(self, instr: Instruction) -> tuple[tuple, list]:
        """What a row shares with its template: the class, every field but the operands'
        buffers and offsets (values by type and exact value; other objects by identity) and
        the operands' buffer records but their names; and the operands (APs, in slot order)."""
        names, values = field_access(type(instr))
        buffers = self._buffers
        parts: list = [instr.__class__]
        ops = []
        for v in values(instr):
            c = v.__class__
            if c is AP:
                b = buffers[v.buffer]
                parts.append((v.dtype, v.dims, b.memory, b.shape, b.dtype))
                ops.append(v)
            elif c is tuple:
                part = []
                for x in v:
                    if x.__class__ is AP:
                        b = buffers[x.buffer]
                        part.append((x.dtype, x.dims, b.memory, b.shape, b.dtype))
                        ops.append(x)
                    else:
                        part.append(_exact(x))
                parts.append(tuple(part))
            else:
                parts.append(_exact(v))
        return tuple(parts), ops

    def rows(self, start: int, stop: int):
        """Columns of instructions ``[start, stop)``: (template ids, provenance, buffer ids, offsets)."""
        r = self._rows
        return r.tmpl[start:stop], r.prov[start:stop], r.buf[start:stop], r.off[start:stop]

    def template(self, t: int) -> Instruction:
        return self._templates[t]

    def extend_rows(self, tmpl, prov, buf, off) -> None:
        """Append rows of already checked templates at other buffers and offsets (loop
        replication); their offset-dependent limits are checked first, by :meth:`first_bad_replica`."""
        self._rows.extend(tmpl, prov, buf, off)

    def first_bad_replica(self, tmpl, buf, off, fixed=None) -> int | None:
        """Replicas of rows of templates ``tmpl`` [m] over buffers ``buf`` [m, width] at
        offsets ``off`` [count, m, width] (a replica's buffers have the same records as
        ``buf``'s): the first replica with a row that breaks a limit its offsets decide
        (bounds, start partitions, PSUM banks -- the rest is the templates', already
        checked), or None. The loop then traces that iteration as it runs, as without
        replication (a tile language retarget that fails its check takes another route).
        ``fixed`` [m, width] (optional): operands whose offsets are the template's in every
        replica, so already checked."""
        if not self.check or len(off) == 0:
            return None
        B = np.asarray(buf, dtype=np.int64)
        sel = B >= 0 if fixed is None else (B >= 0) & ~np.asarray(fixed)
        flat = np.flatnonzero(sel)  # the operands to check, over rows x slots
        if not len(flat):
            return None
        width = B.shape[1]
        bad = self._violations(np.asarray(tmpl)[flat // width], flat % width, B.ravel()[flat],
                               np.asarray(off).reshape(len(off), -1)[:, flat])
        hit = np.flatnonzero(bad)
        return int(hit[0]) if len(hit) else None

    def _limit_table(self):
        """Per template and operand slot (arrays ``[templates, width]``): lowest and highest
        element offset relative to the operand's offset; partitions; whether it is an engine
        operand; whether it is a TensorE result; within-row lowest/highest; itemsize. Grown
        as templates are added."""
        tab = self.__dict__.get("_limits")
        T, width = len(self._templates), self._rows.buf.shape[1]
        if tab is None or tab["T"] != T or tab["w"] != width:
            start = 0 if tab is None or tab["w"] != width else tab["T"]
            new = tab["a"] if start else None
            if new is None or new.shape[1] < T:  # (grown by doubling: templates come a few at a time)
                grown = np.zeros((8, max(T, 2 * start, 64), width), dtype=np.int64)
                if start:
                    grown[:, :start] = new[:, :start]
                new = grown
            for t in range(start, T):
                for j, row in enumerate(_template_limits(self._templates[t])):
                    new[:, t, j] = row
            tab = self._limits = {"T": T, "w": width, "a": new}
        return tab["a"]

    def kind_array(self) -> np.ndarray:
        """Per buffer id its record index, as an array (grown as buffers are added)."""
        arr = self.__dict__.get("_kind_np")
        have, n = self.__dict__.get("_kind_n", 0), len(self._kind)
        if arr is None or have != n:
            if arr is None or len(arr) < n:  # (grown by doubling: loops add buffers a body at a time)
                grown = np.empty(max(n, 2 * (len(arr) if arr is not None else 0), 1024), dtype=np.int64)
                if arr is not None:
                    grown[:have] = arr[:have]
                arr = self._kind_np = grown
            arr[have:n] = self._kind[have:n]
            self._kind_n = n
        return arr[:n]

    def _kind_arrays(self):
        """Per buffer record: size, row length, on chip, in PSUM, and an id of those four
        (grown as records are added)."""
        have = self.__dict__.get("_karr")
        ks = self._kinds
        n = len(ks)
        if have is None or have[0] != n:
            start = 0 if have is None else have[0]
            add = ks[start:]
            ids = self.__dict__.setdefault("_limit_kinds", {})
            fields = [(k.size, max(1, k.row_elems), k.memory != "hbm", k.memory == "psum") for k in add]
            parts = [np.array([f[0] for f in fields], dtype=np.int64),
                     np.array([f[1] for f in fields], dtype=np.int64),
                     np.array([f[2] for f in fields], dtype=bool),
                     np.array([f[3] for f in fields], dtype=bool),
                     np.array([ids.setdefault(f, len(ids)) for f in fields], dtype=np.int64)]
            if have is not None:
                parts = [np.concatenate([old, p]) for old, p in zip(have[1:], parts)]
            have = self._karr = (n, *parts)
        return have[1:]

    def _violations(self, tm, slot, B, O) -> np.ndarray:
        """Per replica [count]: does an operand (of template ``tm``, at operand slot ``slot``,
        over buffer ``B``, each [n]; offsets ``O`` [count, n]) leave its buffer, start at a
        partition an engine cannot, or put a TensorE result across PSUM banks? (What the
        templates and buffer records decide is kept per (templates, records): loops replicate
        the same bodies again and again.)"""
        K = self.kind_array()[B]  # each operand's buffer record
        size, row_el, onchip, psum, limits = self._kind_arrays()
        rows = self._limit_table()[:, tm, slot]
        cache = self.__dict__.setdefault("_limit_rows", {})
        key = (rows.tobytes(), limits[K].tobytes())
        c = cache.get(key)
        if c is None:
            lo, hi, parts, engine_op, pe_dst, flo, fhi, isz = rows
            size, row_el, onchip, psum = size[K], row_el[K], onchip[K], psum[K]
            engine, pe = (engine_op > 0) & onchip, (pe_dst > 0) & psum
            c = cache[key] = (-lo, size - hi, row_el, parts > 64, parts > 32, engine, pe, flo, fhi, isz,
                              bool(np.count_nonzero(engine)), bool(np.count_nonzero(pe)))
        low, top, row_el, p64, p32, engine, pe, flo, fhi, isz, any_engine, any_pe = c
        bad = (O < low) | (O >= top)
        if any_engine:
            sp = O // row_el
            ok_sp = np.where(p64, sp == 0, np.where(p32, (sp == 0) | (sp == 64),
                                                    (sp == 0) | (sp == 32) | (sp == 64) | (sp == 96)))
            bad |= engine & ~ok_sp
        if any_pe:
            w = O % row_el
            bank = self.spec.psum_bank_bytes
            bad |= pe & ((w + flo) * isz // bank != ((w + fhi + 1) * isz - 1) // bank)
        return np.logical_or.reduce(bad, axis=1)

    def replace(self, index: int, instr: Instruction) -> None:
        """Swap the instruction at ``index`` for ``instr`` (checked like a new one).

        The tile language uses it to write a result straight into the tile it is
        assigned to (``t[...] = tl.exp(x)`` retargets the activation's ``dst``)
        instead of emitting a copy. Program order and provenance are unchanged.
        """
        if not 0 <= index < self._rows.n:
            raise ProgramError(f"no instruction #{index} to replace ({self._rows.n} emitted)")
        t, bufs, offs = self._checked(instr)
        self._rows.set(index, t, bufs, offs)
        self._last = (index, instr)

    def instruction(self, index: int) -> Instruction:
        """The instruction at ``index``."""
        r = self._rows
        if not 0 <= index < r.n:
            raise IndexError(f"no instruction #{index} ({r.n} emitted)")
        if self._last[0] == index:
            return self._last[1]
        tmpl = self._templates[int(r.tmpl[index])]
        ops = operands_of(tmpl)
        ids = self._ids
        same = True
        for j, ap in enumerate(ops):
            if ids.get(ap.buffer) != r.buf[index, j] or ap.offset != r.off[index, j]:
                same = False
                break
        if same:
            return tmpl
        return _moved(tmpl, [self.buffer_name(int(b)) for b in r.buf[index, :len(ops)]],
                      r.off[index, :len(ops)].tolist())

    @property
    def instructions(self) -> list:
        """Every instruction so far, as objects (made for rows of replicated loops)."""
        return [self.instruction(i) for i in range(self._rows.n)]

    @staticmethod
    def runtime_scalar(name: str) -> RuntimeScalar:
        """A scalar operand whose value is given per call (not part of the hash)."""
        return RuntimeScalar(name)

    def dma_copy(self, dst, src, *, queue: int | None = None) -> int:
        return self.emit(DmaCopy(as_ap(dst), as_ap(src), queue))

    def dma_indirect(self, dst, src, index, *, indirect: str = "src", queue: int | None = None) -> int:
        """Gather (``indirect="src"``) or scatter (``"dst"``) rows by an SBUF index tile; see
        :class:`~tilescope.isa.DmaIndirect` (the indirect operand's first dim spans the table)."""
        return self.emit(DmaIndirect(as_ap(dst), as_ap(src), queue, "dma", as_ap(index), indirect))

    def max8(self, dst, src) -> int:
        """The 8 largest values of each partition, descending (VectorE)."""
        return self.emit(Max8(as_ap(dst), as_ap(src)))

    def match_replace8(self, dst, data, vals, imm: float, dst_idx=None) -> int:
        """``data`` with each of the 8 ``vals`` per partition replaced by ``imm``; positions to ``dst_idx``."""
        return self.emit(MatchReplace8(as_ap(dst), as_ap(data), as_ap(vals), float(imm),
                                       as_ap(dst_idx) if dst_idx is not None else None))

    def tensor_tensor(self, dst, a, b, op: str, *, engine: str = "dve") -> int:
        return self.emit(TensorTensor(as_ap(dst), as_ap(a), as_ap(b), op, engine))

    def tensor_scalar(self, dst, src, op0: str, scalar0, op1: str | None = None, scalar1=None, *,
                      reverse0: bool = False, reverse1: bool = False, engine: str = "dve") -> int:
        return self.emit(TensorScalar(as_ap(dst), as_ap(src), op0, _scalar(scalar0), op1,
                                      _scalar(scalar1), reverse0, reverse1, engine))

    def activation(self, dst, src, func: str, *, scale=1.0, bias=None, accumulate: bool = False) -> int:
        return self.emit(Activation(as_ap(dst), as_ap(src), func, _scalar(scale), _scalar(bias), accumulate))

    def activation_reduce(self, dst, src, func: str, reduce_dst, *, reduce_op: str = "add",
                          scale=1.0, bias=None) -> int:
        return self.emit(ActivationReduce(as_ap(dst), as_ap(src), func, as_ap(reduce_dst), reduce_op,
                                          _scalar(scale), _scalar(bias)))

    def tensor_reduce(self, dst, src, op: str, *, axes: tuple[int, ...] | None = None,
                      negate: bool = False, engine: str = "dve") -> int:
        return self.emit(TensorReduce(as_ap(dst), as_ap(src), op, axes, negate, engine))

    def tensor_copy(self, dst, src, *, engine: str = "dve") -> int:
        return self.emit(TensorCopy(as_ap(dst), as_ap(src), engine))

    def select(self, dst, pred, on_true, on_false, *, engine: str = "dve") -> int:
        return self.emit(Select(as_ap(dst), as_ap(pred), as_ap(on_true), _scalar(on_false), engine))

    def iota(self, dst, *, base: int = 0, partition_step: int = 0, steps: tuple[int, ...] = ()) -> int:
        return self.emit(Iota(as_ap(dst), base, partition_step, tuple(steps)))

    def memset(self, dst, value: float = 0.0, *, engine: str = "dve") -> int:
        return self.emit(Memset(as_ap(dst), float(value), engine))

    def matmul(self, dst, stationary, moving, *, accumulate: bool = False) -> int:
        return self.emit(Matmul(as_ap(dst), as_ap(stationary), as_ap(moving), accumulate))

    def transpose(self, dst, src) -> int:
        return self.emit(Transpose(as_ap(dst), as_ap(src)))

    def bn_stats(self, dst, src) -> int:
        return self.emit(BnStats(as_ap(dst), as_ap(src)))

    def bn_aggr(self, dst, src) -> int:
        return self.emit(BnAggr(as_ap(dst), as_ap(src)))

    def dropout(self, dst, src, prob: float) -> int:
        return self.emit(Dropout(as_ap(dst), as_ap(src), float(prob)))

    def gpsimd_call(self, name: str, impl: str, inputs, outputs, cycles: float, attrs: tuple = ()) -> int:
        return self.emit(GpsimdCall(name, impl, tuple(as_ap(x) for x in inputs),
                                    tuple(as_ap(x) for x in outputs), float(cycles), tuple(attrs)))

    # ---- result --------------------------------------------------------------
    @property
    def instruction_count(self) -> int:
        return self._rows.n

    def columns(self) -> Columns:
        """The instructions and buffers so far, as :class:`~tilescope.program._instruction_columns.Columns`."""
        r = self._rows
        n = r.n
        return Columns(list(self._templates), r.tmpl[:n].copy(), r.buf[:n].copy(), r.off[:n].copy(),
                       list(self._kinds), np.asarray(self._kind, dtype=np.int32), list(self._names))

    def build(self, meta: dict | None = None, *, describe_site=None, spill: bool = False, allocation: str = "ring",
              shrink_rotation: bool = False, report: dict | None = None) -> Program:
        """Allocate on-chip memory and return the finished, immutable Program.

        ``allocation`` is the allocation mode (``"ring"`` or ``"max_reuse"``: how each tile's
        address is chosen, :mod:`tilescope.program._alloc`). ``describe_site(site) -> str``
        words allocation sites in capacity errors (e.g. as the kernel source line that made
        the tiles). With ``spill``, SBUF tiles that
        do not fit are stored to HBM and loaded back around the instructions that need the
        room (``meta["spills"]`` lists them); see :func:`~tilescope.program._alloc.allocate`.
        """
        if not self._rows.n:
            raise ProgramError(f"program {self.name!r} has no instructions")
        cols = self.columns()
        placed = allocate_columns(cols, self.spec, describe_site=describe_site, spill=spill, mode=allocation)
        meta = dict(meta or {})
        if placed is not None:
            slot_records, slot_of = placed
            return Program(self.name, None, None, inputs=self._inputs, outputs=self._outputs,
                           provenance=self._prov_list, instr_prov=self._rows.prov[:self._rows.n].copy(),
                           meta=meta, spec_name=self.spec.name, columns=cols, slot_records=slot_records,
                           slot_of=slot_of)
        # SBUF is full: the object path, which spills
        instructions = cols.instructions()
        buffers = cols.buffer_dict()
        alloc = allocate(buffers, instructions, self.spec, describe_site=describe_site, spill=spill, mode=allocation)
        prov = self._rows.prov[:self._rows.n].tolist()
        if alloc.instructions is not None:
            instructions, prov = self._spilled(alloc, prov)
            for b in alloc.buffers:
                buffers[b.name] = b
        if alloc.spills:
            meta["spills"] = alloc.spills
        return Program(self.name, buffers.values(), instructions, inputs=self._inputs, outputs=self._outputs,
                       provenance=self._prov_list, instr_prov=prov, slots=alloc.slots, placement=alloc.placement,
                       meta=meta, spec_name=self.spec.name)

    def _spilled(self, alloc, old_prov: list) -> tuple[list, list]:
        """The allocator's instruction list (spill DMAs inserted) and its provenance: a spill's
        says what it is and names the site of the tile that was spilled."""
        prov = []
        for o in alloc.origin:
            if o >= 0:
                prov.append(old_prov[o])
                continue
            k, reload = (-o - 1) // 2, (-o - 1) % 2 == 1
            rec = alloc.spills[k]
            file, line = _site_location(rec["site"])
            p = Provenance(op=self.name, file=file, line=line,
                           label=f"{'reload' if reload else 'spill'}: SBUF full, tile {rec['tile']} "
                                 f"{'loaded back from' if reload else 'stored to'} HBM")
            idx = self._prov_index.get(p)
            if idx is None:
                idx = self._prov_index[p] = len(self._prov_list)
                self._prov_list.append(p)
            prov.append(idx)
        return list(alloc.instructions), prov


def _site_location(site: str) -> tuple[str | None, int | None]:
    """(file, line) of an allocation site written ``file:line:column`` (else (None, None))."""
    parts = site.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1])
    return None, None


def _scalar(v):
    if v is None or isinstance(v, (RuntimeScalar, AP)):
        return v
    if isinstance(v, View):
        return v.ap
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    try:  # numpy scalars
        return float(v)
    except (TypeError, ValueError):
        raise ProgramError(f"expected a scalar (number, runtime scalar or [P, 1] tile), got {v!r}") from None
