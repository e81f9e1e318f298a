"""The background analyses run in worker processes, at a lower priority than the server.

Why a process: the analyses a session warms up at start (op tables, summary, HTA's
analyses, roofline, each source's part of a comparison) take seconds to minutes of DuckDB
and Python work on a large trace. Run as threads of the server's process, their Python
code holds the GIL between the window, event and lifecycle answers' numpy calls, and on a
machine with few cores they take the cores the page's requests need. In a worker process at
``nice`` +5 they do neither: the server's process keeps its GIL to itself and the
scheduler gives the server's threads the cores first.

A worker is ``python -m tilescope.explorer._offload`` (its own interpreter: nothing of the
server's process, its threads or its ``__main__`` is copied). It reads tasks from its stdin
and writes answers to its stdout, one pickled ``(name, spec)`` / ``(ok, value)`` at a time;
it opens each source's trace from the engine's cache (the server opened it before, so that
reads small files only), computes a named analysis of :data:`._api.NAMED`, and writes the
answer where :class:`._work.Results` keeps answers. Workers stop with the server: on its
exit they are killed, and a worker whose parent is gone exits by itself.

>>> fut = submit({"path": "tests/data/kineto/cpu_only_tiny.json.gz", "what": "", "store": None}, "kernels")  # doctest: +SKIP
>>> sorted(fut.result())  # doctest: +SKIP
['modeled', 'table', 'what']
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading

__all__ = ["submit", "compute", "WORKERS", "NICE"]

WORKERS = 2  # processes: a large trace's longest analysis does not hold back the others
# added to a worker's niceness: the server's threads get ~3x a worker's share of a busy core
# (CFS weights 1024 vs 335), and a machine busy with other work still runs the analyses
NICE = 5

_lock = threading.Lock()
_tasks: queue.Queue = queue.Queue()  # (future, name, spec), taken by whichever worker is free
_procs: list = []
_started = False


def submit(spec: dict, name: str):
    """A :class:`concurrent.futures.Future` of analysis ``name`` of the source ``spec``
    (``{"path", "source_dirs", "what", "store"}``: what :func:`compute` reads), computed in a
    worker process (a worker that cannot start or dies fails the future: the caller
    computes the answer itself then)."""
    global _started
    with _lock:
        if not _started:
            _started = True
            for _ in range(WORKERS):
                th = threading.Thread(target=_feed, name="tilescope-explorer-offload", daemon=True)
                th.start()
            atexit.register(_stop)
    fut: cf.Future = cf.Future()  # pending until a worker takes it: until then it can be cancelled
    _tasks.put((fut, name, spec))
    return fut


def _spawn():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the server's tilescope
    p = subprocess.Popen([sys.executable, "-m", "tilescope.explorer._offload"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, env=env)
    with _lock:
        _procs.append(p)
    return p


def _feed() -> None:
    """One worker process's feeder: sends it the next task, waits for its answer."""
    proc = None
    while True:
        fut, name, spec = _tasks.get()
        if not fut.set_running_or_notify_cancel():  # a request computed it meanwhile
            continue
        try:
            if proc is None or proc.poll() is not None:
                proc = _spawn()
            _send(proc.stdin, (name, spec))
            ok, value = _recv(proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError, struct.error) as e:
            proc = None  # a worker that died is replaced for the next task
            fut.set_exception(RuntimeError(f"the analysis worker stopped while computing {name!r}: {e}"))
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def _stop() -> None:
    with _lock:
        procs = list(_procs)
    for p in procs:
        if p.poll() is None:
            p.kill()


def _send(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def _recv(f):
    head = f.read(8)
    if len(head) < 8:
        raise EOFError("the worker closed its output")
    (n,) = struct.unpack("<Q", head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError("the worker's answer was cut short")
    return pickle.loads(data)


_sources: dict = {}  # in a worker: the sources it opened, by path


def compute(spec: dict, name: str):
    """Analysis ``name`` of the source ``spec`` (what a worker runs); its answer is also
    written to ``spec["store"]/<file>.json`` when the analysis names a file."""
    from . import _api
    from ._session import Source

    key = (spec["path"], tuple(spec.get("source_dirs") or ()))
    src = _sources.get(key)
    if src is None:
        src = Source("p0", spec["path"], list(key[1]))
        src.open_trace()
        _sources[key] = src
    _key, store, how = _api.NAMED[name]
    value = how(src.trace, spec.get("what", ""), src.allowed)
    if store and spec.get("store"):
        from ._work import Results

        Results(spec["store"]).store(store, value)
    return value


def _orphan_watch(parent: int) -> None:
    import time

    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)  # the server is gone: nobody wants the answer


def _serve() -> None:
    try:
        os.nice(NICE)
    except (OSError, AttributeError):  # not allowed, or no nice on this OS: the server's priority
        pass
    threading.Thread(target=_orphan_watch, args=(os.getppid(),), daemon=True).start()
    fin, fout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything an analysis prints must not corrupt the answers
    while True:
        try:
            name, spec = _recv(fin)
        except EOFError:
            return
        try:
            answer = (True, compute(spec, name))
        except Exception as e:  # the server raises it to whoever waits for the answer
            answer = (False, RuntimeError(f"{type(e).__name__}: {e}"))
        _send(fout, answer)


if __name__ == "__main__":
    _serve()
