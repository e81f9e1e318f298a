"""The device worker: one thread that computes the numerics of every execution, in order.

It plays the part of the accelerator's execution stream: dispatch returns as soon as
a work item is queued, so the host's profiled time never includes the numerics.
Work items are ``(fn, args, kwargs, label)``; the loop is kept minimal because it shares the
interpreter lock with the host threads. The worker's own aten calls are hidden from
the profiler (record functions disabled on its thread).

An error in a work item does not stop the worker; it is raised, naming the
execution that failed, by the next call that waits for the device
(``synchronize``, ``.cpu()``, ``.item()``, printing). ``configure(blocking=True)``
(``TILESCOPE_LAUNCH_BLOCKING=1``) raises it at the call that caused it instead.

Ctrl-C while the host waits for the device cancels the work queued so far (the running
item is asked to stop through the cancel hooks, e.g. a C++ kernel's): the wait raises
``KeyboardInterrupt`` and the next wait a ``DeviceExecutionError`` saying the outputs of
the cancelled executions hold undefined values. An interpreter that exits on Ctrl-C
cancels the queue instead of finishing it; a second Ctrl-C while it waits for the running
item ends the process at once (exit status 130).
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
import time

import torch

from . import _config

__all__ = ["put", "wait", "cancel", "on_cancel", "pending_error", "DeviceExecutionError"]

_SYNC = "synchronize"  # the label of wait()'s marker: run even while queued work is skipped
_RESUME = "resume after cancel"
_CANCEL_HOOKS: list = []  # called by cancel(): stop the item running now (e.g. a C++ kernel)


class DeviceExecutionError(RuntimeError):
    """A device execution failed; raised at the next call that waits for the device."""


class WorkCancelled(RuntimeError):
    """Queued device work was cancelled (Ctrl-C): its outputs hold undefined values."""


class _Worker:
    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.errors: list[tuple[str, BaseException]] = []
        self.skipping = False  # after cancel(): drop items up to its resume marker
        self.skipped = 0
        self.thread = threading.Thread(target=self._run, name="tilescope-device-worker", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        torch._C._autograd._enable_record_function(False)
        _limit_threads()
        get = self.queue.get
        errors = self.errors
        while True:
            item = get()
            if item is None:  # interpreter exit
                return
            fn, args, kwargs, label = item
            if self.skipping and label != _SYNC and label != _RESUME:
                self.skipped += 1
                continue
            try:
                fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - reported at the next synchronisation
                errors.append((label, e))

    def cancel(self) -> None:
        """Drop the items queued so far (wait() markers still run) and ask the running one to stop."""
        if not self.skipping:
            self.skipping = True
            self.queue.put((self._resume, (), {}, _RESUME))
        for hook in list(_CANCEL_HOOKS):
            try:
                hook()
            except Exception:  # noqa: BLE001 - a hook must not keep the others from running
                pass

    def _resume(self) -> None:
        n, self.skipped, self.skipping = self.skipped, 0, False
        if n:
            self.errors.append(("queued work", WorkCancelled(
                f"{n} queued execution(s) were cancelled by an interrupt (Ctrl-C): the tensors they would have "
                f"written hold undefined values; compute them again")))


def _limit_threads(threads: int | None = None) -> None:
    """Give this thread's OpenMP regions ``threads`` threads (default: the settings'
    ``worker_threads``) -- a per-thread setting in OpenMP; ``torch.set_num_threads`` would
    change the host's too."""
    import ctypes

    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    try:
        ctypes.CDLL(path).omp_set_num_threads(int(threads or _config.settings().worker_threads))
    except (OSError, AttributeError):  # another OpenMP runtime: leave the default
        pass


def _on_settings(old, new) -> None:
    """``configure(worker_threads=...)``: applied on the worker thread, after the work queued
    before it (a worker not started yet reads the new settings when it starts)."""
    if new.worker_threads != old.worker_threads and _W is not None:
        put((_limit_threads, (new.worker_threads,), {}, "configure(worker_threads)"))


_W: _Worker | None = None
_LOCK = threading.Lock()


def _get() -> _Worker:
    global _W
    if _W is None:
        with _LOCK:
            if _W is None:
                _W = _Worker()
    return _W


def put(work) -> None:
    """Queue one work item ``(fn, args, kwargs, label)``."""
    w = _W if _W is not None else _get()
    w.queue.put(work)


def wait() -> None:
    """Block until every item queued so far has run; raise the first error, if any."""
    w = _W
    if w is None:
        return
    if threading.current_thread() is w.thread:
        return
    done = threading.Event()
    w.queue.put((done.set, (), {}, _SYNC))
    try:
        done.wait()
    except KeyboardInterrupt:  # Ctrl-C while waiting for the device: stop what is queued
        w.cancel()
        raise
    if w.errors:
        raise_pending()


def cancel() -> None:
    """Cancel the device work queued so far (the next wait reports it); see the module's doc."""
    if _W is not None:
        _W.cancel()


def on_cancel(hook) -> None:
    """Call ``hook()`` whenever queued work is cancelled, to stop the item running then
    (idempotent per hook)."""
    if hook not in _CANCEL_HOOKS:
        _CANCEL_HOOKS.append(hook)


def pending_error() -> tuple[str, BaseException] | None:
    w = _W
    return w.errors[0] if w is not None and w.errors else None


def raise_pending() -> None:
    w = _W
    if w is None or not w.errors:
        return
    label, err = w.errors[0]
    more = len(w.errors) - 1
    w.errors.clear()
    suffix = f" ({more} later execution(s) also failed)" if more else ""
    raise DeviceExecutionError(
        f"sim device: the execution of {label} failed: {type(err).__name__}: {err}{suffix}. "
        f"Device errors surface at the next call that waits for the device; set "
        f"TILESCOPE_LAUNCH_BLOCKING=1 (or tilescope.device.configure(blocking=True)) to raise "
        f"them at the call that caused them."
    ) from err


def _exiting_on_interrupt() -> bool:
    """The interpreter exits because Ctrl-C was not caught (its exception printed)."""
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return isinstance(last, KeyboardInterrupt)


def _drain_at_exit() -> None:
    """Stop the worker before the interpreter finalizes (a daemon thread left inside a CPU
    kernel at shutdown takes the process down): after the queued work, or at once when the
    exit is an uncaught Ctrl-C (the queue cancelled); a Ctrl-C while it waits cancels too,
    and a further one ends the process (status 130) without waiting for the running item."""
    w = _W
    if w is None or not w.thread.is_alive():
        return
    if _exiting_on_interrupt():
        w.cancel()
    w.queue.put(None)
    try:
        while w.thread.is_alive():
            w.thread.join(0.1)
    except KeyboardInterrupt:
        w.cancel()
        try:
            deadline = time.monotonic() + 5.0
            while w.thread.is_alive() and time.monotonic() < deadline:
                w.thread.join(0.1)
        except KeyboardInterrupt:
            pass
        if w.thread.is_alive():  # an item that cannot be stopped: do not finalize under it
            sys.stderr.write("tilescope: interrupted while the sim device was still running an execution; "
                             "exiting without waiting for it\n")
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(130)


atexit.register(_drain_at_exit)

_config.on_change(_on_settings)


def _after_fork_in_child() -> None:
    # the worker thread does not survive fork(); a child starts its own on first use
    global _W, _LOCK
    _W = None
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
