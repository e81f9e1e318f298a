"""The ``_lanes`` extension writes the same lane text as the Python loops it stands in for."""

import platform
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
def lanes():
    if _events._lanes is None:
        pytest.fail("tilescope.profiler._lanes is not built: run `make setup` (needs a C compiler)")
    return _events._lanes


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


def test_framework_lanes_match_the_python_loop(profiled, lanes):
    prof, _ = profiled
    events = prof.profiler.function_events
    ids = {evt.id for evt in events[::3]} | {-5}
    text, count, threads, ranges, end, by_id = lanes.framework_lanes(
        events, _events._CPU, _events._framework_head, _events._framework_extra, ("user", "aten::mean"), ids)
    expected, exp_threads, _, exp_end, exp_by_id = _events._framework_lanes(events, ids)
    assert text == ",".join(expected) and count == len(expected) > 5
    # the CPU events with those ids, the first of each, as the exporter's launching ops are looked up
    first = {}
    for evt in events:
        if evt.id in ids and evt.device_type.value == _events._CPU:
            first.setdefault(evt.id, evt)
    assert by_id == exp_by_id == first and len(first) > 2 and all(first[i] is by_id[i] for i in first)
    assert threads == exp_threads and len(threads) >= 2 and end == exp_end
    assert any('"Input Dims"' in e for e in expected)
    assert any('"cat":"user_annotation"' in e for e in expected)
    assert [r[1] for r in ranges] == [e.name for e in events if e.device_type.value == _events._CPU
                                      and e.name.startswith(("user", "aten::mean"))]
    assert ranges[0][0] == "user_annotation" and ranges[0][1] == "user \"range\" \u00e9"


def test_framework_lanes_on_unusual_events(lanes):
    """Stacks, names to escape, a non-CPU event skipped, times that round differently."""
    cpu, other = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.PrivateUse1

    def evt(id, name, start, end, device=cpu, thread=7, stack=(), shapes=(), ua=False):
        return SimpleNamespace(id=id, name=name, device_type=device, thread=thread, is_user_annotation=ua,
                               time_range=Interval(start, end), input_shapes=list(shapes), stack=list(stack))

    events = [evt(1, "a\n\"b\" \u00e9\u4e2d", 0.0005, 0.0015), evt(2, "k", 1.0, 2.0, device=other),
              evt(3, "aten::mm", 2.0004999, 1e9 + 0.0005, stack=["x.py(3): f", "y.py(9): g"], shapes=[[2, 3], []]),
              evt(2 ** 62, "aten::mm", -0.0, 3.25, thread=8, ua=True), evt(5, "aten::mm", 7, 9)]
    text, count, threads, ranges, end, by_id = lanes.framework_lanes(
        events, _events._CPU, _events._framework_head, _events._framework_extra, ("aten::",), frozenset({2, 5}))
    expected, exp_threads, _, exp_end, exp_by_id = _events._framework_lanes(events, {2, 5})
    assert by_id == exp_by_id == {5: events[4]}  # id 2: not a CPU event
    with pytest.raises(TypeError, match="ids must be a set"):
        lanes.framework_lanes(events, _events._CPU, _events._framework_head, _events._framework_extra, (), [5])
    assert text == ",".join(expected) and count == 4 and threads == exp_threads == {7: 0, 8: 1}
    assert end == exp_end and [r[:3] for r in ranges] == [
        ("cpu_op", "aten::mm", 0), ("user_annotation", "aten::mm", 1), ("cpu_op", "aten::mm", 0)]
    assert ranges[1][3:] == (-0.0, 3.25)
    assert '"Call stack":"x.py(3): f;y.py(9): g"' in text and text.isascii()
    # heads kept across calls: made once per (category, name, lane), whichever implementation
    made = []

    def head(cat, name, tid):
        made.append((cat, name, tid))
        return _events._framework_head(cat, name, tid)

    heads = {}
    first = lanes.framework_lanes(events, _events._CPU, head, _events._framework_extra, (), None, heads)[0]
    assert len(made) == len(heads) == 3 and first == text
    assert lanes.framework_lanes(events, _events._CPU, head, _events._framework_extra, (), None, heads)[0] == text
    assert _events._framework_lanes(events, None, heads)[0] == expected and len(made) == 3
    with pytest.raises(TypeError, match="heads must be a dict"):
        lanes.framework_lanes(events, _events._CPU, head, _events._framework_extra, (), None, [])


def test_framework_events_are_the_same_with_and_without_the_extension(profiled, monkeypatch, lanes):
    prof, _ = profiled
    ids = {evt.id for evt in prof.profiler.function_events}
    chunks, n, threads, ranges, end, by_id = _events.framework_events(prof, "host/pid:1", ids)
    monkeypatch.setattr(_events, "_lanes", None)
    py_chunks, py_n, py_threads, py_ranges, py_end, py_by_id = _events.framework_events(prof, "host/pid:1", ids)
    assert ",".join(py_chunks) == ",".join(chunks) and py_n == len(py_chunks) == n
    assert (py_threads, py_ranges, py_end, py_by_id) == (threads, ranges, end, by_id) and by_id


@pytest.mark.parametrize("shift", [0.0, 1234.5675])
def test_device_lanes_match_the_python_loop(profiled, monkeypatch, lanes, shift):
    _, rows = profiled
    assert len(rows) >= 3 and {r[0].rec.kind for r in rows} == {"kernel", "memcpy"}
    args = (rows, "host/pid:1", lambda m: m.native_tid)
    fast = _events.device_events(*args, shift=shift, fw_pid=4242)
    monkeypatch.setattr(_events, "_lanes", None)
    slow = _events.device_events(*args, shift=shift, fw_pid=4242)
    assert ",".join(fast) == ",".join(slow)
    assert len(slow) == _events.event_count(rows) - 4 * len(rows)  # one text per row in the Python loop


def test_device_lanes_find_each_ops_lane_by_its_thread(profiled, monkeypatch, lanes):
    """A dict of lanes by torch thread (the system trace's) writes what a function of each op gives."""
    _, rows = profiled
    first, *others = dict.fromkeys(row[0].thread for row in rows)
    assert others  # the autograd thread's ops
    threads = {first: 10}  # the others: lane 0
    by_dict = ",".join(_events.device_events(rows, "host/pid:1", threads))
    by_function = ",".join(_events.device_events(rows, "host/pid:1", lambda m: threads.get(m.thread, 0)))
    monkeypatch.setattr(_events, "_lanes", None)
    assert by_dict == by_function == ",".join(_events.device_events(rows, "host/pid:1", threads))
    assert '"ph":"s","pid":1,"tid":10,' in by_dict and '"ph":"s","pid":1,"tid":0,' in by_dict


def _placements(matched, monkeypatch) -> tuple:
    fast = _events.placement(matched)
    with monkeypatch.context() as m:
        m.setattr(_events, "_lanes", None)
        slow = _events.placement(matched)
    return fast, slow


def test_placement_matches_the_python_loop(profiled, monkeypatch, lanes):
    _, rows = profiled
    matched = [row[0] for row in rows]
    fast, slow = _placements(matched, monkeypatch)
    assert fast == slow and fast.rows == rows and fast.cores == [m.rec.core for m in matched]
    assert fast.end == max(r[3] + r[4] for r in rows)
    texts = {id(row[7]) for row in fast.rows}  # made once per Program, op and core: shared
    assert len(texts) == len({(m.rec.program_hash, m.rec.op, m.rec.core) for m in matched}) < len(matched)
    assert _placements([], monkeypatch) == (([], [], float("-inf")),) * 2


def test_placement_queues_executions_on_their_core_as_the_python_loop_does(monkeypatch, lanes):
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
    fast, slow = _placements(matched, monkeypatch)
    assert fast == slow
    assert fast.rows[1][3] == fast.rows[0][3] + fast.rows[0][4] and fast.rows[2][3] < fast.rows[1][3]
    assert fast.rows[1][5] == 16 - 1e-3 and fast.rows[0][5] == 10.0  # never long before the launch
    with pytest.raises(TypeError, match="named tuple of Execution's fields .at least 17., not tuple"):
        lanes.placement([SimpleNamespace(rec=("short",), launch_us=0.0, parent=None)], _events._PLACEMENT_FIELDS,
                        {}, _events._clock_free_text)
    with pytest.raises(ValueError, match="13 field indices"):
        lanes.placement([], (0, 1), {}, _events._clock_free_text)


def test_bad_rows_are_refused_with_the_reason(lanes):
    for tids in ([0], {0: 1}):  # a tid per row, or the lanes by thread
        with pytest.raises(TypeError, match="placement tuple of 8"):
            lanes.device_lanes([("not", "a", "row")], tids, [0], 0.0, 1, 2, 3)
    with pytest.raises(TypeError, match="a list .one per row. or a dict .by thread., not str"):
        lanes.device_lanes([], "tids", [], 0.0, 1, 2, 3)
    with pytest.raises(ValueError, match="one tid and one core per row"):
        lanes.device_lanes([], [0], [], 0.0, 1, 2, 3)


def test_ids_are_written_as_python_writes_them(monkeypatch, lanes):
    """Flow ids, tids and cores: small ints (written by the extension itself), negative ones, the
    extremes of 64 bits and beyond, and ints of other types (through str(), as Python writes them)."""
    import numpy as np

    texts = ('{"rt":0', ',"rest":1', '{"hw":2', ',"tail":3}')

    def row(flow, core):
        matched = SimpleNamespace(rec=SimpleNamespace(core=core))
        return (matched, 1.0, 2.0, 3.0, 4.0, 0.5, flow, texts)

    cases = [(0, 0, 0), (7, -3, 1), (2 ** 63 - 1, 2 ** 62, -(2 ** 63)), (-(2 ** 63) + 1, 5, 2 ** 64),
             (2 ** 70, np.int64(9), True), (-(2 ** 70), 12, np.int32(-4))]
    rows = [row(flow, core) for flow, _, core in cases]
    tids = [tid for _, tid, _ in cases]
    fast = lanes.device_lanes(rows, tids, [core for _, _, core in cases], 0.25, 4242, 2, 3)
    by_row = {id(r[0]): tid for r, tid in zip(rows, tids)}
    monkeypatch.setattr(_events, "_lanes", None)
    slow = _events._device_lanes(rows, lambda m: by_row[id(m)], 0.25, 4242)
    assert fast == ",".join(slow) and str(2 ** 70) in fast and '"tid":True' in fast


def test_times_are_written_as_python_writes_them(lanes):
    """The integer path (|x| < 2^53 / 1000, rounded half to even) and Python's own conversion
    (the rest) both give f"{x:.3f}": ties, negative zero, subnormals, huge and non-finite values."""
    import random
    import struct

    rng = random.Random(7)
    values = [0.0, -0.0, 0.0005, -0.0005, 0.0015, 0.0625, -0.0004, 2.0004999, 9007199254739.999, 9007199254740.0,
              1e20, 1e300, -1e308, 5e-324, float("inf"), float("-inf"), float("nan"), -float("nan")]
    values += [rng.randrange(-10 ** 9, 10 ** 9) / 2000 for _ in range(20000)]  # exact ties and their neighbours
    values += [rng.uniform(-1e7, 1e7) for _ in range(20000)]
    values += [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(20000)]
    assert [v for v in values if lanes.format_ms(v) != f"{v:.3f}"] == []


@pytest.mark.skipif(platform.system() != "Linux" or platform.machine() != "x86_64", reason="x86-64 fesetround")
def test_times_do_not_depend_on_the_rounding_mode(lanes):
    import ctypes

    libm = ctypes.CDLL("libm.so.6")
    fe_upward, previous = 0x800, libm.fegetround()
    values = [0.0001, 1.0002, 123.4561, -0.0004, 2.5e-4]
    assert libm.fesetround(fe_upward) == 0
    try:
        written = [lanes.format_ms(v) for v in values]
    finally:
        libm.fesetround(previous)
    assert written == [f"{v:.3f}" for v in values] == ["0.000", "1.000", "123.456", "-0.000", "0.000"]


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
