"""Ingest speed and memory: tilescope.trace against HolisticTraceAnalysis 0.5.0, and 1 GB throughput.

    .venv/bin/python benchmarks/ingest_vs_hta.py [--skip-hta] [--gb 1.0] [--repeats 3] [--workdir DIR]

1. Every committed trace of 15 MB or more (decompressed first so neither tool pays for gzip:
   the CUDA traces tests/data/kineto/cuda_trace_diff_{control,test}.json.gz and the MTIA trace
   benchmarks/data/mtia_rank_0.json.gz) is loaded by HTA's ``TraceAnalysis`` in a separate
   virtualenv this script creates (``~/.cache/tilescope/hta-0.5.0-venv``, pip install
   holistictraceanalysis==0.5.0), and by ``tilescope.trace.open`` into an empty cache followed
   by the first ``op_table()``. Each run is a fresh process; the runs of the two tools
   alternate (``--repeats`` each; loop means). The time is the whole job from the first
   import to the answer (imports included: a user pays them): for HTA, imports + load; for
   tilescope, imports + open + first op table, each phase printed; both import from cached
   bytecode, as installed packages do (one untimed warm-up run each). Memory is the process's
   peak RSS (imports included for both). Targets: tilescope >= 10x faster, <= 1/3 of HTA's
   peak memory. CPU time is printed too (it moves less with the machine's load than wall time).
   On the 35 MB control trace HTA's per-stream busy time, category counts and top kernels
   are printed next to tilescope's: they are the cross-check behind the constants in
   tests/test_trace_kineto.py; the DuckDB-JSON fallback (used when the C parser is not built)
   is timed once.
2. A ~1 GB synthetic trace made by replicating the control trace's events (times, ids and
   correlation ids shifted per copy) is ingested the same way. Targets: >= 100 MB/s, peak RSS <= 2 GB.

Every time printed is wall-clock time measured on the machine running this script.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HTA_VENV = os.path.join(os.path.expanduser("~"), ".cache", "tilescope", "hta-0.5.0-venv")

TRACES = [  # every committed trace >= 15 MB decompressed (name, gzip file)
    ("cuda_trace_diff_control", os.path.join(ROOT, "tests", "data", "kineto", "cuda_trace_diff_control.json.gz")),
    ("cuda_trace_diff_test", os.path.join(ROOT, "tests", "data", "kineto", "cuda_trace_diff_test.json.gz")),
    ("mtia_rank_0", os.path.join(ROOT, "benchmarks", "data", "mtia_rank_0.json.gz")),
]

# Both children measure the same way: the clock starts before the first import; the job's wall
# and CPU time to the answer; the process's peak RSS (imports included) and its RSS after imports.
# The peak is the process's own VmHWM: getrusage's ru_maxrss also counts the parent's memory
# at the time of the spawn on Linux (it survives exec), which made the first run after
# building the synthetic trace report the builder's ~230 MB.
_MEASURE = textwrap.dedent(r"""
    import time
    T0 = time.perf_counter()
    import json, resource, sys, warnings
    def status(field):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    def measured(load):
        base = status("VmRSS")
        c0 = cpu()
        t = time.perf_counter()
        result = load()
        dt = time.perf_counter() - t
        return result, {"seconds": dt, "cpu_s": cpu() - c0, "peak_rss": status("VmHWM"), "base_rss": base,
                        "import_s": t - T0}
""")

_HTA_CHILD = _MEASURE + textwrap.dedent(r"""
    import logging
    logging.disable(logging.WARNING); warnings.filterwarnings("ignore")
    from hta.trace_analysis import TraceAnalysis
    ta, out = measured(lambda: TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True))
    out.update(job_s=time.perf_counter() - T0, job_cpu_s=cpu())
    if len(sys.argv) > 2:  # the cross-check figures (after the measurement)
        tr = ta.t
        rank = list(tr.get_all_traces())[0]
        df = tr.get_trace(rank)
        sym = tr.symbol_table.get_sym_table()
        cats = {}
        for c in df["cat"]:
            cats[sym[c]] = cats.get(sym[c], 0) + 1
        streams = {}
        for s, g in df[df["stream"] >= 0].groupby("stream"):
            iv = sorted(zip(g["ts"].tolist(), (g["ts"] + g["dur"]).tolist()))
            busy, cs, ce = 0, None, None
            for a, b in iv:
                if ce is None or a > ce:
                    if ce is not None:
                        busy += ce - cs
                    cs, ce = a, b
                else:
                    ce = max(ce, b)
            busy += ce - cs
            streams[str(int(s))] = [len(g), int(busy)]
        k = df[df["cat"].map(lambda c: sym[c] == "kernel")]
        top = k.groupby("name")["dur"].agg(["sum", "count"]).sort_values("sum", ascending=False).head(3)
        kernels = [[sym[n][:40], int(r["count"]), int(r["sum"])] for n, r in top.iterrows()]
        tb = ta.get_temporal_breakdown(visualize=False)
        out.update(rank=int(rank), rows=len(df), cats=cats, streams=streams, top_kernels=kernels,
                   kernel_time_us=int(tb["kernel_time(us)"].iloc[0]), idle_time_us=int(tb["idle_time(us)"].iloc[0]))
    print(json.dumps(out))
""")

_TS_CHILD = _MEASURE + textwrap.dedent(r"""
    warnings.filterwarnings("ignore")
    import tilescope.trace as tt
    # every module open() uses, imported before its timing (the import time is reported apart)
    from tilescope.trace import _trace, _store, _ingest, _jsonscan, _native_ingest, _parquet  # noqa: F401
    tr, out = measured(lambda: tt.open(sys.argv[1], progress=False))
    out.update(events=tr.meta[0]["ingest"]["events"], mode=tr.meta[0]["ingest"]["mode"])
    # the first op table reads the columns with pyarrow, derives the lanes table and the nesting
    # (no database: DuckDB starts with the first SQL query, the cross-check below)
    t = time.perf_counter()
    tr.op_table()
    out["first_query_s"] = time.perf_counter() - t
    out.update(job_s=time.perf_counter() - T0, job_cpu_s=cpu(), peak_rss_after_query=status("VmHWM"))
    if len(sys.argv) > 2:
        out["ranks"] = tr.ranks
        out["cats"] = dict(tr.sql("SELECT cat, count(*) FROM events WHERE ph = 'X' GROUP BY cat").fetchall())
        out["streams"] = {r["tid"]: [r["events"], r["busy_ns"] // 1000] for r in tr.breakdown().to_pylist()}
        out["top_kernels"] = [[r["name"][:40], r["calls"], r["total_ns"] // 1000]
                              for r in tr.kernels().to_pylist() if r["kind"] == "kernel"][:3]
        rs = tr.ranks_summary().to_pylist()[0]
        out["kernel_time_us"] = rs["device_span_ns"] // 1000
        out["idle_time_us"] = rs["device_idle_ns"] // 1000
    print(json.dumps(out))
""")


def _run_child(python: str, code: str, *args: str, env=None) -> dict:
    p = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"child failed ({python}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def ensure_hta_venv() -> str:
    py = os.path.join(HTA_VENV, "bin", "python")
    ok = os.path.exists(py) and subprocess.run([py, "-c", "import hta"], capture_output=True).returncode == 0
    if not ok:
        print(f"creating {HTA_VENV} with holistictraceanalysis==0.5.0 (one-time, needs pip) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", HTA_VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "--quiet", "holistictraceanalysis==0.5.0"], check=True)
    return py


def synthesize(src_json: str, dst: str, target_bytes: int) -> int:
    """Replicate the events of ``src_json`` (Kineto pretty format) until ``dst`` is ~target_bytes."""
    with open(src_json, "rb") as f:
        text = f.read()
    start = text.index(b'"traceEvents"')
    start = text.index(b"[", start) + 1
    end = text.rindex(b"]")
    head, body, tail = text[:start], text[start:end].strip().rstrip(b","), text[end:]
    span_us = 10_000_000  # each copy starts 10 s after the previous one
    ts_re = re.compile(rb'("ts": )(\d+)')
    id_re = re.compile(rb'("(?:correlation|External id|id)": )(\d+)')
    copies = max(1, target_bytes // len(body))
    with open(dst, "wb") as out:
        out.write(head + b"\n  ")
        for k in range(copies):
            chunk = ts_re.sub(lambda m: m.group(1) + str(int(m.group(2)) + k * span_us).encode(), body)
            chunk = id_re.sub(lambda m: m.group(1) + str(int(m.group(2)) + k * 100_000_000).encode(), chunk)
            out.write(chunk)
            out.write(b",\n  " if k < copies - 1 else b"\n")
        out.write(tail)
    return os.path.getsize(dst)


def _as_installed(env: dict, work: str) -> dict:
    """``env`` for a child that imports from cached bytecode, as an installed package does
    (pip compiles it at install time; HTA's venv has it): with PYTHONDONTWRITEBYTECODE set, as
    on some CI machines, tilescope's modules would be compiled from source in every run while
    HTA's and its libraries' never are. The cache is a folder of the work dir."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(work, "pycache")
    return env


def _alternating(tools: dict, repeats: int) -> dict[str, list[dict]]:
    """``repeats`` fresh runs of each tool (``name -> (python, code, args, env)``), the tools
    alternating so that a change in the machine's load hits both; an empty cache per run.
    One untimed run of each first: the bytecode cache and the OS's file cache warm for both."""
    runs: dict[str, list[dict]] = {k: [] for k in tools}
    for python, code, args, env in tools.values():
        if "TILESCOPE_CACHE_DIR" in env:
            shutil.rmtree(env["TILESCOPE_CACHE_DIR"], ignore_errors=True)
        _run_child(python, code, *args[:1], env=env)
    for i in range(repeats):
        for name, (python, code, args, env) in tools.items():
            if "TILESCOPE_CACHE_DIR" in env:
                shutil.rmtree(env["TILESCOPE_CACHE_DIR"], ignore_errors=True)
            runs[name].append(_run_child(python, code, *(args if i == 0 else args[:1]), env=env))
    return runs


def _mean(runs: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in runs)


def mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-hta", action="store_true", help="do not run HTA (no venv, no pip)")
    ap.add_argument("--skip-big", action="store_true", help="skip the ~1 GB synthetic trace (part 2)")
    ap.add_argument("--gb", type=float, default=1.0, help="size of the synthetic trace (default 1.0)")
    ap.add_argument("--workdir", help="where to put the decompressed and synthetic traces (default: a temp dir)")
    ap.add_argument("--repeats", type=int, default=3, help="fresh runs per tool and trace (mean; default 3)")
    ap.add_argument("--hta-big", action="store_true",
                    help="also load the synthetic trace with HTA (minutes; several GB of memory)")
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="tilescope-bench-")
    os.makedirs(work, exist_ok=True)
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
    print(f"machine: {platform.node()} ({os.cpu_count()} CPUs, {platform.machine()}), Python {platform.python_version()}, "
          f"load average {' '.join(load)} (other work on the machine slows every figure below)")
    reps = max(1, args.repeats)
    ok = True
    hta_py = None if args.skip_hta else ensure_hta_venv()
    left = []
    plain_control = None
    for name, gz in TRACES:
        trace_dir = os.path.join(work, name)  # HTA reads a folder of traces
        os.makedirs(trace_dir, exist_ok=True)
        plain = os.path.join(trace_dir, name + ".json")
        if not os.path.exists(plain):
            with gzip.open(gz, "rb") as f, open(plain, "wb") as g:
                shutil.copyfileobj(f, g, 1 << 20)
        plain_control = plain_control or plain
        size = os.path.getsize(plain)
        env = _as_installed(dict(os.environ, TILESCOPE_CACHE_DIR=os.path.join(work, "cache-" + name)), work)
        check = ["check"] if name == "cuda_trace_diff_control" else []
        tools = {"tilescope": (sys.executable, _TS_CHILD, [plain, *check], env)}
        if hta_py:
            tools["hta"] = (hta_py, _HTA_CHILD, [trace_dir, *check], _as_installed(dict(os.environ), work))
        runs = _alternating(tools, reps)
        tsr = runs["tilescope"]
        ts_job, ts_cpu, ts_peak = _mean(tsr, "job_s"), _mean(tsr, "job_cpu_s"), _mean(tsr, "peak_rss_after_query")
        print(f"\n== {name} ({mb(size)}, {tsr[0]['events']:,} records); means of {reps} fresh runs per tool, alternating")
        print(f"tilescope: {ts_job:.2f} s wall {[round(r['job_s'], 2) for r in tsr]} = imports {_mean(tsr, 'import_s'):.2f} "
              f"+ open {_mean(tsr, 'seconds'):.2f} ({size / _mean(tsr, 'seconds') / 1e6:,.0f} MB/s, {tsr[0]['mode']} parser) "
              f"+ first op table {_mean(tsr, 'first_query_s'):.2f}; {ts_cpu:.2f} s CPU; peak RSS {mb(ts_peak)} "
              f"({mb(_mean(tsr, 'base_rss'))} after imports, {mb(_mean(tsr, 'peak_rss'))} after open)")
        if not hta_py:
            continue
        hr = runs["hta"]
        h_job, h_cpu, h_peak = _mean(hr, "job_s"), _mean(hr, "job_cpu_s"), _mean(hr, "peak_rss")
        print(f"HTA 0.5.0: {h_job:.2f} s wall {[round(r['job_s'], 2) for r in hr]} = imports {_mean(hr, 'import_s'):.2f} "
              f"+ TraceAnalysis load {_mean(hr, 'seconds'):.2f}; {h_cpu:.2f} s CPU; peak RSS {mb(h_peak)} "
              f"({mb(_mean(hr, 'base_rss'))} after imports)")
        speed, mem = h_job / ts_job, ts_peak / h_peak
        print(f"ratio: tilescope {speed:.1f}x faster (target >= 10x: {'met' if speed >= 10 else 'NOT met'}; "
              f"{h_cpu / ts_cpu:.1f}x less CPU time); peak memory {mem:.2f} of HTA's "
              f"(target <= 0.33: {'met' if mem <= 1 / 3 else 'NOT met'})")
        ok &= speed >= 10 and mem <= 1 / 3
        todo = []
        if speed < 10:
            todo.append(f"to reach 10x the job must lose {ts_job - h_job / 10:.2f} s of {ts_job:.2f} s (imports "
                        f"{_mean(tsr, 'import_s'):.2f}, open {_mean(tsr, 'seconds'):.2f}, first op table "
                        f"{_mean(tsr, 'first_query_s'):.2f})")
        if mem > 1 / 3:
            todo.append(f"to reach 1/3 of HTA's memory the peak must lose {mb(ts_peak - h_peak / 3)} of {mb(ts_peak)} "
                        f"(imports {mb(_mean(tsr, 'base_rss'))}, the first op table -- pyarrow's import and the "
                        f"columns -- {mb(ts_peak - _mean(tsr, 'peak_rss'))})")
        if todo:
            left.append(f"{name}: " + "; ".join(todo))
        if check:
            hta, ts = hr[0], tsr[0]
            print("cross-check (HTA | tilescope):")
            print(f"  rank {hta['rank']} | {ts['ranks']}")
            for c in sorted(hta["cats"]):
                print(f"  {c:<16} {hta['cats'][c]:>7,} | {ts['cats'].get(c, 0):>7,}")
            for s in sorted(hta["streams"], key=int):
                print(f"  stream {s:>3}: {hta['streams'][s][0]:>6,} events {hta['streams'][s][1]:>9,} us busy | "
                      f"{ts['streams'][s][0]:>6,} events {ts['streams'][s][1]:>9,} us busy")
            for a, b in zip(hta["top_kernels"], ts["top_kernels"]):
                print(f"  {a[0]:<40} x{a[1]:<3} {a[2]:>9,} us | x{b[1]:<3} {b[2]:>9,} us")
            print(f"  kernel time {hta['kernel_time_us']:,} us, idle {hta['idle_time_us']:,} us | "
                  f"{ts['kernel_time_us']:,} us, idle {ts['idle_time_us']:,} us")
    if left:
        print("\nleft to do:\n  " + "\n  ".join(left))
    plain = plain_control
    fb_env = dict(os.environ, TILESCOPE_CACHE_DIR=os.path.join(work, "cache-fallback"), TILESCOPE_TRACE_INGEST="python")
    shutil.rmtree(fb_env["TILESCOPE_CACHE_DIR"], ignore_errors=True)
    fb = _run_child(sys.executable, _TS_CHILD, plain, env=fb_env)
    print(f"\n(the fallback used when the C parser is not built, DuckDB's JSON reader, on the control trace: open "
          f"{fb['seconds']:.2f} s wall, peak RSS {mb(fb['peak_rss'])})")
    if args.skip_big:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
        print("\nall targets met" if ok else "\nsome targets not met (see above)")
        return 0
    big = os.path.join(work, f"synthetic_{args.gb:g}gb.json")
    target = int(args.gb * 1e9)
    if not os.path.exists(big) or abs(os.path.getsize(big) - target) > 0.1 * target:
        t = time.perf_counter()
        synthesize(plain, big, target)
        print(f"\n(built {big}: {mb(os.path.getsize(big))} in {time.perf_counter() - t:.1f} s)")
    bsize = os.path.getsize(big)
    env = dict(os.environ, TILESCOPE_CACHE_DIR=os.path.join(work, "cache-1gb"))
    shutil.rmtree(env["TILESCOPE_CACHE_DIR"], ignore_errors=True)
    r = _run_child(sys.executable, _TS_CHILD, big, env=env)
    mbps = bsize / r["seconds"] / 1e6
    print(f"\n== synthetic trace ({mb(bsize)}, {r['events']:,} records)")
    print(f"tilescope.trace.open: {r['seconds']:.1f} s wall = {mbps:,.0f} MB/s (target >= 100: {'met' if mbps >= 100 else 'NOT met'}; "
          f"{r['cpu_s']:.1f} s CPU = {r['cpu_s'] / bsize * 1e9:.1f} CPU-s per GB, so at best "
          f"{bsize / (r['cpu_s'] / (os.cpu_count() or 1)) / 1e6:,.0f} MB/s on {os.cpu_count()} otherwise idle cores; "
          f"{r['mode']} parser), peak RSS {mb(r['peak_rss'])} "
          f"(target <= 2 GB: {'met' if r['peak_rss'] <= 2e9 else 'NOT met'})")
    print(f"  then the first query (op table over {r['events']:,} records): {r['first_query_s']:.1f} s, "
          f"peak RSS {mb(r['peak_rss_after_query'])}")
    ok &= mbps >= 100 and r["peak_rss"] <= 2e9
    if args.hta_big and not args.skip_hta:
        bdir = os.path.join(work, "big_for_hta")
        os.makedirs(bdir, exist_ok=True)
        link = os.path.join(bdir, os.path.basename(big))
        if not os.path.exists(link):
            os.symlink(big, link)
        hb = _run_child(ensure_hta_venv(), _HTA_CHILD, bdir)
        print(f"HTA 0.5.0 on the same trace: {hb['seconds']:.1f} s wall ({hb['cpu_s']:.1f} s CPU) = {bsize / hb['seconds'] / 1e6:,.0f} MB/s, "
              f"peak RSS {mb(hb['peak_rss'])}; ratios: tilescope {hb['seconds'] / r['seconds']:.1f}x faster, "
              f"{r['peak_rss'] / hb['peak_rss']:.2f} of HTA's peak memory")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    print("\nall targets met" if ok else "\nsome targets not met (see above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
