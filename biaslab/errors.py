"""Errors that reach the user as one line.

`UserError` marks bad input (a spec, an argument, a dataset): the CLI prints its message alone and
exits 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["UserError", "ReplayMiss", "ModelCallError", "DamagedStore"]


class UserError(Exception):
    """Bad input from the user; the message alone must say what is wrong and where."""


class ReplayMiss(UserError):
    """A strict replay asked for a model call that the source trace does not hold."""


class DamagedStore(UserError):
    """A run store holds a row (or lacks a table) that biaslab did not write: damaged JSON in
    ``cells.coords``, ``outputs.value``, ``calls.record`` or ``meta``, or a dropped table. The
    message names the store, the table and the row, so nothing is read past it in silence."""


class ModelCallError(Exception):
    """A model call failed for good (after retries, or a non-retryable status).

    Attributes:
        status: HTTP-like status code when known (429, 500, 400...), else None.
        retry_after: seconds the endpoint asked us to wait, when it said so.
        transient: whether a retry may succeed.
    """

    def __init__(self, message: str, *, status: int | None = None,
                 retry_after: float | None = None, transient: bool = False):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.transient = transient
