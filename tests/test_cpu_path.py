"""The real-device workflow on this CPU, end to end: the RMSNorm study profiled with
--device cpu, then read by the analysis engine, then served by the explorer's data API."""

import pytest

import tilescope.trace as tt
from tilescope.profiler import diagnose, load
from tilescope.studies import rmsnorm


@pytest.fixture(scope="module")
def cpu_profiles(tmp_path_factory):
    out = tmp_path_factory.mktemp("rmsnorm_cpu")
    return {impl: rmsnorm.run(impl, "fp32", out, device="cpu", quiet=True) for impl in ("naive", "fused", "compiled")}


def test_cpu_profiles_are_complete_and_say_what_ran(cpu_profiles):
    for impl, path in cpu_profiles.items():
        p = load(path)
        assert p.device["kind"] == "cpu" and p.device.get("measured_on")
        assert p.executables() == {}  # no modeled programs on a real device
        assert diagnose(path) == [] or all(f.severity == "info" for f in diagnose(path))


def test_analysis_reads_the_cpu_profiles(cpu_profiles):
    naive = tt.open(cpu_profiles["naive"])
    ops = {row["name"]: row for row in naive.op_table().to_pylist()}
    assert ops["aten::mul"]["calls"] == 3 and ops["aten::mean"]["calls"] == 1
    assert not naive.modeled
    fused = tt.open(cpu_profiles["fused"])
    assert "aten::rms_norm" in {row["name"] for row in fused.op_table().to_pylist()}


def test_comparison_labels_measured_rows(cpu_profiles, capsys):
    rows = rmsnorm.compare({f"{k} (cpu)": v for k, v in cpu_profiles.items()})
    assert all(r["kind"] == "cpu" and r["source"].startswith("host time, measured on") for r in rows.values())
    assert "measured" in capsys.readouterr().out


def test_explorer_data_api_serves_a_cpu_profile(cpu_profiles):
    explorer = pytest.importorskip("tilescope.explorer")
    t = tt.open(cpu_profiles["naive"])
    w = t.window(pixels=200)
    assert len(w["events"]["eid"]) > 0
    assert explorer is not None


def test_profile_dir_is_set_when_the_block_raises(tmp_path):
    """An exception inside ``tilescope.profile()`` still writes the profile of what ran, and
    ``prof.profile_dir`` names it."""
    import pytest
    import torch

    import tilescope
    from tilescope.profiler import load

    with pytest.raises(ValueError, match="user's bug"):
        with tilescope.profile(str(tmp_path), device="cpu") as prof:
            torch.randn(64, 64) @ torch.randn(64, 64)
            raise ValueError("the user's bug")
    assert prof.profile_dir is not None and load(prof.profile_dir).path == prof.profile_dir
