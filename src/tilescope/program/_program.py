"""The Program: one representation for everything that runs on the device.

A Program is an ordered list of engine instructions over named buffers in HBM,
SBUF and PSUM, with its inputs, outputs, per-instruction provenance, a stable
content hash and a JSON form (the *executable* file of a profile).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields as _fields_of
from dataclasses import dataclass
from functools import cached_property
from math import prod
from typing import Iterable

import numpy as np

from ..dtypes import itemsize
from ..isa import AP, Instruction, RuntimeScalar
from ._dump import FORMAT_VERSION, executable_text, fields_dict as _fields_dict, instruction_records

__all__ = ["Buffer", "Provenance", "Program", "MEMORIES", "FORMAT_VERSION"]

MEMORIES = ("hbm", "sbuf", "psum")


@dataclass(frozen=True, slots=True)
class Buffer:
    """A named buffer.

    ``shape`` of an SBUF/PSUM tile is ``(partitions, *free)``. ``role`` is
    ``input``/``output``/``scratch`` for HBM tensors and ``tile`` on chip. Tiles made
    at one allocation ``site`` with ``bufs`` > 0 rotate over that many addresses; with 0
    the allocation mode picks each tile's address (:mod:`tilescope.program._alloc`).
    """

    def __reduce__(self):  # fast unpickling of cached Programs (frozen slotted dataclass)
        return Buffer, tuple(getattr(self, f.name) for f in _fields(Buffer))

    name: str
    memory: str
    shape: tuple[int, ...]
    dtype: str
    role: str = "tile"
    site: str | None = None
    bufs: int = 0

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * itemsize(self.dtype)

    @property
    def partitions(self) -> int:
        return self.shape[0] if self.memory != "hbm" else 1

    @property
    def row_elems(self) -> int:
        """Elements per row of the buffer's 2-D view (per partition on chip)."""
        if self.memory == "hbm":
            return self.shape[-1] if self.shape else 1
        return prod(self.shape[1:])

    @property
    def bytes_per_partition(self) -> int:
        return self.row_elems * itemsize(self.dtype)

    def full(self) -> AP:
        """An AP covering the whole buffer in its natural shape."""
        dims = []
        stride = 1
        for n in reversed(self.shape):
            dims.append((stride, n))
            stride *= n
        return AP(self.name, self.dtype, 0, tuple(reversed(dims)) or ((1, 1),))


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where an instruction came from: an aten op, an FX node, a kernel source line."""

    def __reduce__(self):  # fast unpickling of cached Programs (frozen slotted dataclass)
        return Provenance, tuple(getattr(self, f.name) for f in _fields(Provenance))

    op: str | None = None
    fx_node: str | None = None
    file: str | None = None
    line: int | None = None
    label: str | None = None

    def describe(self) -> str:
        parts = []
        if self.op:
            parts.append(self.op)
        if self.fx_node:
            parts.append(f"fx:{self.fx_node}")
        if self.file:
            parts.append(f"{self.file}:{self.line}" if self.line else self.file)
        if self.label:
            parts.append(self.label)
        return " ".join(parts) or "-"


@dataclass(frozen=True, slots=True)
class Slot:
    """A physical on-chip buffer: where one or more logical tiles live over time."""

    def __reduce__(self):  # fast unpickling of cached Programs (frozen slotted dataclass)
        return Slot, tuple(getattr(self, f.name) for f in _fields(Slot))

    name: str
    memory: str
    addr: int  # byte offset inside each partition (a bank boundary in PSUM)
    nbytes: int  # bytes per partition reserved
    partitions: int
    start: int  # first instruction index using it
    end: int  # last instruction index using it
    site: str | None
    members: tuple[str, ...]
    aliases: tuple[str, ...] = ()  # earlier slots whose address range this one reuses


class Program:
    """An immutable device program.

    Build Programs with :class:`tilescope.program.TileBuilder` rather than by hand;
    the builder allocates on-chip memory and checks tile limits.
    """

    def __init__(
        self,
        name: str,
        buffers: Iterable[Buffer] | None,
        instructions: Iterable[Instruction] | None,
        *,
        inputs: Iterable[str],
        outputs: Iterable[str],
        provenance: Iterable[Provenance] = (),
        instr_prov: Iterable[int] | None = None,
        slots: Iterable[Slot] = (),
        placement: dict[str, str] | None = None,
        meta: dict | None = None,
        spec_name: str | None = None,
        columns=None,
        slot_records=None,
        slot_of=None,
    ) -> None:
        """Give ``buffers`` and ``instructions`` as objects, or ``columns`` (a
        :class:`~tilescope.program._instruction_columns.Columns`; then ``slot_records``/``slot_of`` stand
        for ``slots``/``placement``, and the objects are made when something asks for them)."""
        self.name = name
        self.inputs: tuple[str, ...] = tuple(inputs)
        self.outputs: tuple[str, ...] = tuple(outputs)
        self.provenance: tuple[Provenance, ...] = tuple(provenance) or (Provenance(),)
        self.meta: dict = dict(meta or {})
        self.spec_name = spec_name
        if columns is not None:
            self.__dict__["columns"] = columns
            self._slot_records = list(slot_records or [])
            self._slot_of = slot_of
            n = len(columns)
            self._instr_prov: np.ndarray | None = np.asarray(instr_prov if instr_prov is not None else np.zeros(n),
                                                             dtype=np.int32)
        else:
            if buffers is None or instructions is None:
                raise TypeError("Program needs buffers and instructions (or columns)")
            self.__dict__["buffers"] = {b.name: b for b in buffers}
            self.__dict__["instructions"] = tuple(instructions)
            n = len(self.instructions)
            self.__dict__["instr_prov"] = (tuple(instr_prov) if instr_prov is not None else (0,) * n)
            self.__dict__["slots"] = {s.name: s for s in slots}
            self.__dict__["placement"] = dict(placement or {})  # logical tile -> slot name
            self._instr_prov = None
        self._n = n
        if len(self.instr_prov if self._instr_prov is None else self._instr_prov) != n:
            raise ValueError("instr_prov must have one entry per instruction")

    # ---- content, made from the columns when asked for ---------------------
    @cached_property
    def columns(self):
        """The instructions and buffers as arrays (:mod:`tilescope.program._instruction_columns`)."""
        from ._instruction_columns import Columns

        return Columns.from_objects(self.instructions, self.buffers)

    @cached_property
    def instructions(self) -> tuple[Instruction, ...]:
        return tuple(self.columns.instructions())

    @cached_property
    def buffers(self) -> dict[str, Buffer]:
        return self.columns.buffer_dict()

    def buffer(self, name: str) -> Buffer:
        """The buffer named ``name`` (without making every buffer's record)."""
        if "buffers" in self.__dict__:
            return self.__dict__["buffers"][name]
        cols = self.columns
        return cols.buffer(cols.id_of(name))

    @cached_property
    def instr_prov(self) -> tuple[int, ...]:
        assert self._instr_prov is not None  # (set in __dict__ directly when made from objects)
        return tuple(self._instr_prov.tolist())

    @cached_property
    def instr_prov_array(self) -> np.ndarray:
        if self._instr_prov is not None:
            return self._instr_prov
        return np.asarray(self.instr_prov, dtype=np.int32)

    @cached_property
    def slots(self) -> dict[str, Slot]:
        cols = self.columns
        return {r.name: r.slot(cols.name) for r in self._slot_records}

    @cached_property
    def placement(self) -> dict[str, str]:
        cols = self.columns
        names = [r.name for r in self._slot_records]
        return {cols.name(b): names[s] for b, s in enumerate(self._slot_of.tolist()) if s >= 0}

    # ---- identity ----------------------------------------------------------
    @cached_property
    def hash(self) -> str:
        """Stable content hash (hex, 16 chars), the same for a Program and its executable read
        back. Runtime scalar *values* are not part of it."""
        cols = self.columns
        h = hashlib.sha256()
        h.update(repr((FORMAT_VERSION, self.name, self.inputs, self.outputs, self.spec_name)).encode())
        keys, per_buffer = _first_seen([(k.memory, k.shape, k.dtype, k.role) for k in cols.kinds], cols.kind)
        h.update(repr(keys).encode())
        h.update(per_buffer.tobytes())
        h.update(cols.names_digest())
        if self._instr_prov is not None:  # (the slots' records, without their members' names)
            slots = [(r.name, r.addr, r.nbytes) for r in self._slot_records]
        else:
            slots = [(s.name, s.addr, s.nbytes) for s in self.slots.values()]
        h.update(repr(sorted(slots)).encode())
        h.update(_placement_bytes(self))
        h.update(self.static.digest.encode())  # every instruction, from the columns
        h.update(self.instr_prov_array.astype(np.int32).tobytes())
        h.update(repr(self.provenance).encode())
        return h.hexdigest()[:16]

    @cached_property
    def runtime_scalars(self) -> tuple[str, ...]:
        names = set()
        for instr in self.columns.templates:
            for v in _scalar_fields(instr):
                if isinstance(v, RuntimeScalar):
                    names.add(v.name)
        return tuple(sorted(names))

    # ---- derived data, computed once ---------------------------------------
    @cached_property
    def dependencies(self):
        """CSR arrays ``(indptr, indices)``: predecessors of each instruction."""
        from ._deps import compute_dependencies

        return compute_dependencies(self)

    @cached_property
    def static(self):
        """Preset-independent per-instruction facts (signatures for the cost table)."""
        from ._static import analyze

        return analyze(self)

    def predecessors(self, index: int) -> list[int]:
        indptr, indices = self.dependencies
        return indices[indptr[index]:indptr[index + 1]].tolist()

    def prov_of(self, index: int) -> Provenance:
        return self.provenance[int(self.instr_prov_array[index])]

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return (
            f"Program({self.name!r}, {len(self)} instructions, "
            f"{self.columns.n_buffers} buffers, hash={self.hash})"
        )

    def summary_counts(self) -> dict[str, int]:
        cols = self.columns
        per_template: np.ndarray | list = np.bincount(cols.tmpl, minlength=len(cols.templates)) if len(cols) else []
        counts: dict[str, int] = {}
        for t, c in zip(cols.templates, per_template):
            if c:
                counts[t.KIND] = counts.get(t.KIND, 0) + int(c)
        return counts

    # ---- serialisation -----------------------------------------------------
    def to_json(self) -> dict:
        """The executable as plain data (``dumps`` writes the same document as text)."""
        return {
            "format": "tilescope.executable",
            "version": FORMAT_VERSION,
            "name": self.name,
            "hash": self.hash,
            "spec": self.spec_name,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "buffers": [_fields_dict(b) for b in self.buffers.values()],
            "slots": [_fields_dict(s) for s in self.slots.values()],
            "placement": self.placement,
            "provenance": [_fields_dict(p) for p in self.provenance],
            "instructions": instruction_records(self),
            "meta": self.meta,
        }

    def dumps(self) -> str:
        return self._dumped

    @cached_property
    def _dumped(self) -> str:  # the Program is immutable: serialise it once
        return executable_text(self)

    @classmethod
    def from_json(cls, text_or_data: dict | str) -> "Program":
        data: dict = json.loads(text_or_data) if isinstance(text_or_data, str) else text_or_data
        if data.get("format") != "tilescope.executable":
            raise ValueError("not a tilescope executable (missing format: tilescope.executable)")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"executable format version {data.get('version')} is not supported "
                f"(this tilescope reads version {FORMAT_VERSION})"
            )
        instrs, prov = [], []
        for d in data["instructions"]:
            d = dict(d)
            prov.append(d.pop("prov", 0))
            instrs.append(Instruction.from_json(d))
        prog = cls(
            data["name"],
            [Buffer(**{**b, "shape": tuple(b["shape"])}) for b in data["buffers"]],
            instrs,
            inputs=data["inputs"],
            outputs=data["outputs"],
            provenance=[Provenance(**p) for p in data["provenance"]],
            instr_prov=prov,
            slots=[Slot(**{**s, "members": tuple(s["members"]), "aliases": tuple(s["aliases"])}) for s in data["slots"]],
            placement=data.get("placement", {}),
            meta=data.get("meta", {}),
            spec_name=data.get("spec"),
        )
        if data.get("hash") and data["hash"] != prog.hash:
            raise ValueError(
                f"executable content does not match its recorded hash "
                f"({data['hash']} recorded, {prog.hash} computed): the file was modified or truncated"
            )
        return prog

    # ---- checks ------------------------------------------------------------
    def validate(self, spec=None) -> "Program":
        """Re-run every tile-limit and capacity check; raise a ProgramError on the first problem."""
        from ..spec import preset
        from ._checks import check_instruction, check_buffer, check_slots

        spec = preset(spec if spec is not None else self.spec_name)
        for b in self.buffers.values():
            check_buffer(b, spec)
        for i, instr in enumerate(self.instructions):
            try:
                check_instruction(instr, self.buffers, spec)
            except Exception as e:
                raise type(e)(f"instruction #{i} ({instr.KIND}, from {self.prov_of(i).describe()}): {e}") from e
        check_slots(self, spec)
        return self


def _first_seen(keys: list, of: np.ndarray) -> tuple[list, np.ndarray]:
    """Distinct ``keys`` in order of first use through ``of`` (indices into ``keys``), and
    ``of`` renumbered to them: the same however the keys were shared."""
    ids: dict = {}
    canon = np.array([ids.setdefault(k, len(ids)) for k in keys], dtype=np.int64) if keys else np.zeros(0, np.int64)
    per = canon[of] if len(of) else np.zeros(0, np.int64)
    if not len(per):
        return [], per.astype(np.int32)
    uniq, first = np.unique(per, return_index=True)
    rank = np.empty(len(ids), dtype=np.int64)
    rank[uniq[np.argsort(first, kind="stable")]] = np.arange(len(uniq))
    inv = {v: k for k, v in ids.items()}
    ordered = [inv[int(u)] for u in uniq[np.argsort(first, kind="stable")]]
    return ordered, rank[per].astype(np.int32)


def _placement_bytes(program) -> bytes:
    """Per buffer (in buffer order): the rank of its slot's name, or -1."""
    cols = program.columns
    if program._instr_prov is not None and program._slot_of is not None:
        names = [r.name for r in program._slot_records]
        order = {n: k for k, n in enumerate(sorted(names))}
        rank = np.array([order[n] for n in names] + [-1], dtype=np.int64)
        return rank[program._slot_of].astype(np.int64).tobytes()
    placement = program.placement
    order = {n: k for k, n in enumerate(sorted(program.slots))}
    return np.array([order.get(placement.get(cols.name(b)), -1) for b in range(cols.n_buffers)],
                    dtype=np.int64).tobytes()


def _scalar_fields(instr: Instruction):
    for name in ("scalar0", "scalar1", "scale", "bias", "on_false"):
        if hasattr(instr, name):
            yield getattr(instr, name)
    if hasattr(instr, "attrs"):  # gpsimd_call: runtime scalars nested in its attributes
        yield from _nested_runtime(instr.attrs)


def _nested_runtime(v):
    if isinstance(v, RuntimeScalar):
        yield v
    elif isinstance(v, tuple):
        for x in v:
            yield from _nested_runtime(x)


_FIELDS: dict = {}


def _fields(cls):
    got = _FIELDS.get(cls)
    if got is None:
        got = _FIELDS[cls] = _fields_of(cls)
    return got
