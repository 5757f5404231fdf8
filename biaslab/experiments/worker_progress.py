"""The progress bar of a run whose cells run in worker processes (``--workers``).

Workers run without a bar of their own (several bars on one terminal would overwrite each
other); the coordinating process reads their shard stores instead and draws the one bar a
single process would. It reads only what changed since its last look (calls by rowid), at most
every `every_s` seconds, so that watching costs the workers next to nothing.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Sequence

from biaslab.agents.gateway import RunCounters
from biaslab.experiments.runner import _Progress
from biaslab.traces.store import STORE_FILE

__all__ = ["WorkerProgress"]


class _Shard:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / STORE_FILE
        self.conn: sqlite3.Connection | None = None
        self.last_rowid = 0
        self.calls = self.cache_hits = self.errors = self.unparsed = self.tokens = 0
        self.cells = 0

    def read(self) -> None:
        if self.conn is None:
            if not self.path.is_file():
                return
            try:
                self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=0.2)
            except sqlite3.Error:
                return
        try:
            q = self.conn.execute
            self.cells = q("SELECT COUNT(*) FROM cells WHERE status IN ('done', 'error')"
                           ).fetchone()[0]
            row = q("SELECT COUNT(*), COALESCE(SUM(cache_hit), 0), COUNT(error), "
                    "COUNT(parse_error), COALESCE(SUM(CASE WHEN cache_hit = 0 THEN "
                    "input_tokens + output_tokens ELSE 0 END), 0), COALESCE(MAX(rowid), 0) "
                    "FROM calls WHERE rowid > ?", (self.last_rowid,)).fetchone()
        except sqlite3.Error:  # the worker is creating or locking it: look again next time
            return
        if row[0]:
            self.calls += row[0]
            self.cache_hits += row[1]
            self.errors += row[2]
            self.unparsed += row[3]
            self.tokens += row[4]
            self.last_rowid = row[5]

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class WorkerProgress:
    """`update()` folds the shard stores' new cells and calls into one `_Progress` bar.

    Args:
        total: cells in the whole grid.
        done_before: cells already done in the run's own store (a resume), counted at once.
        shard_dirs: the workers' run directories.
        enabled: False for ``--quiet``.
    """

    def __init__(self, total: int, done_before: int, shard_dirs: Sequence[Path], enabled: bool,
                 every_s: float = 1.0):
        self.counters = RunCounters()
        self.bar = _Progress(total, self.counters, enabled)
        self.enabled = enabled
        self.shards = [_Shard(d) for d in shard_dirs]
        self.every_s = every_s
        self._shown = 0
        self._last = 0.0
        if done_before:
            self.bar.advance(done_before)
            self._shown = done_before
        self._done_before = done_before

    def update(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < self.every_s):
            return
        self._last = now
        for shard in self.shards:
            shard.read()
        c = self.counters
        c.calls = sum(s.calls for s in self.shards)
        c.cache_hits = sum(s.cache_hits for s in self.shards)
        c.errors = sum(s.errors for s in self.shards)
        c.parse_failures = sum(s.unparsed for s in self.shards)
        c.tokens = sum(s.tokens for s in self.shards)
        c.model_calls = c.calls - c.cache_hits - c.errors
        cells = self._done_before + sum(s.cells for s in self.shards)
        if cells > self._shown:
            self.bar.advance(cells - self._shown)
            self._shown = cells

    def close(self) -> None:
        self.update(force=True)
        self.bar.stop()
        for shard in self.shards:
            shard.close()
