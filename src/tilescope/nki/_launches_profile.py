"""One profile directory for every kernel launch of a run (``tilescope nki run``).

The launches are laid end to end on the hardware lane of core 0, in the order they
ran; each has its executable and its *modeled* instruction trace, paired by Program
hash (docs/profile-format.md), so ``tilescope explore DIR`` shows them as one timeline
and ``tilescope report DIR`` tabulates them.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from ..profiler import ProfileWriter
from ..sim import SimResult
from ..spec import preset as _preset

__all__ = ["write_launches_profile"]


def write_launches_profile(output_dir, launches, *, config: dict | None = None) -> Path:
    """Write ``launches`` (:class:`tilescope.nki._jit.Launch`) into a new profile under ``output_dir``."""
    if not launches:
        raise ValueError("no kernel launches to write")
    spec = _preset(launches[0].result.summary.preset)
    device = {"kind": "sim", "name": "sim", "preset": spec.name, "preset_fingerprint": spec.fingerprint,
              "clock": "virtual"}
    instance = socket.gethostname().split(".")[0] or "host"
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
         "args": {"name": f"{instance}/{os.getpid()}/hardware"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "NC0:0"}},
    ]
    runs: dict[str, int] = {}
    t_us = 0.0
    gap_us = spec.runtime_exec_us  # the runtime's fixed cost per execution (an *assumed* preset field)
    with ProfileWriter(output_dir, device=device, config=config or {"source": "tilescope nki run"}) as w:
        for k, launch in enumerate(launches):
            r = launch.result
            program = r.program
            run = runs.get(program.hash, 0)
            runs[program.hash] = run + 1
            dur_us = r.summary.total_ns / 1000.0
            w.add_itrace(program, SimResult(r.timeline, r.summary), run,
                         execution={"flow_id": k + 1, "core": 0, "start_us": t_us})
            events.append({
                "ph": "X", "cat": "hardware", "name": f"exec_running {launch.kernel}", "pid": 1, "tid": 0,
                "ts": t_us, "dur": dur_us,
                "args": {"flow_id": k + 1, "program_hash": program.hash, "op": launch.kernel, "core": 0,
                         "modeled": True, "instructions": len(program), "grid": list(launch.grid)}})
            t_us += dur_us + gap_us
        w.write_json("system_trace.json", {"traceEvents": events, "displayTimeUnit": "ns",
                                           "metadata": {"tilescope": {"modeled": True}}})
        w.stats = {"executions": len(launches), "events": len(events)}
    return w.path
