"""The cross-run cache file (``BIASLAB_CACHE``), opened so that it can never spoil a run.

The shared cache is an optimisation: a run must give the same cells with it, without it, or
with it damaged. So, when a run opens it:

- a path that cannot hold it (a directory, a file that is not SQLite, a parent that is a
  file, a directory that cannot be created or written) stops the run with one line naming
  the cache and ``--no-cache``, before the run writes anything (`check_shared_cache`);
- a SQLite file with damaged pages is moved aside to ``<name>.corrupt-<time>`` (with its
  ``-wal`` and ``-shm`` files), one warning names both paths, and the run starts a fresh one;
- a file the run may not write, or a file in a directory the run may not write, is used
  read-only for the run (its answers are read, new ones not stored), with one warning;
- a file that cannot be opened for another reason (a lock held past the busy timeout, a
  failing disk) is left alone and not used by the run, with one warning;
- an error met later (the disk fills, another process holds the lock too long, the file is
  damaged or replaced mid-run): a failed write makes it read-only for the rest of the run, a
  failed lookup takes it out of the run; one warning each, never a failed cell, since every
  answer stays in the run store, which a resume reads first.

Concurrent runs on one cache share every answer that was stored before they ask for it, but
not the calls in flight: two runs asking the same new question at the same moment both pay.

Memory maps: the file itself is read with plain reads, never mapped (``PRAGMA mmap_size=0``),
so a cache truncated under a run gives SQLite errors (handled as above), not a SIGBUS. WAL's
index (``<name>-shm``) is mapped by SQLite in every process that shares the file, and there is
no way to share a WAL file without it (a rollback journal instead costs ~5x under --workers
contention). So each access first checks that the index was not cut shorter than this process
has seen it: if it was (someone truncated it), it is extended back to that size, zeros, which
SQLite reads as an index to rebuild, and the cache is taken out of the run with one warning.
Not covered: a truncation in the microseconds between that check and SQLite's access.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from biaslab.errors import UserError
from biaslab.traces.cache import _PUT, CACHE_DDL, CachedResponse, CallCache

__all__ = ["SharedCache", "check_shared_cache", "open_shared_cache"]

_SQLITE_HEADER = b"SQLite format 3\x00"


_WARN_LOCK = threading.Lock()


def _warn(message: str) -> None:
    # One write under a lock: warnings from parallel threads never share a line.
    with _WARN_LOCK:
        sys.stderr.write(f"biaslab: warning: {message}\n")
        sys.stderr.flush()


def _refuse(path: Path, problem: str) -> UserError:
    return UserError(f"the shared response cache {path} {problem}; point BIASLAB_CACHE at a "
                     "file in a writable directory, or run with --no-cache")


def check_shared_cache(path: str | Path) -> None:
    """Raise a one-line `UserError` when `path` cannot hold the shared cache. Writes nothing."""
    path = Path(path)
    if path.is_dir():
        raise _refuse(path, "is a directory")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise _refuse(path, f"cannot be created: {parent} is a file")
            if not path.exists() and not os.access(parent, os.W_OK | os.X_OK):
                raise _refuse(path, f"cannot be created: {parent} is not writable")
            break
    if path.exists():
        try:
            with open(path, "rb") as handle:
                head = handle.read(len(_SQLITE_HEADER))
        except OSError as exc:
            raise _refuse(path, f"cannot be read ({exc.strerror or exc})") from None
        if head and head != _SQLITE_HEADER:
            raise _refuse(path, "is not a SQLite file (it may be someone else's file)")


def _writable(path: Path) -> bool:
    """Whether SQLite may write `path` (the file, and its directory for the WAL files)."""
    if path.exists() and not os.access(path, os.W_OK):
        return False
    return os.access(path.parent, os.W_OK | os.X_OK)


def _move_aside(path: Path, warn: Callable[[str], None]) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    for suffix in ("-wal", "-shm"):  # a stale WAL must never be applied to the fresh file
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.replace(aside.with_name(aside.name + suffix))
    path.replace(aside)
    warn(f"the shared response cache {path} is damaged; moved it to {aside} and started "
         "a fresh one")
    return aside


class SharedCache(CallCache):
    """A `CallCache` over the shared file whose errors are warnings, never a failed cell.

    Attributes:
        path: the cache file.
        read_only: no answer is written to it (it could not be written).
        broken: it is no longer read either (it failed on a lookup).
    """

    def __init__(self, conn: sqlite3.Connection, path: Path, *, read_only: bool,
                 warn: Callable[[str], None] = _warn):
        super().__init__(conn, owns=True, create=False)  # (`open_shared_cache` made the table)
        self.path = path
        self.read_only, self.broken = read_only, False
        self._warn = warn
        self._index = Path(f"{path}-shm")
        self._index_seen = 0
        self._index_intact()  # the size SQLite mapped when it opened the file

    def _index_intact(self) -> bool:
        """Whether WAL's mapped index is still as long as this process has seen it; if it was
        cut shorter, extend it back (touching a mapped page past the end of its file is a
        SIGBUS) and take the cache out of the run. See the module docstring."""
        try:
            size = os.stat(self._index).st_size
        except OSError:  # no index (yet), or removed: the mapping keeps its own pages
            return True
        if size >= self._index_seen:
            self._index_seen = size
            return True
        try:
            os.truncate(self._index, self._index_seen)
        except OSError:
            pass
        if not self.broken:
            self.broken = self.read_only = True
            self._warn(f"the shared response cache's index {self._index} was truncated while "
                       "this run used it; the cache is not used for the rest of this run (the "
                       "run store keeps every answer)")
        return False

    def _give_up(self, what: str, exc: sqlite3.Error, *, reads_too: bool) -> None:
        if reads_too and not self.broken:
            self.broken = self.read_only = True
            self._warn(f"the shared response cache {self.path} failed on a {what} ({exc}); it is "
                       "not used for the rest of this run (the run store keeps every answer)")
        elif not self.read_only:
            self.read_only = True
            self._warn(f"the shared response cache {self.path} could not be written ({exc}); it "
                       "is read-only for the rest of this run (the run store keeps every answer)")

    def get(self, key: str) -> CachedResponse | None:
        if self.broken or not self._index_intact():
            return None
        try:
            return super().get(key)
        except sqlite3.Error as exc:
            self._give_up("lookup", exc, reads_too=True)
            return None

    def put(self, key: str, response: CachedResponse, model: dict[str, Any]) -> None:
        if self.read_only or not self._index_intact():
            return
        try:
            super().put(key, response, model)
        except sqlite3.Error as exc:
            self._give_up("write", exc, reads_too=False)

    def put_later(self, key: str, response: CachedResponse, model: dict[str, Any]) -> None:
        if not self.read_only:
            super().put_later(key, response, model)

    def flush(self) -> None:
        """Write the held answers in one short transaction (other runs may be writing too:
        the busy timeout applies); a failure makes the cache read-only, as `put`'s does."""
        if not self._pending:
            return
        rows, self._pending = list(self._pending.values()), {}
        if self.read_only or not self._index_intact():
            return
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                self.conn.executemany(_PUT, rows)
                self.conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            self._give_up("write", exc, reads_too=False)

    def __len__(self) -> int:
        try:
            return 0 if self.broken or not self._index_intact() else super().__len__()
        except sqlite3.Error:
            return 0

    def close(self) -> None:
        self._index_intact()  # closing touches the index too
        super().close()

    def __bool__(self) -> bool:  # an empty cache is still a cache
        return True


def _connect(path: Path, read_only: bool) -> sqlite3.Connection:
    if read_only:
        # In a directory no one may write, WAL's index (-shm) cannot be made, and SQLite will
        # not open the file at all: read it as immutable (nobody can write it there either:
        # a writer needs to create the -wal beside it).
        sealed = not os.access(path.parent, os.W_OK | os.X_OK)
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro"
                               f"{'&immutable=1' if sealed else ''}", uri=True,
                               isolation_level=None)
        conn.execute("PRAGMA mmap_size=0")  # plain reads: see the module docstring
        return conn
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA mmap_size=0")  # plain reads: see the module docstring
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=10000")  # another run may be writing
    return conn


def _healthy(conn: sqlite3.Connection, read_only: bool) -> bool:
    if not read_only:
        conn.execute(CACHE_DDL)
    rows = conn.execute("PRAGMA quick_check").fetchall()
    return rows == [("ok",)]


def _is_damage(exc: sqlite3.Error) -> bool:
    """Damage in the file itself, as opposed to a lock held too long or a failing disk (which
    must never cost the cache its answers)."""
    text = str(exc).lower()
    return any(word in text for word in ("malformed", "not a database", "corrupt", "damage"))


def _unused(path: Path, why: str, warn: Callable[[str], None]) -> SharedCache:
    """A cache that answers nothing and stores nothing, after one warning saying why."""
    warn(f"the shared response cache {path} {why}; this run does not use it (the run store "
         "keeps every answer)")
    cache = SharedCache(sqlite3.connect(":memory:", isolation_level=None), path,
                        read_only=True, warn=warn)
    cache.broken = True
    return cache


def open_shared_cache(path: str | Path, *, warn: Callable[[str], None] = _warn) -> SharedCache:
    """The shared cache at `path`, checked (`check_shared_cache`), repaired or made read-only
    as the module docstring says."""
    path = Path(path)
    check_shared_cache(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    read_only = not _writable(path)
    if read_only and not path.exists():
        raise _refuse(path, "cannot be created")
    for attempt in (1, 2):
        conn = None
        try:
            conn = _connect(path, read_only)
            if _healthy(conn, read_only):
                break
            damage: sqlite3.Error = sqlite3.DatabaseError("PRAGMA quick_check found damage")
        except sqlite3.Error as exc:
            damage = exc
        if conn is not None:
            conn.close()
        if not _is_damage(damage):
            return _unused(path, f"cannot be opened ({damage})", warn)
        if read_only:  # damaged, and not ours to move
            return _unused(path, f"is damaged and read-only ({damage})", warn)
        if attempt == 2:
            raise _refuse(path, f"is damaged and could not be replaced ({damage})")
        try:
            _move_aside(path, warn)
        except OSError as exc:
            raise _refuse(path, f"is damaged and could not be moved aside "
                                f"({exc.strerror or exc})") from None
    if read_only:
        warn(f"the shared response cache {path} is read-only; this run reads answers from it "
             "but stores none there (the run store keeps every answer)")
    return SharedCache(conn, path, read_only=read_only, warn=warn)
