"""The events of a cache entry as numpy columns, read with pyarrow: no database in the loop.

The first questions users ask of a trace (the op table, the nesting, which op launched which
kernel) need a few columns of every slice and a sort; DuckDB's engine alone costs ~0.3 s and
~50 MB before its first row, more than the whole computation. This module reads the
Parquet parts straight into arrays, gives each row its lane and kind (the same rules as the
SQL views: ``CATEGORY_KINDS`` and ``DEVICE_PROCESS`` are tables both read), and builds
``lanes.parquet`` -- the one implementation of the lane table, which the DuckDB views read too.

>>> side_of(dev=3, events=4, labels=None, process_name="python")
'device'
>>> side_of(dev=0, events=9, labels=None, process_name="prof/core0/hardware")
'device'
"""

from __future__ import annotations

import glob
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ._devices import DEVICE_PROCESS
from ._rawcols import read_raw
from ._schema import CATEGORY_KINDS

__all__ = ["EntryColumns", "read_entry", "side_of", "write_lanes", "KINDS", "NOT_EVENTS"]

KINDS = tuple(dict.fromkeys([k for _c, _p, k, _s in CATEGORY_KINDS] + ["other"]))  # kind code -> name
NOT_EVENTS = ("s", "t", "f", "M", "B", "E")  # records the events view leaves out (flows, metadata, B/E halves)
_DEVICE_CATS = sorted({c for c, _p, _k, side in CATEGORY_KINDS if c and side == "device"})
_DEVICE_RX = re.compile(DEVICE_PROCESS)
_PROFILE_SUBSYSTEM = re.compile(r"^(.*)/([^/]+)/(framework|runtime|hardware)$")  # tilescope profile processes
_STRINGS = ["ph", "cat", "name", "pid", "tid"]
_INTS = ["ts_ns", "dur_ns", "correlation", "flow_id"]
_READ = ["part", "ph", "cat", "name", "pid", "tid", "ts_ns", "dur_ns", "correlation", "flow_id"]


def side_of(*, dev: int, events: int, labels: str | None, process_name: str | None) -> str:
    """A lane's side: ``device`` if the process is labelled or named as a device
    (``DEVICE_PROCESS``), is a tilescope profile's ``.../hardware`` process, or most of the
    lane's events carry a device category; else ``host``."""
    if dev * 2 > events or _DEVICE_RX.search(labels or "") or _DEVICE_RX.search(process_name or ""):
        return "device"
    m = _PROFILE_SUBSYSTEM.match(process_name or "")
    return "device" if m and m.group(3) == "hardware" else "host"


def _valid(arr) -> np.ndarray:
    """An Arrow array's validity as a numpy bool mask (from its bitmap: no compute kernel)."""
    bitmap = arr.buffers()[0]
    if bitmap is None or not arr.null_count:
        return np.ones(len(arr), dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[arr.offset:arr.offset + len(arr)].astype(bool)


def _values(arr, dtype) -> np.ndarray:
    """A fixed-width Arrow array's values as numpy (NULL slots hold whatever the buffer has)."""
    data = arr.buffers()[1]
    if data is None:  # (an empty array)
        return np.zeros(len(arr), dtype=dtype)
    return np.frombuffer(data, dtype=dtype)[arr.offset:arr.offset + len(arr)]


def _codes(col, ids: dict) -> np.ndarray:
    """A dictionary-encoded string column as int codes (-1 for NULL) into ``ids`` (value ->
    code, shared by every file of the entry; new values are added)."""
    out = []
    for chunk in col.chunks:
        remap = np.array([ids.setdefault(v, len(ids)) for v in chunk.dictionary.to_pylist()] + [-1], dtype=np.int64)
        idx = chunk.indices
        codes = np.where(_valid(idx), _values(idx, np.dtype(idx.type.to_pandas_dtype())), -1)
        out.append(remap[codes])  # (-1 reads the trailing -1)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _ints(col) -> tuple[np.ndarray, np.ndarray]:
    """An INT64 column as (values with 0 for NULL, a validity mask)."""
    if not col.num_chunks:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    valid = np.concatenate([_valid(c) for c in col.chunks])
    values = np.concatenate([_values(c, np.int64) for c in col.chunks])
    return np.where(valid, values, 0), valid


def _kind_codes(cat: np.ndarray, cats: list, name: np.ndarray, names: list) -> np.ndarray:
    """Each row's kind code (index into KINDS): the first CATEGORY_KINDS row that matches."""
    kind = np.full(len(cat), KINDS.index("other"), dtype=np.int8)
    done = np.zeros(len(cat), dtype=bool)
    cat_index = {c: i for i, c in enumerate(cats)}
    for c, prefix, k, _side in CATEGORY_KINDS:
        m = ~done
        if c is not None:
            m &= cat == cat_index.get(c, -2)
        if prefix is not None:
            starts = np.array([isinstance(n, str) and n.startswith(prefix) for n in names] + [False], dtype=bool)
            m &= starts[name]  # (code -1, a NULL name, reads the trailing False)
        kind[m] = KINDS.index(k)
        done |= m
    return kind


@dataclass
class EntryColumns:
    """One entry's records (every row of its event files, in eid order) as arrays.

    ``lane``: a per-entry lane code, one per (pid, tid) (``lane_keys``; a NULL pid is a lane
    of lanes.parquet but not of the events view, which joins on pid);
    ``kind``: index into KINDS; ``ts``/``dur``: ns with ``has_ts``/``has_dur`` validity."""

    eid: np.ndarray
    ph: np.ndarray
    phs: list
    cat: np.ndarray
    cats: list
    name: np.ndarray
    names: list
    lane: np.ndarray
    lane_keys: list  # (pid, tid) per lane code
    ts: np.ndarray
    has_ts: np.ndarray
    dur: np.ndarray
    has_dur: np.ndarray
    correlation: np.ndarray
    has_corr: np.ndarray
    flow_id: np.ndarray
    has_flow: np.ndarray
    kind: np.ndarray
    files: list  # (path, first row) per file
    named: list | None = None  # from the raw columns: (row, args) of each lane's first naming 'M' record

    def ph_is(self, *values: str) -> np.ndarray:
        ok = np.array([p in values for p in self.phs] + [False], dtype=bool)
        return ok[self.ph]


@contextmanager
def _system_pool(pa):
    """Arrow's allocations from the C library's pool while reading: the default pool
    (mimalloc) keeps what a read freed, ~30 MB on a 35 MB trace, for the life of the process."""
    prev = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(prev)


def event_files(entry: str) -> list[str]:
    """The entry's event Parquet files (every part, the 'B'/'E' slices' part included)."""
    return sorted(glob.glob(os.path.join(entry, "events", "*", "*.parquet")))


def read_entry(entry: str, rank: int) -> EntryColumns | None:
    """The columns of ``entry``'s events (None when it has none): the native ingest's raw
    arrays when the entry has them (``_rawcols``), else read from the Parquet parts."""
    files = event_files(entry)
    if not files:
        return None
    raw = read_raw(entry, files)
    if raw is not None:
        return _from_raw(raw, files, rank)
    import pyarrow as pa
    import pyarrow.parquet as pq

    metas = [pq.read_metadata(f, memory_map=True) for f in files]
    total = sum(md.num_rows for md in metas)
    # filled a row group at a time: what is held beyond the result is one row group's columns
    eid = np.empty(total, dtype=np.int64)
    codes = {c: np.empty(total, dtype=np.int64) for c in _STRINGS}
    ids: dict[str, dict] = {c: {} for c in _STRINGS}  # value -> code, shared by the files
    ints = {c: (np.empty(total, dtype=np.int64), np.empty(total, dtype=bool)) for c in _INTS}
    starts, at = [], 0
    with _system_pool(pa):
        for f, md in zip(files, metas):
            starts.append((f, at))
            row = 0
            for g in range(md.num_row_groups):
                # the strings arrive dictionary-encoded: codes, never a Python object per row.
                # The file is mapped again per row group: the pages a mapping touched count in
                # the process's RSS until it is unmapped (~15 MB of a 35 MB trace's entry)
                pf = pq.ParquetFile(f, metadata=md, read_dictionary=_STRINGS, pre_buffer=False, memory_map=True)
                t = pf.read_row_group(g, columns=_READ, use_threads=False)
                del pf
                n = t.num_rows
                part = _values(t.column("part").combine_chunks(), np.int32).astype(np.int64)
                eid[at:at + n] = (np.int64(rank) << 48) | (part << 32) | np.arange(row, row + n, dtype=np.int64)
                for c in _STRINGS:
                    codes[c][at:at + n] = _codes(t.column(c), ids[c])
                for c in _INTS:
                    ints[c][0][at:at + n], ints[c][1][at:at + n] = _ints(t.column(c))
                at += n
                row += n
    (ts, has_ts), (dur, has_dur), (corr, has_corr), (flow, has_flow) = (ints[c] for c in _INTS)
    return _assemble(eid, [codes[c] for c in _STRINGS], [list(ids[c]) for c in _STRINGS],
                     ts, has_ts, dur, has_dur, corr, has_corr, flow, has_flow, files=starts)


def _from_raw(raw: dict, files: list[str], rank: int) -> EntryColumns:
    """EntryColumns from the native ingest's raw arrays (``_rawcols.read_raw``)."""
    part_rows = raw["part_rows"]
    n = sum(part_rows)
    part = np.repeat(np.array([int(os.path.basename(f)[5:10]) for f in files], dtype=np.int64), part_rows)
    first = np.repeat(np.cumsum([0] + part_rows[:-1]), part_rows).astype(np.int64)
    eid = (np.int64(rank) << 48) | (part << 32) | (np.arange(n, dtype=np.int64) - first)
    starts = [(f, int(a)) for f, a in zip(files, np.cumsum([0] + part_rows[:-1]).tolist())]
    v, ok = raw["ints"], raw["valid"]
    cols = _assemble(eid, [raw["codes"][c] for c in _STRINGS], [raw["values"][c] for c in _STRINGS],
                     v["ts"], ok["ts"], v["dur"], ok["dur"], v["correlation"], ok["correlation"],
                     v["flow_id"], ok["flow_id"], files=starts)
    cols.named = [tuple(x) for x in raw["named"]]
    return cols


def _assemble(eid, codes: list, values: list, ts, has_ts, dur, has_dur, corr, has_corr, flow, has_flow,
              files: list) -> EntryColumns:
    """EntryColumns from the string columns' codes and values (ph, cat, name, pid, tid) and
    the integer columns: each (pid, tid) pair a lane, each row a kind."""
    ph, cat, name, pid, tid = codes
    phs, cats, names, pids, tids = values
    width = len(tids) + 1  # lane = one (pid, tid) pair; a NULL tid is its own lane (IS NOT DISTINCT FROM)
    uniq, lane = np.unique((pid.astype(np.int64) + 1) * width + (tid + 1), return_inverse=True)
    lane_keys = [(pids[k // width - 1] if k // width else None, tids[k % width - 1] if k % width else None)
                 for k in uniq.tolist()]
    return EntryColumns(
        eid=eid, ph=ph, phs=phs, cat=cat, cats=cats, name=name, names=names, lane=lane.astype(np.int64),
        lane_keys=lane_keys, ts=ts, has_ts=has_ts, dur=dur, has_dur=has_dur, correlation=corr, has_corr=has_corr,
        flow_id=flow, has_flow=has_flow, kind=_kind_codes(cat, cats, name, names), files=files)


def _json_string(args: str | None, key: str) -> str | None:
    """``json_extract_string(args, '$.<key>')``: a string member as its text, any other value as JSON."""
    if args is None:
        return None
    try:
        v = json.loads(args)
    except ValueError:
        return None
    v = v.get(key) if isinstance(v, dict) else None
    if v is None or isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _metadata(cols: EntryColumns) -> tuple[dict, dict, dict]:
    """process names and labels per pid, thread names per (pid, tid), from the 'M' records
    (the first record of each; only the row groups holding them read 'args')."""
    proc: dict = {}
    labels: dict = {}
    threads: dict = {}
    wanted = np.array([n in ("process_name", "process_labels", "thread_name") for n in cols.names] + [False])
    is_m = cols.ph_is("M") & wanted[cols.name]
    if is_m.any():  # the first record per (name, pid, tid) (traces can repeat them by the 100,000)
        m = np.flatnonzero(is_m)
        _u, first = np.unique(np.stack([cols.name[m], cols.lane[m]]), axis=1, return_index=True)
        is_m = np.zeros(len(is_m), dtype=bool)
        is_m[m[first]] = True
    if not is_m.any():
        return proc, labels, threads
    if cols.named is not None:  # (the raw columns: the scanner kept each lane's first naming record)
        rows = [row for row, _args in cols.named]
        keys = [cols.lane_keys[ln] for ln in cols.lane[rows].tolist()]
        _name_lanes([(cols.names[cols.name[r]], pid, tid, args) for r, (pid, tid), (_r, args)
                     in zip(rows, keys, cols.named)], proc, labels, threads)
        return proc, labels, threads
    import pyarrow as pa

    with _system_pool(pa):
        _read_names(cols, is_m, proc, labels, threads)
    return proc, labels, threads


def _read_names(cols: EntryColumns, is_m: np.ndarray, proc: dict, labels: dict, threads: dict) -> None:
    import pyarrow.parquet as pq

    for f, first in cols.files:
        pf = pq.ParquetFile(f, pre_buffer=False, memory_map=True)
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            rows = np.flatnonzero(is_m[first:first + n])
            first += n
            if len(rows):
                t = pf.read_row_group(g, columns=["name", "pid", "tid", "args"], use_threads=False)
                _names_from(t, rows.tolist(), proc, labels, threads)


def _names_from(t, rows: list, proc: dict, labels: dict, threads: dict) -> None:
    _name_lanes(zip(*([t.column(c)[i].as_py() for i in rows] for c in ("name", "pid", "tid", "args"))),
                proc, labels, threads)


def _name_lanes(records, proc: dict, labels: dict, threads: dict) -> None:
    """The names per pid and (pid, tid) from naming 'M' records (name, pid, tid, args), in
    row order: the first usable value of each counts."""
    for name, pid, tid, args in records:
        if name == "thread_name":
            key, into, at = "name", threads, (pid, tid)
        else:
            key, into, at = ("name", proc, pid) if name == "process_name" else ("labels", labels, pid)
        v = _json_string(args, key)
        if v is not None:
            into.setdefault(at, v)


def lane_rows(cols: EntryColumns, rank: int) -> dict:
    """The columns of ``lanes.parquet`` for one entry: per lane with at least one event
    (a record the events view keeps), its names, event count, extent, side and the
    categories of its slices that no rule classifies (with counts, as JSON); ``lane_code``
    is the lane's code in ``cols.lane``."""
    keep = ~cols.ph_is(*NOT_EVENTS) & (cols.ph >= 0)
    n_lanes = len(cols.lane_keys)
    lane = cols.lane[keep]
    events = np.bincount(lane, minlength=n_lanes)
    dev_cat = np.array([c in _DEVICE_CATS for c in cols.cats] + [False], dtype=bool)
    dev = np.bincount(lane, weights=dev_cat[cols.cat[keep]], minlength=n_lanes)
    ts_ok = cols.has_ts[keep]
    ts = cols.ts[keep]
    end = ts + np.where(cols.has_dur[keep], np.maximum(cols.dur[keep], 0), 0)
    first = np.full(n_lanes, np.iinfo(np.int64).max)
    last = np.full(n_lanes, np.iinfo(np.int64).min)
    np.minimum.at(first, lane[ts_ok], ts[ts_ok])
    np.maximum.at(last, lane[ts_ok], end[ts_ok])
    other = keep & cols.ph_is("X") & (cols.kind == KINDS.index("other"))
    hist: dict[int, dict] = {}
    pairs, counts = np.unique(np.stack([cols.lane[other], cols.cat[other]]), axis=1, return_counts=True)
    for (ln, c), k in zip(pairs.T.tolist(), counts.tolist()):
        label = cols.cats[c] if c >= 0 else "(no category)"
        hist.setdefault(ln, {})[label] = hist.setdefault(ln, {}).get(label, 0) + int(k)
    proc, labels, threads = _metadata(cols)
    out: dict = {c: [] for c in ("rank", "pid", "tid", "process_name", "thread_name", "labels", "events",
                                 "first_ns", "last_ns", "other_cats", "side", "lane_code")}
    for ln in np.flatnonzero(events).tolist():
        pid, tid = cols.lane_keys[ln]
        if pid is None:  # (LEFT JOIN ... USING (pid): no names for a NULL pid)
            proc_name = lab = thread = None
        else:
            proc_name, lab, thread = proc.get(pid), labels.get(pid), threads.get((pid, tid))
        has_t = first[ln] <= last[ln]
        row = {"rank": rank, "pid": pid, "tid": tid, "process_name": proc_name, "thread_name": thread,
               "labels": lab, "events": int(events[ln]), "first_ns": int(first[ln]) if has_t else None,
               "last_ns": int(last[ln]) if has_t else None,
               "other_cats": json.dumps(dict(sorted(hist[ln].items())), separators=(",", ":")) if ln in hist else None,
               "side": side_of(dev=int(dev[ln]), events=int(events[ln]), labels=lab, process_name=proc_name),
               "lane_code": ln}
        for c, v in row.items():
            out[c].append(v)
    return out


LANE_COLUMNS = (("rank", "INT32"), ("pid", "STRING"), ("tid", "STRING"), ("process_name", "STRING"),
                ("thread_name", "STRING"), ("labels", "STRING"), ("events", "INT64"), ("first_ns", "INT64"),
                ("last_ns", "INT64"), ("other_cats", "STRING"), ("side", "STRING"))


def write_lanes(cols: EntryColumns | None, rank: int, dst: str, rows: dict | None = None) -> None:
    """Write ``lanes.parquet`` (see :func:`lane_rows`; ``rows`` if already computed) to ``dst``
    (with the ingest's own Parquet writer: no pyarrow)."""
    from ._parquet import write_table

    if rows is None:
        rows = lane_rows(cols, rank) if cols is not None else {}
    write_table(dst, LANE_COLUMNS, {c: rows.get(c, []) for c, _kind in LANE_COLUMNS})
