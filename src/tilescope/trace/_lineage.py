"""An event's whole chain: framework op -> runtime launch -> device execution -> instructions."""

from __future__ import annotations

from ._nesting import ensure_hierarchy

__all__ = ["lineage", "execution"]


def _row(trace, eid: int, hop: str) -> dict:
    r = trace.con.execute("""SELECT eid, lane, kind, cat, name, ts_ns, dur_ns, program_hash, flow_id, correlation
                             FROM events WHERE eid = ?""", [eid]).fetchall()[0]
    keys = ("eid", "lane", "kind", "cat", "name", "ts_ns", "dur_ns", "program_hash", "flow_id", "correlation")
    d = dict(zip(keys, r))
    d["hop"] = hop
    return d


def lineage(trace, eid: int) -> list[dict]:
    """Hops of the chain through ``eid`` (any hop of it), in order: ``op`` (the framework op,
    with its ancestors before it as ``parent``), ``launch``, ``device``, and for tilescope
    executions one ``instructions`` hop summarising the modeled instruction trace."""
    ensure_hierarchy(trace)
    con = trace.con
    if con.execute("SELECT count(*) FROM events WHERE eid = ?", [eid]).fetchall()[0][0] == 0:
        raise KeyError(f"no event with eid {eid}")
    links = con.execute("""SELECT dev_eid, launch_eid, op_eid FROM _links
                           WHERE dev_eid = $1 OR launch_eid = $1 OR op_eid = $1 ORDER BY dev_eid""", [eid]).fetchall()
    if not links:
        # an ancestor of an op (module, step): follow its descendants' links
        links = con.execute("""
            WITH RECURSIVE sub(eid) AS (SELECT $1::BIGINT UNION ALL SELECT h.eid FROM _hier h JOIN sub ON h.parent_eid = sub.eid)
            SELECT dev_eid, launch_eid, op_eid FROM _links WHERE op_eid IN (SELECT eid FROM sub) ORDER BY dev_eid""",
                            [eid]).fetchall()
    out: list[dict] = []
    seen = set()
    ops = sorted({o for _d, _l, o in links if o is not None})
    anchor = ops[0] if ops else eid
    chain = []
    p = anchor
    while p is not None and p >= 0:
        chain.append(p)
        r = con.execute("SELECT parent_eid FROM _hier WHERE eid = ?", [p]).fetchall()
        p = r[0][0] if r else None
    for a in reversed(chain[1:]):
        out.append(_row(trace, a, "parent"))
        seen.add(a)
    for o in ops:
        if o not in seen:
            out.append(_row(trace, o, "op"))
            seen.add(o)
    for d, l, _o in links:
        if l not in seen:
            out.append(_row(trace, l, "launch"))
            seen.add(l)
        if d not in seen:
            row = _row(trace, d, "device")
            out.append(row)
            seen.add(d)
            if row["program_hash"] is not None:
                ins = con.execute("""SELECT count(*), min(start_ns), max(end_ns), count(DISTINCT engine), any_value(preset)
                                     FROM instructions WHERE program_hash = ? AND (flow_id = ? OR flow_id IS NULL)""",
                                  [row["program_hash"], row["flow_id"]]).fetchall()[0]
                if ins[0]:
                    out.append({"hop": "instructions", "program_hash": row["program_hash"], "flow_id": row["flow_id"],
                                "instructions": ins[0], "engines": ins[3], "span_ns": ins[2] - ins[1],
                                "preset": ins[4], "modeled": True})
    if not out:
        out.append(_row(trace, eid, "self"))
    return out


def execution(trace, eid: int) -> dict:
    """The device view of one tilescope execution (a hardware event): its instructions as
    columns, ordered by start, with per-engine busy time. All times *modeled*, in ns from the
    execution's start; ``source`` is each instruction's provenance (aten op, FX node, kernel line)."""
    import numpy as np

    from ._trace import _arrow

    row = trace.con.execute("SELECT program_hash, flow_id, name, ts_ns, dur_ns FROM events WHERE eid = ?", [eid]).fetchall()
    if not row or row[0][0] is None:
        raise KeyError(f"event {eid} is not a tilescope device execution (it has no program_hash)")
    h, fid, name, ts, dur = row[0]
    tab = _arrow(trace.con.sql(f"""
        SELECT index, engine, kind, start_ns, end_ns, bytes, flops, source FROM instructions
        WHERE program_hash = '{h}' AND (flow_id = {fid if fid is not None else 'NULL'} OR flow_id IS NULL)
          AND run = (SELECT min(run) FROM instructions WHERE program_hash = '{h}'
                     AND (flow_id = {fid if fid is not None else 'NULL'} OR flow_id IS NULL))
        ORDER BY start_ns, index"""))
    cols = {c: tab.column(c).to_numpy(zero_copy_only=False) for c in tab.column_names}
    busy: dict[str, float] = {}
    for e, s, t in zip(cols["engine"].tolist(), cols["start_ns"].tolist(), cols["end_ns"].tolist()):
        busy[e] = busy.get(e, 0.0) + (t - s)
    return {"eid": eid, "name": name, "program_hash": h, "flow_id": fid, "start_ns": ts, "dur_ns": dur,
            "modeled": True, "instructions": cols, "engine_busy_ns": busy,
            "span_ns": float(np.max(cols["end_ns"])) if len(tab) else 0.0}
