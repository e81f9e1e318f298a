"""The scheduler: the single place that turns a Program into modeled time.

Model (each rule is one line of the loop below):

* Every engine (TensorE, ScalarE, VectorE, GpSimd) runs its instructions in program
  order, one at a time; each DMA queue likewise. An instruction starts when its
  engine is free and every instruction it depends on has finished.
* A matmul whose stationary operand differs from the previous matmul's first loads
  it on TensorE's LoadStationary lane, which runs in the background of the previous
  matmul (nki.isa cost notes).
* A DMA instruction runs on one queue (named by the instruction, else chosen by the
  preset's ``DmaSpec.queue_policy``). Issuing it costs the fixed ~1.3 us on its queue,
  one instruction after another, pipelined with the data movement of the queue's
  previous transfer. Its data then moves on the DMA engines of the partitions it
  touches, each engine one transfer at a time and each queue in order on every engine;
  transfers touching HBM also draw on HBM's bandwidth (see :func:`tilescope.isa.dma_cost`).
* An instruction that depends on the one just before it on the same engine pays the
  engine's dependent-instruction overhead (its pipeline drains first) [arch].
* Shared ports [arch]: VectorE and GpSimd cannot access SBUF at the same time;
  VectorE and ScalarE cannot access PSUM at the same time (NeuronCore-v2; the preset's
  ``shared_ports`` names them, and v3 lifts both [arch2]).

The costs are computed here with numpy, once per instruction signature; the loop that
claims engines, queues and ports in program order is :func:`_loop_reference`, which the C
extension ``tilescope.sim._loop`` runs bit for bit identically when it is built (a change to
a rule of the loop is made in both; tests/test_scheduler_native.py compares them).
"""

from __future__ import annotations

import os
from types import ModuleType

import numpy as np

from ..isa import (
    DmaCopy, DmaIndirect, Matmul, Transpose, dma_cost, dma_engines, dma_indirect_cost, engine_cycles,
    flops, load_stationary_cycles,
)
from ..program import operand_slots
from ..spec import CoreSpec
from ._resources import DmaEngines, IntervalResource
from ._timeline import LANE_GROUPS, SimResult, Summary, Timeline

_native: ModuleType | None
try:  # the loop in C, if built; TILESCOPE_NATIVE=0 runs the Python reference
    if os.environ.get("TILESCOPE_NATIVE", "1") == "0":
        raise ImportError
    from . import _loop as _native
except ImportError:
    _native = None

__all__ = ["schedule"]

_ENGINE_LANES = {"pe": 0, "act": 2, "dve": 3, "pool": 4}
_FIXED_LANES = ("TensorE", "TensorE.LoadStationary", "ScalarE", "VectorE", "GpSimd")
_LS = 1
_DMA = -1


def lane_names(spec: CoreSpec) -> tuple[str, ...]:
    return _FIXED_LANES + tuple(f"DMA.q{q}" for q in range(spec.dma.queues))



def _signature_costs(rep, memories, spec: CoreSpec) -> tuple:
    """Cost-table row of one instruction signature:
    (lane, dur_ns, ls_ns, dma_fixed_ns, nbytes, flops, sbuf_port, psum_port, hbm_read, hbm_write,
     is_pe, dma_descriptors, dma_partitions, dependent_ns)."""
    fl = flops(rep)
    if isinstance(rep, DmaCopy):
        src_mem, dst_mem = memories[0], memories[-1]  # (an indirect DMA also reads its index tile)
        cost = (dma_indirect_cost(rep, spec, src_mem, dst_mem) if isinstance(rep, DmaIndirect)
                else dma_cost(rep, spec, src_mem, dst_mem))
        return (_DMA, 0.0, 0.0, cost.fixed_ns, cost.nbytes, fl, False, False, cost.hbm_read, cost.hbm_write,
                False, cost.descriptors, cost.partitions, 0.0)
    engine = rep.engine
    espec = spec.engines[engine]
    dur = espec.ns(engine_cycles(rep, spec))
    nbytes = sum(ap.nbytes for ap in rep.reads() + rep.writes())
    if isinstance(rep, (Matmul, Transpose)):
        ls = spec.tensor.ns(load_stationary_cycles(rep))
        return (0, dur, ls, 0.0, nbytes, fl, False, False, 0, 0, True, 0, 0, 0.0)
    sbuf_port = "sbuf" in spec.shared_ports and engine in ("dve", "pool") and "sbuf" in memories
    psum_port = "psum" in spec.shared_ports and engine in ("dve", "act") and "psum" in memories
    return (_ENGINE_LANES[engine], dur, 0.0, 0.0, nbytes, fl, sbuf_port, psum_port, 0, 0, False, 0, 0,
            espec.ns(espec.dependent_cycles))


_COLUMNS = (
    ("lane", np.int64), ("dur", np.float64), ("ls", np.float64), ("fixed", np.float64),
    ("nbytes", np.int64), ("flops", np.float64), ("sbuf", bool), ("psum", bool), ("hbm_read", np.int64),
    ("hbm_write", np.int64), ("pe", bool), ("desc", np.int64), ("parts", np.int64), ("dep", np.float64),
)


def _precompute(program, spec: CoreSpec):
    """Per-instruction cost arrays: the cost table applied once per signature, then gathered."""
    static = program.static
    rows = [_signature_costs(rep, mem, spec) for rep, mem in zip(static.representatives, static.memories)]
    table = {name: np.array([r[k] for r in rows], dtype=dt) for k, (name, dt) in enumerate(_COLUMNS)}
    sid = static.sig_id
    cols = {name: arr[sid] for name, arr in table.items()}
    cols["ls"] = np.where(static.stationary_change, cols["ls"], 0.0)
    is_dma = cols["lane"] == _DMA
    cols["dur"] = cols["dur"] + np.where(_depends_on_previous(program, cols["lane"]), cols["dep"], 0.0)
    cols["queue"], cols["first_part"] = _dma_placement(program, spec, cols, is_dma)
    totals = dict(
        hbm_read=int(cols["hbm_read"].sum()), hbm_write=int(cols["hbm_write"].sum()),
        transfers=int(is_dma.sum()), dma_bytes=int(cols["nbytes"][is_dma].sum()),
    )
    return cols, totals


def _depends_on_previous(program, lane: np.ndarray) -> np.ndarray:
    """Per instruction: does it depend on the instruction just before it on the same
    compute engine? (TensorE accumulation into PSUM is near-memory, not a dependency
    stall, and DMA queues are modeled on their own.)"""
    n = len(lane)
    flag = np.zeros(n, dtype=bool)
    if n < 2:
        return flag
    indptr, indices = program.dependencies
    prev = np.full(n, -1, dtype=np.int64)
    order = np.argsort(lane, kind="stable")  # instructions grouped by lane, program order kept
    same = lane[order[1:]] == lane[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    counts = np.diff(np.asarray(indptr))
    rows = np.repeat(np.arange(n), counts)
    hit = np.asarray(indices) == prev[rows]
    flag[rows[hit]] = True
    return flag & (lane > 0)


def _dma_placement(program, spec: CoreSpec, cols, is_dma):
    """Queue (-1: the scheduler picks the queue that frees first) and first partition
    of every DMA instruction, from the Program's columns (no instruction objects)."""
    n = len(is_dma)
    queue = np.full(n, -1, dtype=np.int64)
    first = np.zeros(n, dtype=np.int64)
    if not is_dma.any():
        return queue, first
    idx = np.flatnonzero(is_dma)
    static = program.static
    c = program.columns
    # per template of a DMA: the operand slots of dst and src and their partition strides
    tmpl = c.tmpl[idx]
    slot = np.zeros((len(c.templates), 2), dtype=np.int64)
    stride = np.zeros((len(c.templates), 2), dtype=np.int64)
    of_class: dict = {}
    templates = c.templates
    for t in np.unique(tmpl).tolist():
        ins = templates[t]
        cls = ins.__class__
        js = of_class.get(cls)
        if js is None:  # (dst and src are AP fields of every DMA class: their slots are the class's)
            slots = operand_slots(ins)
            js = of_class[cls] = (slots.index(("dst", None)), slots.index(("src", None)))
        slot[t] = js
        d, sr = ins.dst.dims, ins.src.dims
        stride[t, 0] = d[0][0] if d else 0
        stride[t, 1] = sr[0][0] if sr else 0
    dst_b = c.buf[idx, slot[tmpl, 0]].astype(np.int64)
    src_b = c.buf[idx, slot[tmpl, 1]].astype(np.int64)
    hbm = np.array([k.memory == "hbm" for k in c.kinds], dtype=bool)[c.kind]
    src_hbm, dst_hbm = hbm[src_b], hbm[dst_b]
    # the first partition of the on-chip side (of the destination between on-chip memories)
    side = np.where(dst_hbm, 1, 0)
    off = c.off[idx, slot[tmpl, side]]
    st = stride[tmpl, side]
    part = np.where(st > 0, off // np.where(st > 0, st, 1), 0)
    first[idx] = np.where(cols["parts"][idx] > 0, part, 0)
    if spec.dma.queue_policy == "site":
        # the site: the HBM tensor moved (or, on chip, the destination) and the direction;
        # one queue per site, sites dealt round-robin in order of first use
        key = np.where(src_hbm, src_b, dst_b) * 4 + src_hbm * 2 + dst_hbm
        _, first_use, inverse = np.unique(key, return_index=True, return_inverse=True)
        rank = np.empty(len(first_use), dtype=np.int64)
        rank[np.argsort(first_use, kind="stable")] = np.arange(len(first_use))
        queue[idx] = rank[inverse.reshape(-1)] % spec.dma.queues
    named = {k: r.queue for k, r in enumerate(static.representatives) if isinstance(r, DmaCopy) and r.queue is not None}
    if named:
        sig = static.sig_id[idx]
        for k, q in named.items():
            queue[idx[sig == k]] = q
    return queue, first


def _dma_engine_work(spec: CoreSpec, cols):
    """Per instruction: first DMA engine, engines spanned, each engine's piece (ns) and
    the HBM time (ns) of its bytes."""
    first, count, piece = dma_engines(cols["parts"], cols["desc"], cols["nbytes"], cols["first_part"], spec)
    hbm = (cols["hbm_read"] + cols["hbm_write"]) / spec.hbm_bytes_per_ns
    return first, count, np.where(cols["lane"] == _DMA, piece, 0.0), hbm


def schedule(program, spec: CoreSpec) -> SimResult:
    """Schedule ``program`` on ``spec``; deterministic."""
    cols, totals = _precompute(program, spec)
    first_engine, engine_count, piece_ns, hbm_ns = _dma_engine_work(spec, cols)
    indptr, indices = program.dependencies
    work = (indptr, indices, cols["lane"], cols["dur"], cols["ls"], cols["queue"], cols["fixed"], first_engine,
            engine_count, piece_ns, hbm_ns, cols["sbuf"], cols["psum"])
    loop = _loop_native if _native is not None else _loop_reference
    start, end, out_lane, ls_rows = loop(work, spec.dma.engines, spec.dma.queues)
    fl = cols["flops"]
    timeline = _timeline(program, start, end, out_lane, cols["nbytes"], fl, ls_rows, lane_names(spec))
    summary = _summary(program, spec, timeline, fl, cols["pe"], totals)
    return SimResult(timeline, summary)


def _loop_native(work, engines: int, queues: int):
    """:func:`_loop_reference` in C (tilescope.sim._loop): the same times, bit for bit."""
    assert _native is not None  # (called only when the C loop is built)
    arrays: list[np.ndarray] = [np.ascontiguousarray(a, dtype=dt) for a, dt in zip(work, _WORK_DTYPES)]
    start, end, lane, li, ls, le = _native.run(*arrays, int(engines), int(queues))
    f64 = np.float64
    ls_rows = (np.frombuffer(li, dtype=np.int64), np.frombuffer(ls, dtype=f64), np.frombuffer(le, dtype=f64))
    return np.frombuffer(start, dtype=f64), np.frombuffer(end, dtype=f64), np.frombuffer(lane, dtype=np.int64), ls_rows


_WORK_DTYPES = (np.int64, np.int32, np.int64, np.float64, np.float64, np.int64, np.float64, np.int64, np.int64,
                np.float64, np.float64, np.bool_, np.bool_)


def _loop_reference(work, engines: int, queues: int):
    """The scheduling loop: each instruction in program order claims its engine (or DMA
    queue, DMA engines and HBM) and the shared ports. Returns (start, end, lane) per
    instruction and the LoadStationary rows (instruction, start, end) as arrays."""
    (indptr, indices, lane, dur, ls_dur, queue, dma_fixed, first_engine, engine_count, piece_ns, hbm_ns,
     port_sbuf, port_psum) = work
    n = len(lane)
    ls_rows: list[tuple[int, float, float]] = []

    engine_free = [0.0] * len(_FIXED_LANES)
    dma = DmaEngines(engines, queues)
    sbuf_port = IntervalResource()
    psum_port = IntervalResource()

    indptr_l = np.asarray(indptr).tolist()
    indices_l = np.asarray(indices).tolist()
    lane_l = lane.tolist()
    dur_l = dur.tolist()
    ls_l = ls_dur.tolist()
    queue_l = queue.tolist()
    fixed_l = dma_fixed.tolist()
    first_l = np.asarray(first_engine).tolist()
    count_l = np.asarray(engine_count).tolist()
    piece_l = np.asarray(piece_ns).tolist()
    hbm_l = np.asarray(hbm_ns).tolist()
    psb = port_sbuf.tolist()
    pps = port_psum.tolist()
    end_l = [0.0] * n
    start_l = [0.0] * n
    olane = [0] * n

    for i in range(n):
        ready = 0.0
        for k in range(indptr_l[i], indptr_l[i + 1]):
            e = end_l[indices_l[k]]
            if e > ready:
                ready = e
        ln = lane_l[i]
        if ln == _DMA:
            q = queue_l[i]
            if q < 0:
                q = dma.first_free_queue()
            s, e = dma.transfer(ready, q, fixed_l[i], first_l[i], count_l[i], piece_l[i], hbm_l[i])
            olane[i] = len(_FIXED_LANES) + q
        elif ln == 0:  # TensorE
            s = engine_free[0] if engine_free[0] > ready else ready
            if ls_l[i] > 0.0:
                # LoadStationary reads only the stationary operand: it waits for producers on
                # other engines, not for earlier matmuls (an accumulation group into PSUM orders
                # the multiplies, while the next stationary loads in the background [arch])
                ls_ready = 0.0
                for k in range(indptr_l[i], indptr_l[i + 1]):
                    j = indices_l[k]
                    if lane_l[j] != 0 and end_l[j] > ls_ready:
                        ls_ready = end_l[j]
                ls_s = engine_free[_LS] if engine_free[_LS] > ls_ready else ls_ready
                ls_e = ls_s + ls_l[i]
                engine_free[_LS] = ls_e
                ls_rows.append((i, ls_s, ls_e))
                if ls_e > s:
                    s = ls_e
            e = s + dur_l[i]
            engine_free[0] = e
            olane[i] = 0
        else:
            s = engine_free[ln] if engine_free[ln] > ready else ready
            d = dur_l[i]
            if psb[i] or pps[i]:
                while True:
                    t = s
                    if psb[i]:
                        t = sbuf_port.earliest_gap(t, d)
                    if pps[i]:
                        t = psum_port.earliest_gap(t, d)
                    if t == s:
                        break
                    s = t
                if psb[i]:
                    sbuf_port.reserve(s, s + d)
                if pps[i]:
                    psum_port.reserve(s, s + d)
            e = s + d
            engine_free[ln] = e
            olane[i] = ln
        start_l[i] = s
        end_l[i] = e

    ls_out = (np.array([r[0] for r in ls_rows], dtype=np.int64), np.array([r[1] for r in ls_rows], dtype=np.float64),
              np.array([r[2] for r in ls_rows], dtype=np.float64))
    return (np.array(start_l, dtype=np.float64), np.array(end_l, dtype=np.float64), np.array(olane, dtype=np.int64),
            ls_out)


def _timeline(program, start, end, lane, nbytes, fl, ls_rows, lanes) -> Timeline:
    reps = program.static.representatives
    kinds = sorted({r.KIND for r in reps} | {"load_stationary"})
    kind_id = {k: j for j, k in enumerate(kinds)}
    kind = np.array([kind_id[r.KIND] for r in reps], dtype=np.int16)[program.static.sig_id]
    index = np.arange(len(start), dtype=np.int64)
    prov = np.asarray(program.instr_prov_array, dtype=np.int32)
    li, ls_start, ls_end = ls_rows
    if len(li):
        index = np.concatenate([index, li])
        lane = np.concatenate([lane, np.full(len(li), _LS, dtype=np.int64)])
        start = np.concatenate([start, ls_start])
        end = np.concatenate([end, ls_end])
        nbytes = np.concatenate([nbytes, np.zeros(len(li), dtype=np.int64)])
        fl = np.concatenate([fl, np.zeros(len(li))])
        prov = np.concatenate([prov, prov[li]])
        kind = np.concatenate([kind, np.full(len(li), kind_id["load_stationary"], dtype=np.int16)])
    return Timeline(index, lane.astype(np.int16), start, end, nbytes, fl, prov, kind, lanes, tuple(kinds))


def _union_ns(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length of the union of intervals."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    # a new run starts where an interval begins after every earlier one ended
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    run_ids = np.cumsum(new) - 1
    run_starts = s[new]
    run_ends = np.zeros(len(run_starts))
    np.maximum.at(run_ends, run_ids, e)
    return float((run_ends - run_starts).sum())


def _summary(program, spec, tl: Timeline, fl, pe_flops, totals) -> Summary:
    total = float(tl.end_ns.max()) if len(tl) else 0.0
    busy: dict[str, float] = {}
    for group in LANE_GROUPS:
        ids = [j for j, name in enumerate(tl.lanes) if name.split(".")[0] == group]
        sel = np.isin(tl.lane, ids)
        if sel.any():
            busy[group] = _union_ns(tl.start_ns[sel], tl.end_ns[sel])
    util = {k: (v / total if total else 0.0) for k, v in busy.items()}
    dtype = "float32"
    for instr in program.static.representatives:
        if isinstance(instr, Matmul):
            dtype = instr.moving.dtype
            break
    return Summary(
        program=program.name,
        program_hash=program.hash,
        preset=spec.name,
        total_ns=total,
        instructions=len(program),
        engine_busy_ns=busy,
        utilization=util,
        dma_bytes=int(totals["dma_bytes"]),
        hbm_read_bytes=int(totals["hbm_read"]),
        hbm_write_bytes=int(totals["hbm_write"]),
        dma_transfers=int(totals["transfers"]),
        flops=float(fl.sum()),
        tensor_flops=float(fl[pe_flops].sum()),
        peak_flops=spec.peak_flops(dtype),
        hbm_bytes_per_ns=spec.hbm_bytes_per_ns,
    )
