"""A Program's instructions and buffers as arrays: what building and scheduling read.

A kernel of 100k instructions is mostly a few loop bodies repeated at shifted offsets
(tilescope.lang._loops). Holding one Python object per instruction and per buffer would
cost more than tracing it, so the builder keeps them as columns:

* ``templates``: instruction objects; each row of the Program is one of them with its
  operands moved: ``tmpl[i]`` names the template, ``buf[i, j]`` / ``off[i, j]`` are the
  buffer id and offset of its ``j``-th operand (``-1`` past the template's operands).
* buffers: ``kinds`` (Buffer records), ``kind[b]`` the record of buffer id ``b``, and
  ``names[b]`` its name, or None for a replica, named ``f"{kinds[kind[b]].name}~{b}"``.

:meth:`Columns.instruction` and :meth:`Columns.buffer` make the objects on demand
(the numerics, the executable's JSON, tests); allocation, dependencies, the static
analysis, the hash and the scheduler work on the arrays.

>>> from tilescope.isa import AP, TensorScalar
>>> from tilescope.program._program import Buffer
>>> cols = Columns.from_objects(
...     [TensorScalar(AP("t", "float32", 0, ((4, 2), (1, 4))), AP("t", "float32", 0, ((4, 2), (1, 4))), "add", 1.0)],
...     {"t": Buffer("t", "sbuf", (2, 4), "float32")})
>>> cols.buf.tolist(), cols.off.tolist(), cols.instruction(0).op0
([[0, 0]], [[0, 0]], 'add')
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable

import numpy as np

from ..isa import AP, field_access
from ._program import Buffer

__all__ = ["Columns", "operand_slots", "operands_of"]

_REPLICA = re.compile(r"~r(\d+)$")

_SLOTS: dict[tuple, tuple] = {}


def operand_slots(instr) -> tuple[tuple[str, int | None], ...]:
    """(field, sub-index or None) of each AP operand of ``instr``, in field order."""
    cls = instr.__class__
    names, values = field_access(cls)
    # which fields hold APs (a scalar operand may be a number or a [P, 1] AP)
    key = (cls,) + tuple(-2 if v.__class__ is AP else (tuple(x.__class__ is AP for x in v) if v.__class__ is tuple
                                                        else -1) for v in values(instr))
    hit = _SLOTS.get(key)
    if hit is None:
        out: list[tuple[str, int | None]] = []
        for name, v in zip(names, values(instr)):
            if v.__class__ is AP:
                out.append((name, None))
            elif v.__class__ is tuple:
                out.extend((name, j) for j, x in enumerate(v) if x.__class__ is AP)
        hit = _SLOTS[key] = tuple(out)
    return hit


def operands_of(instr) -> list[AP]:
    """The AP operands of ``instr`` in slot order."""
    out = []
    for name, sub in operand_slots(instr):
        v = getattr(instr, name)
        out.append(v if sub is None else v[sub])
    return out


class Columns:
    """Instructions and buffers as arrays (see the module docs)."""

    def __init__(self, templates: list, tmpl: np.ndarray, buf: np.ndarray, off: np.ndarray, kinds: list[Buffer],
                 kind: np.ndarray, names: list):
        self.templates = templates
        self.tmpl = tmpl
        self.buf = buf
        self.off = off
        self.kinds = kinds
        self.kind = kind
        self.names = names
        self._ids: dict[str, int] | None = None
        self._tslots: list | None = None
        self._tops: list | None = None

    def __len__(self) -> int:
        return len(self.tmpl)

    @property
    def n_buffers(self) -> int:
        return len(self.kind)

    # ---- buffers ------------------------------------------------------------------------
    def name(self, b: int) -> str:
        n = self.names[b]
        return n if n is not None else f"{self.kinds[self.kind[b]].name}~r{b}"

    def all_names(self) -> list[str]:
        """:meth:`name` of every buffer id, in order."""
        kn = [k.name for k in self.kinds]
        return [n if n is not None else f"{kn[k]}~r{b}" for b, (n, k) in enumerate(zip(self.names, self.kind.tolist()))]

    def names_digest(self) -> bytes:
        """Every buffer's name (:meth:`all_names`) as bytes, in a form that does not build
        the names of replicas: each name that ends with ``~r<its id>`` as its prefix and a
        flag, others whole. The same for any columns with the same names, however they
        are kept (as replicas of records, or spelt out)."""
        kn = [k.name for k in self.kinds]
        parts = list(map(kn.__getitem__, self.kind.tolist()))
        implicit = np.array([n is None for n in self.names], dtype=bool)
        for b in np.flatnonzero(~implicit).tolist():
            name = self.names[b]
            m = _REPLICA.search(name)
            if m is not None and int(m.group(1)) == b and m.group(1) == str(b):
                parts[b], implicit[b] = name[:m.start()], True
            else:
                parts[b] = name
        return "\0".join(parts).encode() + b"\1" + implicit.tobytes()

    def buffer(self, b: int) -> Buffer:
        rec = self.kinds[self.kind[b]]
        return rec if self.names[b] == rec.name else dataclasses.replace(rec, name=self.name(b))

    def id_of(self, name: str) -> int:
        if self._ids is None:
            self._ids = {n: b for b, n in enumerate(self.names) if n is not None}
        b = self._ids.get(name)
        if b is None:
            m = _REPLICA.search(name)
            if m is None or int(m.group(1)) >= len(self.kind) or self.name(int(m.group(1))) != name:
                raise KeyError(name)
            b = int(m.group(1))
        return b

    def buffer_dict(self) -> dict[str, Buffer]:
        return {self.name(b): self.buffer(b) for b in range(len(self.kind))}

    def kind_attr(self, attr: str, dtype=None) -> np.ndarray:
        """Per buffer id: an attribute of its record (``memory``, ``row_elems``, ...)."""
        vals = [getattr(k, attr) for k in self.kinds]
        arr = np.array(vals, dtype=dtype) if dtype is not None else np.array(vals, dtype=object)
        return arr[self.kind] if len(self.kind) else arr[:0]

    # ---- instructions ------------------------------------------------------------------
    def _template_info(self):
        if self._tslots is None:
            self._tslots = [operand_slots(t) for t in self.templates]
            self._tops = [operands_of(t) for t in self.templates]
        return self._tslots, self._tops

    def instruction(self, i: int):
        t = int(self.tmpl[i])
        tmpl = self.templates[t]
        slots, ops = self._template_info()
        slots, ops = slots[t], ops[t]
        changes: dict = {}
        row_b, row_o = self.buf[i], self.off[i]
        for j, ((name, sub), ap) in enumerate(zip(slots, ops)):
            bname = self.name(int(row_b[j]))
            o = int(row_o[j])
            if bname == ap.buffer and o == ap.offset:
                continue
            new = AP(bname, ap.dtype, o, ap.dims)
            if sub is None:
                changes[name] = new
            else:
                lst = changes.get(name)
                if lst is None:
                    lst = changes[name] = list(getattr(tmpl, name))
                lst[sub] = new
        if not changes:
            return tmpl
        for k, v in changes.items():
            if isinstance(v, list):
                changes[k] = tuple(v)
        return dataclasses.replace(tmpl, **changes)

    def instructions(self) -> list:
        return [self.instruction(i) for i in range(len(self.tmpl))]

    @classmethod
    def from_objects(cls, instructions: Iterable, buffers: dict[str, Buffer]) -> "Columns":
        """Columns of a list of instruction objects over ``buffers`` (each instruction its own template)."""
        instructions = list(instructions)
        names = list(buffers)
        ids = {name: k for k, name in enumerate(names)}
        width = max([len(operand_slots(ins)) for ins in instructions] + [1])
        n = len(instructions)
        buf = np.full((n, width), -1, dtype=np.int32)
        off = np.zeros((n, width), dtype=np.int64)
        for i, ins in enumerate(instructions):
            for j, ap in enumerate(operands_of(ins)):
                buf[i, j] = ids[ap.buffer]
                off[i, j] = ap.offset
        kinds = list(buffers.values())
        c = cls(instructions, np.arange(n, dtype=np.int32), buf, off, kinds, np.arange(len(kinds), dtype=np.int32),
                names)
        c._ids = ids
        return c
