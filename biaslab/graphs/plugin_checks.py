"""A user's protocol code, held to the CLI's promise: bad code is one line, not a traceback.

A plugin's ``build()`` may raise, return something that is not a graph, or wire a graph that
LangGraph rejects only at compile time (an edge to an unknown node, no entry point); its import
may call ``sys.exit``. `checked_build` wraps a user protocol's ``build`` so that each of these
is a `UserError` naming the protocol and variant the first time anything builds the graph,
which is while the plan is made, before a run directory exists.
"""

from __future__ import annotations

import functools
from typing import Callable

from langgraph.graph import StateGraph

from biaslab.errors import UserError

__all__ = ["checked_build", "exit_error"]


def exit_error(where: str, exc: SystemExit) -> UserError:
    """A plugin that calls ``sys.exit`` (or ``exit()``) while it loads or builds."""
    return UserError(f"{where} called sys.exit({exc.code!r}); a plugin must not exit the "
                     "process (raise an exception to report a problem)")


def checked_build(build: Callable) -> Callable:
    """`build` wrapped: what it raises or returns, and the graph's wiring, are checked."""
    if getattr(build, "_biaslab_checked", False):
        return build

    @functools.wraps(build)
    def wrapper(self, variant, options=None):
        where = f"protocol '{self.name}' build({variant!r})"
        try:
            builder = build(self, variant, options)
        except UserError:
            raise
        except SystemExit as exc:
            raise exit_error(where, exc) from None
        except Exception as exc:
            raise UserError(f"{where} raised {type(exc).__name__}: {exc}") from None
        if not isinstance(builder, StateGraph):
            raise UserError(f"{where} returned {type(builder).__name__}, not a langgraph "
                            "StateGraph (return the builder, uncompiled)")
        compiled = builder.compiled  # validate() marks the builder compiled; keep it as it was
        try:
            builder.validate()
        except ValueError as exc:
            raise UserError(f"{where}: the graph is not valid: {exc}") from None
        finally:
            builder.compiled = compiled
        return builder

    wrapper._biaslab_checked = True
    return wrapper
