"""How the explorer computes without blocking: cancellable requests, a pool of connections
per trace, and shared results computed once.

* Every API request runs with a :class:`Token` (``current()`` in its thread). The server
  cancels it when the browser goes away (the socket closes: a fetch aborted by a new click,
  a page left); long work checks it, and a query running for it is interrupted.
* Analyses (op table, summary, roofline, device data, compare) run on :class:`Readers`:
  each trace has a few independent engine connections, so a slow analysis holds one of them
  and nothing else. The interactive answers (window, event, lifecycle, select, search, meta)
  read the in-memory index and never take a reader.
* :class:`Results` keeps each analysis' answer: the first request starts it on a worker
  thread, later ones wait for the same answer; when every request waiting for a running
  computation is gone, the computation is interrupted and nothing is kept. Answers that
  depend only on the trace are also written next to the engine's cache entry, so a second
  ``tilescope explore`` of the same trace answers at once.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import threading
import time

__all__ = ["Cancelled", "Token", "current", "using", "check", "Readers", "Results", "code_tag"]


class Cancelled(Exception):
    """The request's client went away (or its deadline passed): stop, answer nothing."""


class Token:
    """Cancellation state of one request."""

    def __init__(self):
        self._event = threading.Event()
        self._hooks: list = []
        self._lock = threading.Lock()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            hooks, self._hooks = self._hooks, []
        for h in hooks:
            try:
                h()
            except Exception:  # a hook that fails must not stop the others
                pass

    def on_cancel(self, hook) -> None:
        """Call ``hook()`` on cancellation (at once if already cancelled)."""
        with self._lock:
            if not self._event.is_set():
                self._hooks.append(hook)
                return
        hook()

    def off_cancel(self, hook) -> None:
        with self._lock:
            if hook in self._hooks:
                self._hooks.remove(hook)

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled("the request was cancelled")

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


_local = threading.local()
_NEVER = Token()


def current() -> Token:
    """The running request's token (a token never cancelled outside requests)."""
    return getattr(_local, "token", None) or _NEVER


class using:
    """``with using(token):`` makes ``token`` the current one in this thread."""

    def __init__(self, token: Token):
        self.token = token

    def __enter__(self):
        self.prev = getattr(_local, "token", None)
        _local.token = self.token
        return self.token

    def __exit__(self, *exc):
        _local.token = self.prev
        return False


def check() -> None:
    """Raise :class:`Cancelled` if the current request was cancelled."""
    current().check()


class Readers:
    """Independent engine connections (``Trace`` objects) over one opened source.

    ``with readers.take() as trace:`` lends one; a new one is opened while fewer than
    ``limit`` exist and all are in use (opening reads the cache entry's small files only)."""

    def __init__(self, first, opener, limit: int = 4):
        self._free = [first]
        self._count = 1
        self._opener = opener
        self._limit = limit
        self._cond = threading.Condition()

    def take(self):
        return _Lend(self)

    def _get(self):
        tok = current()
        with self._cond:
            while True:
                if self._free:
                    return self._free.pop()
                if self._count < self._limit:
                    self._count += 1
                    break
                tok.check()
                self._cond.wait(0.05)
        try:
            return self._opener()
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _put(self, trace) -> None:
        with self._cond:
            self._free.append(trace)
            self._cond.notify()


class _Lend:
    def __init__(self, readers: Readers):
        self.readers = readers

    def __enter__(self):
        self.trace = self.readers._get()
        return self.trace

    def __exit__(self, *exc):
        self.readers._put(self.trace)
        return False


def interrupt(trace) -> None:
    """Interrupt the query running on ``trace``'s connection (if it has one open)."""
    con = getattr(trace, "_con", None)
    if con is not None:
        try:
            con.interrupt()
        except Exception:  # an older DuckDB without interrupt: the query runs to its end
            pass


def code_tag() -> str:
    """A digest of the explorer's and the analysis engine's code: stored answers made by
    other code are not reused."""
    h = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (here, os.path.join(os.path.dirname(here), "trace")):
        for f in sorted(os.listdir(d)):
            if f.endswith(".py"):
                with open(os.path.join(d, f), "rb") as fh:
                    h.update(f.encode() + fh.read())
    return h.hexdigest()[:12]


_WORKER = "tilescope-explorer-compute"  # the name of Results' worker threads


class _Job:
    def __init__(self, future):
        self.future = future
        self.waiters = 0
        self.traces: list = []  # connections the computation is using (to interrupt)
        self.stop = Token()
        self.elsewhere = False  # computed by another process (Results.warm_elsewhere)


class Results:
    """Answers computed once per key (see the module doc)."""

    _pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix=_WORKER)

    def __init__(self, store_dir: str | None = None):
        self._done: dict = {}
        self._jobs: dict = {}
        self._lock = threading.Lock()
        self.store_dir = store_dir
        self.interrupted = 0  # computations stopped because nobody waited any more (tests read it)
        self.background: set = set()  # keys computed for everyone (warm-up): never interrupted

    def peek(self, key):
        return self._done.get(key)

    def _stored(self, name: str):
        if not self.store_dir or not name:
            return None
        p = os.path.join(self.store_dir, name + ".json")
        try:
            with open(p, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def store(self, name: str, value) -> None:
        """Keep ``value`` on disk as ``name`` (nothing when there is no store directory)."""
        if not self.store_dir or not name:
            return
        try:
            from ._api import to_json

            os.makedirs(self.store_dir, exist_ok=True)
            tmp = os.path.join(self.store_dir, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
            with open(tmp, "wb") as f:
                f.write(to_json(value))
            os.replace(tmp, os.path.join(self.store_dir, name + ".json"))
        except OSError:  # a read-only cache: keep the answer in memory only
            pass

    def get(self, key, fn, *, store: str | None = None, timeout: float | None = None):
        """The answer for ``key``: kept, stored on disk (``store`` names the file), or computed
        by ``fn(job)`` on a worker; waits for it while the current request is alive.
        ``fn`` registers the connections it uses with ``job.traces`` so that they can be
        interrupted, and may call ``job.stop.check()`` between steps."""
        if key in self._done:
            return self._done[key]
        tok = current()
        job, inline = self._join(key, fn, store)
        if job is None:
            return self._done[key]
        if inline:
            try:
                job.future.set_result(self._run(key, fn, job, store))
            except BaseException as e:  # the waiters below (and later ones) see the same error
                job.future.set_exception(e)
        t_end = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                try:
                    return job.future.result(timeout=0.02)
                except cf.TimeoutError:
                    pass
                tok.check()
                if t_end is not None and time.monotonic() > t_end:
                    raise Cancelled(f"no answer within {timeout:g} s")
        finally:
            with self._lock:
                job.waiters -= 1
                orphan = job.waiters == 0 and not job.future.done() and key not in self.background
            if orphan:
                self.interrupted += 1
                job.stop.cancel()
                for t in list(job.traces):
                    interrupt(t)

    def _join(self, key, fn, store):
        """(the job computing ``key``, joined as one more waiter; whether this thread must run
        it), or (None, False) when the answer is known (kept or read from disk)."""
        with self._lock:
            if key in self._done:
                return None, False
            job = self._jobs.get(key)
            inline = False
            if job is not None and job.elsewhere and job.future.cancel():
                # still queued behind other sources' analyses: a request wants it now, so it is
                # computed here instead of after the queue
                self._jobs.pop(key)
                self.background.discard(key)
                job = None
            if job is None:
                v = self._stored(store) if store else None
                if v is not None:
                    self._done[key] = v
                    return None, False
                job = _Job(None)
                # an answer asked for by a computation already on a worker (a comparison needs
                # each source's part) is computed on that worker: queued behind it, it could
                # wait for a worker that waits for it
                inline = threading.current_thread().name.startswith(_WORKER)
                job.future = cf.Future() if inline else self._pool.submit(self._run, key, fn, job, store)
                self._jobs[key] = job
                if inline:
                    job.future.set_running_or_notify_cancel()
            job.waiters += 1
            return job, inline

    def warm(self, key, fn, *, store: str | None = None) -> None:
        """Compute ``key`` in the background unless known (nobody waits for it)."""
        with self._lock:
            if key in self._done or key in self._jobs:
                return
            v = self._stored(store) if store else None
            if v is not None:
                self._done[key] = v
                return
            self.background.add(key)
            job = _Job(None)
            job.future = self._pool.submit(self._run, key, fn, job, store)
            self._jobs[key] = job

    def warm_elsewhere(self, key, start, *, store: str | None = None) -> bool:
        """Like :meth:`warm`, for a computation that runs elsewhere (another process) and
        keeps its answer on disk itself: ``start()`` returns its Future, or None when it
        cannot run there (then this returns False and the caller warms it here). A failed
        computation is forgotten: the next request computes it here."""
        with self._lock:
            if key in self._done or key in self._jobs:
                return True
            v = self._stored(store) if store else None
            if v is not None:
                self._done[key] = v
                return True
            fut = start()
            if fut is None:
                return False
            self.background.add(key)
            job = self._jobs[key] = _Job(fut)
            job.elsewhere = True

        def done(f):
            if f.cancelled():  # taken back from the queue by a request (see _join)
                return
            with self._lock:
                if f.exception() is None:  # a failure is computed again, here, by the next request
                    self._done[key] = f.result()
                if self._jobs.get(key) is job:
                    self._jobs.pop(key)
        fut.add_done_callback(done)
        return True

    def _run(self, key, fn, job: _Job, store):
        try:
            with using(job.stop):
                value = fn(job)
            with self._lock:
                self._done[key] = value
            if store:
                self.store(store, value)
            return value
        finally:
            with self._lock:
                self._jobs.pop(key, None)
