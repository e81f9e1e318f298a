"""The native trace parser (C) reads every trace exactly as the DuckDB JSON path does.

The DuckDB path (``TILESCOPE_TRACE_INGEST=python``) is the reference: both ingest the same
file into separate caches and every column of every record must agree (``args`` compared
as JSON values: the two minify differently).
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilescope.trace as tt
from tilescope.trace import _ingest, _native_ingest
from tilescope.trace._schema import ARG_COLUMNS

KINETO = os.path.join(os.path.dirname(__file__), "data", "kineto")
ARG_KEYS = ["correlation", "External id", "stream", "device", "flow_id", "program_hash"]  # ARG_COLUMNS' keys
COLUMNS = "ph, cat, name, pid, tid, ts_ns, dur_ns, id, bp, s, json(args), " + ", ".join(c for c, _p, _t in ARG_COLUMNS)


def test_native_parser_is_built():
    # `make setup` compiles it; a missing build would silently fall back to the slower path
    assert _native_ingest._kscan is not None, "tilescope.trace._kscan is not built: run `make setup` (needs a C compiler)"
    # a build older than _kscan.c still ingests, but without the raw columns the first op table reads
    assert getattr(_native_ingest._kscan, "RAW_COLUMNS", 0), "tilescope.trace._kscan predates _kscan.c: run `make setup`"


def test_the_ingest_switch_names_bad_values(monkeypatch):
    monkeypatch.setenv("TILESCOPE_TRACE_INGEST", "pyhton")
    with pytest.raises(ValueError, match=r"TILESCOPE_TRACE_INGEST='pyhton': expected 'native' or 'python'"):
        _native_ingest.available()
    monkeypatch.setenv("TILESCOPE_TRACE_INGEST", "python")
    assert not _native_ingest.available()
    monkeypatch.setattr(_native_ingest, "_kscan", None)
    monkeypatch.setenv("TILESCOPE_TRACE_INGEST", "native")
    with pytest.raises(RuntimeError, match=r"not built: install with a C compiler"):
        _native_ingest.available()
    monkeypatch.delenv("TILESCOPE_TRACE_INGEST")
    assert not _native_ingest.available()  # unset: the DuckDB path when the parser is missing


def _rows(path, engine, cache, monkeypatch):
    monkeypatch.setenv("TILESCOPE_TRACE_INGEST", engine)
    monkeypatch.setenv("TILESCOPE_CACHE_DIR", str(cache / engine))
    t = tt.open(path, refresh=True)
    return t, t.sql(f"SELECT {COLUMNS} FROM raw ORDER BY eid").fetchall()


def _same(path, tmp_path, monkeypatch):
    a, rows_a = _rows(path, "native", tmp_path, monkeypatch)
    b, rows_b = _rows(path, "python", tmp_path, monkeypatch)
    assert a.meta[0]["ingest"]["mode"] == "native"
    assert rows_a == rows_b
    # The one intended difference: the DuckDB path cannot tell an unparseable line from an
    # event without any of ph/cat/name/pid/tid (both come back as NULLs), so it reports such
    # events as "not valid JSON"; the C parser knows a valid object when it reads one.
    empty = [r for r in rows_a if r[:5] == (None,) * 5]
    warn_b = [w for w in b.meta[0]["warnings"] if not (empty and "are not valid JSON objects" in w)]
    if empty and b.meta[0]["events"] == 0 and a.meta[0]["events"]:
        warn_b = [w for w in warn_b if "holds no events" not in w]
    assert a.meta[0]["warnings"] == warn_b
    for k in ("notes", "trace_metadata") + (() if empty else ("t0_ns", "t1_ns", "events")):
        assert a.meta[0][k] == b.meta[0][k], k
    _raw_columns_equal_the_parts(a)
    return a


_ENTRY_ARRAYS = ("eid", "ph", "cat", "name", "lane", "ts", "has_ts", "dur", "has_dur", "correlation", "has_corr",
                 "flow_id", "has_flow", "kind")


def _raw_columns_equal_the_parts(t) -> None:
    # the nesting's input as the C parser wrote it beside the pages (_rawcols) is what pyarrow
    # reads back from the Parquet parts: every array, every dictionary, the lanes' names
    import numpy as np

    from tilescope.trace import _columns

    entry, rank = t.entries[0], t.ranks[0]
    files = _columns.event_files(entry)
    if not files:
        return
    raw = _columns.read_raw(entry, files)
    be = any("part-65535" in f for f in files)  # the 'B'/'E' slices' part: not the scanner's, so no raw columns
    assert (raw is None) == (be or not getattr(_native_ingest._kscan, "RAW_COLUMNS", 0))
    fast = _columns.read_entry(entry, rank)
    saved = _columns.read_raw
    _columns.read_raw = lambda *_a: None
    try:
        slow = _columns.read_entry(entry, rank)
    finally:
        _columns.read_raw = saved
    for f in _ENTRY_ARRAYS:
        assert np.array_equal(getattr(fast, f), getattr(slow, f)), f
    for f in ("phs", "cats", "names", "lane_keys"):
        assert list(getattr(fast, f)) == list(getattr(slow, f)), f
    assert _columns.lane_rows(fast, rank) == _columns.lane_rows(slow, rank)


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(KINETO) if f.endswith(".json.gz")))
def test_real_traces_read_identically(name, tmp_path, monkeypatch):
    t = _same(os.path.join(KINETO, name), tmp_path, monkeypatch)
    assert t.sql("SELECT count(*) FROM raw").fetchall()[0][0] > 0


TRICKY = [
    {"ph": "X", "name": 'k<{a}>, "q" \\ }, {', "cat": "kernel", "pid": 0, "tid": 7, "ts": 1.5, "dur": 2.25,
     "args": {"note": "],\n  {\"ph\": \"X\"}", "nested": {"a": [1, 2.5e3, None, True, {"b": "\u00e9\U0001F600"}]}}},
    {"name": "no ph, dur given", "pid": "proc", "tid": "thread 1", "ts": "12.0005", "dur": 1e-3},
    {"name": "no ph, ts only", "pid": 1, "tid": 1, "ts": 13},
    {"ph": "i", "name": "\u2603 snow\ttab", "pid": 1, "tid": 1, "ts": -4.0016, "s": "t"},
    {"ph": "s", "id": 42, "cat": "flow", "name": "f", "pid": 1, "tid": 1, "ts": 20, "bp": "e"},
    {"ph": "X", "name": "dup", "name_": 1, "pid": 1, "tid": 1, "ts": 1661203462598738, "dur": 0, "args": "text"},
    {"ph": "X", "name": None, "pid": None, "tid": 10 ** 30, "ts": 5, "dur": -1, "args": [1, {"x": None}]},
    {},
]


@pytest.mark.parametrize("block", [1, 7, 64, 4096])
def test_block_boundaries_do_not_matter(block, tmp_path, monkeypatch):
    doc = {"schemaVersion": 1, "deviceProperties": [{"name": "x]}"}], "traceEvents": TRICKY, "z": {"k": "]"}}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc, indent=1))
    monkeypatch.setattr(_ingest, "BLOCK_BYTES", block)
    monkeypatch.setattr(_ingest, "FIRST_BLOCK_BYTES", block)
    t = _same(str(p), tmp_path, monkeypatch)
    assert t.meta[0]["trace_metadata"] == {"schemaVersion": 1, "deviceProperties": [{"name": "x]}"}], "z": {"k": "]"}}
    rows = t.sql("SELECT name, ph, ts_ns, dur_ns FROM raw ORDER BY eid").fetchall()
    assert rows[0] == (TRICKY[0]["name"], "X", 1500, 2250)
    assert rows[1][1:] == ("X", 12001, 1) and rows[2][1:] == ("i", 13000, None)
    assert rows[3][1:] == ("i", -4002, None)  # floor(x * 1000 + 0.5), like the DuckDB path
    assert rows[7] == (None, None, None, None)  # an empty object is a record without fields


def test_malformed_and_non_object_elements_are_counted(tmp_path, monkeypatch):
    text = '{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}, 7, {"ph": bad}, , "s", {"ph": "i", "ts": 2} x, {"ts": 3},]}'
    p = tmp_path / "t.json"
    p.write_text(text)
    monkeypatch.setenv("TILESCOPE_CACHE_DIR", str(tmp_path / "c"))
    t = tt.open(str(p))
    assert t.sql("SELECT ts_ns FROM raw ORDER BY eid").fetchall() == [(1000,), (3000,)]
    assert any("5 of 7 events are not valid JSON objects" in w for w in t.warnings)


def test_stray_closing_brace_is_an_error_naming_the_offset(tmp_path, monkeypatch):
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": [{"ts": 1}, }]}')
    monkeypatch.setenv("TILESCOPE_CACHE_DIR", str(tmp_path / "c"))
    # small blocks: the stray brace reaches the native parser (a whole-file block fails earlier, in
    # the Python scanner's own bracket count, at the first byte where the depth goes negative)
    monkeypatch.setattr(_ingest, "BLOCK_BYTES", 8)
    monkeypatch.setattr(_ingest, "FIRST_BLOCK_BYTES", 8)
    with pytest.raises(tt.TraceFormatError, match=r"t\.json: byte offset 28: unbalanced '\}' inside 'traceEvents'"):
        tt.open(str(p))


@pytest.mark.parametrize("engine", ["native", "python"])
def test_typed_args_columns(engine, tmp_path, monkeypatch):
    """args ids become BIGINT only when they are integers (or strings holding one) within
    int64; program_hash only when it is a string; the first of duplicate keys counts."""
    cases = [  # (args as JSON text, (correlation, external_id, stream, device, flow_id, program_hash))
        ('{"correlation": 12, "External id": -3, "stream": 7, "device": 0, "flow_id": 5, "program_hash": "ab"}',
         (12, -3, 7, 0, 5, "ab")),
        ('{"correlation": "0012", "stream": "-5", "device": "\\u0031\\u0032", "program_hash": 12}',
         (12, None, -5, 12, None, None)),
        ('{"correlation": 1.0, "stream": 1e3, "device": true, "flow_id": [1], "program_hash": null}',
         (None, None, None, None, None, None)),
        ('{"correlation": " 1", "stream": "+5", "device": "1.0", "flow_id": ""}', (None,) * 6),
        ('{"correlation": 9223372036854775807, "stream": -9223372036854775808, "device": 9223372036854775808, '
         '"flow_id": "-9223372036854775809"}', (2 ** 63 - 1, None, -2 ** 63, None, None, None)),
        ('{"correlation": 1, "correlation": 2, "x": {"stream": 3}}', (1, None, None, None, None, None)),
        ('[1, 2]', (None,) * 6),
        ('"correlation"', (None,) * 6),
    ]
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": [' + ",".join(
        f'{{"ph": "X", "name": "e{k}", "pid": 1, "tid": 1, "ts": {k}, "dur": 1, "args": {a}}}'
        for k, (a, _) in enumerate(cases)) + "]}")
    monkeypatch.setenv("TILESCOPE_TRACE_INGEST", engine)
    monkeypatch.setenv("TILESCOPE_CACHE_DIR", str(tmp_path / "cache"))
    cols = ", ".join(c for c, _p, _t in ARG_COLUMNS)
    got = tt.open(str(p)).sql(f"SELECT {cols} FROM raw ORDER BY ts_ns").fetchall()
    assert got == [want for _a, want in cases]


@pytest.mark.parametrize("event, want", [
    # the first of duplicate keys counts, for the event's own fields as for its args
    ('{"ph": "X", "name": "first", "name": "second", "pid": 1, "tid": 1, "ts": 1, "ts": 5, "dur": 2, "dur": 3,'
     ' "args": {"External id": 7, "External id": 9}}', ("first", 1000, 2000, 7)),
    # NaN and Infinity, as Python's json writes them: a record without a time, its args kept as text
    ('{"ph": "X", "name": "nan", "pid": 1, "tid": 1, "ts": NaN, "dur": Infinity, "args": {"v": -Infinity}}',
     ("nan", None, None, None)),
    # nesting of any depth inside an event (the C parser validates without recursion)
    ('{"ph": "X", "name": "deep", "pid": 1, "tid": 1, "ts": 3, "dur": 2, "args": {"x": ' + "[" * 100_000
     + "]" * 100_000 + ', "External id": 5}}', ("deep", 3000, 2000, 5)),
])
def test_edge_cases_read_identically(event, want, tmp_path, monkeypatch):
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": [{"ph": "i", "name": "fine", "pid": 1, "tid": 1, "ts": 9}, ' + event + "]}")
    t = _same(str(p), tmp_path, monkeypatch)
    assert t.sql("SELECT name, ts_ns, dur_ns, external_id FROM raw ORDER BY eid").fetchall()[1] == want
    assert not any("not valid JSON" in w for w in t.warnings), t.warnings


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 63, 2 ** 63), st.text(max_size=12),
                     st.floats(allow_nan=False, allow_infinity=False, width=32))
_json = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                     max_leaves=8)
# (the DuckDB path rounds sub-nanosecond digits through a double, the C parser from the decimal
# text: they agree except at exact halves, which test_sub_nanosecond_rounding pins)
# args that exercise the typed columns: their keys, with ids of every shape the rule separates
_ids = st.one_of(st.integers(-2 ** 64, 2 ** 64), st.floats(allow_nan=False, allow_infinity=False, width=32),
                 st.sampled_from(["0012", "-5", "+5", " 1", "1.0", "-", "", "-0", "9223372036854775807",
                                  "9223372036854775808", "-9223372036854775808", "-9223372036854775809", "ab12"]),
                 st.booleans(), st.none(), st.text(max_size=4))
_args = st.one_of(_json, st.dictionaries(st.sampled_from(ARG_KEYS + ["x"]),
                                         st.one_of(_ids, _json), max_size=5))
_times = st.one_of(st.integers(0, 2 ** 52), st.floats(0, 1e12, allow_nan=False).map(lambda x: round(x, 3)),
                   st.just("12.5"), st.just("x"), st.none())
_event = st.fixed_dictionaries({}, optional={
    "ph": st.sampled_from(["X", "i", "M", "s", "f", "B", "E", "C"]), "cat": st.text(max_size=8),
    "name": st.text(max_size=20), "pid": st.one_of(st.integers(0, 9), st.text(max_size=4)),
    "tid": st.one_of(st.integers(0, 9), st.text(max_size=4)), "ts": _times, "dur": _times,
    "id": st.integers(0, 99), "s": st.sampled_from(["t", "p", "g"]), "args": _args, "extra": _json})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(_event, max_size=12), indent=st.sampled_from([None, 1, 2]), ascii_only=st.booleans())
def test_random_traces_read_identically(events, indent, ascii_only, tmp_path_factory, monkeypatch):
    d = tmp_path_factory.mktemp("h")
    p = d / "t.json"
    p.write_text(json.dumps({"traceEvents": events}, indent=indent, ensure_ascii=ascii_only), encoding="utf-8")
    _same(str(p), d, monkeypatch)


@pytest.mark.parametrize("text, ns", [("1.0005", 1001), ("2.0025", 2003), ("-4.0015", -4001), ("-4.00151", -4002),
                                      ("0.0004999", 0), ("1e3", 1_000_000), ("-0.5e-3", 0), ("9223372036854775", None),
                                      ("1661203462598738.123", 1661203462598738123)])
def test_sub_nanosecond_rounding(text, ns, tmp_path, monkeypatch):
    # microseconds -> nanoseconds is floor(x * 1000 + 0.5) computed on the decimal digits, so
    # halves round up exactly (a double would round 2.0025 down: it is 2.00249999...)
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": [{"ph": "i", "ts": %s}]}' % text)
    monkeypatch.setenv("TILESCOPE_CACHE_DIR", str(tmp_path / "c"))
    assert tt.open(str(p)).sql("SELECT ts_ns FROM raw").fetchall() == [(ns,)]


def test_mutated_input_never_crashes():
    # the parser reads untrusted bytes: random edits of a valid array (bytes flipped, inserted,
    # deleted, cut) must come back as a result, never as a crash or an out-of-range offset
    import random

    rng = random.Random(0)
    texts = [json.dumps(TRICKY, indent=i, ensure_ascii=a)[1:] for i in (None, 1) for a in (True, False)]
    alphabet = b'{}[]",:\\ \n\tu0123456789.eE-+abcdefnrtlsx\x00\x1f\xff'
    for _ in range(3000):
        t = bytearray(rng.choice(texts).encode())
        for _ in range(rng.randint(1, 6)):
            op, i = rng.random(), rng.randrange(len(t) + 1)
            if op < 0.4 and t:
                t[min(i, len(t) - 1)] = rng.choice(alphabet)
            elif op < 0.7:
                t[i:i] = bytes([rng.choice(alphabet)])
            elif op < 0.9 and t:
                del t[min(i, len(t) - 1)]
            else:
                t = t[:i]
        for final in (False, True):
            r = _native_ingest._kscan.scan(bytes(t), final)
            assert 0 <= r["consumed"] <= len(t) and r["ended"] <= len(t) and r["stray"] < len(t)
            assert r["rows"] + r["bad"] <= len(t)


def test_damaged_or_stale_raw_columns_are_not_used(tmp_path, monkeypatch):
    # the raw columns are a copy: a folder cut short, or one that mirrors other part files
    # than the entry holds, is ignored and the Parquet parts are read instead
    from tilescope.trace import _columns

    monkeypatch.setenv("TILESCOPE_CACHE_DIR", str(tmp_path))
    t = tt.open(os.path.join(KINETO, "cuda_alexnet_small.json.gz"))
    entry = t.entries[0]
    files = _columns.event_files(entry)
    expected = t.op_table().to_pylist()
    assert _columns.read_raw(entry, files) is not None
    assert _columns.read_raw(entry, files + [files[0].replace("part-00000", "part-00001")]) is None
    ts = os.path.join(entry, "columns", "ts.i64")
    with open(ts, "r+b") as f:
        f.truncate(os.path.getsize(ts) - 8)
    assert _columns.read_raw(entry, files) is None
    assert tt.open(os.path.join(KINETO, "cuda_alexnet_small.json.gz")).op_table().to_pylist() == expected


@pytest.mark.parametrize("block", [96, 1 << 20])
def test_repeated_naming_records_name_lanes_as_the_parts_do(block, tmp_path, monkeypatch):
    # a lane's first naming record counts, even when its args are empty; repeats (traces hold
    # them by the 100,000) are dropped in the parser, within a block and across blocks
    events = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": None},
              {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "A"}},
              {"ph": "M", "name": "process_name", "pid": 1, "tid": 1, "args": {"name": "B"}},
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "T1"}}]
    events += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": t, "args": {"name": f"T{t}-{k}"}}
               for k in range(40) for t in (1, 2)]
    events += [{"ph": "X", "name": "op", "pid": 1, "tid": t, "ts": 1, "dur": 1} for t in (0, 1, 2)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events}))
    monkeypatch.setattr(_ingest, "BLOCK_BYTES", block)
    monkeypatch.setattr(_ingest, "FIRST_BLOCK_BYTES", block)
    t = _same(str(p), tmp_path, monkeypatch)
    lanes = t.sql("SELECT tid, process_name, thread_name FROM lanes ORDER BY tid").fetchall()
    assert lanes == [("0", "B", None), ("1", "B", "T1"), ("2", "B", "T2-0")]
