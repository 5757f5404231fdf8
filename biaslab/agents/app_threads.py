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
"""

from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor

from biaslab.agents.app_guard import APP, who
from biaslab.agents.class_patch import ClassPatch

__all__ = ["install_pool_context", "uninstall_pool_context"]

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
