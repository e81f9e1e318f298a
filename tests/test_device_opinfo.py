"""A representative subset of the OpInfo sweep (``benchmarks/opinfo_sweep.py`` runs all of
``op_db``): sample inputs made on the device, compared with CPU, in a subprocess so that a
crash fails the test instead of killing the suite."""

import importlib.util
import pathlib

SWEEP = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "opinfo_sweep.py"

SUBSET = [
    # elementwise, with broadcasting and scalars
    "add", "mul", "sub", "div", "exp", "log", "sigmoid", "tanh", "nn.functional.relu", "where", "clamp",
    "pow", "masked_fill", "lerp", "addcdiv",
    # reductions
    "sum", "mean", "amax", "var", "prod", "argmax", "nn.functional.cross_entropy",
    # TensorE
    "mm", "bmm", "addmm", "matmul", "nn.functional.linear", "nn.functional.conv2d",
    # fused built-ins
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.rms_norm", "nn.functional.gelu",
    "nn.functional.silu", "nn.functional.scaled_dot_product_attention",
    # movement, indexing, data-dependent shapes, random, complex
    "cat", "stack", "transpose", "permute", "reshape", "index_select", "gather", "topk", "sort", "cumsum",
    "nonzero", "unique", "nn.functional.embedding", "nn.functional.dropout", "fft.fft", "as_strided",
    "tensor_split",
]


def _sweep_module():
    spec = importlib.util.spec_from_file_location("opinfo_sweep", SWEEP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_opinfo_subset_matches_cpu_without_crashes():
    sweep = _sweep_module()
    keys = [k for k in (sweep._key(o) for o in sweep._ops()) if k in SUBSET or k.split(".")[0] in SUBSET]
    assert len(keys) >= len(SUBSET)
    results = sweep.sweep(keys, max_samples=2, chunk=len(keys), log=lambda *a, **k: None)
    bad = [(r["op"], r["status"], r["reason"]) for r in results if r["status"] not in ("pass", "skip")]
    assert not bad, bad
    specific = [r for r in results if r["status"] == "pass" and r["rules"] and "generic" not in r["rules"]]
    assert len(specific) >= len(results) // 2  # most of these are served by specific lowerings
