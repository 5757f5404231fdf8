"""Content-addressed response cache: the same call is never paid for twice.

The key hashes the model's identity, the rendered messages, the sampling parameters, the seed
and the sample index; so a changed prompt, model or exposure misses and everything else hits.
Every run store holds one; a shared cache file (``BIASLAB_CACHE``) can serve across runs.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CachedResponse", "CallCache", "cache_key", "CACHE_DDL"]

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
        return CachedResponse(*row) if row else None

    def put(self, key: str, response: CachedResponse, model: dict[str, Any]) -> None:
        self.conn.execute("INSERT OR IGNORE INTO cache VALUES (?,?,?,?,?)",
                          (key, response.raw, response.input_tokens, response.output_tokens,
                           json.dumps(model, sort_keys=True)))

    def __len__(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM cache").fetchone()[0]

    def close(self) -> None:
        if self.owns:
            self.conn.close()
