"""An executable's JSON text (``Program.dumps``): the document ``Program.to_json`` returns, and back."""

import json

import orjson
import pytest
import torch

import tilescope.device
from tilescope.program import Program, _dump


def _typed(text):
    """The parsed JSON with floats tagged: 1.0 written as 1 would otherwise compare equal."""
    return json.loads(text, parse_float=lambda s: ("float", float(s)))


def _python_text(prog: Program) -> bytes:
    return orjson.dumps(prog.to_json(), option=_dump._ORJSON)


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


def test_every_lowered_program_is_written_as_its_document_and_read_back(lowered_programs):
    for prog in lowered_programs:
        assert _typed(orjson.dumps(_dump.instruction_records(prog))) == _typed(_dump.instructions_json(prog))
        text = prog.dumps()
        assert _typed(text) == _typed(_python_text(prog))
        assert list(_typed(text)) == list(prog.to_json())  # same keys, same order
        assert Program.from_json(text).hash == prog.hash
