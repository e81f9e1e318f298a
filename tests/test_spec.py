"""Hardware presets: lookup, derivation, and the numbers the docs give."""

import pytest

from tilescope.spec import CoreSpec, preset, preset_names


def test_presets_exist_and_default_is_trn1(monkeypatch):
    monkeypatch.delenv("TILESCOPE_PRESET", raising=False)
    assert {"trn1", "inf2", "trn2"} <= set(preset_names())
    assert preset().name == "trn1"


def test_env_var_selects_preset(monkeypatch):
    monkeypatch.setenv("TILESCOPE_PRESET", "trn2")
    assert preset().name == "trn2"


def test_trn1_headline_figures_match_the_architecture_guide():
    p = preset("trn1")
    assert p.partitions == 128
    assert p.sbuf_bytes == 24 * 1024 * 1024
    assert p.psum_bytes == 2 * 1024 * 1024
    assert p.psum_bank_bytes == 2048
    # 92 TFLOPS bf16, 23 fp32 (arch guide), from 128x128 PEs at 2.8 GHz
    assert p.peak_flops("bfloat16") / 1e12 == pytest.approx(91.75, rel=1e-3)
    assert p.peak_flops("float32") / 1e12 == pytest.approx(22.94, rel=1e-3)
    assert p.dma.bytes_per_ns == pytest.approx(272.0)  # 16 x 17 B/ns
    assert p.hbm_bytes_per_ns == 410.0


def test_trn2_figures():
    p = preset("trn2")
    assert p.sbuf_bytes_per_partition == 224 * 1024
    assert p.peak_flops("bfloat16") / 1e12 == pytest.approx(78.6, rel=1e-2)
    assert p.dma.bytes_per_ns == pytest.approx(368.0)
    assert p.cores_per_chip == 8


def test_archdma_variant_is_reachable():
    assert preset("trn1-archdma").dma.bytes_per_ns_per_engine == pytest.approx(27 * 2**30 / 1e9)


def test_replace_derives_and_changes_fingerprint():
    p = preset("trn1")
    q = p.replace(runtime_exec_us=99.0, vector={"clock_ghz": 2.0})
    assert q.runtime_exec_us == 99.0 and q.vector.clock_ghz == 2.0
    assert p.vector.clock_ghz == 1.12  # frozen: the original is untouched
    assert q.fingerprint != p.fingerprint
    with pytest.raises(TypeError, match="no field"):
        p.replace(not_a_field=1)


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ValueError, match="unknown hardware preset 'trn9'.*trn1"):
        preset("trn9")


def test_assumed_fields_are_documented_as_assumed():
    import inspect

    from tilescope.spec.presets import trn1

    src = inspect.getsource(trn1)
    for field in ("runtime_exec_us", "host_dispatch_us", "descriptor_ns", "queue_policy"):
        before = src[: src.index(field + "=")]
        assert "ASSUMED" in before[-700:], field
    assert isinstance(preset("trn1"), CoreSpec)
