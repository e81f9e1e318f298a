"""Compile operator sources into a shared library, cached by content.

The user's sources include only ``tilescope/gpsimd.h`` (no PyTorch headers), so the
machine's C++ compiler is called directly: each source becomes an object file named by
the hash of everything that affects it -- its bytes, the bytes of every header it
includes (from the compiler's ``-MMD`` dependency list), the flags and the compiler's
version -- and the library is named by the hash of its objects. An unchanged load
therefore compiles nothing and links nothing; an edit recompiles only the edited source.

Each library gets a manifest (``lib<name>.<hash>.json``: its sources and flags), from which
:func:`build_counting` builds the same sources once more for the device model's compute
estimate: the user's sources with ``-fsanitize-coverage=trace-pc`` (a probe at the start of
every basic block, which the runtime counts) and without auto-vectorization (the estimate
counts scalar instructions; see :mod:`tilescope.cpp._count`), into ``<build dir>/count``.

>>> from tilescope.cpp._build import include_dir, runtime_source
>>> (include_dir() / "tilescope" / "gpsimd.h").is_file(), runtime_source().name
(True, 'gpsimd_runtime.cpp')
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ._errors import CompileError

__all__ = ["BuildResult", "build", "build_counting", "include_dir", "runtime_source", "compiler_command",
           "default_build_root", "COUNT_FLAGS"]

_HERE = Path(__file__).resolve().parent
_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall")
# the user's sources carry line tables, so a kernel that faults is reported at its source line
# (debug information does not change the generated code)
_USER_FLAGS = ("-g",)
# the user's sources in a counting build: a probe per basic block, scalar code
COUNT_FLAGS = ("-fsanitize-coverage=trace-pc", "-fno-tree-vectorize", "-fno-tree-slp-vectorize")
_COMPILER_IDS: dict[tuple[str, ...], str] = {}


def include_dir() -> Path:
    """The directory to add with ``-I`` (it holds ``tilescope/gpsimd.h``)."""
    return _HERE / "include"


def runtime_source() -> Path:
    return _HERE / "runtime" / "gpsimd_runtime.cpp"


def compiler_command() -> list[str]:
    """The C++ compiler: ``$CXX`` if set, else ``c++``, ``g++`` or ``clang++`` from PATH."""
    env = os.environ.get("CXX")
    if env:
        return env.split()
    for name in ("c++", "g++", "clang++"):
        if shutil.which(name):
            return [name]
    raise CompileError(
        "no C++ compiler found: set $CXX or install g++ (>= 9) or clang++ (>= 10); "
        "tilescope builds C++ operators with the machine's compiler"
    )


def default_build_root() -> Path:
    """``$TILESCOPE_CACHE_DIR/cpp``, else ``~/.cache/tilescope/cpp``."""
    base = os.environ.get("TILESCOPE_CACHE_DIR")
    root = Path(base) if base else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tilescope"
    return root / "cpp"


def _compiler_id(cxx: list[str]) -> str:
    key = tuple(cxx)
    if key not in _COMPILER_IDS:
        try:
            out = subprocess.run(cxx + ["--version"], capture_output=True, text=True, timeout=60)
        except OSError as e:
            raise CompileError(f"cannot run the C++ compiler {' '.join(cxx)!r}: {e}") from None
        _COMPILER_IDS[key] = (out.stdout.splitlines() or ["?"])[0]
    return _COMPILER_IDS[key]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str | None:
    try:
        return _sha(path.read_bytes())
    except OSError:
        return None


@dataclass(frozen=True)
class BuildResult:
    """A built library: its path, whether it came from the cache, and the time taken."""

    path: Path
    cached: bool
    seconds: float
    compiled: tuple[str, ...]  # sources compiled by this build (empty when cached)


@dataclass(frozen=True)
class _Source:
    path: Path  # absolute
    shown: str  # as the user wrote it, for messages


def _object_paths(obj_dir: Path, src: _Source, key: str) -> tuple[Path, Path]:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", src.path.name)
    base = f"{stem}-{key[:16]}"
    return obj_dir / f"{base}.o", obj_dir / f"{base}.deps.json"


def _source_key(src: _Source, cxx_id: str, flags: tuple[str, ...]) -> str:
    data = src.path.read_bytes()
    return _sha(json.dumps([cxx_id, flags, str(src.path)]).encode() + b"\0" + data)


def _object_is_fresh(obj: Path, deps: Path) -> bool:
    if not obj.exists() or not deps.exists():
        return False
    try:
        recorded = json.loads(deps.read_text())
    except (OSError, ValueError):
        return False
    return all(_file_sha(Path(p)) == h for p, h in recorded.items())


def _parse_depfile(text: str) -> list[str]:
    body = text.split(":", 1)[1] if ":" in text else ""
    body = body.replace("\\\n", " ")
    return [p for p in re.split(r"(?<!\\)\s+", body) if p]


def _shown(text: str, sources: list[_Source]) -> str:
    """Compiler output with absolute source paths written the way the user wrote them."""
    for s in sources:
        text = text.replace(str(s.path), s.shown)
    return text


def _compile(cxx: list[str], flags: tuple[str, ...], src: _Source, obj: Path, deps: Path,
             all_sources: list[_Source], verbose: bool) -> None:
    tmp_obj = obj.with_name(obj.name + f".{os.getpid()}.tmp")
    depfile = obj.with_name(obj.name + f".{os.getpid()}.d")
    cmd = cxx + list(flags) + ["-I", str(include_dir()), "-MMD", "-MF", str(depfile),
                               "-c", str(src.path), "-o", str(tmp_obj)]
    if verbose:
        print(" ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    output = _shown(proc.stdout + proc.stderr, all_sources)
    if proc.returncode != 0:
        tmp_obj.unlink(missing_ok=True)
        depfile.unlink(missing_ok=True)
        raise CompileError.from_output(src.shown, output, internal=(str(include_dir()),))
    if verbose and output.strip():
        print(output, end="", flush=True)
    headers = [Path(p) for p in _parse_depfile(depfile.read_text())]
    depfile.unlink(missing_ok=True)
    recorded = {str(h.resolve()): _file_sha(h) for h in headers}
    os.replace(tmp_obj, obj)
    tmp_deps = deps.with_name(deps.name + f".{os.getpid()}.tmp")
    tmp_deps.write_text(json.dumps(recorded, indent=0))
    os.replace(tmp_deps, deps)


def build(name: str, sources: list[str | os.PathLike], build_directory: str | os.PathLike | None = None,
          extra_cflags: list[str] | None = None, verbose: bool = False, *, counting: bool = False,
          cores: int | None = None) -> BuildResult:
    """Build ``lib<name>.so`` from ``sources`` (plus tilescope's runtime); reuse it when unchanged.

    Returns the path of a content-named library (``lib<name>.<hash>.so``); ``lib<name>.so``
    next to it always points at the newest build, for :func:`tilescope.cpp.load_library`.
    ``counting=True`` compiles the user's sources with :data:`COUNT_FLAGS` (see
    :func:`build_counting`). ``cores``: the mode the library is built for (1, or the GpSimd
    cores of a multicore build), recorded in it for :func:`tilescope.cpp.load_library`.
    """
    t0 = time.perf_counter()
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise CompileError(f"library name {name!r} must be a C identifier (letters, digits, '_')")
    srcs: list[_Source] = []
    for s in sources:
        p = Path(s)
        if not p.exists():
            raise CompileError(f"source file {str(s)!r} does not exist (looked at {p.resolve()})")
        srcs.append(_Source(p.resolve(), str(s)))
    if not srcs:
        raise CompileError("no sources given: pass compute_srcs (kernels) and shape_srcs (shape functions)")
    srcs.append(_Source(runtime_source(), "tilescope/cpp/runtime/gpsimd_runtime.cpp"))
    out_dir = Path(build_directory) if build_directory is not None else default_build_root() / name
    obj_dir = out_dir / "obj"
    obj_dir.mkdir(parents=True, exist_ok=True)

    cxx = compiler_command()
    flags = _FLAGS + tuple(extra_cflags or ())
    runtime = srcs[-1]
    cxx_id = _compiler_id(cxx)
    plan = []
    for src in srcs:
        if src is runtime:
            src_flags = flags + ((f"-DTILESCOPE_BUILD_CORES={int(cores)}",) if cores else ())
        else:
            src_flags = flags + _USER_FLAGS + (COUNT_FLAGS if counting else ())
        key = _source_key(src, cxx_id, src_flags)
        obj, deps = _object_paths(obj_dir, src, key)
        plan.append((src, key, obj, deps, _object_is_fresh(obj, deps), src_flags))
    stale = [p for p in plan if not p[4]]
    if stale:
        workers = max(1, min(len(stale), os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            futures = [pool.submit(_compile, cxx, src_flags, src, obj, deps, srcs, verbose)
                       for src, _, obj, deps, _, src_flags in stale]
            errors = []
            for f in futures:
                try:
                    f.result()
                except CompileError as e:
                    errors.append(e)
            if errors:
                raise errors[0] if len(errors) == 1 else CompileError.combine(errors)

    # the library: named by its objects (each object's name already hashes its inputs)
    lib_key = _sha(json.dumps([cxx_id, flags, counting, [p[1] for p in plan],
                               [json.loads(p[3].read_text()) for p in plan]]).encode())
    lib_path = out_dir / f"lib{name}.{lib_key[:16]}.so"
    cached = not stale and lib_path.exists()
    if not lib_path.exists():
        tmp = lib_path.with_name(lib_path.name + f".{os.getpid()}.tmp")
        # (-lrt: timer_create, in the C library itself since glibc 2.34)
        cmd = cxx + ["-shared", "-Wl,--no-undefined"] + [str(p[2]) for p in plan] + ["-lrt", "-o", str(tmp)]
        if verbose:
            print(" ".join(cmd), flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise CompileError.from_output(f"lib{name}.so (link)", _shown(proc.stdout + proc.stderr, srcs))
        os.replace(tmp, lib_path)
    _write_manifest(lib_path, name, srcs[:-1], extra_cflags, cores)
    _point_stable_name(out_dir / f"lib{name}.so", lib_path)
    _prune(out_dir, f"lib{name}.*.so", keep={lib_path})
    for p in plan:
        _prune(obj_dir, p[2].name.rsplit("-", 1)[0] + "-*.o", keep={p[2]})
    compiled = tuple(p[0].shown for p in stale)
    return BuildResult(lib_path, cached, time.perf_counter() - t0, compiled)


def _write_manifest(lib_path: Path, name: str, sources: list[_Source], extra_cflags, cores) -> None:
    manifest = lib_path.with_suffix(".json")
    data = {"name": name, "sources": [str(s.path) for s in sources], "shown": [s.shown for s in sources],
            "extra_cflags": list(extra_cflags or ()), "cores": cores}
    if not manifest.exists() or json.loads(manifest.read_text() or "{}") != data:
        tmp = manifest.with_name(manifest.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, manifest)


def build_counting(library: str | os.PathLike, verbose: bool = False) -> BuildResult:
    """The counting build of a library built by :func:`build`: the same sources and flags,
    the user's sources instrumented (:data:`COUNT_FLAGS`), in ``<its directory>/count``."""
    path = Path(library).resolve()
    manifest = path.with_suffix(".json")
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        raise CompileError(
            f"{path} has no build manifest ({manifest.name}): the device model counts the instructions of "
            f"a kernel by building its sources again; load the library with tilescope.cpp.load(...)"
        ) from None
    missing = [s for s in data["sources"] if not Path(s).exists()]
    if missing:
        raise CompileError(f"the sources of {path.name} moved or were deleted ({missing[0]}): the device model "
                           f"needs them to count the kernel's instructions; load the library again from its sources")
    return build(data["name"], data["sources"], path.parent / "count", data["extra_cflags"], verbose, counting=True,
                 cores=data.get("cores"))


def _prune(folder: Path, pattern: str, keep: set[Path], newest: int = 4) -> None:
    """Delete all but the ``newest`` files matching ``pattern`` (old builds of the same source)."""
    found = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime if p.exists() else 0, reverse=True)
    for p in found[newest:]:
        if p in keep:
            continue
        sibling = p.with_name(p.name[:-2] + ".deps.json") if p.suffix == ".o" else p.with_suffix(".json")
        for q in (p, sibling):
            if q is not None:
                q.unlink(missing_ok=True)


def _point_stable_name(link: Path, target: Path) -> None:
    try:
        if link.is_symlink() and os.readlink(link) == target.name:
            return
        fd, tmp = tempfile.mkstemp(prefix=link.name, dir=link.parent)
        os.close(fd)
        os.unlink(tmp)
        os.symlink(target.name, tmp)
        os.replace(tmp, link)
    except OSError:  # file systems without symlinks: copy instead
        shutil.copyfile(target, link)
