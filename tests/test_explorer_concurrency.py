"""The explorer never blocks: a slow request holds nothing the others need, a parent event's
lifecycle is bounded and paged, a request whose client went away is cancelled on the server,
and one request cannot ask for unbounded work. On a real CUDA trace (HTA's test data)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time

import numpy as np
import pytest

from tilescope.explorer import Session, api
from tilescope.explorer._server import make_server

KINETO = os.path.join(os.path.dirname(__file__), "data", "kineto")
CONTROL = os.path.join(KINETO, "cuda_trace_diff_control.json.gz")
BUDGET_MS = 200  # server time of an interaction (issue budget, p95)


@pytest.fixture(scope="module")
def cuda(tmp_path_factory):
    old = os.environ.get("TILESCOPE_CACHE_DIR")
    os.environ["TILESCOPE_CACHE_DIR"] = str(tmp_path_factory.mktemp("explorer-conc") / "cache")
    s = Session([f"control={CONTROL}", f"again={CONTROL}"])
    srv = make_server(s, "127.0.0.1", 0)
    srv.serve_in_thread()
    yield s, srv
    srv.shutdown()
    srv.server_close()
    if old is None:
        os.environ.pop("TILESCOPE_CACHE_DIR", None)
    else:
        os.environ["TILESCOPE_CACHE_DIR"] = old


def _get(port, path, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t = time.perf_counter()
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    wall = (time.perf_counter() - t) * 1e3
    timing = r.getheader("Server-Timing") or ""
    server_ms = float(timing.split("dur=")[1]) if "dur=" in timing else None
    c.close()
    return r.status, body, server_ms, wall


def _step_ref(src, name="ProfilerStep#1011"):
    ix = src.index
    return int(np.flatnonzero(ix.name == ix.names.index(name))[0])


def test_a_step_parents_lifecycle_is_its_launches_paged_and_fast(cuda):
    s, srv = cuda
    src = s.sources[0]
    ix = src.index
    ref = _step_ref(src)
    port = srv.server_address[1]
    status, body, ms, _wall = _get(port, f"/api/p/p0/lineage?ref={ref}")  # took 285 s before
    assert status == 200, body
    lin = json.loads(body)
    assert lin["shape"] == "launches" and lin["total"] > 100 and lin["pages"] > 1
    assert ms < 5 * BUDGET_MS  # the first answer reads a cold index; the budget is checked below
    times = [_get(port, f"/api/p/p0/lineage?ref={ref}&page={p}")[2] for p in range(5)]
    assert sorted(times)[-2] < BUDGET_MS, times
    hops = lin["hops"]
    me = next(h for h in hops if h["hop"] == "self")
    assert me["name"] == "ProfilerStep#1011"
    launches = [h for h in hops if h["hop"] == "launch"]
    assert len(launches) == lin["per_page"]
    for la in launches:  # nested in the step on its thread, each with the op that made it
        assert la["lane"] == me["lane"] and me["start_ns"] <= la["start_ns"] <= me["start_ns"] + me["dur_ns"]
        cause = hops[la["after"]]
        assert cause["hop"] in ("op", "self") and la["delay_ns"] >= 0
    for d in (h for h in hops if h["hop"] == "device"):
        assert hops[d["after"]]["hop"] == "launch"
    # every page together: each launch once, in time order
    seen = []
    for p in range(lin["pages"]):
        page = api(s, "/api/p/p0/lineage", ref=ref, page=p)
        seen += [h["ref"] for h in page["hops"] if h["hop"] == "launch"]
    assert len(seen) == len(set(seen)) == lin["total"]
    starts = ix.start[np.asarray(seen)]
    assert (np.diff(starts) >= 0).all()
    # the step's links found by binary search over start times are those a scan of every link finds
    for col in ("launch", "op"):
        scan = np.flatnonzero(ix.inside(ref, getattr(ix, f"lk_{col}")))
        assert np.array_equal(ix.links_inside(ref, col), scan) and (col == "op" or scan.size == lin["total"])


def test_a_kernels_chain_matches_the_engine_and_orders_hops_by_cause(cuda):
    s, _srv = cuda
    src = s.sources[0]
    ix = src.index
    k = next(i for i, n in enumerate(ix.names) if n.startswith("void cutlass"))
    ref = int(np.flatnonzero(ix.name == k)[0])
    lin = api(s, "/api/p/p0/lineage", ref=ref)
    assert lin["shape"] == "chain"
    kinds = [h["hop"] for h in lin["hops"]]
    assert kinds[-3:] == ["op", "launch", "device"] and kinds[0] == "parent"
    want = src.trace.lineage(int(ix.eid[ref]))
    assert [h["eid"] for h in lin["hops"]] == [h["eid"] for h in want]
    launch, dev = lin["hops"][-2], lin["hops"][-1]
    assert lin["hops"][launch["after"]]["hop"] == "op" and launch["delay_ns"] >= 0
    assert dev["after"] == len(lin["hops"]) - 2 and dev["delay_ns"] == dev["start_ns"] - launch["start_ns"]


def test_a_slow_request_blocks_nothing(cuda, monkeypatch):
    """The reproduction of the hang: while one request computes for seconds (a summary held
    the trace's only lock before), /meta, /window, /event and a lifecycle still answer
    within their budget."""
    s, srv = cuda
    import tilescope.explorer._api as A

    started, release = threading.Event(), threading.Event()
    real = A.summary_core

    def slow_summary(trace, allowed):
        started.set()
        trace.sql("SELECT count(*) FROM events").fetchall()  # it holds an engine connection
        release.wait(30)
        return real(trace, allowed)

    monkeypatch.setattr(A, "summary_core", slow_summary)
    monkeypatch.setattr(s.sources[1].results, "store_dir", None)
    port = srv.server_address[1]
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", _get(port, "/api/p/p1/summary?part=core")))
    th.start()
    assert started.wait(60)
    src = s.sources[1]
    ref = _step_ref(src)
    span = src.index.span_ns
    try:
        for path in ("/api/p/p1/meta", f"/api/p/p1/window?t0=0&t1={span}&px=2000",
                     f"/api/p/p1/window?t0={span // 3}&t1={span // 3 + span // 50}&px=2000",
                     f"/api/p/p1/event?ref={ref}", f"/api/p/p1/lineage?ref={ref}", "/api/p/p1/meta",
                     f"/api/p/p1/event?ref={ref + 1}", f"/api/p/p1/match?q=cutlass&t={span // 2}"):
            status, body, ms, wall = _get(port, path, timeout=10)
            assert status == 200, body
            assert ms < 3 * BUDGET_MS and wall < 2000, (path, ms, wall)
        assert th.is_alive()  # the slow request was still running all along
    finally:
        release.set()
        th.join(60)
    assert out["r"][0] == 200


def test_an_abandoned_request_is_cancelled_on_the_server(cuda, monkeypatch):
    s, srv = cuda
    import tilescope.explorer._api as A

    state = {"interrupted": False, "started": threading.Event()}

    def endless(trace, allowed):
        state["started"].set()
        try:  # a query that would run for minutes: interrupted when the client leaves
            trace.con.execute("SELECT sum(i) FROM range(20000000000) t(i)").fetchall()
        except Exception as e:  # duckdb.InterruptException
            state["interrupted"] = "interrupt" in type(e).__name__.lower() or "interrupt" in str(e).lower()
            raise
        return {}

    monkeypatch.setattr(A, "summary_core", endless)
    res = s.sources[0].results
    monkeypatch.setattr(res, "store_dir", None)  # computed afresh, not read from an earlier test's answer
    res._done.pop("summary-core", None)
    port = srv.server_address[1]
    before = srv.cancelled
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"GET /api/p/p0/summary?part=core HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert state["started"].wait(60)
    sock.close()  # the browser aborted the fetch
    deadline = time.time() + 20
    while time.time() < deadline and not state["interrupted"]:
        time.sleep(0.05)
    assert srv.cancelled == before + 1
    assert state["interrupted"], "the running query was not interrupted"
    assert s.sources[0].results.interrupted >= 1
    # nothing was kept: the next request computes again (and answers)
    monkeypatch.setattr(A, "summary_core", lambda trace, allowed: {"ok": 1})
    assert api(s, "/api/p/p0/summary", part="core") == {"ok": 1}


@pytest.mark.parametrize("path, message", [
    ("/api/p/p0/window?t0=0&t1=inf", "must be a finite integer"),
    ("/api/p/p0/window?t0=-inf&t1=5", "must be a finite integer"),
    ("/api/p/p0/window?t0=0&t1=nan", "must be a finite integer"),
    ("/api/p/p0/select?t0=0&t1=1e30", "is outside [-2^62, 2^62]"),
    ("/api/p/p0/select?t0=0&t1=99999999999999999999", "is outside [-2^62, 2^62]"),
    ("/api/p/p0/window?t0=0&t1=100&px=-60", "'px' = -60 is outside [1, 100000]"),
    ("/api/p/p0/lineage?ref=0&per_page=100000", "'per_page' = 100000 is outside"),
    ("/api/compare?ids=" + ",".join(["p0"] * 100), "compare of 100 profiles asked; one request compares at most 8"),
    ("/api/compare?ids=p0,p0", "p0 is listed more than once"),
])
def test_out_of_range_requests_are_400_with_the_limit(cuda, path, message):
    _s, srv = cuda
    t = time.perf_counter()
    status, body, _ms, _wall = _get(srv.server_address[1], path)
    assert status == 400, body
    err = json.loads(body)
    assert message in err["error"] and err["fix"]
    assert time.perf_counter() - t < 2  # refused at once (100 copies of one id took 20 s)
