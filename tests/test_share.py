"""`tilescope share --redact` on an ordinary profile: fused built-ins and a tile kernel whose
file lies outside the working directory. The copy is complete, its executable/trace pairs
match, and it holds no host name, user name or absolute path."""

import getpass
import importlib.util
import json
import os
import re
import socket
import sys
import textwrap

import pytest
import torch

import tilescope
from tilescope.cli import main as cli
from tilescope.profiler import find_profiles, load

KERNEL = textwrap.dedent("""
    import tilescope
    import tilescope.lang as tl

    SECRET = "a line of the user's own source"

    @tilescope.kernel
    def doubled(x):
        out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm)
        t = tl.load(x)
        tl.store(out, t * 2.0)
        return out
""")

# an absolute path anywhere in a text: "/" starting a name, then at least two components
_ABS = re.compile(r"(?<![\w.~/-])(?:/[\w.@+-]+){2,}")


def _kernel_from(directory):
    directory.mkdir()
    (directory / "kernels_elsewhere.py").write_text(KERNEL)
    spec = importlib.util.spec_from_file_location("kernels_elsewhere", directory / "kernels_elsewhere.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory):
    import tilescope.device

    tilescope.device.register()
    tmp = tmp_path_factory.mktemp("share")
    mod = _kernel_from(tmp / "elsewhere")  # outside the working directory: recorded by absolute path
    x = torch.randn(128, 256).to("sim")
    w = torch.ones(256).to("sim")
    with tilescope.profile(str(tmp / "out")) as prof:
        y = torch.nn.functional.gelu(x)
        z = torch.nn.functional.rms_norm(x, (256,), w)
        s = torch.softmax(x, -1)
        k = mod.doubled(x)
        total = (y.sum() + z.sum() + s.sum() + k.sum()).cpu()
    assert torch.isfinite(total)
    return tmp, prof.profile_dir


def _copy(tmp, src, name, *extra):
    assert cli(["share", str(src), "--out", str(tmp / name), *extra]) == 0
    (copy,) = find_profiles(tmp / name)
    return load(copy.path)  # complete: manifest checksums verified


def test_redacted_share_of_builtins_and_an_outside_kernel(profile_dir):
    tmp, src = profile_dir
    original = load(src)
    texts = "".join(p.read_text() for p in original.executables().values())
    assert str(tmp / "elsewhere") in texts and "a line of the user's own source" in texts  # what is at stake

    copy = _copy(tmp, src, "shared")
    assert copy.path.parent.name == "host_pid_0"
    assert len(copy.executables()) == len(original.executables())
    for h in copy.executables():
        assert copy.program(h).hash == h  # re-hashed consistently with its content
    runs = copy.itraces()
    assert len(runs) == len(original.itraces())
    for h, _, trace in runs:  # executable / instruction trace pairs renamed together
        assert copy.load_itrace(trace)["program_hash"] == h and h in copy.executables()

    host = socket.gethostname().split(".")[0]
    user = getpass.getuser()
    word = lambda name: re.compile(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])")  # noqa: E731
    kernel_seen = False
    for f in copy.manifest["files"]:
        text = (copy.path / f["path"]).read_text()
        found = _ABS.findall(text)
        assert not found, (f["path"], found[:5])
        for secret in (str(tmp), os.path.dirname(tilescope.__file__), sys.prefix, os.path.expanduser("~")):
            assert secret not in text
        assert not word(host).search(text), f["path"]
        assert not word(user).search(text), f["path"]
        assert "Call stack" not in text and "a line of the user's own source" not in text  # no embedded source
        kernel_seen |= '"kernels_elsewhere.py:10:' in text  # provenance keeps the file name and line
    assert kernel_seen


def test_redacted_share_keeps_sources_when_asked(profile_dir):
    tmp, src = profile_dir
    copy = _copy(tmp, src, "with_sources", "--keep-sources")
    source = (copy.path / "sources" / "kernels_elsewhere.py").read_text()  # for the explorer's code view
    assert "a line of the user's own source" in source and "def doubled" in source
    for f in copy.manifest["files"]:
        assert str(tmp) not in (copy.path / f["path"]).read_text()


def test_a_damaged_executable_is_an_error_not_re_hashed(profile_dir, tmp_path, capsys):
    import shutil

    tmp, src = profile_dir
    broken = tmp_path / "broken"
    shutil.copytree(src, broken)
    exe = next(iter(load(broken).executables().values()))
    data = json.loads(exe.read_text())
    data["name"] += "_changed"
    exe.write_text(json.dumps(data))
    # the manifest's checksum catches it first; past that, the recorded hash would
    assert cli(["share", str(broken), "--out", str(tmp_path / "out")]) == 2
    assert "tilescope share:" in capsys.readouterr().err


def test_path_names_stay_distinct_and_short():
    from tilescope.profiler._share import _redactor

    redact = _redactor("vm", "alice")
    assert redact({"site": "/data/k.py:5:9", "b": "/srv/alice/k.py:7", "c": "sbuf:/data/k.py:5:9#0"}) == {
        "site": "k.py:5:9", "b": "2/k.py:7", "c": "sbuf:k.py:5:9#0"}
    # relative paths, rates and lanes are not absolute paths
    assert redact({"a": "src/pkg/k.py", "r": "GB/s", "lane": "vm/pid:1", "u": "alice's run"}) == {
        "a": "src/pkg/k.py", "r": "GB/s", "lane": "host/pid:1", "u": "user's run"}
    assert redact("/home/someone/venv/lib/python3.11/site-packages/tilescope/lower/kernels.py:12").endswith(
        "kernels.py:12")
