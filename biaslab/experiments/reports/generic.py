"""The report every protocol gets for free, including one a user wrote an hour ago.

It needs nothing but the run store:
- ``tables/calls_by_node.csv``: calls, model calls, cache hits, tokens, errors and parse
  failures per variant × node × condition × model;
- ``tables/outputs.csv``: every node's state updates, one row per update, nested values
  flattened into columns;
- ``tables/exposed_vs_clean.csv``: for every numeric, boolean or label output field, each
  exposed condition against clean on the same cells, with a paired bootstrap CI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from biaslab.evaluators.exposure_effects import paired_condition_effects
from biaslab.prompts.exposure import condition_id
from biaslab.traces.store import RunStore

__all__ = ["write_generic_report", "calls_by_node", "outputs_table", "exposed_vs_clean",
           "with_condition"]

_CELL_KEYS = ["variant", "item", "model", "seed"]
_MAX_LABELS = 8  # a string field with at most this many short distinct values is a label
_MAX_LABEL_CHARS = 40


def calls_by_node(store: RunStore) -> pd.DataFrame:
    """Per variant × node × condition × model: what the calls cost and how they ended."""
    query = """
        SELECT c.cell_id, k.node, k.cache_hit, k.input_tokens, k.output_tokens,
               k.error IS NOT NULL AS failed, k.parse_error IS NOT NULL AS unparsed
        FROM calls k JOIN cells c ON c.cell_id = k.cell_id"""
    calls = pd.read_sql_query(query, store.conn)
    cells = store.cells()
    columns = ["variant", "node", "condition", "model", "calls", "model_calls", "cache_hits",
               "input_tokens", "output_tokens", "errors", "parse_failures",
               "parse_failure_rate"]
    if calls.empty or cells.empty:
        return pd.DataFrame(columns=columns)
    cells = with_condition(cells)[["cell_id", "variant", "condition", "model"]]
    frame = calls.merge(cells, on="cell_id")
    grouped = frame.groupby(["variant", "node", "condition", "model"], sort=True)
    out = grouped.agg(calls=("node", "size"), cache_hits=("cache_hit", "sum"),
                      input_tokens=("input_tokens", "sum"),
                      output_tokens=("output_tokens", "sum"), errors=("failed", "sum"),
                      parse_failures=("unparsed", "sum")).reset_index()
    out["model_calls"] = out["calls"] - out["cache_hits"]
    out["parse_failure_rate"] = out["parse_failures"] / out["calls"]
    return out[columns]


def with_condition(cells: pd.DataFrame) -> pd.DataFrame:
    """`RunStore.cells()` with each cell's arm id in a ``condition`` column."""
    cells = cells.copy()
    cells["condition"] = [condition_id(str(t), str(d))
                          for t, d in zip(cells["target"], cells["direction"])]
    return cells


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts become dotted columns; lists are kept as JSON text."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_flatten(inner, f"{prefix}{key}."))
        return out
    if isinstance(value, list):
        return {prefix.rstrip("."): json.dumps(value, default=str)}
    return {prefix.rstrip("."): value}


def outputs_table(store: RunStore) -> pd.DataFrame:
    """One row per node state update of a finished cell, with the cell's coordinates.

    ``visit`` counts a node's updates within its cell, so the k-th visit of a node in a loop
    lines up across conditions."""
    cells = store.cells()
    if cells.empty:
        return pd.DataFrame()
    cells = with_condition(cells)
    done = cells[cells["status"] == "done"].set_index("cell_id")
    rows, visits = [], {}
    for cell_id, seq, node, value in store.iter_outputs():
        if cell_id not in done.index or value is None:
            continue
        visit = visits.get((cell_id, node), 0)
        visits[(cell_id, node)] = visit + 1
        coords = done.loc[cell_id]
        row = {"cell_id": cell_id, "variant": coords["variant"], "item": coords["item"],
               "condition": coords["condition"], "model": coords["model"],
               "seed": coords["seed"], "node": node, "visit": visit}
        flat = _flatten(value) if isinstance(value, dict) else {"value": value}
        row.update({f"out.{k}" if k else "out": v for k, v in flat.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def _measures(column: pd.Series) -> dict[str, pd.Series]:
    """The comparable readings of an output column: itself if numeric or boolean, one 0/1
    indicator per label if it is a small set of strings; nothing otherwise."""
    values = column.dropna()
    if values.empty:
        return {}
    if values.map(lambda v: isinstance(v, (bool, np.bool_))).all():
        return {"": column.map(lambda v: np.nan if v is None or v != v else float(v))}
    if values.map(lambda v: isinstance(v, (int, float, np.number))
                  and not isinstance(v, bool)).all():
        return {"": pd.to_numeric(column, errors="coerce")}
    if values.map(lambda v: isinstance(v, str)).all():
        labels = sorted(values.unique())
        short = all(len(label) <= _MAX_LABEL_CHARS for label in labels)
        if short and 1 < len(labels) <= _MAX_LABELS and len(labels) < len(values):
            return {f"={label}": column.map(lambda v, label=label: np.nan if v is None
                                            or v != v else float(v == label))
                    for label in labels}
    return {}


def exposed_vs_clean(outputs: pd.DataFrame, *, n_resamples: int = 2_000,
                     random_state: int = 0) -> pd.DataFrame:
    """Each exposed condition against clean, per node output field, paired on the same
    variant, item, model, seed and visit."""
    columns = ["variant", "node", "field", "condition", "n_pairs", "clean_mean",
               "exposed_mean", "diff", "ci_low", "ci_high"]
    if outputs.empty or "none" not in set(outputs["condition"]):
        return pd.DataFrame(columns=columns)
    parts = []
    for (variant, node), frame in outputs.groupby(["variant", "node"], sort=True):
        for field in [c for c in frame.columns if c.startswith("out")]:
            for suffix, measure in _measures(frame[field]).items():
                data = frame[_CELL_KEYS + ["visit", "condition"]].copy()
                data["value"] = measure
                if data.duplicated(_CELL_KEYS + ["visit", "condition"]).any():
                    continue
                effects = paired_condition_effects(
                    data, value="value", pair_on=["item", "model", "seed", "visit"],
                    n_resamples=n_resamples, random_state=random_state)
                if effects.empty:
                    continue
                effects.insert(0, "field", field.removeprefix("out.") + suffix)
                effects.insert(0, "node", node)
                effects.insert(0, "variant", variant)
                parts.append(effects)
    if not parts:
        return pd.DataFrame(columns=columns)
    return pd.concat(parts, ignore_index=True)[columns]


def write_generic_report(store: RunStore, run_dir: str | Path) -> list[Path]:
    """Write the three generic tables under ``run_dir/tables``."""
    tables = Path(run_dir) / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    outputs = outputs_table(store)
    written = []
    for name, frame in (("calls_by_node", calls_by_node(store)), ("outputs", outputs),
                        ("exposed_vs_clean", exposed_vs_clean(outputs))):
        path = tables / f"{name}.csv"
        frame.to_csv(path, index=False, float_format="%.6g")
        written.append(path)
    return written
