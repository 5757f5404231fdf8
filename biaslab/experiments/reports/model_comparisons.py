"""``tables/model_comparisons.csv`` and its forest plot: every pair of a run's models, paired on
the protocol's unit (`Protocol.unit`) and corrected for multiplicity.

Part of the generic report, so every protocol, built in or composed, gets it when its run has
two models or more. The same units as ``exposed_vs_clean.csv``, paired across the model axis
instead of the condition axis: same unit, same condition, same seed and node visit, model A
against model B (the statistics: `biaslab.evaluators.model_comparisons`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from biaslab.evaluators.model_comparisons import MODEL_COMPARISON_COLUMNS, compare_models
from biaslab.experiments.reports.figure_files import figures_wanted, save_figure
from biaslab.experiments.reports.units import ALL_GROUPS, PAIR_KEYS, unit_frame, unit_of
from biaslab.graphs.registry import Protocol
from biaslab.graphs.units import ITEM_UNIT, AnalysisUnit
from biaslab.traces.store import RunStore

__all__ = ["model_comparisons", "write_model_comparisons", "plot_model_comparisons",
           "MODEL_COMPARISONS_FILE", "MAX_FOREST_ROWS"]

MODEL_COMPARISONS_FILE = "model_comparisons"
MAX_FOREST_ROWS = 60
"""The forest plot shows at most this many rows (the smallest adjusted p first); the table
has them all."""
_ALPHA = 0.05


def _pooled_and_by_group(units: pd.DataFrame, unit: AnalysisUnit) -> pd.DataFrame:
    pooled = units.assign(group=ALL_GROUPS)
    return pd.concat([pooled, units], ignore_index=True) if unit.group else pooled


POOLED_FAMILY = "pooled"
PER_GROUP_FAMILY = "per group"


def _family(row: dict) -> str:
    """Two families: the pooled rows (``group = all``) and the per-group rows. A pooled row
    sums its group rows, so one family holding both would test each unit twice."""
    return POOLED_FAMILY if row["group"] == ALL_GROUPS else PER_GROUP_FAMILY


def model_comparisons(units: pd.DataFrame, unit: AnalysisUnit = ITEM_UNIT,
                      models: list[str] | None = None) -> pd.DataFrame:
    """Every pair of models on the same units, per variant × node × measure × stratum ×
    condition × group (``all`` pools the groups), with `MODEL_COMPARISON_COLUMNS`: paired on
    the unit with its seeds averaged, adjusted within two families (pooled rows, per-group
    rows), each label's complement counted once (`compare_models`).

    Args:
        units: `unit_frame` of the run.
        unit: the protocol's `AnalysisUnit` (names the unit and the sensitive attribute).
        models: the run's models in spec order; model A is the earlier of a pair, and
            ``diff`` is B − A.
    """
    if units.empty or units["model"].nunique() < 2:
        return pd.DataFrame(columns=MODEL_COMPARISON_COLUMNS)
    by = ["variant", "node", "field", "stratum", "condition", "group"]
    out = compare_models(_pooled_and_by_group(units, unit), value="value", model="model",
                         pair_on=PAIR_KEYS, by=by, models=models, replicates=["seed"],
                         family=_family, labels="field")
    out = out.rename(columns={"field": "measure"})
    out.insert(0, "unit", unit.name)
    out["attribute"] = unit.group or ""
    order = out.assign(_pooled=out["group"] != ALL_GROUPS)
    keys = ["variant", "node", "measure", "stratum", "condition", "model_a", "model_b"]
    order = order.sort_values([*keys, "_pooled", "group"], kind="stable")
    return order.drop(columns="_pooled").reset_index(drop=True)[MODEL_COMPARISON_COLUMNS]


def _short_names(models: list[str]) -> tuple[str, dict[str, str]]:
    """The models' shared prefix up to a separator (``scripted:roleplay-synthetic@``) and
    each model's name without it, so the plot's labels show what differs."""
    prefix = os.path.commonprefix(models)
    cut = max(prefix.rfind(c) for c in ":@/") + 1
    prefix = prefix[:cut]
    short = {m: m[cut:] or m for m in models}
    return prefix, short


def _label(row: Any, short: dict[str, str]) -> str:
    parts = [row.variant, row.node, row.measure, row.stratum, row.condition]
    if row.group != ALL_GROUPS:
        parts.append(f"{row.attribute}={row.group}")
    where = " · ".join(str(p) for p in parts if p)
    return f"{where}\n{short[row.model_b]} − {short[row.model_a]}"


def plot_model_comparisons(table: pd.DataFrame, figures: Path) -> list[Path]:
    """A forest plot: one line per compared row that has an interval (at most
    `MAX_FOREST_ROWS`, smallest Holm p first), the difference B − A as a dot and its CI as a
    bar, 0 (no difference) as a vertical line; filled dots survive Holm at α = 0.05."""
    shown = table[table["ci_low"].notna()].sort_values(["p_holm", "p"], kind="stable")
    if shown.empty or not figures_wanted():  # --no-figures: nothing drawn
        return []
    cut = len(shown) > MAX_FOREST_ROWS
    shown = shown.head(MAX_FOREST_ROWS).iloc[::-1]
    prefix, short = _short_names(sorted({*table["model_a"], *table["model_b"]}))
    labels = [_label(r, short) for r in shown.itertuples()]
    fig = Figure(figsize=(8.0, 1.4 + 0.42 * len(shown)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    y = range(len(shown))
    diff = shown["diff"].to_numpy(float)
    ax.hlines(list(y), shown["ci_low"], shown["ci_high"], color="0.35", linewidth=1.4)
    significant = (shown["p_holm"] < _ALPHA).to_numpy()
    ax.scatter(diff[significant], [i for i, s in zip(y, significant) if s], color="C3",
               zorder=3, label=f"Holm p < {_ALPHA}")
    ax.scatter(diff[~significant], [i for i, s in zip(y, significant) if not s],
               facecolor="white", edgecolor="0.2", zorder=3, label="not significant")
    ax.axvline(0.0, color="0.6", linestyle="--", linewidth=1)
    ax.set_yticks(list(y), labels, fontsize=7)
    ax.set_xlabel("difference B − A (paired, 95% bootstrap CI)")
    sizes = (table.dropna(subset=["family_size"]).groupby("family")["family_size"].max()
             .astype(int))
    families = ", ".join(f"{name} {size}" for name, size in sizes.items()) or "none"
    title = (f"Model against model{f' ({prefix}…)' if prefix else ''}: tests per family "
             f"({families})")
    ax.set_title(title + (f"\nthe {MAX_FOREST_ROWS} smallest Holm p shown" if cut else ""),
                 fontsize=9)
    ax.legend(fontsize=7, loc="best")
    figures.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, [
        (figures / f"{MODEL_COMPARISONS_FILE}.png", {"dpi": 150, "metadata": None}),
        (figures / f"{MODEL_COMPARISONS_FILE}.svg", {"dpi": "figure",
                                                     "metadata": {"Date": None}})])


def _models_in_spec_order(store: RunStore) -> list[str]:
    cells = store.cells()
    if cells.empty:
        return []
    if "ord" in cells:
        cells = cells.sort_values("ord", kind="stable")
    return list(dict.fromkeys(str(m) for m in cells["model"]))


def write_model_comparisons(store: RunStore, run_dir: str | Path, proto: Protocol | None = None,
                            options: Any = None, *, units: pd.DataFrame | None = None
                            ) -> list[Path]:
    """Write ``tables/model_comparisons.csv`` and ``figures/model_comparisons.{png,svg}`` when
    the run has two models or more; nothing otherwise. `units`: the run's
    :func:`unit_frame`, where the caller has built it already."""
    models = _models_in_spec_order(store)
    if len(models) < 2:
        return []
    run_dir = Path(run_dir)
    if units is None:
        units = unit_frame(store, proto, options)
    table = model_comparisons(units, unit_of(proto), models)
    path = run_dir / "tables" / f"{MODEL_COMPARISONS_FILE}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False, float_format="%.6g")
    return [path, *plot_model_comparisons(table, run_dir / "figures")]
