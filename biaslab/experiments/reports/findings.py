"""The report's first screen: each exposure's and mitigation's effect on the unit's measures.

A reader opens a report to learn whether an exposure moved anything, so that is what comes
first, for a composed protocol or an app as for a built-in one: the pooled rows (group
``all``) of ``exposed_vs_clean.csv`` and ``mitigation_effects.csv``, each with its difference,
interval, number of pairs and pairing rule, and one forest plot per measure
(``figures/effects_<measure>.png``). Run metadata and diagnostics follow it in the report.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from biaslab.experiments.reports.figure_files import figures_wanted

__all__ = ["finding_rows", "plot_findings", "write_findings_figures", "FINDINGS_PREFIX",
           "MAX_FINDING_FIGURES"]

FINDINGS_PREFIX = "effects_"
"""Figures of the findings are ``figures/effects_<measure>.png``."""
MAX_FINDING_FIGURES = 8
"""At most this many measures get a forest plot (those with the largest effect first); the
tables hold every one."""
_MAX_ROWS = 30
_MEASURE = ["node", "field", "stratum"]


def _read(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path, keep_default_na=False, na_values=[""])
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame()


def finding_rows(run_dir: str | Path) -> pd.DataFrame:
    """The pooled effect rows of a run directory's tables, exposures then mitigations.

    Returns:
        Columns ``kind`` (exposure / mitigation), ``arm`` (the condition, or ``mitigation on
        exposure``), ``variant``, ``model``, ``node``, ``field``, ``stratum``, ``diff``,
        ``ci_low``, ``ci_high``, ``n_pairs``, ``n_seeds``, ``pairing`` and ``note``; empty
        when the run has no exposed or mitigation arm.
    """
    tables = Path(run_dir) / "tables"
    parts = []
    exposed = _read(tables / "exposed_vs_clean.csv")
    if not exposed.empty:
        parts.append(exposed.assign(kind="exposure", arm=exposed["condition"]))
    mitigated = _read(tables / "mitigation_effects.csv")
    if not mitigated.empty:
        arm = mitigated["mitigation"].astype(str) + " on " + mitigated["exposure"].astype(str)
        parts.append(mitigated.assign(kind="mitigation", arm=arm))
    columns = ["kind", "arm", "variant", "model", *_MEASURE, "diff", "ci_low", "ci_high",
               "n_pairs", "n_seeds", "pairing", "note"]
    if not parts:
        return pd.DataFrame(columns=columns)
    rows = pd.concat(parts, ignore_index=True)
    rows = rows[rows["group"].astype(str) == "all"]
    for column in columns:
        if column not in rows:
            rows[column] = "" if column in ("pairing", "note", "stratum") else np.nan
    for column in ("stratum", "note", "pairing"):
        rows[column] = rows[column].astype(object).where(rows[column].notna(), "")
    return rows[columns].reset_index(drop=True)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "measure"


def _measure_name(key: tuple) -> str:
    node, field, stratum = (str(k) for k in key)
    return " · ".join(p for p in (node, field, stratum) if p and p != "nan")


def _row_label(row, several: dict[str, bool]) -> str:
    parts = [str(getattr(row, c)) for c in ("variant", "model") if several[c]]
    return " · ".join([*parts, str(row.arm)])


def plot_findings(rows: pd.DataFrame, figures: Path) -> list[Path]:
    """One forest plot per measure: each arm's difference as a dot and its 95% CI as a bar,
    0 (no effect) as a dashed line; a hollow dot has no interval (too few pairs)."""
    if rows.empty or not figures_wanted():  # --no-figures: nothing drawn
        return []
    several = {c: rows[c].nunique() > 1 for c in ("variant", "model")}
    grouped = list(rows.groupby(_MEASURE, sort=True, dropna=False))
    grouped.sort(key=lambda kv: (-float(np.nanmax(np.abs(kv[1]["diff"].to_numpy(float)))
                                        if kv[1]["diff"].notna().any() else 0.0),
                                 _measure_name(kv[0])))
    figures.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for key, part in grouped[:MAX_FINDING_FIGURES]:
        part = part.head(_MAX_ROWS).iloc[::-1]
        fig = Figure(figsize=(7.0, 1.3 + 0.32 * len(part)))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        y = np.arange(len(part))
        diff = part["diff"].to_numpy(float)
        has_ci = part["ci_low"].notna().to_numpy()
        ax.hlines(y[has_ci], part["ci_low"][has_ci], part["ci_high"][has_ci], color="0.35",
                  linewidth=1.4)
        colors = np.where(part["kind"].to_numpy() == "mitigation", "C2", "C0")
        if has_ci.any():
            ax.scatter(diff[has_ci], y[has_ci], c=list(colors[has_ci]), zorder=3,
                       label="with 95% CI")
        if (~has_ci).any():
            ax.scatter(diff[~has_ci], y[~has_ci], facecolor="white",
                       edgecolor=list(colors[~has_ci]), zorder=3, label="no CI (too few pairs)")
        ax.axvline(0.0, color="0.6", linestyle="--", linewidth=1)
        labels = [f"{_row_label(r, several)}  (n={int(r.n_pairs)})" for r in part.itertuples()]
        ax.set_yticks(list(y), labels, fontsize=7)
        pairing = ", ".join(sorted({str(p) for p in part["pairing"] if str(p)})) or "unit"
        ax.set_xlabel(f"difference from the reference arm (pairs: {pairing})", fontsize=8)
        ax.set_title(f"Effect on {_measure_name(key)}", fontsize=9)
        ax.legend(fontsize=7, loc="best")
        name = _slug(_measure_name(key))
        while figures / f"{FINDINGS_PREFIX}{name}.png" in paths:  # two measures, one slug
            name += "-2"
        path = figures / f"{FINDINGS_PREFIX}{name}.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        paths.append(path)
    return paths


def write_findings_figures(run_dir: str | Path) -> list[Path]:
    """Draw the findings' forest plots from the tables already written under ``tables/``;
    old ones are removed first, so a figure never outlives its measure. With figures off
    (``--no-figures``) nothing is drawn or removed, and ``report.html`` shows no figure."""
    if not figures_wanted():
        return []
    figures = Path(run_dir) / "figures"
    for old in figures.glob(f"{FINDINGS_PREFIX}*.png"):
        old.unlink()
    return plot_findings(finding_rows(run_dir), figures)
