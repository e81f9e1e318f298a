"""An executable's text: the C encoder writes what the Python path writes, or leaves it to it."""

import dataclasses
import json
import math

import numpy as np
import orjson
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tilescope.device
from tilescope.isa import AP, RuntimeScalar
from tilescope.isa._instructions import _to_json
from tilescope.program import Program, TileBuilder, _dump


def _typed(text):
    """The parsed JSON with floats tagged: 1.0 written as 1 would otherwise compare equal."""
    return json.loads(text, parse_float=lambda s: ("float", float(s)))


def _python_text(prog: Program) -> bytes:
    return orjson.dumps(prog.to_json(), option=_dump._ORJSON)


def test_the_encoder_is_built():
    assert _dump._execjson is not None, "tilescope.program._execjson is not built: run `make setup` (needs a C compiler)"


@pytest.fixture(scope="module")
def lowered_programs():
    """The Programs of a handful of eager ops on the device (APs, runtime scalars, fills, matmul)."""
    tilescope.device.register()
    progs = {}

    def keep(rec):
        if rec.program is not None:
            progs[rec.program.hash] = rec.program

    tilescope.device.subscribe(keep)
    try:
        torch.manual_seed(0)
        lin = torch.nn.Linear(64, 32).to("sim")
        opt = torch.optim.AdamW(lin.parameters(), lr=1e-3)
        x = torch.randn(16, 64, device="sim")
        y = torch.nn.functional.layer_norm(lin(x).softmax(-1), (32,))
        torch.nn.functional.pad(y, (1, 2), value=float("-inf")).amax().backward()
        opt.step()
        torch.where(x > 0, x, torch.full_like(x, float("nan"))).sum().item()
    finally:
        tilescope.device.unsubscribe(keep)
    assert len(progs) >= 8
    return list(progs.values())


def test_every_lowered_program_is_written_by_the_encoder_as_python_writes_it(lowered_programs):
    layouts = _dump._instruction_layouts()
    for prog in lowered_programs:
        # straight through C: no value in a lowering's Program sends it down the slow path
        records = _dump._execjson.encode(prog.instructions, prog.instr_prov, layouts, AP, RuntimeScalar)
        assert _typed(records) == _typed(orjson.dumps(_dump.instruction_records(prog)))
        text = prog.dumps()
        assert _typed(text) == _typed(_python_text(prog))
        assert list(_typed(text)) == list(prog.to_json())  # same keys, same order
        assert Program.from_json(text).hash == prog.hash


def test_without_the_encoder_the_text_is_the_same(lowered_programs, monkeypatch):
    fast = {p.hash: _typed(_dump.executable_text(p)) for p in lowered_programs}
    monkeypatch.setattr(_dump, "_execjson", None)
    for prog in lowered_programs:
        assert _typed(_dump.executable_text(prog)) == fast[prog.hash]


def test_a_value_the_encoder_has_no_form_for_takes_the_python_path():
    b = TileBuilder("numpy_scalar")
    x, y = b.input("x", (128, 8), "float32"), b.output("y", (128, 8), "float32")
    t = b.sbuf((128, 8), "float32")
    b.dma_copy(t, x)
    b.tensor_scalar(t, t, "multiply", 0.25)
    b.dma_copy(y, t)
    built = b.build()
    instrs = list(built.instructions)
    instrs[1] = dataclasses.replace(instrs[1], scalar0=np.float64(0.25))  # a float subclass: refused
    prog = Program(built.name, built.buffers.values(), instrs, inputs=built.inputs, outputs=built.outputs,
                   provenance=built.provenance, instr_prov=built.instr_prov, slots=built.slots.values(),
                   placement=built.placement, meta=built.meta, spec_name=built.spec_name)
    with pytest.raises(TypeError, match="float64"):
        _dump._execjson.encode(prog.instructions, prog.instr_prov, _dump._instruction_layouts(), AP, RuntimeScalar)
    assert _typed(prog.dumps()) == _typed(_python_text(prog))


@dataclasses.dataclass(frozen=True, slots=True)
class _Record:
    a: object
    b: object


_LAYOUT = {_Record: (b'{"kind":"t","op":"t"', ("a", "b"), (b',"a":', b',"b":'), False)}

_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats()
            | st.text(max_size=12) | st.builds(RuntimeScalar, st.text(max_size=8)))
_aps = st.builds(AP, st.text(max_size=8), st.sampled_from(["float32", "bfloat16"]), st.integers(0, 2**40),
                 st.lists(st.tuples(st.integers(-4096, 4096), st.integers(1, 4096)), max_size=4).map(tuple))
_values = st.recursive(_scalars | _aps, lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=12)


@given(st.lists(st.tuples(_values, _values, st.integers(0, 2**31)), max_size=6))
def test_encoder_writes_any_field_value_as_instruction_to_json_does(rows):
    records = tuple(_Record(a, b) for a, b, _ in rows)
    prov = tuple(p for *_, p in rows)
    text = _dump._execjson.encode(records, prov, _LAYOUT, AP, RuntimeScalar)
    expected = [{"kind": "t", "op": "t", "a": _to_json(a), "b": _to_json(b), "prov": p} for a, b, p in rows]
    assert _typed(text) == _typed(orjson.dumps(expected))


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, [1, 2], {"k": 1}, np.int64(3), 1.5j])
def test_encoder_refuses_what_it_cannot_write_exactly(value):
    with pytest.raises(TypeError):
        _dump._execjson.encode((_Record(value, None),), (0,), _LAYOUT, AP, RuntimeScalar)


def test_plain_records_write_tuples_as_arrays_and_refuse_non_finite_floats():
    layout = {_Record: _dump.record_layout(_Record)}
    text = _dump._execjson.encode((_Record((1, (2, "x")), 0.1),), None, layout, AP, RuntimeScalar)
    assert _typed(text) == [{"a": [1, [2, "x"]], "b": ("float", 0.1)}]
    with pytest.raises(TypeError):
        _dump._execjson.encode((_Record(math.inf, 0),), None, layout, AP, RuntimeScalar)
