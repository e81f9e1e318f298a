"""The analysis engine on tilescope profile directories (made by tests/trace_fixtures.py from
the core modules, in the profile format v1): op table, fusion diff, lineage down to
instructions, engines, roofline, replay on another preset, windowed queries, CLI."""

from __future__ import annotations

import json
import os

import pytest

import tilescope.trace as tt
from tilescope.cli import main
from tilescope.sim import simulate
from tilescope.spec import preset
from tilescope.trace import TraceFormatError
from trace_fixtures import NAIVE_OPS, programs_for, write_profile


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    old = os.environ.get("TILESCOPE_CACHE_DIR")
    root = tmp_path_factory.mktemp("profiles")
    os.environ["TILESCOPE_CACHE_DIR"] = str(root / "cache")
    naive = write_profile(str(root / "naive"), "naive", steps=2)
    fused = write_profile(str(root / "fused"), "fused", steps=2)
    yield {"naive": naive, "fused": fused, "root": root}
    if old is None:
        os.environ.pop("TILESCOPE_CACHE_DIR", None)
    else:
        os.environ["TILESCOPE_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def naive(profiles):
    return tt.open(profiles["naive"])


@pytest.fixture(scope="module")
def fused(profiles):
    return tt.open(profiles["fused"])


def test_lanes_follow_the_profile_format(naive):
    lanes = naive.sql("SELECT instance, subsystem, identifier, side FROM lanes ORDER BY lane").fetchall()
    assert lanes == [("host", "framework", "TID:100", "host"), ("host", "runtime", "NC:0", "host"),
                     ("host", "hardware", "NC0:0", "device")]
    assert naive.modeled and naive.kind == "tilescope" and naive.preset_name() == "trn1"


def test_op_table_has_modeled_device_time_per_aten_op(naive):
    ops = {r["name"]: r for r in naive.op_table().to_pylist()}
    assert ops["aten::mul"]["calls"] == 4  # 2 per step, 2 steps
    assert ops["aten::mul"]["device_calls"] == 4
    mul = dict(programs_for("naive", "trn1"))["aten::mul"]
    assert ops["aten::mul"]["device_self_ns"] == 4 * round(simulate(mul, "trn1").summary.total_ns)
    for op in set(NAIVE_OPS):
        assert ops[op]["device_total_ns"] > 0


def test_fused_has_one_execution_where_naive_has_six_and_the_diff_says_so(naive, fused):
    per_step = lambda t: t.sql("SELECT count(*) FROM events WHERE cat = 'hardware'").fetchall()[0][0] / 2  # noqa: E731
    assert per_step(naive) == 6 and per_step(fused) == 1
    d = tt.diff(naive, fused, names=["naive", "fused"])
    assert d.per_step
    [f] = d.fusion
    assert f.region == "RMSNorm"
    assert f.before_executions == 6 and f.after_executions == 1
    assert f.before_ops == {"aten::pow": 1, "aten::mean": 1, "aten::add": 1, "aten::rsqrt": 1, "aten::mul": 2}
    assert f.after_ops == {"aten::rms_norm": 1}
    text = f.text()
    assert text.startswith("In RMSNorm: 6 ops")
    assert "6 ops" in text and "became 1" in text and "-5 executions" in text and "(modeled)" in text
    # a measured trace ran other kernels on another device: no fusion finding against it
    cuda = tt.open(os.path.join(os.path.dirname(__file__), "data", "kineto", "cuda_trace_diff_control.json.gz"))
    assert tt.diff(naive, cuda).fusion == [] and tt.diff(cuda, fused).fusion == []
    assert f.after_bytes < f.before_bytes and f.after_device_ns < f.before_device_ns
    summary = {r["metric"]: r for r in d.summary.to_pylist()}
    assert summary["device executions / kernels"]["naive"] == 6 and summary["device executions / kernels"]["fused"] == 1


def test_lineage_from_framework_op_to_instructions(naive):
    eid = naive.sql("SELECT eid FROM events WHERE name = 'aten::mul' ORDER BY ts_ns LIMIT 1").fetchall()[0][0]
    hops = naive.lineage(eid)
    assert [h["hop"] for h in hops] == ["parent", "parent", "op", "launch", "device", "instructions"]
    assert [h.get("name") for h in hops[:2]] == ["ProfilerStep#0", "RMSNorm"]
    launch, device, ins = hops[3], hops[4], hops[5]
    assert launch["name"] == "execute aten::mul" and device["name"] == "exec_running aten::mul"
    assert launch["flow_id"] == device["flow_id"] and device["program_hash"] == ins["program_hash"]
    assert ins["modeled"] and ins["instructions"] == len(dict(programs_for("naive", "trn1"))["aten::mul"])
    ex = naive.execution(device["eid"])
    assert ex["modeled"] and len(ex["instructions"]["index"]) == ins["instructions"]
    assert set(ex["engine_busy_ns"]) >= {"VectorE"} and ex["span_ns"] == pytest.approx(ins["span_ns"])
    assert all("aten::mul" in s for s in ex["instructions"]["source"])
    # starting from the hardware event gives the same chain
    assert [h["eid"] for h in naive.lineage(device["eid"]) if "eid" in h] == [h["eid"] for h in hops if "eid" in h]


def test_engine_breakdown_and_roofline_are_modeled(naive):
    eng = {r["engine"]: r for r in naive.engine_breakdown().to_pylist()}
    assert "VectorE" in eng and any(k.startswith("DMA") for k in eng) and all(r["modeled"] for r in eng.values())
    rf = naive.roofline().to_pylist()
    assert {r["name"] for r in rf} == {"pow", "mean", "add", "rsqrt", "mul"}
    spec = preset("trn1")
    for r in rf:
        assert r["modeled"] and r["peak_source"] == "preset trn1"
        assert r["mbu"] == pytest.approx(r["gbps"] / spec.hbm_bytes_per_ns)
        assert 0 < r["pct_of_roofline"] <= 1.0


def test_gaps_on_the_simulated_device(naive):
    g = naive.gaps().to_pylist()
    classes = {r["class"] for r in g}
    # each execution waits for the runtime's fixed cost after submit; the host waits in synchronize
    assert "device_waits_on_runtime" in classes and "host_waits_on_device" in classes


def test_replay_on_trn2_changes_times_and_nothing_else(naive):
    r = naive.replay("trn2")
    same = "SELECT eid, ph, cat, name, pid, tid, program_hash, flow_id FROM {} ORDER BY eid"
    assert naive.sql(same.format("raw")).fetchall() == r.sql(same.format("raw")).fetchall()
    host = "SELECT eid, ts_ns, dur_ns FROM events WHERE lane = 0 ORDER BY eid"
    assert naive.sql(host).fetchall() == r.sql(host).fetchall()  # host events untouched
    assert naive.sql("SELECT count(*), sum(flops), sum(bytes) FROM instructions").fetchall() == \
        r.sql("SELECT count(*), sum(flops), sum(bytes) FROM instructions").fetchall()
    dev = "SELECT program_hash, dur_ns FROM events WHERE cat = 'hardware' ORDER BY eid"
    before, after = naive.sql(dev).fetchall(), r.sql(dev).fetchall()
    progs = {p.hash: p for _op, p in programs_for("naive", "trn1")}
    for (h, d0), (h1, d1) in zip(before, after):
        assert h == h1 and d0 != d1
        assert d1 == round(simulate(progs[h], "trn2").summary.total_ns)
    assert r.preset_name() == "trn2" and set(r.sql("SELECT DISTINCT preset FROM instructions").fetchall()) == {("trn2",)}
    # an execution never starts before its submit + the runtime cost, nor before the previous one ends
    rows = r.sql("""SELECT h.ts_ns, h.end_ns, x.ts_ns FROM events h JOIN events x ON x.flow_id = h.flow_id AND x.cat = 'runtime'
                    WHERE h.cat = 'hardware' ORDER BY h.ts_ns""").fetchall()
    rt = preset("trn2").runtime_exec_us * 1000
    prev = 0
    for start, end, submit in rows:
        assert start == max(round(submit + rt), prev) or start == max(submit + rt, prev)
        prev = end


def test_replay_on_the_same_preset_reproduces_the_recorded_times(naive):
    r = naive.replay("trn1")
    q = "SELECT eid, ts_ns, dur_ns FROM raw ORDER BY eid"
    assert naive.sql(q).fetchall() == r.sql(q).fetchall()


def test_replay_needs_executables(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]}))
    with pytest.raises(ValueError, match="no executables to replay"):
        tt.open(str(p)).replay("trn2")


def test_standalone_executable_and_itrace_pair(profiles):
    p = profiles["naive"]
    it = sorted(os.listdir(os.path.join(p, "itraces")))[0]
    h = it.split(".")[0]
    t = tt.open([os.path.join(p, "executables", f"{h}.json"), os.path.join(p, "itraces", it)])
    n = t.sql("SELECT count(*) FROM instructions").fetchall()[0][0]
    with open(os.path.join(p, "itraces", it)) as f:
        assert n == len(json.load(f)["columns"]["index"])
    assert t.engine_breakdown().num_rows > 0 and t.summary()["events"] == 0


def test_incomplete_or_modified_profiles_are_refused(tmp_path):
    bad = write_profile(str(tmp_path / "a"), "fused", steps=1, corrupt="checksum")
    with pytest.raises(TraceFormatError, match="does not match its sha256 in the manifest"):
        tt.open(bad)
    partial = write_profile(str(tmp_path / "b"), "fused", steps=1, corrupt="no_manifest")
    with pytest.raises(TraceFormatError, match="incomplete profile directory: manifest.json is missing"):
        tt.open(partial)
    ok = write_profile(str(tmp_path / "c"), "fused", steps=1)
    with open(os.path.join(ok, "system_trace.json"), "a") as f:
        f.write(" ")
    with pytest.raises(TraceFormatError, match=r"system_trace.json has \d+ bytes, the manifest says"):
        tt.open(ok)


def test_window_lod_and_exact_paths(naive):
    w = naive.window(pixels=2000)
    assert w["exact"] and w["events"]["eid"].size == naive.summary()["events"]
    assert w["events"]["start_ns"].min() == 0  # relative to the trace start
    depth = {w["names"][n]: int(d) for n, d in zip(w["events"]["name"], w["events"]["depth"])}
    assert (depth["ProfilerStep#0"], depth["RMSNorm"], depth["aten::mul"]) == (0, 1, 2)  # as in the op hierarchy
    assert set(w) >= {"t0_ns", "t1_ns", "origin_ns", "exact", "bucket_ns", "names", "events", "buckets"}
    lod = naive.window(pixels=10, max_events=5)
    assert not lod["exact"] and lod["buckets"]["lane"].size > 0
    assert lod["buckets"]["count"].sum() + 0 >= 1
    # names index into the name list; lane filter restricts every array
    only_hw = naive.window(lanes=[2], pixels=2000)
    assert set(only_hw["events"]["lane"].tolist()) == {2}
    assert {only_hw["names"][i] for i in only_hw["events"]["name"]} <= {f"exec_running {op}" for op in NAIVE_OPS}
    with pytest.raises(ValueError, match="empty window"):
        naive.window(100, 50)


def test_cli_report_diff_sql_replay(profiles, capsys, tmp_path):
    assert main(["report", profiles["naive"], "--json", "--plot", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    rep = json.loads(out[out.index("{"):])
    assert rep["time_source"] == "modeled" and rep["summary"]["executables"] == 5
    import xml.etree.ElementTree as ET

    for name, shape in (("roofline.svg", "circle"), ("breakdown.svg", "rect")):
        root = ET.parse(tmp_path / "plots" / name).getroot()  # well-formed SVG
        assert len(root.findall(f"{{http://www.w3.org/2000/svg}}{shape}")) >= 5
        assert "modeled" in ET.tostring(root, encoding="unicode")
    assert main(["report", profiles["naive"]]) == 0
    text = capsys.readouterr().out
    assert "(modeled)" in text and "aten::mul" in text
    assert main(["diff", profiles["naive"], profiles["fused"]]) == 0
    text = " ".join(capsys.readouterr().out.split())  # undo the console's line wrapping
    assert "fusion:" in text and "became 1" in text
    assert main(["compare", profiles["naive"], profiles["fused"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fusion"][0]["after_executions"] == 1
    assert main(["sql", profiles["naive"], "SELECT name, count(*) AS n FROM events WHERE cat = 'hardware' GROUP BY name ORDER BY name", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"]: r["n"] for r in rows}["exec_running aten::mul"] == 4
    assert main(["sql", profiles["naive"], "SELECT nope FROM events"]) == 2
    assert "SQL error" in capsys.readouterr().err
    assert main(["replay", profiles["naive"], "--preset", "trn2"]) == 0
    assert "replayed (trn2)" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
