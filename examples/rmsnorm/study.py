"""The RMSNorm study, three ways, on the simulated device: shared input, config and schedule.

Input: ``x`` of shape (8, 1024, 2048) -- 8 sequences of 1024 tokens with hidden size 2048,
as in a small transformer layer -- and a weight of shape (2048,), in fp32 or bf16. Every
implementation runs under the same ``ProfileConfig`` and ``schedule(wait=2, warmup=1,
active=1)`` on the virtual clock, so its modeled figures are deterministic, and writes its
own profile directory under ``<out>/<impl>_<dtype>/``.

All device times here are *modeled* by tilescope's device model (preset trn1 unless
``TILESCOPE_PRESET`` says otherwise).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.autograd.profiler_util import EventList
from torch.profiler import ProfilerActivity

import tilescope.device
from tilescope.profiler import ProfileConfig, Profiler

SHAPE = (8, 1024, 2048)
HIDDEN = SHAPE[-1]
EPS = 1e-6
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def naive_rmsnorm(x, w):
    """mul, mean, add, rsqrt, mul, mul: six aten ops, six device executions."""
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * w


def fused_rmsnorm(x, w):
    """torch's built-in fused op: one device execution (a tilescope tile kernel)."""
    return torch.rms_norm(x, (HIDDEN,), w, EPS)


_compiled = {}


def compiled_rmsnorm(x, w):
    """torch.compile of the naive code: the compiler finds the fusion itself."""
    fn = _compiled.get("fn")
    if fn is None:
        fn = _compiled["fn"] = torch.compile(naive_rmsnorm, backend="tilescope")
    return fn(x, w)


IMPLEMENTATIONS = {"naive": naive_rmsnorm, "fused": fused_rmsnorm, "compiled": compiled_rmsnorm}


def setup(device: str = "sim"):
    if device == "sim":
        tilescope.device.register()
        tilescope.device.configure(clock="virtual")


def make_inputs(dtype: str, device: str = "sim"):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(SHAPE, generator=gen).to(DTYPES[dtype]).to(device)
    w = torch.randn(HIDDEN, generator=gen).to(DTYPES[dtype]).to(device)
    return x, w


def config(out_dir: Path) -> ProfileConfig:
    return ProfileConfig(output_dir=str(out_dir))


def rmsnorm_rows(prof) -> EventList:
    """key_averages() rows that ran device work (the RMSNorm ops and their device executions)."""
    ka = prof.key_averages()
    rows = [e for e in ka if e.device_time_total > 0 and not e.key.startswith("ProfilerStep")
            and not e.key.startswith("Torch-Compiled Region")]
    return EventList(rows, use_device=ka._use_device)


def run(impl: str, dtype: str = "fp32", out: str | Path = "profile_out/rmsnorm", *, device: str = "sim",
        quiet: bool = False) -> Path:
    """Profile one implementation; returns its profile directory."""
    setup(device)
    fn = IMPLEMENTATIONS[impl]
    x, w = make_inputs(dtype, device)
    cfg = config(Path(out) / f"{impl}_{dtype}")
    exporter = Profiler(cfg)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if device == "sim" else [])
    with torch.profiler.profile(activities=activities, schedule=torch.profiler.schedule(wait=2, warmup=1, active=1),
                                experimental_config=cfg, on_trace_ready=exporter.export_trace) as prof:
        for _ in range(4):
            fn(x, w)
            if device == "sim":
                torch.sim.synchronize()
            prof.step()
    if not quiet:
        print(f"== {impl} RMSNorm, {dtype}, input {tuple(SHAPE)}: key_averages() rows with device time (modeled)")
        print(rmsnorm_rows(prof).table(sort_by="self_device_time_total", row_limit=12))
        print(f"profile: {exporter.path}\n")
    return exporter.path


def main(impl: str) -> None:
    parser = argparse.ArgumentParser(description=f"{impl} RMSNorm on the simulated device")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--out", default="profile_out/rmsnorm")
    args = parser.parse_args()
    run(impl, args.dtype, args.out)
