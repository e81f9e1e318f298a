"""Scheduler properties on small hand-built Programs."""

import numpy as np
import pytest

from tilescope.program import TileBuilder
from tilescope.sim import cache_info, clear_cache, simulate


def _starts(result):
    start, end = result.timeline.by_instruction()
    return start, end


def test_independent_instructions_on_different_engines_overlap():
    b = TileBuilder("overlap")
    t1 = b.sbuf((128, 512), "float32", site="a")
    t2 = b.sbuf((128, 512), "float32", site="b")
    b.activation(t1, t1, "exp")  # ScalarE
    b.tensor_scalar(t2, t2, "add", 1.0)  # VectorE
    start, end = _starts(simulate(b.build()))
    assert start[0] == 0 and start[1] == 0


def test_dependent_instructions_serialise():
    b = TileBuilder("chain")
    t = b.sbuf((128, 512), "float32", site="a")
    u = b.sbuf((128, 512), "float32", site="b")
    b.activation(u, t, "exp")
    b.tensor_scalar(t, u, "add", 1.0)  # RAW on u
    b.activation(u, t, "exp")  # RAW on t, WAW on u
    start, end = _starts(simulate(b.build()))
    assert start[1] >= end[0] and start[2] >= end[1]


def test_war_dependency_orders_a_write_after_a_read():
    b = TileBuilder("war")
    t = b.sbuf((128, 512), "float32", site="a")
    u = b.sbuf((128, 512), "float32", site="b")
    b.activation(u, t, "exp")  # reads t
    b.memset(t, 0.0)  # writes t: must wait for the read
    start, end = _starts(simulate(b.build()))
    assert start[1] >= end[0]


def _loads(n, cols, queues=None, partitions=128, spec=None):
    b = TileBuilder(f"loads{n}x{cols}x{partitions}")
    x = b.input("x", (partitions * n, cols), "float32")
    for k in range(n):
        t = b.sbuf((partitions, cols), "float32", site=f"t{k}")
        b.dma_copy(t, x[partitions * k:partitions * (k + 1)], queue=None if queues is None else queues[k])
    return simulate(b.build(), spec).summary.total_ns


def _piece(partitions, cols):
    """One engine's share: its (at most 8) partition rows at 17 B/ns, 12 ns per <= 4 KiB descriptor."""
    row = cols * 4
    return min(8, partitions) * (row / 17 + -(-row // 4096) * 12)


def test_a_queue_issues_one_transfer_after_another_pipelined_with_the_data():
    big = _piece(128, 2048)  # 8 KiB rows: 3.9 us of data per engine, more than the 1.3 us issue
    assert _loads(1, 2048) == pytest.approx(1300 + big)
    # same site, same queue: the second issues during the first's data, its data follows in order
    assert _loads(2, 2048) == pytest.approx(1300 + 2 * big)
    small = _piece(128, 64)  # 256 B rows: issue-bound, one transfer per 1.3 us
    assert _loads(4, 64) == pytest.approx(4 * 1300 + small)


def test_transfers_on_different_queues_overlap_their_issue_and_share_the_engines():
    small = _piece(128, 64)
    assert _loads(4, 64, queues=[0, 1, 2, 3]) == pytest.approx(1300 + 4 * small)
    big = _piece(128, 2048)
    assert _loads(2, 2048, queues=[0, 1]) == pytest.approx(1300 + 2 * big)  # the engines are shared


def test_fewer_partitions_use_fewer_engines():
    # [dmaintro] 8 partitions per engine: 4 rows land on one engine, at one engine's rate
    assert _loads(1, 2048, partitions=4) == pytest.approx(1300 + _piece(4, 2048))
    assert _loads(1, 2048, partitions=4) > _loads(1, 2048, partitions=128) * 0.45


def test_queue_policy_free_lets_one_site_use_every_queue():
    from tilescope.spec import preset

    free = preset("trn1").replace(name="trn1-free", dma={"queue_policy": "free"})
    small = _piece(128, 64)
    assert _loads(4, 64, spec=free) == pytest.approx(1300 + 4 * small)
    assert _loads(4, 64) == pytest.approx(4 * 1300 + small)


def test_an_instruction_reading_its_predecessor_pays_the_pipeline_drain():
    b = TileBuilder("drain")
    t = b.sbuf((128, 1), "float32", site="t")
    u = b.sbuf((128, 1), "float32", site="u")
    for _ in range(4):
        b.activation(t, t, "exp")  # each reads the previous one's output
    for _ in range(4):
        b.activation(u, t, "exp")  # independent of each other (same input, WAW only on u)
    start, end = _starts(simulate(b.build()))
    fast = (60 + 64) / 1.4  # access + MIN_II at 1.4 GHz
    assert end[0] - start[0] == pytest.approx(fast)
    assert end[1] - start[1] == pytest.approx(fast + 100 / 1.4)  # [arch] ~100-cycle static overhead


def test_accumulating_matmuls_load_the_next_stationary_in_the_background():
    b = TileBuilder("accum")
    ws = [b.sbuf((128, 128), "bfloat16", site=f"w{k}") for k in range(8)]
    v = b.sbuf((128, 1), "bfloat16", site="v")
    acc = b.psum((128, 1), site="acc")
    for k, w in enumerate(ws):
        b.matmul(acc, w, v, accumulate=k > 0)  # a new stationary every time, one PSUM accumulation group
    start, _ = _starts(simulate(b.build()))
    # [perf] Opt #7: a matmul every ~64 cycles, LoadStationary (128/4 = 32 cycles) hidden behind it
    assert np.diff(start[1:]) == pytest.approx(64 / 2.8)


def test_vector_and_gpsimd_share_the_sbuf_port():
    b = TileBuilder("port")
    t1 = b.sbuf((128, 512), "float32", site="a")
    t2 = b.sbuf((128, 512), "float32", site="b")
    b.tensor_scalar(t1, t1, "add", 1.0, engine="dve")
    b.tensor_scalar(t2, t2, "add", 1.0, engine="pool")
    start, end = _starts(simulate(b.build()))
    assert start[1] >= end[0]  # independent, yet serialised by the shared port


def test_vector_and_scalar_do_not_share_sbuf_but_share_psum():
    b = TileBuilder("ports")
    t1 = b.sbuf((128, 512), "float32", site="a")
    t2 = b.sbuf((128, 512), "float32", site="b")
    b.tensor_scalar(t1, t1, "add", 1.0, engine="dve")
    b.activation(t2, t2, "exp")
    start, _ = _starts(simulate(b.build()))
    assert start[0] == start[1] == 0

    b = TileBuilder("psum")
    p1 = b.psum((128, 512), site="p1")
    p2 = b.psum((128, 512), site="p2")
    s1 = b.sbuf((128, 512), "float32", site="a")
    s2 = b.sbuf((128, 512), "float32", site="b")
    b.tensor_copy(s1, p1, engine="dve")
    b.activation(s2, p2, "copy")
    start, end = _starts(simulate(b.build()))
    assert start[1] >= end[0]


def test_neuroncore_v3_lifts_both_port_restrictions():
    """[arch2]: on v3 VectorE and GpSimd reach SBUF, and VectorE and ScalarE reach PSUM, in parallel."""
    from tilescope.spec import preset

    assert preset("trn1").shared_ports == ("sbuf", "psum") and preset("trn2").shared_ports == ()
    for name in ("trn1", "trn2"):
        b = TileBuilder("ports_v3", spec=name)
        p1 = b.psum((128, 512), site="p1")
        p2 = b.psum((128, 512), site="p2")
        s1 = b.sbuf((128, 512), "float32", site="a")
        s2 = b.sbuf((128, 512), "float32", site="b")
        s3 = b.sbuf((128, 512), "float32", site="c")
        b.tensor_copy(s1, p1, engine="dve")
        b.activation(s2, p2, "copy")
        b.tensor_scalar(s3, s3, "add", 1.0, engine="pool")
        start, end = _starts(simulate(b.build()))
        if name == "trn1":
            assert start[1] >= end[0] and start[2] >= end[0]
        else:
            assert start[0] == start[1] == start[2] == 0


def _pipeline(bufs):
    b = TileBuilder(f"pipe{bufs}", bufs=bufs)
    x = b.input("x", (512, 2048), "float32")
    y = b.output("y", (512, 2048), "float32")
    for r0, n in b.tiles(512, 128):
        t = b.sbuf((n, 2048), "float32", site="t")
        b.dma_copy(t, x[r0:r0 + n])
        b.activation(t, t, "exp")
        b.dma_copy(y[r0:r0 + n], t)
    return simulate(b.build())


def test_buffer_rotation_lets_independent_iterations_overlap():
    one, three = _pipeline(1), _pipeline(3)
    s1, e1 = _starts(one)
    s3, e3 = _starts(three)
    # instructions 0..2 are iteration 0 (load, exp, store); 3 is the next load
    assert s1[3] >= e1[2]  # one buffer: the next load waits for the store (WAR)
    assert s3[3] < e3[2]  # rotating buffers: it starts while iteration 0 is in flight
    assert three.summary.total_ns < 0.75 * one.summary.total_ns


def test_schedule_is_deterministic_and_cached():
    clear_cache()
    r1 = _pipeline(2)
    info = cache_info()
    r2 = _pipeline(2)
    assert cache_info()["hits"] == info["hits"] + 1
    assert r1 is r2
    clear_cache()
    r3 = _pipeline(2)
    assert (r3.timeline.start_ns == r1.timeline.start_ns).all()


def test_matmul_loads_stationary_once_for_repeated_use():
    b = TileBuilder("ls")
    a = b.sbuf((128, 128), "bfloat16", site="a")
    m = b.sbuf((128, 512), "bfloat16", site="m")
    acc = b.psum((128, 512), site="acc")
    for k in range(4):
        b.matmul(acc, a, m, accumulate=k > 0)
    tl = simulate(b.build()).timeline
    kinds = [tl.kinds[k] for k in tl.kind]
    assert kinds.count("load_stationary") == 1


def test_summary_is_labelled_modeled_and_consistent():
    r = _pipeline(3)
    s = r.summary
    assert s.modeled
    assert "modeled" in s.table().title
    assert s.hbm_read_bytes == s.hbm_write_bytes == 512 * 2048 * 4
    assert s.dma_transfers == 8
    assert 0 < s.utilization["DMA"] <= 1
    assert s.bound_by == "DMA"
    assert "modeled" in r.timeline.text()
