"""An executable's JSON text (``Program.dumps``), written fast.

A profile's first export writes every executable that ran: for one transformer training
step ~50 Programs, ~6k instruction records and ~4k buffer records, ~1.7 MB. orjson writes
it, record dicts built with :func:`fields_dict` (no deep copy). A C encoder of the records
wrote them ~4x faster, but the export as a whole gained nothing from it
(``benchmarks/native_paths.py``: 0.95x), so it was removed.

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

from ..isa import field_access

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


def _records_json(records) -> bytes:
    return orjson.dumps([fields_dict(r) for r in records], option=_ORJSON)


def instructions_json(program) -> bytes:
    """``instruction_records(program)`` as JSON text."""
    return orjson.dumps(instruction_records(program), option=_ORJSON)


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
