"""The device worker: one thread that computes the numerics of every execution, in order.

It plays the part of the accelerator's execution stream: dispatch returns as soon as
a work item is queued, so the host's profiled time never includes the numerics.
The thread and its queue live in the native runtime (``_csrc/worker.cpp``): the items the
dispatch fast path queues (an aten op's CPU kernel on views of device memory) run there
without the interpreter lock, so a loop of small ops does not wait for the worker's
interpreter time; Python items -- ``(fn, args, kwargs, label)``, from :func:`put` -- take the
lock to run. The worker's own aten calls are hidden from the profiler (record functions
disabled on its thread).

An error in a work item does not stop the worker; it is raised, naming the
execution that failed, by the next call that waits for the device
(``synchronize``, ``.cpu()``, ``.item()``, printing). ``configure(blocking=True)``
(``TILESCOPE_LAUNCH_BLOCKING=1``) raises it at the call that caused it instead.

Ctrl-C while the host waits for the device cancels the work queued so far (the running
item is asked to stop through the cancel hooks, e.g. a C++ kernel's): the wait raises
``KeyboardInterrupt`` and the next wait a ``DeviceExecutionError`` saying the outputs of
the cancelled executions hold undefined values. An interpreter that exits on Ctrl-C
cancels the queue instead of finishing it; a second Ctrl-C while it waits for the running
item ends the process at once (exit status 130). (The host waits in short slices, so that
its interpreter takes the Ctrl-C.)
"""

from __future__ import annotations

import atexit
import os
import sys
import time

import torch

from . import _settings

__all__ = ["put", "wait", "cancel", "on_cancel", "pending_error", "DeviceExecutionError", "stats"]

_SLICE_S = 0.1  # a wait's slice: how soon a Ctrl-C is taken
_CANCEL_HOOKS: list = []  # called by cancel(): stop the item running now (e.g. a C++ kernel)


class DeviceExecutionError(RuntimeError):
    """A device execution failed; raised at the next call that waits for the device."""


class WorkCancelled(RuntimeError):
    """Queued device work was cancelled (Ctrl-C): its outputs hold undefined values."""


_native = None
_errors: list[tuple[str, BaseException]] = []  # taken from the native worker, not raised yet


def _rt():
    global _native
    if _native is None:
        from ._native_runtime import load

        _native = load()
        _native.worker_on_start(_limit_threads)
    return _native


def _limit_threads(threads: int | None = None) -> None:
    """Give this thread's OpenMP regions ``threads`` threads (default: the settings'
    ``worker_threads``) -- a per-thread setting in OpenMP; ``torch.set_num_threads`` would
    change the host's too."""
    import ctypes

    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    try:
        ctypes.CDLL(path).omp_set_num_threads(int(threads or _settings.settings().worker_threads))
    except (OSError, AttributeError):  # another OpenMP runtime: leave the default
        pass


def _on_settings(old, new) -> None:
    """``configure(worker_threads=...)``: applied on the worker thread, after the work queued
    before it (a worker not started yet reads the new settings when it starts)."""
    if new.worker_threads != old.worker_threads and _native is not None:
        put((_limit_threads, (new.worker_threads,), {}, "configure(worker_threads)"))


def put(work) -> None:
    """Queue one work item ``(fn, args, kwargs, label)``."""
    (_native or _rt()).worker_put(work)


def wait() -> None:
    """Block until every item queued so far has run; raise the first error, if any."""
    rt = _native
    if rt is None:
        return
    target = rt.worker_submitted()
    try:
        while not rt.worker_wait(target, _SLICE_S):
            pass
    except KeyboardInterrupt:  # Ctrl-C while waiting for the device: stop what is queued
        cancel()
        raise
    if _errors or rt.worker_has_failures():
        raise_pending()


def cancel() -> None:
    """Cancel the device work queued so far (the next wait reports it); see the module's doc."""
    if _native is None:
        return
    _native.worker_cancel()
    for hook in list(_CANCEL_HOOKS):
        try:
            hook()
        except Exception:  # noqa: BLE001 - a hook must not keep the others from running
            pass


def on_cancel(hook) -> None:
    """Call ``hook()`` whenever queued work is cancelled, to stop the item running then
    (idempotent per hook)."""
    if hook not in _CANCEL_HOOKS:
        _CANCEL_HOOKS.append(hook)


def _collect() -> None:
    if _native is None:
        return
    if _native.worker_has_failures():
        _errors.extend(_native.worker_take_failures())
    n = _native.worker_take_skipped()
    if n:
        _errors.append(("queued work", WorkCancelled(
            f"{n} queued execution(s) were cancelled by an interrupt (Ctrl-C): the tensors they would have "
            f"written hold undefined values; compute them again")))


def pending_error() -> tuple[str, BaseException] | None:
    _collect()
    return _errors[0] if _errors else None


def stats() -> dict:
    """Items the worker ran (native: without the interpreter lock; python), items pending."""
    if _native is None:
        return {"native_items": 0, "python_items": 0, "pending": 0, "skipped": 0, "running": False, "thread": 0}
    return _native.worker_stats()


def raise_pending() -> None:
    _collect()
    if not _errors:
        return
    label, err = _errors[0]
    more = len(_errors) - 1
    _errors.clear()
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
    """Stop the worker before the interpreter finalizes (a worker thread left inside a CPU
    kernel at shutdown takes the process down): after the queued work, or at once when the
    exit is an uncaught Ctrl-C (the queue cancelled); a Ctrl-C while it waits cancels too,
    and a further one ends the process (status 130) without waiting for the running item."""
    rt = _native
    if rt is None:
        return
    if _exiting_on_interrupt():
        cancel()
    if not rt.worker_request_stop():
        return
    try:
        while not rt.worker_join(_SLICE_S):
            pass
    except KeyboardInterrupt:
        cancel()
        _stop_after_interrupt(rt)


def _stop_after_interrupt(rt) -> None:
    """After a Ctrl-C at exit: give the running item 5 s to stop, else (or on a further
    Ctrl-C) end the process without finalizing under it."""
    stopped = False
    try:
        deadline = time.monotonic() + 5.0
        while not (stopped := rt.worker_join(_SLICE_S)) and time.monotonic() < deadline:
            pass
    except KeyboardInterrupt:
        pass
    if stopped:
        return
    sys.stderr.write("tilescope: interrupted while the sim device was still running an execution; "
                     "exiting without waiting for it\n")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(130)


atexit.register(_drain_at_exit)

_settings.on_change(_on_settings)
