"""Content-addressed response cache: the same call is never paid for twice.

The key hashes the model's identity, the rendered messages, the sampling parameters, the seed
and the sample index; so a changed prompt, model or exposure misses and everything else hits.
Every run store holds one; a shared cache file (``BIASLAB_CACHE``) can serve across runs.

What is cached: every answer a model returned with some text, parsable or not (an unparsable
answer is the model's real answer, and replaying it keeps a run reproducible). What is never
cached: failed calls (errors, timeouts, dropped connections, truncated bodies) and empty or
blank answers, which are far more often an endpoint's hiccup than the model's choice; they are
asked again on the next run or ``--resume``. Empty entries written by older versions are
ignored on lookup.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CachedResponse", "CallCache", "cache_key", "is_cacheable", "CACHE_DDL", "shared_cache_path"]

CACHE_DDL = """
CREATE TABLE IF NOT EXISTS cache (
    key TEXT PRIMARY KEY,
    raw TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    model TEXT NOT NULL
)"""


def cache_key(model_identity: dict[str, Any], messages: list[dict[str, str]],
              params: dict[str, Any], sample: int) -> str:
    payload = json.dumps({"m": model_identity, "x": messages, "p": params, "s": sample},
                         sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class CachedResponse:
    raw: str
    input_tokens: int
    output_tokens: int


def is_cacheable(response: CachedResponse) -> bool:
    """Whether a response may become a permanent cache entry: it has some non-blank text."""
    return bool(response.raw and response.raw.strip())


class CallCache:
    """A ``cache`` table in a SQLite connection. Writes commit with the owner's transactions."""

    def __init__(self, conn: sqlite3.Connection, *, owns: bool = False):
        self.conn = conn
        self.owns = owns
        conn.execute(CACHE_DDL)

    @classmethod
    def open_file(cls, path: str | Path) -> "CallCache":
        """A standalone cache file shared across runs."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return cls(conn, owns=True)

    def get(self, key: str) -> CachedResponse | None:
        row = self.conn.execute("SELECT raw, input_tokens, output_tokens FROM cache WHERE key=?",
                                (key,)).fetchone()
        if not row or not is_cacheable(CachedResponse(*row)):
            return None
        return CachedResponse(*row)

    def put(self, key: str, response: CachedResponse, model: dict[str, Any]) -> None:
        """Store a response; one that `is_cacheable` refuses is silently not stored."""
        if not is_cacheable(response):
            return
        # The first answer stays (a run is self-consistent); only a blank one left by an older
        # version is replaced.
        self.conn.execute(
            "INSERT INTO cache VALUES (?,?,?,?,?) ON CONFLICT(key) DO UPDATE SET raw=excluded.raw, "
            "input_tokens=excluded.input_tokens, output_tokens=excluded.output_tokens, "
            "model=excluded.model WHERE trim(cache.raw, char(32, 9, 10, 13)) = ''",
            (key, response.raw, response.input_tokens, response.output_tokens,
             json.dumps(model, sort_keys=True)))

    def __len__(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM cache").fetchone()[0]

    def close(self) -> None:
        if self.owns:
            self.conn.close()


def shared_cache_path() -> Path | None:
    """The cross-run response cache: ``$BIASLAB_CACHE``, or under the user's cache dir.
    ``BIASLAB_CACHE=off`` disables it."""
    env = os.environ.get("BIASLAB_CACHE")
    if env == "off":
        return None
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "biaslab" / "calls.sqlite"
