"""ProfileConfig refuses bad values at construction, naming the value and what to pass."""

import pytest

from tilescope.profiler import ProfileConfig, ProfileMode
from tilescope.profiler._config import parse_cores


@pytest.mark.parametrize("kwargs, message", [
    (dict(modes=()), "modes is empty; pick at least one of DEVICE"),
    (dict(modes=("bogus",)), "'bogus' is not a valid ProfileMode"),
    (dict(max_events_per_core=0), "max_events_per_core must be >= 1, got 0"),
    (dict(device_profile="every"), "device_profile must be 'first' or 'session', got 'every'"),
    (dict(capture_cores="0,x"), "capture_cores '0,x': cannot read 'x'; use core ids and ranges"),
    (dict(capture_cores="3-1"), "capture_cores '3-1': cannot read '3-1'"),
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
