"""SQL over a run store for the viewer: every list is paginated and filtered in SQLite.

The viewer must stay fast on a store with a million call records, so nothing here loads a
table: cell filters are ``WHERE json_extract(coords, ...)`` clauses with ``LIMIT/OFFSET`` over
the (small) cells table, call lists use the ``calls(cell_id)`` index or keyset pagination on the
call id, and a call's JSON record is read only when it is opened.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, Mapping

from biaslab.prompts.exposure import condition_id
from biaslab.traces.store import STORE_FILE

__all__ = ["ViewerQueries", "COORD_FILTERS", "JUDGE_HINTS"]

COORD_FILTERS = ("protocol", "variant", "item", "target", "direction", "model", "seed")
JUDGE_HINTS = ("judge", "validator", "guardrail", "classifier", "coherence", "critique")
"""Node-name parts that mark a judging node, whose verdicts the call detail lists."""
MAX_PAGE = 500


class ViewerQueries:
    """Read-only queries on one run's ``run.sqlite`` (one connection per server thread)."""

    def __init__(self, run_dir: str | Path, *, create_indexes: bool = True):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / STORE_FILE
        self._local = threading.local()
        if create_indexes:
            self._ensure_indexes()

    def _ensure_indexes(self) -> None:
        """Add a ``calls(node, id)`` index when the store is writable; harmless to the run
        code (it only ever creates tables and indexes IF NOT EXISTS) and skipped when the file
        is read-only or busy, in which case node filters scan in id order instead."""
        try:
            conn = sqlite3.connect(self.path, timeout=1.0)
            try:
                conn.execute("CREATE INDEX IF NOT EXISTS viewer_calls_node ON calls(node, id)")
                conn.commit()
            finally:
                conn.close()
        except sqlite3.Error:
            pass

    @property
    def conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5.0)
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
        return conn

    # -- cells ------------------------------------------------------------------------------
    @staticmethod
    def cell_where(filters: Mapping[str, str], alias: str = "") -> tuple[str, list[Any]]:
        """WHERE clause (with a leading ``WHERE`` or empty) for the viewer's cell filters."""
        a = f"{alias}." if alias else ""
        clauses: list[str] = []
        args: list[Any] = []
        for key in COORD_FILTERS:
            value = filters.get(key)
            if value in (None, ""):
                continue
            clauses.append(f"json_extract({a}coords, '$.{key}') = ?")
            args.append(int(value) if key == "seed" and str(value).lstrip("-").isdigit()
                        else value)
        condition = filters.get("condition")
        if condition:
            if condition == "none":
                clauses.append(f"json_extract({a}coords, '$.target') = 'none'")
            else:
                target, _, direction = condition.partition(":")
                clauses.append(f"json_extract({a}coords, '$.target') = ?")
                clauses.append(f"json_extract({a}coords, '$.direction') = ?")
                args += [target, direction]
        exposure = filters.get("exposure")
        if exposure == "clean":
            clauses.append(f"json_extract({a}coords, '$.target') = 'none'")
        elif exposure == "exposed":
            clauses.append(f"json_extract({a}coords, '$.target') != 'none'")
        if filters.get("status"):
            clauses.append(f"{a}status = ?")
            args.append(filters["status"])
        if filters.get("cell"):
            clauses.append(f"{a}cell_id = ?")
            args.append(filters["cell"])
        if filters.get("q"):
            clauses.append(f"{a}cell_id LIKE ?")
            args.append(f"%{filters['q']}%")
        return ("WHERE " + " AND ".join(clauses)) if clauses else "", args

    @staticmethod
    def _cell_row(row: sqlite3.Row) -> dict[str, Any]:
        coords = json.loads(row["coords"])
        condition = condition_id(str(coords.get("target")), str(coords.get("direction")))
        out = {"cell_id": row["cell_id"], "ord": row["ord"], "status": row["status"],
               "error": row["error"], "started": row["started"], "finished": row["finished"],
               "condition": condition, **coords}
        if "n_calls" in row.keys():
            out["n_calls"] = row["n_calls"]
        return out

    def cells(self, filters: Mapping[str, str], *, limit: int = 50, offset: int = 0
              ) -> dict[str, Any]:
        """A page of cells in grid order with their call counts, and the filtered total."""
        limit = max(1, min(int(limit), MAX_PAGE))
        where, args = self.cell_where(filters, "c")
        rows = self.conn.execute(
            "SELECT c.*, (SELECT COUNT(*) FROM calls k WHERE k.cell_id = c.cell_id) AS n_calls "
            f"FROM cells c {where} ORDER BY c.ord LIMIT ? OFFSET ?",
            [*args, limit, int(offset)]).fetchall()
        total = self.conn.execute(f"SELECT COUNT(*) FROM cells c {where}", args).fetchone()[0]
        return {"rows": [self._cell_row(r) for r in rows], "total": total, "limit": limit,
                "offset": int(offset)}

    def cell(self, cell_id: str) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT * FROM cells WHERE cell_id = ?", (cell_id,)).fetchone()
        return self._cell_row(row) if row else None

    def facets(self) -> dict[str, list[Any]]:
        """Distinct values for the filter menus (one pass over the cells table each)."""
        out: dict[str, list[Any]] = {}
        for key in ("protocol", "variant", "model", "seed"):
            out[key] = [r[0] for r in self.conn.execute(
                f"SELECT DISTINCT json_extract(coords, '$.{key}') AS v FROM cells ORDER BY v")]
        out["condition"] = [r[0] for r in self.conn.execute(
            "SELECT DISTINCT CASE WHEN json_extract(coords, '$.target') = 'none' THEN 'none' "
            "ELSE json_extract(coords, '$.target') || ':' || json_extract(coords, '$.direction')"
            " END AS v FROM cells ORDER BY v")]
        out["status"] = [r[0] for r in self.conn.execute(
            "SELECT DISTINCT status FROM cells ORDER BY status")]
        return out

    def meta(self) -> dict[str, Any]:
        meta = {}
        for key, value in self.conn.execute("SELECT key, value FROM meta"):
            try:
                meta[key] = json.loads(value)
            except ValueError:
                meta[key] = value
        return meta

    # -- calls ------------------------------------------------------------------------------
    _CALL_COLUMNS = ("k.id, k.cell_id, k.seq, k.node, k.cache_hit, k.input_tokens, "
                     "k.output_tokens, k.error, k.parse_error, "
                     "json_extract(k.record, '$.item') AS item, "
                     "json_extract(k.record, '$.sample') AS sample, "
                     "json_extract(k.record, '$.attempt') AS attempt, "
                     "json_extract(k.record, '$.exposed') AS exposed, "
                     "json_extract(k.record, '$.latency_s') AS latency_s")

    def calls(self, filters: Mapping[str, str], *, limit: int = 50, after: int = 0
              ) -> dict[str, Any]:
        """A page of call summaries, keyset-paginated on the call id (``after``).

        Filters: any cell filter, plus ``node``, ``parse_error=1``, ``error=1``, ``cache_hit``
        (0/1). ``more`` says whether another page follows; no total is counted, because a
        count over a million calls is what this view must not pay for."""
        limit = max(1, min(int(limit), MAX_PAGE))
        where, args = self.cell_where(filters, "c")
        clauses = [where.removeprefix("WHERE ")] if where else []
        if filters.get("node"):
            clauses.append("k.node = ?")
            args.append(filters["node"])
        if filters.get("parse_error") == "1":
            clauses.append("k.parse_error IS NOT NULL")
        if filters.get("error") == "1":
            clauses.append("k.error IS NOT NULL")
        if filters.get("cache_hit") in ("0", "1"):
            clauses.append("k.cache_hit = ?")
            args.append(int(filters["cache_hit"]))
        clauses.append("k.id > ?")
        args.append(int(after))
        join = "JOIN cells c ON c.cell_id = k.cell_id" if where else ""
        order = "k.seq" if filters.get("cell") else "k.id"
        rows = self.conn.execute(
            f"SELECT {self._CALL_COLUMNS} FROM calls k {join} WHERE {' AND '.join(clauses)} "
            f"ORDER BY {order} LIMIT ?", [*args, limit + 1]).fetchall()
        out = [dict(r) for r in rows[:limit]]
        return {"rows": out, "more": len(rows) > limit, "limit": limit,
                "next_after": out[-1]["id"] if out and order == "k.id" else None}

    def cell_calls(self, cell_id: str, *, limit: int = 200, offset: int = 0) -> list[dict]:
        rows = self.conn.execute(
            f"SELECT {self._CALL_COLUMNS} FROM calls k WHERE k.cell_id = ? ORDER BY k.seq "
            "LIMIT ? OFFSET ?", (cell_id, max(1, min(int(limit), MAX_PAGE)), int(offset)))
        return [dict(r) for r in rows]

    def call(self, call_id: int) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT id, cell_id, seq, record FROM calls WHERE id = ?",
                                (int(call_id),)).fetchone()
        if row is None:
            return None
        return {"id": row["id"], "cell_id": row["cell_id"], "seq": row["seq"],
                **json.loads(row["record"])}

    def matching_call(self, cell_id: str, node: str, item: str, sample: int, attempt: int
                      ) -> dict[str, Any] | None:
        """The call of another cell made by the same node for the same item/sample/attempt."""
        row = self.conn.execute(
            "SELECT id FROM calls WHERE cell_id = ? AND node = ? "
            "AND json_extract(record, '$.item') = ? AND json_extract(record, '$.sample') = ? "
            "AND json_extract(record, '$.attempt') = ? LIMIT 1",
            (cell_id, node, item, sample, attempt)).fetchone()
        return self.call(row[0]) if row else None

    def judge_calls(self, cell_id: str, *, exclude: int | None = None, limit: int = 40
                    ) -> list[dict[str, Any]]:
        """The cell's calls by judging nodes (name contains a `JUDGE_HINTS` part)."""
        like = " OR ".join("node LIKE ?" for _ in JUDGE_HINTS)
        rows = self.conn.execute(
            f"SELECT id, node, record FROM calls WHERE cell_id = ? AND ({like}) "
            "ORDER BY seq LIMIT ?", (cell_id, *[f"%{h}%" for h in JUDGE_HINTS], limit))
        out = []
        for r in rows:
            if r["id"] == exclude:
                continue
            rec = json.loads(r["record"])
            out.append({"id": r["id"], "node": r["node"], "item": rec.get("item"),
                        "sample": rec.get("sample"), "parsed": rec.get("parsed"),
                        "raw": rec.get("raw"), "parse_error": rec.get("parse_error")})
        return out

    # -- cells around a cell ---------------------------------------------------------------
    def siblings(self, cell_id: str) -> list[dict[str, Any]]:
        """Cells with the same variant, item, model and seed (every condition of one point)."""
        cell = self.cell(cell_id)
        if cell is None:
            return []
        filters = {k: str(cell[k]) for k in ("variant", "item", "model", "seed") if k in cell}
        where, args = self.cell_where(filters)
        return [self._cell_row(r) for r in self.conn.execute(
            f"SELECT * FROM cells {where} ORDER BY ord LIMIT 200", args)]

    def outputs(self, cell_id: str, limit: int = 200) -> list[dict[str, Any]]:
        return [{"seq": s, "node": n, "value": json.loads(v)} for s, n, v in self.conn.execute(
            "SELECT seq, node, value FROM outputs WHERE cell_id = ? ORDER BY seq LIMIT ?",
            (cell_id, limit))]

    def dialogue(self, cell_id: str) -> dict[str, Any] | None:
        """The cell's dialogue: an output holding ``{"dialogue": {"turns": [...]}}``."""
        row = self.conn.execute(
            "SELECT value FROM outputs WHERE cell_id = ? AND "
            "json_type(value, '$.dialogue.turns') = 'array' ORDER BY seq DESC LIMIT 1",
            (cell_id,)).fetchone()
        return json.loads(row[0])["dialogue"] if row else None

    def has_dialogues(self) -> bool:
        """Whether the run holds dialogues (looks at a bounded number of outputs)."""
        row = self.conn.execute(
            "SELECT 1 FROM (SELECT value FROM outputs LIMIT 5000) "
            "WHERE json_type(value, '$.dialogue.turns') = 'array' LIMIT 1").fetchone()
        return row is not None
