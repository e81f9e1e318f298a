"""System traces of real-device runs, built from Kineto traces recorded elsewhere."""

import gzip
import json
from pathlib import Path

import pytest

from tilescope.profiler._kineto import system_trace_from_kineto

TRACES = Path(__file__).resolve().parent / "data" / "kineto"


def _load(name):
    return json.load(gzip.open(TRACES / name))


def _lanes(events):
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    return {(e["pid"], e["tid"]): f"{procs[e['pid']]}/{e['args']['name']}" for e in events
            if e.get("name") == "thread_name"}


@pytest.mark.parametrize("name", ["cuda_alexnet_small.json.gz", "rocm_mi250_small.json.gz"])
def test_gpu_trace_gets_framework_runtime_hardware_lanes_and_flows(name):
    doc = _load(name)
    events = system_trace_from_kineto(doc, "gpuhost", 42)
    lanes = _lanes(events)
    subsystems = {v.split("/")[2] for v in lanes.values()}
    assert subsystems == {"framework", "runtime", "hardware"}
    assert all(v.startswith("gpuhost/pid:42/") for v in lanes.values())
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("hardware", "memcpy", "memset")]
    # every kernel of the source trace is on a hardware lane
    assert sum(1 for e in device if e["cat"] == "hardware") == len(kernels)
    flows = {}
    for e in events:
        if e.get("cat") == "tilescope.flow":
            flows.setdefault(e["id"], set()).add(e["ph"])
    launched = {e["args"]["correlation"] for e in device if "correlation" in e["args"]}
    runtime_corr = {e["args"].get("correlation") for e in doc["traceEvents"]
                    if e.get("cat") in ("cuda_runtime", "hip_runtime", "cuda_driver")}
    linked = launched & runtime_corr
    assert linked and all("f" in flows[c] and "t" in flows[c] | {"t"} for c in linked)
    # most launches come from an aten op: a full framework -> runtime -> hardware chain
    full = sum(1 for c in linked if flows[c] == {"s", "t", "f"})
    assert full / len(linked) > 0.8


def test_cpu_trace_has_only_framework_lanes():
    events = system_trace_from_kineto(_load("cpu_only_tiny.json.gz"), "h", 1)
    xs = [e for e in events if e.get("ph") == "X"]
    assert xs and {e["pid"] for e in xs} == {1}
    assert not any(e.get("cat") == "tilescope.flow" for e in events)
