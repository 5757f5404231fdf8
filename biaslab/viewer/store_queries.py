"""SQL over a run store for the viewer: every list is paginated and filtered in SQLite.

The viewer must stay fast on a store with a million call records, so nothing here loads a
table: cell filters are ``WHERE json_extract(coords, ...)`` clauses with ``LIMIT/OFFSET`` over
the (small) cells table, call lists use the ``calls(cell_id)`` index or keyset pagination on the
call id, and a call's JSON record is read only when it is opened.

A row whose JSON is damaged (``cells.coords``, ``calls.record``, ``outputs.value``) is shown
marked ``damaged`` rather than failing the page: every ``json_extract`` goes through `_jx`,
which reads invalid JSON as NULL (SQLite would abort the whole query), and the Python side
warns once per column on stderr.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any, Mapping

from biaslab.prompts.exposure import NO_MITIGATION, condition_id, split_condition_id
from biaslab.traces.store import STORE_FILE
from biaslab.viewer.params import MAX_INT

__all__ = ["ViewerQueries", "COORD_FILTERS", "JUDGE_HINTS"]

COORD_FILTERS = ("protocol", "variant", "item", "target", "direction", "model", "seed",
                 "mitigation")
JUDGE_HINTS = ("judge", "validator", "guardrail", "classifier", "coherence", "critique")
"""Node-name parts that mark a judging node, whose verdicts the call detail lists."""
MAX_PAGE = 500


def _jx(column: str, path: str) -> str:
    """``json_extract`` that reads a damaged JSON cell as NULL instead of aborting the query."""
    return f"json_extract(CASE WHEN json_valid({column}) THEN {column} END, '{path}')"


def _seed_value(value: str) -> Any:
    """A seed filter as SQLite compares it: an integer when it is one that SQLite can hold."""
    text = str(value)
    if text.lstrip("-").isdigit() and len(text) <= 20 and abs(int(text)) <= MAX_INT:
        return int(text)
    return text


class ViewerQueries:
    """Read-only queries on one run's ``run.sqlite`` (one connection per server thread)."""

    def __init__(self, run_dir: str | Path, *, create_indexes: bool = True):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / STORE_FILE
        self._local = threading.local()
        self._warned: set[str] = set()
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

    def _warn_damaged(self, column: str, row: str) -> None:
        """One stderr line per damaged column, naming the first row found."""
        if column not in self._warned:
            self._warned.add(column)
            print(f"biaslab view: {column} of {row} is not valid JSON; such rows are shown "
                  "marked 'damaged'", file=sys.stderr)

    # -- cells ------------------------------------------------------------------------------
    @staticmethod
    def cell_where(filters: Mapping[str, str], alias: str = "") -> tuple[str, list[Any]]:
        """WHERE clause (with a leading ``WHERE`` or empty) for the viewer's cell filters.

        ``condition`` is an arm id as the cells name it (``none``, ``target:direction``, either
        with ``+mit:<arm>``); without the mark it means the unmitigated arm only, so that a
        mitigated arm never hides among the arm it mitigates."""
        a = f"{alias}." if alias else ""
        col = f"{a}coords"
        clauses: list[str] = []
        args: list[Any] = []
        for key in COORD_FILTERS:
            value = filters.get(key)
            if value in (None, "") or (key == "mitigation" and value == NO_MITIGATION):
                continue
            clauses.append(f"{_jx(col, '$.' + key)} = ?")
            args.append(_seed_value(value) if key == "seed" else value)
        if filters.get("mitigation") == NO_MITIGATION:
            clauses.append(f"COALESCE({_jx(col, '$.mitigation')}, 'none') = 'none'")
        condition = filters.get("condition")
        if condition:
            exposure_arm, mitigation = split_condition_id(condition)
            if exposure_arm == "none":
                clauses.append(f"{_jx(col, '$.target')} = 'none'")
            else:
                target, _, direction = exposure_arm.partition(":")
                clauses.append(f"{_jx(col, '$.target')} = ?")
                clauses.append(f"{_jx(col, '$.direction')} = ?")
                args += [target, direction]
            clauses.append(f"COALESCE({_jx(col, '$.mitigation')}, 'none') = ?")
            args.append(mitigation)
        exposure = filters.get("exposure")  # clean, exposed, or an exposure arm id (tables
        if exposure in ("clean", "none"):    # such as mitigation_effects.csv link with one)
            clauses.append(f"{_jx(col, '$.target')} = 'none'")
        elif exposure == "exposed":
            clauses.append(f"{_jx(col, '$.target')} != 'none'")
        elif exposure:
            target, _, direction = split_condition_id(exposure)[0].partition(":")
            clauses.append(f"{_jx(col, '$.target')} = ?")
            clauses.append(f"{_jx(col, '$.direction')} = ?")
            args += [target, direction]
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

    def _cell_row(self, row: sqlite3.Row) -> dict[str, Any]:
        try:
            coords = json.loads(row["coords"])
            if not isinstance(coords, dict):
                raise ValueError("not an object")
        except (TypeError, ValueError):
            self._warn_damaged("cells.coords", f"cell {row['cell_id']}")
            coords = {"damaged": "cells.coords is not valid JSON"}
        condition = ("?" if "damaged" in coords else
                     condition_id(str(coords.get("target")), str(coords.get("direction")),
                                  coords.get("mitigation")))
        out = {"cell_id": row["cell_id"], "ord": row["ord"], "status": row["status"],
               "error": row["error"], "started": row["started"], "finished": row["finished"],
               **coords, "condition": condition}
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
                f"SELECT DISTINCT {_jx('coords', '$.' + key)} AS v FROM cells "
                "WHERE json_valid(coords) ORDER BY v")]
        arms = self.conn.execute(
            f"SELECT DISTINCT {_jx('coords', '$.target')}, {_jx('coords', '$.direction')}, "
            f"{_jx('coords', '$.mitigation')} FROM cells WHERE json_valid(coords)").fetchall()
        out["condition"] = sorted({condition_id(str(t), str(d), m) for t, d, m in arms})
        out["mitigation"] = sorted({m for _, _, m in arms if m not in (None, NO_MITIGATION)})
        if out["mitigation"]:
            out["mitigation"].insert(0, NO_MITIGATION)
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
                     f"{_jx('k.record', '$.item')} AS item, "
                     f"{_jx('k.record', '$.sample')} AS sample, "
                     f"{_jx('k.record', '$.attempt')} AS attempt, "
                     f"{_jx('k.record', '$.exposed')} AS exposed, "
                     f"{_jx('k.record', '$.latency_s')} AS latency_s, "
                     "json_valid(k.record) AS record_ok")

    def _call_rows(self, rows) -> list[dict[str, Any]]:
        out = []
        for r in rows:
            call = dict(r)
            if not call.pop("record_ok"):
                self._warn_damaged("calls.record", f"call {call['id']}")
                call["damaged"] = "calls.record is not valid JSON"
            out.append(call)
        return out

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
        out = self._call_rows(rows[:limit])
        return {"rows": out, "more": len(rows) > limit, "limit": limit,
                "next_after": out[-1]["id"] if out and order == "k.id" else None}

    def cell_calls(self, cell_id: str, *, limit: int = 200, offset: int = 0) -> list[dict]:
        rows = self.conn.execute(
            f"SELECT {self._CALL_COLUMNS} FROM calls k WHERE k.cell_id = ? ORDER BY k.seq "
            "LIMIT ? OFFSET ?", (cell_id, max(1, min(int(limit), MAX_PAGE)), int(offset)))
        return self._call_rows(rows)

    def _record(self, call_id: int, text: Any) -> dict[str, Any]:
        """A call's JSON record, or a ``damaged`` stand-in with no messages."""
        try:
            record = json.loads(text)
            if isinstance(record, dict):
                return record
        except (TypeError, ValueError):
            pass
        self._warn_damaged("calls.record", f"call {call_id}")
        return {"damaged": "calls.record is not valid JSON", "messages": []}

    def call(self, call_id: int) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT id, cell_id, seq, node, record FROM calls WHERE id = ?",
                                (int(call_id),)).fetchone()
        if row is None:
            return None
        return {"node": row["node"], **self._record(row["id"], row["record"]),
                "id": row["id"], "cell_id": row["cell_id"], "seq": row["seq"]}

    def matching_call(self, cell_id: str, node: str, item: str, sample: int, attempt: int
                      ) -> dict[str, Any] | None:
        """The call of another cell made by the same node for the same item/sample/attempt."""
        row = self.conn.execute(
            "SELECT id FROM calls WHERE cell_id = ? AND node = ? "
            f"AND {_jx('record', '$.item')} = ? AND {_jx('record', '$.sample')} = ? "
            f"AND {_jx('record', '$.attempt')} = ? LIMIT 1",
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
            rec = self._record(r["id"], r["record"])
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
        if "damaged" in cell:  # its grid point is unknown: it stands alone
            return [cell]
        return [self._cell_row(r) for r in self.conn.execute(
            f"SELECT * FROM cells {where} ORDER BY ord LIMIT 200", args)]

    def outputs(self, cell_id: str, limit: int = 200) -> list[dict[str, Any]]:
        out = []
        for seq, node, value in self.conn.execute(
                "SELECT seq, node, value FROM outputs WHERE cell_id = ? ORDER BY seq LIMIT ?",
                (cell_id, limit)):
            try:
                out.append({"seq": seq, "node": node, "value": json.loads(value)})
            except (TypeError, ValueError):
                self._warn_damaged("outputs.value", f"output {seq} of cell {cell_id}")
                out.append({"seq": seq, "node": node, "value": None,
                            "damaged": "outputs.value is not valid JSON"})
        return out

    _DIALOGUE = ("json_valid(value) AND "
                 "json_type(CASE WHEN json_valid(value) THEN value END, '$.dialogue.turns') "
                 "= 'array'")

    def dialogue(self, cell_id: str) -> dict[str, Any] | None:
        """The cell's dialogue: an output holding ``{"dialogue": {"turns": [...]}}``."""
        row = self.conn.execute(
            f"SELECT value FROM outputs WHERE cell_id = ? AND {self._DIALOGUE} "
            "ORDER BY seq DESC LIMIT 1", (cell_id,)).fetchone()
        return json.loads(row[0])["dialogue"] if row else None

    def has_dialogues(self) -> bool:
        """Whether the run holds dialogues (looks at a bounded number of outputs)."""
        row = self.conn.execute(
            "SELECT 1 FROM (SELECT value FROM outputs LIMIT 5000) "
            f"WHERE {self._DIALOGUE} LIMIT 1").fetchone()
        return row is not None
