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

__all__ = ["CachedResponse", "CallCache", "cache_key", "identity_json", "keyed_by", "is_cacheable", "CACHE_DDL", "shared_cache_path"]

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
    return keyed_by(identity_json(model_identity), messages, params, sample)


def identity_json(model_identity: dict[str, Any]) -> str:
    """A model identity's part of `cache_key`: the same for every call of the model, so a run
    renders it once (`keyed_by`)."""
    return _canonical(model_identity)


def keyed_by(identity: str, messages: list[dict[str, str]], params: dict[str, Any],
             sample: int) -> str:
    """`cache_key` from the model identity's `identity_json`: the very bytes of the canonical
    JSON of ``{"m": identity, "p": params, "s": sample, "x": messages}`` (keys in sorted
    order), hashed."""
    payload = (f'{{"m":{identity},"p":{_canonical_params(params)},"s":{_canonical(sample)},'
               f'"x":{_canonical_messages(messages)}}}')
    return hashlib.sha256(payload.encode()).hexdigest()


# json.dumps with these options would build an encoder per call (a tenth of a key's cost)
_canonical = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode
_string = json.encoder.encode_basestring  # a JSON string as `_canonical` writes it (no \u escapes)


def _canonical_messages(messages: list) -> str:
    """`_canonical(messages)` without the encoder's per-call set-up, for the usual shape (a
    list of ``{"role": str, "content": str}``); anything else is left to `_canonical`. The
    bytes are the same (tests/traces/test_cache_batching.py compares them)."""
    parts = []
    for m in messages:
        if type(m) is not dict or len(m) != 2:
            return _canonical(messages)
        content, role = m.get("content"), m.get("role")
        if type(content) is not str or type(role) is not str:
            return _canonical(messages)
        parts.append(f'{{"content":{_string(content)},"role":{_string(role)}}}')
    return f"[{','.join(parts)}]"


def _canonical_params(params: dict) -> str:
    """`_canonical(params)` for a dict of str keys whose values are ints or strings (a call's
    usual sampling parameters); anything else is left to `_canonical`."""
    if not all(type(k) is str for k in params):
        return _canonical(params)
    parts = []
    for key in sorted(params):
        value = params[key]
        if type(value) is int:
            parts.append(f"{_string(key)}:{value!r}")
        elif type(value) is str:
            parts.append(f"{_string(key)}:{_string(value)}")
        else:
            return _canonical(params)
    return f"{{{','.join(parts)}}}"


@dataclass(frozen=True)
class CachedResponse:
    raw: str
    input_tokens: int
    output_tokens: int


def is_cacheable(response: CachedResponse) -> bool:
    """Whether a response may become a permanent cache entry: it has some non-blank text."""
    return bool(response.raw and response.raw.strip())


class _KeyFilter:
    """A Bloom filter of cache keys (hex SHA-256): "maybe" or "surely not", in 2 MiB.

    Why: a new run's own cache is empty, so almost every lookup there misses; one query per
    call was a twentieth of a one-call cell's CPU. Three 24-bit slices of the key (uniform
    already) are its bit positions: at a million keys about 0.4 % of misses still query."""

    _BITS = 1 << 24

    def __init__(self) -> None:
        self.bits = bytearray(self._BITS // 8)
        self.unsure = False  # a key that is not hex was added: every lookup asks the table

    @staticmethod
    def _positions(key: str) -> tuple[int, int, int]:
        v = int(key[:18], 16)
        return v & 0xFFFFFF, (v >> 24) & 0xFFFFFF, v >> 48

    def add(self, key: str) -> None:
        try:
            positions = self._positions(key)
        except ValueError:
            self.unsure = True
            return
        bits = self.bits
        for p in positions:
            bits[p >> 3] |= 1 << (p & 7)

    def may_hold(self, key: str) -> bool:
        if self.unsure:
            return True
        try:
            a, b, c = self._positions(key)
        except ValueError:  # not a hex key: ask the table
            return True
        bits = self.bits
        return bool(bits[a >> 3] & (1 << (a & 7)) and bits[b >> 3] & (1 << (b & 7))
                    and bits[c >> 3] & (1 << (c & 7)))


# The first answer stays (a run is self-consistent); only a blank one left by an older version
# is replaced.
_PUT = ("INSERT INTO cache VALUES (?,?,?,?,?) ON CONFLICT(key) DO UPDATE SET raw=excluded.raw, "
        "input_tokens=excluded.input_tokens, output_tokens=excluded.output_tokens, "
        "model=excluded.model WHERE trim(cache.raw, char(32, 9, 10, 13)) = ''")


class CallCache:
    """A ``cache`` table in a SQLite connection. Writes commit with the owner's transactions."""

    def __init__(self, conn: sqlite3.Connection, *, owns: bool = False, sole_writer: bool = False,
                 create: bool = True):
        """`sole_writer`: nothing but this object writes the table while it is open (a run's
        own store, whose directory the run locks): if the table is empty now, a key this
        object never wrote is a miss without a query. `create`: make the table if missing
        (not on a read-only connection)."""
        self.conn = conn
        self.owns = owns
        self._pending: dict[str, tuple] = {}
        self._models: dict[int, tuple[dict[str, Any], str]] = {}
        self._written: _KeyFilter | None = None
        if create:
            conn.execute(CACHE_DDL)
        if sole_writer and conn.execute("SELECT 1 FROM cache LIMIT 1").fetchone() is None:
            self._written = _KeyFilter()

    @classmethod
    def open_file(cls, path: str | Path) -> "CallCache":
        """A standalone cache file shared across runs."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return cls(conn, owns=True)

    def get(self, key: str) -> CachedResponse | None:
        waiting = self._pending.get(key)
        if waiting is not None:
            return CachedResponse(*waiting[1:4])
        if self._written is not None and not self._written.may_hold(key):
            return None  # the table was empty when opened, and this process never wrote `key`
        row = self.conn.execute("SELECT raw, input_tokens, output_tokens FROM cache WHERE key=?",
                                (key,)).fetchone()
        if not row or not is_cacheable(CachedResponse(*row)):
            return None
        return CachedResponse(*row)

    def put(self, key: str, response: CachedResponse, model: dict[str, Any]) -> None:
        """Store a response; one that `is_cacheable` refuses is silently not stored."""
        if not is_cacheable(response):
            return
        if self._written is not None:
            self._written.add(key)
        self.conn.execute(_PUT, self._row(key, response, model))

    def put_later(self, key: str, response: CachedResponse, model: dict[str, Any]) -> None:
        """`put`, written by the next `flush` (the owner flushes before it commits, so the entry
        lands in the same transaction as it would have); `get` sees it at once. Why: one
        statement per call was a tenth of what a one-call cell costs."""
        if is_cacheable(response) and key not in self._pending:
            if self._written is not None:
                self._written.add(key)
            self._pending[key] = self._row(key, response, model)

    def written_elsewhere(self) -> None:
        """Entries reached the table by another path (a merge's SQL): look every key up."""
        self._written = None

    def flush(self) -> None:
        """Write the entries `put_later` holds."""
        if self._pending:
            rows, self._pending = list(self._pending.values()), {}
            self.conn.executemany(_PUT, rows)

    def _row(self, key: str, response: CachedResponse, model: dict[str, Any]) -> tuple:
        if not model:
            text = "{}"
        else:  # a run's calls share a few model dicts: each is rendered once (held: its id stays)
            seen = self._models.get(id(model))
            if seen is None or seen[0] is not model:
                if len(self._models) >= 64:
                    self._models.clear()
                seen = self._models[id(model)] = (model, json.dumps(model, sort_keys=True))
            text = seen[1]
        return (key, response.raw, response.input_tokens, response.output_tokens, text)

    def __len__(self) -> int:
        self.flush()
        return self.conn.execute("SELECT COUNT(*) FROM cache").fetchone()[0]

    def close(self) -> None:
        self.flush()
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
