"""The explorer without a browser: the timeline index against brute-force SQL, the packed
format, every API endpoint on tilescope profiles and real Kineto traces, and the HTTP server's
local-first rules (token, Host check, no path traversal, read-only)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse

import numpy as np
import pytest

import tilescope.trace as tt
from tilescope.explorer import Session, api
from tilescope.explorer._binary import pack, unpack
from tilescope.explorer._index import TimelineIndex
from tilescope.explorer._server import make_server
from trace_fixtures import write_profile

KINETO = os.path.join(os.path.dirname(__file__), "data", "kineto")
CONTROL = os.path.join(KINETO, "cuda_trace_diff_control.json.gz")
ALEXNET = os.path.join(KINETO, "cuda_alexnet_small.json.gz")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    old = os.environ.get("TILESCOPE_CACHE_DIR")
    root = tmp_path_factory.mktemp("explorer")
    os.environ["TILESCOPE_CACHE_DIR"] = str(root / "cache")
    naive = write_profile(str(root / "naive"), "naive", steps=2)
    fused = write_profile(str(root / "fused"), "fused", steps=2)
    yield {"root": root, "naive": naive, "fused": fused}
    if old is None:
        os.environ.pop("TILESCOPE_CACHE_DIR", None)
    else:
        os.environ["TILESCOPE_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def session(env):
    return Session([f"naive={env['naive']}", f"fused={env['fused']}", ALEXNET, str(env["root"] / "missing.json")])


@pytest.fixture(scope="module")
def control(env):
    t = tt.open(CONTROL)
    return t, TimelineIndex.load_or_build(t)


# ---- the packed format -------------------------------------------------------------------
def test_pack_round_trips_every_dtype():
    arrays = {"a": ("f64", np.array([1.5, -2.25])), "b": ("u32", np.arange(5)), "c": ("u8", np.array([1, 2, 3])),
              "d": ("i16", np.array([-7])), "e": ("u32", np.zeros(0))}
    head, out = unpack(pack(arrays, {"x": 1}))
    assert head["x"] == 1
    for k, (_dt, v) in arrays.items():
        assert np.array_equal(out[k], v)
    assert all(s["offset"] % 8 == 0 for s in head["arrays"])  # the browser wraps them without copying
    with pytest.raises(ValueError, match="dtype 'i64' is not one of"):
        pack({"z": ("i64", np.zeros(1))})


# ---- the timeline index ------------------------------------------------------------------
def test_exact_window_matches_sql(control):
    t, ix = control
    a, b = ix.span_ns // 3, ix.span_ns // 3 + ix.span_ns // 200
    w = ix.window(a, b, None, 1000, max_events=10**6)
    assert w["exact"]
    got = set(ix.eid[w["events"]["ref"].astype(np.int64)].tolist())
    o = ix.origin_ns
    want = {r[0] for r in t.sql(f"""SELECT eid FROM events WHERE ph IN ('X', 'i') AND ts_ns - {o} < {b}
                                     AND (ts_ns + coalesce(dur_ns, 0) - {o} > {a}
                                          OR (coalesce(dur_ns, 0) = 0 AND ts_ns - {o} >= {a}))""").fetchall()}
    assert got == want and len(got) > 100


def test_lod_window_keeps_every_wide_event_and_counts_the_rest(control):
    t, ix = control
    w = ix.window(None, None, None, 800, max_events=2000)
    assert not w["exact"] and w["bucket_ns"] > 0
    px = ix.span_ns / 800
    drawn = set(ix.eid[w["events"]["ref"].astype(np.int64)].tolist())
    o = ix.origin_ns
    wide = {r[0] for r in t.sql(f"SELECT eid FROM events WHERE ph = 'X' AND dur_ns >= {2 * px}").fetchall()}
    assert wide <= drawn  # every event two pixels wide or more is drawn individually
    # buckets hold the others: counts add up to every drawable event of the trace
    assert len(drawn) + int(w["buckets"]["count"].sum()) == ix.n
    assert t.sql(f"SELECT count(*) FROM events WHERE ph IN ('X', 'i') AND ts_ns - {o} >= 0").fetchall()[0][0] == ix.n


def test_depth_matches_the_engines_nesting(control):
    t, ix = control
    w = t.window(max_events=10**7, pixels=10)
    eng = dict(zip(w["events"]["eid"].tolist(), w["events"]["depth"].tolist()))
    refs = ix.refs_of(np.array(list(eng)))
    mine = ix.g_depth[ix.group[refs]]
    dur = ix.dur[refs]
    theirs = np.array(list(eng.values()))
    # zero-length events: the engine nests later events inside them, the explorer does not
    assert np.array_equal(mine[dur > 0], theirs[dur > 0])


def test_kernels_take_the_colour_of_the_op_that_launched_them(control):
    t, ix = control
    k = ix.kinds.index("kernel")
    kern = np.flatnonzero(ix.kind == k)
    linked = ix.op_key[kern] != ix.name[kern]
    assert linked.mean() > 0.95
    # cross-check one kernel against the engine's lineage
    r = int(kern[linked][0])
    hops = t.lineage(int(ix.eid[r]))
    op = [h for h in hops if h["hop"] == "op"][-1]["name"]
    assert ix.names[ix.op_key[r]] == op


def test_window_queries_are_fast_and_the_index_is_cached(control, env):
    t, ix = control
    again = TimelineIndex.load_or_build(t)
    assert again.loaded_from_cache and again.n == ix.n
    assert np.array_equal(np.asarray(again.start), ix.start) and again.names == ix.names
    times = []
    for frac in (1.0, 0.3, 0.05, 0.01, 0.001):
        t0 = time.perf_counter()
        again.window(int(ix.span_ns * 0.2), int(ix.span_ns * (0.2 + frac * 0.8)), None, 1500)
        times.append(time.perf_counter() - t0)
    assert max(times) < 0.25, times


def test_box_selection_summary(control):
    t, ix = control
    a, b = ix.span_ns // 2, ix.span_ns // 2 + ix.span_ns // 50
    s = ix.select(a, b)
    assert s["events"] > 0 and s["by_name"] and s["by_lane"]
    assert all(0 <= x["busy_share"] <= 1.0 + 1e-9 for x in s["by_lane"])
    top = s["by_name"][0]
    assert top["time_ns"] <= (b - a) * len(ix.lanes)


# ---- API on tilescope profiles -----------------------------------------------------------
def test_profiles_list_names_what_failed_and_the_fix(session):
    ps = api(session, "/api/profiles")["profiles"]
    assert [p["label"] for p in ps[:2]] == ["naive", "fused"]
    assert ps[0]["ok"] and ps[0]["modeled"]
    bad = ps[3]
    assert not bad["ok"] and "missing.json" in bad["error"] and "no such file" in bad["error"]
    assert bad["fix"]
    with pytest.raises(ValueError, match="could not be loaded"):
        api(session, "/api/p/p3/meta")


def test_meta_labels_modeled_and_lanes(session):
    m = api(session, "/api/p/p0/meta")
    assert m["modeled"] and m["what"].startswith("modeled")
    assert [(x["subsystem"], x["identifier"]) for x in m["lanes"]] == [
        ("framework", "TID:100"), ("runtime", "NC:0"), ("hardware", "NC0:0")]
    assert [x["core"] for x in m["lanes"]] == ["host", "NC0", "NC0"]
    assert m["executions"] == 12 and m["first_step_ns"] == 0
    k = api(session, "/api/p/p2/meta")
    assert not k["modeled"] and "measured on NVIDIA" in k["what"]


def test_window_endpoint_is_packed_and_colours_device_work_by_op(session):
    head, a = api(session, "/api/p/p0/window", px=500)
    assert head["exact"] and len(a["ev_ref"]) == 42
    m = api(session, "/api/p/p0/meta")
    names = m["names"]
    hw = [i for i in range(len(a["ev_ref"])) if names[a["ev_name"][i]].startswith("exec_running ")]
    assert hw and all(names[a["ev_key"][i]] == names[a["ev_name"][i]][len("exec_running "):] for i in hw)
    head2, b = api(session, "/api/p/p0/window", lanes="2", color="kind")
    assert set(b["ev_lane"].tolist()) == {2}


def test_lineage_of_aten_mul_reaches_runtime_hardware_and_instructions(session, env):
    t = session.get("p0").trace
    eid = t.sql("SELECT eid FROM events WHERE name = 'aten::mul' ORDER BY ts_ns LIMIT 1").fetchall()[0][0]
    lin = api(session, "/api/p/p0/lineage", eid=eid)
    hops = {h["hop"]: h for h in lin["hops"]}
    assert {"op", "launch", "device", "instructions"} <= set(hops)
    assert hops["launch"]["name"] == "execute aten::mul" and hops["device"]["name"] == "exec_running aten::mul"
    lanes = {x["lane"]: x["subsystem"] for x in api(session, "/api/p/p0/meta")["lanes"]}
    assert lanes[hops["launch"]["lane"]] == "runtime" and lanes[hops["device"]["lane"]] == "hardware"
    assert hops["device"]["ref"] is not None and hops["device"]["device_view"]["own_trace"]
    dv = hops["instructions"]["device_view"]
    head, cols = api(session, "/api/p/p0/device", hash=dv["hash"], run=dv["run"])
    assert head["modeled"] and {"TensorE", "VectorE", "ScalarE", "GpSimd"} <= set(head["engines"])
    assert any(e.startswith("DMA.q") for e in head["engines"])
    assert len(cols["index"]) == hops["instructions"]["instructions"]
    assert {p["op"] for p in head["provenance"]} >= {"aten::mul"}


def test_instruction_detail_has_dependencies_with_slack(session):
    ex = api(session, "/api/p/p0/executions")["executions"][0]
    d = api(session, "/api/p/p0/instruction", hash=ex["program_hash"], run=ex["run"], index=1)
    assert d["modeled"] and d["kind"] and d["predecessors"]
    assert d["predecessors"][0]["index"] == 0 and d["predecessors"][0]["slack_ns"] >= 0
    assert any(s["index"] == 2 for s in d["successors"])
    assert "src" in d["operands"] or "a" in d["operands"]
    with pytest.raises(ValueError, match="out of range"):
        api(session, "/api/p/p0/instruction", hash=ex["program_hash"], run=ex["run"], index=10_000)


def test_memory_and_code_views(session):
    ex = api(session, "/api/p/p1/executions")["executions"][0]
    m = api(session, "/api/p/p1/memory", hash=ex["program_hash"], run=ex["run"])
    assert m["capacity"]["sbuf"] > 0 and m["series"]["sbuf"]["peak"] > 0
    assert m["series"]["sbuf"]["bytes"][-1] == 0  # everything is freed at the end
    c = api(session, "/api/p/p1/code", hash=ex["program_hash"], run=ex["run"])
    assert sum(x["instructions"] for x in c["lines"]) == ex["instructions"]


def test_summary_tables_roofline_and_exports(session):
    s = api(session, "/api/p/p0/summary")
    assert s["modeled"] and "modeled" in s["label"]
    m = s["metrics"]
    assert m["executions"] == 12 and m["mbu"] > 0 and m["average_dma_bytes"] > 0
    assert {"hfu", "mfu", "arithmetic_intensity", "spill_bytes", "engines"} <= set(m)
    assert any(r["code"] == "runtime-overhead" for r in s["recommendations"])
    ops = api(session, "/api/p/p0/ops")["table"]
    row = dict(zip(ops["columns"], next(r for r in ops["rows"] if r[0] == "aten::mul")))
    assert row["calls"] == 4 and row["device_calls"] == 4
    rf = api(session, "/api/p/p0/roofline")
    assert rf["modeled"] and rf["peak_tflops"] > 0 and rf["table"]["rows"]
    ex = api(session, "/api/p/p0/executions")["executions"][0]
    csv_all = api(session, "/api/p/p0/export/instructions.csv", hash=ex["program_hash"], run=ex["run"]).decode()
    lines = csv_all.strip().splitlines()
    assert lines[0].startswith("index,engine,kind,start_ns_modeled") and len(lines) == ex["instructions"] + 1
    part = api(session, "/api/p/p0/export/instructions.csv", hash=ex["program_hash"], run=ex["run"],
               engines="VectorE").decode().strip().splitlines()
    assert 1 < len(part) < len(lines) and all(",VectorE," in x for x in part[1:])
    assert api(session, "/api/p/p0/export/ops.csv").decode().startswith("name,calls")


def test_summary_comes_in_two_parts_the_page_shows_apart(session):
    """The figures and rules (quick) and HTA's analyses (long on a large trace) are asked for
    apart, so the page shows the first at once; together they are the whole summary."""
    core = api(session, "/api/p/p2/summary", part="core")
    hta = api(session, "/api/p/p2/summary", part="analyses")
    assert "analyses" not in core and core["metrics"]["kernels"] == 79
    assert set(hta) == {"analyses"} and hta["analyses"]["launch_stats"]
    assert api(session, "/api/p/p2/summary") == {**core, **hta}
    with pytest.raises(ValueError, match="parameter 'part' must be one of all, core, analyses"):
        api(session, "/api/p/p2/summary", part="cards")


def test_compare_finds_the_fusion(session):
    c = api(session, "/api/compare", ids="p0,p1")
    assert [p["label"] for p in c["profiles"]] == ["naive", "fused"]
    f = c["diff"]["fusion"]
    assert f and "became 1" in f[0]["text"] and "(modeled)" in f[0]["text"]
    with pytest.raises(ValueError, match="at least two"):
        api(session, "/api/compare", ids="p0")


def test_kineto_summary_says_where_it_was_measured(session):
    s = api(session, "/api/p/p2/summary")
    assert not s["modeled"] and s["label"].startswith("measured on NVIDIA")
    assert s["metrics"]["kernels"] == 79
    lin_eid = session.get("p2").trace.sql(
        "SELECT eid FROM events WHERE kind = 'kernel' ORDER BY ts_ns LIMIT 1").fetchall()[0][0]
    hops = [h["hop"] for h in api(session, "/api/p/p2/lineage", eid=lin_eid)["hops"]]
    assert "launch" in hops and "device" in hops and "op" in hops
    assert api(session, "/api/p/p2/executions")["executions"] == []


def test_bad_parameters_name_the_parameter_and_the_fix(session):
    for path, q, msg in (("/api/p/p0/window", {"t0": "abc"}, "parameter 't0' must be an integer"),
                         ("/api/p/p0/window", {"t0": 5, "t1": 5}, "empty window"),
                         ("/api/p/p0/window", {"color": "rainbow"}, "parameter 'color' must be one of"),
                         ("/api/p/p0/window", {"lanes": "x"}, "comma-separated lane numbers"),
                         ("/api/p/p0/device", {"hash": "zz"}, "unexpected value"),
                         ("/api/p/p9/meta", {}, "no profile 'p9'; open ones, by id \\(label\\): p0 \\("),
                         ("/api/p/naive/meta", {}, "no profile 'naive'; open ones"),
                         ("/api/p/p0/nothing", {}, "no endpoint"),
                         ("/api/p/p0/event", {"eid": 123456789}, "no event with eid")):
        with pytest.raises(ValueError, match=msg) as e:
            api(session, path, **q)
        assert "(fix: " in str(e.value)


# ---- the HTTP server -----------------------------------------------------------------------
def _get(port, path, headers=None, method="GET"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request(method, path, headers=headers or {})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, dict(r.getheaders()), body


@pytest.fixture(scope="module")
def server(session):
    srv = make_server(session, "127.0.0.1", 0)
    srv.serve_in_thread()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_server_serves_the_app_and_the_api(server):
    port = server.server_address[1]
    st, h, body = _get(port, "/")
    assert st == 200 and b"tilescope explorer" in body and h["Content-Type"].startswith("text/html")
    assert "default-src 'self'" in h["Content-Security-Policy"] and h["X-Content-Type-Options"] == "nosniff"
    assert h["Referrer-Policy"] == "no-referrer" and h["Cache-Control"] == "no-store"
    st, h, body = _get(port, "/static/js/main.js")
    assert st == 200 and h["Content-Type"].startswith("text/javascript")
    st, h, body = _get(port, "/api/p/p0/window?px=100")
    assert st == 200 and body[:4] == b"TSB1"
    assert server.token is None and server.url.startswith("http://127.0.0.1:")


@pytest.mark.parametrize("path", [
    "/static/../../../../etc/passwd", "/static/..%2f..%2f..%2fpyproject.toml", "/static/%2e%2e/%2e%2e/_server.py",
    "/static//etc/passwd", "/../../etc/passwd", "/static/js/../../_server.py", "/etc/passwd", "/static/",
    "/api/p/p0/file?path=../../../../etc/passwd", "/api/p/p0/file?path=/etc/passwd",
    "/api/p/p0/file?path=executables/../../../../../etc/passwd", "/api/p/p0/file?path=%2Fetc%2Fpasswd",
    "/api/p/..%2Fp0/meta", "/api/p/p0/code?hash=../../etc&run=0",
])
def test_no_path_traversal(server, path):
    port = server.server_address[1]
    st, _h, body = _get(port, path)
    assert st in (400, 404), (path, st)
    assert b"root:" not in body and b"def make_server" not in body and b"[project]" not in body


def test_only_the_profiles_files_are_served(server, env):
    port = server.server_address[1]
    st, _h, body = _get(port, "/api/p/p0/files")
    names = [f["name"] for f in json.loads(body)["files"]]
    assert "system_trace.json" in names and "manifest.json" in names and any(n.startswith("executables/") for n in names)
    st, h, body = _get(port, "/api/p/p0/file?path=system_trace.json")
    assert st == 200 and json.loads(body)["traceEvents"] and "attachment" in h["Content-Disposition"]
    # a symlink placed inside the profile that points outside it is never served
    link = os.path.join(env["naive"], "escape.json")
    os.symlink("/etc/passwd", link)
    try:
        s2 = Session([env["naive"]], load=False)
        s2.sources[0]._collect_files()
        assert "escape.json" not in s2.sources[0].files
        assert not s2.sources[0].allowed(link)
    finally:
        os.remove(link)


def test_host_header_must_be_loopback(server):
    port = server.server_address[1]
    st, _h, body = _get(port, "/api/profiles", {"Host": "evil.example:80"})
    assert st == 403 and b"unexpected Host header" in body
    assert _get(port, "/api/profiles", {"Host": f"localhost:{port}"})[0] == 200
    assert _get(port, "/api/profiles", {"Host": f"[::1]:{port}"})[0] == 200


def test_read_only(server):
    port = server.server_address[1]
    for m in ("POST", "PUT", "DELETE"):
        st, h, _b = _get(port, "/api/profiles", method=m)
        assert st == 405 and h["Allow"] == "GET, HEAD"


def test_non_loopback_address_requires_the_token(session):
    srv = make_server(session, "0.0.0.0", 0)
    srv.serve_in_thread()
    try:
        port = srv.server_address[1]
        assert srv.token and len(srv.token) >= 24 and f"?token={srv.token}" in srv.url
        st, _h, body = _get(port, "/api/profiles")
        assert st == 403 and b"needs its token" in body
        assert _get(port, "/api/profiles?token=wrong")[0] == 403
        st, h, _b = _get(port, f"/?token={srv.token}")
        assert st == 200 and "HttpOnly" in h["Set-Cookie"] and "SameSite=Strict" in h["Set-Cookie"]
        cookie = h["Set-Cookie"].split(";")[0]
        assert _get(port, "/api/profiles", {"Cookie": cookie})[0] == 200
        assert _get(port, "/static/js/main.js", {"Cookie": "tilescope_token=nope"})[0] == 403
    finally:
        srv.shutdown()
        srv.server_close()


def test_busy_port_is_a_clear_error(server, session):
    with pytest.raises(OSError, match=r"port \d+ on 127.0.0.1 is in use; pass --port N"):
        make_server(session, "127.0.0.1", server.server_address[1])


# ---- the command line ----------------------------------------------------------------------
def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "tilescope", *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ}, **kw)


def test_cli_json_prints_what_the_page_shows(env, session):
    r = _cli("explore", env["naive"], "--json", "/api/p/p0/summary")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == api(session, "/api/p/p0/summary")
    r = _cli("explore", env["naive"], "--json", "/api/p/p0/window?px=10&t0=x")
    assert r.returncode == 1 and "parameter 't0' must be an integer" in r.stdout


def test_cli_serves_and_explains_the_ssh_tunnel(env):
    p = subprocess.Popen([sys.executable, "-m", "tilescope", "explore", env["naive"], "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        lines = []
        deadline = time.time() + 120
        while time.time() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C" in line:
                break
        out = "".join(lines)
        assert "tilescope explorer ready" in out and "http://127.0.0.1:" in out, out + p.stderr.read()
        assert "ssh -N -L " in out and "127.0.0.1" in out
        url = next(x for x in out.split() if x.startswith("http://127.0.0.1:"))
        port = urllib.parse.urlsplit(url).port
        assert _get(port, "/api/profiles")[0] == 200
    finally:
        p.terminate()
        p.wait(timeout=30)


# ---- standalone pairs, the doctor banner, the code view ----------------------------------------
def test_standalone_executable_and_instruction_trace_pair(env):
    import glob as _glob

    exe = sorted(_glob.glob(os.path.join(env["fused"], "executables", "exec_*.json")))[0]
    itr = sorted(_glob.glob(os.path.join(env["fused"], "itraces", "exec_*.itrace.json")))[0]
    s = Session([f"{exe}+{itr}", itr])
    for sid in ("p0", "p1"):
        ex = api(s, f"/api/p/{sid}/executions")["executions"]
        assert len(ex) == 1 and ex[0]["eid"] is None and ex[0]["instructions"] > 0
        head, cols = api(s, f"/api/p/{sid}/device", hash=ex[0]["program_hash"], run=ex[0]["run"])
        assert head["modeled"] and len(cols["index"]) == ex[0]["instructions"]
        assert api(s, f"/api/p/{sid}/meta")["modeled"]
    # only those files are served
    assert sorted(s.sources[0].files) == sorted([os.path.basename(exe), os.path.basename(itr)])
    assert not s.sources[1].allowed(os.path.join(env["fused"], "system_trace.json"))


def test_doctor_findings_reach_the_page(env, tmp_path):
    import shutil as _shutil

    p = str(tmp_path / "dropped")
    _shutil.copytree(env["naive"], p)
    man = os.path.join(p, "manifest.json")
    with open(man) as f:
        m = json.load(f)
    m["stats"]["dropped_events"] = {"0": 1234}
    m["config"]["max_events_per_core"] = 1000
    with open(man, "w") as f:
        json.dump(m, f)
    s = Session([p])
    doc = api(s, "/api/p/p0/meta")["doctor"]
    d = next(x for x in doc if x["code"] == "dropped-events")
    assert "1234" in d["message"] and "max_events_per_core" in d["fix"]


def test_code_view_shows_kernel_source_only_from_allowed_directories(tmp_path):
    import ml_dtypes

    import tilescope

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "matmul"))
    try:
        from matmul_kernels import matmul_naive
    finally:
        sys.path.pop(0)
    K, M, N = 256, 128, 512
    a = np.zeros((K, M), ml_dtypes.bfloat16)
    b = np.zeros((K, N), ml_dtypes.bfloat16)
    r = np.zeros((M, N), ml_dtypes.bfloat16)
    tilescope.simulate(matmul_naive, a, b, r, profile_dir=str(tmp_path / "k"), numerics=False)
    prof = next(os.path.dirname(m) for m in glob_manifests(str(tmp_path / "k")))
    with_src = Session([prof], source_dirs=[os.getcwd()])
    ex = api(with_src, "/api/p/p0/executions")["executions"][0]
    c = api(with_src, "/api/p/p0/code", hash=ex["program_hash"], run=ex["run"])
    f = next(k for k in c["files"] if k.endswith("matmul_kernels.py"))
    assert "def matmul_naive" in c["files"][f]["text"]
    text = c["files"][f]["text"].splitlines()
    mm = next(ln for ln in c["lines"] if ln["label"] == "tl.matmul")
    assert "tl.matmul" in text[mm["line"] - 1] and mm["busy_ns"].get("TensorE", 0) > 0
    assert sum(ln["instructions"] for ln in c["lines"]) == ex["instructions"]
    # without --sources the text stays out, and the page says how to show it
    bare = Session([prof])
    c2 = api(bare, "/api/p/p0/code", hash=ex["program_hash"], run=ex["run"])
    assert c2["files"][f]["text"] is None and "--sources" in c2["files"][f]["note"]
    # a provenance path never leaves the allowed directories
    from tilescope.explorer._device_view import _read_source

    assert _read_source("../../../../../etc/passwd", [str(tmp_path)]) == (None, None)
    assert _read_source("/etc/passwd", [str(tmp_path)]) == (None, None)


def glob_manifests(root):
    import glob as _glob

    return _glob.glob(os.path.join(root, "**", "manifest.json"), recursive=True)
