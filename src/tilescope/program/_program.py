"""The Program: one representation for everything that runs on the device.

A Program is an ordered list of engine instructions over named buffers in HBM,
SBUF and PSUM, with its inputs, outputs, per-instruction provenance, a stable
content hash and a JSON form (the *executable* file of a profile).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from math import prod
from typing import Iterable

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
    at one allocation ``site`` rotate over ``bufs`` physical buffers.
    """

    name: str
    memory: str
    shape: tuple[int, ...]
    dtype: str
    role: str = "tile"
    site: str | None = None
    bufs: int = 1

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
        buffers: Iterable[Buffer],
        instructions: Iterable[Instruction],
        *,
        inputs: Iterable[str],
        outputs: Iterable[str],
        provenance: Iterable[Provenance] = (),
        instr_prov: Iterable[int] | None = None,
        slots: Iterable[Slot] = (),
        placement: dict[str, str] | None = None,
        meta: dict | None = None,
        spec_name: str | None = None,
    ) -> None:
        self.name = name
        self.buffers: dict[str, Buffer] = {b.name: b for b in buffers}
        self.instructions: tuple[Instruction, ...] = tuple(instructions)
        self.inputs: tuple[str, ...] = tuple(inputs)
        self.outputs: tuple[str, ...] = tuple(outputs)
        self.provenance: tuple[Provenance, ...] = tuple(provenance) or (Provenance(),)
        self.instr_prov: tuple[int, ...] = (
            tuple(instr_prov) if instr_prov is not None else (0,) * len(self.instructions)
        )
        self.slots: dict[str, Slot] = {s.name: s for s in slots}
        self.placement: dict[str, str] = dict(placement or {})  # logical tile -> slot name
        self.meta: dict = dict(meta or {})
        self.spec_name = spec_name
        if len(self.instr_prov) != len(self.instructions):
            raise ValueError("instr_prov must have one entry per instruction")

    # ---- identity ----------------------------------------------------------
    @cached_property
    def hash(self) -> str:
        """Stable content hash (hex, 16 chars). Runtime scalar *values* are not part of it."""
        h = hashlib.sha256()
        h.update(repr((FORMAT_VERSION, self.name, self.inputs, self.outputs, self.spec_name)).encode())
        h.update(repr(sorted((b.name, b.memory, b.shape, b.dtype, b.role) for b in self.buffers.values())).encode())
        h.update(repr(sorted((s.name, s.addr, s.nbytes) for s in self.slots.values())).encode())
        h.update(repr(sorted(self.placement.items())).encode())
        h.update(self.static.digest.encode())  # every instruction, computed in one pass
        h.update(repr(self.instr_prov).encode())
        h.update(repr(self.provenance).encode())
        return h.hexdigest()[:16]

    @cached_property
    def runtime_scalars(self) -> tuple[str, ...]:
        names = set()
        for instr in self.instructions:
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
        return self.provenance[self.instr_prov[index]]

    def __len__(self) -> int:
        return len(self.instructions)

    def __repr__(self) -> str:
        return (
            f"Program({self.name!r}, {len(self.instructions)} instructions, "
            f"{len(self.buffers)} buffers, hash={self.hash})"
        )

    def summary_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for instr in self.instructions:
            counts[instr.KIND] = counts.get(instr.KIND, 0) + 1
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
    def from_json(cls, data: dict | str) -> "Program":
        if isinstance(data, str):
            data = json.loads(data)
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
