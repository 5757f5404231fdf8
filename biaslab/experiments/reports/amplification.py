"""Tables and figures of the "amplification" protocol.

* :func:`table1` -- FBS per pipeline x exposed agents x direction (rows) and model (columns), in
  the layout of the paper's Table 1; cells read ``"+0.088 ± .031"`` = seed-mean FBS ± mean
  bootstrap std.
* :func:`write_tables` -- CSV / Markdown files under ``<out_dir>/tables``.
* :func:`plot_fbs_scatter` -- AUC and accuracy vs FBS, one figure per dataset and pipeline, under
  ``<out_dir>/figures`` (marker = exposed agents, colour = direction, bars = ±1 bootstrap std).
* :func:`headline` -- Table 1 as ``biaslab report`` prints it on the terminal.

Plots use matplotlib's Agg canvas directly (no pyplot state, no display needed).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from biaslab.datasets.student import anchor_scores, cached_split, cached_test_probabilities
from biaslab.evaluators.amplification import CLEAN, aggregate_over_seeds
from biaslab.experiments.reports.markdown import to_markdown

__all__ = [
    "format_fbs",
    "table1",
    "write_tables",
    "fbs_scatter_figure",
    "target_markers",
    "plot_fbs_scatter",
    "headline",
    "write_report",
]

_PIPELINE_ORDER = {"E0": 0, "E1": 1, "E2": 2}
_DIRECTION_ORDER = {"pro_female": 0, "pro_male": 1}
_ROW_LEVELS = ["dataset", "pipeline", "target", "direction"]
_ROUTING = ["n", "n_parse_failures", "disagreement_rate", "disagreement_rate_F",
            "disagreement_rate_M", "judge_share", "judge_share_F", "judge_share_M"]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h"]


def _is_nan(x: Any) -> bool:
    try:
        return x is None or math.isnan(float(x))
    except (TypeError, ValueError):
        return True


def _no_leading_zero(x: float, digits: int = 3) -> str:
    s = f"{abs(x):.{digits}f}"
    if s.startswith("0."):
        s = s[1:]
    return ("-" if x < 0 else "") + s


def format_fbs(mean: float, std: float, digits: int = 3) -> str:
    """``"+0.088 ± .031"``: signed mean with ``digits`` decimals ± std without its leading zero.

    NaN mean -> ``"n/a"``; NaN std -> the mean alone.
    """
    if _is_nan(mean):
        return "n/a"
    head = f"{mean:+.{digits}f}"
    if _is_nan(std):
        return head
    return f"{head} ± {_no_leading_zero(float(std), digits)}"


def _target_sort_key(target: str) -> tuple[int, str]:
    return (target.count("+") + 1, target)


def _sort_rows(df: pd.DataFrame) -> pd.DataFrame:
    order = df.assign(
        _p=df["pipeline"].map(lambda p: _PIPELINE_ORDER.get(p, 99)),
        _t=df["target"].map(_target_sort_key),
        _d=df["direction"].map(lambda d: _DIRECTION_ORDER.get(d, 99)),
    ).sort_values(["dataset", "_p", "pipeline", "_t", "_d", "direction"], kind="stable")
    return order.drop(columns=["_p", "_t", "_d"])


def table1(aggregated: pd.DataFrame) -> pd.DataFrame:
    """FBS table in the layout of the paper's Table 1.

    Args:
        aggregated: :func:`~biaslab.evaluators.amplification.aggregate_over_seeds` output
            (needs ``fbs`` and ``fbs_boot_std``; per-seed metrics are pooled first).

    Returns:
        Rows: MultiIndex (dataset, pipeline, target, direction) of exposed conditions (clean
        rows omitted); columns: models; cells ``"+0.088 ± .031"`` (seed-mean FBS ± mean
        bootstrap std), ``"n/a"`` when FBS is undefined, ``""`` when the model lacks the row.
    """
    agg = aggregate_over_seeds(aggregated) if "seed" in aggregated.columns else aggregated
    agg = agg.loc[agg["target"] != CLEAN].copy()
    std = agg["fbs_boot_std"] if "fbs_boot_std" in agg.columns else pd.Series(np.nan, agg.index)
    agg["fbs_cell"] = [format_fbs(m, s) for m, s in zip(agg["fbs"], std)]
    models = list(dict.fromkeys(agg["model"]))  # caller's model order
    agg = _sort_rows(agg)
    if agg.empty:
        empty_index = pd.MultiIndex.from_tuples([], names=_ROW_LEVELS)
        return pd.DataFrame(index=empty_index, columns=models, dtype=object)
    rows = list(dict.fromkeys(agg[_ROW_LEVELS].itertuples(index=False, name=None)))
    out = pd.DataFrame("", index=pd.MultiIndex.from_tuples(rows, names=_ROW_LEVELS),
                       columns=pd.Index(models, name="model"), dtype=object)
    for rec in agg.itertuples(index=False):
        out.loc[tuple(getattr(rec, c) for c in _ROW_LEVELS), rec.model] = rec.fbs_cell
    return out


def write_tables(metrics: pd.DataFrame, aggregated: pd.DataFrame, superadd: pd.DataFrame,
                 out_dir: str | Path, superadd_over_seeds: pd.DataFrame | None = None
                 ) -> dict[str, Path]:
    """Write the protocol's tables under ``<out_dir>/tables``.

    Files: ``table1.csv``/``.md`` (:func:`table1`), ``condition_metrics.csv`` (per seed),
    ``aggregated.csv`` (over seeds), ``superadditivity.csv``/``.md`` (per seed) and, when
    given, ``superadditivity_over_seeds.csv``/``.md`` -- both with the paper's reading
    (``margin_over_strongest_single`` and ``verdict``: the Table 1 multi-agent FBS against the
    largest single-agent one) beside the sum reading (``superadditivity_sum_reading``, the
    paired common-rows index with its CI and ``verdict_sum``) --, and
    ``routing.csv`` (E2 rows of ``metrics``: counts, disagreement rates and judge shares,
    overall and per sex).

    Returns:
        ``{file name: path}`` of everything written.
    """
    tables = Path(out_dir) / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}

    def put(name: str, text: str) -> None:
        path = tables / name
        path.write_text(text, encoding="utf-8")
        written[name] = path

    t1 = table1(aggregated)
    put("table1.csv", t1.reset_index().to_csv(index=False))
    put("table1.md", to_markdown(t1))
    put("condition_metrics.csv", metrics.to_csv(index=False))
    put("aggregated.csv", aggregated.to_csv(index=False))
    put("superadditivity.csv", superadd.to_csv(index=False))
    put("superadditivity.md", to_markdown(superadd, index=False))
    if superadd_over_seeds is not None:
        put("superadditivity_over_seeds.csv", superadd_over_seeds.to_csv(index=False))
        put("superadditivity_over_seeds.md", to_markdown(superadd_over_seeds, index=False))
    keys = [c for c in ["dataset", "pipeline", "target", "direction", "model", "seed"]
            if c in metrics.columns]
    routing = metrics.loc[metrics["pipeline"] == "E2",
                          keys + [c for c in _ROUTING if c in metrics.columns]]
    put("routing.csv", routing.to_csv(index=False))
    return written


# Okabe & Ito (2008) colour-blind-safe palette: colour encodes the covert direction only.
_DIRECTION_COLOURS = {"pro_female": "#D55E00", "pro_male": "#0072B2"}  # vermillion, blue
_OTHER_COLOURS = ["#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442"]
_CLEAN_COLOUR = "#000000"
_FONT = 8.5  # points; the figure is drawn at its print size (7 in wide = a two-column page)


def _direction_colours(directions: Sequence[str]) -> dict[str, str]:
    out = {d: c for d, c in _DIRECTION_COLOURS.items() if d in directions}
    extra = [d for d in directions if d not in out]
    out.update({d: _OTHER_COLOURS[i % len(_OTHER_COLOURS)] for i, d in enumerate(extra)})
    return out


def _direction_sort_key(direction: str) -> tuple[int, str]:
    return (_DIRECTION_ORDER.get(direction, 99), direction)


def target_markers(targets: Sequence[str]) -> dict[str, str]:
    """Exposed target set -> marker, single agents first; pass every target of a report so a
    target keeps its marker in every pipeline's figure."""
    exposed = sorted({str(t) for t in targets if t != CLEAN}, key=_target_sort_key)
    return {t: _MARKERS[i % len(_MARKERS)] for i, t in enumerate(exposed)}


def fbs_scatter_figure(agg: pd.DataFrame, *, markers: dict[str, str] | None = None) -> Figure:
    """One (dataset, pipeline)'s AUC and accuracy against FBS, one row of panels per model.

    Args:
        agg: seed-aggregated rows of ONE dataset and pipeline (``fbs``, ``fbs_boot_std``,
            ``auc``, ``accuracy``), clean rows included.
        markers: exposed target set -> marker, shared by all figures of a report so a target
            looks the same in each; None assigns markers to this pipeline's targets.

    Encodings: marker = exposed target set (only those this pipeline has, in the legend),
    colour = covert direction (Okabe-Ito), horizontal bars = ±1 bootstrap std of FBS (the mean
    over seeds of each seed's paired bootstrap std, as in Table 1), dashed line = the model's
    clean run. Read: right of 0 the exposure moved predictions toward the favored group; below
    the dashed line it cost performance.
    """
    exposed = agg.loc[agg["target"] != CLEAN]
    targets = sorted(exposed["target"].astype(str).unique(), key=_target_sort_key)
    if markers is None:
        markers = target_markers(targets)
    directions = sorted(exposed["direction"].astype(str).unique(), key=_direction_sort_key)
    colours = _direction_colours(directions)
    models = list(dict.fromkeys(agg["model"].astype(str)))
    std_col = "fbs_boot_std" if "fbs_boot_std" in agg.columns else "fbs_std"

    n_rows = max(len(models), 1)
    legend_rows = max(math.ceil(len(targets) / 2), len(directions) + 2)
    legend_h = 0.15 + 0.2 * (legend_rows + 1)  # inches: a title line, then the entries
    fig = Figure(figsize=(7.0, 0.5 + 1.9 * n_rows + legend_h), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(n_rows + 1, 2, height_ratios=[1.9] * n_rows + [legend_h])
    axes = np.empty((n_rows, 2), dtype=object)
    for r in range(n_rows):
        for c in range(2):
            axes[r, c] = fig.add_subplot(grid[r, c], sharex=axes[0, 0] if (r or c) else None)
    legend_axes = [fig.add_subplot(g) for g in grid[n_rows, :].subgridspec(
        1, 2, width_ratios=[2.3, 1])]
    ylabels = {"auc": "AUC (test set)", "accuracy": "Accuracy (fraction correct)"}
    for r, model in enumerate(models):
        rows = agg.loc[agg["model"].astype(str) == model]
        for ax, metric in zip(axes[r], ["auc", "accuracy"]):
            ax.axvline(0.0, color="0.75", lw=0.8, zorder=0)
            clean = rows.loc[rows["target"] == CLEAN, metric]
            if len(clean) and not _is_nan(clean.iloc[0]):
                ax.axhline(float(clean.iloc[0]), color=_CLEAN_COLOUR, ls="--", lw=0.9,
                           alpha=0.7, zorder=1)
            for rec in rows.loc[rows["target"] != CLEAN].itertuples(index=False):
                x, y = rec.fbs, getattr(rec, metric)
                if _is_nan(x) or _is_nan(y):
                    continue
                xerr = getattr(rec, std_col, np.nan)
                colour = colours[str(rec.direction)]
                ax.errorbar([x], [y], xerr=None if _is_nan(xerr) else [[xerr], [xerr]],
                            fmt=markers[str(rec.target)], color=colour, ecolor=colour,
                            elinewidth=0.9, capsize=2.5, ms=6, mec="white", mew=0.5,
                            alpha=0.9, zorder=2)
            ax.set_ylabel(ylabels[metric], fontsize=_FONT)
            ax.tick_params(labelsize=_FONT - 0.5)
            ax.grid(alpha=0.3, lw=0.5)
            ax.set_title(f"{model}: {'AUC' if metric == 'auc' else 'accuracy'} vs FBS",
                         fontsize=_FONT, loc="left")
    for ax in axes[-1]:
        ax.set_xlabel("FBS (−2…2; > 0 = toward the favored group)", fontsize=_FONT)
    target_handles = [Line2D([], [], ls="", marker=markers[t], color="0.3", mec="white",
                             mew=0.5, ms=6, label=t) for t in targets]
    direction_handles = ([Patch(facecolor=colours[d], edgecolor="none", label=d)
                          for d in directions]
                         + [Line2D([], [], color=_CLEAN_COLOUR, ls="--", lw=0.9, alpha=0.7,
                                   label="clean run"),
                            Line2D([], [], color="0.45", ls="-", lw=0.9, marker="|", ms=6,
                                   label="±1 bootstrap std")])
    for ax, handles, title, ncols in (
            (legend_axes[0], target_handles, "exposed agent(s) = marker", 2),
            (legend_axes[1], direction_handles, "covert direction = colour", 1)):
        ax.axis("off")
        if handles:
            ax.legend(handles=handles, loc="upper center", title=title, ncols=ncols,
                      fontsize=_FONT, title_fontsize=_FONT, frameon=False,
                      borderaxespad=0.0, columnspacing=1.5, handlelength=1.6)
    return fig


def plot_fbs_scatter(metrics: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """AUC vs FBS and accuracy vs FBS, one figure per (dataset, pipeline); see
    :func:`fbs_scatter_figure` for how to read it.

    ``metrics`` is :func:`~biaslab.evaluators.amplification.condition_metrics` output (pooled
    over seeds here) or already aggregated.

    Returns:
        Paths of the written ``figures/fbs_scatter_<dataset>_<pipeline>.png`` (200 dpi) and
        ``.svg``.
    """
    from biaslab.experiments.reports.figure_files import figures_wanted, save_figure

    if not figures_wanted():  # --no-figures: nothing drawn
        return []
    agg = aggregate_over_seeds(metrics) if "seed" in metrics.columns else metrics
    figures = Path(out_dir) / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    markers = target_markers(agg["target"])
    written: list[Path] = []
    for (dataset, pipeline), df in agg.groupby(["dataset", "pipeline"], sort=True):
        fig = fbs_scatter_figure(df, markers=markers)
        fig.suptitle(f"{dataset} / {pipeline}: performance vs favor bias strength",
                     fontsize=_FONT + 1.5)
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", f"fbs_scatter_{dataset}_{pipeline}")
        written += save_figure(fig, [(figures / f"{stem}.png", {"dpi": 200}),
                                     (figures / f"{stem}.svg", {"dpi": "figure"})])
    return written


# -- from a run store ------------------------------------------------------------------------
def predictions_frame(store, options) -> pd.DataFrame:
    """One row per (finished cell, test record), joined with the cell's grid coordinates and
    the record's true label and sex from the dataset (labels never enter the graph)."""
    rows = []
    for c, value in store.finished_outputs("finalize"):
        split = cached_split(c["item"], int(c["seed"]), options.max_test, options.data_dir)
        for p in value["predictions"]:
            rid = p["record_id"]
            rows.append({"dataset": c["item"], "pipeline": c["variant"], "target": c["target"],
                         "direction": c["direction"], "model": c["model"],
                         "seed": int(c["seed"]), "record_id": rid,
                         "sex": int(split.test.at[rid, "sex_code"]),
                         "y_true": int(split.test.at[rid, "fail"]),
                         "p_llm": p["p_llm"], "p_ml": p["p_ml"], "p_final": p["p_final"],
                         "decided_by": p["decided_by"], "disagree": bool(p["disagree"])})
    frame = pd.DataFrame(rows)
    for col in ("p_llm", "p_ml", "p_final"):
        if col in frame:
            frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame


def ml_anchor(store, options) -> pd.DataFrame:
    """The ML predictor's test accuracy and AUC per dataset and seed of the run (the sanity
    anchor), whichever pipelines ran: it is fit on the training split only. From its test
    probabilities, which the run kept on disk: a report neither fits nor runs the model."""
    cells = store.cells()
    rows = []
    for dataset, seed in sorted({(c["item"], int(c["seed"])) for _, c in cells.iterrows()}):
        key = (dataset, seed, options.max_test, options.data_dir)
        anchor = anchor_scores(cached_split(*key).y_test, cached_test_probabilities(*key))
        rows.append({"dataset": dataset, "seed": seed, **anchor})
    return pd.DataFrame(rows, columns=["dataset", "seed", "accuracy", "auc"])


def headline(run_dir: str | Path) -> pd.DataFrame | None:
    """Table 1 of a reported run, as written to ``tables/table1.csv`` (cells as printed:
    ``"+0.088 ± .031"``); None before the report has been written."""
    path = Path(run_dir) / "tables" / "table1.csv"
    if not path.is_file():
        return None
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    frame.attrs["title"] = "Table 1: FBS, seed mean ± bootstrap std (> 0 = toward favored group)"
    return frame


def write_report(store, run_dir: str | Path, options) -> list[Path]:
    """Every table and figure of an amplification run, from its store alone."""
    from biaslab.datasets import load_student
    from biaslab.evaluators.amplification import (AGGREGATE_KEYS, arbitration_fbs_drop,
                                                  condition_metrics,
                                                  direction_asymmetry, pooled_fbs,
                                                  superadditivity, superadditivity_over_seeds)

    run_dir = Path(run_dir)
    predictions = predictions_frame(store, options)
    if predictions.empty:
        return []
    tables = run_dir / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    predictions.to_csv(tables / "predictions.csv", index=False)
    metrics = condition_metrics(predictions, n_resamples=options.n_resamples)
    aggregated = aggregate_over_seeds(metrics)
    pooled = pooled_fbs(predictions, n_resamples=options.n_resamples)
    aggregated = aggregated.merge(pooled, on=AGGREGATE_KEYS, how="left")
    superadd = superadditivity(predictions, n_resamples=options.n_resamples)
    superadd_pooled = superadditivity_over_seeds(predictions, n_resamples=options.n_resamples)
    written = list(write_tables(metrics, aggregated, superadd, run_dir,
                                superadd_over_seeds=superadd_pooled).values())
    base = {}
    for dataset in predictions["dataset"].unique():
        frame = load_student(dataset, None if not options.data_dir
                             else Path(options.data_dir) / f"student-{'mat' if dataset == 'math' else 'por'}.csv")
        pass_rate = 1 - frame.groupby("sex")["fail"].mean()
        base[dataset] = {"F": float(pass_rate["F"]), "M": float(pass_rate["M"])}
    asym = direction_asymmetry(aggregated, base)
    asym.to_csv(tables / "direction_asymmetry.csv", index=False)
    anchor = ml_anchor(store, options)
    anchor.to_csv(tables / "ml_anchor.csv", index=False)
    written += [tables / "predictions.csv", tables / "direction_asymmetry.csv",
                tables / "ml_anchor.csv"]
    drop = arbitration_fbs_drop(predictions, n_resamples=options.n_resamples)
    if not drop.empty:  # (a run without both E1 and E2 has nothing to compare)
        drop.to_csv(tables / "ml_arbitration_fbs.csv", index=False)
        written.append(tables / "ml_arbitration_fbs.csv")
    written += plot_fbs_scatter(aggregated if "fbs_boot_std" in aggregated else metrics, run_dir)
    return written
