"""Scheduler properties on small hand-built Programs."""

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


def test_dmas_share_bandwidth():
    def loads(n):
        b = TileBuilder(f"loads{n}")
        x = b.input("x", (128 * n, 2048), "float32")
        for k in range(n):
            t = b.sbuf((128, 2048), "float32", site=f"t{k}")
            b.dma_copy(t, x[128 * k:128 * (k + 1)])
        return simulate(b.build()).summary.total_ns

    one, two = loads(1), loads(2)
    nbytes = 128 * 2048 * 4
    # alone: fixed cost + bytes at the aggregate DMA rate (16 x 17 B/ns)
    assert one == pytest.approx(1300 + nbytes / 272.0)
    # two at once: the fixed costs overlap, the bytes share the bandwidth
    assert two == pytest.approx(1300 + 2 * nbytes / 272.0)


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
