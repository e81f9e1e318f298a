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
from .._console import console as new_console
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
    """torch.compile of the naive code: the compiler finds the fusion itself (tilescope's
    backend on the simulated device, Inductor on a real one)."""
    backend = "tilescope" if x.device.type not in ("cpu", "cuda") else "inductor"
    fn = _compiled.get(backend)
    if fn is None:
        fn = _compiled[backend] = torch.compile(naive_rmsnorm, backend=backend)
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
    extra = {"sim": [ProfilerActivity.PrivateUse1], "cuda": [ProfilerActivity.CUDA]}.get(device, [])
    sync = {"sim": lambda: torch.sim.synchronize(), "cuda": torch.cuda.synchronize}.get(device, lambda: None)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU] + extra,
                                schedule=torch.profiler.schedule(wait=2, warmup=1, active=1),
                                experimental_config=cfg, on_trace_ready=exporter.export_trace) as prof:
        for _ in range(4):
            fn(x, w)
            sync()
            prof.step()
    if not quiet:
        label = {"sim": "device time, modeled", "cuda": "device time, measured on " + torch.cuda.get_device_name()
                 if device == "cuda" else "", "cpu": "host time, measured on this CPU"}[device]
        print(f"== {impl} RMSNorm on {device}, {dtype}, input {tuple(SHAPE)}: key_averages() ({label})")
        if device == "cpu":
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
        else:
            print(rmsnorm_rows(prof).table(sort_by="self_device_time_total", row_limit=12))
        print(f"profile: {exporter.path}\n")
    return exporter.path


# Published device-time totals on real hardware (neuroncore.md, "Reference figures"):
PUBLISHED_US = {"naive": 2355.0, "fused": 403.3, "compiled": 375.5}
RUNTIME_COSTS_US = (0, 5, 10, 20, 50, 100)


def summarize(path) -> dict:
    """One profile's figures: device executions and time (modeled on sim, measured on a real
    device; on a CPU, the profiled step's host time), HBM traffic where the model knows it."""
    prof = load(path)
    kind = prof.device.get("kind", "cpu")
    events = json.loads((prof.path / "system_trace.json").read_text())["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X"]
    device_events = sorted((e for e in xs if e.get("cat") in ("hardware", "memcpy", "memset")), key=lambda e: e["ts"])
    row = {"path": prof.path, "kind": kind, "preset": prof.device.get("preset"), "clock": prof.device.get("clock"),
           "assumed": prof.device.get("assumed", {}), "hbm_bytes": None, "durations_us": [],
           "measured_on": prof.device.get("measured_on") or prof.device.get("name")}
    if kind == "sim":
        programs, hbm = {}, 0
        for e in device_events:
            h = e["args"]["program_hash"]
            if h not in programs:
                programs[h] = simulate(prof.program(h)).summary
            hbm += programs[h].hbm_bytes
        row.update(executions=len(device_events), device_us=sum(e["dur"] for e in device_events),
                   durations_us=[e["dur"] for e in device_events], hbm_bytes=hbm, source="modeled")
    elif kind == "cuda":
        row.update(executions=len(device_events), device_us=sum(e["dur"] for e in device_events),
                   source=f"measured on {row['measured_on']}")
    else:
        steps = [e for e in xs if e.get("name", "").startswith("ProfilerStep")]
        row.update(executions=0, device_us=sum(e["dur"] for e in steps) if steps else 0.0,
                   source=f"host time, measured on {row['measured_on'] or 'this CPU'}")
    return row


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
    """Print the study's comparison. ``paths`` maps a label (``naive``, ``fused``, ``compiled``,
    optionally suffixed `` (cpu)`` etc.) to a profile directory; modeled and measured rows
    sit in one table, each labelled, with ratios taken within each device."""
    console = console or new_console()
    rows = {label: summarize(p) for label, p in paths.items()}

    def impl_of(label):
        return label.split(" ")[0]

    fused_by_kind = {r["kind"]: r["device_us"] for label, r in rows.items() if impl_of(label) == "fused"}
    kinds = {r["kind"] for r in rows.values()}
    mixed = len(kinds) > 1
    first = next(iter(rows.values()))
    where = "" if mixed else (f" on sim ({first['preset']}), modeled" if first["kind"] == "sim"
                              else f" on {first['kind']}, {first['source']}")
    t = Table(title=f"RMSNorm, three ways{where}")
    cols = ["implementation"] + (["device", "source"] if mixed else []) + [
        "executions", "time", "HBM traffic", "vs fused", "published trn1", "published ratio"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("implementation", "device", "source") else "right")
    for label, r in rows.items():
        pub = PUBLISHED_US.get(impl_of(label)) if r["kind"] == "sim" else None
        base = fused_by_kind.get(r["kind"])
        cells = [label]
        if mixed:
            cells += [r["kind"] if r["kind"] != "sim" else f"sim ({r['preset']})", r["source"]]
        cells += [str(r["executions"]) if r["kind"] != "cpu" else "-", f"{r['device_us']:,.1f} us",
                  f"{r['hbm_bytes'] / 1e6:,.1f} MB" if r["hbm_bytes"] is not None else "-",
                  f"{r['device_us'] / base:.2f}x" if base else "-",
                  f"{pub:,.1f} us" if pub else "-", f"{pub / PUBLISHED_US['fused']:.2f}x" if pub else "-"]
        t.add_row(*cells)
    console.print(t)
    if "sim" in kinds:
        console.print("Published figures: measured on real trn1 hardware (one profiler run, input shape not "
                      "published); tilescope's sim figures are modeled. HBM traffic is modeled.")
    sim_rows = {label: r for label, r in rows.items() if r["kind"] == "sim"}
    if {"naive", "fused"} <= {impl_of(label) for label in sim_rows}:
        naive_l = next(label for label in sim_rows if impl_of(label) == "naive")
        fused_l = next(label for label in sim_rows if impl_of(label) == "fused")
        spec = preset(sim_rows[fused_l]["preset"])
        dispatch = sim_rows[fused_l]["assumed"].get("host_dispatch_us", spec.host_dispatch_us)
        s = Table(title="Sensitivity to the assumed runtime cost per execution (modeled)")
        s.add_column("runtime cost per execution")
        for label in sim_rows:
            s.add_column(f"{label}: launch to end", justify="right")
        s.add_column("naive / fused", justify="right")
        for r_us in RUNTIME_COSTS_US:
            spans = {label: end_to_end_us(r["durations_us"], r_us, dispatch) for label, r in sim_rows.items()}
            mark = " (preset)" if r_us == spec.runtime_exec_us else ""
            s.add_row(f"{r_us} us{mark}", *(f"{spans[label]:,.1f} us" for label in sim_rows),
                      f"{spans[naive_l] / spans[fused_l]:.2f}x")
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



def demo(out: str | Path = "profile_out/rmsnorm", dtype: str = "fp32", device: str = "sim") -> dict:
    """Run the three implementations, compare them, and say how to open them in the explorer."""
    console = new_console()
    where = "the simulated device (virtual clock; device times are modeled)" if device == "sim" else device
    console.print(f"[bold]RMSNorm three ways[/bold] on {where}: input {SHAPE} {dtype}, "
                  "schedule(wait=2, warmup=1, active=1).\n")
    paths = {(impl if device == "sim" else f"{impl} ({device})"): run(impl, dtype, out, device=device)
             for impl in IMPLEMENTATIONS}
    rows = compare(paths, console)
    console.print("\nOpen the three profiles side by side in the explorer (Compare tab; the code view shows the "
                  "built-in kernels' source):")
    console.print("  " + explore_command(paths), markup=False, soft_wrap=True)
    return rows


def explore_command(paths: dict) -> str:
    """The ``tilescope explore`` line for the study's profiles, each named (NAME=PATH) so that
    the tabs and the comparison say naive / fused / compiled rather than a timestamp.

    >>> explore_command({"naive": "out/a", "fused (cpu)": "out/b b"})
    "tilescope explore naive=out/a 'fused_cpu=out/b b'"
    """
    import re
    import shlex

    names = {label: re.sub(r"\W+", "_", label).strip("_") for label in paths}
    return "tilescope explore " + " ".join(shlex.quote(f"{names[k]}={p}") for k, p in paths.items())


def main(impl: str) -> None:
    parser = argparse.ArgumentParser(description=f"{impl} RMSNorm, profiled")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--device", choices=("sim", "cpu", "cuda"), default="sim")
    parser.add_argument("--out", default="profile_out/rmsnorm")
    args = parser.parse_args()
    run(impl, args.dtype, f"{args.out}" if args.device == "sim" else f"{args.out}_{args.device}", device=args.device)
