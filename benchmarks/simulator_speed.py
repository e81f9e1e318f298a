"""Simulator speed on the GIoU tile kernel vs plain vectorised numpy on the same data.

Prints (medians of REPEATS runs in this one process, batch 1024 x 256 boxes x 4 fp32):
  * numpy: ``giou_reference`` (vectorised numpy GIoU)
  * warm simulate(): the second and later calls (tracing cached; the modeled timeline is
    looked up by Program hash; the numerics run) -> its ratio to numpy (target <= 3x)
  * cold simulate(): a fresh kernel object each time (tracing, Program build, scheduling
    and numerics), shown separately

Run: .venv/bin/python benchmarks/simulator_speed.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "giou"))

import tilescope  # noqa: E402
from giou_kernel import giou_kernel, giou_reference, random_boxes  # noqa: E402
from tilescope import sim  # noqa: E402

TARGET_RATIO = 3.0
REPEATS = 7


def median_time(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    boxes1, boxes2 = random_boxes(1024, 256, 0), random_boxes(1024, 256, 1)
    out = np.empty((1024, 256), np.float32)

    t_numpy = median_time(lambda: giou_reference(boxes1, boxes2))

    tilescope.simulate(giou_kernel, boxes1, boxes2, out)  # first call: traces
    traces = giou_kernel.trace_count
    t_warm = median_time(lambda: tilescope.simulate(giou_kernel, boxes1, boxes2, out))
    assert giou_kernel.trace_count == traces, "a warm call must not trace again"
    assert np.allclose(out, giou_reference(boxes1, boxes2), atol=1e-5)

    def cold():
        sim.clear_cache()
        tilescope.simulate(tilescope.kernel(giou_kernel.fn), boxes1, boxes2, out)

    t_cold = median_time(cold, repeats=3)
    modeled = tilescope.simulate(giou_kernel, boxes1, boxes2, out).summary.total_us
    ratio = t_warm / t_numpy
    print(f"GIoU, 1024 x 256 box pairs fp32 (medians of {REPEATS} runs)")
    print(f"numpy (vectorised):        {t_numpy * 1e3:8.2f} ms")
    print(f"simulate(), warm:          {t_warm * 1e3:8.2f} ms  -> {ratio:.2f}x numpy "
          f"(target <= {TARGET_RATIO:g}x: {'met' if ratio <= TARGET_RATIO else 'NOT met'})")
    print(f"simulate(), cold (trace):  {t_cold * 1e3:8.2f} ms")
    print(f"modeled device time of the kernel: {modeled:.2f} us (modeled)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
