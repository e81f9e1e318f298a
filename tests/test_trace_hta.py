"""HTA's analyses, as Trace methods, against HolisticTraceAnalysis 0.5.0's figures.

Every fixed number below was printed by ``benchmarks/hta_reference.py`` (HTA 0.5.0 in its own
virtualenv, ``TraceAnalysis(trace_dir, include_last_profiler_step=True)``) on the committed
traces; the tests never import HTA. Where tilescope and HTA differ, the test says why and
checks the relation: HTA rounds a fractional-microsecond trace to whole microseconds inward
(start up, end down) and types device work by name only.
"""

from __future__ import annotations

import os

import pytest

import tilescope.trace as tt
from kineto_synth import KERNEL_US, VENDORS, make_trace, write
from tilescope.trace._launches import LAUNCH_NAMES_HTA

KINETO = os.path.join(os.path.dirname(__file__), "data", "kineto")


pytestmark = pytest.mark.usefixtures("module_cache_dir")


@pytest.fixture(scope="module")
def control():
    return tt.open(os.path.join(KINETO, "cuda_trace_diff_control.json.gz"))


@pytest.fixture(scope="module")
def mtia():
    return tt.open(os.path.join(KINETO, "mtia_inference_rank_0.json.gz"))


def test_kernel_type_split_with_overlaps_equals_hta(control):
    # HTA get_gpu_kernel_breakdown()[0], us (the control trace has whole-microsecond times: exact)
    hta = {"compute": 180_696, "communication": 86_554, "compute + communication": 66_699,
           "compute + memory": 25_026, "memory": 19_330, "compute + communication + memory": 8_915,
           "communication + memory": 1_367}
    got = {r["kernel_type"]: r["time_ns"] // 1000 for r in control.kernel_types().to_pylist()}
    assert got == hta
    assert abs(sum(r["share"] for r in control.kernel_types().to_pylist()) - 1) < 1e-12


def test_temporal_breakdown_equals_hta(control):
    # HTA get_temporal_breakdown: idle 76,007 us, compute 281,336, non-compute 107,251 of 464,594
    r = control.temporal_breakdown().to_pylist()[0]
    assert (r["rank"], r["span_ns"], r["idle_ns"], r["compute_ns"], r["non_compute_ns"]) == (
        3, 464_594_000, 76_007_000, 281_336_000, 107_251_000)
    assert (round(r["idle_pct"], 2), round(r["compute_pct"], 2), round(r["non_compute_pct"], 2)) == (16.36, 60.56, 23.08)


def test_temporal_breakdown_on_mtia_counts_stream_waits_only_when_asked(mtia):
    # HTA: kernel_time 443,275 us, idle 19,235 us -- HTA counts event_wait (a stream waiting on
    # another) as kernel time. tilescope's default does not: idle is larger by the waits.
    as_hta = mtia.temporal_breakdown(busy_kinds=("kernel", "memcpy", "memset", "sync")).to_pylist()[0]
    assert as_hta["span_ns"] // 1000 == 443_275
    # HTA's inward rounding shortens each of the ~1,300 intervals by up to 2 us, so its idle is larger
    assert 0 <= 19_235_000 - as_hta["idle_ns"] <= 2_000 * 1_313
    own = mtia.temporal_breakdown().to_pylist()[0]
    waits = mtia.sql("SELECT sum(dur_ns) FROM events WHERE kind = 'sync' AND side = 'device'").fetchall()[0][0]
    assert own["idle_ns"] > as_hta["idle_ns"] and waits > own["idle_ns"] - as_hta["idle_ns"]


def test_comm_comp_overlap_equals_hta(control):
    row = control.comm_comp_overlap().to_pylist()[0]
    # communication (merged) = HTA's 86,554 + 66,699 + 8,915 + 1,367 us of kernel types holding it
    assert row["communication_ns"] == (86_554 + 66_699 + 8_915 + 1_367) * 1000
    assert row["overlapped_ns"] == (66_699 + 8_915) * 1000
    # HTA get_comm_comp_overlap: 46.24 (percent, rounded to 2 places)
    assert round(100 * row["overlap_ratio"], 2) == 46.24


def test_launch_stats_equal_hta(control, mtia):
    # HTA get_cuda_kernel_launch_stats: 9,450 pairs; sums (us) cpu 139,446, gpu 501,567,
    # delay 20,056,883; gpu < cpu 3,704; cpu > 50 us 30; delay > 100 us 6,098
    r = control.launch_stats(launch_names=LAUNCH_NAMES_HTA).to_pylist()[0]
    assert (r["launches"], r["cpu_duration_ns"], r["gpu_duration_ns"], r["launch_delay_ns"]) == (
        9_450, 139_446_000, 501_567_000, 20_056_883_000)
    assert (r["short_kernels"], r["long_launches"], r["long_delays"]) == (3_704, 30, 6_098)
    # every runtime call that submitted work is the default: the same set on this trace
    assert control.launch_stats().to_pylist()[0]["launches"] == 9_450
    # MTIA: HTA counts 73 launches, 2 long launches, 72 long delays; its sums (cpu 413 us,
    # gpu 306,327 us) are lower than the exact ones by its inward rounding (<= 2 us an event)
    m = mtia.launch_stats(launch_names=LAUNCH_NAMES_HTA).to_pylist()[0]
    assert (m["launches"], m["long_launches"], m["long_delays"]) == (73, 2, 72)
    assert 0 <= m["cpu_duration_ns"] - 413_000 <= 2_000 * 73
    assert 0 <= m["gpu_duration_ns"] - 306_327_000 <= 2_000 * 73


def test_queue_length_equals_hta(control):
    # HTA get_queue_length_summary, per stream: (changes, mean, max)
    hta = {"7": (17_928, 36.36780455153949, 288), "20": (564, 2.5815602836879434, 10), "21": (120, 0.75, 2),
           "22": (288, 10.57638888888889, 22)}
    got = {r["identifier"].split()[-1]: r for r in control.queue_length_summary().to_pylist()}
    for s, (n, mean, mx) in hta.items():
        assert (got[s]["changes"], got[s]["max"]) == (n, mx)
        # HTA sorts a launch and a kernel start at the same microsecond in no set order;
        # tilescope counts the launch first, so the row means differ in the 4th digit at most
        assert got[s]["mean"] == pytest.approx(mean, rel=2e-3)
        assert 0 <= got[s]["time_weighted_mean"] <= mx


def test_memory_bandwidth_equals_hta(control):
    # HTA get_memory_bw_summary over its series' non-zero points: (points, mean GB/s, max GB/s)
    hta = {"Memcpy DtoD": (18, 537.1093815824354, 934.0139211136891), "Memcpy DtoH": (60, 0.6608355396666509, 3.7083333333333335),
           "Memcpy HtoD": (150, 5.320889233516836, 11.696847946525894), "Memset": (654, 16.06852610421378, 693.3894736842105)}
    got = {r["copy_type"]: r for r in control.memory_bandwidth_summary().to_pylist()}
    for name, (n, mean, mx) in hta.items():
        assert got[name]["series_max_gbps"] == pytest.approx(mx, rel=1e-9), name
        # HTA drops the points where the series returns to 0 before averaging, and keeps points
        # where two copies start at one time; the series hold the same steps, so the means agree
        # to within the share of such points
        assert got[name]["series_mean_gbps"] == pytest.approx(mean, rel=0.1), name
    assert got["Memcpy HtoD"]["bytes"] == 423_923_260 and got["Memcpy HtoD"]["copies"] == 150


def test_kernel_sequences(tmp_path):
    # HTA 0.5.0's get_frequent_cuda_kernel_sequences fails under pandas >= 3 (np.unique on
    # objects), so the synthetic trace's known answer is the reference: 4 steps, each one
    # aten::linear launching gemm_kernel_0..2 and a copy
    p = write(str(tmp_path / "s.json"), make_trace(VENDORS["cuda"], steps=4, kernels=3))
    rows = tt.open(p).kernel_sequences("aten::linear", min_length=3).to_pylist()
    assert [(r["pattern"], r["count"], r["kernels"]) for r in rows] == [
        ("aten::linear|gemm_kernel_0|gemm_kernel_1|gemm_kernel_2|Memcpy HtoD (Pageable -> Device)", 4, 4)]
    assert rows[0]["device_ns"] == 4 * (3 * KERNEL_US + 10) * 1000
    assert tt.open(p).kernel_sequences("aten::linear", min_length=5).num_rows == 0
    with pytest.raises(ValueError, match="op_name is empty"):
        tt.open(p).kernel_sequences("")


def test_kernel_sequences_on_a_real_trace_equal_hta(control):
    # HTA 0.5.0 get_frequent_cuda_kernel_sequences("aten::linear", min_pattern_len=3) under
    # pandas 2.3 (benchmarks/hta_reference.py --pandas2): one pattern, 12 occurrences,
    # GPU kernel duration 1183 us, CPU op duration 1348 us
    rows = control.kernel_sequences("aten::linear", min_length=3, top=5).to_pylist()
    assert [(r["count"], r["kernels"], r["device_ns"], r["op_ns"]) for r in rows] == [(12, 3, 1_183_000, 1_348_000)]
    assert rows[0]["pattern"].startswith("aten::linear|void at::native::elementwise_kernel<128, 2, "
                                         "at::native::gpu_kernel_impl<at::native::(anonymous namespace)::"
                                         "direct_copy_kernel_cuda(at::TensorIteratorBase&)")
    # the whole 1,283-character pattern equals HTA's (its SHA-256, HTA's string hashed)
    import hashlib

    assert hashlib.sha256(rows[0]["pattern"].encode()).hexdigest()[:16] == "a0b3a7ee61f25805"


def test_critical_path_tiles_the_path_and_follows_launches(tmp_path, control):
    p = write(str(tmp_path / "c.json"), make_trace(VENDORS["cuda"], steps=2, kernels=3))
    path = tt.open(p).critical_path().to_pylist()
    kinds = [r["kind"] for r in path]
    # back from the last copy: the stream's kernels of step 1, their launch, the host before it
    assert kinds == ["host", "host", "launch_delay", "device", "stream_wait", "device", "stream_wait", "device",
                     "stream_wait", "device"]
    assert [r["name"] for r in path if r["kind"] == "device"] == [
        "gemm_kernel_0", "gemm_kernel_1", "gemm_kernel_2", "Memcpy HtoD (Pageable -> Device)"]
    for t in (path, control.critical_path().to_pylist()):
        assert all(a["end_ns"] == b["start_ns"] for a, b in zip(t, t[1:]))  # no gap, no overlap
        assert sum(r["dur_ns"] for r in t) == t[-1]["end_ns"] - t[0]["start_ns"]
    with pytest.raises(ValueError, match="rank 9 is not in this trace"):
        control.critical_path(rank=9)


def _event_wait_trace(path: str, wait_args: dict) -> str:
    # thread 1 launches A on stream 7 and records an event after it; thread 2 tells stream 8 to
    # wait for that event, then launches B early: B starts when A ends, not when it was launched
    def ev(name, cat, tid, ts, dur, corr, **args):
        pid = 0 if cat in ("kernel", "cuda_sync") else 100
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
                "args": {"correlation": corr, **args}}
    events = [ev("cudaLaunchKernel", "cuda_runtime", 1, 0, 5, 1), ev("cudaEventRecord", "cuda_runtime", 1, 6, 1, 2),
              ev("cudaStreamWaitEvent", "cuda_runtime", 2, 1, 1, 3), ev("cudaLaunchKernel", "cuda_runtime", 2, 3, 1, 4),
              ev("kernel_A", "kernel", 7, 10, 90, 1, stream=7, device=0),
              ev("Stream Wait Event", "cuda_sync", 8, 5, 1, 3, stream=8, device=0, **wait_args),
              ev("kernel_B", "kernel", 8, 100, 20, 4, stream=8, device=0)]
    import json

    with open(path, "w") as f:
        json.dump({"traceEvents": events}, f)
    return path


def test_critical_path_crosses_streams_through_cuda_events(tmp_path):
    # HTA links a "Stream Wait Event" to the kernel launched before the cudaEventRecord it names
    t = tt.open(_event_wait_trace(str(tmp_path / "e.json"), {"wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": 2}))
    path = [(r["kind"], r["name"], r["start_ns"], r["end_ns"]) for r in t.critical_path().to_pylist()]
    assert path == [("host", "cudaLaunchKernel", 0, 5_000), ("launch_delay", "", 5_000, 10_000),
                    ("device", "kernel_A", 10_000, 100_000), ("device", "kernel_B", 100_000, 120_000)]
    # without the event's record id the wait names nothing: B waited for its launch, as before
    t = tt.open(_event_wait_trace(str(tmp_path / "n.json"), {"wait_on_stream": 7}))
    kinds = [r["kind"] for r in t.critical_path().to_pylist()]
    assert kinds[-2:] == ["launch_delay", "device"] and "kernel_A" not in [r["name"] for r in t.critical_path().to_pylist()]


def test_critical_path_of_one_step_is_clipped_as_htas(tmp_path):
    p = write(str(tmp_path / "c.json"), make_trace(VENDORS["cuda"], steps=3, kernels=3))
    t = tt.open(p)
    steps = t.sql("SELECT ts_ns, end_ns FROM events WHERE kind = 'step' ORDER BY ts_ns").fetchall()
    for i, (a, b) in enumerate(steps):
        path = t.critical_path(step=i).to_pylist()
        # the step's own work: its kernels and copy, walked back to the step's start at the latest
        assert [r["name"] for r in path if r["kind"] == "device"] == [
            "gemm_kernel_0", "gemm_kernel_1", "gemm_kernel_2", "Memcpy HtoD (Pageable -> Device)"]
        last = t.sql(f"SELECT max(end_ns) FROM events WHERE side = 'device' AND ts_ns BETWEEN {a} AND {b}").fetchall()[0][0]
        assert path[-1]["end_ns"] == last and a <= path[0]["start_ns"]
        assert all(x["end_ns"] == y["start_ns"] for x, y in zip(path, path[1:]))
    # the whole rank ends with the last step's path
    assert t.critical_path().to_pylist()[-1] == t.critical_path(step=2).to_pylist()[-1]
    with pytest.raises(ValueError, match=r"step 3 is not in rank 0: it has 3 ProfilerStep slices"):
        t.critical_path(step=3)


def test_critical_path_per_step_against_hta(control):
    # HTA critical_path_analysis(annotation="ProfilerStep", instance_id=i), us: the path's weight
    # and the span from its first node (the step's first aten::empty) to its last (a Memcpy DtoH)
    hta_weight = [59_158, 59_087, 59_543, 61_292, 59_265, 61_269]
    hta_span = [73_758, 75_177, 74_488, 74_994, 76_694, 79_360]
    steps = control.sql("SELECT ts_ns, end_ns FROM events WHERE kind = 'step' ORDER BY ts_ns").fetchall()
    assert len(steps) == len(hta_weight)
    for i, (a, b) in enumerate(steps):
        path = control.critical_path(step=i).to_pylist()
        first_op = control.sql(f"SELECT min(ts_ns) FROM events WHERE name = 'aten::empty' AND ts_ns >= {a}").fetchall()[0][0]
        dtoh = control.sql(f"""SELECT max(end_ns) FROM events WHERE name LIKE 'Memcpy DtoH%'
                               AND ts_ns BETWEEN {a} AND {b}""").fetchall()[0][0]
        assert dtoh - first_op == hta_span[i] * 1000  # HTA's path ends where tilescope finds the step's last DtoH
        # tilescope's path ends at the step's last device work, at or after HTA's end
        assert path[-1]["end_ns"] >= dtoh
        length = path[-1]["end_ns"] - path[0]["start_ns"]
        if i == 0:  # the walk stops at a second host thread's first event, 32 ms into the step (see the docs)
            assert length < hta_weight[i] * 1000 and path[0]["start_ns"] - a > 30_000_000
        else:  # HTA's weight leaves out the host's gaps between top-level ops; tilescope's wall-time path keeps them
            assert path[0]["start_ns"] == a and length > hta_weight[i] * 1000


def test_diff_says_when_two_traces_are_different_programs(control):
    other = tt.open(os.path.join(KINETO, "cuda_alexnet_small.json.gz"))
    d = tt.diff(control, other, names=["ranking", "alexnet"])
    assert d.fusion == [] and not d.overlap[0]["same_program"]
    assert d.overlap[0]["ops"] < 0.25
    assert any("look like different programs" in w and "no fusion is reported" in w for w in d.warnings)
    same = tt.diff(control, tt.open(os.path.join(KINETO, "cuda_trace_diff_test.json.gz")))
    assert same.overlap[0]["same_program"] and same.warnings == []


def test_kernel_sequences_take_the_launches_within_the_op_on_its_lane(tmp_path):
    # an op's launches: those on its thread that start and end inside it; a launch straddling
    # the op's end and one on another thread at the same time are not its own
    def x(name, cat, tid, ts, dur, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1 if tid < 1000 else 0, "tid": tid, "ts": ts, "dur": dur,
                "args": args}

    events = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}]
    for step, t0 in enumerate((0, 1000)):
        events += [x("aten::mm", "cpu_op", 10, t0, 100),
                   x("cudaLaunchKernel", "cuda_runtime", 10, t0 + 10, 10, correlation=10 * step + 1),
                   x("cudaLaunchKernel", "cuda_runtime", 10, t0 + 20, 10, correlation=10 * step + 2),
                   x("cudaLaunchKernel", "cuda_runtime", 10, t0 + 90, 20, correlation=10 * step + 3),
                   x("cudaLaunchKernel", "cuda_runtime", 11, t0 + 30, 10, correlation=10 * step + 4)]
        events += [x(f"k{i}", "kernel", 1007, t0 + 200 + 10 * i, 5, correlation=10 * step + i, stream=7, device=0)
                   for i in (1, 2, 3, 4)]
    p = write(str(tmp_path / "k.json"), {"schemaVersion": 1, "traceEvents": events})
    rows = tt.open(p).kernel_sequences("aten::mm", min_length=1).to_pylist()
    assert [(r["pattern"], r["count"], r["kernels"], r["device_ns"], r["op_ns"]) for r in rows] == [
        ("aten::mm|k1|k2", 2, 2, 2 * 10_000, 2 * 100_000)]
