"""The generic share, visible on every surface: the profile (per-execution ``lowering`` arg and
``stats.generic``), the doctor, the analysis tables, ``tilescope report``, the explorer's
summary and ``tilescope.compile.explain``.

The workload pairs a matmul (a specific lowering) with ``logcumsumexp``, an op no rule lowers:
its one device execution is modeled by the generic lowering. If a rule for it lands, pick
another op without one (the first test says so)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tilescope.profiler import ProfileWriter, diagnose, read_profile

GENERIC_OP = "aten::_logcumsumexp"


def _workload(x, w):
    return torch.logcumsumexp(x @ w, dim=1)


@pytest.fixture(scope="module")
def profiled(sim_virtual, tmp_path_factory):
    from tilescope.device import recording, synchronize
    from tilescope.profiler import profile

    x = torch.randn(256, 512).to("sim")
    w = torch.randn(512, 512).to("sim")
    _workload(x, w)  # warm: Programs built before the profiled window
    synchronize()
    root = tmp_path_factory.mktemp("generic")
    with recording() as runs:
        with profile(str(root / "prof")) as prof:
            _workload(x, w)
    path = str(prof.profile_dir)
    old = os.environ.get("TILESCOPE_CACHE_DIR")
    os.environ["TILESCOPE_CACHE_DIR"] = str(root / "cache")
    yield path, [r for r in runs if r.kind != "memcpy"]
    if old is None:
        os.environ.pop("TILESCOPE_CACHE_DIR", None)
    else:
        os.environ["TILESCOPE_CACHE_DIR"] = old


def _expected(runs):
    total = sum(r.modeled_ns for r in runs)
    generic = sum(r.modeled_ns for r in runs if r.lowering == "generic")
    return generic / total


def test_the_workload_has_a_generic_and_a_specific_execution(profiled):
    _, runs = profiled
    by_op = {r.op: r.lowering for r in runs}
    assert by_op.get(GENERIC_OP) == "generic", f"{GENERIC_OP} has a lowering now ({by_op}): use another op"
    assert by_op.get("aten::mm") == "matmul"


def test_the_profile_records_each_execution_s_rule_and_the_generic_share(profiled):
    path, runs = profiled
    stats = read_profile(path).require_complete().manifest["stats"]
    g = stats["generic"]
    assert g["share"] == pytest.approx(_expected(runs), rel=1e-6)
    assert g["executions"] == 1 and g["kernel_executions"] == len(runs)
    assert g["top"][0]["op"] == GENERIC_OP and g["top"][0]["shapes"] == [[256, 512]]
    assert stats["lowerings"]["matmul"]["executions"] == 1
    from tilescope.lower import declines  # the process's declines (they only grow until the cache is cleared)
    now = {(r, why): n for r, why, n in declines()}
    assert all(0 < d["calls"] <= now[d["rule"], d["reason"]] for d in stats["lowering_declines"])
    with open(os.path.join(path, "system_trace.json"), encoding="utf-8") as f:
        hw = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "hardware"]
    assert sorted(e["args"]["lowering"] for e in hw) == sorted(r.lowering for r in runs)


def test_the_doctor_names_the_generic_ops_and_their_shapes(profiled):
    path, runs = profiled
    (f,) = [f for f in diagnose(path) if f.code == "generic-share"]
    assert f.severity == "warning"
    assert f"{_expected(runs):.1%}" in f.message and f"{GENERIC_OP} [256x512]" in f.message


def _generic_profile(tmp_path, share_us: tuple[float, float], *, stats: bool):
    """A profile with one generic and one matmul execution of the given modeled times; the
    generic share in ``stats`` or only in the hardware events' args (an older profile)."""
    generic_us, matmul_us = share_us
    hw = [{"ph": "X", "cat": "hardware", "name": f"exec_running {op}", "pid": 2, "tid": 0, "ts": 0, "dur": us,
           "args": {"op": op, "lowering": rule, "program_hash": None}}
          for op, rule, us in ((GENERIC_OP, "generic", generic_us), ("aten::mm", "matmul", matmul_us))]
    st = {"executions": 2}
    if stats:
        share = generic_us / (generic_us + matmul_us)
        st["generic"] = {"share": share, "executions": 1, "modeled_us": generic_us,
                         "kernel_modeled_us": generic_us + matmul_us, "kernel_executions": 2,
                         "top": [{"op": GENERIC_OP, "shapes": [[8, 16]], "executions": 1, "modeled_us": generic_us,
                                  "share": share}]}
    with ProfileWriter(tmp_path, device={"kind": "sim", "preset": "trn1"},
                       config={"modes": ["DEVICE", "RUNTIME"], "correlate_device_time": True}) as w:
        w.write_json("system_trace.json", {"traceEvents": hw})
        w.stats = st
    return w.path


@pytest.mark.parametrize("stats", [True, False], ids=["stats", "events"])
def test_the_doctor_threshold_is_five_percent(tmp_path, stats):
    over = _generic_profile(tmp_path / "over", (6.0, 94.0), stats=stats)
    under = _generic_profile(tmp_path / "under", (5.0, 95.0), stats=stats)
    (f,) = [f for f in diagnose(over) if f.code == "generic-share"]
    assert "6.0%" in f.message and GENERIC_OP in f.message
    assert "generic-share" not in {f.code for f in diagnose(under)}


def test_the_doctor_names_the_rules_that_declined_calls(tmp_path):
    path = _generic_profile(tmp_path / "declined", (6.0, 94.0), stats=True)
    manifest = json.loads((path / "manifest.json").read_text())
    assert "lowering_declines" not in manifest["stats"]
    (f,) = [f for f in diagnose(path) if f.code == "generic-share"]
    assert "declined" not in f.message
    with ProfileWriter(tmp_path / "with", device={"kind": "sim", "preset": "trn1"},
                       config={"modes": ["DEVICE", "RUNTIME"], "correlate_device_time": True}) as w:
        w.write_bytes("system_trace.json", (path / "system_trace.json").read_bytes())
        w.stats = {**manifest["stats"], "lowering_declines": [
            {"rule": "fused:softmax", "reason": "tiles do not fit the kernel (CapacityError)", "calls": 3}]}
    (f,) = [f for f in diagnose(w.path) if f.code == "generic-share"]
    assert "fused:softmax 3x (tiles do not fit the kernel (CapacityError))" in f.message


def test_the_analysis_tables_carry_the_rule(profiled):
    import tilescope.trace as tt

    path, runs = profiled
    t = tt.open(path)
    rows = t.sql("SELECT lowering, count(*) FROM events WHERE cat = 'hardware' GROUP BY 1 ORDER BY 1").fetchall()
    assert dict(rows) == {"generic": 1, "matmul": 1}
    shapes = t.sql("SELECT shapes FROM executables WHERE shapes IS NOT NULL").fetchall()
    assert [json.loads(s) for (s,) in shapes] == [[[256, 512]]]
    g = t.generic_share()
    assert g["share"] == pytest.approx(_expected(runs), abs=2e-3)  # (events keep integer ns)
    assert g["top"][0]["op"] == GENERIC_OP and g["top"][0]["shapes"] == [[256, 512]]
    by_rule = {r["lowering"]: r for r in t.lowerings().to_pylist()}
    assert set(by_rule) == {"generic", "matmul"} and sum(r["share"] for r in by_rule.values()) == pytest.approx(1)


def test_a_kineto_trace_has_no_generic_share():
    import tilescope.trace as tt

    t = tt.open(os.path.join(os.path.dirname(__file__), "data", "kineto", "cpu_only_tiny.json.gz"))
    assert t.generic_share() is None and t.lowerings().num_rows == 0


def test_report_shows_the_share_and_the_generic_ops(profiled):
    import io

    from rich.console import Console

    import tilescope.trace as tt
    from tilescope.trace._report import print_report, report_dict

    path, runs = profiled
    t = tt.open(path)
    d = report_dict(t)
    assert d["generic"]["share"] == pytest.approx(_expected(runs), abs=2e-3)
    out = io.StringIO()
    print_report(t, Console(file=out, width=200))
    text = out.getvalue()
    assert f"generic lowering: {d['generic']['share']:.1%} of modeled kernel time" in text
    assert "ops modeled by the generic lowering" in text and "256x512" in text


def test_the_explorer_summary_shows_the_share(profiled):
    from tilescope.explorer._engine import open_source
    from tilescope.explorer._insights import summary_page

    path, runs = profiled
    page = summary_page(open_source(path))
    m = page["metrics"]
    assert m["generic_share"] == pytest.approx(_expected(runs), abs=2e-3)
    assert m["generic"]["top"][0]["op"] == GENERIC_OP
    (rec,) = [r for r in page["recommendations"] if r["code"] == "generic-share"]
    assert GENERIC_OP in rec["message"]
    static = os.path.join(os.path.dirname(__import__("tilescope.explorer").explorer.__file__), "static", "js")
    with open(os.path.join(static, "summary.js"), encoding="utf-8") as f:
        js = f.read()
    assert "m.generic_share" in js and "generic-ops" in js  # the card and the table read these fields


def test_explain_reports_the_generic_share_of_a_call_on_the_device(sim_virtual):
    from tilescope.compile import explain

    x = torch.randn(64, 128).to("sim")
    w = torch.randn(128, 128).to("sim")
    e = explain(_workload, x, w)
    rules = {r.op: r.lowering for r in e.executions}
    assert rules[GENERIC_OP] == "generic"
    generic = sum(r.modeled_ns for r in e.executions if r.lowering == "generic")
    assert e.generic_share == pytest.approx(generic / sum(r.modeled_ns for r in e.executions))
    assert 0 < e.generic_share < 1 and f"generic lowering {e.generic_share:.1%}" in str(e)
    assert e.to_dict()["generic_share"] == e.generic_share
    assert explain(_workload, x.cpu(), w.cpu()).generic_share is None  # not run on the device: not known
