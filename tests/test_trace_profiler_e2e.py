"""The analysis engine on profiles written by the real profiler (torch.profiler + ProfileConfig
on the simulated device): the documented RMSNorm loop, read back by tilescope.trace."""

from __future__ import annotations

import os

import pytest
import torch

import tilescope.device
import tilescope.trace as tt
from documented_loop import fused_rmsnorm, run_documented_loop


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    tilescope.device.register()
    old = tilescope.device.settings().clock
    tilescope.device.configure(clock="virtual")
    old_cache = os.environ.get("TILESCOPE_CACHE_DIR")
    os.environ["TILESCOPE_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield tmp_path_factory
    tilescope.device.configure(clock=old)
    if old_cache is None:
        os.environ.pop("TILESCOPE_CACHE_DIR", None)
    else:
        os.environ["TILESCOPE_CACHE_DIR"] = old_cache


@pytest.fixture(scope="module")
def naive(sim):
    x = torch.randn(128, 256, device="sim")
    w = torch.randn(256, device="sim")
    prof, path = run_documented_loop(sim.mktemp("naive"), x, w)
    return prof, tt.open(str(path))


def test_op_table_agrees_with_key_averages(naive):
    prof, t = naive
    assert t.kind == "tilescope" and t.modeled
    ka = {e.key: e for e in prof.key_averages()}
    ops = {r["name"]: r for r in t.op_table().to_pylist()}
    for op in ("aten::mul", "aten::mean", "aten::add", "aten::rsqrt"):
        assert ops[op]["calls"] == ka[op].count
        assert ops[op]["device_self_ns"] > 0
        # key_averages' Self SIM (us) is the same modeled device time, read from torch's side
        assert ops[op]["device_self_ns"] / 1000 == pytest.approx(ka[op].self_device_time_total, rel=0.01, abs=1)


def test_six_executions_each_with_its_whole_chain(naive):
    _prof, t = naive
    assert t.sql("SELECT count(*) FROM events WHERE cat = 'hardware'").fetchall()[0][0] == 6
    eid = t.sql("SELECT eid FROM events WHERE name = 'aten::rsqrt' AND kind = 'op'").fetchall()[0][0]
    hops = [h["hop"] for h in t.lineage(eid)]
    assert hops[-4:] == ["op", "launch", "device", "instructions"]


def test_replay_on_another_preset_changes_device_times_only(naive):
    _prof, t = naive
    other = "trn1" if t.preset_name() == "trn2" else "trn2"  # replay on whichever it was not recorded on
    r = t.replay(other)
    same = "SELECT eid, ph, cat, name, pid, tid, program_hash FROM raw ORDER BY eid"
    assert t.sql(same).fetchall() == r.sql(same).fetchall()
    q = "SELECT dur_ns FROM events WHERE cat = 'hardware' ORDER BY eid"
    assert t.sql(q).fetchall() != r.sql(q).fetchall()


def test_fused_has_one_execution_where_naive_has_six_and_the_diff_says_so(sim, naive):
    _prof, t_naive = naive
    x = torch.randn(128, 256, device="sim")
    w = torch.randn(256, device="sim")
    _p, path = run_documented_loop(sim.mktemp("fused"), x, w, model=fused_rmsnorm)
    t_fused = tt.open(str(path))
    n = t_fused.sql("SELECT count(*) FROM events WHERE cat = 'hardware'").fetchall()[0][0]
    # F.rms_norm is one fused built-in: a regression that splits it again fails here, not skips
    assert n == 1, f"the simulated device runs F.rms_norm as {n} executions, not as its one fused built-in"
    d = tt.diff(t_naive, t_fused, names=["naive", "fused"])
    [f] = d.fusion
    assert f.before_executions == 6 and f.after_executions == 1
    assert sum(f.before_ops.values()) == 6 and f.before_ops["aten::mul"] == 3
    text = f.text()
    assert "6 ops" in text and "became 1" in text and "-5 executions" in text and "(modeled)" in text
    assert f.after_device_ns < f.before_device_ns and f.after_bytes < f.before_bytes
    print(text)
