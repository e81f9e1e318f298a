"""The RMSNorm study, three ways, on the simulated device: shared input, config and schedule.

``make demo`` runs it: naive composition of aten ops, torch's fused ``rms_norm`` (a
tilescope tile kernel) and ``torch.compile`` of the naive code, each profiled into its
own directory, then :func:`compare` puts them side by side with the published
real-hardware figures.

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
import json
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from torch.autograd.profiler_util import EventList
from torch.profiler import ProfilerActivity

from .. import device as _device
from ..profiler import ProfileConfig, Profiler, find_profiles, load
from ..sim import simulate
from ..spec import preset

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
        _device.register()
        _device.configure(clock="virtual")


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


# Published device-time totals on real hardware (neuroncore.md, "Reference figures"):
PUBLISHED_US = {"naive": 2355.0, "fused": 403.3, "compiled": 375.5}
RUNTIME_COSTS_US = (0, 5, 10, 20, 50, 100)


def summarize(path) -> dict:
    prof = load(path)
    events = json.loads((prof.path / "system_trace.json").read_text())["traceEvents"]
    hw = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "hardware"), key=lambda e: e["ts"])
    programs = {}
    hbm = 0
    durations = []
    for e in hw:
        h = e["args"]["program_hash"]
        if h not in programs:
            programs[h] = simulate(prof.program(h)).summary
        hbm += programs[h].hbm_bytes
        durations.append(e["dur"])
    return {
        "path": prof.path, "executions": len(hw), "device_us": sum(durations), "durations_us": durations,
        "hbm_bytes": hbm, "preset": prof.device.get("preset"), "clock": prof.device.get("clock"),
        "assumed": prof.device.get("assumed", {}),
        "ops": sorted({e["args"]["op"] for e in hw}),
    }


def end_to_end_us(durations_us, runtime_us: float, dispatch_us: float) -> float:
    """Launch of the first execution to the end of the last, on one core (virtual clock):
    host submits every ``dispatch_us``; each execution starts after the runtime's fixed cost
    and after the previous one ends."""
    end = 0.0
    for i, d in enumerate(durations_us):
        start = max(i * dispatch_us + runtime_us, end)
        end = start + d
    return end


def compare(paths: dict[str, Path], console: Console | None = None) -> dict:
    console = console or Console()
    rows = {impl: summarize(p) for impl, p in paths.items()}
    fused = rows["fused"]["device_us"]
    t = Table(title="RMSNorm, three ways (tilescope figures are modeled)")
    for col in ("implementation", "device executions", "device time (modeled)", "HBM traffic (modeled)",
                "ratio to fused", "published, real trn1", "published ratio"):
        t.add_column(col, justify="right" if col != "implementation" else "left")
    for impl, r in rows.items():
        pub = PUBLISHED_US.get(impl)
        t.add_row(impl, str(r["executions"]), f"{r['device_us']:,.1f} us", f"{r['hbm_bytes'] / 1e6:,.1f} MB",
                  f"{r['device_us'] / fused:.2f}x", f"{pub:,.1f} us" if pub else "-",
                  f"{pub / PUBLISHED_US['fused']:.2f}x" if pub else "-")
    console.print(t)
    spec = preset(rows["fused"]["preset"])
    dispatch = rows["fused"]["assumed"].get("host_dispatch_us", spec.host_dispatch_us)
    s = Table(title="Sensitivity to the assumed runtime cost per execution (modeled)")
    s.add_column("runtime cost per execution")
    for impl in rows:
        s.add_column(f"{impl}: launch to end", justify="right")
    s.add_column("naive / fused", justify="right")
    for r_us in RUNTIME_COSTS_US:
        spans = {impl: end_to_end_us(r["durations_us"], r_us, dispatch) for impl, r in rows.items()}
        mark = " (preset)" if r_us == spec.runtime_exec_us else ""
        s.add_row(f"{r_us} us{mark}", *(f"{spans[i]:,.1f} us" for i in rows), f"{spans['naive'] / spans['fused']:.2f}x")
    console.print(s)
    console.print(
        "Device time excludes the runtime's fixed cost, so its ratio does not move with it; the launch-to-end "
        f"latency does (host dispatch assumed {dispatch:g} us per op).")
    return rows


def latest(root: Path, name: str) -> Path:
    found = [p for p in find_profiles(root / name) if p.complete]
    if not found:
        raise SystemExit(f"no complete profile under {root / name}; run examples/rmsnorm/{name.split('_')[0]}.py first")
    return max(found, key=lambda p: p.path.name).path



def latest(root: Path, name: str) -> Path:
    found = [p for p in find_profiles(root / name) if p.complete]
    if not found:
        raise SystemExit(f"no complete profile under {root / name}; run examples/rmsnorm/{name.split('_')[0]}.py first")
    return max(found, key=lambda p: p.path.name).path


def demo(out: str | Path = "profile_out/rmsnorm", dtype: str = "fp32") -> dict:
    """Run the three implementations, compare them, and say how to open them in the explorer."""
    console = Console()
    console.print(f"[bold]RMSNorm three ways[/bold] on the simulated device: input {SHAPE} {dtype}, "
                  "virtual clock, schedule(wait=2, warmup=1, active=1). Device times are modeled.\n")
    paths = {impl: run(impl, dtype, out) for impl in IMPLEMENTATIONS}
    rows = compare(paths, console)
    console.print("\nOpen the three profiles side by side in the explorer:")
    console.print("  tilescope explore " + " ".join(str(p) for p in paths.values()), markup=False, soft_wrap=True)
    return rows


def main(impl: str) -> None:
    parser = argparse.ArgumentParser(description=f"{impl} RMSNorm on the simulated device")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--out", default="profile_out/rmsnorm")
    args = parser.parse_args()
    run(impl, args.dtype, args.out)
