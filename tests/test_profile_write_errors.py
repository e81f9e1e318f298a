"""A profile that cannot be written (a full disk) fails with an error naming the file, and
leaves no profile that looks complete."""

import errno
import os

import pytest
import torch

import tilescope
from tilescope.profiler import find_profiles
from tilescope.profiler import _fast_files


def test_a_failed_write_names_its_file(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")  # as os.write raises it: no file named

    monkeypatch.setattr(_fast_files.os, "write", full)
    target = tmp_path / "system_trace.json"
    with pytest.raises(OSError, match="No space left on device") as info:
        _fast_files.write_file(str(target), b"{}")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)


def test_torch_failing_to_write_its_trace_is_an_error_naming_it(tmp_path, monkeypatch):
    """torch's profiler logs a failed write of its trace (a full disk) and returns: the export
    must not go on as if the file were there."""
    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", lambda self, path: None)
    with pytest.raises(OSError, match="torch's profiler could not write its trace") as info:
        with tilescope.profile(str(tmp_path), device="cpu"):
            torch.randn(32, 32) @ torch.randn(32, 32)
    assert os.path.basename(info.value.filename) == "trace.json"
    assert not [p for p in find_profiles(tmp_path) if p.complete]
