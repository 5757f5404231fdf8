"""Ctrl-C during ``biaslab run``: the first stops the run cleanly, the second quits at once.

Why not asyncio's own handling: ``asyncio.run`` cancels the run on the first Ctrl-C, but then
joins its executor threads, and the interpreter joins them again at exit. A thread computing a
reply of the embedded model held the process until the reply was done (minutes on a loaded
machine), printing nothing; the second Ctrl-C raised KeyboardInterrupt into that shutdown and
the process still waited. Here the first Ctrl-C says at once that the run is stopping and
cancels the run's task: every cell already finished is in the store, every answer already
returned is in the cache (both are committed as they come), and the embedded model stops its
generations at their next token (`biaslab.agents.providers.local`). Once the run has stopped
and said how much is kept, the process ends with ``os._exit(130)``: nothing of a normal exit
is left but waits. A second Ctrl-C ends the process on the spot, the same way; what is
committed stays, which is everything but the last fraction of a second.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any, Coroutine

__all__ = ["CtrlC", "Cancellable", "ctrl_c_guard", "interrupted_by_signal", "is_ctrl_c_watcher", "kept_message",
           "interrupt_hint_text", "quit_now", "run_coroutine", "set_interrupt_hint"]

EXIT_INTERRUPTED = 130
"""128 + SIGINT: what a shell reports for a command stopped by Ctrl-C."""


def kept_message(run_dir: Path, cells_total: int | None, hint: str | None = None) -> str:
    """How much of an interrupted run is kept, read from its store, and how to continue
    (`hint`: the command that continues it, default ``biaslab run --resume RUN_DIR``)."""
    # imported here: every `biaslab` command imports this module first (`cli.main`), and the
    # store's records (pydantic) would double the start-up of --help and of a refused argument;
    # every command that can be interrupted with cells to keep has loaded the store already.
    from biaslab.traces.store import STORE_FILE, RunStore

    hint = f"continue with: {hint or f'biaslab run --resume {run_dir}'}"
    if not (Path(run_dir) / STORE_FILE).is_file():
        return f"interrupted before any cell finished.\n{hint}"
    try:
        store = RunStore(run_dir, readonly=True)
        try:
            counts, cached = store.counts(), len(store.cache)
        finally:
            store.conn.close()
    except sqlite3.Error:
        return f"interrupted; finished cells are kept.\n{hint}"
    done, failed = counts["cells_done"], counts["cells_error"]
    of = f" of {cells_total}" if cells_total is not None else ""
    answers = "answer" if cached == 1 else "answers"
    # the command on a line of its own: a terminal wraps a long line anywhere, mid-word too
    return (f"interrupted: {done + failed}{of} cells kept ({done} done, {failed} "
            f"failed), {cached} {answers} cached.\n{hint}")


_LIVE_LINES = 2
"""The progress bar's height (`runner._Progress`: the cells line and the calls line). Its next
redraw moves up over that many lines and rewrites them, so a message written under a live
bar is followed by as many blank lines for it to take."""


def _say(line: str, *, under_live_bar: bool = False) -> None:
    """One line (or a few) on stderr from a signal handler: unbuffered, since the handler may
    have interrupted a write to ``sys.stderr`` (a reentrant write there raises). Under a live
    progress bar, blank lines follow for the bar's redraw to take, so none of the message
    is overwritten."""
    pad = "\n" * _LIVE_LINES if under_live_bar else ""
    data = f"\n{line}\n{pad}".encode("utf-8", "replace")
    try:
        os.write(sys.stderr.fileno(), data)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        try:
            print(line, file=sys.stderr)
        except RuntimeError:
            pass


_QUITTING = threading.Lock()


def quit_now(line: str | None = None, code: int = EXIT_INTERRUPTED) -> None:
    """Say `line` (once, whichever thread gets here first) and end the process at once."""
    if not _QUITTING.acquire(blocking=False):
        threading.Event().wait()  # another thread is ending the process
    if line:
        _say(line)
    _hard_exit(code)


def _hard_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe must not keep the process alive
            pass
    os._exit(code)


class Cancellable:
    """``asyncio.run(coro)`` whose task another thread (or a signal handler) can cancel: the
    runner then returns an interrupted result. `CtrlC` cancels through one, and so does
    ``biaslab.run`` in a notebook."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None

    def run(self, coro: Coroutine) -> Any:
        async def main():
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            try:
                return await coro
            finally:
                self._loop = self._task = None

        return asyncio.run(main())

    @property
    def running(self) -> bool:
        return self._task is not None

    def cancel(self) -> bool:
        """Cancel the running coroutine; False if none is running (nothing was done)."""
        loop, task = self._loop, self._task
        if loop is None or task is None:
            return False
        loop.call_soon_threadsafe(task.cancel)
        return True


class CtrlC:
    """SIGINT handling for one run, as a context manager (main thread only; elsewhere inert).

    While a coroutine started with `run` is going, the first Ctrl-C prints one line and cancels
    it (the runner returns an interrupted result); outside one it raises KeyboardInterrupt as
    usual. Any further Ctrl-C prints how much is kept and exits with 130 at once.
    """

    grace_s = 1.0
    """How long `leave` lets embedded-model calls reach their next token before giving up."""

    def __init__(self, run_dir: Path, cells_total: int | None, *, hint: str | None = None,
                 announce: bool = True):
        """`hint`: the command that continues the run (for the kept message); `announce`:
        whether the first Ctrl-C says so (a shard worker leaves that to its coordinator)."""
        self.run_dir, self.cells_total = Path(run_dir), cells_total
        self.hint, self.announce = hint, announce
        self.presses = 0
        self._running = Cancellable()
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> "CtrlC":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def run(self, coro: Coroutine) -> Any:
        """``asyncio.run(coro)``, with the first Ctrl-C cancelling it."""
        return self._running.run(coro)

    def _on_sigint(self, signum, frame) -> None:
        self.presses += 1
        if self.presses > 1:
            quit_now(f"biaslab: Ctrl-C again: quitting now. "
                     f"{kept_message(self.run_dir, self.cells_total, self.hint)}")
        if not self._running.running:
            raise KeyboardInterrupt
        if self.announce:
            # two lines of under 80 columns: a wrapped line's tail is lost in the redraw
            _say("biaslab: Ctrl-C: stopping; finished cells and returned answers are kept\n"
                 "biaslab: (Ctrl-C again to quit at once)", under_live_bar=True)
        self._running.cancel()

    def leave(self, code: int = EXIT_INTERRUPTED) -> int:
        """End an interrupted run's process once its outcome is printed.

        After a real Ctrl-C the process ends here with `code` (``os._exit``): the store is
        closed, and what remains of a normal exit only waits (the interpreter joins executor
        threads, tears down llama.cpp under a call still computing a long prompt) or lets a
        further Ctrl-C land in the shutdown. Otherwise (a KeyboardInterrupt raised some other
        way) it returns `code`, unless embedded-model calls are still running after
        `grace_s`."""
        if self.presses:
            _hard_exit(code)
        local = sys.modules.get("biaslab.agents.providers.local")
        if local is not None and not local.wait_native_calls(self.grace_s):
            _hard_exit(code)
        return code


_ACTIVE: list[CtrlC] = []
"""The `CtrlC` blocks entered in this process, innermost last."""


def run_coroutine(coro: Coroutine) -> Any:
    """``asyncio.run(coro)`` under the innermost active `CtrlC` (its first Ctrl-C cancels
    `coro`, a second quits at once), or plain ``asyncio.run`` outside one. Replays and shard
    workers run their grid through this, so they stop the way ``biaslab run`` does."""
    if _ACTIVE:
        return _ACTIVE[-1].run(coro)
    return asyncio.run(coro)


# -- every phase of every verb -----------------------------------------------------------------
_HINT: list[str] = []
_GUARD_STATE: dict[str, Any] = {"presses": 0, "on": None}
WATCHER_NAME = "biaslab-ctrl-c"


def is_ctrl_c_watcher(thread: threading.Thread) -> bool:
    """Whether `thread` is `ctrl_c_guard`'s watcher: it only waits in a read of its own pipe
    and holds no lock, so forking beside it is safe (see shards._can_fork)."""
    return thread.name == WATCHER_NAME and thread.daemon


def _forget_in_child() -> None:
    """A forked child (a --workers shard) does not share its parent's watcher: its Ctrl-C
    bytes must not reach the parent's pipe, where they would count as a second press."""
    guard = _GUARD_STATE.get("on")
    if guard is None or guard._fds is None:
        return
    try:
        signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        pass
    for fd in guard._fds:
        try:
            os.close(fd)
        except OSError:
            pass
    guard._fds, guard._on = None, False
    _GUARD_STATE["on"] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def set_interrupt_hint(hint: str | None) -> None:
    """What a Ctrl-C outside a run says is kept and how to go on (the report phase: the run is
    whole, ``biaslab report RUN`` writes its report again); None: nothing to say."""
    _HINT[:] = [hint] if hint else []


def interrupted_by_signal() -> bool:
    """Whether a real SIGINT reached this process while `ctrl_c_guard` was on."""
    return _GUARD_STATE["presses"] > 0


class ctrl_c_guard:
    """Ctrl-C for a whole ``biaslab`` command, in every phase (planning, calls, report, export,
    view): the first stops it within `grace_s` seconds, a second at once.

    Why a watcher thread: Python runs a signal handler only in the main thread, between
    bytecodes. A main thread inside one long C call (an SQLite query, a numpy kernel, a join of
    worker threads at exit) runs no handler until the call returns, so a KeyboardInterrupt
    alone can leave the process running for minutes, and a second Ctrl-C with it. The C-level
    handler writes each signal's number to a wakeup file descriptor at once, whatever the main
    thread is doing; a daemon thread reads it. The first Ctrl-C still raises KeyboardInterrupt
    in the main thread as usual (or, during a run's calls, `CtrlC` stops the run cleanly); if
    the process has not ended `grace_s` seconds later, the watcher ends it (exit 130, after
    saying what is kept). A second Ctrl-C ends it at once. What was committed stays: a run's
    cells and answers are committed as they come; a report's tables are derived from the store
    and can always be written again.

    Inert outside the main thread and where SIGINT is not Python's default handler (a caller
    that handles Ctrl-C itself keeps doing so)."""

    grace_s = 3.0

    def __init__(self) -> None:
        self._on = False
        self._old_fd = -1
        self._fds: tuple[int, int] | None = None
        self._previous: Any = None

    def __enter__(self) -> "ctrl_c_guard":
        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
            return self
        read, write = os.pipe()
        os.set_blocking(write, False)
        try:
            self._old_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(read)
            os.close(write)
            return self
        self._fds = (read, write)
        self._previous = signal.signal(signal.SIGINT, _raise_interrupt)
        _GUARD_STATE["presses"] = 0
        _GUARD_STATE["on"] = self
        self._on = True
        threading.Thread(target=self._watch, args=(read,), name=WATCHER_NAME,
                         daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if not self._on:
            return
        self._on = False
        _GUARD_STATE["on"] = None
        signal.signal(signal.SIGINT, self._previous)
        try:
            signal.set_wakeup_fd(self._old_fd)
        except (ValueError, OSError):
            signal.set_wakeup_fd(-1)
        read, write = self._fds
        os.close(write)  # the watcher's read returns b"": it ends
        self._fds = None

    def _watch(self, read: int) -> None:
        try:
            while True:
                data = os.read(read, 64)
                if not data:
                    return
                for number in data:
                    if number == signal.SIGINT and self._on:
                        self._pressed()
        except OSError:
            return
        finally:
            try:
                os.close(read)
            except OSError:
                pass

    def _pressed(self) -> None:
        _GUARD_STATE["presses"] += 1
        if _GUARD_STATE["presses"] > 1:
            if _ACTIVE:  # during a run's calls: what CtrlC says, from here (the main thread
                run = _ACTIVE[-1]  # may be inside a C call)
                quit_now(f"biaslab: Ctrl-C again: quitting now. "
                         f"{kept_message(run.run_dir, run.cells_total, run.hint)}")
            quit_now(f"biaslab: Ctrl-C again: quitting now{interrupt_hint_text()}")
        if _ACTIVE:  # a run's calls: CtrlC stops them and leaves, the way it always has
            return
        timer = threading.Timer(self.grace_s, self._too_slow)
        timer.daemon = True
        timer.start()

    def _too_slow(self) -> None:
        if _ACTIVE:
            return
        quit_now(f"biaslab: Ctrl-C: still busy after {self.grace_s:g} s; quitting now"
                 f"{interrupt_hint_text()}")


def interrupt_hint_text() -> str:
    return f"; {_HINT[0]}" if _HINT else ""


def _raise_interrupt(signum, frame) -> None:
    if _importing(frame):  # a module half imported: say the line and end, unwinding nothing
        quit_now(f"biaslab: interrupted{interrupt_hint_text()}")
    raise KeyboardInterrupt


def _importing(frame) -> bool:
    """Whether the main thread is inside an import (a lazily imported library: matplotlib,
    scikit-learn, a plugin). A KeyboardInterrupt raised there leaves an extension module half
    initialised, and unwinding or collecting it can crash the process (SIGSEGV, no message,
    as `export` did when interrupted while pyarrow loaded). Unwinding would finish nothing
    (what a command writes is committed as it goes, and a report can be written again), so
    the command ends at once instead: the same line, exit 130."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False
