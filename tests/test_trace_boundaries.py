"""The analysis engine's module rules: it reads the profile format and never imports the
device; its docstring examples run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def test_opening_and_analysing_a_profile_never_imports_the_device(tmp_path):
    code = f"""
import os, sys
sys.path.insert(0, {HERE!r})
os.environ["TILESCOPE_CACHE_DIR"] = {str(tmp_path / 'cache')!r}
from trace_fixtures import write_profile
import tilescope.trace as tt
a = tt.open(write_profile({str(tmp_path / 'a')!r}, "naive", steps=1))
b = tt.open(write_profile({str(tmp_path / 'b')!r}, "fused", steps=1))
a.op_table(); a.lineage(a.sql("SELECT min(eid) FROM events WHERE kind = 'op'").fetchall()[0][0])
a.window(); a.roofline(); tt.diff(a, b); a.replay("trn2")
bad = sorted(m for m in sys.modules if m.startswith(("tilescope.device", "tilescope.lower")))
print("IMPORTED", bad)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "IMPORTED []" in out.stdout


def test_analysing_a_kineto_trace_imports_neither_torch_nor_the_device(tmp_path):
    # the engine reads real traces without torch (a process that only analyses starts fast)
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}]}')
    code = f"""
import os, sys
os.environ["TILESCOPE_CACHE_DIR"] = {str(tmp_path / 'cache')!r}
import tilescope.trace as tt
from tilescope.trace._report import report_dict
t = tt.open({str(trace)!r}); t.op_table(); t.breakdown(); t.gaps(); t.window(); t.roofline(); report_dict(t)
print("IMPORTED", sorted(m for m in sys.modules if m.startswith(("torch", "tilescope.device", "tilescope.lower"))))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "IMPORTED []" in out.stdout


def test_opening_a_trace_and_its_first_op_table_never_start_duckdb(tmp_path):
    # DuckDB's start (~0.3 s, ~50 MB) would be most of the first question's cost: the native
    # ingest and the op table work on arrays; SQL (t.sql, other analyses) opens it
    trace = os.path.join(HERE, "data", "kineto", "cuda_alexnet_small.json.gz")
    code = f"""
import os, sys
os.environ["TILESCOPE_CACHE_DIR"] = {str(tmp_path / 'cache')!r}
import tilescope.trace as tt
t = tt.open({trace!r})
ops = t.op_table()
print("DUCKDB", "duckdb" in sys.modules, ops.num_rows)
from tilescope.trace import _native_ingest
print("PARQUET READER", "pyarrow.parquet" in sys.modules, "NATIVE", _native_ingest.available())
t.sql("SELECT count(*) FROM _links").fetchall()
print("THEN", "duckdb" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "DUCKDB False 37" in out.stdout and "THEN True" in out.stdout, out.stdout
    # the native ingest hands the nesting its columns as raw arrays: no Parquet reader either
    # (pyarrow.parquet is ~10 MB and 0.05 s; pyarrow itself comes with the op table's result)
    assert "PARQUET READER False NATIVE True" in out.stdout or "NATIVE False" in out.stdout, out.stdout


def test_the_guide_lists_every_table_column():
    from tilescope.trace import TABLES

    with open(os.path.join(HERE, "..", "docs", "trace-analysis.md"), encoding="utf-8") as f:
        doc = f.read()
    import re

    missing = [f"{t}.{c}" for t, cols in TABLES.items() for c, _ty, _d in cols
               if not re.search(rf"[`\s,]{re.escape(c)}[`,\s]", doc)]
    assert not missing, f"docs/trace-analysis.md does not mention {missing}"


def _nest_reference(lane, ts, end):
    """The plain stack algorithm nest() must agree with (zero-length slices contain nothing)."""
    parent, stack, prev = [-1] * len(ts), [], None
    for i in range(len(ts)):
        if lane[i] != prev:
            stack.clear()
            prev = lane[i]
        while stack and end[stack[-1]] <= ts[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        if end[i] > ts[i]:
            stack.append(i)
    return parent


def test_the_c_stack_walk_equals_the_python_one():
    # lanes whose slices straddle are walked with a stack; the C walk (the trace extension)
    # and the Python one give the same parents, depths and straddle count
    import numpy as np

    from tilescope.trace import _nesting

    if _nesting._kscan is None or not hasattr(_nesting._kscan, "nest_stack"):
        pytest.skip("the trace extension is not built")
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 500):
        ts = np.sort(rng.integers(0, 60, n))
        end = ts + rng.integers(0, 25, n) * (rng.random(n) < 0.9)
        order = np.lexsort((-end, ts))
        ts, end = ts[order].astype(np.int64), end[order].astype(np.int64)
        a, b = (0, n) if n < 7 else (2, n - 1)
        out = []
        for walk in (_nesting._stack, _nesting._stack_py):
            parent, depth = np.full(n, -7, dtype=np.int64), np.full(n, -7, dtype=np.int64)
            out.append((walk(ts, end, a, b, parent, depth), parent.tolist(), depth.tolist()))
        assert out[0] == out[1], n
    with pytest.raises(ValueError, match="four int64 arrays"):
        _nesting._kscan.nest_stack(np.zeros(3, np.int64), np.zeros(2, np.int64), np.zeros(3, np.int64),
                                   np.zeros(3, np.int64), 0, 3)


def test_vectorised_nesting_equals_the_stack_algorithm():
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from tilescope.trace._nesting import nest

    def nested(draw_lane, lo, hi, depth, draw):
        out = []
        t = lo
        while t < hi and len(out) < 12:
            a = draw(st.integers(t, hi))
            b = draw(st.integers(a, hi))
            out.append((draw_lane, a, b))
            if depth < 4 and b > a:
                out += nested(draw_lane, a, b, depth + 1, draw)
            t = b + draw(st.integers(0, 3))
        return out

    @settings(max_examples=150, deadline=None)
    @given(st.data(), st.booleans())
    def check(data, straddling):
        ev = []
        for lane in range(data.draw(st.integers(1, 3))):
            if straddling:  # arbitrary intervals: slices may overlap without nesting
                for _ in range(data.draw(st.integers(0, 25))):
                    a = data.draw(st.integers(0, 50))
                    ev.append((lane, a, a + data.draw(st.integers(0, 20))))
            else:
                ev += nested(lane, 0, 60, 0, data.draw)
        ev.sort(key=lambda e: (e[0], e[1], -e[2]))
        lane = np.array([e[0] for e in ev], dtype=np.int64)
        ts = np.array([e[1] for e in ev], dtype=np.int64)
        end = np.array([e[2] for e in ev], dtype=np.int64)
        parent, _depth, _o = nest(lane, ts, end)
        assert parent.tolist() == _nest_reference(lane.tolist(), ts.tolist(), end.tolist())

    check()
