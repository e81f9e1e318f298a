"""Preset-independent facts about a Program's instructions, computed once.

The scheduler needs, per instruction, its cost and its resource needs. Costs
depend only on an instruction's *signature* -- its kind, engine, operand shapes,
strides, dtypes and memories, and its non-operand fields -- never on which buffer
or offset it touches. A Program of 100k instructions has a few dozen signatures,
so the cost table runs once per signature and the scheduler gathers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields

import numpy as np

from ..isa import AP, Matmul, Transpose

__all__ = ["StaticInfo", "analyze"]


@dataclass(frozen=True)
class StaticInfo:
    sig_id: np.ndarray  # int32 per instruction: index into ``representatives``
    representatives: tuple  # one instruction per signature
    memories: tuple  # per signature: tuple of operand memories (reads + writes)
    stationary_change: np.ndarray  # bool per instruction: TensorE must load its stationary
    digest: str  # sha256 of every instruction (signature + operand locations)


_FIELDS: dict[type, tuple[str, ...]] = {}


def _signature(instr, buffers, locs: list) -> tuple:
    """The instruction's signature; its operands' (buffer, offset) go to ``locs``."""
    names = _FIELDS.get(type(instr))
    if names is None:
        names = _FIELDS[type(instr)] = tuple(f.name for f in fields(instr))
    parts = [instr.KIND]
    for v in map(instr.__getattribute__, names):
        if v.__class__ is AP:
            parts.append((v.dtype, v.dims, buffers[v.buffer].memory))
            locs.append(v.buffer)
            locs.append(v.offset)
        elif v.__class__ is tuple:
            sub = []
            for x in v:
                if x.__class__ is AP:
                    sub.append((x.dtype, x.dims, buffers[x.buffer].memory))
                    locs.append(x.buffer)
                    locs.append(x.offset)
                else:
                    sub.append(x)
            parts.append(tuple(sub))
        else:
            parts.append(v)
    return tuple(parts)


def analyze(program) -> StaticInfo:
    buffers = program.buffers
    n = len(program.instructions)
    sig_id = np.empty(n, dtype=np.int32)
    stationary_change = np.zeros(n, dtype=bool)
    ids: dict[tuple, int] = {}
    reps: list = []
    mems: list = []
    last_stationary = None
    locs: list = []
    for i, instr in enumerate(program.instructions):
        sig = _signature(instr, buffers, locs)
        k = ids.get(sig)
        if k is None:
            k = ids[sig] = len(reps)
            reps.append(instr)
            mems.append(tuple(buffers[ap.buffer].memory for ap in instr.reads() + instr.writes()))
        sig_id[i] = k
        t = type(instr)
        if t is Matmul:
            if instr.stationary != last_stationary:
                stationary_change[i] = True
            last_stationary = instr.stationary
        elif t is Transpose:
            stationary_change[i] = True
            last_stationary = None
    h = hashlib.sha256()
    h.update(repr([_signature(r, buffers, []) for r in reps]).encode())
    h.update(sig_id.tobytes())
    h.update(repr(locs).encode())
    return StaticInfo(sig_id, tuple(reps), tuple(mems), stationary_change, h.hexdigest())
