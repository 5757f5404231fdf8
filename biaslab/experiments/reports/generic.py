"""The report every protocol gets for free, including one a user wrote an hour ago.

It needs nothing but the run store:
- ``tables/calls_by_node.csv``: calls, tokens, errors and parse failures per variant × node ×
  condition × model: what the run asked and got, identical on every run of the same spec;
- ``cache_use.csv`` (beside ``tables/``, not in it): how many of those calls were paid and how
  many the cache answered. That depends on what the cache held when the run ran and, for
  identical calls in flight together, on scheduling; so it is kept out of the tables, which
  stay byte-identical between a fresh run and its cached re-run;
- ``tables/outputs.csv``: every node's state updates, one row per update, nested values
  flattened into columns;
- ``tables/exposed_vs_clean.csv``: for every measure of the protocol's unit (`Protocol.unit`:
  a record, a question, a dialogue...; by default the cell's item and every numeric, boolean
  or label output field), each exposed condition against clean on the same units, pooled and
  per group of the sensitive attribute, with a paired t interval from `MIN_PAIRS_FOR_CI`
  pairs on and a "too few pairs" note below that;
- ``tables/model_comparisons.csv`` and its forest plot, when the run has two models or more:
  every pair of models on the same units, with Holm and BH adjusted p-values over the table
  (`biaslab.experiments.reports.model_comparisons`);
- ``tables/mitigation_effects.csv``, when the run has mitigation arms (or the protocol a
  structural mitigation): each mitigation against the unmitigated arm of the same exposure
  (`biaslab.experiments.reports.mitigations`).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from biaslab.evaluators.exposure_effects import (CLEAN_CONDITION, MIN_PAIRS_FOR_CI, UNIT_PAIRING,
                                                paired_arms)
from biaslab.experiments.reports.findings import write_findings_figures
from biaslab.experiments.reports.units import (ALL_GROUPS, PAIR_KEYS, flatten, json_text,
                                               pairing_of,
                                               unit_frame, unit_of)
from biaslab.experiments.reports.model_comparisons import write_model_comparisons
from biaslab.graphs.registry import Protocol
from biaslab.graphs.units import ITEM_UNIT, AnalysisUnit
from biaslab.prompts.exposure import condition_id
from biaslab.traces.store import RunStore

__all__ = ["write_generic_report", "calls_by_node", "cache_use_by_node", "CACHE_USE_FILE",
           "outputs_table", "write_outputs_csv", "MAX_FIELD_COLUMNS", "exposed_vs_clean",
           "with_condition", "pooled_and_by_group", "sort_groups", "EXPOSED_VS_CLEAN_COLUMNS"]


_NODE_KEYS = ["variant", "node", "condition", "model"]


def _calls_per_node(store: RunStore) -> pd.DataFrame | None:
    """The calls summed per variant × node × condition × model. SQLite sums them per cell and
    node first, so a store of millions of calls never becomes a frame of millions of rows."""
    query = """
        SELECT cell_id, node, COUNT(*) AS calls, SUM(cache_hit) AS cache_hits,
               SUM(input_tokens) AS input_tokens, SUM(output_tokens) AS output_tokens,
               SUM(error IS NOT NULL) AS errors, SUM(parse_error IS NOT NULL) AS parse_failures
        FROM calls GROUP BY cell_id, node"""
    calls = pd.read_sql_query(query, store.conn)
    cells = store.cells()
    if calls.empty or cells.empty:
        return None
    cells = with_condition(cells)[["cell_id", "variant", "condition", "model"]]
    return calls.merge(cells, on="cell_id").groupby(_NODE_KEYS, sort=True).sum(
        numeric_only=True).reset_index()


CACHE_USE_FILE = "cache_use.csv"


def calls_by_node(store: RunStore) -> pd.DataFrame:
    """Per variant × node × condition × model: the calls, what they cost in tokens and how
    they ended. Nothing here depends on the cache or on scheduling (see `cache_use_by_node`)."""
    columns = [*_NODE_KEYS, "calls", "input_tokens", "output_tokens", "errors",
               "parse_failures", "parse_failure_rate"]
    out = _calls_per_node(store)
    if out is None:
        return pd.DataFrame(columns=columns)
    out["parse_failure_rate"] = out["parse_failures"] / out["calls"]
    return out[columns]


def cache_use_by_node(store: RunStore, setup: list[dict[str, Any]] = ()) -> pd.DataFrame:
    """Per variant × node × condition × model: calls paid (model calls) and calls the cache
    answered, and after them the `setup` rows: calls made before the grid (an audited app's
    discovery pass, condition ``discovery``). Volatile by nature: a re-run answers everything
    from the cache."""
    columns = [*_NODE_KEYS, "calls", "model_calls", "cache_hits"]
    out = _calls_per_node(store)
    if out is None:
        out = pd.DataFrame(columns=columns)
    else:
        out["model_calls"] = out["calls"] - out["cache_hits"]
        out = out[columns]
    if setup:
        out = pd.concat([out, pd.DataFrame(list(setup), columns=columns)], ignore_index=True)
    return out[columns]


def with_condition(cells: pd.DataFrame) -> pd.DataFrame:
    """`RunStore.cells()` with each cell's arm id in a ``condition`` column."""
    cells = cells.copy()
    mitigation = cells["mitigation"] if "mitigation" in cells else [None] * len(cells)
    cells["condition"] = [condition_id(str(t), str(d), m)
                          for t, d, m in zip(cells["target"], cells["direction"], mitigation)]
    return cells


MAX_FIELD_COLUMNS = 50
"""An output field whose nested dicts would spread over more columns than this (a dict keyed by
item id, say: one column per id) is written as one column of JSON text instead."""


def _output_rows(store: RunStore, wide: frozenset[str] = frozenset()
                 ) -> Iterator[dict[str, Any]]:
    """`outputs_table`'s rows, one at a time; the fields in `wide` stay JSON text."""
    cells = store.cells()
    if cells.empty:
        return
    cells = with_condition(cells)
    done = {r["cell_id"]: r for r in cells[cells["status"] == "done"][
        ["cell_id", "variant", "item", "condition", "model", "seed"]].to_dict("records")}
    visits: dict[tuple[str, str], int] = {}
    for cell_id, seq, node, value in store.iter_outputs():
        if cell_id not in done or value is None:
            continue
        visit = visits.get((cell_id, node), 0)
        visits[(cell_id, node)] = visit + 1
        row = {**done[cell_id], "node": node, "visit": visit}
        if isinstance(value, dict):
            flat: dict[str, Any] = {}
            for key, inner in value.items():
                flat.update({str(key): json_text(inner)} if key in wide
                            else flatten(inner, f"{key}."))
        else:
            flat = {"value": value}
        row.update({f"out.{k}" if k else "out": v for k, v in flat.items()})
        yield row


def _output_columns(store: RunStore) -> tuple[list[str], frozenset[str]]:
    """The columns of `outputs_table` in order of first appearance, and the output fields too
    wide to flatten (`MAX_FIELD_COLUMNS`): one pass over the outputs, keeping names only."""
    names: dict[str, None] = {}
    nested: dict[str, set[str]] = {}
    for row in _output_rows(store):
        for name in row:
            if name not in names:
                names[name] = None
                top, dot, rest = name.removeprefix("out.").partition(".")
                if name.startswith("out.") and dot:
                    nested.setdefault(top, set()).add(rest)
    wide = frozenset(t for t, inner in nested.items() if len(inner) > MAX_FIELD_COLUMNS)
    columns: dict[str, None] = {}
    for name in names:
        top, dot, _ = name.removeprefix("out.").partition(".")
        columns[f"out.{top}" if name.startswith("out.") and top in wide else name] = None
    return list(columns), wide


def outputs_table(store: RunStore) -> pd.DataFrame:
    """One row per node state update of a finished cell, with the cell's coordinates.

    ``visit`` counts a node's updates within its cell, so the k-th visit of a node in a loop
    lines up across conditions. Nested dicts become dotted columns, except a field that would
    need more than `MAX_FIELD_COLUMNS` of them (kept as JSON text). A big run's table is
    better written with `write_outputs_csv`, which never holds it whole."""
    columns, wide = _output_columns(store)
    return pd.DataFrame(list(_output_rows(store, wide)), columns=columns or None)


def _csv_value(value: Any) -> Any:
    """One cell of ``outputs.csv``, formatted by its own type (never by its chunk's column
    dtype, which would print the same number as 1 in one chunk and 1.0 in the next)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def write_outputs_csv(store: RunStore, path: str | Path) -> Path:
    """`outputs_table` written to `path` one row at a time (two passes over the outputs: the
    columns, then the rows), so memory stays flat in the size of the run."""
    columns, wide = _output_columns(store)
    path = Path(path)
    if not columns:
        pd.DataFrame().to_csv(path, index=False)
        return path
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        for row in _output_rows(store, wide):
            writer.writerow([_csv_value(row.get(name)) for name in columns])
    return path


def pooled_and_by_group(units: pd.DataFrame, unit: AnalysisUnit) -> pd.DataFrame:
    """The unit frame once pooled (group ``all``) and, where the protocol declares a
    sensitive attribute, once more per group."""
    pooled = units.assign(group=ALL_GROUPS)
    return pd.concat([pooled, units], ignore_index=True) if unit.group else pooled


EXPOSED_VS_CLEAN_COLUMNS = ["unit", "variant", "model", "node", "field", "stratum",
                            "attribute", "group", "condition", "pairing", "n_pairs", "n_seeds",
                            "clean_mean", "exposed_mean", "diff", "ci_low", "ci_high", "note"]


def exposed_vs_clean(units: pd.DataFrame, unit: AnalysisUnit = ITEM_UNIT, *,
                     confidence: float = 0.95, min_pairs: int = MIN_PAIRS_FOR_CI,
                     pairing: str = UNIT_PAIRING) -> pd.DataFrame:
    """Each exposed condition against clean, per measure, paired on the protocol's unit.

    Args:
        units: `unit_frame` of the run.
        unit: the protocol's `AnalysisUnit` (names the unit and the sensitive attribute).

    Returns:
        One row per variant × model × node × measure × stratum × group × exposed condition
        (group ``all`` pools every group): ``n_pairs`` units seen in both arms (same item,
        node visit and unit id), each with its seeds averaged (``n_seeds``: how many), the two
        means, ``diff`` = exposed − clean (0: no effect), its paired t 95% interval, or none
        and a ``note`` when there are fewer than `MIN_PAIRS_FOR_CI` pairs. ``pairing`` names
        the rule; ``pairing="per-seed"`` makes each (unit, seed) a pair instead.
    """
    replicates, label = pairing_of(unit, pairing)
    if units.empty or CLEAN_CONDITION not in set(units["condition"]):
        return pd.DataFrame(columns=EXPOSED_VS_CLEAN_COLUMNS)
    effects = paired_arms(pooled_and_by_group(units, unit), value="value", pair_on=PAIR_KEYS,
                          arm="condition", reference=CLEAN_CONDITION,
                          by=["variant", "model", "node", "field", "stratum", "group"],
                          names=("clean", "exposed"), confidence=confidence,
                          min_pairs=min_pairs,
                          replicates=replicates)
    effects.insert(0, "unit", unit.name)
    effects["pairing"] = label
    effects["attribute"] = unit.group or ""
    return sort_groups(effects, ["variant", "model", "node", "field", "stratum", "condition"]
                       )[EXPOSED_VS_CLEAN_COLUMNS]


def sort_groups(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows sorted by `keys`, then the pooled row (group ``all``) before each group's."""
    order = frame.assign(_pooled=frame["group"] != ALL_GROUPS)
    return (order.sort_values([*keys, "_pooled", "group"], kind="stable")
            .drop(columns="_pooled").reset_index(drop=True))


def write_generic_report(store: RunStore, run_dir: str | Path, proto: Protocol | None = None,
                         options: Any = None) -> list[Path]:
    """Write the three generic tables under ``run_dir/tables``; `proto` (and its `options`)
    say what a unit is (without one, the cell's item)."""
    tables = Path(run_dir) / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    written = []
    # one unit frame for every table below that reads one (it was built three times)
    units = unit_frame(store, proto, options)
    for name in ("calls_by_node", "outputs", "exposed_vs_clean"):
        path = tables / f"{name}.csv"
        if name == "outputs":  # streamed: a paper-size run's outputs never fit one frame
            written.append(write_outputs_csv(store, path))
            continue
        frame = (calls_by_node(store) if name == "calls_by_node" else
                 exposed_vs_clean(units.copy(), unit_of(proto)))
        frame.to_csv(path, index=False, float_format="%.6g")
        written.append(path)
    written += write_model_comparisons(store, run_dir, proto, options,  # 2+ models only
                                       units=units.copy())
    from biaslab.experiments.reports.mitigations import write_mitigation_effects  # uses this module

    written += write_mitigation_effects(store, run_dir, proto, options,  # mitigation arms only
                                        units=units.copy())
    written += write_findings_figures(run_dir)  # from the tables just written
    path = Path(run_dir) / CACHE_USE_FILE
    setup_calls = getattr(proto, "setup_calls", None)  # an app's discovery pass
    cache_use_by_node(store, setup_calls(options) if setup_calls and options else []
                      ).to_csv(path, index=False)
    written.append(path)
    return written
