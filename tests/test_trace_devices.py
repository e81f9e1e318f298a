"""Any accelerator's trace: device lanes from the trace's own metadata, vendors, and a warning
(never a silent "CPU only") for device-looking events no rule classifies.

The MTIA figures come from HolisticTraceAnalysis 0.5.0 on the committed real MTIA trace
(tests/data/kineto/mtia_inference_rank_0.json.gz): ``benchmarks/hta_reference.py`` prints them.
"""

from __future__ import annotations

import json
import os
import warnings

import pytest

import tilescope.trace as tt
from kineto_synth import COPY_US, KERNEL_US, VENDORS, make_trace, write

KINETO = os.path.join(os.path.dirname(__file__), "data", "kineto")
MTIA = os.path.join(KINETO, "mtia_inference_rank_0.json.gz")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILESCOPE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("key", sorted(VENDORS))
def test_every_vendor_dialect_finds_device_work(tmp_path, key):
    v = VENDORS[key]
    p = write(str(tmp_path / f"{key}.json"), make_trace(v, steps=2, kernels=3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", tt.TraceWarning)  # nothing unclassified
        t = tt.open(p)
        assert t.vendors() == {0: v.name}
    lanes = t.table("lanes").to_pylist()
    assert [lane["process_name"] for lane in lanes if lane["side"] == "device"] == [v.device_label]
    k = {kind: (n, ns) for kind, n, ns in t.sql(
        "SELECT kind, count(*), sum(dur_ns) FROM events WHERE side = 'device' GROUP BY kind").fetchall()}
    assert k["kernel"] == (6, 6 * KERNEL_US * 1000) and k["memcpy"] == (2, 2 * COPY_US * 1000)
    # every device event reaches its launch, and its time lands on the op that launched it
    ops = {r["name"]: r for r in t.op_table().to_pylist()}
    assert ops["aten::linear"]["device_total_ns"] == 2 * (3 * KERNEL_US + COPY_US) * 1000
    assert ops["aten::linear"]["device_calls"] == 8
    assert t.summary()["device_lanes"] == 1


def test_unknown_device_category_is_named_in_a_warning(tmp_path):
    p = write(str(tmp_path / "x.json"), make_trace(VENDORS["cuda"], extra_device_cat="acme_npu_events"))
    with pytest.warns(tt.TraceWarning, match=r"acme_npu_events \(1 events, device process 'GPU 0'\)"):
        t = tt.open(p)
        t.summary()
    assert any("acme_npu_events" in w for w in t.warnings)


def test_device_looking_category_on_an_unlabelled_process_is_not_silent(tmp_path):
    # an accelerator with no device process labels and unknown categories: no lane is a
    # device lane, but the report must not claim "CPU only" without a warning
    tr = make_trace(VENDORS["cuda"], steps=1, kernels=1)
    tr["traceEvents"] = [e for e in tr["traceEvents"] if e.get("pid") != 1] + [
        {"ph": "X", "cat": "acme_kernel", "name": "k", "pid": 100, "tid": 9, "ts": 1_000_200.0, "dur": 3.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 9, "ts": 1_000_100.0, "dur": 3.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 9, "ts": 1_000_110.0, "dur": 3.0}]
    p = write(str(tmp_path / "y.json"), tr)
    with pytest.warns(tt.TraceWarning, match="acme_kernel"):
        tt.open(p).summary()


def test_mtia_trace_is_not_read_as_cpu_only():
    with warnings.catch_warnings():
        warnings.simplefilter("error", tt.TraceWarning)
        t = tt.open(MTIA)
        assert t.vendors() == {0: "Meta MTIA"}
    s = t.summary()
    assert s["device_lanes"] == 24 and s["device_busy_ns"] > 0
    # HTA 0.5.0 get_gpu_kernel_breakdown (sum per name, us): merge 257,837; pe_exe 107,664;
    # remote 48,490; dma_request 44,482. HTA rounds a fractional-microsecond trace to whole
    # microseconds inward (start up, end down: up to 2 us less per event); tilescope keeps the
    # nanoseconds. Rounded HTA's way, tilescope's events give HTA's figures exactly.
    hta = {"merge": (36, 257_837), "pe_exe": (24, 107_664), "remote": (37, 48_490), "dma_request": (877, 44_482)}
    got = {r["name"]: r for r in t.kernels().to_pylist()}
    rounded = dict(t.sql("""SELECT name, sum(floor((ts_ns + dur_ns) / 1000) - ceil(ts_ns / 1000))::BIGINT FROM events
                            WHERE side = 'device' GROUP BY name""").fetchall())
    for name, (calls, us) in hta.items():
        assert got[name]["calls"] == calls
        assert rounded[name] == us, name
        assert 0 <= got[name]["total_ns"] / 1000 - us <= 2 * calls, name
    # the kernels are linked to the runtime call that submitted them (correlation ids)
    ops = {r["name"]: r for r in t.op_table().to_pylist()}
    assert ops["runFunction - job_prep_and_submit_for_execution"]["device_calls"] == 73


def test_truncated_plain_json_keeps_its_header(tmp_path):
    full = write(str(tmp_path / "full.json"), make_trace(VENDORS["cuda"], rank=1, steps=3))
    data = open(full, "rb").read()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: int(len(data) * 0.7)])
    with pytest.warns(tt.TraceWarning, match="ends inside 'traceEvents'"):
        t = tt.open(str(cut))
    assert t.ranks == [1]
    assert t.device_names() == ["GPU 0 test device"]


def test_distributed_info_written_as_python_text_gives_the_rank(tmp_path):
    p = write(str(tmp_path / "r.json.gz"), make_trace(VENDORS["mtia"], rank=5, dist_as_text=True))
    assert tt.open(p).ranks == [5]


def test_a_dur_of_1e20_is_named_as_too_large(tmp_path):
    tr = make_trace(VENDORS["cuda"], steps=1, kernels=1)
    tr["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::huge", "pid": 100, "tid": 1,
                              "ts": 1_000_500.0, "dur": 1e20})
    p = write(str(tmp_path / "h.json"), tr)
    with pytest.warns(tt.TraceWarning) as rec:
        t = tt.open(p)
    text = " ".join(str(w.message) for w in rec)
    assert "1 events have a 'dur' too large to be a time" in text and "no numeric 'dur'" not in text
    # kept as an instant: no call with a duration, nothing summed
    assert "aten::huge" not in {r["name"] for r in t.op_table().to_pylist()}


def test_calls_total_and_mean_count_the_same_events(tmp_path):
    tr = make_trace(VENDORS["cuda"], steps=1, kernels=1)
    for dur in (4.0, -3.0, None):  # a valid one, a negative one, one without dur
        e = {"ph": "X", "cat": "cpu_op", "name": "aten::odd", "pid": 100, "tid": 1, "ts": 1_000_600.0}
        if dur is not None:
            e["dur"] = dur
        tr["traceEvents"].append(e)
    p = write(str(tmp_path / "c.json"), tr)
    with pytest.warns(tt.TraceWarning):
        t = tt.open(p)
    row = {r["name"]: r for r in t.op_table().to_pylist()}["aten::odd"]
    assert (row["calls"], row["host_total_ns"], row["host_avg_ns"]) == (1, 4000, 4000)


def test_corruption_inside_a_gzip_stream_is_named_as_gzip_corruption(tmp_path):
    import gzip as _gzip

    raw = json.dumps(make_trace(VENDORS["cuda"], steps=200, kernels=3), indent=1).encode()
    blob = bytearray(_gzip.compress(raw, 6))
    mid = len(blob) // 2
    for k in range(mid, mid + 64):  # scribble over the middle of the deflate stream
        blob[k] ^= 0x5A
    p = tmp_path / "corrupt.json.gz"
    p.write_bytes(bytes(blob))
    with pytest.raises(tt.TraceFormatError, match=r"corrupt\.json\.gz: (corrupt gzip data near compressed byte|gzip "
                                                  r"stream ends early)"):
        tt.open(str(p))
