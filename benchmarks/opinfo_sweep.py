"""OpInfo sweep: every op in PyTorch's ``op_db`` that supports float32, sim vs CPU.

For each op, up to ``--samples`` float32 sample inputs are made on the simulated device
(``op.sample_inputs("sim", torch.float32)``, as PyTorch's device tests do), copied to
the CPU for the reference, and run on both; outputs must match
(``torch.testing.assert_close``; random ops and ops returning uninitialised memory
compare shape and dtype only). Ops run in
subprocess chunks, so a crash takes out one chunk, whose ops are then rerun one by
one to find the crashing op.

Each op is reported as ``pass`` / ``fail`` / ``error`` / ``crash`` / ``skip`` (no sample
runs on CPU), with the lowering rules its device executions used: an op is *served by
specific lowerings* when none of its kernel executions used the generic rule.

    .venv/bin/python benchmarks/opinfo_sweep.py                    # the whole sweep (~15 min)
    .venv/bin/python benchmarks/opinfo_sweep.py --ops add,mul,sum  # some ops
    .venv/bin/python benchmarks/opinfo_sweep.py --json out.json    # keep the results
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))


def _ops():
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    return [o for o in op_db if torch.float32 in o.supported_dtypes("cpu")]


def _key(o) -> str:
    return o.name + (f".{o.variant_test_name}" if o.variant_test_name else "")


def _tree_map(fn, x):
    import torch

    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_tree_map(fn, v) for v in x) if not hasattr(x, "_fields") else type(x)(*[_tree_map(fn, v) for v in x])
    if isinstance(x, dict):
        return {k: _tree_map(fn, v) for k, v in x.items()}
    return x


def _flat(x) -> list:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        out = []
        for v in x:
            out.extend(_flat(v))
        return out
    if isinstance(x, dict):
        return _flat(list(x.values()))
    return [x]


def _dense(x):
    import torch

    return _tree_map(lambda t: t.to_dense() if t.layout != torch.strided else t, x)


def _same(a, b) -> bool:
    import torch

    fa, fb = _flat(_dense(a)), _flat(_dense(b))
    if len(fa) != len(fb):
        return False
    for x, y in zip(fa, fb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if not torch.equal(x.detach(), y.detach()) and not (
                    x.is_floating_point() and torch.allclose(x, y, equal_nan=True)):
                return False
        elif x != y and not (x != x and y != y):
            return False
    return True


def _host_copy(t):
    """A CPU copy of a device tensor that keeps its place in its storage (offset, strides),
    so ops reading outside a view (as_strided) see the same memory as on the device."""
    import torch

    if t.device.type != "sim":
        return t
    if t.layout != torch.strided:
        return t.cpu()
    storage = t.untyped_storage().cpu()
    out = torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.shape, t.stride())
    return out.conj() if t.is_conj() else out


_UNINITIALISED = {"torch.empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}


def run_one(opinfo, max_samples: int) -> dict:
    """Run one OpInfo's samples on CPU and sim; the verdict and the rules its executions used."""
    import torch

    import tilescope.device as dev

    rules: Counter = Counter()
    generic: set = set()

    def listen(e):
        if e.kind == "kernel":
            rules[e.lowering] += 1
            if e.lowering == "generic":
                generic.add(e.op)

    result = {"op": _key(opinfo), "status": "skip", "reason": "", "samples": 0, "rules": {}}
    try:
        samples = list(opinfo.sample_inputs("sim", torch.float32, requires_grad=False))[:max_samples]
        torch.sim.synchronize()
    except Exception as e:  # noqa: BLE001
        result.update(status="error", reason=f"making sample inputs on sim: {type(e).__name__}: {e}"[:300])
        return result
    to_cpu = _host_copy
    uninitialised = opinfo.name.startswith(("empty", "new_empty")) or opinfo.name in _UNINITIALISED
    dev.subscribe(listen)
    try:
        for sample in samples:
            sim_args = (sample.input,) + tuple(sample.args)
            sim_kwargs = dict(sample.kwargs)
            args = _tree_map(to_cpu, sim_args)
            # factories name their device: the reference runs on the CPU
            kwargs = {k: ("cpu" if k == "device" else v) for k, v in _tree_map(to_cpu, sim_kwargs).items()}
            try:
                torch.manual_seed(0)
                ref = _dense(opinfo(*args, **kwargs))
                ref2 = _dense(opinfo(*_tree_map(to_cpu, sim_args), **kwargs))
                random = uninitialised or not _same(ref, ref2)
            except Exception:  # noqa: BLE001 - the CPU reference itself rejects this sample
                continue
            try:
                out = opinfo(*sim_args, **sim_kwargs)
                torch.sim.synchronize()
                host = _dense(_tree_map(lambda t: t.cpu() if t.device.type == "sim" else t, out))
            except Exception as e:  # noqa: BLE001
                result.update(status="error", reason=f"{type(e).__name__}: {e}".splitlines()[0][:300])
                return result
            result["samples"] += 1
            try:
                if random:
                    fr, fh = _flat(ref), _flat(host)
                    assert len(fr) == len(fh), f"{len(fh)} outputs, expected {len(fr)}"
                    for r, h in zip(fr, fh):
                        if isinstance(r, torch.Tensor):
                            assert r.shape == h.shape and r.dtype == h.dtype, f"{h.shape}/{h.dtype} vs {r.shape}/{r.dtype}"
                else:
                    torch.testing.assert_close(host, ref, equal_nan=True, check_device=False)
            except Exception as e:  # noqa: BLE001
                msg = str(e).strip().splitlines()
                result.update(status="fail", reason=(msg[0] if msg else type(e).__name__)[:300])
                return result
        if result["samples"]:
            result["status"] = "pass"
        else:
            result["reason"] = "no sample input runs on CPU"
    finally:
        dev.unsubscribe(listen)
        result["rules"] = dict(rules)
        result["generic_ops"] = sorted(generic)
    return result


def worker(keys: list[str], max_samples: int) -> None:
    import torch

    import tilescope.device as dev

    dev.register()
    torch.sim  # noqa: B018
    by_key = {_key(o): o for o in _ops()}
    for k in keys:
        print("START " + k, flush=True)
        try:
            res = run_one(by_key[k], max_samples)
        except Exception as e:  # noqa: BLE001 - a harness problem, reported as such
            res = {"op": k, "status": "error", "reason": f"harness: {type(e).__name__}: {e}"[:300],
                   "samples": 0, "rules": {}}
        print("RESULT " + json.dumps(res), flush=True)


def _run_chunk(keys, max_samples, timeout) -> tuple[list[dict], bool]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--samples", str(max_samples), "--keys", json.dumps(keys)]
    env = dict(os.environ, TILESCOPE_LAUNCH_BLOCKING="1", TILESCOPE_CLOCK="virtual", PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        out, code = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as e:
        out, code = (e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout) or "", -9
    results = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
    return results, code == 0


def sweep(keys, max_samples=4, chunk=40, timeout=900, log=print) -> list[dict]:
    """Run ``keys`` in subprocess chunks. When a chunk dies, the op it was running is
    rerun alone (a crash if it dies again) and the chunk resumes after it."""
    results: dict[str, dict] = {}
    pending = list(keys)
    while pending:
        part, pending = pending[:chunk], pending[chunk:]
        got, ok = _run_chunk(part, max_samples, timeout)
        for r in got:
            results[r["op"]] = r
        missing = [k for k in part if k not in results]
        if missing:
            suspect = missing[0]
            alone, _ = _run_chunk([suspect], max_samples, timeout)
            results[suspect] = alone[0] if alone else {
                "op": suspect, "status": "crash", "reason": "process died", "samples": 0, "rules": {}}
            pending = missing[1:] + pending
        log(f"  {len(results)}/{len(keys)} ops swept", file=sys.stderr)
    return [results[k] for k in keys]


def report(results: list[dict]) -> dict:
    counted = [r for r in results if r["status"] != "skip"]
    passed = [r for r in counted if r["status"] == "pass"]
    crashes = [r for r in counted if r["status"] == "crash"]
    specific = [r for r in passed if r["rules"] and "generic" not in r["rules"]]
    no_kernel = [r for r in passed if not r["rules"]]
    summary = {
        "ops": len(results), "counted": len(counted), "passed": len(passed),
        "pass_rate": len(passed) / len(counted) if counted else 0.0,
        "crashes": len(crashes), "skipped": len(results) - len(counted),
        "specific": len(specific), "views_or_copies_only": len(no_kernel),
        "specific_share": len(specific) / len(passed) if passed else 0.0,
    }
    print(f"OpInfo sweep (float32 forward, sim vs CPU): {summary['passed']}/{summary['counted']} ops pass "
          f"({summary['pass_rate']:.1%}), {summary['crashes']} crashes, {summary['skipped']} skipped "
          f"(no sample runs on CPU)")
    print(f"served by specific lowerings only: {summary['specific']}/{summary['passed']} passing ops "
          f"({summary['specific_share']:.1%}); {len(no_kernel)} passing ops ran no kernel (views/metadata)")
    failures = [r for r in counted if r["status"] != "pass"]
    if failures:
        print("\n| op | status | reason |\n|---|---|---|")
        for r in failures:
            print(f"| {r['op']} | {r['status']} | {r['reason'].replace('|', '/')} |")
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", help="comma-separated op names (default: all)")
    p.add_argument("--samples", type=int, default=4, help="sample inputs per op (default 4)")
    p.add_argument("--chunk", type=int, default=40, help="ops per subprocess (default 40)")
    p.add_argument("--json", help="write per-op results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--keys", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(json.loads(args.keys), args.samples)
        return 0
    keys = [_key(o) for o in _ops()]
    if args.ops:
        want = set(args.ops.split(","))
        keys = [k for k in keys if k in want or k.split(".")[0] in want]
    t0 = time.time()
    results = sweep(keys, args.samples, args.chunk)
    summary = report(results)
    print(f"\nwall time {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
