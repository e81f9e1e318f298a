"""ProfileConfig refuses bad values at construction, naming the value and what to pass."""

import pytest

from tilescope.profiler import ProfileConfig, ProfileMode
from tilescope.profiler._config import parse_cores


@pytest.mark.parametrize("kwargs, message", [
    (dict(modes=()), "modes is empty; pick at least one of DEVICE"),
    (dict(modes=("bogus",)), "unknown profile mode 'bogus'; use one of DEVICE, RUNTIME, HOST_CPU, HOST_MEMORY"),
    (dict(max_events_per_core=0), "max_events_per_core must be a whole number >= 1 (instruction events kept per "
                                  "core), got 0; the default keeps 1,000,000"),
    (dict(max_events_per_core=1.5), "max_events_per_core must be a whole number >= 1"),
    (dict(max_events_per_core="abc"), "max_events_per_core must be a whole number >= 1"),
    (dict(device_profile="every"), "device_profile must be 'first' or 'session', got 'every'"),
    (dict(capture_cores="0,x"), "capture_cores '0,x': cannot read 'x'; use core ids and ranges"),
    (dict(capture_cores="3-1"), "capture_cores '3-1': the range '3-1' runs backwards; write it low-high (1-3)"),
])
def test_bad_values_are_refused_with_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ProfileConfig(**kwargs)


def test_an_output_dir_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "profile_out"
    path.write_text("not a directory")
    with pytest.raises(ValueError, match="is a file; profiles are directories written under it: pass a directory"):
        ProfileConfig(output_dir=path)
    assert ProfileConfig(output_dir=tmp_path / "new").output_dir.endswith("new")  # missing: made at export


def test_cores_and_modes_read_as_documented():
    assert parse_cores("0,1,2-4") == {0, 1, 2, 3, 4} and parse_cores("all") is None
    cfg = ProfileConfig(modes="runtime", capture_cores="1")
    assert cfg.modes == (ProfileMode.RUNTIME,) and cfg.captures(1) and not cfg.captures(0)


def test_modes_by_the_names_manifests_write_and_a_manifest_config_round_trips():
    cfg = ProfileConfig(modes=["DEVICE", "host_cpu"])
    assert cfg.modes == (ProfileMode.DEVICE, ProfileMode.HOST_CPU)
    again = ProfileConfig(**{k: v for k, v in cfg.to_dict().items()})
    assert again.to_dict() == cfg.to_dict()


def test_what_only_the_device_or_the_block_can_check(tmp_path, capsys):
    """A core the device does not have; a config given with its own arguments; one host
    sampler per process; the CLI's bad options as one line before the script runs."""
    import tilescope
    import tilescope.device as dev
    from tilescope.cli import main
    from tilescope.profiler import Profiler

    dev.register()
    cores = dev.settings().preset.cores_per_chip
    with pytest.raises(ValueError, match=f"capture_cores '0,99': the device has {cores} core\\(s\\), 0-{cores - 1}; "
                                         f"99 is not one of them"):
        Profiler(ProfileConfig(output_dir=str(tmp_path), capture_cores="0,99"))
    with pytest.raises(ValueError, match="give the ProfileConfig or its arguments, not both"):
        with tilescope.profile(tmp_path, config=ProfileConfig(output_dir=str(tmp_path))):
            pass
    host = ProfileConfig(output_dir=str(tmp_path), modes=["HOST_CPU"])
    assert Profiler(host)._sampler is Profiler(host)._sampler
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('the script ran')\n")
    for bad, says in ((["--mode", "bogus"], "unknown profile mode 'bogus'"), (["--cores", "3-1"], "runs backwards"),
                      (["--max-events", "0"], "must be a whole number >= 1")):
        assert main(["profile", *bad, str(script)]) == 2
        assert says in capsys.readouterr().err
