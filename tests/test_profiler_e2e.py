"""The profiler end to end: torch.profiler with ProfileConfig and Profiler on naive RMSNorm."""

import json

import pytest
import torch
from torch.profiler import ProfilerActivity

from documented_loop import naive_rmsnorm, run_documented_loop
from tilescope.profiler import ProfileConfig, Profiler, diagnose, profile, read_profile


@pytest.fixture(scope="module")
def sim(sim_virtual):
    """The sim device, virtual clock (tests/conftest.py)."""


def _flows_reach_every_device_event(trace, starts=("cpu_op", "user_annotation")):
    events = trace["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e.get("name") == "process_name"}
    fw_pids = {pid for pid, n in names if n.endswith("/framework")}
    slices = [e for e in events if e.get("ph") == "X"]
    flows = {}
    for e in events:
        if e.get("cat") == "tilescope.flow":
            flows.setdefault(e["id"], {})[e["ph"]] = e

    def inside(point, cats):
        return any(s["pid"] == point["pid"] and s["tid"] == point["tid"] and s.get("cat") in cats
                   and s["ts"] - 1e-3 <= point["ts"] <= s["ts"] + s["dur"] + 1e-3 for s in slices)

    device = [e for e in slices if e.get("cat") in ("runtime", "hardware", "memcpy")]
    assert device
    for e in device:
        hops = flows[e["args"]["flow_id"]]
        assert set(hops) == {"s", "t", "f"}
        assert hops["s"]["pid"] in fw_pids and inside(hops["s"], starts)
        assert inside(hops["t"], ("runtime",))
        assert inside(hops["f"], ("hardware", "memcpy"))


def test_documented_loop_on_naive_rmsnorm(sim, device_recorder, tmp_path):
    x = torch.randn(512, 1024, device="sim")
    w = torch.randn(1024, device="sim")
    prof, path = run_documented_loop(tmp_path, x, w)

    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=20)
    assert "Self SIM" in table and "SIM total" in table and "SIM time avg" in table
    assert "Self SIM time total" in table
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["aten::mul"].count == 3 and rows["aten::mul"].self_device_time_total > 0
    for op in ("aten::mean", "aten::add", "aten::rsqrt"):
        assert rows[op].count == 1 and rows[op].self_device_time_total > 0
    # the sort alias users know from the real toolchain works too
    prof.key_averages().table(sort_by="self_privateuse1_time_total")

    p = read_profile(path).require_complete()  # verifies every checksum
    assert p.device["kind"] == "sim" and p.device["clock"] == "virtual"
    assert (path / "trace.json").exists() and (path / "system_trace.json").exists()
    exes = p.executables()
    assert len(exes) >= 4
    for h, run, trace_path in p.itraces():
        assert h in exes
        assert p.load_itrace(trace_path)["program_hash"] == h
    trace = json.loads((path / "system_trace.json").read_text())
    assert p.manifest["stats"]["events"] == len(trace["traceEvents"])
    gaps = p.manifest["stats"]["launch_interval_us"]  # host time between the step's launches
    assert gaps["samples"]["profiled"] == 5 and gaps["profiled"] > 0
    hardware = [e for e in trace["traceEvents"] if e.get("cat") == "hardware"]
    assert len(hardware) == 6 and all(e["args"]["modeled"] for e in hardware)
    assert {e["args"]["program_hash"] for e in hardware} <= set(exes)
    _flows_reach_every_device_event(trace)
    # torch's own trace.json carries the device executions too, on its clock
    framework = json.loads((path / "trace.json").read_text())
    if device_recorder == "torch":  # recorded by torch itself, each linked to its op
        kernels = [e for e in framework["traceEvents"] if e.get("cat") == "kernel"]
        assert len(kernels) == 6 and all(e["name"].startswith("exec_running aten::") for e in kernels)
        ops = {e["args"]["External id"]: e for e in framework["traceEvents"] if e.get("cat") == "cpu_op"}
        launching = [ops[k["args"]["External id"]] for k in kernels]
        assert sorted(op["name"] for op in launching) == sorted(
            ["aten::mul"] * 3 + ["aten::mean", "aten::add", "aten::rsqrt"])
        assert all(op["ts"] <= k["ts"] for op, k in zip(launching, kernels))
        assert not any(e.get("cat") == "hardware" for e in framework["traceEvents"])  # not twice
    else:  # added by the export, with the runtime lane and the flows
        hw = [e for e in framework["traceEvents"] if e.get("cat") == "hardware"]
        assert len(hw) == 6
        ops = [e for e in framework["traceEvents"] if e.get("ph") == "X" and e.get("name") == "aten::mean"]
        assert ops and any(ops[0]["ts"] <= f["ts"] <= ops[0]["ts"] + ops[0]["dur"] for f in framework["traceEvents"]
                           if f.get("cat") == "tilescope.flow" and f.get("ph") == "s")
    assert not any(e.get("name", "").startswith("tilescope::exec#") for e in framework["traceEvents"]
                   if device_recorder == "torch")
    # no mistake found; "profiler-distortion" compares wall-clock gaps between launches, which a
    # loaded machine stretches while profiling (its rule has its own test in test_doctor.py)
    assert [f for f in diagnose(path) if f.code != "profiler-distortion"] == []


def test_short_profile_context_and_cpu_model(sim, tmp_path):
    x = torch.randn(256, 512, device="sim")
    w = torch.randn(512, device="sim")
    with profile(tmp_path / "sim") as prof:
        naive_rmsnorm(x, w)
    assert read_profile(prof.profile_dir).require_complete().device["kind"] == "sim"

    xc, wc = torch.randn(256, 512), torch.randn(512)
    with profile(tmp_path / "cpu", device="cpu") as prof:
        naive_rmsnorm(xc, wc)
    p = read_profile(prof.profile_dir).require_complete()
    assert p.device["kind"] == "cpu" and p.executables() == {}
    trace = json.loads((prof.profile_dir / "system_trace.json").read_text())
    assert any(e.get("name") == "aten::mul" for e in trace["traceEvents"])


def test_loop_without_synchronize_and_first_iteration_are_diagnosed(sim, tmp_path, capsys):
    x = torch.randn(384, 1024, device="sim")  # a new shape: its Programs are built in the profile
    w = torch.randn(1024, device="sim")
    cfg = ProfileConfig(output_dir=str(tmp_path))
    exporter = Profiler(cfg)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                schedule=torch.profiler.schedule(wait=0, warmup=0, active=1),
                                experimental_config=cfg, on_trace_ready=exporter.export_trace) as prof:
        naive_rmsnorm(x, w)  # no torch.sim.synchronize() before the step ends
        prof.step()
    first = exporter.paths[0]  # the active step's profile (stopping the profiler exports an empty one)
    codes = {f.code for f in diagnose(first)}
    assert {"no-synchronize", "cold-start"} <= codes
    told = capsys.readouterr().err  # the doctor at export, on what the exporter had in memory
    assert "[warning] no-synchronize:" in told and "[warning] cold-start:" in told
    trace = json.loads((first / "system_trace.json").read_text())
    xs = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    (step,) = [e for e in xs if e["name"].startswith("ProfilerStep")]
    syncs = [e for e in xs if e["name"] == "tilescope::synchronize"]
    # the only synchronize is torch's own, when the trace stops: after the step
    assert all(e["ts"] >= step["ts"] + step["dur"] for e in syncs)


def _training_step_profile(tmp_path, parse_first: bool, recorder: str = "markers"):
    """One training step profiled; the device time correlated with torch's events parsed by
    torch first or not, the executions recorded by torch itself (``recorder="torch"``) or
    marked (markers among the parsed events, or taken out before the parse)."""
    from conftest import device_profiler
    from tilescope.profiler._capture import capture
    from tilescope.profiler._correlate import correlate

    exporter = Profiler(ProfileConfig(output_dir=tmp_path))  # listens to the device while open  # noqa: F841
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to("sim")
    x = torch.randn(32, 64, device="sim")

    def step():
        with torch.profiler.record_function("step"):
            model(x).square().mean().backward()  # backward ops launch from autograd's own thread
        torch.sim.synchronize()

    step()  # build every Program first
    with device_profiler(recorder == "torch"):
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            step()
        if parse_first:
            marked = any(e.name.startswith("tilescope::exec#") for e in prof.profiler.function_events)
            assert marked == (recorder == "markers")
        matched, pending = correlate(prof, capture, float("inf"), into_tables=True)
    launches = [(m.rec.op, m.parent.name if m.parent is not None else None, m.parent is not None and
                 m.parent.time_range.start <= m.launch_us <= m.parent.time_range.end) for m in matched]
    table = {e.key: (e.count, e.self_device_time_total, e.device_time_total) for e in prof.key_averages()}
    return launches, table, prof


def _same_table(a: dict, b: dict, executions: int = 1) -> bool:
    """The same rows and counts, device times equal to the nanosecond per device activity
    (torch keeps each activity's times in whole nanoseconds, so a row summing several
    executions -- a record_function around the step -- may differ by one ns for each)."""
    return a.keys() == b.keys() and all(
        a[k][0] == b[k][0] and abs(a[k][1] - b[k][1]) <= 1e-3 * max(a[k][0], executions)
        and abs(a[k][2] - b[k][2]) <= 1e-3 * max(a[k][0], executions)
        for k in a)


def test_markers_taken_out_before_torch_parses_give_the_same_attribution(sim, tmp_path):
    fast, fast_table, prof = _training_step_profile(tmp_path / "a", parse_first=False)
    slow, slow_table, _ = _training_step_profile(tmp_path / "b", parse_first=True)
    assert len(fast) > 10 and all(parent is not None and inside for _, parent, inside in fast)
    assert fast == slow  # the same launching op for every execution, in launch order
    assert _same_table(fast_table, slow_table, executions=len(fast))
    assert not any(e.name.startswith("tilescope::exec#") for e in prof.profiler.function_events)
    assert {p for _, p, _ in fast} >= {"aten::addmm", "aten::mm"}  # forward and backward threads


@pytest.mark.parametrize("parse_first", [False, True])
def test_device_activities_recorded_by_torch_give_the_markers_attribution(sim, tmp_path, parse_first):
    """torch links each execution to the op it was launched in (the device's Kineto profiler):
    the same op, and the same key_averages rows, as the markers give."""
    recorded, recorded_table, prof = _training_step_profile(tmp_path / "a", parse_first, recorder="torch")
    marked, marked_table, _ = _training_step_profile(tmp_path / "b", parse_first=False)
    assert [(op, parent) for op, parent, _ in recorded] == [(op, parent) for op, parent, _ in marked]
    assert len(recorded) > 10 and all(parent is not None for _, parent, _ in recorded)
    assert _same_table(recorded_table, marked_table, executions=len(recorded))
    devices = [e for e in prof.profiler.function_events if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert len(devices) == len(recorded)


def test_device_events_are_what_torch_constructor_makes():
    """Device events are copied from a first one built by torch's constructor: each must equal
    a constructed one, attribute for attribute, and share no mutable container with another."""
    from torch.autograd.profiler_util import DeviceType, FunctionEvent

    from tilescope.profiler._correlate import _DeviceEventFactory

    make = _DeviceEventFactory("privateuse1")
    made = [make(10 + i, f"exec_running op{i}", 7 + i, 1.5 * i, 2.5 * i + 1, i % 3) for i in range(4)]
    for i, evt in enumerate(made):
        name = f"exec_running op{i}"
        want = FunctionEvent(id=10 + i, name=name, thread=7 + i, start_us=1.5 * i, end_us=2.5 * i + 1,
                             device_type=DeviceType.PrivateUse1, device_index=i % 3, use_device="privateuse1",
                             is_legacy=False, stack=[], input_shapes=[], trace_name=name)
        got, exp = vars(evt), vars(want)
        assert got.keys() == exp.keys()
        for k in exp:
            if k == "time_range":
                assert (got[k].start, got[k].end) == (exp[k].start, exp[k].end)
            else:
                assert got[k] == exp[k], k
    made[1].kernels.append("k")
    made[2].cpu_children.append(made[3])
    assert made[3].kernels == [] and made[0].cpu_children == [] and made[3].stack is not made[0].stack


def test_the_documented_loop_exports_executables_prepared_in_its_first_steps(sim, tmp_path, monkeypatch):
    """Programs first run in the schedule's wait steps (a new shape: built there) have their
    executables and instruction traces' text made then; the export of the active step only
    writes them."""
    from tilescope.profiler import _itrace
    from tilescope.program import _program

    serialised, traced = [], []
    real, real_doc = _program.executable_text, _itrace._itrace_doc
    monkeypatch.setattr(_program, "executable_text", lambda p: serialised.append(p.hash) or real(p))
    monkeypatch.setattr(_itrace, "_itrace_doc", lambda p, *a: traced.append(p.hash) or real_doc(p, *a))
    before_step = []

    def model(x, w):
        before_step.append((len(serialised), len(traced)))
        return naive_rmsnorm(x, w)

    _, path = run_documented_loop(tmp_path, torch.randn(320, 1024, device="sim"), torch.randn(1024, device="sim"),
                                  model)
    prepared, prepared_traces = before_step[3]  # by the active step: the wait and warm-up steps ran every Program
    profile = read_profile(path).require_complete()
    exes = profile.executables()
    assert len(exes) >= 4 and set(exes) <= set(serialised[:prepared])
    assert len(serialised) == prepared  # nothing serialised since (the input copies ran before)
    itraces = {h for h, _, _ in profile.itraces()}
    assert len(itraces) >= 4 and itraces <= set(traced[:prepared_traces])
    assert len(traced) == prepared_traces


def test_a_program_that_cannot_be_serialised_does_not_fail_its_first_run():
    """Preparing the executable happens inside the user's op: an error there is left for the
    export to report, never raised into the model."""
    import threading

    from tilescope.device._runtime import Execution
    from tilescope.profiler._capture import capture
    from tilescope.program import TileBuilder

    b = TileBuilder("odd")
    x, y = b.input("x", (128, 8), "float32"), b.output("y", (128, 8), "float32")
    b.dma_copy(y, x)
    prog = b.build(meta={"not json": object()})
    with pytest.raises(TypeError):
        prog.dumps()
    rec = Execution(1, "aten::odd", "kernel", "generic", prog, prog.hash, 0, 0, threading.get_ident(),
                    0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0, None, "virtual", True)
    capture.on_execution(rec)  # the profiler is not recording: the first-run path


def test_the_record_buffer_keeps_the_latest_launches_and_counts_the_drops(monkeypatch):
    import threading

    from tilescope.device._runtime import Execution
    from tilescope.profiler import _capture

    monkeypatch.setattr(_capture, "_KEEP", 3)
    monkeypatch.setattr(torch.autograd.profiler, "_is_profiler_enabled", True)
    cap = _capture.Capture()
    recs = [Execution(f, "aten::mul", "kernel", "elementwise", None, "", 0, 0, threading.get_ident(),
                      0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0, None, "virtual", False) for f in range(1, 6)]
    for rec in recs:
        cap.on_execution(rec)
    assert cap.dropped == 2 and cap.get(1) is None and cap.get(2) is None
    assert [cap.get(f)[0] for f in (3, 4, 5)] == recs[2:]
    assert cap.get(5)[1] == threading.get_native_id()


def test_executions_torch_records_reach_the_capture_through_the_device_profiler(sim):
    """While torch records device activities, the device's profiler keeps the runtime's record of
    each execution instead of the capture's listener being called (a listener subscribed with
    recorded=False is skipped the same way, the others are called); the export hands the records
    over with the session's launches. It keeps the first ``limit`` per session and counts the
    rest as drops; the launches themselves all stay (torch's tables have them)."""
    import threading

    from tilescope.device import _runtime
    from tilescope.profiler._capture import capture

    exporter = Profiler(ProfileConfig(output_dir="unused"))  # installs the capture while open  # noqa: F841
    x, w = torch.randn(256, 1024, device="sim"), torch.randn(1024, device="sim")
    every, unrecorded = [], []
    _runtime.subscribe(every.append)
    _runtime.subscribe(unrecorded.append, recorded=False)
    try:
        naive_rmsnorm(x, w)
        torch.sim.synchronize()
        assert len(every) == len(unrecorded) == 6  # unprofiled: every listener
        every.clear(), unrecorded.clear()
        kept = _runtime.keep_recorded(4)
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            naive_rmsnorm(x, w)
            torch.sim.synchronize()
    finally:
        _runtime.keep_recorded(kept)
        _runtime.unsubscribe(every.append), _runtime.unsubscribe(unrecorded.append)
    assert len(every) == 6 and all(r.recorded_by_torch for r in every) and unrecorded == []
    assert capture.get(every[0].flow_id) is None  # kept by the device's profiler until taken
    taken = _runtime.take_device_activities(prof.profiler.kineto_results.trace_start_ns())
    assert [launch[0] for launch in taken.launches] == [r.flow_id for r in every]
    # (flow, 0, launch µs from the trace start, None), as the correlation matches launches: one
    # thread launched them one after the other
    times = [us for _, _, us, _ in taken.launches]
    assert all(t == 0 and p is None for _, t, _, p in taken.launches) and 0 <= times[0] and times == sorted(times)
    assert taken.ranges.keys() == {r.flow_id for r in every} and taken.range_ids == {
        rid for ids in taken.ranges.values() for rid in ids if rid > 0} != set()
    assert taken.records == {r.flow_id: (r, threading.get_native_id()) for r in every[:4]}
    assert all(type(rec) is _runtime.Execution for rec, _ in taken.records.values()) and taken.dropped == 2
    assert _runtime.take_device_activities(prof.profiler.kineto_results.trace_start_ns()).launches == []  # once


def _recorded_profile():
    """Naive RMSNorm (6 executions) in a plain torch.profiler session with device activities,
    after a tilescope Profiler exists (its capture keeps the execution records)."""
    from tilescope.profiler._capture import capture

    exporter = Profiler(ProfileConfig(output_dir="unused"))  # open through the session; its export is not used  # noqa: F841
    x, w = torch.randn(256, 1024, device="sim"), torch.randn(1024, device="sim")
    naive_rmsnorm(x, w)
    torch.sim.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        naive_rmsnorm(x, w)
        torch.sim.synchronize()
    return prof, capture


def test_a_plain_torch_profiler_session_gets_device_time_from_torch_itself(sim):
    """No tilescope config and no exporter, after a tilescope Profiler exists in the process:
    torch's own tables and Chrome trace have the device executions, and no marker rows."""
    prof, _ = _recorded_profile()
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["aten::mul"].count == 3 and rows["aten::mul"].self_device_time_total > 0
    assert rows["exec_running aten::mul.Tensor"].count == 3
    assert not any(k.startswith("tilescope::exec#") for k in rows)
    assert "Self SIM time total" in prof.key_averages().table(row_limit=3)


@pytest.mark.parametrize("now_ns, into_tables", [(0.0, True), (float("inf"), False)])
def test_device_time_torch_recorded_is_taken_out_where_it_must_not_be(sim, now_ns, into_tables):
    """Executions still running at export (every one, with the clock at 0), or every one with
    correlate_device_time=False: out of torch's tables, though torch recorded them."""
    from tilescope.profiler._correlate import correlate

    prof, capture = _recorded_profile()
    assert capture.markers == 0 and sum(
        e.device_type() == torch.autograd.DeviceType.PrivateUse1 for e in prof.profiler.kineto_results.events()) == 6
    matched, pending = correlate(prof, capture, now_ns, into_tables=into_tables)
    assert (len(matched), pending) == ((0, 6) if now_ns == 0.0 else (6, 0))
    assert all(m.recorded_by_torch and m.parent is not None for m in matched)
    ka = prof.key_averages()
    assert sum(e.self_device_time_total for e in ka) == 0 and sum(e.device_time_total for e in ka) == 0
    assert not any(e.key.startswith("exec_running") for e in ka)


def test_a_cpu_only_session_marks_each_launch_and_still_gets_device_time(sim, tmp_path):
    """Without ProfilerActivity.PrivateUse1 torch records no device activity: tilescope's
    profiler marks each launch, and the profile has every execution; torch's table has no
    device columns then, and the doctor says why."""
    cfg = ProfileConfig(output_dir=str(tmp_path))
    exporter = Profiler(cfg)
    x, w = torch.randn(256, 1024, device="sim"), torch.randn(1024, device="sim")
    naive_rmsnorm(x, w)
    torch.sim.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU], experimental_config=cfg,
                                on_trace_ready=exporter.export_trace) as prof:
        naive_rmsnorm(x, w)
        torch.sim.synchronize()
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["aten::mul"].count == 3 and not any(k.startswith("tilescope::exec#") for k in rows)
    p = read_profile(exporter.path).require_complete()
    assert p.manifest["stats"]["executions"] == 6
    framework = json.loads((exporter.path / "trace.json").read_text())
    assert len([e for e in framework["traceEvents"] if e.get("cat") == "hardware"]) == 6  # added by the export
    (finding,) = [f for f in diagnose(exporter.path) if f.code == "device-time-not-correlated"]
    assert "ProfilerActivity.PrivateUse1" in finding.message


@pytest.mark.parametrize("merged_found_by", ["enclosing ranges", "raw events"])
def test_each_cycle_of_a_repeating_schedule_gets_its_own_executions(sim, tmp_path, monkeypatch, merged_found_by):
    """Two cycles, each exported when it ends (acc_events or not): each profile has its own six
    executions, each linked to its op -- also the mean whose inner call torch merged, found
    through the ranges the device saw around the launch or, where it knows none, through
    torch's raw events."""
    from tilescope.profiler import _correlate
    from tilescope.profiler._capture import capture
    from tilescope.profiler._correlate import correlate

    if merged_found_by == "raw events":
        take = _correlate.take_device_activities
        monkeypatch.setattr(_correlate, "take_device_activities", lambda t0: (t := take(t0))._replace(
            ranges={f: ids[:1] for f, ids in t.ranges.items()},  # the enclosing ranges unknown
            range_ids={ids[0] for ids in t.ranges.values() if ids[0] > 0}))
    else:
        def fail(*args):
            raise AssertionError("the raw-event scan ran although the enclosing ranges were known")
        monkeypatch.setattr(_correlate, "_merged_ranges", fail)

    x, w = torch.randn(128, 1024, device="sim"), torch.randn(1024, device="sim")

    def model():
        (x * torch.rsqrt((x * x).mean() + 1e-6) * w).sum()  # mean() calls mean.dim: merged by torch

    model()
    torch.sim.synchronize()
    for acc_events in (False, True):
        found = []
        exporter = Profiler(ProfileConfig(output_dir=str(tmp_path)))  # the capture keeps the records  # noqa: F841
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                    schedule=torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=2),
                                    acc_events=acc_events,
                                    on_trace_ready=lambda p: found.append(correlate(p, capture, float("inf"),
                                                                                    into_tables=True))) as prof:
            for _ in range(4):
                model()
                torch.sim.synchronize()
                prof.step()
        assert len(found) == 2
        for matched, pending in found:
            assert pending == 0 and len(matched) == 7 and all(m.recorded_by_torch for m in matched)
            assert [m.parent.name for m in matched] == [
                "aten::mul", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul", "aten::mul", "aten::sum"]
        flows = [{m.rec.flow_id for m in matched} for matched, _ in found]
        assert not flows[0] & flows[1]


def test_a_trace_exported_after_a_later_session_gets_its_own_executions(sim):
    """The device keeps each finished session's record until its trace is exported."""
    from tilescope.profiler._capture import capture
    from tilescope.profiler._correlate import correlate

    exporter = Profiler(ProfileConfig(output_dir="unused"))  # noqa: F841  (open: the capture listens)
    x = torch.randn(64, 64, device="sim")
    profs = []
    for op in (torch.add, torch.mul):
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            op(x, x)
            torch.sim.synchronize()
        profs.append(prof)
    later, _ = correlate(profs[1], capture, float("inf"), into_tables=True)
    earlier, _ = correlate(profs[0], capture, float("inf"), into_tables=True)
    assert [(m.rec.op, m.parent.name) for m in earlier] == [("aten::add.Tensor", "aten::add")]
    assert [(m.rec.op, m.parent.name) for m in later] == [("aten::mul.Tensor", "aten::mul")]


def test_executions_running_at_export_are_left_out_of_torch_trace_too(sim, tmp_path, monkeypatch):
    """Still running when the trace is exported (the runtime's clock before their end): out of
    torch's tables, the profile's traces and torch's own trace.json, as a device's unfinished
    kernels are."""
    from tilescope.profiler import _export

    monkeypatch.setattr(_export, "_runtime_now", lambda: 0.0)
    cfg = ProfileConfig(output_dir=str(tmp_path))
    exporter = Profiler(cfg)
    x, w = torch.randn(256, 1024, device="sim"), torch.randn(1024, device="sim")
    naive_rmsnorm(x, w)
    torch.sim.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                experimental_config=cfg, on_trace_ready=exporter.export_trace) as prof:
        naive_rmsnorm(x, w)
        torch.sim.synchronize()
    assert sum(e.self_device_time_total for e in prof.key_averages()) == 0
    p = read_profile(exporter.path).require_complete()
    assert p.manifest["stats"]["pending_executions"] == 6 and p.manifest["stats"]["executions"] == 0
    framework = json.loads((exporter.path / "trace.json").read_text())
    assert not [e for e in framework["traceEvents"] if e.get("cat") == "kernel"]
    assert any(e.get("name") == "aten::mul" for e in framework["traceEvents"])


def test_a_compiled_program_is_linked_to_its_fused_range(sim):
    """torch.compile's fused Program launches inside its own ``tilescope::fused[...]`` range:
    torch links the execution there (Self SIM on that row)."""
    x, w = torch.randn(256, 1024, device="sim"), torch.randn(1024, device="sim")
    fused = torch.compile(naive_rmsnorm, backend="tilescope")
    fused(x, w)
    torch.sim.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        fused(x, w)
        torch.sim.synchronize()
    rows = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    assert {e.key.startswith("tilescope::fused[") for e in rows} == {True, False}  # the range and its execution
    assert all(e.count == 1 for e in rows)


def test_a_missing_launching_range_is_not_taken_for_the_range_around_it(sim, monkeypatch):
    """Only a range torch merged into its same-named parent is replaced by that parent (which
    then holds the execution's kernel); a launching range torch's events lack for another reason
    leaves the execution without a launching op, not attributed to the range around it."""
    from tilescope.profiler import _correlate
    from tilescope.profiler._capture import capture
    from tilescope.profiler._correlate import correlate

    exporter = Profiler(ProfileConfig(output_dir="unused"))  # noqa: F841  (open: the capture listens)
    x = torch.randn(64, 64, device="sim")

    def profile():
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            with torch.profiler.record_function("outer"):
                x * x
            torch.sim.synchronize()
        return correlate(prof, capture, float("inf"), into_tables=True)[0]

    assert [m.parent.name for m in profile()] == ["aten::mul"]
    take = _correlate.take_device_activities
    unknown = 10 ** 15  # a range id torch's events do not have; "outer" still encloses the launch
    monkeypatch.setattr(_correlate, "take_device_activities", lambda t0: (a := take(t0))._replace(
        ranges={f: (unknown, *ids[1:]) for f, ids in a.ranges.items()}, range_ids={unknown} | a.range_ids))
    (m,) = profile()
    assert m.parent is None


def _profile_with_a_second_thread(tmp_path, **config):
    """Naive RMSNorm run once by a second thread, then once by the profiling thread, in one
    profiled window exported by tilescope: (torch's profile, the profile directory, its system
    trace, the second thread's system id)."""
    import threading

    cfg = ProfileConfig(output_dir=str(tmp_path), **config)
    exporter = Profiler(cfg)
    x, w = torch.randn(256, 1024, device="sim"), torch.randn(1024, device="sim")
    naive_rmsnorm(x, w)
    torch.sim.synchronize()
    other_id = []

    def other():
        other_id.append(threading.get_native_id())
        naive_rmsnorm(x, w)

    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                experimental_config=cfg, on_trace_ready=exporter.export_trace) as prof:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        naive_rmsnorm(x, w)
        torch.sim.synchronize()
    assert read_profile(exporter.path).require_complete().manifest["stats"]["executions"] == 12
    return prof, exporter.path, json.loads((exporter.path / "system_trace.json").read_text()), other_id[0]


def test_executions_launched_from_a_thread_torch_does_not_profile_get_their_own_lane(sim, tmp_path):
    """torch records the ops of the thread that started its profiler only (profile_all_threads
    is off by default) and the device every execution, as CUPTI does kernels: work a second
    thread launches is in the profile with no launching op -- its flows start on a lane of that
    thread (named by its system id), at a zero-length launch slice, not at whatever op the
    profiling thread ran meanwhile."""
    _, path, trace, other_id = _profile_with_a_second_thread(tmp_path)
    events = trace["traceEvents"]
    _flows_reach_every_device_event(trace, starts=("cpu_op", "user_annotation", "launch"))
    (lane,) = [e["tid"] for e in events if e.get("name") == "thread_name" and e["pid"] == 1
               and e["args"]["name"] == f"thread {other_id} (no recorded ops)"]
    launches = [e for e in events if e.get("cat") == "launch"]
    assert len(launches) == 6 and {e["tid"] for e in launches} == {lane}
    assert [e["name"] for e in launches][:2] == ["launch aten::mul.Tensor", "launch aten::mean.dim"]
    starts = [e for e in events if e.get("cat") == "tilescope.flow" and e["ph"] == "s"]
    assert sorted(e["tid"] for e in starts) == sorted([0] * 6 + [lane] * 6)
    assert not any(e.get("cat") == "cpu_op" and e["tid"] == lane for e in events)
    (finding,) = [f for f in diagnose(path) if f.code == "launches-without-op"]
    assert "6 device execution(s) launched from 1 thread(s)" in finding.message


def test_profile_all_threads_links_another_threads_launches_to_its_ops(sim, tmp_path):
    """ProfileConfig(profile_all_threads=True) passes torch's option on: the second thread's ops
    are recorded, and its executions are linked to them on its own lane (no launch slices)."""
    prof, path, trace, _ = _profile_with_a_second_thread(tmp_path, profile_all_threads=True)
    assert {e.key: e.count for e in prof.key_averages()}["aten::mul"] == 6
    assert read_profile(path).manifest["config"]["profile_all_threads"] is True
    _flows_reach_every_device_event(trace)
    events = trace["traceEvents"]
    starts = [e for e in events if e.get("cat") == "tilescope.flow" and e["ph"] == "s"]
    assert len({e["tid"] for e in starts}) == 2 and not any(e.get("cat") == "launch" for e in events)
    assert not [f for f in diagnose(path) if f.code == "launches-without-op"]


def test_a_tile_kernel_launched_outside_any_op_is_its_own_launching_op(sim, tmp_path):
    """A tile kernel called on device tensors runs inside no aten op: its launch is a range of
    its own name, so the execution has a launching op on the profiling thread's framework lane
    (not a lane of "a thread torch does not profile") and its device time is on that row."""
    import tilescope
    import tilescope.lang as nl

    @tilescope.kernel
    def twice(x, o):
        nl.store(o, nl.load(x) * 2)

    x = torch.randn(128, 64, device="sim")
    o = torch.empty_like(x)
    twice(x, o)  # built before the profile
    with profile(tmp_path) as prof:
        twice(x, o)
        torch.sim.synchronize()
    (row,) = [e for e in prof.key_averages() if e.key == "kernel::twice"]
    assert row.count == 1 and row.self_device_time_total > 0
    stats = read_profile(prof.profile_dir).require_complete().manifest["stats"]
    assert stats["executions"] == 1 and stats["executions_without_op"] == 0
    assert "launches-without-op" not in {f.code for f in diagnose(prof.profile_dir)}
    trace = json.loads((prof.profile_dir / "system_trace.json").read_text())
    _flows_reach_every_device_event(trace)
    assert torch.equal(o.cpu(), x.cpu() * 2)


def test_the_synchronize_rows_count_the_users_calls(sim, tmp_path):
    """torch's profiler synchronises the device as it stops, and ``profile()`` as its block
    ends: neither is counted as a ``tilescope::synchronize`` call of the user's code (the
    block's own wait keeps a range of its own name, which the doctor does not take for one)."""
    x = torch.randn(8, device="sim")

    def syncs(calls=0, **kwargs):
        with profile(tmp_path, **kwargs) as prof:
            x * 2
            for _ in range(calls):
                torch.sim.synchronize()
        return {e.key: e.count for e in prof.key_averages() if "synchronize" in e.key}

    assert syncs(synchronize=False) == {}
    assert syncs(synchronize=False, calls=2) == {"tilescope::synchronize": 2}
    assert syncs(calls=1) == {"tilescope::synchronize": 1, "tilescope::synchronize (profile exit)": 1}
