"""A run's units and their measures, read from the store with the protocol's `AnalysisUnit`.

`unit_frame` is what the generic tables pair: one row per finished cell × node visit × unit ×
stratum × measure, with the unit's group. Exposed against clean (``exposed_vs_clean.csv``)
and a counterfactual against its source (``compare_measures.csv``) are both pairings of it.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from biaslab.evaluators.exposure_effects import UNIT_PAIRING, pairing_label
from biaslab.graphs.llm_nodes import turn_loops
from biaslab.graphs.registry import Protocol
from biaslab.graphs.units import ITEM_UNIT, AnalysisUnit, Measure
from biaslab.prompts.exposure import condition_id
from biaslab.traces.store import RunStore

__all__ = ["unit_frame", "cell_measures", "unit_of", "flatten", "json_text", "pairing_of",
           "UNIT_KEYS", "PAIR_KEYS", "ALL_GROUPS"]

UNIT_KEYS = ["variant", "item", "condition", "model", "seed", "node", "visit", "unit",
             "stratum", "group", "field"]
"""The columns of `unit_frame` besides ``value``."""
PAIR_KEYS = ["item", "seed", "visit", "unit"]
"""What makes two rows the same unit (with variant, model, node, field, stratum, group)."""
ALL_GROUPS = "all"
"""The group column's value on a row pooled over every group."""

_MAX_LABELS = 8  # a string field with at most this many short distinct values is a label
_MAX_LABEL_CHARS = 40


def pairing_of(unit: AnalysisUnit, pairing: str = UNIT_PAIRING) -> tuple[list[str], str]:
    """The seed handling of every paired table: (the `PAIR_KEYS` averaged away, the words of
    the table's ``pairing`` column).

    By default (`UNIT_PAIRING`) a unit's seeds are averaged first, so a pair is a unit;
    a protocol whose seeds make new units (`AnalysisUnit.seed_units`) pairs (unit, seed), and
    so does the named alternative `SEED_PAIRING`."""
    label = pairing_label(pairing)
    if pairing != UNIT_PAIRING:
        return [], label
    if unit.seed_units:
        return [], "unit x seed (each seed a new unit)"
    return ["seed"], label


def unit_of(proto: Protocol | None) -> AnalysisUnit:
    """The protocol's declared unit, or `ITEM_UNIT` when there is no protocol."""
    return getattr(proto, "unit", None) or ITEM_UNIT


json_text = json.JSONEncoder(default=str).encode
"""What ``json.dumps(value, default=str)`` writes, without building an encoder per call (a
paper-size outputs CSV writes hundreds of thousands of lists and wide fields)."""


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts become dotted keys; lists are kept as JSON text."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(flatten(inner, f"{prefix}{key}."))
        return out
    if isinstance(value, list):
        return {prefix.rstrip("."): json_text(value)}
    return {prefix.rstrip("."): value}


def _dig(value: Any, path: str | None) -> Any:
    for key in (path.split(".") if path else ()):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _rows(value: Any, unit: AnalysisUnit) -> list[Mapping[str, Any]]:
    found = _dig(value, unit.rows)
    if isinstance(found, list):
        return [r for r in found if isinstance(r, Mapping)]
    if isinstance(found, Mapping):
        return [found]
    return [] if unit.rows else [{"value": found}]


def _no_lists(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row without its list fields (turns, votes...): a list is no measure of its unit, and
    a protocol whose units sit in a list declares it as `AnalysisUnit.rows`."""
    return {k: _no_lists(v) if isinstance(v, Mapping) else v for k, v in row.items()
            if not isinstance(v, list)}


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _lookup(key: str, row: Mapping, attrs: Mapping, coords: Mapping) -> Any:
    for source in (row, attrs, coords):
        if key in source:
            return source[key]
    return None


def _excluded(unit: AnalysisUnit, proto: Protocol | None, variant: str, options: Any
              ) -> set[str]:
    """Fields never compared: the unit's id, group and strata, its bookkeeping fields, and
    the turn-loop counters of the variant's graph."""
    out = {unit.id, *unit.strata, *unit.bookkeeping}
    if unit.group:
        out.add(unit.group)
    if proto is not None:
        out.update(loop.turn_key for loop in turn_loops(proto.build(variant, options))
                   if loop.turn_key)
    return out


def _readings(column: pd.Series, *, declared: bool) -> dict[str, pd.Series]:
    """The comparable readings of a column: itself if numeric or boolean, one 0/1 indicator
    per label if it holds a few short strings (any count when `declared`), else nothing."""
    values = column[~column.map(_missing)]
    if values.empty:
        return {}
    if values.map(lambda v: isinstance(v, (bool, np.bool_, int, float, np.number))).all():
        return {"": column.map(lambda v: np.nan if _missing(v) else float(v))}
    if values.map(lambda v: isinstance(v, str)).all():
        labels = sorted(values.unique())
        short = all(len(label) <= _MAX_LABEL_CHARS for label in labels)
        repeated = declared or len(labels) < len(values)
        if short and len(labels) <= _MAX_LABELS and repeated:
            return {f"={label}": column.map(lambda v, label=label: np.nan if _missing(v)
                                            else float(v == label)) for label in labels}
    return {}


def _wide(store: RunStore, unit: AnalysisUnit, options: Any) -> pd.DataFrame:
    """One row per finished cell × node visit × unit row, with the row's flattened fields
    (prefixed ``f.``) and every `Measure`'s reading."""
    cells = store.cells()
    if cells.empty:
        return pd.DataFrame()
    cells = cells[cells["status"] == "done"].copy()
    mitigation = cells["mitigation"] if "mitigation" in cells else [None] * len(cells)
    cells["condition"] = [condition_id(str(t), str(d), m)
                          for t, d, m in zip(cells["target"], cells["direction"], mitigation)]
    coords = {r["cell_id"]: r for r in cells.to_dict("records")}
    measures = [m for m in unit.measures if isinstance(m, Measure)]
    rows, visits = [], {}
    outputs = (store.iter_outputs() if unit.nodes is None else
               (o for n in unit.nodes for o in store.iter_outputs(node=n)))
    for cell_id, _, node, value in outputs:
        c = coords.get(cell_id)
        if c is None or value is None:
            continue
        visit = visits.get((cell_id, node), 0)
        visits[(cell_id, node)] = visit + 1
        for row in _rows(value, unit):
            unit_id = _lookup(unit.id, row, {}, c)
            if _missing(unit_id):
                continue
            attrs = unit.attributes(unit_id, c, options) if unit.attributes else {}
            group = _lookup(unit.group, row, attrs, c) if unit.group else None
            stratum = ", ".join(f"{s}={row.get(s)}" for s in unit.strata)
            out = {"variant": c["variant"], "item": c["item"], "condition": c["condition"],
                   "model": c["model"], "seed": c["seed"], "node": node, "visit": visit,
                   "unit": str(unit_id), "stratum": stratum,
                   "group": None if _missing(group) else str(group)}
            out.update({f"f.{k or 'value'}": v for k, v in flatten(_no_lists(row)).items()})
            out.update({f"m.{m.name}": m.read(row) for m in measures})
            rows.append(out)
    return pd.DataFrame(rows)


def unit_frame(store: RunStore, proto: Protocol | None = None, options: Any = None
               ) -> pd.DataFrame:
    """Every measure of every unit, long: `UNIT_KEYS` + ``value`` (NaN = unscored).

    A label field becomes one 0/1 measure per label (``decision=older``). A unit with
    several rows in one stratum of a cell visit gets their mean.
    """
    unit = unit_of(proto)
    wide = _wide(store, unit, options)
    if wide.empty:
        return pd.DataFrame(columns=[*UNIT_KEYS, "value"])
    keys = [k for k in UNIT_KEYS if k != "field"]
    declared = [m.name if isinstance(m, Measure) else m for m in unit.measures]
    parts, excluded = [], {}
    for (variant, node), frame in wide.groupby(["variant", "node"], sort=True):
        empty = [c for c in frame.columns if c.startswith(("f.", "m.")) and frame[c].isna().all()]
        frame = frame.drop(columns=empty)
        if declared:
            fields = [(name, f"{'m' if f'm.{name}' in frame else 'f'}.{name}")
                      for name in declared]
        else:
            if variant not in excluded:
                excluded[variant] = _excluded(unit, proto, variant, options)
            skip = excluded[variant]
            fields = [(c[2:], c) for c in frame.columns
                      if c.startswith("f.") and c[2:] not in skip
                      and not c[2:].endswith(("_id", ".id")) and c[2:] != "id"]
        for name, column in fields:
            if column not in frame:
                continue
            for suffix, reading in _readings(frame[column], declared=bool(declared)).items():
                part = frame[keys].assign(field=name + suffix, value=reading.to_numpy())
                parts.append(part)
    if not parts:
        return pd.DataFrame(columns=[*UNIT_KEYS, "value"])
    long = pd.concat(parts, ignore_index=True)
    long["group"] = long["group"].fillna("")
    return (long.groupby(UNIT_KEYS, sort=True, dropna=False)["value"].mean()
            .reset_index())


def cell_measures(proto: Protocol | None, options: Any, variant: str, coords: Mapping[str, Any],
                  outputs: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """The measures one cell gives its units, read as `unit_frame` reads them, for a page
    that shows one grid point under two arms (the viewer's compare page): the same unit rows,
    the same measures and the same fields left out (ids, group, strata, turn-loop counters).

    `outputs` are the cell's ``(node, value)`` in write order. A value is a number, a short
    label (the table's ``decision=older`` is the label ``older`` of ``decision``) or None
    (unscored). One entry per node visit × unit row × field."""
    unit = unit_of(proto)
    declared = [m.name if isinstance(m, Measure) else m for m in unit.measures]
    measures = [m for m in unit.measures if isinstance(m, Measure)]
    skip = set() if declared else _excluded(unit, proto, variant, options)
    out: list[dict[str, Any]] = []
    visits: dict[str, int] = {}
    for node, value in outputs:
        if (unit.nodes is not None and node not in unit.nodes) or value is None:
            continue
        visit = visits.get(node, 0)
        visits[node] = visit + 1
        for row in _rows(value, unit):
            unit_id = _lookup(unit.id, row, {}, coords)
            if _missing(unit_id):
                continue
            flat = {k or "value": v for k, v in flatten(_no_lists(row)).items()}
            read = {m.name: m.read(row) for m in measures}
            names = declared or [k for k in flat if k not in skip and k != "id"
                                 and not k.endswith(("_id", ".id"))]
            base = {"node": node, "visit": visit, "unit": str(unit_id),
                    "stratum": ", ".join(f"{s}={row.get(s)}" for s in unit.strata)}
            for name in names:
                v = read[name] if name in read else flat.get(name)
                if _missing(v):
                    out.append({**base, "field": name, "value": None})
                elif isinstance(v, (bool, np.bool_, int, float, np.number)):
                    out.append({**base, "field": name, "value": float(v)})
                elif isinstance(v, str) and len(v) <= _MAX_LABEL_CHARS:
                    out.append({**base, "field": name, "value": v})
    return out
