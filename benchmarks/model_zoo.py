"""The model zoo's figures (``examples/models``): per model, one warm training step eager and
compiled on the simulated device -- modeled step time, MFU, the generic lowering's share of
modeled kernel time, TensorE efficiency of convolutions and attention -- each beside its target,
with every value checked against the same steps on CPU. All device figures are *modeled*.

Targets (issue "Real models, real numbers"): the generic share at most 5% of each model's
modeled kernel time; convolution and attention at 50% or more of the TensorE peak at the zoo's
large shapes. The values must match CPU (loss, gradients, parameters: ``zoo.TOLERANCE``).

    .venv/bin/python benchmarks/model_zoo.py [--size large|small] [--models gpt2,llama,...] [--modes eager,compiled]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

from examples.models import zoo  # noqa: E402

GENERIC_TARGET = 0.05  # at most, of modeled kernel time
TENSOR_TARGET = 0.50  # at least, of the TensorE peak, for convolution and attention


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(zoo.SIZES), default="large")
    p.add_argument("--models", default=",".join(zoo.MODELS))
    p.add_argument("--modes", default="eager,compiled")
    args = p.parse_args()
    runs = []
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            t0 = time.perf_counter()
            try:
                runs.append(zoo.run_model(name, mode, args.size))
            except Exception as e:  # noqa: BLE001 - a model that cannot run is a figure too
                print(f"{name} {mode}: FAILED to run: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            finally:
                import torch

                torch._dynamo.reset()
            r = runs[-1]
            diff = ", ".join(f"{k} {v:.1e}" for k, v in r.max_rel_diff.items())
            ok = r.matches_cpu
            eff = ", ".join(f"{k} {v:.1%} of TensorE peak in useful FLOPs (target >= {TENSOR_TARGET:.0%}: ratio {v / TENSOR_TARGET:.2f}; "
                            f"{r.tensor_ceiling.get(k, 0.0):.1%} at its roofline bounds)"
                            for k, v in r.tensor_efficiency.items() if k in ("convolution", "attention"))
            print(f"{name} {mode}: step {r.step_ns / 1e3:,.1f} us (modeled), MFU {r.mfu:.2%}; generic "
                  f"{r.generic_share:.1%} of modeled kernel time (target <= {GENERIC_TARGET:.0%}: ratio "
                  f"{r.generic_share / GENERIC_TARGET:.2f}); vs CPU (max rel. diff) {diff}: "
                  f"{'ok' if ok else 'MISMATCH'} (tolerances {zoo.TOLERANCE[args.size]}){'; ' + eff if eff else ''}  [{time.perf_counter() - t0:.0f} s wall]",
                  flush=True)
            for o in r.ops:
                print(f"    top: {o.op} {o.share:.1%} of kernel time, {o.pct_of_bound:.0%} of its roofline bound "
                      f"({o.executions}x, {o.lowering})")
            for o in r.generic_ops:
                print(f"    generic: {o.op} {o.share:.1%} ({o.executions}x)")
    if runs:
        zoo.print_table(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
