"""Jobs past one machine: time against the number of ranks, DuckDB and a local Dask cluster.

    .venv/bin/python benchmarks/multirank.py [--ranks 8,16,32,64] [--steps 10] [--kernels 500]
                                             [--repeats 3] [--dask-workers 2] [--workdir DIR]

For each rank count, writes that many per-rank Kineto traces of a data-parallel job
(tests/kineto_synth.make_rank_trace: per step ``--kernels`` compute kernels and their launches,
then an all-reduce; rank 1 computes 1.5x slower), then measures

* **ingest**: ``tilescope.trace.ingest_ranks`` into the hive layout, one local process per CPU;
* **duckdb**: ``rank_metrics(layout, engine="duckdb")`` (the embedded engine, one process);
* **dask**: ``rank_metrics(layout, engine="dask", client=...)`` on a ``LocalCluster`` of
  ``--dask-workers`` processes started once beforehand (its start-up is printed on its own line);

each a loop mean over ``--repeats`` runs (ingest: one run, it writes the layout), and checks
that both engines return the same table and name rank 1 as the straggler. On one machine Dask
pays for its scheduler and for moving each rank's result between processes; what it buys is
that the same call runs on a cluster of machines (docs/trace-analysis.md). Every time printed
is wall-clock time measured on the machine running this script.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # kineto_synth: the public Kineto format's writer


def _mean_time(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.fmean(times), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="8,16,32,64", help="comma-separated rank counts")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kernels", type=int, default=500, help="compute kernels per step")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dask-workers", type=int, default=2)
    ap.add_argument("--workdir", help="keep the traces and layouts here (default: a temporary folder)")
    a = ap.parse_args(argv)
    counts = [int(x) for x in a.ranks.split(",")]

    import kineto_synth as ks
    from distributed import Client, LocalCluster

    from tilescope.trace import _multirank as mr

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    work = a.workdir or tempfile.mkdtemp(prefix="tilescope-multirank-")
    t = time.perf_counter()
    cluster = LocalCluster(n_workers=a.dask_workers, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = Client(cluster)
    print(f"dask LocalCluster: {a.dask_workers} worker processes, started in {time.perf_counter() - t:.2f} s (not counted below)")
    print(f"{'ranks':>5} {'events':>10} {'trace MB':>9} {'ingest s':>9} {'duckdb s':>9} {'dask s':>9} "
          f"{'duckdb ms/rank':>15} {'dask ms/rank':>13} {'dask/duckdb':>11}")
    try:
        for n in counts:
            d = os.path.join(work, f"r{n}")
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            paths = [ks.write(os.path.join(d, f"rank{r}.json"),
                              ks.make_rank_trace(r, n, steps=a.steps, kernels=a.kernels, slow_rank=1), indent=None)
                     for r in range(n)]
            mb = sum(os.path.getsize(p) for p in paths) / 1e6
            layout = os.path.join(d, "layout")
            t = time.perf_counter()
            mr.ingest_ranks(paths, layout)
            t_ingest = time.perf_counter() - t
            t_duck, duck = _mean_time(lambda: mr.rank_metrics(layout, engine="duckdb"), a.repeats)
            t_dask, dask = _mean_time(lambda: mr.rank_metrics(layout, engine="dask", client=client), a.repeats)
            if dask.to_pylist() != duck.to_pylist():
                raise SystemExit(f"{n} ranks: the engines disagree")
            x = mr.cross_rank(layout)
            if [(s["rank"], s["reason"]) for s in x["stragglers"]] != [(1, "late to collectives")]:
                raise SystemExit(f"{n} ranks: straggler not found: {x['stragglers']}")
            events = sum(duck.column("events").to_pylist())
            print(f"{n:>5} {events:>10,} {mb:>9.1f} {t_ingest:>9.2f} {t_duck:>9.3f} {t_dask:>9.3f} "
                  f"{1e3 * t_duck / n:>15.2f} {1e3 * t_dask / n:>13.2f} {t_dask / t_duck:>11.2f}")
            if not a.workdir:
                shutil.rmtree(d, ignore_errors=True)
    finally:
        client.close()
        cluster.close()
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print("same table from both engines and rank 1 named the straggler at every rank count")
    return 0


if __name__ == "__main__":
    sys.exit(main())
