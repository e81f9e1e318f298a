"""The system trace's lanes as the exporter writes them: framework events with their shapes,
stacks and ranges, each execution's runtime and hardware slices on its op's lane, and the
placement that queues executions on their core."""

from types import SimpleNamespace

import pytest
import torch
from torch.autograd.profiler_util import Interval
from torch.profiler import ProfilerActivity, record_function

from tilescope.profiler import ProfileConfig, Profiler, _events
from tilescope.profiler._capture import capture
from tilescope.profiler._correlate import Correlation


@pytest.fixture(scope="module")
def sim(sim_virtual):
    """The sim device, virtual clock (tests/conftest.py)."""


@pytest.fixture(scope="module")
def profiled(sim):
    """A profile with what the lanes write differently: input shapes, a user range, a
    second thread, copies and kernels; its executions placed as the export places them."""
    exporter = Profiler(ProfileConfig())  # listens to the device while open  # noqa: F841
    x = torch.randn(256, 512, device="sim", requires_grad=True)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                record_shapes=True) as prof:
        with record_function("user \"range\" \u00e9"):
            y = (x * x).mean(-1)
        y.sum().backward()  # on autograd's device thread: a second framework lane
        torch.sim.synchronize()
        y.detach().cpu()
    matched, _ = Correlation(prof, capture, float("inf")).complete(into_tables=True)
    return prof, _events.placement(matched).rows


def test_framework_lanes_write_shapes_ranges_and_launching_ops(profiled):
    prof, _ = profiled
    events = prof.profiler.function_events
    ids = {evt.id for evt in events[::3]} | {-5}
    chunks, threads, ranges, end, by_id = _events._framework_lanes(events, ids)
    first = {}  # the CPU events with those ids, the first of each
    for evt in events:
        if evt.id in ids and evt.device_type.value == _events._CPU:
            first.setdefault(evt.id, evt)
    assert by_id == first and len(first) > 2 and all(first[i] is by_id[i] for i in first)
    assert len(threads) >= 2 and len(chunks) > 5 and end > 0
    assert any('"Input Dims"' in e for e in chunks)
    assert any('"cat":"user_annotation"' in e for e in chunks)
    doctor = [r for r in ranges if r[1].startswith(_events._DOCTOR_RANGES)]
    assert doctor == ranges  # only the ranges the doctor reads


def test_device_lanes_find_each_ops_lane_by_its_thread(profiled):
    """A dict of lanes by torch thread (the system trace's) writes what a function of each op gives."""
    _, rows = profiled
    assert len(rows) >= 3 and {r[0].rec.kind for r in rows} == {"kernel", "memcpy"}
    first, *others = dict.fromkeys(row[0].thread for row in rows)
    assert others  # the autograd thread's ops
    threads = {first: 10}  # the others: lane 0
    by_dict = ",".join(_events.device_events(rows, "host/pid:1", threads))
    by_function = ",".join(_events.device_events(rows, "host/pid:1", lambda m: threads.get(m.thread, 0)))
    assert by_dict == by_function
    assert '"ph":"s","pid":1,"tid":10,' in by_dict and '"ph":"s","pid":1,"tid":0,' in by_dict
    assert len(_events.device_events(rows, "host/pid:1", threads)) == _events.event_count(rows) - 4 * len(rows)


def test_placement_queues_executions_on_their_core():
    """Made-up records: one core busy past the next launch (the hardware slice waits), two cores,
    integer times, an op with no known parent and one that started long before its launch."""
    from tilescope.device._runtime import Execution
    from tilescope.profiler._correlate import Matched

    def rec(flow, core, submit, start, end, op="aten::mul"):
        return Execution(flow, op, "kernel", "tile", None, f"h{core}", core, 0, 1, submit, submit + 2000,
                         start, end, end - start, 2000, 64, None, "virtual")

    parent = SimpleNamespace(time_range=Interval(-50.0, 1.0))
    matched = [Matched(rec(1, 0, 0.0, 5000.0, 90000.0), 10.0, 1, None),
               Matched(rec(2, 0, 6000, 9000, 12000), 16, 1, parent),  # queued behind flow 1
               Matched(rec(3, 1, 6000.5, 9000.25, 9500.0, op="aten::add"), 16.5, 1, parent)]
    placed = _events.placement(matched)
    assert placed.rows[1][3] == placed.rows[0][3] + placed.rows[0][4] and placed.rows[2][3] < placed.rows[1][3]
    assert placed.rows[1][5] == 16 - 1e-3 and placed.rows[0][5] == 10.0  # never long before the launch
    assert placed.cores == [0, 0, 1] and placed.end == max(r[3] + r[4] for r in placed.rows)
    assert _events.placement([]) == ([], [], float("-inf"))


def test_the_framework_pass_finds_the_launching_ops_as_the_correlation_would(sim):
    """The exporter looks up the executions' launching ops in the framework lanes' pass over
    torch's events: the same events the correlation's own scan finds, and the same parents."""
    from tilescope.profiler._correlate import _ranges_by_id

    exporter = Profiler(ProfileConfig())  # noqa: F841  (open: the capture listens)
    x = torch.randn(64, 128, device="sim")
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        (x * x).mean(-1)
        torch.sim.synchronize()
    correlation = Correlation(prof, capture, float("inf"))
    ids = correlation.range_ids()
    events = correlation.parse()
    framework = _events.framework_events(prof, "host/pid:1", ids)
    assert ids and framework.by_id == _ranges_by_id(events, ids)
    matched, pending = correlation.complete(into_tables=True, ranges=framework.by_id)
    assert pending == 0 and len(matched) == 2
    assert [m.parent.name for m in matched] == ["aten::mul", "aten::mean"]
