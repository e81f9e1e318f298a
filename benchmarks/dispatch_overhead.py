"""Host time a loop of small eager ops pays per op on the simulated device, over CPU.

What a training loop pays is not the median of single calls (which hides the periodic
costs: the numerics worker taking the interpreter lock, queue hand-offs, garbage
collection, allocation) but the mean over a back-to-back loop. So for each small op
(add, mul by a Python scalar, relu, in-place add, a reduction, a 64x64 matmul; 64x64
fp32 tensors) and for a loop cycling through all six, this times ``--iters`` back-to-back
calls with no synchronize inside the loop (``perf_counter_ns`` around the whole loop,
after a warm-up that builds every Program), on CPU and on ``sim``, alternating, in one
process, ``--runs`` times. The device is synchronized *after* each timed loop, outside the
timing: the loop's figure is host dispatch time, as on an accelerator.

Per op it prints the mean added host time per op over the runs (sim loop mean minus CPU loop
mean), the median over the runs, and the ratio of the mean to the target: at most 15 us added
per op (a CUDA launch is 3-7 us). Beside it, the host thread's own CPU time per op
(``thread_time``) on each device: on a loaded machine the wall figures also carry the share of
the cores the process got, the CPU times do not. Two settings: with numerics (the device worker computes every
op concurrently, sharing the interpreter lock and the machine's cores with the host) and with
``numerics=False`` (dispatch alone). Wall clock, the default. The machine may be shared: the
runs alternate CPU and sim so that load hits both, and the spread over the runs is printed.

    .venv/bin/python benchmarks/dispatch_overhead.py [--iters 2000] [--runs 7]

Last figures (the shared 2-core machine, defaults; "mean over the six ops", with numerics):
10.5-12.1 us added per op (0.70-0.81x the target) at a load average of about 9, 23.9 us (1.60x)
at about 14 -- the worker's numerics share the loaded cores with the host; the host thread's
own CPU time per op stays within about 2 us of CPU's. The Python handler alone
(``TILESCOPE_FAST_DISPATCH=0``): 186 us (load 9) and 308 us (load 14).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import tilescope.device as dev

TARGET_US = 15.0  # mean added host time per op over a loop (a CUDA launch: 3-7 us)


def _ops(x, y, w):
    """name -> one call (each returns its result, dropped by the loop as user code drops it)."""
    return {
        "add (tensor + tensor)": lambda: x + y,
        "mul (tensor * python scalar)": lambda: x * 1.5,
        "relu": lambda: torch.relu(x),
        "add_ (in place)": lambda: y.add_(x, alpha=1e-9),
        "sum over a dim": lambda: x.sum(1),
        "matmul 64x64": lambda: x @ w,
    }


def _loop_us(calls, iters: int, sync) -> tuple[float, float]:
    """(wall, host thread CPU) us per call over ``iters`` back-to-back calls cycling through ``calls``."""
    n = len(calls)
    seq = [calls[i % n] for i in range(iters)]
    c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
    for fn in seq:
        fn()
    t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
    sync()
    return (t1 - t0) / iters / 1000.0, (c1 - c0) / iters / 1000.0


def run(iters: int, runs: int, numerics: bool) -> dict:
    """{loop name: {"cpu": [wall us per op per run], "sim": [...], "cpu_thread": [host thread CPU us
    per op per run], "sim_thread": [...]}}."""
    dev.register()
    dev.configure(numerics=numerics)
    torch.manual_seed(0)
    cpu = [torch.randn(64, 64) for _ in range(3)]
    sim = [t.to("sim") for t in cpu]
    cpu_ops, sim_ops = _ops(*cpu), _ops(*sim)
    loops = {name: ([cpu_ops[name]], [sim_ops[name]]) for name in cpu_ops}
    loops["all six, interleaved"] = (list(cpu_ops.values()), list(sim_ops.values()))
    no_sync = lambda: None  # noqa: E731
    sync = torch.sim.synchronize
    for c, s in loops.values():  # warm-up: every signature's first (synchronous) call and Program
        _loop_us(c, 200, no_sync)
        _loop_us(s, 200, sync)
    times = {name: {"cpu": [], "sim": [], "cpu_thread": [], "sim_thread": []} for name in loops}
    for _ in range(runs):
        for name, (c, s) in loops.items():
            for dev_name, calls, after in (("cpu", c, no_sync), ("sim", s, sync)):
                wall, thread = _loop_us(calls, iters, after)
                times[name][dev_name].append(wall)
                times[name][dev_name + "_thread"].append(thread)
    dev.configure(numerics=True)
    return times


def _added(t: dict) -> list[float]:
    return [s - c for c, s in zip(t["cpu"], t["sim"])]


def report(times: dict, label: str) -> float:
    """Print one setting's table; returns the mean added us per op of the interleaved loop."""
    print(f"\n{label}")
    print(f"{'loop':30s} {'CPU us/op':>10s} {'sim us/op':>10s} {'added mean':>11s} {'median':>7s} "
          f"{'min-max':>13s} {'/ target':>9s}   {'host thread CPU us/op: CPU':>27s} {'sim':>6s}")
    for name, t in times.items():
        added = _added(t)
        mean = statistics.fmean(added)
        print(f"{name:30s} {statistics.fmean(t['cpu']):10.2f} {statistics.fmean(t['sim']):10.2f} {mean:11.2f} "
              f"{statistics.median(added):7.2f} {min(added):6.1f}-{max(added):<6.1f} {mean / TARGET_US:8.2f}x   "
              f"{statistics.fmean(t['cpu_thread']):27.2f} {statistics.fmean(t['sim_thread']):6.2f}")
    six = [statistics.fmean(_added(t)) for name, t in times.items() if "interleaved" not in name]
    overall = statistics.fmean(six)
    print(f"mean over the six ops: {overall:.2f} us added per op = {overall / TARGET_US:.2f}x the {TARGET_US:.0f} us "
          f"target ({'met' if overall <= TARGET_US else 'NOT met'})")
    return overall


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=2000, help="back-to-back calls per timed loop (default 2000)")
    p.add_argument("--runs", type=int, default=7, help="timed loops per op, device and setting (default 7)")
    args = p.parse_args(argv)
    # one intra-op thread on the host: small CPU ops are single-threaded anyway, and on a shared
    # 2-core machine OpenMP regions waiting for a busy core would make the CPU reference the noise
    torch.set_num_threads(1)
    with_numerics = run(args.iters, args.runs, True)
    dispatch_only = run(args.iters, args.runs, False)
    print(f"Added host time per op over CPU, loops of {args.iters} back-to-back calls on 64x64 fp32 tensors, "
          f"no synchronize inside; {args.runs} runs alternating CPU and sim (wall clock)")
    mean = report(with_numerics, "with numerics (the device worker computes each op concurrently):")
    report(dispatch_only, "numerics=False (dispatch alone):")
    print(f"\nresult: {mean:.2f} us mean added host time per op with numerics; target <= {TARGET_US:.0f} us: "
          f"ratio {mean / TARGET_US:.2f} ({'met' if mean <= TARGET_US else 'NOT met'}). "
          f"Host: {torch.get_num_threads()} intra-op threads, worker: {dev.settings().worker_threads}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
