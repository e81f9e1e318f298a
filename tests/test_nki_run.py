"""Whole NKI kernels, written in NKI's documented style (tests/nki_kernels/), run unchanged
through ``tilescope nki run``: their ``neuronxcc.nki`` / ``nki`` imports are mapped for the
run only, each file's ``__main__`` checks its values against numpy, and the run's launches
land in one profile the explorer opens."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tilescope.nki import run_file
from tilescope.profiler import read_profile

KERNELS = os.path.join(os.path.dirname(__file__), "nki_kernels")

# file -> kernels its main path launches, in order
FILES = {
    "grid_add.py": ["grid_add"],
    "transpose2d.py": ["transpose_free", "transpose_partition"],
    "avgpool2d.py": ["avgpool2d"],
    "rmsnorm.py": ["rmsnorm"],
    "layernorm.py": ["layernorm"],
    "matmul.py": ["matmul_tiled", "matmul_blocked"],
    "flash_attention.py": ["flash_attention", "flash_attention"],
    "selective_scan.py": ["selective_scan"],
    "moe_router.py": ["moe_router"],
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_kernel_file_runs_unchanged_with_values_checked(name, tmp_path, capsys):
    run = run_file(os.path.join(KERNELS, name), profile_dir=tmp_path)
    assert run.exit_code == 0
    assert f"{name[:-3]}: OK" in capsys.readouterr().out  # the file's own numpy check passed
    assert [launch.kernel for launch in run.launches] == FILES[name]
    for launch in run.launches:
        assert launch.result.summary.modeled and launch.result.summary.total_ns > 0
    prof = read_profile(run.profile_dir).require_complete()
    assert len(list(prof.itraces())) == len(run.launches)
    for module in ("nki", "neuronxcc", "nki.language", "neuronxcc.nki"):
        assert module not in sys.modules  # mapped for the run only


def test_the_explorer_opens_the_run_profile(tmp_path):
    from tilescope.explorer import Session, api

    run = run_file(os.path.join(KERNELS, "matmul.py"), profile_dir=tmp_path)
    session = Session([str(run.profile_dir)])
    ex = api(session, "/api/p/p0/executions")["executions"]
    assert len(ex) == 2 and {e["program_hash"] for e in ex} == {launch.result.program.hash for launch in run.launches}
    head, cols = api(session, "/api/p/p0/device", hash=ex[0]["program_hash"], run=ex[0]["run"])
    assert head["modeled"] and len(cols["index"]) >= len(run.launches[0].result.program)


def test_cli_runs_a_file_and_prints_modeled_times(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(KERNELS), "..", "src"),
                                                      os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "tilescope", "nki", "run", os.path.join(KERNELS, "grid_add.py"),
                        "--profile-dir", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "grid_add: OK" in p.stdout and "modeled" in p.stdout and "2x2" in p.stdout
    assert "tilescope explore" in p.stdout


def test_name_selects_a_function_or_a_kernels_launches(tmp_path):
    run = run_file(os.path.join(KERNELS, "transpose2d.py") + "::check", profile_dir=None)
    assert [launch.kernel for launch in run.launches] == ["transpose_free", "transpose_partition"]
    run = run_file(os.path.join(KERNELS, "transpose2d.py") + "::transpose_partition", profile_dir=None)
    assert [launch.kernel for launch in run.launches] == ["transpose_partition"]


def test_an_installed_nki_package_is_shadowed_only_during_the_run(tmp_path, monkeypatch):
    fake = tmp_path / "site" / "nki"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    kernel = tmp_path / "k.py"
    kernel.write_text(textwrap.dedent("""
        import numpy as np
        import nki
        import nki.language as nl
        assert not hasattr(nki, "REAL")
        @nki.jit
        def neg(a):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.negative(nl.load(a)))
            return out
        assert (neg(np.ones((4, 4), np.float32)) == -1).all()
    """))
    run = run_file(str(kernel), profile_dir=None)
    assert [launch.kernel for launch in run.launches] == ["neg"]
    import nki

    assert nki.REAL  # the installed package again, after the run
    del sys.modules["nki"]


def test_an_error_in_a_kernel_file_points_at_its_line_without_internal_frames(tmp_path):
    kernel = tmp_path / "bad.py"
    kernel.write_text(textwrap.dedent("""
        import numpy as np
        import neuronxcc.nki as nki
        import neuronxcc.nki.isa as nisa
        import neuronxcc.nki.language as nl
        @nki.jit
        def bad(a):
            t = nl.load(a)
            m = nisa.sequence_bounds(segment_ids=t)
            return m
        bad(np.ones((128, 8), np.float32))
    """))
    from tilescope.errors import KernelError

    with pytest.raises(KernelError) as e:
        run_file(str(kernel), profile_dir=None)
    msg = str(e.value)
    assert "nisa.sequence_bounds is not supported by tilescope" in msg and "on the host" in msg
    assert f"{kernel.name}:9" in msg or f"bad.py:9" in msg
    tb, files = e.tb, []
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    assert files[-1] == str(kernel)
    internal = [f for f in files[2:] if os.sep + "tilescope" + os.sep in f or "runpy" in f]
    assert internal == []  # after run_file's own line, only the kernel file's frames
