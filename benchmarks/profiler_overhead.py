"""Wall-time overhead of tilescope's profiler on top of torch.profiler's own.

Both sides run the same workload on the simulated device (virtual clock) under
torch.profiler with CPU + PrivateUse1 activities, export, and read the op table
(``key_averages``), as the documented workflow does:
  * torch:     torch.profiler alone, exporting its Chrome trace. It records the device
               executions itself -- device time in its tables and trace -- through the device's
               activity profiler for Kineto, as it records CUDA kernels through CUPTI (once a
               tilescope Profiler exists, tilescope's capture also keeps every execution's
               record while torch's profiler records; it is taken off for these runs);
  * tilescope: the same plus ProfileConfig and Profiler(cfg).export_trace (each execution's
               launching op, system trace, executables and instruction traces, doctor, manifest).

Three workloads: loops of naive RMSNorm of 20 and 200 iterations (small ops, ~0.2 ms of host
time each: the export's fixed cost dominates the first, its cost per device execution the
second) and one training step of a 2-layer transformer encoder (a realistic profiled step).
Two situations (the second not for the 200-iteration loop):
  * steady: the same workload profiled again and again in one process (pairs of runs, one
    per side, for about STEADY_SECONDS: from 32 pairs for the longest workload to 300 for the
    shortest; a training loop with a repeating schedule: each side writes its
    profiles into one directory, torch's a new trace file each time as its
    tensorboard_trace_handler does, tilescope's a new profile directory). Prints the median wall time of each
    side, the overhead (target <= 10%), the overhead per device execution, the median and
    quartiles of the ratios of adjacent pairs (less sensitive to the machine's load drifting
    during the run; the quartiles show how far one pair's figure can be trusted) with a 95%
    confidence interval of that median (how precisely this run pins it down) and what that
    interval says of the target (within it, over it, or spanning it),
    the CPU time of the thread that profiles (the work the profiler adds: it leaves out the
    device's numerics thread and time spent waiting -- on this kind of shared 2-core VM the
    wall-clock figures swing by tens of percent between runs), and the medians of each side's
    phases: the profiled region (capture during the workload), stopping the
    profiler with its export, and reading the op table.
  * first profile: a fresh process warms the workload up unprofiled, then profiles it once
    (the usual "profile one step of my model"). As in the documented loop, the tilescope
    Profiler exists before the warm-up: each Program's first run prepares the text of its
    executable and instruction trace there; the export writes every file for the first
    time. COLD_PAIRS pairs of fresh processes; the same figures, and the warm-up's
    wall time on each side (where that preparation went).

Each pair runs in the opposite order of the one before (torch first, then tilescope first, ...):
a run's figures depend on what ran just before it (what the previous export left in the
allocator and caches, the machine's load pattern), and on this VM that position alone moved one
side's median by ~10 ms when every pair ran torch first.

Every run starts after a full garbage collection, outside its timing: torch's parse of a
profile allocates ~10^5 objects, and without it a collection triggered by one run's garbage
lands at a random place in the next (tens of ms, on either side).

Run: .venv/bin/python benchmarks/profiler_overhead.py [--out DIR]

Profiles go under the current directory by default (where ProfileConfig's default
``output_dir="profile_out"`` writes them); the script prints how long creating a file takes
there and in the system temp directory, since a profile is a few dozen files: on the
development VM that cost moved between ~20 and ~600 us per file from one run to the next, in
either place (the file system's inode creation; linking an existing file stays ~15 us).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import shutil
import json
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity

import tilescope.device
from tilescope.device import _runtime
from tilescope.profiler import ProfileConfig, Profiler
from tilescope.profiler._capture import capture

STEADY_SECONDS = 45.0  # each workload's steady pairs run for about this long ...
STEADY_PAIRS = (32, 300)  # ... and at least / at most this many pairs (an even count: as many of each order)
COLD_PAIRS = 31  # a fresh process per run: its median of pair ratios is pinned to about +-10 points
TARGET = 0.10  # the overhead the profiler should stay within


def naive_rmsnorm_loop(x, w, iterations):
    for _ in range(iterations):
        x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
        torch.sim.synchronize()


def make_transformer_step():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, dropout=0.0), 2).to("sim")
    opt = torch.optim.SGD(layer.parameters(), lr=1e-3)
    x = torch.randn(8, 128, 256, device="sim")

    def step():
        opt.zero_grad(set_to_none=True)
        layer(x).square().mean().backward()
        opt.step()
        torch.sim.synchronize()

    return step


def run(workload, with_tilescope: bool, out: str, exporter: Profiler | None = None) -> tuple[dict, int]:
    """One profiled run, its profile written under ``out``; returns its wall times (total and
    the split: profiled region, stop + export, key_averages) and how many device executions it
    profiled. With tilescope, the ``exporter`` made before the workload's first steps, as the
    documented loop makes it, or a new one."""
    os.makedirs(out, exist_ok=True)
    gc.collect()  # each run starts with no garbage left by the previous one (either side's)
    # executions counted from the runtime's counters: a listener would make the runtime build
    # each execution's record on the torch side too, hiding what tilescope's capture costs
    executed = sum(_runtime.counters()["executions"])
    installed = capture.installed
    if installed and not with_tilescope:  # torch alone: without tilescope's capture (module doc)
        capture.uninstall()
    c0, t0 = time.thread_time(), time.perf_counter()
    if with_tilescope:
        exporter = exporter or Profiler(ProfileConfig(output_dir=out))
        kwargs = dict(experimental_config=exporter.config, on_trace_ready=exporter.export_trace)
    else:
        # a new file per profile, as torch's tensorboard_trace_handler writes them
        kwargs = dict(on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/trace_{time.time_ns()}.json"))
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], **kwargs) as prof:
        workload()
        t1 = time.perf_counter()
    t2 = time.perf_counter()
    prof.key_averages()
    t3, c3 = time.perf_counter(), time.thread_time()
    executed = sum(_runtime.counters()["executions"]) - executed
    if installed and not with_tilescope:
        capture.install()
    return {"total": t3 - t0, "region": t1 - t0, "stop+export": t2 - t1, "key_averages": t3 - t2,
            "cpu": c3 - c0}, executed


def file_create_us(directory: str, n: int = 200) -> float:
    """Median cost of creating and writing one small file in ``directory`` (a profile is ~45 files)."""
    d = tempfile.mkdtemp(dir=directory, prefix=".fs-probe-")
    times = []
    for i in range(n):
        t = time.perf_counter()
        fd = os.open(os.path.join(d, f"f{i}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.write(fd, b"x" * 2048)
        os.close(fd)
        times.append(time.perf_counter() - t)
    shutil.rmtree(d, ignore_errors=True)
    return statistics.median(times) * 1e6


def make_rmsnorm_loop(iterations=20):
    x = torch.randn(512, 1024, device="sim")
    w = torch.randn(1024, device="sim")
    return lambda: naive_rmsnorm_loop(x, w, iterations)


WORKLOADS = {  # name -> (factory of the workload, also measure its first profile in a fresh process)
    # (a child process builds only the one it runs)
    "naive RMSNorm [512, 1024] x 20 iterations": (make_rmsnorm_loop, True),
    "naive RMSNorm [512, 1024] x 200 iterations": (lambda: make_rmsnorm_loop(200), False),
    "2-layer transformer encoder training step (d=256, 8x128 tokens)": (make_transformer_step, True),
}


def first_profile(name: str, with_tilescope: bool, out: str) -> None:
    """In a fresh process: build the workload, make the exporter (as a script passes
    ``Profiler(cfg).export_trace`` to ``torch.profiler.profile`` before its loop), warm the
    workload up unprofiled, profile it once; print the times, the warm-up's included."""
    workload = WORKLOADS[name][0]()
    exporter = Profiler(ProfileConfig(output_dir=out)) if with_tilescope else None
    t0 = time.perf_counter()
    for _ in range(2):
        workload()
    warmup = time.perf_counter() - t0
    t, n = run(workload, with_tilescope, out, exporter)
    print(json.dumps({"times": t | {"warm-up": warmup}, "executions": n}))


def pair_order(k: int) -> tuple[bool, bool]:
    """The sides of pair ``k`` in the order they run (False: torch alone), alternating.

    >>> [pair_order(k) for k in range(2)]
    [(False, True), (True, False)]
    """
    return (False, True) if k % 2 == 0 else (True, False)


def steady_pairs_wanted(done: int, elapsed_s: float) -> bool:
    """Whether to run another steady pair: for about ``STEADY_SECONDS`` per workload, within
    ``STEADY_PAIRS``, stopping after an even count (as many pairs of each order). A short workload
    gets many pairs -- its figures are the noisiest -- and the count never depends on the results.

    >>> steady_pairs_wanted(31, 100.0), steady_pairs_wanted(32, 100.0), steady_pairs_wanted(33, 1.0)
    (True, False, True)
    """
    low, high = STEADY_PAIRS
    if done < low or done % 2:
        return True
    return done < high and elapsed_s < STEADY_SECONDS


def cold_runs(name: str, out: str) -> dict[bool, list[dict]]:
    times: dict[bool, list[dict]] = {True: [], False: []}
    for k in range(COLD_PAIRS):
        for flag in pair_order(k):
            res = subprocess.run(
                [sys.executable, __file__, "--first-profile", name, *(["--tilescope"] if flag else []),
                 "--out", f"{out}/cold{k}{flag}"], capture_output=True, text=True)
            if res.returncode != 0:  # say why, not just that it failed
                errors = "\n".join(line for line in res.stderr.splitlines() if not line.startswith("USDT:"))
                sys.exit(f"a fresh process profiling {name!r} ({'tilescope' if flag else 'torch alone'}) "
                         f"exited with {res.returncode}:\n{errors[-4000:]}")
            times[flag].append(json.loads(res.stdout.strip().splitlines()[-1])["times"])
    return times


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: the k-th smallest and k-th
    largest values, k the largest with P(Binomial(n, 1/2) < k) <= (1 - level) / 2.

    >>> median_interval(list(range(15)))  # 96.5% coverage with 15 values
    (3, 11)
    """
    xs, n = sorted(values), len(values)
    k, tail = 0, 0.0
    while k < n and tail + math.comb(n, k) / 2 ** n <= (1 - level) / 2:
        tail += math.comb(n, k) / 2 ** n
        k += 1
    return (xs[0], xs[-1]) if k == 0 else (xs[k - 1], xs[n - k])


def verdict(low: float, high: float, target: float = TARGET) -> str:
    """What a run says of the target, from the 95% confidence interval of its pairs' median
    overhead (the figure the machine's drift moves least).

    >>> verdict(0.02, 0.08), verdict(0.07, 0.12), verdict(0.11, 0.15)
    ('within the target', 'at the target: the interval spans it', 'over the target')
    """
    if high <= target:
        return "within the target"
    if low > target:
        return "over the target"
    return "at the target: the interval spans it"


def report(label: str, times: dict[bool, list[dict]], execs: int | None) -> None:
    med = {flag: {part: statistics.median(t[part] for t in ts) for part in ts[0]} for flag, ts in times.items()}
    base, ours = med[False]["total"], med[True]["total"]
    print(f"  {label} (medians of {len(times[True])}):")
    print(f"    torch.profiler alone + export + key_averages: {base * 1e3:8.1f} ms")
    print(f"    with tilescope's Profiler:                    {ours * 1e3:8.1f} ms")
    per_exec = f"; {(ours - base) * 1e6 / execs:.0f} us per device execution, all costs included" if execs else ""
    ratios = [t["total"] / b["total"] - 1 for t, b in zip(times[True], times[False])]
    q1, paired, q3 = statistics.quantiles(ratios, n=4)
    lo, hi = median_interval(ratios)
    print(f"    overhead: {(ours / base - 1) * 100:+.1f}% (target <= {TARGET:.0%}){per_exec}")
    print(f"    overhead of each adjacent pair: median {paired * 100:+.1f}% (95% confidence interval of the "
          f"median {lo * 100:+.1f}% .. {hi * 100:+.1f}%), quartiles {q1 * 100:+.1f}% .. {q3 * 100:+.1f}% "
          f"({len(ratios)} pairs)")
    print(f"    verdict, from that interval: {verdict(lo, hi)} ({TARGET:.0%})")
    cpu_base, cpu_ours = med[False]["cpu"], med[True]["cpu"]
    print(f"    CPU time of the profiling thread (the work the profiler adds, system calls included; "
          f"less sensitive to other load): {cpu_base * 1e3:.1f} -> {cpu_ours * 1e3:.1f} ms "
          f"({(cpu_ours - cpu_base) * 1e3:+.1f} ms)")
    print("    split (torch alone -> with tilescope, ms): " + ", ".join(
        f"{part} {med[False][part] * 1e3:.1f} -> {med[True][part] * 1e3:.1f}"
        for part in ("region", "stop+export", "key_averages")))
    if "warm-up" in med[False]:
        print(f"    before it, not in the figures above: the unprofiled warm-up (2 runs, the first building "
              f"every Program) {med[False]['warm-up'] * 1e3:.0f} -> {med[True]['warm-up'] * 1e3:.0f} ms "
              f"(with tilescope it also prepares each executable and instruction trace; ratio of medians "
              f"{med[True]['warm-up'] / med[False]['warm-up']:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.getcwd(),
                    help="directory under which both sides write their profiles (default: the current "
                         "directory, where ProfileConfig's default output_dir='profile_out' puts them)")
    ap.add_argument("--first-profile", metavar="WORKLOAD", help=argparse.SUPPRESS)  # a cold child
    ap.add_argument("--tilescope", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    tilescope.device.register()
    tilescope.device.configure(clock="virtual")
    if args.first_profile:
        first_profile(args.first_profile, args.tilescope, args.out)
        return
    probe = {d: file_create_us(d) for d in dict.fromkeys([args.out, tempfile.gettempdir()])}
    print("profiles written under " + os.path.abspath(args.out) + "; file creation there: "
          + ", ".join(f"{d} {us:.0f} us per file" for d, us in probe.items())
          + " (both sides write there; tilescope's profile is ~2 files per Program that ran + 3)")
    with tempfile.TemporaryDirectory(dir=args.out, prefix=".profiler-overhead-") as tmp:
        for index, (name, (make, cold)) in enumerate(WORKLOADS.items()):
            workload = make()
            for _ in range(2):  # build every Program first: we measure profiling, not lowering
                workload()
            times = {True: [], False: []}
            execs, k, began = 0, 0, time.perf_counter()
            while steady_pairs_wanted(k, time.perf_counter() - began):
                for flag in pair_order(k):  # each side into its own directory, as a training loop's profiles go
                    t, n = run(workload, flag, f"{tmp}/workload{index}-{'tilescope' if flag else 'torch'}")
                    times[flag].append(t)
                    execs = n
                k += 1
            print(f"{name}: {execs} device executions per profile")
            report("steady: profiled again in one process", times, execs)
            if cold:
                report("first profile in a fresh process", cold_runs(name, tmp), execs)


if __name__ == "__main__":
    main()
