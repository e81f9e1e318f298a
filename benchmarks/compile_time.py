"""Compile time: the tilescope backend's own, cold and cached, beside Inductor's on CPU.

For naive RMSNorm (8x1024x2048), a GELU-MLP and each model of the zoo (``examples/models``,
a training step: forward and backward graphs), in one process, as loop means over
``--repeats`` runs:

* backend, cold: tilescope's share of compiling (plan + Program emission + allocation) with an
  empty on-disk Program cache, and per graph;
* backend, cached: the same with the Programs read back from the disk cache (target
  <= 50 ms per graph);
* compile, cold: the whole first call (Dynamo + AOT tracing + backend) minus a warm call, on
  the simulated device;
* Inductor (CPU), cold: the same for ``torch.compile`` with the default backend on CPU, every
  Inductor cache disabled -- the reference the other columns are compared to.

Run: .venv/bin/python benchmarks/compile_time.py [--models gpt2,resnet18] [--size small] [--repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # Inductor compiles cold, every time

import torch  # noqa: E402

TARGET_CACHED_S = 0.050


def rmsnorm(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def gelu_mlp(x, w1, b1, w2):
    return torch.nn.functional.gelu(x @ w1 + b1) @ w2


class _Fn(torch.nn.Module):
    def __init__(self, fn, *params):
        super().__init__()
        self.fn = fn
        self.params = torch.nn.ParameterList(torch.nn.Parameter(p) for p in params)

    def forward(self, x):
        return self.fn(x, *self.params)


def _cases(models: list[str], size: str):
    """name -> (make the module, inputs, loss(output) for the backward graph)."""
    cases = {
        "naive RMSNorm (8x1024x2048)": (
            lambda: _Fn(rmsnorm, torch.randn(2048)), (torch.randn(8, 1024, 2048),), lambda out: out.sum()),
        "GELU-MLP (512x1024 @ 1024x4096 @ 4096x1024)": (
            lambda: _Fn(gelu_mlp, torch.randn(1024, 4096) * 0.02, torch.randn(4096), torch.randn(4096, 1024) * 0.02),
            (torch.randn(512, 1024),), lambda out: out.sum()),
    }
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    try:
        from examples.models.zoo import MODELS, SIZES
    except ImportError as e:
        print(f"(the model zoo is not importable here: {e}; timing the small cases only)")
        return cases
    for name in models or list(MODELS):
        entry = MODELS[name]
        cfg, batch = SIZES[size][name]
        inputs, target = entry.batch(cfg, batch, torch.Generator().manual_seed(1))
        cases[f"{name} ({size}) training step"] = (
            lambda e=entry, c=cfg: e.build(c).train(), inputs,
            lambda out, e=entry, t=target: e.loss(out, t.to(out.device)))
    return cases


def _step(fn, inputs, loss_of):
    out = fn(*inputs)
    loss_of(out).backward()


def _timed_backend(backend_s: list):
    """The tilescope backend with its own time (per graph) recorded."""
    from torch._dynamo.backends.common import aot_autograd

    from tilescope.compile._backend import _compiler, skip_internals
    from tilescope.compile._graph import DECOMPOSITIONS

    def timed(gm, example_inputs):
        t0 = time.perf_counter()
        out = _compiler(gm, example_inputs)
        backend_s.append(time.perf_counter() - t0)
        return out

    skip_internals()
    return aot_autograd(fw_compiler=timed, bw_compiler=timed, decompositions=DECOMPOSITIONS,
                        keep_inference_input_mutations=True)


def _first_minus_warm(make, inputs, loss_of, compile_fn, device):
    """(first call's wall time minus a warm call's, the compiled callable's extra output)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().to(device)
    ins = tuple(x.to(device) for x in inputs)
    fn = compile_fn(model)
    sync = torch.sim.synchronize if device == "sim" else (lambda: None)
    t0 = time.perf_counter()
    _step(fn, ins, loss_of)
    sync()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    _step(fn, ins, loss_of)
    sync()
    return first - (time.perf_counter() - t0)


def measure(name, make, inputs, loss_of, repeats: int, cache: str) -> dict:
    cold_backend, cold_graphs, cached_backend, cached_graphs, cold_total, inductor = [], [], [], [], [], []
    for _ in range(repeats):
        shutil.rmtree(os.path.join(cache, "programs"), ignore_errors=True)
        backend_s: list = []
        cold_total.append(_first_minus_warm(make, inputs, loss_of,
                                            lambda m: torch.compile(m, backend=_timed_backend(backend_s)), "sim"))
        cold_backend.append(sum(backend_s))
        cold_graphs.append(len(backend_s))
        backend_s = []
        _first_minus_warm(make, inputs, loss_of, lambda m: torch.compile(m, backend=_timed_backend(backend_s)), "sim")
        cached_backend.append(sum(backend_s))
        cached_graphs.append(len(backend_s))
        inductor.append(_first_minus_warm(make, inputs, loss_of, torch.compile, "cpu"))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731 - loop means, not medians
    graphs = max(1, round(mean(cached_graphs)))
    return {"name": name, "graphs": graphs, "cold_backend": mean(cold_backend), "cached_backend": mean(cached_backend),
            "cached_per_graph": mean(cached_backend) / graphs, "cold_total": mean(cold_total),
            "inductor": mean(inductor)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated zoo models (default: all)")
    ap.add_argument("--size", default="small")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    import tilescope.device

    tilescope.device.register()
    tilescope.device.configure(clock="virtual")
    cache = tempfile.mkdtemp()
    os.environ["TILESCOPE_CACHE_DIR"] = cache
    rows = []
    try:
        models = [m for m in args.models.split(",") if m]
        for name, (make, inputs, loss_of) in _cases(models, args.size).items():
            r = measure(name, make, inputs, loss_of, args.repeats, cache)
            rows.append(r)
            print(f"{name}: {r['graphs']} graph(s)")
            print(f"  tilescope backend, cold cache:  {r['cold_backend'] * 1e3:9.1f} ms")
            print(f"  tilescope backend, cached:      {r['cached_backend'] * 1e3:9.1f} ms  "
                  f"({r['cached_per_graph'] * 1e3:.1f} ms per graph; target {TARGET_CACHED_S * 1e3:.0f} ms, "
                  f"ratio {r['cached_per_graph'] / TARGET_CACHED_S:.2f}x of target)")
            print(f"  tilescope compile, cold:        {r['cold_total'] * 1e3:9.1f} ms  (Dynamo + AOT + backend)")
            print(f"  Inductor (CPU) compile, cold:   {r['inductor'] * 1e3:9.1f} ms  "
                  f"(tilescope / Inductor: {r['cold_total'] / r['inductor']:.2f}x)")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    worst = max(r["cached_per_graph"] for r in rows)
    print(f"worst cached compile per graph: {worst * 1e3:.1f} ms (target {TARGET_CACHED_S * 1e3:.0f} ms, "
          f"{'within' if worst <= TARGET_CACHED_S else 'OVER'} the target)")


if __name__ == "__main__":
    main()
