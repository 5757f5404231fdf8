"""Sentence embeddings of a run's texts, kept in its store so a report embeds a text once.

A report that measures diversity embeds the same queries again and again (per model, per
framing, the reference scripts each time); at paper scale that is tens of thousands of
embeddings per ``biaslab report``. The ``embeddings`` table of ``run.sqlite`` keeps each one,
keyed by the embedding model's name and the sha256 of the text, so the next report reads them
back instead. It is a cache: deleting the table loses nothing but time.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from biaslab.traces.store import STORE_FILE

__all__ = ["EmbeddingCache", "text_hash"]

_DDL = """CREATE TABLE IF NOT EXISTS embeddings (
    model TEXT NOT NULL, text_hash TEXT NOT NULL, vector BLOB NOT NULL,
    PRIMARY KEY (model, text_hash))"""


def text_hash(text: str) -> str:
    """The key of a text: sha256 of its UTF-8 bytes, hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    """The ``embeddings`` table of a run directory's store.

    Vectors are kept as float32. A store that cannot be written (a read-only copy of a run)
    is read where it can be and otherwise left alone: the report still runs, embedding what
    it does not find.
    """

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / STORE_FILE
        self.writable = True
        self.conn: sqlite3.Connection | None = None
        try:
            self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=10)
            self.conn.execute(_DDL)
        except sqlite3.Error:  # a read-only copy: read the table if it is there
            self.writable = False
            if self.conn is not None:
                self.conn.close()
            try:
                self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                            isolation_level=None)
                self.conn.execute("SELECT 1 FROM embeddings LIMIT 1")
            except sqlite3.Error:
                self.conn = None

    def get(self, model: str, hashes: Iterable[str]) -> dict[str, np.ndarray]:
        """The vectors stored for these text hashes (missing ones are left out)."""
        if self.conn is None:
            return {}
        wanted = list(dict.fromkeys(hashes))
        found: dict[str, np.ndarray] = {}
        for start in range(0, len(wanted), 500):  # SQLite's bound-parameter limit
            chunk = wanted[start:start + 500]
            rows = self.conn.execute(
                f"SELECT text_hash, vector FROM embeddings WHERE model = ? AND text_hash IN "
                f"({','.join('?' * len(chunk))})", [model, *chunk])
            found.update({h: np.frombuffer(blob, dtype="<f4") for h, blob in rows})
        return found

    def put(self, model: str, vectors: Mapping[str, np.ndarray]) -> None:
        """Store vectors by text hash (float32); a store that cannot be written is skipped."""
        if self.conn is None or not self.writable or not vectors:
            return
        rows = [(model, h, np.asarray(v, dtype="<f4").tobytes()) for h, v in vectors.items()]
        try:
            self.conn.execute("BEGIN")
            self.conn.executemany("INSERT OR REPLACE INTO embeddings VALUES (?,?,?)", rows)
            self.conn.execute("COMMIT")
        except sqlite3.Error:
            self.writable = False
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
