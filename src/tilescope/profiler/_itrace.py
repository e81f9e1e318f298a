"""Instruction traces and executables as profile files: their names, their text, their digests.

An instruction trace (``itraces/exec_<hash>.<run>.itrace.json``) is one modeled run of a
Program: the simulator's timeline as columns, its summary and the execution it belongs to. Its
columns -- the bulk of the file -- depend on the (immutable) Program and its modeled result
alone, so their text and SHA-256 state are made once per result and every run's file only adds
its ``execution`` object (docs/profile-format.md).

>>> from tilescope.profiler._itrace import itrace_name
>>> itrace_name("ab12", 3)
'itraces/exec_ab12.3.itrace.json'
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import orjson

__all__ = ["FORMAT_VERSION", "executable_name", "itrace_name", "itrace_bytes", "itrace_parts", "itrace_summary",
           "itrace_json"]

FORMAT_VERSION = 1  # of the profile format (docs/profile-format.md): its manifest and the files it lists


def executable_name(program_hash: str) -> str:
    return f"executables/exec_{program_hash}.json"


def itrace_name(program_hash: str, run: int) -> str:
    return f"itraces/exec_{program_hash}.{run}.itrace.json"


_COLUMNS_CACHE: dict = {}  # id(result) -> (result, text up to "execution", its sha256 state, summary), the latest 256
_COLUMNS_LOCK = threading.Lock()  # filled by the exporter and by launching threads (prepare_files)


def itrace_bytes(program, result, *, execution: dict | None = None) -> bytes:
    """``itrace_json`` serialised; the columns (the bulk) are serialised once per result."""
    return b"".join(itrace_parts(program, result, execution=execution)[0])


def itrace_parts(program, result, *, execution: dict | None = None) -> tuple[tuple[bytes, bytes], str]:
    """``itrace_bytes`` as the file's two parts and its SHA-256: the document up to its
    ``execution`` object -- the same for every run of one modeled result, made and hashed once
    -- and that object. An export writes the parts as they are (no join) and finishes the
    digest from the first part's."""
    prefix, digest, _ = _itrace_body(program, result)
    tail = orjson.dumps(execution or {}) + b"}"
    digest = digest.copy()
    digest.update(tail)
    return (prefix, tail), digest.hexdigest()


def _itrace_body(program, result) -> tuple[bytes, "hashlib._Hash", dict]:
    """The instruction trace's text up to its ``execution`` object (which it ends with), that
    text's SHA-256 state and the run's summary as a dict: all depend on the (immutable)
    Program and its modeled run alone."""
    key = id(result)
    cached = _COLUMNS_CACHE.get(key)
    if cached is None or cached[0] is not result:
        doc = _itrace_doc(program, result, None, _numpy_column)
        doc.pop("execution")
        prefix = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)[:-1] + b',"execution":'
        cached = (result, prefix, hashlib.sha256(prefix), doc["summary"])
        with _COLUMNS_LOCK:
            _COLUMNS_CACHE[key] = cached
            while len(_COLUMNS_CACHE) > 256:
                del _COLUMNS_CACHE[next(iter(_COLUMNS_CACHE))]
    return cached[1], cached[2], cached[3]


def itrace_summary(program, result) -> dict:
    """``result.summary.to_dict()``, made once per result (do not modify it)."""
    return _itrace_body(program, result)[2]


def _numpy_column(a: np.ndarray):
    """A column orjson writes itself, without a Python number per value: the text of its
    ``tolist()`` for ints and float64 (orjson writes a float32 value's shortest float32 form)."""
    if a.dtype.kind == "f" and a.dtype != np.float64:
        return a.tolist()
    return np.ascontiguousarray(a)


def itrace_json(program, result, *, execution: dict | None = None) -> dict:
    """The instruction-trace document of one modeled run (``result`` is a SimResult)."""
    return _itrace_doc(program, result, execution, np.ndarray.tolist)


def _itrace_doc(program, result, execution: dict | None, column) -> dict:
    tl = result.timeline
    return {
        "format": "tilescope.itrace",
        "version": FORMAT_VERSION,
        "program_hash": program.hash,
        "preset": result.summary.preset,
        "modeled": True,
        "execution": execution or {},
        "lanes": list(tl.lanes),
        "kinds": list(tl.kinds),
        "columns": {
            "index": column(tl.index),
            "lane": column(tl.lane),
            "kind": column(tl.kind),
            "start_ns": column(tl.start_ns),
            "end_ns": column(tl.end_ns),
            "bytes": column(tl.nbytes),
            "flops": column(tl.flops),
            "prov": column(tl.prov),
        },
        "summary": result.summary.to_dict(),
    }
