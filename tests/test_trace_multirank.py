"""Past one machine: per-rank ingest in parallel into the hive Parquet layout, and the
cross-rank analyses on DuckDB and on a local Dask cluster giving the same answer.

The rank set is generated (tests/kineto_synth.make_rank_trace): a data-parallel job whose
rank 2 computes 1.5x slower, so every other rank waits for it in the all-reduce. Every figure
below follows from the generator's constants."""

from __future__ import annotations

import json
import os
import warnings

import pytest

import kineto_synth as ks
from tilescope.trace import _multirank as mr

WORLD, STEPS, KERNELS, SLOW = 4, 3, 4, 2
US = 1000  # ns per microsecond


def _write_ranks(d, world=WORLD, *, same_rank: bool = False, overlap_rank: int | None = 1) -> list[str]:
    paths = []
    for r in range(world):
        t = ks.make_rank_trace(r, world, steps=STEPS, kernels=KERNELS, slow_rank=SLOW)
        if same_rank:
            t["distributedInfo"]["rank"] = 0
        if r == overlap_rank:  # a collective on stream 13 while the first step's first kernel runs
            t["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_Broadcast", "pid": 1,
                                     "tid": 13, "ts": 1_000_050.0, "dur": 10.0, "args": {"stream": 13}})
        paths.append(ks.write(os.path.join(d, f"rank{r}.json.gz"), t))
    return paths


def _expected(r: int) -> dict:
    k_us = ks.KERNEL_US * (1.5 if r == SLOW else 1.0)
    compute = STEPS * KERNELS * k_us
    # the all-reduce ends for everyone when the slow rank arrives + ALLREDUCE_US
    comm = STEPS * (KERNELS * ks.KERNEL_US * 1.5 - KERNELS * k_us + ks.ALLREDUCE_US)
    overlap = 10.0 if r == 1 else 0.0
    return {"compute_ns": compute * US, "communication_ns": (comm + overlap) * US, "overlap_ns": overlap * US,
            "active_ns": (compute + comm) * US}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILESCOPE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranks")
    paths = _write_ranks(str(d))
    out = str(d / "layout")
    ranks = mr.ingest_ranks(paths, out, workers=2)
    return {"paths": paths, "out": out, "ranks": ranks}


@pytest.fixture(scope="module")
def dask_client():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


def test_parallel_ingest_writes_the_hive_layout(layout):
    out = layout["out"]
    assert layout["ranks"] == list(range(WORLD))
    assert sorted(os.listdir(os.path.join(out, "events"))) == [f"rank={r}" for r in range(WORLD)]
    for r in range(WORLD):
        assert any(f.endswith(".parquet") for f in os.listdir(os.path.join(out, "events", f"rank={r}")))
        with open(os.path.join(out, "ranks", f"rank={r}.json")) as f:
            info = json.load(f)
        assert info["rank"] == r and info["source"] == os.path.abspath(layout["paths"][r]) and info["events"] > 0
    assert not os.path.exists(os.path.join(out, "_staging"))  # the workers' staging folders are gone


def test_duckdb_metrics_follow_the_generator(layout):
    rows = mr.rank_metrics(layout["out"]).to_pylist()
    assert [r["rank"] for r in rows] == list(range(WORLD))
    for row in rows:
        exp = _expected(row["rank"])
        assert row["steps"] == STEPS
        for k, v in exp.items():
            assert row[k] == pytest.approx(v, abs=1), (row["rank"], k)
        assert row["memory_ns"] == 0
        assert row["non_compute_ns"] == row["active_ns"] - row["compute_ns"]
        assert row["idle_ns"] == row["device_span_ns"] - row["active_ns"] > 0


def test_duckdb_metrics_equal_the_single_machine_analyses(layout):
    """The layout's per-rank figures are the ones ``Trace.temporal_breakdown`` / ``comm_comp_overlap``
    give on the same traces opened together."""
    import tilescope.trace as tt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = tt.open(layout["paths"])
    tb = {r["rank"]: r for r in t.temporal_breakdown().to_pylist()}
    ov = {r["rank"]: r for r in t.comm_comp_overlap().to_pylist()}
    for row in mr.rank_metrics(layout["out"]).to_pylist():
        r = row["rank"]
        assert (row["device_span_ns"], row["idle_ns"], row["compute_ns"], row["non_compute_ns"]) == \
            (tb[r]["span_ns"], tb[r]["idle_ns"], tb[r]["compute_ns"], tb[r]["non_compute_ns"])
        assert (row["communication_ns"], row["overlap_ns"]) == (ov[r]["communication_ns"], ov[r]["overlapped_ns"])


@pytest.mark.slow
def test_dask_cluster_gives_the_same_answer(layout, dask_client):
    duck = mr.rank_metrics(layout["out"], engine="duckdb")
    dask = mr.rank_metrics(layout["out"], engine="dask", client=dask_client)
    assert dask.schema == duck.schema
    assert dask.to_pylist() == duck.to_pylist()
    a = mr.cross_rank(layout["out"], engine="duckdb")
    b = mr.cross_rank(layout["out"], engine="dask", client=dask_client)
    assert {k: v for k, v in a.items() if k not in ("engine", "ranks")} == \
        {k: v for k, v in b.items() if k not in ("engine", "ranks")}


@pytest.mark.slow
def test_parallel_ingest_on_a_dask_cluster(tmp_path, dask_client, layout):
    out = str(tmp_path / "layout")
    assert mr.ingest_ranks(layout["paths"], out, client=dask_client) == list(range(WORLD))
    assert mr.rank_metrics(out).to_pylist() == mr.rank_metrics(layout["out"]).to_pylist()


def test_cross_rank_names_the_straggler(layout):
    x = mr.cross_rank(layout["out"])
    # every rank's step ends with the all-reduce, so step times agree: the slow rank shows as
    # the one that waits least in the collective
    assert x["step_time"]["min_ns"] == x["step_time"]["max_ns"]
    assert [(s["rank"], s["reason"]) for s in x["stragglers"]] == [(SLOW, "late to collectives")]
    skew = x["comm_wait_skew"]
    assert (skew["min_rank"], skew["max_rank"]) == (SLOW, 1)
    assert skew["skew_ns"] == pytest.approx(_expected(1)["communication_ns"] - _expected(SLOW)["communication_ns"])


def test_export_parquet_is_the_same_layout(layout, tmp_path):
    import tilescope.trace as tt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = tt.open(layout["paths"]).export_parquet(str(tmp_path / "export"))
    assert mr.rank_metrics(out).to_pylist() == mr.rank_metrics(layout["out"]).to_pylist()


def test_files_claiming_one_rank_are_numbered_by_position(tmp_path, monkeypatch):
    _write_ranks(str(tmp_path), world=3, same_rank=True, overlap_rank=None)
    monkeypatch.chdir(tmp_path)  # relative names: the rank files record absolute ones (for cluster workers)
    paths, out = [f"rank{r}.json.gz" for r in range(3)], "layout"
    assert mr.ingest_ranks(paths, out, workers=1) == [0, 1, 2]
    with open(os.path.join(out, "ranks", "rank=2.json")) as f:
        info = json.load(f)
    assert any("several files claim rank [0]" in w and "rank2.json.gz is rank 2" in w for w in info["warnings"])
    assert info["source"] == str(tmp_path / "rank2.json.gz")
    assert [r["rank"] for r in mr.rank_metrics(out).to_pylist()] == [0, 1, 2]


def test_errors_name_the_problem(layout, tmp_path):
    with pytest.raises(FileExistsError, match="already holds a layout"):
        mr.ingest_ranks(layout["paths"], layout["out"])
    with pytest.raises(FileNotFoundError, match="no such trace file"):
        mr.ingest_ranks([str(tmp_path / "missing.json")], str(tmp_path / "x"))
    with pytest.raises(FileNotFoundError, match="no events/ folder"):
        mr.rank_metrics(str(tmp_path))
    with pytest.raises(ValueError, match="engine must be 'duckdb' or 'dask'"):
        mr.rank_metrics(layout["out"], engine="spark")
    with pytest.raises(ValueError, match="straggler_threshold=-1"):
        mr.cross_rank(layout["out"], straggler_threshold=-1)


def test_cli_ingests_and_reports(layout, tmp_path, capsys):
    from tilescope.cli import main

    out = str(tmp_path / "layout")
    folder = os.path.dirname(layout["paths"][0])  # a folder of per-rank traces
    assert main(["ranks", "ingest", out, folder, "--workers", "1"]) == 0
    assert f"{WORLD} ranks (0..{WORLD - 1})" in capsys.readouterr().out
    assert main(["ranks", "report", out, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["engine"] == "duckdb" and [r["rank"] for r in d["ranks"]] == list(range(WORLD))
    assert [(s["rank"], s["reason"]) for s in d["stragglers"]] == [(SLOW, "late to collectives")]
    assert main(["ranks", "report", out]) == 0
    text = capsys.readouterr().out
    assert f"straggler: rank {SLOW}, late to collectives" in text and "communication wait skew" in text
    assert main(["ranks", "report", out, "--scheduler", "tcp://127.0.0.1:1"]) == 2
    assert "--engine dask" in capsys.readouterr().err
    assert main(["ranks", "ingest", out, folder]) == 2
    assert "already holds a layout" in capsys.readouterr().err


def test_a_rank_without_events_is_a_row_on_both_engines(tmp_path):
    t = ks.make_rank_trace(0, 2, steps=1, kernels=2)
    empty = {"schemaVersion": 1, "distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": []}
    paths = [ks.write(str(tmp_path / "r0.json"), t), ks.write(str(tmp_path / "r1.json"), empty)]
    out = str(tmp_path / "layout")
    assert mr.ingest_ranks(paths, out, workers=1) == [0, 1]
    rows = mr.rank_metrics(out).to_pylist()
    assert [(r["rank"], r["events"] > 0, r["steps"], r["active_ns"]) for r in rows] == \
        [(0, True, 1, rows[0]["active_ns"]), (1, False, 0, 0)]
    assert rows == [mr.rank_metrics_of_table(r, tbl) for r, tbl in
                    ((0, mr._rank_table(os.path.join(out, "events", "rank=0"))),
                     (1, mr._rank_table(os.path.join(out, "events", "rank=1"))))]
