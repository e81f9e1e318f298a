"""Hostile traces, generated here: slices that all share one timestamp nest as deep as they
are many; the op table stays linear-ish in them and the windowed query does not overflow."""

import json
import time

import tilescope.trace as tt


def _same_time_trace(tmp_path, n, dur_us):
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{k % 3}", "pid": 1, "tid": 1, "ts": 1000.0,
               "dur": dur_us} for k in range(n)]
    path = tmp_path / f"same_{n}_{dur_us}.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return tt.open(str(path), progress=False)


def test_slices_with_one_timestamp_nest_without_quadratic_time(tmp_path):
    n = 100_000  # nested 100,000 deep: a pass per level took ~80 s here, pointer jumping ~3 s
    tr = _same_time_trace(tmp_path, n, 5.0)
    t = time.perf_counter()
    rows = {r["name"]: r for r in tr.op_table().to_pylist()}
    took = time.perf_counter() - t
    assert sum(r["calls"] for r in rows.values()) == n
    assert sum(r["host_self_ns"] for r in rows.values()) == 5_000  # the innermost holds all the self time
    assert all(r["host_total_ns"] == r["calls"] * 5_000 for r in rows.values())
    assert took < 20, took


def test_the_window_over_slices_deeper_than_int16(tmp_path):
    tr = _same_time_trace(tmp_path, 40_000, 5.0)
    w = tr.window(max_events=50_000)
    assert w["exact"] and int(w["events"]["depth"].max()) == 39_999


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_metadata_nested_deeper_than_the_json_reader_is_a_warning(tmp_path):
    event = json.dumps({"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0})
    depth = 100_000
    tr = tt.open(_write(tmp_path, "deep.json", '{"traceEvents": [' + event + '], "x": ' + "[" * depth + "]" * depth
                        + "}"), progress=False)
    assert [r[0] for r in tr.sql("SELECT name FROM events").fetchall()] == ["a"]
    assert any("nests deeper than the JSON reader follows" in w for w in tr.warnings), tr.warnings


def test_records_without_a_numeric_ts_are_where_the_warning_says(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 1, "ts": "abc", "dur": 2.0},
              {"ph": "X", "cat": "cpu_op", "name": "fine", "pid": 1, "tid": 1, "ts": 3.0, "dur": 2.0}]
    tr = tt.open(_write(tmp_path, "ts.json", json.dumps({"traceEvents": events})), progress=False)
    (warning,) = [w for w in tr.warnings if "no numeric 'ts'" in w]
    assert "kept in the raw table" in warning and "left out of events" in warning
    assert tr.sql("SELECT name FROM raw WHERE ts_ns IS NULL").fetchall() == [("no_ts",)]
    assert tr.sql("SELECT name FROM events").fetchall() == [("fine",)]


def _gzip_trace(path, middle_chunks, before=b"", after=b""):
    import gzip

    event = b'{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1.0,"dur":2.0}'
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b'{"traceEvents":[' + event + b"," + before)
        for chunk in middle_chunks:
            f.write(chunk)
        f.write(after + event + b"]}")
    return str(path)


def _peak_rss_of(code: str) -> tuple[int, str]:
    """Peak RSS (bytes) of a fresh process running ``code``, and its output."""
    import os
    import subprocess
    import sys

    src = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "src")
    # VmHWM is this process image's own peak; ru_maxrss is not: Linux carries the parent's RSS at
    # fork over exec into it, so under a large pytest process it reads the parent's size
    probe = code + ("\nimport re; print('peak', int(re.search(r'VmHWM:\\s+(\\d+) kB', "
                    "open('/proc/self/status').read()).group(1)) * 1024)")
    env = {k: v for k, v in os.environ.items() if k != "TILESCOPE_TRACE_INGEST"}  # the native reader, when built
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", probe], capture_output=True, text=True, timeout=600,
                         env={**env, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split("peak")[-1]), out.stdout


needs_native = __import__("pytest").mark.skipif(
    __import__("tilescope.trace._native_ingest", fromlist=["_kscan"])._kscan is None,
    reason="the native trace reader is not built")


@needs_native
def test_a_run_of_whitespace_between_events_is_not_held(tmp_path):
    """300 MiB of whitespace (1.4 MB of gzip) between two events: it was held and scanned
    again block after block (660 MB and 110 s here); memory now stays near a baseline."""
    path = _gzip_trace(tmp_path / "ws.json.gz", [b" " * (1 << 20)] * 300)
    rss, out = _peak_rss_of(f"import tilescope.trace as tt; tr = tt.open({path!r}, progress=False); "
                            f"print('events', tr.sql('SELECT count(*) FROM events').fetchall()[0][0])")
    assert "events 2" in out
    assert rss < 400 << 20, rss


@needs_native
def test_one_huge_string_is_an_error_not_unbounded_memory(tmp_path):
    path = _gzip_trace(tmp_path / "str.json.gz", [b"x" * (1 << 20)] * 100, before=b'{"name":"', after=b'"},')
    rss, out = _peak_rss_of(f"import tilescope.trace as tt\ntry:\n    tt.open({path!r}, progress=False)\n"
                            f"except tt.TraceFormatError as e:\n    print('error', e)")
    assert "one element of 'traceEvents' runs past 64 MiB" in out, out
    assert rss < 600 << 20, rss
