"""Ingest of broken and odd inputs: each is a clear error or a warning, never a crash or
silently wrong numbers."""

from __future__ import annotations

import gzip
import json
import os
import warnings

import pytest

import tilescope.trace as tt
from tilescope.trace import TraceFormatError
from tilescope.trace import _native_ingest
from tilescope.trace._jsonscan import ChromeTraceScanner


@pytest.fixture(autouse=True, params=["native", "python"])
def engine(request, tmp_path, monkeypatch):
    """Every test runs on both ingest paths: the C parser and the DuckDB JSON reader it replaces."""
    monkeypatch.setenv("TILESCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TILESCOPE_TRACE_INGEST", request.param)
    if request.param == "native" and not _native_ingest.available():
        pytest.fail("the native trace parser (tilescope.trace._kscan) is not built: run `make setup`")
    return request.param


def _events(n=20, pid=1, tid=1, t0=1000.0, dur=10.0, cat="cpu_op"):
    return [{"ph": "X", "cat": cat, "name": f"op{i % 3}", "pid": pid, "tid": tid, "ts": t0 + 20 * i, "dur": dur,
             "args": {"External id": i}} for i in range(n)]


def _write(tmp_path, doc, name="t.json", indent=2):
    p = tmp_path / name
    text = doc if isinstance(doc, (str, bytes)) else json.dumps(doc, indent=indent)
    (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
    return str(p)


def _open(path, **kw):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        t = tt.open(path, **kw)
    return t, [str(x.message) for x in w]


def test_pretty_and_minified_give_the_same_tables(tmp_path, engine):
    doc = {"traceEvents": _events(3000), "schemaVersion": 1}  # > 256 KiB: the fast path takes over
    a, _ = _open(_write(tmp_path, doc, "a.json", indent=2))
    b, _ = _open(_write(tmp_path, doc, "b.json", indent=None))
    q = "SELECT name, count(*), sum(dur_ns) FROM events GROUP BY name ORDER BY name"
    assert a.sql(q).fetchall() == b.sql(q).fetchall() == [("op0", 1000, 10_000_000), ("op1", 1000, 10_000_000),
                                                          ("op2", 1000, 10_000_000)]
    assert a.meta[0]["ingest"]["mode"] == b.meta[0]["ingest"]["mode"] == {"native": "native", "python": "fast"}[engine]


def test_fast_path_falls_back_when_the_separator_hides_in_strings(tmp_path, engine):
    # one-line JSON: the learned separator is '}, {', which these names contain; the fast split
    # yields lines that are not JSON objects, so the file is re-read in exact mode
    ev = _events(3000)
    for e in ev[2900:2910]:  # past the first (exact) block
        e["name"] = 'tricky}, {"name": "x'
    t, w = _open(_write(tmp_path, {"traceEvents": ev}, indent=None))
    assert t.meta[0]["ingest"]["mode"] == {"native": "native", "python": "exact"}[engine]
    assert t.sql("SELECT count(*) FROM events").fetchall()[0][0] == 3000
    assert t.sql("SELECT count(*) FROM events WHERE name = ?", params=[ev[2900]["name"]]).fetchall()[0][0] == 10
    assert not w


def test_truncated_json_keeps_complete_events_and_warns(tmp_path):
    text = json.dumps({"traceEvents": _events(40)}, indent=2)
    cut = text[: int(len(text) * 0.6)]
    t, w = _open(_write(tmp_path, cut))
    n = t.sql("SELECT count(*) FROM events").fetchall()[0][0]
    assert 0 < n < 40
    assert any("ends inside 'traceEvents'" in m and "truncated" in m for m in w)
    # the kept events are exactly the complete ones: a prefix of the original sequence
    names = [r[0] for r in t.sql("SELECT name FROM events ORDER BY ts_ns").fetchall()]
    assert names == [f"op{i % 3}" for i in range(n)]


def test_truncated_gzip_is_an_error_naming_the_offset(tmp_path):
    data = gzip.compress(json.dumps({"traceEvents": _events(500)}).encode())
    p = _write(tmp_path, data[: len(data) // 2], "t.json.gz")
    with pytest.raises(TraceFormatError, match=r"t\.json\.gz: gzip stream ends early at compressed byte"):
        tt.open(p)


@pytest.mark.parametrize("text, match", [
    ("", "empty file"),
    ("   \n", "empty file"),
    ('{"foo": 1, "bar": [1, 2]}', r"without a 'traceEvents' array.*top-level keys: foo, bar"),
    ('{"traceEvents": {"ph": "X"}}', r"field 'traceEvents' is a dict, expected an array"),
    ("hello world", r"byte offset 0: expected a JSON object or array"),
    ('{"traceEvents": []}}', r"byte offset 19: unbalanced"),
    ('{"traceEvents": []} {"x": 1}', r"data after the end of the trace document"),
])
def test_not_a_trace_is_a_clear_error(tmp_path, text, match):
    with pytest.raises(TraceFormatError, match=match) as e:
        tt.open(_write(tmp_path, text))
    assert "t.json" in str(e.value)


def test_binary_garbage_names_file_and_offset(tmp_path):
    p = _write(tmp_path, b"\x00\x01\x02PK\x03\x04" * 10, "blob.json")
    with pytest.raises(TraceFormatError, match=r"blob\.json: byte offset 0"):
        tt.open(p)


def test_empty_trace_opens_with_a_warning(tmp_path):
    t, w = _open(_write(tmp_path, {"traceEvents": []}))
    assert t.summary()["events"] == 0
    assert any("holds no events" in m for m in w)
    assert t.op_table().num_rows == 0 and t.breakdown().num_rows == 0 and t.gaps().num_rows == 0


def test_wrong_types_are_kept_as_null_and_reported(tmp_path):
    ev = _events(10)
    ev[3]["ts"] = "not a number"
    ev[4]["dur"] = [1, 2]
    ev[5]["pid"] = {"weird": True}
    ev[6]["args"] = "a string"
    t, w = _open(_write(tmp_path, {"traceEvents": ev}))
    assert t.sql("SELECT count(*) FROM raw").fetchall()[0][0] == 10
    assert t.sql("SELECT count(*) FROM events").fetchall()[0][0] == 9  # the one without a time
    assert any("1 records have no numeric 'ts'" in m for m in w)
    assert any("no numeric 'dur'" in m for m in w)
    assert t.op_table().num_rows > 0


def test_malformed_event_is_skipped_and_counted(tmp_path):
    text = json.dumps({"traceEvents": _events(30)}, indent=2)
    text = text.replace('"name": "op1"', '"name": op1', 1)  # one event is not JSON
    t, w = _open(_write(tmp_path, text))
    assert t.sql("SELECT count(*) FROM events").fetchall()[0][0] == 29
    assert any("1 of 30 events are not valid JSON objects" in m for m in w)


def test_escapes_braces_and_commas_inside_strings(tmp_path):
    ev = _events(6)
    ev[2]["name"] = 'void k<{lambda(float)#1}>, "quoted" \\ back}, {slash'
    ev[3]["args"]["note"] = "],\n  {\"ph\": \"X\"}"
    t, _ = _open(_write(tmp_path, {"traceEvents": ev}))
    names = [r[0] for r in t.sql("SELECT name FROM events ORDER BY ts_ns").fetchall()]
    assert len(names) == 6 and names[2] == ev[2]["name"]


def test_bad_utf8_is_replaced_with_a_warning(tmp_path):
    text = json.dumps({"traceEvents": _events(5)}, indent=2).encode()
    text = text.replace(b'"op1"', b'"op\xff\xfe1"', 1)
    t, w = _open(_write(tmp_path, text))
    assert t.sql("SELECT count(*) FROM events").fetchall()[0][0] == 5
    assert any("invalid UTF-8 at byte offset" in m for m in w)
    assert t.sql("SELECT count(*) FROM events WHERE name = 'op\ufffd\ufffd1'").fetchall()[0][0] == 1


def test_huge_ints_and_missing_fields(tmp_path):
    ev = _events(4)
    ev[0]["args"]["External id"] = 2 ** 70
    ev[0]["args"]["correlation"] = 18446744073709551615
    ev[1].pop("cat")
    ev[2].pop("name")
    ev[3]["tid"] = 10 ** 30
    t, _ = _open(_write(tmp_path, {"traceEvents": ev}))
    assert t.sql("SELECT count(*) FROM events").fetchall()[0][0] == 4
    assert t.sql("SELECT external_id, correlation FROM events ORDER BY ts_ns LIMIT 1").fetchall()[0] == (None, None)
    assert "1180591620717411303424" in t.event(t.sql("SELECT min(eid) FROM events").fetchall()[0][0])["args"].__repr__()


def test_zero_duration_and_overlapping_events(tmp_path):
    ev = _events(6)
    ev[1]["dur"] = 0
    ev.append({"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 995.0, "dur": 30.0})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "straddle", "pid": 1, "tid": 1, "ts": 1015.0, "dur": 30.0})
    t, _ = _open(_write(tmp_path, {"traceEvents": ev}))
    t.op_table()
    assert any("zero duration" in n for n in t.notes)
    assert any("overlap a slice on the same lane without nesting" in n for n in t.notes)
    busy = t.breakdown(side="host").to_pylist()[0]["busy_ns"]
    # union of [995, 1045) and the later ops [1040, ...] etc.: no double counting of overlaps
    assert busy == t.sql("SELECT max(end_ns) - min(ts_ns) FROM events").fetchall()[0][0] - 5_000 * 0 - _holes(t)


def _holes(t):
    rows = t.sql("SELECT ts_ns, end_ns FROM events ORDER BY ts_ns, end_ns").fetchall()
    holes, reach = 0, rows[0][1]
    for s, e in rows[1:]:
        if s > reach:
            holes += s - reach
        reach = max(reach, e)
    return holes


def test_clock_skew_between_ranks_warns_and_aligns(tmp_path):
    a = _write(tmp_path, {"traceEvents": _events(10, cat="kernel", pid=0, tid=7), "distributedInfo": {"rank": 0}}, "r0.json")
    b = _write(tmp_path, {"traceEvents": _events(10, cat="kernel", pid=0, tid=7, t0=3.6e9), "distributedInfo": {"rank": 1}}, "r1.json")
    t, w = _open([a, b])
    assert t.ranks == [0, 1]
    assert any("ranks' clocks disagree" in m and "align='start'" in m for m in w)
    t2, w2 = _open([a, b], align="start")
    starts = t2.sql("SELECT rank, min(ts_ns) FROM events GROUP BY rank ORDER BY rank").fetchall()
    assert starts[0][1] == starts[1][1]
    assert any("aligned" in m for m in w2)
    assert t2.ranks_summary().num_rows == 2


def test_directory_of_rank_traces(tmp_path):
    d = tmp_path / "ranks"
    d.mkdir()
    for r in range(3):
        (d / f"rank{r}.json").write_text(json.dumps({"traceEvents": _events(5, cat="kernel", pid=0, tid=7),
                                                    "distributedInfo": {"rank": r}}))
    t, _ = _open(str(d))
    assert t.ranks == [0, 1, 2]
    out = t.export_parquet(str(tmp_path / "export"))
    import duckdb

    n = duckdb.sql(f"SELECT count(*), count(DISTINCT rank) FROM read_parquet('{out}/events/rank=*/*.parquet', "
                   f"hive_partitioning=true)").fetchall()[0]
    assert n == (15, 3)


def test_duplicate_ranks_are_renumbered(tmp_path):
    a = _write(tmp_path, {"traceEvents": _events(3), "distributedInfo": {"rank": 0}}, "a.json")
    b = _write(tmp_path, {"traceEvents": _events(3), "distributedInfo": {"rank": 0}}, "b.json")
    t, w = _open([a, b])
    assert t.ranks == [0, 1] and any("same rank" in m for m in w)


def test_bare_array_and_unclosed_array_formats(tmp_path):
    ev = _events(7)
    t, _ = _open(_write(tmp_path, ev, "arr.json"))
    assert t.sql("SELECT count(*) FROM events").fetchall()[0][0] == 7
    text = json.dumps(ev, indent=1)[:-1]  # Chrome's JSON Array Format may omit the closing ']'
    t, _ = _open(_write(tmp_path, text, "open.json"))
    assert t.sql("SELECT count(*) FROM events").fetchall()[0][0] == 7


def test_scanner_block_boundaries_do_not_matter():
    doc = json.dumps({"a": [1, "x\\\"]"], "traceEvents": _events(25) + [{"name": "q\\\\", "ph": "i", "ts": 1}],
                      "z": {"k": "}"}}, indent=1).encode()
    ref = None
    for size, fast in [(n, f) for n in (1, 2, 3, 7, 64, 1000, len(doc)) for f in (False, True)]:
        out = []
        s = ChromeTraceScanner("x", out.append, fast=fast)
        for i in range(0, len(doc), size):
            s.feed(doc[i:i + size])
        s.finish()
        lines = [json.loads(x) for x in b"".join(bytes(o) for o in out).split(b"\n") if x.strip()]
        assert len(lines) == 26
        assert s.events == 26 or (fast and s.events_uncounted)
        assert s.metadata == {"a": [1, 'x\\"]'], "traceEvents": [], "z": {"k": "}"}}
        ref = ref or lines
        assert lines == ref


def test_executable_itrace_hash_mismatch_names_both_files(tmp_path):
    from trace_fixtures import write_profile

    p = write_profile(str(tmp_path / "p"), "naive", steps=1)
    ex = sorted(os.listdir(os.path.join(p, "executables")))
    it = sorted(os.listdir(os.path.join(p, "itraces")))
    a = os.path.join(p, "executables", ex[0])
    other = next(x for x in it if not x.startswith(ex[0][:-5]))
    b = os.path.join(p, "itraces", other)
    with pytest.raises(TraceFormatError, match=r"belongs to another executable") as e:
        tt.open([a, b])
    assert ex[0] in str(e.value) and other in str(e.value)


def test_fractional_epoch_timestamps_keep_every_nanosecond(tmp_path, engine):
    # absolute-epoch microseconds with a fraction: a double would round to 0.25 us
    base = 1_686_355_493_423_513
    lines = [f'  {{"ph": "X", "cat": "kernel", "name": "k{i}", "pid": 0, "tid": 7, "ts": {base}.{i:03d}, "dur": 0.001}}'
             for i in range(1, 6)]
    text = '{"traceEvents": [\n' + ",\n".join(lines) + "\n]}"
    t, _ = _open(_write(tmp_path, text))
    # the C parser reads the decimal text exactly; the DuckDB path must pick DECIMAL to
    assert t.meta[0]["ingest"]["ts_type"].startswith({"native": "exact", "python": "DECIMAL"}[engine])
    rows = t.sql("SELECT name, ts_ns, dur_ns FROM events ORDER BY ts_ns").fetchall()
    assert rows == [(f"k{i}", base * 1000 + i, 1) for i in range(1, 6)]


def test_integer_epoch_timestamps_are_exact_as_doubles(tmp_path, engine):
    base = 1_661_203_463_029_566  # Kineto's integer microseconds (the control trace's clock)
    ev = [{"ph": "X", "name": "k", "pid": 0, "tid": 7, "ts": base + i, "dur": 1} for i in range(3)]
    t, _ = _open(_write(tmp_path, {"traceEvents": ev}))
    assert t.meta[0]["ingest"]["ts_type"] == {"native": "exact", "python": "DOUBLE"}[engine]
    assert [r[0] for r in t.sql("SELECT ts_ns FROM events ORDER BY ts_ns").fetchall()] == [(base + i) * 1000 for i in range(3)]


def test_peak_device_memory_per_op(tmp_path):
    # Kineto's profile_memory=True writes '[memory]' instants on the host thread
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 20, "dur": 10},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 40, "dur": 10}]
    for ts, dev, total in ((11, 1, 1000), (21, 1, 5000), (25, 0, 99999), (41, 1, 3000), (60, 1, 8000)):
        ev.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts, "s": "t",
                   "args": {"Device Type": dev, "Device Id": 0, "Total Allocated": total, "Bytes": 512}})
    t, _ = _open(_write(tmp_path, {"traceEvents": ev}))
    peak = {r["name"]: r["peak_allocated_bytes"] for r in t.memory().to_pylist()}
    assert peak == {"aten::mm": 5000, "aten::empty": 1000}  # the CPU (type 0) allocation is not device memory
    assert tt.open(_write(tmp_path, {"traceEvents": ev[:3]}, "nomem.json")).memory().num_rows == 0


def test_begin_end_pairs_become_slices(tmp_path):
    ev = [{"ph": "B", "name": "outer", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 0, "args": {"k": 1}},
          {"ph": "B", "name": "inner", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 2},
          {"ph": "E", "pid": 1, "tid": 1, "ts": 5},
          {"ph": "B", "name": "inner", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 6},
          {"ph": "E", "pid": 1, "tid": 1, "ts": 8},
          {"ph": "E", "pid": 1, "tid": 1, "ts": 10},
          {"ph": "B", "name": "other_thread", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 1},
          {"ph": "E", "pid": 1, "tid": 2, "ts": 4},
          {"ph": "B", "name": "never_ends", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 9},
          {"ph": "X", "name": "plain", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 11, "dur": 1}]
    t, w = _open(_write(tmp_path, {"traceEvents": ev}))
    rows = t.sql("SELECT name, ts_ns, dur_ns FROM events ORDER BY tid, ts_ns").fetchall()
    assert rows == [("outer", 0, 10_000), ("inner", 2_000, 3_000), ("inner", 6_000, 2_000),
                    ("other_thread", 1_000, 3_000), ("plain", 11_000, 1_000)]
    assert any("1 'B'/'E' events have no partner" in m for m in w)
    ops = {r["name"]: r for r in t.op_table().to_pylist()}
    assert ops["outer"]["host_self_ns"] == 10_000 - 5_000 and ops["inner"]["calls"] == 2
