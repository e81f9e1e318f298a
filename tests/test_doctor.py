"""The doctor: one test per finding, on deliberately broken profiles."""


from tilescope.profiler import ProfileWriter, write_kernel_profile
from tilescope.profiler._doctor import diagnose
from tilescope.program import TileBuilder
from tilescope.sim import simulate


def _sim_profile(tmp_path, events=(), stats=None, config=None, program=None):
    with ProfileWriter(tmp_path, device={"kind": "sim", "preset": "trn1"},
                       config=config or {"modes": ["DEVICE", "RUNTIME"], "correlate_device_time": True}) as w:
        w.write_json("system_trace.json", {"traceEvents": list(events)})
        if program is not None:
            w.add_itrace(program, simulate(program), 0)
        w.stats = stats or {}
    return w.path


def _codes(path):
    return [f.code for f in diagnose(path)]


def _hw(h=None, dur=10.0):
    return {"ph": "X", "cat": "hardware", "name": "exec_running aten::mul", "pid": 1, "tid": 1, "ts": 0,
            "dur": dur, "args": {"program_hash": h} if h else {}}


def test_no_device_activity(tmp_path):
    (f,) = diagnose(_sim_profile(tmp_path))
    assert f.code == "no-device-activity"
    assert "no device executions" in f.message and "ProfilerActivity.PrivateUse1" in f.fix


def test_device_time_not_correlated(tmp_path):
    path = _sim_profile(tmp_path, [_hw()], {"executions": 1},
                        {"modes": ["RUNTIME"], "correlate_device_time": False})
    (f,) = diagnose(path)
    assert f.code == "device-time-not-correlated" and "Self SIM" in f.message


def test_no_synchronize(tmp_path):
    path = _sim_profile(tmp_path, [_hw()], {"executions": 3, "pending_executions": 2})
    (f,) = diagnose(path)
    assert f.code == "no-synchronize" and "2 device execution(s)" in f.message
    assert "torch.sim.synchronize()" in f.fix


def test_dropped_events(tmp_path):
    path = _sim_profile(tmp_path, [_hw()], {"executions": 1, "dropped_events": {"0": 120, "1": 0}},
                        {"modes": ["DEVICE"], "max_events_per_core": 1000})
    (f,) = diagnose(path)
    assert f.code == "dropped-events" and "120 instruction events" in f.message and "core 0: 120" in f.message


def test_launches_without_op(tmp_path):
    path = _sim_profile(tmp_path, [_hw()], {"executions": 7, "executions_without_op": 6, "threads_without_ops": 1})
    (f,) = diagnose(path)
    assert f.code == "launches-without-op" and "6 device execution(s) launched from 1 thread(s)" in f.message
    assert "ProfileConfig(profile_all_threads=True)" in f.fix


def test_unpaired_executable(tmp_path):
    path = _sim_profile(tmp_path, [_hw("feedfacefeedface")], {"executions": 1})
    (f,) = diagnose(path)
    assert f.code == "unpaired-trace" and "feedfacefeedface" in f.message


def test_incomplete_profile_hides_other_rules(tmp_path):
    path = _sim_profile(tmp_path, [_hw()], {"executions": 1})
    (path / "manifest.json").unlink()
    (f,) = diagnose(path)
    assert f.code == "incomplete-profile" and "manifest.json is missing" in f.message


def test_the_folder_profiles_are_written_under_is_named_not_taken_for_an_incomplete_profile(tmp_path, capsys):
    """``tilescope doctor profile_out`` (the output_dir, or one process's folder in it): the
    command names the newest profile to pass, where an incomplete profile's "profile again"
    would send the user the wrong way; ``explore`` / ``report`` say the same."""
    import pytest

    from tilescope.cli import main
    import tilescope.trace as tt

    older = _sim_profile(tmp_path, [_hw()], {"executions": 1})
    newest = _sim_profile(tmp_path, [_hw()], {"executions": 1})
    unfinished = newest.parent / (newest.name + "9.partial")  # later, but still being written: never suggested
    unfinished.mkdir()
    (unfinished / "manifest.json").write_text((newest / "manifest.json").read_text())
    for folder in (tmp_path, newest.parent):
        assert main(["doctor", str(folder)]) == 2
        err = capsys.readouterr().err
        assert f"{folder} is not a profile directory but a folder profiles are written under" in err
        assert f"the newest is {newest}" in err and str(older) not in err and ".partial" in err
        assert str(unfinished) not in err
        with pytest.raises(tt.TraceFormatError, match="pass one of them -- the newest is"):
            tt.open(str(folder))
    assert main(["doctor", str(tmp_path / "nowhere")]) == 2
    assert "no profile directory at" in capsys.readouterr().err


def test_host_copies(tmp_path):
    copy = {"ph": "X", "cat": "memcpy", "name": "memcpy HtoD", "pid": 1, "tid": 1, "ts": 0, "dur": 50.0}
    path = _sim_profile(tmp_path, [_hw(dur=10.0), copy], {"executions": 1})
    (f,) = diagnose(path)
    assert f.code == "host-copies" and "83%" in f.message


def test_small_dma(tmp_path):
    b = TileBuilder("gather_columns")
    x = b.input("x", (128, 64), "float32")
    for k in range(16):
        t = b.sbuf((128, 1), "float32", site="col")
        b.dma_copy(t, x[:, k:k + 1])
    prog = b.build()
    path = _sim_profile(tmp_path, [_hw(prog.hash)], {"executions": 1}, program=prog)
    codes = _codes(path)
    assert codes == ["small-dma"]
    assert "gather_columns (0.5 KiB)" in diagnose(path)[0].message


def test_healthy_kernel_profile_has_no_findings(tmp_path):
    b = TileBuilder("k")
    x = b.input("x", (128, 1024), "float32")
    y = b.output("y", (128, 1024), "float32")
    t = b.sbuf((128, 1024), "float32")
    b.dma_copy(t, x)
    b.dma_copy(y, t)
    prog = b.build()
    assert diagnose(write_kernel_profile(tmp_path, prog, simulate(prog))) == []


def _step(name, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 0, "ts": ts, "dur": dur}


def _launch(ts):
    return {"ph": "X", "cat": "runtime", "name": "execute aten::mul", "pid": 2, "tid": 0, "ts": ts, "dur": 1.0,
            "args": {}}


def test_step_without_synchronize(tmp_path):
    events = [_step("ProfilerStep#3", 0, 100), _launch(10), _launch(20), _hw()]
    (f,) = diagnose(_sim_profile(tmp_path, events, {"executions": 2}))
    assert f.code == "no-synchronize" and "ProfilerStep#3 launched device work" in f.message
    sync = {"ph": "X", "cat": "user_annotation", "name": "tilescope::synchronize", "pid": 1, "tid": 0,
            "ts": 90, "dur": 5}
    assert diagnose(_sim_profile(tmp_path / "ok", events + [sync], {"executions": 2})) == []


def test_at_export_the_device_slices_are_made_only_for_a_rule_that_reads_them(tmp_path):
    """The exporter hands over each device category as a function that makes its slices (one
    dict per execution: milliseconds for a long profile); without ProfilerStep ranges or copies
    no rule calls them, and with steps the synchronize rule gets the launches it reads."""
    made = []

    def slices(cat, events=()):
        def make():
            made.append(cat)
            return list(events)
        return make

    path = _sim_profile(tmp_path, [], {"executions": 2})
    by_cat = {"runtime": slices("runtime"), "hardware": slices("hardware"), "memcpy": slices("memcpy")}
    assert diagnose(path, trusted=True, slices=(by_cat, [])) == [] and made == ["memcpy"]  # (no copies: stop)
    made.clear()
    by_cat = {"runtime": slices("runtime", [_launch(10)]), "hardware": slices("hardware"), "memcpy": slices("memcpy")}
    (f,) = diagnose(path, trusted=True, slices=(by_cat, [_step("ProfilerStep#0", 0, 100)]))
    assert f.code == "no-synchronize" and made == ["runtime", "memcpy"]


def test_cold_start(tmp_path):
    (f,) = diagnose(_sim_profile(tmp_path, [_hw()], {"executions": 6, "cold_executions": 6,
                                                     "cold_ops": ["aten::mean.dim", "aten::mul.Tensor"]}))
    assert f.code == "cold-start" and "6 device execution(s)" in f.message and "aten::mean.dim" in f.message
    assert "warmup=1" in f.fix


def test_profiler_distortion(tmp_path):
    stats = {"executions": 3, "launch_interval_us": {"profiled": 90.0, "unprofiled": 30.0,
                                                       "samples": {"profiled": 40, "unprofiled": 80}}}
    (f,) = diagnose(_sim_profile(tmp_path, [_hw()], stats))
    assert f.code == "profiler-distortion" and "3.0x longer while profiling" in f.message


def test_missing_privateuse1_activity(tmp_path):
    with ProfileWriter(tmp_path, device={"kind": "sim", "preset": "trn1", "activities": ["CPU"],
                                                 "device_columns": None},
                       config={"modes": ["RUNTIME"], "correlate_device_time": True}) as w:
        w.write_json("system_trace.json", {"traceEvents": [_hw()]})
        w.stats = {"executions": 4}
    (f,) = diagnose(w.path)
    assert f.code == "device-time-not-correlated" and "activities were CPU" in f.message
    assert "ProfilerActivity.PrivateUse1" in f.fix


def test_events_of_odd_shape_from_elsewhere_are_skipped(tmp_path):
    """A trace written by another tool may put anything in an event's fields: the rules read
    what they understand and skip the rest."""
    odd = [{"ph": "X", "cat": ["not", "a", "name"], "name": 3, "ts": 0, "dur": 1},
           {"ph": "X", "name": "ProfilerStep#1", "ts": 0, "dur": 100}]  # no category
    copy = {"ph": "X", "cat": "memcpy", "name": "memcpy HtoD", "pid": 1, "tid": 1, "ts": 0, "dur": 50.0}
    path = _sim_profile(tmp_path, [*odd, _hw(dur=10.0), copy], {"executions": 1})
    assert _codes(path) == ["host-copies"]


def test_an_instruction_trace_the_manifest_does_not_list_makes_the_profile_incomplete(tmp_path):
    """A file dropped into ``itraces/`` after the export would be read as one more run with
    no checksum behind it: the doctor, the trace reader and share refuse it, naming it."""
    import shutil

    import pytest

    import tilescope.trace as tt
    from tilescope.profiler import load
    from tilescope.profiler._reader import IncompleteProfileError

    b = TileBuilder("k")
    x = b.input("x", (128, 64), "float32")
    t = b.sbuf((128, 64), "float32")
    b.dma_copy(t, x)
    prog = b.build()
    path = _sim_profile(tmp_path, [_hw(prog.hash)], {"executions": 1}, program=prog)
    assert load(path).complete
    (listed,) = (path / "itraces").iterdir()
    stray = path / "itraces" / listed.name.replace(".0.itrace", ".7.itrace")
    shutil.copy(listed, stray)
    (f,) = diagnose(path)
    assert f.code == "incomplete-profile" and f"itraces/{stray.name} is not listed in the manifest" in f.message
    with pytest.raises(IncompleteProfileError, match=stray.name):
        load(path)
    with pytest.raises(tt.TraceFormatError, match=stray.name):
        tt.open(str(path))
