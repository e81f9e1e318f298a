"""The end-to-end gain of each hand-written native path over the library or Python code it replaces.

Each C extension (or hand-written writer) stands in for something a dependency or plain Python
already does; it is worth its maintenance only if the path a user waits on gets faster. This
script times each path whole, with the native piece and without it, in fresh processes
(alternated, so the machine's drift hits both alike), and prints the means and their ratio:

  ingest     ``tilescope.trace.open`` of the 35 MB CUDA trace (decompressed first) into an empty
             cache: ``_kscan`` (C JSON scanner) + ``_parquet`` (hand-written Parquet pages), against
             the fallback (DuckDB's JSON reader writing Parquet; ``TILESCOPE_TRACE_INGEST=python``);
  export     a profile's export (``Profiler.export_trace``, torch's parse included) of a naive
             RMSNorm loop, the first export of a fresh process (executables written) and the mean
             of the next ones, with ``_lanes`` (the system trace's lane text) and without it
             (Python loops).

A ratio below 1.5x means the native piece does not pay for itself end to end (issue threshold):
the verdict column says so, and such a piece is removed. Every figure is measured wall time on
this machine, not modeled.

Run: .venv/bin/python benchmarks/native_paths.py [--repeats N] [--iterations N] [--exports N]

Last run (defaults, 2026-12-02, on a quiet 2-core VM), before two export extensions were removed:

  ingest  _kscan + _parquet 0.39 s, DuckDB JSON reader 1.01 s: 2.59x -- kept
  export  every extension: first 95.3 ms, later 70.8 ms
          without _lanes      first 149.2 ms (1.57x), later 103.2 ms (1.46x) -- kept: the first
                              export, the one a profiling run waits on, clears 1.5x
          without _execjson   first 90.7 ms (0.95x; later exports write no executable) -- removed:
                              executables are written by orjson (program/_dump.py)
          without _filebatch  first 78.6 ms (0.82x), later 63.8 ms (0.90x) -- removed: the C
                              writer thread (its own pthread and SHA-256) was slower than writing
                              and hashing each file in Python with hashlib (profiler/_fast_files.py)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(ROOT, "tests", "data", "kineto", "cuda_trace_diff_control.json.gz")
THRESHOLD = 1.5

_INGEST_CHILD = textwrap.dedent("""
    import json, sys, time
    import tilescope.trace as tt
    start = time.perf_counter()
    t = tt.open(sys.argv[1])
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "events": t.sql("SELECT count(*) FROM raw").fetchall()[0][0]}))
""")

_EXPORT_CHILD = textwrap.dedent("""
    import gc, json, os, sys, tempfile, time
    import torch
    from torch.profiler import ProfilerActivity
    import tilescope.device
    from tilescope.profiler import ProfileConfig, Profiler
    off = set(filter(None, os.environ.get("NATIVE_OFF", "").split(",")))
    if "lanes" in off:
        from tilescope.profiler import _events; _events._lanes = None
    iterations, exports = int(sys.argv[1]), int(sys.argv[2])
    tilescope.device.register()
    tilescope.device.configure(clock="virtual")
    x, w = torch.randn(512, 1024, device="sim"), torch.randn(1024, device="sim")
    def run():
        for _ in range(iterations):
            x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
            torch.sim.synchronize()
    run()  # Programs built once: the export, not the lowering, is timed
    times = []
    with tempfile.TemporaryDirectory() as out:
        exporter = Profiler(ProfileConfig(output_dir=out))
        def export(prof):
            start = time.perf_counter()
            exporter.export_trace(prof)
            times.append(time.perf_counter() - start)
        for _ in range(exports):
            gc.collect()
            with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                        experimental_config=exporter.config, on_trace_ready=export):
                run()
    print(json.dumps({"first": times[0], "next": times[1:]}))
""")


def _child(code: str, args: list[str], env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _verdict(ratio: float) -> str:
    return f"{ratio:5.2f}x  " + ("keeps its place" if ratio >= THRESHOLD else f"under {THRESHOLD}x: use the library")


def ingest(repeats: int, work: str) -> None:
    plain = os.path.join(work, "control.json")
    with gzip.open(TRACE, "rb") as f, open(plain, "wb") as g:
        shutil.copyfileobj(f, g)
    size_mb = os.path.getsize(plain) / 1e6
    runs: dict[str, list[float]] = {"native": [], "python": []}
    for i in range(repeats):
        for mode in ("native", "python") if i % 2 == 0 else ("python", "native"):
            cache = tempfile.mkdtemp(dir=work)
            env = dict(os.environ, TILESCOPE_TRACE_INGEST=mode, TILESCOPE_CACHE_DIR=cache)
            runs[mode].append(_child(_INGEST_CHILD, [plain], env)["seconds"])
            shutil.rmtree(cache, ignore_errors=True)
    native, python = statistics.mean(runs["native"]), statistics.mean(runs["python"])
    print(f"ingest of a {size_mb:.0f} MB Kineto trace (tilescope.trace.open, empty cache; means of {repeats} fresh "
          f"processes each, wall):")
    print(f"  _kscan + _parquet      {native:7.2f} s   DuckDB JSON reader {python:7.2f} s   {_verdict(python / native)}")


def export(repeats: int, iterations: int, exports: int) -> None:
    variants = ("", "lanes")
    first: dict[str, list[float]] = {v: [] for v in variants}
    later: dict[str, list[float]] = {v: [] for v in variants}
    for i in range(repeats):
        order = variants if i % 2 == 0 else variants[::-1]
        for v in order:
            r = _child(_EXPORT_CHILD, [str(iterations), str(exports)], dict(os.environ, NATIVE_OFF=v))
            first[v].append(r["first"])
            later[v].extend(r["next"])
    base_first, base_next = statistics.mean(first[""]), statistics.mean(later[""])
    print(f"profile export of naive RMSNorm x {iterations} ({6 * iterations} device executions; means over "
          f"{repeats} fresh processes, {exports - 1} later exports each; wall, torch's parse included):")
    print(f"  every extension: first export {base_first * 1e3:7.1f} ms, later exports {base_next * 1e3:7.1f} ms")
    names = {"lanes": "_lanes (else Python loops)"}
    for v in variants[1:]:
        f, n = statistics.mean(first[v]), statistics.mean(later[v])
        print(f"  without {names[v]:38s} first {f * 1e3:7.1f} ms  {_verdict(f / base_first)}")
        print(f"  {'':46s} later {n * 1e3:7.1f} ms  {_verdict(n / base_next)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=4, help="fresh processes per variant (default 4)")
    ap.add_argument("--iterations", type=int, default=50, help="RMSNorm loop length of a profile (default 50)")
    ap.add_argument("--exports", type=int, default=4, help="exports per process, the first included (default 4)")
    ap.add_argument("--only", choices=("ingest", "export"), help="run one of the two")
    args = ap.parse_args()
    for name in ("repeats", "iterations", "exports"):
        if getattr(args, name) < (2 if name == "exports" else 1):
            ap.error(f"--{name} is too small: {getattr(args, name)}")
    with tempfile.TemporaryDirectory(prefix="tilescope-native-paths-") as work:
        if args.only in (None, "ingest"):
            ingest(args.repeats, work)
        if args.only in (None, "export"):
            export(args.repeats, args.iterations, args.exports)


if __name__ == "__main__":
    main()
