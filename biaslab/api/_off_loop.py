"""Blocking work that may be asked for from inside a running event loop (a notebook cell).

Jupyter runs every cell inside its own asyncio loop, so ``asyncio.run`` there fails with
"cannot be called from a running event loop", and biaslab's runner and replays call it. When a
loop is running in the calling thread, the work goes to a worker thread with no loop of its
own, and the caller waits for it. Elsewhere (a script) it runs in the calling thread, where
``asyncio.run``'s own Ctrl-C handling cancels a run's task.

Interrupting the notebook (Ctrl-C, the kernel's stop button) lands in the waiting thread. The
worker is then stopped the way Ctrl-C stops the CLI: its run's task is cancelled (`Cancellable`),
or, for work that runs a loop of its own out of reach, a KeyboardInterrupt is raised inside it;
either way the runner keeps every finished cell and returned answer, and closes its store
and lock. Only then does the caller get what the work returned (an interrupted result) or
raised, as if it had run in the caller's thread: the run directory is free for
``resume=True`` at once, not held by a run still going in the background.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from typing import Callable, TypeVar

from biaslab.experiments.interrupts import Cancellable

__all__ = ["call_off_loop", "loop_is_running", "Cancellable"]

T = TypeVar("T")

_POLL_S = 0.1
"""How often the waiting thread wakes; a signal is handled at the next wake at the latest."""


def loop_is_running() -> bool:
    """Whether this thread is inside a running asyncio loop (a notebook cell, an async def)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _interrupt(thread: threading.Thread) -> None:
    """Raise KeyboardInterrupt in `thread` at its next Python instruction."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                   ctypes.py_object(KeyboardInterrupt))


def call_off_loop(fn: Callable[[], T], cancel: Callable[[], bool] | None = None) -> T:
    """``fn()``, in a worker thread when a loop is running here; its result or its exception.

    Args:
        cancel: how to stop `fn` on Ctrl-C (e.g. `Cancellable.cancel`); when it returns False,
            or is not given, a KeyboardInterrupt is raised in the worker instead."""
    if not loop_is_running():
        return fn()
    outcome: dict[str, object] = {}
    # Waited for with an Event, not Thread.join: a KeyboardInterrupt landing inside join can
    # mark a live thread stopped (CPython's bpo-45274 handling), and the wait would end early.
    finished = threading.Event()

    def work() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the caller as it is
            outcome["error"] = exc
        finally:
            finished.set()

    worker = threading.Thread(target=work, name="biaslab-off-loop", daemon=True)
    worker.start()
    try:
        while not finished.wait(_POLL_S):
            pass
    except KeyboardInterrupt:
        if not finished.is_set() and not (cancel is not None and cancel()):
            _interrupt(worker)  # once: a second one could land in the runner's cleanup
        while not finished.wait(_POLL_S):  # a second Ctrl-C stops the waiting, not the cleanup
            pass
        if not outcome:
            raise
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
