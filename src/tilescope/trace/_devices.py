"""Which lanes belong to an accelerator, and whose accelerator it is: rules as data.

Kineto writes every accelerator's timeline the same way: a process per device whose
``process_labels`` / ``process_name`` metadata names it (``GPU 0``, ``MTIA 9``, ``XPU 0``),
device work under vendor categories (``kernel``, ``gpu_memcpy``, ``mtia_ccp_events``) and
the host runtime calls that submitted it under another (``cuda_runtime``, ``mtia_runtime``,
``xpu_runtime``, ``privateuse1_runtime``). A lane is a device lane when its process is
labelled as a device (``DEVICE_PROCESS``) or when most of its events carry a device
category (``CATEGORY_KINDS`` in ``_schema.py`` says which kind each category is).

``VENDORS`` names the vendor of each rank from the same evidence (first row that matches).
Events that look like device work but match no rule are never dropped silently:
:func:`unclassified_device_events` finds them and the trace warns, naming the categories.

>>> vendor_of({"cat:mtia_runtime", "label:MTIA 9"})
'Meta MTIA'
>>> vendor_of({"cat:cuda_runtime", "name:hipLaunchKernel", "label:GPU 0"})
'AMD GPU (ROCm/HIP)'
>>> vendor_of({"cat:cpu_op"}) is None
True
"""

from __future__ import annotations

import re

__all__ = ["VENDORS", "DEVICE_PROCESS", "DEVICE_LOOKING", "CATEGORY_HINT", "vendor_of",
           "unclassified_device_events"]

CATEGORY_HINT = ("tilescope classifies events by the rules in tilescope.trace.CATEGORY_KINDS; a row for "
                 "these categories (kernel, memcpy, memset, sync or launch) makes them count")

# A process whose label or name matches is a device (Kineto: "GPU 0", "MTIA 9"; Intel's
# plugins: "XPU 0"; Gaudi: "HPU 0"; PrivateUse1 backends such as Ascend's or Cambricon's:
# "NPU 0", "MLU 0"). Case-sensitive on purpose: "gpu_worker" threads are host threads.
DEVICE_PROCESS = r"^(GPU|MTIA|XPU|HPU|NPU|MLU|TPU|IPU|PrivateUse1|Device) ?\d*\b"

# (vendor, evidence: a regex over the rank's facts "cat:<category>", "name:<launch-like event name>",
#  "label:<device process label>", "device:<deviceProperties name>", "backend:<distributed backend>").
# First match wins, so the specific rows come before the general ones (ROCm traces use
# Kineto's cuda_runtime category with hip* names).
VENDORS = (
    ("tilescope (modeled)", r"^cat:hardware$"),
    ("Meta MTIA", r"^(cat:mtia_|label:MTIA\b|backend:.*mtia)"),
    ("AMD GPU (ROCm/HIP)", r"^(cat:hip_runtime$|name:hip|device:.*(AMD|Radeon|Instinct))"),
    ("NVIDIA GPU (CUDA)", r"^(cat:cuda_(runtime|driver|sync)$|name:cu|device:.*(NVIDIA|Tesla|GeForce|Quadro))"),
    ("Intel XPU", r"^(cat:xpu_runtime$|label:XPU\b|device:.*Intel)"),
    ("Intel Gaudi (HPU)", r"^(cat:hpu_op$|label:HPU\b)"),
    ("PrivateUse1 backend", r"^(cat:privateuse1_|label:(NPU|MLU|PrivateUse1)\b)"),
    ("unnamed accelerator", r"^label:"),
)

# A category or process label that looks like an accelerator's even though no rule knows it.
DEVICE_LOOKING = r"(?i)(kernel|gpu|device|mtia|xpu|hpu|npu|mlu|tpu|privateuse1|accel|_ccp_|dma|memcpy|memset|stream)"


def vendor_of(facts: set[str]) -> str | None:
    """The vendor whose evidence matches one of ``facts`` (first row of ``VENDORS``), else None."""
    for vendor, evidence in VENDORS:
        rx = re.compile(evidence)
        if any(rx.search(f) for f in facts):
            return vendor
    return None


def unclassified_device_events(lanes: list[tuple]) -> list[tuple[str, str, int]]:
    """(where, category, events) for events that look like device work but no rule classifies:
    any unclassified category on a device lane, and device-looking categories on host lanes.
    ``lanes``: (side, process, other_cats) per lane, ``other_cats`` the JSON object of the
    lane's unclassified slice categories and counts that ``lanes.parquet`` records.

    >>> unclassified_device_events([("device", "GPU 0", '{"acme":2}'), ("host", "python", '{"Trace":1,"npu_ops":3}')])
    [("host process 'python'", 'npu_ops', 3), ("device process 'GPU 0'", 'acme', 2)]
    """
    import json

    rx = re.compile(DEVICE_LOOKING)
    acc: dict[tuple[str, str], int] = {}
    for side, proc, other in lanes:
        for cat, n in (json.loads(other) if other else {}).items():
            if side == "device" or rx.search(cat):
                key = (f"{side} process {proc!r}", cat)
                acc[key] = acc.get(key, 0) + int(n)
    return sorted(((w, c, n) for (w, c), n in acc.items()), key=lambda r: (-r[2], r[0], r[1]))
