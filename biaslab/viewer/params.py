"""Checks on the viewer API's query parameters, so that a bad one is a 400, not a dropped
connection.

SQLite integers are signed 64-bit: a page number beyond that overflows inside the driver, and a
LIKE pattern over 50,000 bytes is refused by SQLite itself. Both used to escape the handler
as a traceback; here they become one-line messages that the handler sends as JSON.
"""

from __future__ import annotations

from typing import Mapping

__all__ = ["BadRequest", "MAX_FILTER_CHARS", "MAX_INT", "check_lengths", "whole_number"]

MAX_INT = 2**63 - 1
"""The largest integer SQLite stores; page numbers and ids above it are refused."""
MAX_FILTER_CHARS = 1000
"""A filter value longer than this is refused: no cell id, item, node or model name is near it."""


class BadRequest(ValueError):
    """A query parameter the API refuses; its message is the one line the client sees."""


def check_lengths(params: Mapping[str, str]) -> None:
    """Refuse any parameter longer than `MAX_FILTER_CHARS` (names included)."""
    for key, value in params.items():
        if len(key) > MAX_FILTER_CHARS:
            raise BadRequest(f"a parameter name is {len(key)} characters long "
                             f"(at most {MAX_FILTER_CHARS})")
        if len(value) > MAX_FILTER_CHARS:
            raise BadRequest(f"parameter '{key}' is {len(value)} characters long "
                             f"(at most {MAX_FILTER_CHARS})")


def whole_number(params: Mapping[str, str], name: str, default: int = 0) -> int:
    """The parameter `name` as an integer in [0, 2^63 - 1], or `default` when absent."""
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    text = str(raw).strip()
    if not text.isdigit() or not text.isascii():
        raise BadRequest(f"parameter '{name}' must be a whole number from 0 to {MAX_INT}, "
                         f"got '{_short(text)}'")
    digits = text.lstrip("0")
    if len(digits) > len(str(MAX_INT)) or int(digits or "0") > MAX_INT:
        raise BadRequest(f"parameter '{name}' must be at most {MAX_INT}, got {_short(text)}")
    return int(digits or "0")


def _short(text: str, keep: int = 40) -> str:
    return text if len(text) <= keep else f"{text[:keep]}… ({len(text)} characters)"
