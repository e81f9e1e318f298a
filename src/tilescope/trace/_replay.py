"""What-if replay: re-simulate a profile's saved Programs on another core model.

Only device times change: each execution's modeled duration comes from the simulator on
the new preset; it starts at max(host submit + the preset's runtime cost, end of the
previous execution on its core) — the rule of the simulated runtime (docs/DESIGN.md,
"Time semantics"); the runtime event's queued -> scheduled span follows. Host events,
names, counts, flows and program hashes stay as recorded. Host waits (synchronize) are
not re-modeled: their host-side durations are the recorded ones.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["replay"]


def replay(trace, preset, *, out_dir: str | None = None):
    """A new :class:`Trace` with the device timeline re-modeled on ``preset`` (name or CoreSpec)."""
    from ..program import Program
    from ..sim import simulate
    from ..spec import preset as get_preset
    from ._columns import read_entry, write_lanes
    from ._store import _build_lod, _connect, cache_root
    from ._trace import Trace, _arrow

    spec = get_preset(preset)
    exe = trace.sql("SELECT program_hash, path FROM executables").fetchall()
    if not exe:
        raise ValueError(
            f"{', '.join(trace.sources)}: no executables to replay (replay needs a tilescope profile recorded "
            f"with ProfileMode.DEVICE, which saves each Program)")
    if len(trace.entries) != 1:
        raise ValueError("replay works on one profile at a time; open each profile separately")
    entry = trace.entries[0]
    programs, results = {}, {}
    for h, path in exe:
        with open(path, encoding="utf-8") as f:
            programs[h] = Program.from_json(f.read())
        results[h] = simulate(programs[h], spec)
    key = hashlib.sha256(f"{entry}|{spec.fingerprint}".encode()).hexdigest()[:20]
    dest = out_dir or os.path.join(cache_root(), f"replay-{key}")
    tmp = f"{dest}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    con = _connect()
    try:
        # executions, in order per hardware lane, with their submit time (runtime event start)
        ex = _arrow(trace.sql("""
            SELECT h.eid, h.rank, h.pid, h.tid, h.ts_ns - o.off AS ts_raw, h.program_hash, h.flow_id,
                   r.eid AS r_eid, r.ts_ns - o.off AS submit_raw
            FROM events h JOIN _offsets o USING (rank)
            LEFT JOIN events r ON r.cat = 'runtime' AND r.flow_id = h.flow_id AND r.rank = h.rank
            WHERE h.cat = 'hardware' AND h.ph = 'X' ORDER BY h.pid, h.tid, h.ts_ns"""))
        rt = spec.runtime_exec_us * 1000.0
        new_ts, new_dur, r_eids, r_durs, f_ids, f_ts = [], [], [], [], [], []
        prev_end: dict = {}
        cols = {c: ex.column(c).to_pylist() for c in ex.column_names}
        for i in range(ex.num_rows):
            lane = (cols["pid"][i], cols["tid"][i])
            h = cols["program_hash"][i]
            dur = results[h].summary.total_ns if h in results else None
            if dur is None:
                raise ValueError(f"execution {cols['eid'][i]} ran program {h!r}, which has no executable in the profile")
            submit = cols["submit_raw"][i]
            start = cols["ts_raw"][i] if submit is None else max(submit + rt, prev_end.get(lane, -np.inf))
            start = int(round(start))
            end = start + int(round(dur))
            prev_end[lane] = end
            new_ts.append(start)
            new_dur.append(int(round(dur)))
            if cols["r_eid"][i] is not None:
                r_eids.append(cols["r_eid"][i])
                r_durs.append(max(0, start - submit))
            f_ids.append(str(cols["flow_id"][i]))
            f_ts.append(start)
        changes = pa.table({"eid": pa.array(cols["eid"] + r_eids, pa.int64()),
                            "new_ts": pa.array(new_ts + [None] * len(r_eids), pa.int64()),
                            "new_dur": pa.array(new_dur + r_durs, pa.int64())})
        fl = pa.table({"fid": pa.array(f_ids, pa.string()), "new_ts": pa.array(f_ts, pa.int64())})
        con.register("changes", changes)
        con.register("flow_moves", fl)
        src_dirs = sorted(glob.glob(os.path.join(entry, "events", "rank=*")))
        for d in src_dirs:
            rank = int(os.path.basename(d).split("=")[1])
            os.makedirs(os.path.join(tmp, "events", os.path.basename(d)))
            for f in sorted(glob.glob(os.path.join(d, "*.parquet"))):
                out = os.path.join(tmp, "events", os.path.basename(d), os.path.basename(f))
                con.execute(f"""
                  COPY (
                    SELECT r.* REPLACE (
                      CASE WHEN c.new_ts IS NOT NULL THEN c.new_ts
                           WHEN r.ph = 'f' AND r.cat = 'tilescope.flow' AND m.new_ts IS NOT NULL THEN m.new_ts
                           ELSE r.ts_ns END AS ts_ns,
                      coalesce(c.new_dur, r.dur_ns) AS dur_ns)
                    FROM (SELECT *, ((({rank}::BIGINT) << 48) | (part::BIGINT << 32) | file_row_number) AS _eid
                          FROM read_parquet('{f}', file_row_number=true)) r
                    LEFT JOIN changes c ON c.eid = r._eid
                    LEFT JOIN flow_moves m ON m.fid = r.id AND r.ph = 'f'
                    ORDER BY r.file_row_number
                  ) TO '{out}' (FORMAT parquet)""")
                con.execute(f"CREATE OR REPLACE TEMP TABLE _t AS SELECT * EXCLUDE (_eid, file_row_number) FROM read_parquet('{out}')")
                con.execute(f"COPY _t TO '{out}' (FORMAT parquet)")
        meta = dict(trace.meta[0])
        meta["replayed_from"] = {"source": trace.sources[0], "preset": meta.get("manifest", {}).get("device", {}).get("preset")}
        man = json.loads(json.dumps(meta.get("manifest") or {}))
        man.setdefault("device", {})["preset"] = spec.name
        man["device"]["preset_fingerprint"] = spec.fingerprint
        meta["manifest"] = man
        meta["kind"] = "profile"
        meta["notes"] = list(meta.get("notes", [])) + [
            f"device times re-modeled on preset {spec.name} (modeled); host events are the recorded ones"]
        g = os.path.join(tmp, "events", "*", "*.parquet")
        t_lo, t_hi = con.execute(f"""SELECT min(ts_ns), max(ts_ns + greatest(coalesce(dur_ns, 0), 0))
                                     FROM read_parquet('{g}') WHERE ph NOT IN ('M','s','t','f')""").fetchall()[0]
        meta.update(t0_ns=t_lo, t1_ns=t_hi)
        write_lanes(read_entry(tmp, meta["rank"]), meta["rank"], os.path.join(tmp, "lanes.parquet"))
        meta["lod_levels"] = _build_lod(con, tmp, t_lo, t_hi)
        # instructions and executables, re-modeled
        rows = {k: [] for k in ("program_hash", "run", "flow_id", "preset", "index", "engine", "kind", "start_ns",
                                "end_ns", "bytes", "flops", "source")}
        runs = trace.sql("SELECT DISTINCT program_hash, run, flow_id FROM instructions ORDER BY ALL").fetchall()
        for h, run, fid in runs:
            tl = results[h].timeline
            prog = programs[h]
            n = len(tl)
            rows["program_hash"] += [h] * n
            rows["run"] += [run] * n
            rows["flow_id"] += [fid] * n
            rows["preset"] += [spec.name] * n
            rows["index"] += tl.index.astype(int).tolist()
            rows["engine"] += [tl.lanes[int(x)] for x in tl.lane]
            rows["kind"] += [tl.kinds[int(x)] for x in tl.kind]
            rows["start_ns"] += tl.start_ns.astype(float).tolist()
            rows["end_ns"] += tl.end_ns.astype(float).tolist()
            rows["bytes"] += tl.nbytes.astype(int).tolist()
            rows["flops"] += tl.flops.astype(float).tolist()
            rows["source"] += [prog.prov_of(int(i)).describe() for i in tl.index]
        if runs:
            pq.write_table(pa.table(rows), os.path.join(tmp, "instructions.parquet"))
        exrows = _arrow(trace.sql("SELECT * FROM executables")).to_pylist()
        for r in exrows:
            s = results[r["program_hash"]].summary
            r.update(flops=float(s.flops), hbm_bytes=int(s.hbm_bytes), modeled_ns=float(s.total_ns))
        pq.write_table(pa.Table.from_pylist(exrows), os.path.join(tmp, "executables.parquet"))
        with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1, default=str)
        con.close()
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(tmp, dest)
    except BaseException:
        con.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Trace([dest], [f"{trace.sources[0]} @ {spec.name}"])
