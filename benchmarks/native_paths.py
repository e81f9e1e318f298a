"""The end-to-end gain of each hand-written native path over the library or Python code it replaces.

Each C extension (or hand-written writer) stands in for something a dependency or plain Python
already does; it is worth its maintenance only if the path a user waits on gets faster. This
script times each path whole, with the native piece and without it, in fresh processes
(alternated, so the machine's drift hits both alike), and prints the means and their ratio:

  ingest     ``tilescope.trace.open`` of the 35 MB CUDA trace (decompressed first) into an empty
             cache: ``_kscan`` (C JSON scanner) + ``_parquet`` (hand-written Parquet pages), against
             the fallback (DuckDB's JSON reader writing Parquet; ``TILESCOPE_TRACE_INGEST=python``);

A ratio below 1.5x means the native piece does not pay for itself end to end (issue threshold):
the verdict column says so, and such a piece is removed. Every figure is measured wall time on
this machine, not modeled.

Run: .venv/bin/python benchmarks/native_paths.py [--repeats N]

The export's native pieces were measured the same way (a profile's export of a naive RMSNorm
loop x 50, torch's parse included; first export of a fresh process and the mean of the next
ones, means over 4 fresh processes) and all three are gone. Last runs (2026-12-02, 2-core VM):

  ingest  _kscan + _parquet 0.39 s, DuckDB JSON reader 1.01 s: 2.59x -- kept
  export  every extension: first 95.3 ms, later 70.8 ms
          without _lanes      first 149.2 ms (1.57x), later 103.2 ms (1.46x) at load ~5; rerun
                              at load ~1 (`--only export`): every extension first 32.9 / later
                              23.8 ms, without _lanes 40.6 ms (1.23x) / 31.9 ms (1.34x) -- removed:
                              the system trace's lane text comes from the Python loops
                              (profiler/_events.py)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=4, help="fresh processes per variant (default 4)")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats is too small: {args.repeats}")
    with tempfile.TemporaryDirectory(prefix="tilescope-native-paths-") as work:
        ingest(args.repeats, work)


if __name__ == "__main__":
    main()
