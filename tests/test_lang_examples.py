"""The example kernels: values against numpy, each runnable as a script, and the matmul
pair's modeled shape (naive <= ~25% of TensorE peak, optimised >= ~60%)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tilescope

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def load(rel: str):
    path = EXAMPLES / rel
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


giou = load("giou/giou_kernel.py")
rmsnorm = load("rmsnorm/rmsnorm_kernel.py")
softmax = load("softmax/softmax_kernel.py")
layernorm = load("layernorm/layernorm_kernel.py")
matmul = load("matmul/matmul_kernels.py")


def test_giou_classic_shape_writes_into_the_passed_buffer():
    b1, b2 = giou.random_boxes(1024, 256, 0), giou.random_boxes(1024, 256, 1)
    out = np.full((1024, 256), -7.0, np.float32)
    r = tilescope.simulate(giou.giou_kernel, b1, b2, out)
    np.testing.assert_allclose(out, giou.giou_reference(b1, b2), rtol=1e-5, atol=1e-6)
    assert r.summary.bound_by == "VectorE" and r.summary.dma_transfers == 3 * 8


def test_giou_ragged_batch_is_masked():
    b1, b2 = giou.random_boxes(200, 40, 2), giou.random_boxes(200, 40, 3)
    out = np.full((200, 40), -7.0, np.float32)
    tilescope.simulate(giou.giou_kernel, b1, b2, out)
    np.testing.assert_allclose(out, giou.giou_reference(b1, b2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows,d", [(1000, 512), (128, 2048), (77, 96)])
def test_rmsnorm(rows, d):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, d), dtype=np.float32)
    g = rng.uniform(0.5, 1.5, d).astype(np.float32)
    r = tilescope.simulate(rmsnorm.rmsnorm_kernel, x, g)
    np.testing.assert_allclose(r.value, rmsnorm.rmsnorm_reference(x, g), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", ["softmax_kernel", "softmax_fused"])
def test_softmax(kernel):
    x = np.random.default_rng(1).standard_normal((300, 700), dtype=np.float32) * 4
    r = tilescope.simulate(getattr(softmax, kernel), x)
    np.testing.assert_allclose(r.value, softmax.softmax_reference(x), rtol=1e-5, atol=1e-7)


def test_fused_softmax_uses_fewer_instructions_and_less_modeled_time():
    x = np.random.default_rng(1).standard_normal((1024, 1024), dtype=np.float32)
    plain = tilescope.simulate(softmax.softmax_kernel, x).summary
    fused = tilescope.simulate(softmax.softmax_fused, x).summary
    assert fused.instructions < plain.instructions and fused.total_ns < plain.total_ns
    assert fused.engine_busy_ns["VectorE"] < plain.engine_busy_ns["VectorE"]


@pytest.mark.parametrize("kernel", ["layernorm_two_pass", "layernorm_bn_stats"])
def test_layernorm_tutorial_shape(kernel):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 1000), dtype=np.float32) * 2 + 1
    g, b = rng.uniform(0.5, 1.5, 1000).astype(np.float32), rng.standard_normal(1000, dtype=np.float32)
    r = tilescope.simulate(getattr(layernorm, kernel), x, g, b)
    np.testing.assert_allclose(r.value, layernorm.layernorm_reference(x, g, b), rtol=1e-4, atol=1e-4)


def test_bn_stats_layernorm_is_faster_in_the_model():
    x = np.zeros((300, 1000), np.float32)
    g = b = np.zeros(1000, np.float32)
    two = tilescope.simulate(layernorm.layernorm_two_pass, x, g, b).summary
    bn = tilescope.simulate(layernorm.layernorm_bn_stats, x, g, b).summary
    kinds = tilescope.simulate(layernorm.layernorm_bn_stats, x, g, b).program.summary_counts()
    assert kinds["bn_stats"] == 3 * 2 and kinds["bn_aggr"] == 3
    assert bn.total_ns < two.total_ns and bn.engine_busy_ns["VectorE"] < two.engine_busy_ns["VectorE"]


@pytest.mark.parametrize("kernel,kwargs", [
    ("matmul_naive", {}),
    ("matmul_optimized", dict(TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=1, TILES_IN_BLOCK_K=4)),
])
def test_matmul_values(kernel, kwargs):
    K, M, N = 1024, 256, 1024
    lhsT, rhs, out = matmul.inputs(K, M, N, seed=3)
    tilescope.simulate(getattr(matmul, kernel), lhsT, rhs, out, **kwargs)
    expect = lhsT.astype(np.float32).T @ rhs.astype(np.float32)
    # bf16 output (the optimised kernel also keeps its K-block partial sums in bf16, as the tutorial does)
    np.testing.assert_allclose(out.astype(np.float32), expect, rtol=3e-2, atol=0.5)
    assert out.dtype == ml_dtypes.bfloat16


def test_matmul_pair_reproduces_the_tutorials_shape():
    """Naive: DMA-bound, TensorE <= ~25% of its modeled peak. Optimised: >= ~60%."""
    args = matmul.inputs(4096, 2048, 2048, data=False)
    naive = tilescope.simulate(matmul.matmul_naive, *args, numerics=False).summary
    opt = tilescope.simulate(matmul.matmul_optimized, *args, numerics=False).summary
    assert naive.tensor_flops == opt.tensor_flops == 2 * 4096 * 2048 * 2048
    assert naive.mfu <= 0.25 and opt.mfu >= 0.60
    # why, from the timeline: the naive kernel keeps the DMA queues busy all the time while
    # TensorE waits; the optimised one moves less data in larger transfers and keeps TensorE busy
    assert naive.bound_by == "DMA" and naive.utilization["DMA"] > 0.95 and naive.utilization["TensorE"] < 0.3
    assert opt.bound_by == "TensorE" and opt.utilization["TensorE"] > 0.6
    assert opt.hbm_read_bytes < naive.hbm_read_bytes / 4 and opt.average_dma_bytes > 3 * naive.average_dma_bytes


@pytest.mark.parametrize("script", ["giou/giou_kernel.py", "rmsnorm/rmsnorm_kernel.py", "softmax/softmax_kernel.py",
                                    "layernorm/layernorm_kernel.py", "mamba/mamba_kernels.py"])
def test_examples_run_as_scripts(script):
    res = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "modeled" in res.stdout


def test_matmul_example_main(capsys):
    assert matmul.main([]) == 0
    text = capsys.readouterr().out
    assert "of peak" in text and "modeled" in text and "TensorE" in text
