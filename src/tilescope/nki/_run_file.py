"""Run an NKI kernel file unchanged: ``tilescope nki run FILE.py[::NAME]``.

For the run only, ``import nki`` / ``import nki.language as nl`` / ``from neuronxcc import
nki`` / ``import neuronxcc.nki.isa as nisa`` (and ``typing``, ``compiler``) resolve to
:mod:`tilescope.nki`; when the run ends the previous entries of ``sys.modules`` are put
back, so an installed ``nki`` or ``neuronxcc`` package is untouched outside it.

* ``FILE.py`` runs the file as ``__main__`` (its benchmark or test driver).
* ``FILE.py::NAME`` with NAME a function of no arguments imports the file and calls it;
  with NAME a kernel, runs the ``__main__`` path and keeps that kernel's launches only.

Every launch is simulated (values from the numpy interpreter, time *modeled* by the
device model) and, unless ``profile_dir`` is None, all of them go into one profile
directory that ``tilescope explore`` opens.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TilescopeError
from ..lang.internal import filter_traceback
from ._jit import Launch, NkiKernel, recording

__all__ = ["run_file", "NkiRun", "nki_imports", "ALIASES"]

# module names a kernel file imports -> the tilescope module they mean during a run
ALIASES = {
    "nki": "tilescope.nki",
    "nki.language": "tilescope.nki.language",
    "nki.isa": "tilescope.nki.isa",
    "nki.typing": "tilescope.nki.typing",
    "nki.compiler": "tilescope.nki.compiler",
    "neuronxcc.nki": "tilescope.nki",
    "neuronxcc.nki.language": "tilescope.nki.language",
    "neuronxcc.nki.isa": "tilescope.nki.isa",
    "neuronxcc.nki.typing": "tilescope.nki.typing",
    "neuronxcc.nki.compiler": "tilescope.nki.compiler",
}


@contextlib.contextmanager
def nki_imports():
    """Within the block, NKI's module names import tilescope's (see the module docs)."""
    import importlib

    saved = {name: sys.modules.get(name) for name in list(ALIASES) + ["neuronxcc"]}
    before = set(sys.modules)
    shim = types.ModuleType("neuronxcc", "tilescope's stand-in for neuronxcc during `tilescope nki run`")
    shim.__path__ = []  # a package: its submodules are the aliases below
    shim.nki = importlib.import_module("tilescope.nki")
    sys.modules["neuronxcc"] = shim
    for name, target in ALIASES.items():
        sys.modules[name] = importlib.import_module(target)
    try:
        yield
    finally:
        for name in set(sys.modules) - before:  # submodules imported under the aliases during the run
            if name.split(".")[0] in ("nki", "neuronxcc"):
                del sys.modules[name]
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


@dataclass
class NkiRun:
    """What ``run_file`` did: the launches (each with its modeled result) and the profile."""

    path: Path
    launches: list[Launch] = field(default_factory=list)
    profile_dir: Path | None = None
    exit_code: int = 0

    def table(self) -> str:
        """One line per launch: modeled time, instructions, bound by, host time to trace and model."""
        if not self.launches:
            return "no kernel launches"
        rows = [("kernel", "grid", "instructions", "modeled us", "bound by", "host s")]
        for launch in self.launches:
            s = launch.result.summary
            rows.append((launch.kernel, "x".join(map(str, launch.grid)) or "-", f"{s.instructions:,}",
                         f"{s.total_us:,.2f}", s.bound_by, f"{launch.host_s:.2f}"))
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) if k in (0, 1, 4) else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths)))
                 for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines) + "\n(times modeled by tilescope's device model; host s: trace + model + values)"


def _user_frames(tb):
    """``tb`` without tilescope's frames and runpy's (the file's own frames remain)."""
    tb = filter_traceback(tb)
    kept = []
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name == "<frozen runpy>" or name.endswith(os.sep + "runpy.py") or name == __file__):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for entry in reversed(kept):
        out = types.TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out


def _split(target: str) -> tuple[Path, str | None]:
    path, _, name = str(target).partition("::")
    return Path(path), (name or None)


def run_file(target, *, name: str | None = None, argv=(), profile_dir="profile_out/nki",
             preset: str | None = None) -> NkiRun:
    """Run an NKI kernel file with its ``nki`` / ``neuronxcc.nki`` imports mapped to tilescope.

    ``target`` is ``FILE.py`` or ``FILE.py::NAME`` (see the module docs); ``argv`` becomes
    ``sys.argv[1:]``; ``profile_dir=None`` writes no profile. Errors in the file propagate
    (tilescope's own frames removed from the traceback).

    >>> import textwrap, tempfile, os
    >>> src = textwrap.dedent('''
    ...     import numpy as np
    ...     from neuronxcc import nki
    ...     import neuronxcc.nki.language as nl
    ...     @nki.jit
    ...     def inc(a):
    ...         out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    ...         nl.store(out, nl.add(nl.load(a), 1.0))
    ...         return out
    ...     if __name__ == "__main__":
    ...         assert (inc(np.zeros((128, 4), np.float32)) == 1).all()
    ... ''')
    >>> path = os.path.join(tempfile.mkdtemp(), "inc.py")
    >>> _ = open(path, "w").write(src)
    >>> r = run_file(path, profile_dir=None)
    >>> [launch.kernel for launch in r.launches], "neuronxcc" in sys.modules
    (['inc'], False)
    """
    path, parsed = _split(target)
    name = name or parsed
    if not path.is_file():
        raise FileNotFoundError(f"no kernel file {str(path)!r}")
    run = NkiRun(path.resolve())
    old_argv, old_path = sys.argv, list(sys.path)
    old_preset = os.environ.get("TILESCOPE_PRESET")
    if preset is not None:
        os.environ["TILESCOPE_PRESET"] = preset
    sys.argv = [str(path)] + list(argv)
    sys.path.insert(0, str(path.resolve().parent))  # the file's own helper modules, as `python FILE`
    try:
        keep = None
        with nki_imports(), recording() as launches:
            try:
                keep = _execute(path, name, launches)
            except SystemExit as e:
                run.exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except TilescopeError as e:
                raise e.with_traceback(_user_frames(e.__traceback__))
        run.launches = [launch for launch in launches if keep is None or launch.kernel == keep]
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
        if preset is not None:
            if old_preset is None:
                os.environ.pop("TILESCOPE_PRESET", None)
            else:
                os.environ["TILESCOPE_PRESET"] = old_preset
    if profile_dir is not None and run.launches:
        from ._launches_profile import write_launches_profile

        run.profile_dir = write_launches_profile(
            profile_dir, run.launches,
            config={"source": "tilescope nki run", "file": str(path), "name": name})
    return run


def _execute(path: Path, name: str | None, launches: list) -> str | None:
    """Run the file; returns the name of the kernel whose launches to keep (None: all)."""
    if name is None:
        runpy.run_path(str(path), run_name="__main__")
        return None
    module = runpy.run_path(str(path), run_name=f"__tilescope_nki__.{path.stem}")
    obj = module.get(name)
    if obj is None:
        raise TilescopeError(f"{path} has no {name!r}; name a kernel or a function of no arguments")
    if isinstance(obj, NkiKernel):
        launches.clear()  # importing the file may have launched kernels at its top level
        runpy.run_path(str(path), run_name="__main__")  # its main path launches it
        if not any(launch.kernel == obj.kernel.name for launch in launches):
            raise TilescopeError(
                f"{path}'s __main__ path never launched kernel {name!r}; name a function of no arguments that "
                f"calls it, or call it from the file's `if __name__ == \"__main__\":` block")
        return obj.kernel.name
    if not callable(obj):
        raise TilescopeError(f"{path}::{name} is a {type(obj).__name__}, not a kernel or a function")
    launches.clear()
    obj()
    return None
