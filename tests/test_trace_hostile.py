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
