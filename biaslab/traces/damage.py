"""Damage inside a run store's rows, found and named in one place.

SQLite checks its pages; it does not check the JSON biaslab keeps in ``cells.coords``,
``outputs.value``, ``calls.record`` and ``meta.value``. A row damaged there (a disk fault, a hand
edit, a tool that wrote into the file) would otherwise surface as a traceback deep inside a
report, or be copied on by a merge. `find_damage` looks for such rows with SQLite's own
``json_valid`` (about 0.5 s per million calls); `decode` is the one place that turns a row's
JSON into Python, and `damage_error` says which row is damaged in one line.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from biaslab.errors import DamagedStore

__all__ = ["Damage", "decode", "find_damage", "damage_error", "missing_tables",
           "tables_error", "TABLES"]

TABLES = ("meta", "cells", "calls", "outputs", "cache")
"""The tables every biaslab run store holds."""

# (table, what names a row, its cell id, the JSON column, the JSON type it must have or None)
_CHECKS = (
    ("meta", "'key ' || quote(key)", "NULL", "value", None),
    ("cells", "'cell ' || quote(cell_id)", "cell_id", "coords", "object"),
    ("calls", "'rowid ' || id || ' (cell ' || quote(cell_id) || ', call ' || seq || ')'",
     "cell_id", "record", "object"),
    ("outputs", "'cell ' || quote(cell_id) || ', output ' || seq", "cell_id", "value", None),
)


@dataclass(frozen=True)
class Damage:
    """One damaged row: ``table`` row ``row`` (e.g. ``rowid 3 (cell 'E0/…', call 1)``) has a
    ``column`` that is not what biaslab wrote; ``cell_id`` is the cell it belongs to, if any."""

    table: str
    row: str
    column: str
    cell_id: str | None
    reason: str = "is not valid JSON"

    def describe(self) -> str:
        return f"table {self.table}, {self.row}: {self.column} {self.reason}"


def missing_tables(conn: sqlite3.Connection, schema: str = "main") -> list[str]:
    """The run-store tables that `conn`'s database lacks (all of them for a new, empty file)."""
    present = {name for (name,) in conn.execute(
        f"SELECT name FROM {schema}.sqlite_master WHERE type='table'")}
    return [t for t in TABLES if t not in present]


def find_damage(conn: sqlite3.Connection, *, limit: int = 20) -> list[Damage]:
    """Rows whose JSON is not valid (or, for coordinates and call records, not a JSON object),
    at most `limit` of them, table by table."""
    found: list[Damage] = []
    for table, row, cell, column, kind in _CHECKS:
        wrong = f"NOT json_valid({column})"
        if kind:
            wrong += f" OR json_type({column}) <> '{kind}'"
        query = (f"SELECT {row}, {cell}, json_valid({column}) FROM {table} "
                 f"WHERE {column} IS NULL OR {wrong} LIMIT ?")
        for name, cell_id, valid in conn.execute(query, (limit - len(found),)):
            reason = f"is not a JSON {kind}" if valid else "is not valid JSON"
            found.append(Damage(table, name, column, cell_id, reason))
        if len(found) >= limit:
            break
    return found


def damage_error(path: str | Path, damage: list[Damage], hint: str | None = None) -> DamagedStore:
    """The one-line error for `damage` (the first row named, with how many more there are)."""
    more = f" (and {len(damage) - 1} more damaged rows)" if len(damage) > 1 else ""
    hint = hint or _hint(damage, Path(path).parent)
    return DamagedStore(f"{path} is damaged: {damage[0].describe()}{more}; {hint}")


def tables_error(path: str | Path, missing: list[str]) -> DamagedStore:
    """The one-line error for a store that lacks some of its tables (dropped by hand or by a
    tool): resuming it would lose its call records without a word."""
    names = ", ".join(missing)
    return DamagedStore(f"{path} is damaged: its {names} table{'s' if len(missing) > 1 else ''} "
                        f"{'are' if len(missing) > 1 else 'is'} missing; the run cannot be read "
                        "or resumed past it: restore run.sqlite from a copy, or run the spec "
                        "again into a new --out")


def _hint(damage: list[Damage], run_dir: Path) -> str:
    if all(d.cell_id for d in damage):
        return (f"biaslab run --resume {run_dir} runs the damaged cells again (their answers "
                "come from the cache); nothing else reads past it")
    return "the run cannot be read past it: restore run.sqlite from a copy, or run the spec again"


def decode(text: Any, path: str | Path, table: str, row: str, column: str,
           cell_id: str | None = None) -> Any:
    """`text` from a row's JSON column as Python; a `DamagedStore` naming the row if it is not
    JSON."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        reason = f"is not valid JSON ({exc})" if isinstance(exc, ValueError) else "is empty"
        raise damage_error(path, [Damage(table, row, column, cell_id, reason)]) from None
