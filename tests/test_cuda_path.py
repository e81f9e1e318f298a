"""The CUDA code paths: run where a GPU is visible, skip cleanly elsewhere."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")


def test_cuda_profile_has_lanes_and_flows(tmp_path):
    import json

    from tilescope.profiler import load, profile

    x = torch.randn(1024, 1024, device="cuda")
    with profile(tmp_path, device="cuda") as prof:
        (x @ x).relu().sum()
    p = load(prof.profile_dir)
    assert p.device["kind"] == "cuda"
    events = json.loads((p.path / "system_trace.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "hardware" for e in events)
    assert any(e.get("cat") == "tilescope.flow" and e.get("ph") == "f" for e in events)


def test_cuda_bench_uses_events_and_flushes_l2():
    from tilescope.bench import bench

    x = torch.randn(2048, 2048, device="cuda")
    r = bench(lambda x: x @ x, x, warmup=2, iters=10, flush_l2=True)
    assert r.backend == "cuda" and r.device_us is not None and not r.device_modeled
    assert any("CUDA events" in n for n in r.notes) and any("L2 flushed" in n for n in r.notes)


def test_cuda_rmsnorm_study(tmp_path):
    from tilescope.studies import rmsnorm

    paths = {f"{impl} (cuda)": rmsnorm.run(impl, "fp32", tmp_path, device="cuda", quiet=True)
             for impl in ("naive", "fused", "compiled")}
    rows = rmsnorm.compare(paths)
    assert all(r["kind"] == "cuda" and r["device_us"] > 0 for r in rows.values())
