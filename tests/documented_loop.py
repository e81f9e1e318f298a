"""The profiling loop the issue and the README document, shared by the end-to-end tests."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity

from tilescope.profiler import ProfileConfig, Profiler


def naive_rmsnorm(x, w):
    # mul, mean, add, rsqrt, mul, mul: the composition the reference study profiles
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def fused_rmsnorm(x, w):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)


def run_documented_loop(out_dir, x, w, model=naive_rmsnorm):
    """schedule(wait=2, warmup=1, active=1) over 4 steps, exported by ``Profiler(cfg).export_trace``;
    returns torch's profile object and the profile directory written."""
    cfg = ProfileConfig(output_dir=str(out_dir))
    exporter = Profiler(cfg)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                schedule=torch.profiler.schedule(wait=2, warmup=1, active=1),
                                experimental_config=cfg, on_trace_ready=exporter.export_trace) as prof:
        for _ in range(4):
            model(x, w)
            torch.sim.synchronize()
            prof.step()
    return prof, exporter.path
