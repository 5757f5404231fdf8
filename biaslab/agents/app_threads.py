"""Thread pools started inside an audited app's node inherit the node's cell.

Context variables (which cell a call belongs to, which node runs, whether the code is the
app's) follow tasks but not threads: ``concurrent.futures.ThreadPoolExecutor`` runs each
submitted function in a worker thread with an empty context, so a model call made there
belongs to no cell and would be refused. While an audited cell runs,
``ThreadPoolExecutor.submit`` (which ``map`` uses too) runs the function in a copy of the
submitter's context when the submitter is app code, exactly as ``asyncio.to_thread`` does:
the call is the node's, attributed, exposed and recorded as if the node had made it itself.
Submissions from code that is not the app's are left as they were.

A bare ``threading.Thread`` is not followed: its thread outlives any one submission and no
copy can be taken at the right moment for every pattern. Its calls and connections are
refused (`biaslab.agents.app_guard`).

The event loop an audit runs on gets a default executor that never makes work wait for a
thread (`roomy_default_executor`): the app's sync nodes block threads of that executor while
their calls are answered on the loop, and the answer itself may need a thread of it.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from concurrent.futures import ThreadPoolExecutor

from biaslab.agents.app_guard import APP, who
from biaslab.agents.class_patch import ClassPatch

__all__ = ["install_pool_context", "uninstall_pool_context", "roomy_default_executor",
           "APP_THREADS_MAX"]

APP_THREADS_MAX = 1024
"""Threads the audit loop's default executor may start: one per sync app node waiting at
once, and more for the work that answers them; started only when none is idle."""

_ROOMY: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

def _submit(self, fn, /, *args, **kwargs):
    submit = _PATCH.original["submit"]
    if who() == APP:
        return submit(self, contextvars.copy_context().run, fn, *args, **kwargs)
    return submit(self, fn, *args, **kwargs)


_PATCH = ClassPatch(ThreadPoolExecutor, {"submit": _submit})


def install_pool_context() -> None:
    """Pools carry the app's context from now until the matching `uninstall_pool_context`."""
    _PATCH.install()


def uninstall_pool_context() -> None:
    _PATCH.uninstall()


def roomy_default_executor(loop: asyncio.AbstractEventLoop) -> None:
    """Give `loop` a default executor that starts a thread whenever none is idle (up to
    `APP_THREADS_MAX`), once per loop.

    Why: LangGraph runs an app's sync nodes in the loop's default executor, and a model call
    made there blocks that thread until the gateway, on the loop, has the answer. The
    gateway's HTTP client needs the same executor: the OpenAI SDK's client reads the
    platform for its headers there on its first requests (``asyncio.to_thread``), and opening
    a connection to a host name resolves it there (``loop.getaddrinfo``). asyncio's own
    default has min(32, cores + 4) threads, so with that many sync nodes waiting (6 on 2
    cores) the work that would answer them queued behind them for good: the run sat idle,
    its requests unsent. Whether the first requests won the race for a thread depended on
    timing, so a busy machine met it; a host name, always (tests/apps/
    test_app_many_sync_nodes.py).
    """
    if loop in _ROOMY:
        return
    loop.set_default_executor(ThreadPoolExecutor(max_workers=APP_THREADS_MAX,
                                                 thread_name_prefix="biaslab-app"))
    _ROOMY.add(loop)
