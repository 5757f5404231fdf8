"""The ``biaslab`` console command: Ctrl-C answered from the first instant.

`biaslab.cli.main` stops a command cleanly on Ctrl-C (`biaslab.experiments.interrupts`), but
only once its guard is on, and getting there imports LangGraph, pandas and pyarrow (about a
second). A Ctrl-C in that second used to print a Python traceback and kill the process by the
signal (exit -2, not 130), and one that landed in a native module's import could crash it at
exit (SIGSEGV while a half-initialised extension was torn down).

So the console script enters here, in a module whose first statements (before any other
import) set its own SIGINT handler: until the guard takes over, a Ctrl-C says one line and ends the process
at once with ``os._exit(130)``. Nothing has been written yet at that point (no run store, no
table), and ending without the interpreter's teardown is what avoids the crash: no
half-imported extension module is finalised. After the command returns, the same handler
covers the interpreter's exit (joining worker threads, flushing), for the same reasons.

The interpreter's own start, before it runs the console script's first import (about 20 ms
on an idle machine, tens to hundreds under load), is beyond any Python code: SIGINT's
disposition is the default there (death by the signal), then Python's own handler (a
traceback from inside `site` or an import). So the ``biaslab`` command is a launcher,
scripts/biaslab, that starts the Python entry point ``_biaslab`` (this module's `main`) with
SIGINT *blocked* (GNU env's ``--block-signal``): CPython leaves the signal mask as it finds
it, a Ctrl-C during its start stays pending, and this module unblocks SIGINT right after
`_quit` is in place, so a pending Ctrl-C is answered at that moment with the same line and
exit 130. What remains open is the launcher's own start (the shell's, before its trap, and
env's, before it blocks the signal: about 1.2 ms together at load 6 on two cores,
bench/results.md). ``python -m biaslab``, ``_biaslab`` run directly, and the launcher where
env has no ``--block-signal`` leave the interpreter's start open as before.
"""

from __future__ import annotations

import os
import signal

_LINE = b"\nbiaslab: interrupted\n"


def _quit(signum=None, frame=None) -> None:
    """One line, exit 130, no teardown (see the module docstring)."""
    try:
        os.write(2, _LINE)
    except OSError:
        pass
    os._exit(130)


def _take_sigint() -> bool:
    """Whether this process's Ctrl-C is now `_quit` (only in the main thread, and only where
    Python's default handler was in place: a caller that handles Ctrl-C keeps doing so)."""
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _quit)
        return signal.getsignal(signal.SIGINT) is _quit
    except ValueError:  # not the main thread
        return False


def _unblock_sigint() -> None:
    """Let SIGINT in. The `biaslab` launcher (scripts/biaslab) starts Python with SIGINT blocked,
    so a Ctrl-C during the interpreter's own start-up is kept pending rather than killing the
    process or raising inside an import; unblocked once `_quit` is in place, a pending one is
    answered here at once. Also before any child process or thread exists, so none inherits
    the block (llama.cpp servers, shard workers, Ray)."""
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    except (AttributeError, OSError):  # no pthread_sigmask (Windows)
        pass


# First of all, before any other import: this module is the console script's entry.
_HANDLING = _take_sigint()
_unblock_sigint()

__all__ = ["entry", "main"]


def main(argv: list[str] | None = None) -> int:
    """The console entry point: `biaslab.cli.main` behind an early Ctrl-C handler."""
    handling = _HANDLING or _take_sigint()
    try:
        from biaslab.cli import main as run_cli
        import biaslab.experiments.interrupts  # noqa: F401  (the guard's heavy imports)
    except KeyboardInterrupt:  # a caller's own handler raised it
        _quit()
    if handling:  # the guard in `run_cli` takes over from the default handler
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = run_cli(argv)
    except KeyboardInterrupt:  # between the handler's return and the guard
        _quit()
    if handling:
        signal.signal(signal.SIGINT, _quit)  # the interpreter's exit
    return code


def entry() -> None:
    """The `_biaslab` console script and ``python -m biaslab``: `main`, then `_exit_now`."""
    _exit_now(main())


def _exit_now(code: int | None) -> None:
    """End the process with `code`, Ctrl-C answered by `_quit` to the last instant.

    Why not the interpreter's own exit: CPython's finalisation first puts every handler Python
    installed back to the default, then tears the modules down (pandas, pyarrow, ...: a tenth
    of a second or more), and a Ctrl-C there killed the process by the signal without a word
    (`export` interrupted as it ended: 8 of 20 tries at 1.2-1.4 s). So what the exit would run
    for the program runs here, with `_quit` in place: waiting for non-daemon threads and the
    thread-pool exits (`threading._shutdown`), then the exit functions (`atexit`: logging,
    Ray, multiprocessing, temporary directories); then the streams are flushed and the process
    ends, skipping only the module teardown (objects still alive then are not finalised; every
    store and file biaslab writes is closed by then)."""
    import atexit
    import sys
    import threading

    try:
        getattr(threading, "_shutdown", lambda: None)()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        # A Ctrl-C from here on is held back and answered below, not lost to the exit.
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            if signal.SIGINT in signal.sigpending():
                _quit()
        except (AttributeError, OSError):  # no pthread_sigmask (Windows)
            pass
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))
