"""The background analyses run in worker processes at a lower priority than the server, and
every comparison is made from each source's part, computed once: a pair compared for the
first time costs only the combination."""

from __future__ import annotations

import json
import os
import time

import pytest

import tilescope.trace as tt
from tilescope.explorer import Session
from tilescope.explorer import _api as api
from tilescope.explorer import _offload

KINETO = os.path.join(os.path.dirname(__file__), "data", "kineto")
A = os.path.join(KINETO, "cuda_alexnet_small.json.gz")
B = os.path.join(KINETO, "cuda_triton_tiny.json.gz")
C = os.path.join(KINETO, "cpu_only_tiny.json.gz")


def _warm(session, timeout=240):
    t = time.monotonic()
    while any(s.results._jobs for s in session.sources) or session.results._jobs:
        assert time.monotonic() - t < timeout, "the background analyses did not finish"
        time.sleep(0.05)


def _json(session, path, **q):
    r = api.handle(session, path, {k: [str(v)] for k, v in q.items()})
    assert r.status == 200, r.body[:300]
    return json.loads(r.body)


@pytest.fixture(scope="module")
def warmed(module_cache_dir):
    s = Session([f"alexnet={A}", f"triton={B}", f"cpu={C}"])
    s.warm_up()
    _warm(s)
    return s


def test_the_analyses_run_in_lower_priority_worker_processes(warmed):
    procs = [p for p in _offload._procs if p.poll() is None]
    assert procs, "no worker process ran the analyses"
    assert all(p.pid != os.getpid() for p in procs)
    if hasattr(os, "getpriority"):
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert all(os.getpriority(os.PRIO_PROCESS, p.pid) >= mine + 1 for p in procs)
    for src in warmed.sources:
        done = src.results._done
        for key in [("ops", False), "summary-core", "kernels", "breakdown", "roofline", "summary-analyses", "diff-profile"]:
            assert key in done, (src.label, key)
        # kept on disk by the worker: a second session answers at once
        assert os.path.exists(os.path.join(src.results.store_dir, "summary-analyses.json"))


def test_a_workers_answer_is_the_servers_own(warmed):
    """The answers computed in the workers equal the same analyses computed in the server."""
    src = warmed.sources[0]
    for name in ("ops", "kernels", "summary-core", "diff-profile"):
        key, _store, how = api.NAMED[name]
        here = json.loads(api.to_json(how(src.trace, src.label_text(), src.allowed)))
        there = json.loads(api.to_json(src.results.peek(key)))
        if name == "summary-core":  # the engine's notes grow as a trace is analysed (the banner reads them live)
            assert set(there.pop("notes")) <= set(here.pop("notes"))
        assert there == here, name


def test_a_pair_compared_for_the_first_time_reuses_each_sources_part(warmed):
    for s in warmed.sources:
        assert "diff-profile" in s.results._done
    before = {s.id: s.results._done["diff-profile"] for s in warmed.sources}
    got = _json(warmed, "/api/compare", ids="p2,p0")  # not warmed: the session warms p0,p1,p2
    # made from the parts kept (the same objects: nothing computed again) ...
    assert all(warmed.sources[i].results._done["diff-profile"] is before[f"p{i}"] for i in range(3))
    # ... and the same diff as the traces' own
    ref = tt.diff(warmed.sources[2].trace, warmed.sources[0].trace, names=["cpu", "alexnet"]).to_dict()
    assert got["diff"] == json.loads(api.to_json(ref))


def test_without_processes_the_analyses_warm_on_threads(module_cache_dir):
    s = Session([f"triton={B}"])
    for src in s.sources:  # answers the module's other session kept on disk are not reused
        src.results.store_dir = None
    n = len(_offload._procs)
    s.warm_up(processes=False)
    _warm(s)
    assert len(_offload._procs) == n
    assert "summary-analyses" in s.sources[0].results._done


def test_a_request_takes_back_an_analysis_still_queued_for_a_worker(tmp_path):
    """A small source's analysis queued behind a large one's is computed at once when a
    request asks for it, instead of after the queue."""
    import concurrent.futures as cf

    from tilescope.explorer._work import Results

    r = Results(str(tmp_path))
    queued = cf.Future()  # a worker never takes it
    assert r.warm_elsewhere("k", lambda: queued, store="k")
    t = time.monotonic()
    assert r.get("k", lambda job: 42, store="k") == 42
    assert time.monotonic() - t < 5 and queued.cancelled()
    assert r.peek("k") == 42 and not r._jobs
    # a job a worker already runs is waited for, not computed again
    running = cf.Future()
    running.set_running_or_notify_cancel()
    assert r.warm_elsewhere("j", lambda: running)
    got = []
    th = __import__("threading").Thread(target=lambda: got.append(r.get("j", lambda job: "here")))
    th.start()
    time.sleep(0.2)
    running.set_result("there")
    th.join(5)
    assert got == ["there"] and r.peek("j") == "there"
