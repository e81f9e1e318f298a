"""Preset-independent facts about a Program's instructions, computed once, from its columns.

The scheduler needs, per instruction, its cost and its resource needs. Costs depend
only on an instruction's *signature* -- its kind, engine, operand shapes, strides,
dtypes and memories, and its non-operand fields -- never on which buffer or offset it
touches. A Program of 100k instructions has a few dozen signatures, and its rows share
a few templates (:mod:`tilescope.program._instruction_columns`): the signature is computed once per
template, and the per-instruction arrays are gathers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..isa import AP, Matmul, Transpose, field_access

__all__ = ["StaticInfo", "analyze", "signature"]


@dataclass(frozen=True)
class StaticInfo:
    sig_id: np.ndarray  # int32 per instruction: index into ``representatives``
    representatives: tuple  # one instruction per signature
    memories: tuple  # per signature: tuple of operand memories (reads + writes)
    stationary_change: np.ndarray  # bool per instruction: TensorE must load its stationary
    digest: str  # sha256 of every instruction (signature + operand locations)


def signature(instr, memory_of) -> tuple:
    """The instruction's signature (``memory_of(buffer name) -> memory``)."""
    names, values = field_access(type(instr))
    parts = [instr.KIND]
    for v in values(instr):
        if v.__class__ is AP:
            parts.append((v.dtype, v.dims, memory_of(v.buffer)))
        elif v.__class__ is tuple:
            parts.append(tuple((x.dtype, x.dims, memory_of(x.buffer)) if x.__class__ is AP else x for x in v))
        else:
            parts.append(v)
    return tuple(parts)


def analyze(program) -> StaticInfo:
    cols = program.columns
    n = len(cols)
    templates = cols.templates
    memories_of_buffer: dict[str, str] = {}

    def memory_of(name: str) -> str:
        m = memories_of_buffer.get(name)
        if m is None:
            m = memories_of_buffer[name] = cols.kinds[cols.kind[cols.id_of(name)]].memory
        return m

    # one signature per template, numbered in order of first use by the rows
    sig_keys: dict[tuple, int] = {}
    tsig = np.empty(len(templates), dtype=np.int64)
    for t, instr in enumerate(templates):
        tsig[t] = sig_keys.setdefault(signature(instr, memory_of), len(sig_keys))
    per_row = tsig[cols.tmpl] if n else np.zeros(0, np.int64)
    uniq, first = np.unique(per_row, return_index=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(sig_keys), dtype=np.int64)
    rank[uniq[order]] = np.arange(len(uniq))
    sig_id = rank[per_row].astype(np.int32) if n else np.zeros(0, np.int32)
    reps, mems = [], []
    keys = list(sig_keys)
    for r in first[order].tolist():
        instr = cols.instruction(r)
        reps.append(instr)
        mems.append(tuple(memory_of(ap.buffer) for ap in instr.reads() + instr.writes()))
    stationary_change = _stationary_changes(cols, n)
    h = hashlib.sha256()
    h.update(repr([keys[int(u)] for u in uniq[order]]).encode())
    h.update(sig_id.tobytes())
    w = int((cols.buf[:n] >= 0).sum(axis=1).max()) if n else 0  # the operands used (widths may differ)
    h.update(np.ascontiguousarray(cols.buf[:n, :w]).astype(np.int32).tobytes())
    h.update(np.ascontiguousarray(cols.off[:n, :w]).astype(np.int64).tobytes())
    return StaticInfo(sig_id, tuple(reps), tuple(mems), stationary_change, h.hexdigest())


def _stationary_changes(cols, n: int) -> np.ndarray:
    """A matmul whose stationary operand (buffer, offset, shape) differs from the previous
    matmul's, and every transpose (it loads its source as the stationary)."""
    out = np.zeros(n, dtype=bool)
    if not n:
        return out
    from ._instruction_columns import operand_slots

    templates = cols.templates
    kind = np.zeros(len(templates), dtype=np.int8)  # 1 matmul, 2 transpose
    slot = np.zeros(len(templates), dtype=np.int64)
    dims_key: dict = {}
    dims_id = np.zeros(len(templates), dtype=np.int64)
    for t, instr in enumerate(templates):
        c = instr.__class__
        if c is Matmul:
            kind[t] = 1
            slot[t] = [name for name, _ in operand_slots(instr)].index("stationary")
            st = instr.stationary
            dims_id[t] = dims_key.setdefault((st.dtype, st.dims), len(dims_key))
        elif c is Transpose:
            kind[t] = 2
    rk = kind[cols.tmpl]
    rows = np.nonzero(rk)[0]
    if not len(rows):
        return out
    t = cols.tmpl[rows]
    is_mm = rk[rows] == 1
    j = slot[t]
    b = np.where(is_mm, cols.buf[rows, j], -2)
    o = np.where(is_mm, cols.off[rows, j], -2)
    d = np.where(is_mm, dims_id[t], -2)
    change = np.ones(len(rows), dtype=bool)
    if len(rows) > 1:
        same = (b[1:] == b[:-1]) & (o[1:] == o[:-1]) & (d[1:] == d[:-1]) & is_mm[1:] & is_mm[:-1]
        change[1:] = ~same
    out[rows] = change
    return out
