"""An executable's JSON text (``Program.dumps``), written fast.

A profile's first export writes every executable that ran: for one transformer training
step ~50 Programs, ~6k instruction records and ~4k buffer records, ~1.7 MB. The records
are written by the C encoder ``_execjson`` when it is built (~4x faster than building the
dicts in Python for orjson), everything else by orjson. Both paths write the document
``Program.to_json`` returns; a record the encoder has no form for (it raises TypeError)
sends that part of the document down the Python path.

>>> import json
>>> from tilescope.program import TileBuilder
>>> b = TileBuilder("scale")
>>> x, y = b.input("x", (128, 64), "float32"), b.output("y", (128, 64), "float32")
>>> t = b.sbuf((128, 64), "float32")
>>> _ = b.dma_copy(t, x), b.tensor_scalar(t, t, "multiply", float("nan")), b.dma_copy(y, t)
>>> prog = b.build()
>>> json.loads(prog.dumps()) == json.loads(json.dumps(prog.to_json()))  # nan as {"float": "nan"}
True
"""

from __future__ import annotations

import orjson

from ..isa import AP, INSTRUCTION_KINDS, RuntimeScalar, field_access

try:
    from . import _execjson
except ImportError:  # not built (no compiler at install time): orjson writes everything
    _execjson = None

__all__ = ["FORMAT_VERSION", "executable_text", "instruction_records", "fields_dict"]

FORMAT_VERSION = 1  # of the executable format

_ORJSON = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def fields_dict(record) -> dict:
    """A flat dataclass record as a dict (``asdict`` deep-copies every value: far slower, and
    an executable holds thousands of records). Tuples stay tuples: JSON writes them as lists."""
    names, values = field_access(type(record))
    return dict(zip(names, values(record)))


def _with_prov(d: dict, prov: int) -> dict:
    d["prov"] = prov
    return d


def instruction_records(program) -> list[dict]:
    """The executable's ``instructions``: each instruction's JSON form and its provenance index."""
    return [_with_prov(instr.to_json(), p) for instr, p in zip(program.instructions, program.instr_prov)]


def _keys(names, first: str) -> tuple[bytes, ...]:
    return tuple(((first if i == 0 else ",") + orjson.dumps(n).decode() + ":").encode() for i, n in enumerate(names))


def record_layout(cls) -> tuple[bytes, tuple[str, ...], tuple[bytes, ...], bool]:
    """``fields_dict``'s object for the C encoder: every field, plain values, in field order."""
    names, _ = field_access(cls)
    return b"{", names, _keys(names, ""), True


def instruction_layout(cls) -> tuple[bytes, tuple[str, ...], tuple[bytes, ...], bool]:
    """``Instruction.to_json``'s record for the C encoder: the opening text up to the fields
    (``"op"`` is left to the field of that name when there is one, as ``to_json`` lets it
    overwrite the kind), every field in field order, values in their instruction-field forms."""
    names, _ = field_access(cls)
    prefix = {"kind": cls.KIND} if "op" in names else {"kind": cls.KIND, "op": cls.KIND}
    return orjson.dumps(prefix)[:-1], names, _keys(names, ","), False


_INSTRUCTION_LAYOUTS: dict[type, tuple] = {}  # instruction class -> instruction_layout, every kind
_KINDS_SEEN = [0]  # how many kinds were registered when _INSTRUCTION_LAYOUTS was built
_RECORD_LAYOUTS: dict[type, tuple] = {}  # Buffer, Slot, Provenance -> record_layout


def _instruction_layouts() -> dict[type, tuple]:
    if _KINDS_SEEN[0] != len(INSTRUCTION_KINDS):  # a kind registered since: rebuild
        _INSTRUCTION_LAYOUTS.clear()
        _INSTRUCTION_LAYOUTS.update((cls, instruction_layout(cls)) for cls in INSTRUCTION_KINDS.values()
                                    if "prov" not in field_access(cls)[0])  # "prov" is the record's own key
        _KINDS_SEEN[0] = len(INSTRUCTION_KINDS)
    return _INSTRUCTION_LAYOUTS


def _encoded(records: tuple, layouts: dict, prov, python_form) -> bytes:
    """The JSON array of ``records``: by the C encoder, else orjson of ``python_form()``."""
    if _execjson is not None:
        try:
            return _execjson.encode(records, prov, layouts, AP, RuntimeScalar)
        except TypeError:
            pass
    return orjson.dumps(python_form(), option=_ORJSON)


def _records_json(records) -> bytes:
    records = tuple(records)
    for cls in {type(r) for r in records} - _RECORD_LAYOUTS.keys():
        _RECORD_LAYOUTS[cls] = record_layout(cls)
    return _encoded(records, _RECORD_LAYOUTS, None, lambda: [fields_dict(r) for r in records])


def instructions_json(program) -> bytes:
    """``instruction_records(program)`` as JSON text."""
    return _encoded(program.instructions, _instruction_layouts(), program.instr_prov,
                    lambda: instruction_records(program))


def executable_text(program) -> str:
    """``program.to_json()`` as JSON text (same keys, same order)."""
    parts = (
        orjson.dumps({
            "format": "tilescope.executable", "version": FORMAT_VERSION, "name": program.name,
            "hash": program.hash, "spec": program.spec_name, "inputs": list(program.inputs),
            "outputs": list(program.outputs),
        }, option=_ORJSON)[:-1],
        b',"buffers":', _records_json(program.buffers.values()),
        b',"slots":', _records_json(program.slots.values()),
        b',"placement":', orjson.dumps(program.placement, option=_ORJSON),
        b',"provenance":', _records_json(program.provenance),
        b',"instructions":', instructions_json(program),
        b',"meta":', orjson.dumps(program.meta, option=_ORJSON), b"}",
    )
    return b"".join(parts).decode()
