"""The analysis engine on real Kineto traces recorded elsewhere (tests/data/kineto/).

Expected numbers were cross-checked once against HolisticTraceAnalysis 0.5.0
(`TraceAnalysis(trace_dir, include_last_profiler_step=True)` on the decompressed control
trace; `benchmarks/ingest_vs_hta.py` prints the same figures from HTA). Each constant
below says where it came from.
"""

from __future__ import annotations

import json
import os

import pytest

import tilescope.trace as tt

KINETO = os.path.join(os.path.dirname(__file__), "data", "kineto")
CONTROL = os.path.join(KINETO, "cuda_trace_diff_control.json.gz")
TEST = os.path.join(KINETO, "cuda_trace_diff_test.json.gz")



pytestmark = pytest.mark.usefixtures("module_cache_dir")


@pytest.fixture(scope="module")
def control():
    return tt.open(CONTROL)


def test_record_and_category_counts(control):
    # 109,123 records: tests/data/kineto/README.md; same count from json.load of the file.
    assert control.sql("SELECT count(*) FROM raw").fetchall()[0][0] == 109_123
    # per-category counts of complete events: HTA 0.5.0 trace DataFrame (value_counts of 'cat')
    cats = dict(control.sql("SELECT cat, count(*) FROM events WHERE ph = 'X' GROUP BY cat").fetchall())
    hta = {"cpu_op": 40_506, "cuda_runtime": 24_692, "kernel": 8_568, "gpu_memset": 654,
           "user_annotation": 288, "gpu_memcpy": 228}
    assert {k: cats[k] for k in hta} == hta
    # flows: 9,450 's' and 24,692 'f' records (count of "ph" values in the file)
    assert dict(control.sql("SELECT ph, count(*) FROM flows GROUP BY ph").fetchall()) == {"s": 9_450, "f": 24_692}


def test_rank_comes_from_distributed_info(control):
    # HTA names this trace rank 3 (distributedInfo.rank)
    assert control.ranks == [3]
    assert "NVIDIA A100-PG509-200" in control.device_names()


def test_per_stream_busy_time_matches_hta(control):
    # HTA 0.5.0: events per stream and the union of their [ts, ts+dur) intervals, in us
    hta = {"7": (8_964, 280_227), "20": (282, 7_165), "21": (60, 163_535), "22": (144, 50_640)}
    got = {r["tid"]: (r["events"], r["busy_ns"] // 1000) for r in control.breakdown().to_pylist()}
    assert got == hta


def test_temporal_breakdown_matches_hta(control):
    # HTA get_temporal_breakdown: kernel_time 464,594 us, idle_time 76,007 us (rank 3)
    r = control.ranks_summary().to_pylist()[0]
    assert r["device_span_ns"] == 464_594_000
    assert r["device_idle_ns"] == 76_007_000
    assert r["device_active_ns"] == 464_594_000 - 76_007_000


def test_top_kernels_match_hta(control):
    # HTA get_gpu_kernel_breakdown (per-kernel sum in us and count), the three largest kernels
    k = [r for r in control.kernels().to_pylist() if r["kind"] == "kernel"][:3]
    assert [(r["name"][:40], r["calls"], r["total_ns"] // 1000) for r in k] == [
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8", 42, 130_655),
        ("void split_embedding_backward_codegen_ro", 6, 36_180),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(n", 18, 32_880),
    ]
    # HTA: 8,568 kernels totalling 446,813 us
    tot = control.sql("SELECT count(*), sum(dur_ns) FROM events WHERE kind = 'kernel'").fetchall()[0]
    assert (tot[0], tot[1] // 1000) == (8_568, 446_813)


def test_op_table_attributes_kernel_time_to_the_launching_op(control):
    ops = {r["name"]: r for r in control.op_table().to_pylist()}
    # every kernel/memcpy/memset reached from a launch (by correlation id) lands on the nearest
    # enclosing aten op, or on the launch itself when no op encloses it (as key_averages shows it)
    linked = control.sql("SELECT sum(d.dur_ns) FROM _links k JOIN events d ON d.eid = k.dev_eid").fetchall()[0][0]
    rows = control.op_table(kinds=("op", "launch")).to_pylist()
    assert sum(r["device_self_ns"] for r in rows) == linked
    # kernels launched outside any op: 7.642 ms here, on the cudaLaunchKernel row of the op table too
    outside = sum(r["device_self_ns"] for r in rows if r["name"].startswith("cuda"))
    assert outside == ops["cudaLaunchKernel"]["device_self_ns"] == 7_642_000
    assert sum(r["device_self_ns"] for r in ops.values()) == linked
    # NCCL's record_param_comms launches all of stream 21's kernels: 163,535 us (HTA stream 21 busy)
    assert ops["record_param_comms"]["device_self_ns"] == 163_535_000
    # self host time never exceeds total, and parents include their children's device time
    assert all(r["host_self_ns"] <= r["host_total_ns"] for r in ops.values())


def test_lineage_from_a_kernel_reaches_its_op_and_launch(control):
    eid = control.sql("SELECT eid FROM events WHERE name LIKE 'ncclKernel_SendRecv%' ORDER BY ts_ns LIMIT 1").fetchall()[0][0]
    hops = control.lineage(eid)
    kinds = [h["hop"] for h in hops]
    assert "op" in kinds and "launch" in kinds and "device" in kinds
    launch = next(h for h in hops if h["hop"] == "launch")
    dev = next(h for h in hops if h["hop"] == "device")
    assert launch["correlation"] == dev["correlation"] and dev["eid"] == eid
    assert launch["ts_ns"] <= dev["ts_ns"]


def test_gaps_are_classified(control):
    g = control.gaps()
    classes = set(g.column("class").to_pylist())
    assert classes <= {"device_waits_on_host", "device_waits_on_runtime", "device_other", "host_waits_on_device"}
    # device gaps on a lane never overlap that lane's busy time: their total is the lane's span minus busy
    lane = control.breakdown().to_pylist()[0]
    span = control.sql(f"SELECT max(end_ns) - min(ts_ns) FROM events WHERE lane = {lane['lane']} AND ph = 'X'").fetchall()[0][0]
    tot = sum(ns for ln, c, ns in zip(g.column("lane").to_pylist(), g.column("class").to_pylist(), g.column("gap_ns").to_pylist())
              if ln == lane["lane"] and c != "host_waits_on_device")
    assert tot == span - lane["busy_ns"]


def test_diff_of_two_runs(control):
    d = tt.diff(control, tt.open(TEST))
    ops = {r["op"]: r for r in d.ops.to_pylist()}
    names = d.names
    assert ops["aten::mm"][f"calls[{names[0]}]"] > 0
    assert set(d.summary.column("metric").to_pylist()) >= {"events", "device busy ns (summed over device lanes)",
                                                          "device executions / kernels"}
    assert d.modeled == [False, False] and "measured" in d.times_label()


def test_a_diff_from_stored_profiles_equals_the_diff_of_the_traces(control):
    """Each trace's part of a diff is plain data: kept as JSON and passed back, it gives the
    same diff (the explorer computes it once per trace for every comparison)."""
    import json

    test = tt.open(TEST)
    profiles = [json.loads(json.dumps(tt.diff_profile(t))) for t in (control, test)]
    assert tt.diff(control, test, names=["a", "b"], profiles=profiles).to_dict() == \
        tt.diff(control, test, names=["a", "b"]).to_dict()
    with pytest.raises(ValueError, match="one profile"):
        tt.diff(control, test, profiles=profiles[:1])


def test_diff_of_runs_whose_files_share_a_name(tmp_path, capsys):
    """Two runs' trace.json.gz in their own folders (the usual layout) get distinct columns
    from those folders; the same trace twice is numbered; NAME=PATH names a column."""
    import shutil

    from tilescope.cli import main

    paths = []
    for run, src in (("runA", CONTROL), ("runB", TEST)):
        os.makedirs(tmp_path / run)
        paths.append(str(shutil.copy(src, tmp_path / run / "trace.json.gz")))
    d = tt.diff(*paths)
    assert d.names == ["runA/trace.json.gz", "runB/trace.json.gz"]
    assert d.summary.column_names == ["metric", *d.names]
    assert tt.diff(paths[0], paths[0], paths[0]).names == ["trace.json.gz", "trace.json.gz (2)", "trace.json.gz (3)"]
    with pytest.raises(ValueError, match="one distinct name per trace"):
        tt.diff(*paths, names=["same", "same"])
    assert main(["compare", f"control={paths[0]}", f"test={paths[1]}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["names"] == ["control", "test"]


@pytest.mark.parametrize("name, kernels, ops", [
    # counts by "cat" in each file (json.load), the same numbers HTA's trace DataFrame shows
    ("cuda_alexnet_small", 79, 359),
    ("rocm_mi250_small", 14, 70),
    ("cuda_triton_tiny", 1, 3),
    ("cpu_only_tiny", 0, 4),
])
def test_small_traces(name, kernels, ops):
    t = tt.open(os.path.join(KINETO, f"{name}.json.gz"))
    s = t.summary()
    assert s["by_kind"].get("kernel", 0) == kernels
    assert s["by_category"].get("cpu_op", 0) == ops
    t.op_table()
    t.gaps()
    if kernels:
        assert s["device_lanes"] >= 1
        assert sum(r["events"] for r in t.breakdown().to_pylist()) >= kernels
    else:
        assert t.breakdown().num_rows == 0


def test_rocm_lineage_uses_correlation():
    t = tt.open(os.path.join(KINETO, "rocm_mi250_small.json.gz"))
    eid = t.sql("SELECT eid FROM events WHERE kind = 'kernel' LIMIT 1").fetchall()[0][0]
    assert [h["hop"] for h in t.lineage(eid)][-2:] == ["launch", "device"]


def test_ac2g_flows_bind_to_launch_and_kernel():
    t = tt.open(os.path.join(KINETO, "cuda_alexnet_small.json.gz"))
    # every ac2g 'f' record sits at the start of a device event or its launch on the same lane
    bound = t.sql("""SELECT count(*) FROM flows f JOIN lanes l ON l.rank = f.rank AND l.pid = f.pid AND l.tid = f.tid
                     JOIN events e ON e.lane = l.lane AND e.ts_ns = f.ts_ns WHERE f.cat = 'ac2g' AND f.ph = 'f'""").fetchall()[0][0]
    total = t.sql("SELECT count(*) FROM flows WHERE cat = 'ac2g' AND ph = 'f'").fetchall()[0][0]
    assert total > 0 and bound >= total


def test_dataframe_exports(control):
    tab = control.table("lanes")
    assert tab.num_rows == control.summary()["lanes"]
    pytest.importorskip("pandas")
    assert len(control.to_pandas("lanes")) == tab.num_rows


def test_window_is_exact_when_small_and_lod_when_large(control):
    # every LOD level accounts for every slice exactly once
    n = control.sql("SELECT count(*) FROM events WHERE ph = 'X' AND dur_ns IS NOT NULL").fetchall()[0][0]
    per_level = control.sql("SELECT level, sum(count), sum(busy_ns) FROM lod GROUP BY level ORDER BY level").fetchall()
    assert len(per_level) == 5 and {c for _l, c, _b in per_level} == {n} and len({b for *_x, b in per_level}) == 1
    full = control.window(pixels=1000)
    assert not full["exact"]  # 75k slices: served from the LOD buckets plus the wide events
    assert full["buckets"]["count"].sum() > 0
    assert (full["events"]["dur_ns"] >= full["bucket_ns"] // 4).all() or full["events"]["dur_ns"].size == 0
    # a 50 us window around one kernel is small: exact events
    k = control.sql("SELECT ts_ns - (SELECT min(first_ns) FROM lanes) FROM events WHERE kind = 'kernel' LIMIT 1").fetchall()[0][0]
    w = control.window(k, k + 50_000, pixels=800)
    assert w["exact"] and w["events"]["eid"].size > 0
    assert ((w["events"]["start_ns"] < k + 50_000) & (w["events"]["start_ns"] + w["events"]["dur_ns"] >= k)).all()


def test_fp32_ops_are_measured_against_the_fp32_peak():
    """A V100 trace's fp32 matmuls: MFU against the FP32 peak (15.7 TFLOP/s), not the 16-bit
    tensor cores' (125). The A100 trace's fp32 matmuls run faster than its FP32 units can (19.5):
    TF32 on the tensor cores, against that peak (156). Opened together, each rank has its GPU's."""
    rows = {(r["name"], r["precision"]): r for r in tt.open(TEST).roofline().to_pylist()}
    mm = rows[("aten::mm", "fp32")]
    assert mm["mfu"] == pytest.approx(mm["tflops"] / 15.7)
    rows = {(r["name"], r["precision"]): r for r in tt.open(CONTROL).roofline().to_pylist()}
    mm = rows[("aten::mm", "tf32 (inferred)")]
    assert mm["tflops"] > 19.5 and mm["mfu"] == pytest.approx(mm["tflops"] / 156.0)
    with pytest.warns(tt.TraceWarning):  # (the two ranks' clocks disagree)
        both = tt.open([CONTROL, TEST]).roofline().to_pylist()
    sources = {r["peak_source"] for r in both if r["name"] == "aten::mm"}
    assert sources == {"NVIDIA A100 datasheet (40 GB SXM)", "NVIDIA V100 SXM2 datasheet"}


def test_cli_bad_arguments_are_one_line_errors(tmp_path, capsys):
    from tilescope.cli import main

    tiny = os.path.join(KINETO, "cpu_only_tiny.json.gz")
    with pytest.raises(SystemExit):
        main(["report", tiny, "--top", "-2"])
    assert "--top: -2 rows: give 0 or more" in capsys.readouterr().err
    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(["report", tiny, "--plot", str(afile)]) != 0
    assert "--plot takes a directory" in capsys.readouterr().err
    assert main(["sql", tiny, "SELECT 'nan'::DOUBLE AS b, 1.5 / 0 AS a", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"b": None, "a": None}]  # strict JSON
    assert main(["sql", tiny, ""]) != 0
    assert "give a SELECT" in capsys.readouterr().err
    assert main(["demo", "--preset", "nope"]) == 2
    assert "unknown hardware preset 'nope'" in capsys.readouterr().err


def test_the_op_table_holds_all_the_device_time(control):
    """Kernels launched outside any op (48 cudaLaunchKernel calls in this trace) are on their
    launch's row: the op table's device self time adds up to the kernels' total."""
    ops = control.op_table().to_pylist()
    assert sum(r["device_self_ns"] or 0 for r in ops) == sum(r["total_ns"] for r in control.kernels().to_pylist())
    (launch,) = [r for r in ops if r["name"] == "cudaLaunchKernel"]
    assert launch["calls"] == 48 and launch["device_self_ns"] > 0
