"""Compare the three RMSNorm profiles of the study, beside the published real-hardware figures.

Run: python examples/rmsnorm/compare.py DIR_NAIVE DIR_FUSED DIR_COMPILED
(or with no arguments: the newest profile of each implementation under profile_out/rmsnorm).

Every tilescope figure printed here is *modeled*; the published figures were measured on
real Trainium hardware (one profiler run, input shape not published) and are shown for the
shape of the result only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tilescope.profiler import find_profiles, load
from tilescope.sim import simulate
from tilescope.spec import preset

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


def main(argv: list[str]) -> None:
    if len(argv) == 3:
        paths = dict(zip(("naive", "fused", "compiled"), map(Path, argv)))
    else:
        root = Path("profile_out/rmsnorm")
        dtype = argv[0] if argv else "fp32"
        paths = {impl: latest(root, f"{impl}_{dtype}") for impl in ("naive", "fused", "compiled")}
    compare(paths)


if __name__ == "__main__":
    main(sys.argv[1:])
