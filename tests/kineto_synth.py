"""Small Kineto traces written from the public Kineto JSON format, per accelerator vendor.

Kineto's ``ChromeTraceLogger`` writes one process per device (``process_name`` /
``process_labels`` metadata: "GPU 0", "MTIA 9", ...), host work as ``cpu_op`` slices, the
runtime calls that submit device work under the vendor's runtime category with a
``correlation`` arg, and the device work under the vendor's device categories with the
same ``correlation``. Each :class:`Vendor` row below is one such dialect; ``make_trace``
writes a trace with ``steps`` steps of ``kernels`` launches each, every figure known in
advance (times in microseconds, as Kineto writes them).
"""

from __future__ import annotations

import dataclasses
import gzip
import json


@dataclasses.dataclass(frozen=True)
class Vendor:
    name: str                 # what tilescope's VENDORS table should call it
    device_label: str         # process_name / process_labels of the device process
    runtime_cat: str          # host runtime category (the launch calls)
    launch_name: str          # the launch call's name
    kernel_cat: str           # device work category
    memcpy_cat: str | None    # device copies' category (None: named "dma..." under kernel_cat)
    memcpy_name: str = "Memcpy HtoD (Pageable -> Device)"


VENDORS = {
    "cuda": Vendor("NVIDIA GPU (CUDA)", "GPU 0", "cuda_runtime", "cudaLaunchKernel", "kernel", "gpu_memcpy"),
    "rocm": Vendor("AMD GPU (ROCm/HIP)", "GPU 0", "cuda_runtime", "hipLaunchKernel", "kernel", "gpu_memcpy"),
    "mtia": Vendor("Meta MTIA", "MTIA 9", "mtia_runtime", "runFunction - job_prep_and_submit_for_execution",
                   "mtia_ccp_events", None, "dma_request"),
    "xpu": Vendor("Intel XPU", "XPU 0", "xpu_runtime", "zeCommandListAppendLaunchKernel", "kernel", "gpu_memcpy"),
    "hpu": Vendor("Intel Gaudi (HPU)", "HPU 0", "hpu_op", "launch", "kernel", "gpu_memcpy"),
    "privateuse1": Vendor("PrivateUse1 backend", "NPU 0", "privateuse1_runtime", "aclrtLaunchKernel", "kernel",
                          "gpu_memcpy"),
}

KERNEL_US = 30.0   # each kernel's duration
COPY_US = 10.0     # each copy's duration
STEP_US = 1000.0   # one step


def make_trace(vendor: Vendor, *, steps: int = 2, kernels: int = 3, rank: int = 0,
               extra_device_cat: str | None = None, dist_as_text: bool = False) -> dict:
    """A trace dict: per step one ``aten::linear`` op that launches ``kernels`` kernels and one
    copy, all on stream 7 of the device process (pid 1). ``extra_device_cat``: one more device
    event under a category no rule knows (for the unclassified-events warning)."""
    host, dev = 100, 1
    ev: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": host, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "pid": host, "tid": 0, "args": {"labels": "CPU"}},
        {"ph": "M", "name": "process_name", "pid": dev, "tid": 0, "args": {"name": vendor.device_label}},
        {"ph": "M", "name": "process_labels", "pid": dev, "tid": 0, "args": {"labels": vendor.device_label}},
        {"ph": "M", "name": "thread_name", "pid": dev, "tid": 7, "args": {"name": "stream 7"}},
    ]
    corr = 1
    for s in range(steps):
        t0 = 1_000_000.0 + s * STEP_US
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": host, "tid": 1,
                   "ts": t0, "dur": STEP_US - 1})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": host, "tid": 1, "ts": t0 + 1,
                   "dur": 10.0 * (kernels + 1), "args": {"External id": s + 1}})
        for k in range(kernels + 1):
            ts_launch = t0 + 2 + 10 * k
            is_copy = k == kernels
            ev.append({"ph": "X", "cat": vendor.runtime_cat,
                       "name": "memcpyAsync" if is_copy else vendor.launch_name, "pid": host, "tid": 1,
                       "ts": ts_launch, "dur": 5.0, "args": {"correlation": corr, "External id": s + 1}})
            start = t0 + 100 + 40 * k
            if is_copy:
                cat = vendor.memcpy_cat or vendor.kernel_cat
                ev.append({"ph": "X", "cat": cat, "name": vendor.memcpy_name, "pid": dev, "tid": 7, "ts": start,
                           "dur": COPY_US, "args": {"correlation": corr, "stream": 7, "device": 0, "bytes": 1 << 20,
                                                    "memory bandwidth (GB/s)": (1 << 20) / (COPY_US * 1e3)}})
            else:
                ev.append({"ph": "X", "cat": vendor.kernel_cat, "name": f"gemm_kernel_{k}", "pid": dev, "tid": 7,
                           "ts": start, "dur": KERNEL_US, "args": {"correlation": corr, "stream": 7, "device": 0}})
            corr += 1
    if extra_device_cat:
        ev.append({"ph": "X", "cat": extra_device_cat, "name": "mystery_work", "pid": dev, "tid": 7,
                   "ts": 1_000_000.0 + 900, "dur": 5.0, "args": {"stream": 7}})
    dist = {"backend": "nccl", "rank": rank, "world_size": rank + 1}
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": f"{vendor.device_label} test device"}],
            "distributedInfo": repr(dist) if dist_as_text else dist, "traceEvents": ev,
            "displayTimeUnit": "ms", "baseTimeNanoseconds": 1_700_000_000_000_000_000}


def write(path: str, trace: dict, *, indent: int | None = 1) -> str:
    """Write ``trace`` as Kineto does (pretty-printed JSON; gzip when the name ends in .gz)."""
    text = json.dumps(trace, indent=indent).encode()
    if path.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(text)
    else:
        with open(path, "wb") as f:
            f.write(text)
    return path


def make_rank_trace(rank: int, world: int, *, steps: int = 3, kernels: int = 4, slow_rank: int | None = None,
                    slowdown: float = 1.5) -> dict:
    """One rank of a data-parallel job: per step, ``kernels`` compute kernels on stream 7, then
    an all-reduce (``ncclKernel_AllReduce``) on stream 13 that ends for every rank when the
    slowest rank has arrived plus ``ALLREDUCE_US``. ``slow_rank`` computes ``slowdown`` times
    slower, so it arrives last and waits least in the collective (the straggler)."""
    t = make_trace(VENDORS["cuda"], steps=0, rank=rank)
    t["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    ev = t["traceEvents"]
    ev.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": 13, "args": {"name": "stream 13"}})
    corr = 1
    k_us = lambda r: KERNEL_US * (slowdown if r == slow_rank else 1.0)  # noqa: E731
    t0 = 1_000_000.0
    for s in range(steps):
        compute_end = {r: t0 + 50 + kernels * k_us(r) for r in range(world)}
        done = max(compute_end.values()) + ALLREDUCE_US
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 100, "tid": 1,
                   "ts": t0, "dur": done + 10 - t0})
        for k in range(kernels):
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 1,
                       "ts": t0 + 1 + k, "dur": 1.0, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": f"gemm_kernel_{k}", "pid": 1, "tid": 7,
                       "ts": t0 + 50 + k * k_us(rank), "dur": k_us(rank), "args": {"correlation": corr, "stream": 7}})
            corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 1,
                   "ts": t0 + 1 + kernels, "dur": 1.0, "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": 1, "tid": 13,
                   "ts": compute_end[rank], "dur": done - compute_end[rank], "args": {"correlation": corr, "stream": 13}})
        corr += 1
        t0 = done + 20
    return t


ALLREDUCE_US = 20.0
