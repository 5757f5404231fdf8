"""The run store: one embedded SQLite file per run directory (WAL, a single writer).

It holds the run, its cells with their grid coordinates and status, every model call
(`CallRecord`) and every node output. A cell's calls and outputs are written in the same
transaction that marks it done (the runner lets finished cells share one transaction for up
to 0.2 s), so a run killed at any moment leaves only whole cells behind;
the response cache is committed as calls return, so a resumed run does not pay for them again.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from pydantic import ValidationError

from biaslab.traces.cache import CACHE_DDL, CallCache
from biaslab.traces.damage import (TABLES, Damage, damage_error, decode, find_damage,
                                   missing_tables, tables_error)
from biaslab.traces.records import CallRecord

if TYPE_CHECKING:
    import pandas as pd

# pandas is imported inside the methods that build frames: it costs ~0.5 s at the start of
# every `biaslab` command, and most of them (a run's writes, --help) never read a frame.

__all__ = ["RunStore", "STORE_FILE"]

STORE_FILE = "run.sqlite"

_DDL = [
    """CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS cells (
        cell_id TEXT PRIMARY KEY, ord INTEGER NOT NULL, coords TEXT NOT NULL,
        status TEXT NOT NULL, error TEXT, started REAL, finished REAL)""",
    """CREATE TABLE IF NOT EXISTS calls (
        id INTEGER PRIMARY KEY, cell_id TEXT NOT NULL, seq INTEGER NOT NULL, record TEXT NOT NULL,
        node TEXT NOT NULL, cache_key TEXT NOT NULL, cache_hit INTEGER NOT NULL,
        input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, error TEXT,
        parse_error TEXT)""",
    "CREATE INDEX IF NOT EXISTS calls_cell ON calls(cell_id)",
    """CREATE TABLE IF NOT EXISTS outputs (
        cell_id TEXT NOT NULL, seq INTEGER NOT NULL, node TEXT NOT NULL, value TEXT NOT NULL,
        PRIMARY KEY (cell_id, seq))""",
]


_ENCODER = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                            default=str, allow_nan=True)  # one encoder, not one per call


def dumps(value: Any) -> str:
    """Canonical JSON: equal values give equal bytes, which strict replay compares."""
    return _ENCODER.encode(value)


class RunStore:
    """Reads and writes one run directory's ``run.sqlite``."""

    def __init__(self, run_dir: str | Path, *, readonly: bool = False):
        self.dir = Path(run_dir)
        self.path = self.dir / STORE_FILE
        if readonly:
            self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                        isolation_level=None)
        else:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            # A store missing some of its tables had them dropped: creating them afresh would
            # let a resume lose the call records without a word (a new file has none at all).
            missing = missing_tables(self.conn)
            if missing and len(missing) < len(TABLES):
                raise tables_error(self.path, missing)
            if not readonly:
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=NORMAL")
                self.conn.execute("BEGIN")  # all tables or none, even if killed right here
                for ddl in (*_DDL, CACHE_DDL):
                    self.conn.execute(ddl)
                self.conn.execute("COMMIT")
        except BaseException:
            self.conn.close()
            raise
        # (the run locks its directory: nothing else writes this cache while it is open)
        self.cache = CallCache(self.conn, sole_writer=True) if not readonly \
            else _ReadOnlyCache(self.conn)
        self._in_tx = False
        self._cells_started = False
        self._last_commit = time.monotonic()
        self.batch_s = 0.0
        """Seconds finished cells may wait to share one commit (0: commit each cell). The runner
        batches; a cell's records and its status always land in the same transaction."""

    # -- transactions ------------------------------------------------------------------------
    def _begin(self) -> None:
        if not self._in_tx:
            self.conn.execute("BEGIN")
            self._in_tx = True

    def commit(self) -> None:
        if self._in_tx:
            self.cache.flush()  # the cache entries put since the last commit, in this transaction
            self.conn.execute("COMMIT")
            self._in_tx = False
        self._last_commit = time.monotonic()

    def maybe_commit(self, every_s: float = 0.5) -> None:
        """Batch small writes (cache entries) into few transactions."""
        if time.monotonic() - self._last_commit >= every_s:
            self.commit()

    def close(self) -> None:
        self.commit()
        self.conn.close()

    # -- run metadata ------------------------------------------------------------------------
    def set_meta(self, **values: Any) -> None:
        self._begin()
        for key, value in values.items():
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?,?)", (key, dumps(value)))
        self.commit()

    def meta(self) -> dict[str, Any]:
        return {k: decode(v, self.path, "meta", f"key {k!r}", "value")
                for k, v in self.conn.execute("SELECT key, value FROM meta")}

    def put_cache(self, key, response, model) -> None:
        self._begin()
        self.cache.put_later(key, response, model)
        self.maybe_commit()

    # -- cells ------------------------------------------------------------------------------
    def cell_status(self, cell_id: str) -> str | None:
        row = self.conn.execute("SELECT status FROM cells WHERE cell_id=?", (cell_id,)).fetchone()
        return row[0] if row else None

    def start_cell(self, cell_id: str, ord_: int, coords: dict[str, Any]) -> None:
        self.start_cells([(cell_id, ord_, coords)])

    def start_cells(self, cells: Iterable[tuple[str, int, dict[str, Any]]]) -> None:
        """Mark cells running (cell id, grid order, coordinates), in one statement.

        The first time, ``meta.cells_started`` is set in the same transaction: a store that
        has it but no cells was emptied, and a resume refuses it instead of paying again."""
        self._begin()
        if not self._cells_started:
            self.conn.execute("INSERT OR IGNORE INTO meta VALUES ('cells_started', 'true')")
            self._cells_started = True
        now = time.time()
        self.conn.executemany(
            "INSERT INTO cells VALUES (?,?,?,'running',NULL,?,NULL) ON CONFLICT(cell_id) DO UPDATE "
            "SET status='running', error=NULL, started=excluded.started, coords=excluded.coords",
            [(cell_id, ord_, dumps(coords), now) for cell_id, ord_, coords in cells])

    def finish_cell(self, cell_id: str, calls: Iterable[CallRecord],
                    outputs: Iterable[tuple[str, Any]], *, error: str | None = None) -> None:
        """Write a cell's calls and outputs and its final status in one transaction.

        With `batch_s` set, several cells share that transaction (committed at most `batch_s`
        seconds later, or by `maybe_commit`/`close`): a killed run loses the last few finished
        cells, never half of one.
        """
        self.finish_cells([(cell_id, calls, outputs, error)])

    def finish_cells(self, cells: Iterable[tuple[str, Iterable[CallRecord],
                                                 Iterable[tuple[str, Any]], str | None]]) -> None:
        """`finish_cell` for several cells (id, calls, outputs, error) in one transaction."""
        cells = list(cells)
        ids = [(cell_id,) for cell_id, *_ in cells]
        self._begin()
        self.conn.executemany("DELETE FROM calls WHERE cell_id=?", ids)
        self.conn.executemany("DELETE FROM outputs WHERE cell_id=?", ids)
        self.conn.executemany(
            "INSERT INTO calls (cell_id, seq, record, node, cache_key, cache_hit, input_tokens, "
            "output_tokens, error, parse_error) VALUES (?,?,?,?,?,?,?,?,?,?)",
            [(cell_id, i, c.model_dump_json(), c.node, c.cache_key, int(c.cache_hit),
              c.input_tokens, c.output_tokens, c.error, c.parse_error)
             for cell_id, calls, _, _ in cells for i, c in enumerate(calls)])
        self.conn.executemany("INSERT INTO outputs VALUES (?,?,?,?)",
                              [(cell_id, i, node, dumps(value))
                               for cell_id, _, outputs, _ in cells
                               for i, (node, value) in enumerate(outputs)])
        now = time.time()
        self.conn.executemany("UPDATE cells SET status=?, error=?, finished=? WHERE cell_id=?",
                              [("error" if error else "done", error, now, cell_id)
                               for cell_id, _, _, error in cells])
        if self.batch_s:
            self.maybe_commit(self.batch_s)
        else:
            self.commit()

    def damage(self) -> list[Damage]:
        """Rows whose JSON biaslab cannot read (see `biaslab.traces.damage`); [] when sound."""
        return find_damage(self.conn)

    def check_rows(self) -> None:
        """Raise `DamagedStore` naming the first damaged row, if any."""
        found = self.damage()
        if found:
            raise damage_error(self.path, found)

    def reset_damaged(self) -> list[Damage]:
        """Before a resume: cells with a damaged row lose their calls and outputs and run
        again (their answers are in the cache, so this costs no model calls). Damage outside
        cells (``meta``) cannot be repaired and raises `DamagedStore`."""
        found = find_damage(self.conn, limit=1_000_000)
        if any(d.cell_id is None for d in found):
            raise damage_error(self.path, [d for d in found if d.cell_id is None])
        ids = sorted({(d.cell_id,) for d in found})
        if ids:
            self._begin()
            for table in ("calls", "outputs"):
                self.conn.executemany(f"DELETE FROM {table} WHERE cell_id=?", ids)
            self.conn.executemany("UPDATE cells SET status='pending' WHERE cell_id=?", ids)
            self.commit()
        return found

    def reset_unfinished(self) -> int:
        """Before a resume: cells that were running when the run died start again.

        Their cached responses stay, so re-running them costs no model calls."""
        self._begin()
        n = self.conn.execute("UPDATE cells SET status='pending' WHERE status='running'").rowcount
        self.commit()
        return n

    @contextmanager
    def _from_store(self, source: str | Path):
        """Another run's store attached read-only as ``src``, in one transaction of this one:
        committed on leaving, rolled back on any error, detached either way."""
        conn = self.conn
        self.commit()
        conn.execute("ATTACH DATABASE ? AS src", (f"file:{Path(source) / STORE_FILE}?mode=ro",))
        try:
            self._begin()
            yield conn
            self.commit()
        except BaseException:
            if self._in_tx:
                conn.execute("ROLLBACK")
                self._in_tx = False
            raise
        finally:
            conn.execute("DETACH DATABASE src")

    def merge_from(self, source: str | Path) -> int:
        """Copy another store's finished cells, with their calls and outputs, and its response
        cache into this one, in one transaction (shards of one run). A cell done here is never
        replaced by one that failed there. Returns the number of cells copied."""
        with self._from_store(source) as conn:
            conn.execute("""CREATE TEMP TABLE pick AS SELECT s.cell_id FROM src.cells s
                LEFT JOIN main.cells m ON m.cell_id = s.cell_id
                WHERE s.status = 'done' OR (s.status = 'error' AND
                      (m.cell_id IS NULL OR m.status <> 'done'))""")
            n = conn.execute("SELECT COUNT(*) FROM temp.pick").fetchone()[0]
            for table in ("calls", "outputs", "cells"):
                conn.execute(f"DELETE FROM main.{table} WHERE cell_id IN "
                             "(SELECT cell_id FROM temp.pick)")
            picked = "cell_id IN (SELECT cell_id FROM temp.pick)"
            conn.execute(f"INSERT INTO main.cells SELECT * FROM src.cells WHERE {picked}")
            cols = ("cell_id, seq, record, node, cache_key, cache_hit, input_tokens, "
                    "output_tokens, error, parse_error")
            conn.execute(f"INSERT INTO main.calls ({cols}) SELECT {cols} FROM src.calls "
                         f"WHERE {picked} ORDER BY cell_id, seq")
            conn.execute(f"INSERT INTO main.outputs SELECT * FROM src.outputs WHERE {picked}")
            conn.execute("INSERT OR IGNORE INTO main.cache SELECT * FROM src.cache")
            self.cache.written_elsewhere()
            conn.execute("DROP TABLE temp.pick")
        return n

    def copy_outputs_from(self, source: str | Path) -> int:
        """Copy another store's meta, finished cells and their node outputs, without their call
        records, into this empty one (a re-scoring that changes some outputs and reports:
        judge sensitivity of a run it cannot replay). Returns the number of cells copied."""
        with self._from_store(source) as conn:
            conn.execute("INSERT OR REPLACE INTO main.meta SELECT * FROM src.meta")
            conn.execute("INSERT INTO main.cells SELECT * FROM src.cells WHERE status = 'done'")
            conn.execute("INSERT INTO main.outputs SELECT o.* FROM src.outputs o JOIN "
                         "src.cells c ON c.cell_id = o.cell_id WHERE c.status = 'done'")
            n = conn.execute("SELECT COUNT(*) FROM main.cells").fetchone()[0]
        return n

    def replace_outputs(self, cell_id: str, values: dict[str, Any]) -> None:
        """Set the last output of each named node of a cell to a new value (in the open
        transaction; `commit` writes it)."""
        self._begin()
        for node, value in values.items():
            self.conn.execute(
                "UPDATE outputs SET value=? WHERE cell_id=? AND node=? AND seq=(SELECT MAX(seq) "
                "FROM outputs WHERE cell_id=? AND node=?)",
                (dumps(value), cell_id, node, cell_id, node))

    # -- reading ----------------------------------------------------------------------------
    def node_calls(self, nodes: Iterable[str], fields: dict[str, str]) -> pd.DataFrame:
        """The call records of `nodes` in finished cells, flat, read by SQLite without
        rebuilding a `CallRecord` per row: ``cell_id``, ``seq``, ``node``, ``error``,
        ``parse_error`` and one column per `fields` entry (column name → JSON path into the
        record, e.g. ``"$.raw"``), each as JSON text (``json.loads`` gives the value: a
        string, number, boolean, list, object or None; a path the record lacks gives None)."""
        import pandas as pd

        nodes = list(nodes)
        if not nodes:
            return pd.DataFrame(columns=["cell_id", "seq", "node", "error", "parse_error",
                                         *fields])
        picked = ", ".join(f"c.record -> '{path}' AS \"{name}\""
                           for name, path in fields.items())
        marks = ", ".join("?" for _ in nodes)
        query = (f"SELECT c.cell_id, c.seq, c.node, c.error, c.parse_error"
                 f"{', ' + picked if picked else ''} FROM calls c JOIN cells d ON "
                 f"d.cell_id = c.cell_id WHERE d.status = 'done' AND c.node IN ({marks}) "
                 "ORDER BY c.cell_id, c.seq")
        try:
            return pd.read_sql_query(query, self.conn, params=nodes)
        except sqlite3.OperationalError:  # malformed JSON in a record: say which row
            self.check_rows()
            raise

    def cells(self) -> pd.DataFrame:
        import pandas as pd

        frame = pd.read_sql_query("SELECT * FROM cells ORDER BY ord", self.conn)
        if len(frame):
            coords = pd.DataFrame([decode(c, self.path, "cells", f"cell {cid!r}", "coords", cid)
                                   for cid, c in zip(frame["cell_id"], frame["coords"])])
            frame = pd.concat([frame.drop(columns="coords"), coords], axis=1)
        return frame

    def iter_calls(self, cell_id: str | None = None) -> Iterator[CallRecord]:
        query = "SELECT id, cell_id, seq, record FROM calls" + \
            (" WHERE cell_id=?" if cell_id else "") + " ORDER BY cell_id, seq"
        for rowid, cid, seq, record in self.conn.execute(query, (cell_id,) if cell_id else ()):
            try:
                yield CallRecord.model_validate_json(record)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(map(str, first["loc"]))
                reason = f"is not a call record ({where + ': ' if where else ''}{first['msg']})"
                raise damage_error(self.path, [Damage(
                    "calls", f"rowid {rowid} (cell {cid!r}, call {seq})", "record", cid,
                    reason)]) from None

    def calls(self) -> pd.DataFrame:
        """Every call record as a DataFrame (messages and params kept as Python objects)."""
        import pandas as pd

        rows = [c.model_dump() for c in self.iter_calls()]
        return pd.DataFrame(rows, columns=list(CallRecord.model_fields))

    def calls_frame(self) -> pd.DataFrame:
        """The calls' flat columns (and each answer's text) straight from SQLite, without
        rebuilding a `CallRecord` per row: what large-store reports and rescoring read; about
        1 s per million calls where `calls()` takes tens of seconds and far more memory."""
        try:
            return self._calls_frame()
        except sqlite3.OperationalError:  # malformed JSON in a record: say which row
            self.check_rows()
            raise

    def _calls_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.read_sql_query(
            "SELECT cell_id, seq, node, json_extract(record, '$.item') AS item, "
            "json_extract(record, '$.sample') AS sample, "
            "json_extract(record, '$.exposed') AS exposed, cache_key, cache_hit, "
            "input_tokens, output_tokens, error, parse_error, "
            "json_extract(record, '$.raw') AS raw FROM calls ORDER BY cell_id, seq", self.conn)

    def iter_outputs(self, cell_id: str | None = None, node: str | None = None
                     ) -> Iterator[tuple[str, int, str, Any]]:
        """Yields (cell_id, seq, node, value) in cell and write order."""
        clauses, args = [], []
        if cell_id:
            clauses.append("cell_id=?")
            args.append(cell_id)
        if node:
            clauses.append("node=?")
            args.append(node)
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        for cid, seq, nd, value in self.conn.execute(
                f"SELECT cell_id, seq, node, value FROM outputs{where} ORDER BY cell_id, seq",
                args):
            yield cid, seq, nd, decode(value, self.path, "outputs", f"cell {cid!r}, output {seq}",
                                       "value", cid)

    def finished_outputs(self, node: str) -> Iterator[tuple[dict[str, Any], Any]]:
        """Yields (cell coordinates with ``cell_id``, value) for each output of `node` in a
        finished cell: what a report reads, never half a cell."""
        coords = {cid: {"cell_id": cid, **decode(c, self.path, "cells", f"cell {cid!r}",
                                                 "coords", cid)}
                  for cid, c in self.conn.execute(
                      "SELECT cell_id, coords FROM cells WHERE status='done'")}
        for cell_id, _, _, value in self.iter_outputs(node=node):
            if cell_id in coords:
                yield coords[cell_id], value

    def raw_outputs(self) -> dict[tuple[str, int], tuple[str, str]]:
        """Outputs as stored bytes, keyed by (cell_id, seq), for byte-for-byte comparison."""
        return {(c, s): (n, v) for c, s, n, v in
                self.conn.execute("SELECT cell_id, seq, node, value FROM outputs")}

    def counts(self) -> dict[str, int]:
        """Cells done and failed, and the calls' totals, in one pass over each table (every
        verb opens a store through this, and a paper-size store has ~300k calls)."""
        done, failed = self.conn.execute(
            "SELECT COALESCE(SUM(status='done'), 0), COALESCE(SUM(status='error'), 0) "
            "FROM cells").fetchone()
        calls, hits, unparsed, errors, paid = self.conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(cache_hit=1), 0), "
            "COALESCE(SUM(parse_error IS NOT NULL), 0), COALESCE(SUM(error IS NOT NULL), 0), "
            "COALESCE(SUM(CASE WHEN cache_hit=0 THEN input_tokens + output_tokens END), 0) "
            "FROM calls").fetchone()
        return {"cells_done": done, "cells_error": failed, "calls": calls, "cache_hits": hits,
                "parse_failures": unparsed, "call_errors": errors, "tokens_paid": paid}

    def export(self, out_dir: str | Path, fmt: str = "parquet") -> list[Path]:
        """Write calls, cells and outputs as Parquet or JSONL; nested fields as JSON strings."""
        import pandas as pd

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        calls = self.calls()
        for col in ("messages", "model", "params", "parsed"):
            calls[col] = calls[col].map(dumps)
        outputs = pd.DataFrame(self.iter_outputs(), columns=["cell_id", "seq", "node", "value"])
        outputs["value"] = outputs["value"].map(dumps)
        written = []
        for name, frame in (("calls", calls), ("cells", self.cells()), ("outputs", outputs)):
            path = out / f"{name}.{ 'parquet' if fmt == 'parquet' else 'jsonl'}"
            if fmt == "parquet":
                frame.to_parquet(path, index=False)
            else:
                frame.to_json(path, orient="records", lines=True, force_ascii=False)
            written.append(path)
        return written


class _ReadOnlyCache(CallCache):
    """A cache view over a read-only store (replay sources)."""

    def __init__(self, conn: sqlite3.Connection):
        super().__init__(conn, create=False)

    def put(self, *args, **kwargs) -> None:  # pragma: no cover - never written
        raise RuntimeError("read-only store")
