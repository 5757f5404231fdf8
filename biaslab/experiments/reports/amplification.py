"""Tables and figures of the "amplification" protocol.

* :func:`table1` -- FBS per pipeline x exposed agents x direction (rows) and model (columns), in
  the layout of the paper's Table 1; cells read ``"+0.088 ± .031"`` = seed-mean FBS ± mean
  bootstrap std.
* :func:`write_tables` -- CSV / Markdown files under ``<out_dir>/tables``.
* :func:`plot_fbs_scatter` -- AUC and accuracy vs FBS, one figure per dataset and pipeline, under
  ``<out_dir>/figures``.

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

from biaslab.evaluators.amplification import CLEAN, aggregate_over_seeds

__all__ = [
    "format_fbs",
    "table1",
    "to_markdown",
    "write_tables",
    "plot_fbs_scatter",
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


def _md_cell(x: Any) -> str:
    if isinstance(x, float):
        s = "" if math.isnan(x) else f"{x:.4g}"
    else:
        s = str(x)
    return s.replace("|", "\\|").replace("\n", " ")


def to_markdown(df: pd.DataFrame, *, index: bool = True) -> str:
    """GitHub-flavoured Markdown table (no ``tabulate`` dependency).

    With ``index=True`` the (Multi)index levels become the leading columns.
    """
    frame = df.reset_index() if index else df
    if isinstance(frame.columns, pd.MultiIndex):
        frame.columns = [" / ".join(str(c) for c in col if str(c)) for col in frame.columns]
    header = [_md_cell(c) for c in frame.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for rec in frame.itertuples(index=False, name=None):
        lines.append("| " + " | ".join(_md_cell(v) for v in rec) + " |")
    return "\n".join(lines) + "\n"


def write_tables(metrics: pd.DataFrame, aggregated: pd.DataFrame, superadd: pd.DataFrame,
                 out_dir: str | Path) -> dict[str, Path]:
    """Write the protocol's tables under ``<out_dir>/tables``.

    Files: ``table1.csv``/``.md`` (:func:`table1`), ``condition_metrics.csv`` (per seed),
    ``aggregated.csv`` (over seeds), ``superadditivity.csv``/``.md``, ``routing.csv`` (E2 rows of
    ``metrics``: counts, disagreement rates and judge shares, overall and per sex).

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
    keys = [c for c in ["dataset", "pipeline", "target", "direction", "model", "seed"]
            if c in metrics.columns]
    routing = metrics.loc[metrics["pipeline"] == "E2",
                          keys + [c for c in _ROUTING if c in metrics.columns]]
    put("routing.csv", routing.to_csv(index=False))
    return written


def _style_maps(values: Sequence[Any], palette: Sequence[Any]) -> dict[Any, Any]:
    return {v: palette[i % len(palette)] for i, v in enumerate(values)}


def plot_fbs_scatter(metrics: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """AUC vs FBS and accuracy vs FBS, one figure per (dataset, pipeline).

    ``metrics`` is :func:`~biaslab.evaluators.amplification.condition_metrics` output (pooled
    over seeds here) or already aggregated. x = seed-mean FBS with ±1 bootstrap-std horizontal
    error bars; colour = model, marker = exposure target, filled = ``pro_female``, hollow =
    ``pro_male``; clean baselines are faint points at FBS = 0. Points right of 0 moved
    predictions toward the favored group; a point lower than its model's clean point lost
    performance.

    Returns:
        Paths of the written ``figures/fbs_scatter_<dataset>_<pipeline>.png`` and ``.svg``.
    """
    agg = aggregate_over_seeds(metrics) if "seed" in metrics.columns else metrics
    figures = Path(out_dir) / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    models = sorted(agg["model"].astype(str).unique())
    colours = _style_maps(models, [f"C{i}" for i in range(10)])
    targets = sorted((t for t in agg["target"].unique() if t != CLEAN), key=_target_sort_key)
    markers = _style_maps(targets, _MARKERS)
    written: list[Path] = []

    for (dataset, pipeline), df in agg.groupby(["dataset", "pipeline"], sort=True):
        fig = Figure(figsize=(11, 4.5), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, 2, sharex=True)
        for ax, metric, label in zip(axes, ["auc", "accuracy"], ["AUC", "Accuracy"]):
            ax.axvline(0.0, color="0.7", lw=0.8, zorder=0)
            for rec in df.itertuples(index=False):
                y = getattr(rec, metric)
                colour = colours[str(rec.model)]
                if _is_nan(y):
                    continue
                if rec.target == CLEAN:
                    ax.scatter([0.0], [y], color=colour, alpha=0.3, s=60, marker="o",
                               edgecolors="none", zorder=1)
                    continue
                x = rec.fbs
                if _is_nan(x):
                    continue
                xerr = getattr(rec, "fbs_boot_std", np.nan)
                filled = rec.direction != "pro_male"
                ax.errorbar([x], [y], xerr=None if _is_nan(xerr) else [[xerr], [xerr]],
                            fmt=markers[rec.target], color=colour, ecolor=colour,
                            elinewidth=0.8, capsize=2, ms=7,
                            mfc=colour if filled else "none", mec=colour, zorder=2)
            ax.set_xlabel("FBS (favor bias strength; > 0 = toward favored group)")
            ax.set_ylabel(label)
            ax.set_title(f"{label} vs FBS")
            ax.grid(alpha=0.3)
        handles = (
            [Line2D([], [], ls="", marker="o", color=colours[m], label=m) for m in models]
            + [Line2D([], [], ls="", marker=markers[t], color="0.3", label=t) for t in targets]
            + [Line2D([], [], ls="", marker="o", color="0.3", label="pro_female"),
               Line2D([], [], ls="", marker="o", color="0.3", mfc="none", label="pro_male"),
               Line2D([], [], ls="", marker="o", color="0.3", alpha=0.3, label="clean")]
        )
        fig.legend(handles=handles, loc="outside right center", fontsize="small", frameon=False)
        fig.suptitle(f"{dataset} / {pipeline}: performance vs favor bias strength")
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", f"fbs_scatter_{dataset}_{pipeline}")
        for ext in ("png", "svg"):
            path = figures / f"{stem}.{ext}"
            fig.savefig(path, dpi=150 if ext == "png" else "figure")
            written.append(path)
    return written


# -- from a run store ------------------------------------------------------------------------
def predictions_frame(store, options) -> pd.DataFrame:
    """One row per (finished cell, test record), joined with the cell's grid coordinates and
    the record's true label and sex from the dataset (labels never enter the graph)."""
    from biaslab.graphs.amplification import _split

    cells = store.cells()
    if cells.empty:
        return pd.DataFrame()
    cells = cells[cells["status"] == "done"].set_index("cell_id")
    rows = []
    for cell_id, _, _, value in store.iter_outputs(node="finalize"):
        if cell_id not in cells.index:
            continue
        c = cells.loc[cell_id]
        split = _split(c["item"], int(c["seed"]), options.max_test, options.data_dir)
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
    anchor), whichever pipelines ran: it is fit on the training split only."""
    from biaslab.graphs.amplification import _ml, _split

    cells = store.cells()
    rows = []
    for dataset, seed in sorted({(c["item"], int(c["seed"])) for _, c in cells.iterrows()}):
        key = (dataset, seed, options.max_test, options.data_dir)
        rows.append({"dataset": dataset, "seed": seed, **_ml(*key).evaluate(_split(*key))})
    return pd.DataFrame(rows, columns=["dataset", "seed", "accuracy", "auc"])


def write_report(store, run_dir: str | Path, options) -> list[Path]:
    """Every table and figure of an amplification run, from its store alone."""
    from biaslab.datasets import load_student
    from biaslab.evaluators.amplification import (AGGREGATE_KEYS, condition_metrics,
                                                  direction_asymmetry, pooled_fbs,
                                                  superadditivity)

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
    written = list(write_tables(metrics, aggregated, superadd, run_dir).values())
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
    written += plot_fbs_scatter(aggregated if "fbs_boot_std" in aggregated else metrics, run_dir)
    return written
