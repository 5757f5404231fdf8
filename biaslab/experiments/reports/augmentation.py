"""Tables, figure and export of the ``augmentation`` protocol, from the run store alone.

Under ``tables/`` (clean arm unless said otherwise; every rate with a 95% cluster-bootstrap CI
over source examples, cells read ``"41.2 [35.0, 47.9]"``):

* ``dr_rates.csv``: DR%/AR% per model × condition × category (the long table);
* ``table2.{csv,md}``: per model, DR% and AR% per condition for more-studied vs less-studied
  categories (the layout of the paper's Table 2);
* ``table3.{csv,md}``: per category, DR% per condition, over all target models (Table 3);
* ``validator_pass.{csv,md}``: share of scenarios kept by the unanimous filter, per category;
* ``bbq_mc.{csv,md}``: BBQ accuracy and ambiguous bias score s_AMB per model × condition ×
  category (the multiple-choice view);
* ``exposure_effects.{csv,md}``: DR% of every exposed node × direction minus clean, paired
  over the same source examples;
* ``rephrase.csv``: how many rephrasings passed the check (differs, names no answer).

Under ``figures/``: ``dr_by_condition.{png,svg}``, DR% per category and condition, one panel
per target model (like the paper's Figure 3). The augmented set goes to ``augmented.jsonl`` in
the run directory: one line per generated scenario with its provenance and ``passed``.

Categories regenerated from templates are marked "regenerated from templates" in every table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from biaslab.datasets.bbq import LESS_STUDIED, MORE_STUDIED, REGENERATED_LABEL, study_group
from biaslab.evaluators.augmentation import (CONDITION_ORDER, bbq_metrics, decisive_rates,
                                             exposure_effects, pass_rates)
from biaslab.experiments.reports.markdown import to_markdown
from biaslab.prompts.exposure import condition_id

__all__ = ["rows_frame", "scenarios_frame", "summary_frame", "write_report", "export_augmented",
           "table2", "table3", "dr_figure"]

_CATEGORY_ORDER = [*MORE_STUDIED, *LESS_STUDIED]
# Okabe-Ito, colour-blind safe: one colour per condition.
_COLOURS = {"OCOQ": "#0072B2", "OCAQ": "#56B4E9", "ASOQ": "#D55E00", "ASAQ": "#E69F00"}
_HATCH = {"OCOQ": "", "OCAQ": "//", "ASOQ": "", "ASAQ": "//"}


def _finalized(store):
    """(coordinates, value) of each finished cell's ``finalize`` output. The arm is called
    ``exposure`` here, since ``condition`` names OCOQ/OCAQ/ASOQ/ASAQ in this protocol."""
    for coords, value in store.finished_outputs("finalize"):
        yield {"model": coords["model"], "seed": coords["seed"],
               "exposure": condition_id(coords["target"], coords["direction"]),
               "target": coords["target"], "direction": coords["direction"]}, value


def rows_frame(store, finalized: list | None = None) -> pd.DataFrame:
    """One row per target response: coords, source fields, condition, dr, mc_choice.
    `finalized`: `_finalized(store)` already read (the report decodes it once)."""
    finalized = list(_finalized(store)) if finalized is None else finalized
    rows = [{**coords, **row} for coords, value in finalized for row in value["rows"]]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    for col in ("dr", "mc_choice", "biased", "stereotyped", "label"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame


def scenarios_frame(store, finalized: list | None = None) -> pd.DataFrame:
    """One row per generated scenario, with its validator votes and ``passed``."""
    rows = []
    for coords, value in list(_finalized(store)) if finalized is None else finalized:
        for aug in value["augmented"]:
            rows.append({**coords, "item": aug["source_id"], "category": aug["category"],
                         "data_origin": aug["data_origin"], "variant": aug["variant"],
                         "has_scenario": aug["scenario"] is not None, "passed": aug["passed"],
                         **{k: v for k, v in aug["validator_votes"].items()}})
    return pd.DataFrame(rows)


def summary_frame(store, finalized: list | None = None) -> pd.DataFrame:
    finalized = list(_finalized(store)) if finalized is None else finalized
    return pd.DataFrame([{**coords, **value["summary"]} for coords, value in finalized])


def _label(category: str, origins: set[str]) -> str:
    return f"{category} ({REGENERATED_LABEL})" if REGENERATED_LABEL in origins else category


def _ci(value: float, low: float, high: float, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def table2(rows: pd.DataFrame, n_resamples: int) -> pd.DataFrame:
    """Per model × study group (+ all): DR% and AR% per condition, ``rate [CI]``."""
    data = rows.assign(group=rows["category"].map(study_group))
    both = pd.concat([data, data.assign(group="all")])
    rates = decisive_rates(both, ["model", "group", "condition"], n_resamples=n_resamples)
    out = []
    for (model, group), part in rates.groupby(["model", "group"], sort=True):
        row: dict[str, Any] = {"model": model, "group": group}
        for cond in CONDITION_ORDER:
            hit = part[part["condition"] == cond]
            if hit.empty:
                row[f"{cond} DR%"] = row[f"{cond} AR%"] = "–"
                continue
            r = hit.iloc[0]
            row[f"{cond} DR%"] = _ci(r["DR%"], r["DR_low"], r["DR_high"])
            row[f"{cond} AR%"] = _ci(r["AR%"], r["AR_low"], r["AR_high"])
        row["n sources"] = int(part["n_sources"].max())
        out.append(row)
    frame = pd.DataFrame(out)
    order = {"more-studied": 0, "less-studied": 1, "all": 2}
    return frame.sort_values(["model", "group"], key=lambda s: s.map(order) if s.name ==
                             "group" else s).reset_index(drop=True)


def table3(rows: pd.DataFrame, n_resamples: int) -> pd.DataFrame:
    """Per category (all target models pooled): DR% per condition, ``rate [CI]``."""
    rates = decisive_rates(rows, ["category", "condition"], n_resamples=n_resamples)
    origins = rows.groupby("category")["data_origin"].agg(set).to_dict()
    out = []
    for category in [c for c in _CATEGORY_ORDER if c in set(rates["category"])]:
        part = rates[rates["category"] == category]
        row: dict[str, Any] = {"category": _label(category, origins.get(category, set())),
                               "group": study_group(category)}
        for cond in CONDITION_ORDER:
            hit = part[part["condition"] == cond]
            row[f"{cond} DR%"] = ("–" if hit.empty else
                                  _ci(hit.iloc[0]["DR%"], hit.iloc[0]["DR_low"],
                                      hit.iloc[0]["DR_high"]))
        row["n sources"] = int(part["n_sources"].max())
        out.append(row)
    return pd.DataFrame(out)


def dr_figure(rates: pd.DataFrame, origins: dict[str, set]) -> Figure:
    """Grouped bars: DR% per category (more-studied first), one bar per condition, 95% CIs."""
    models = sorted(rates["model"].unique())
    categories = [c for c in _CATEGORY_ORDER if c in set(rates["category"])]
    fig = Figure(figsize=(max(6.0, 1.1 * len(categories) + 2), 2.9 * len(models) + 0.6),
                 constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(models), 1, squeeze=False)[:, 0]
    width = 0.8 / len(CONDITION_ORDER)
    for ax, model in zip(axes, models):
        part = rates[rates["model"] == model]
        for j, cond in enumerate(CONDITION_ORDER):
            sub = part[part["condition"] == cond].set_index("category")
            xs, ys, lo, hi = [], [], [], []
            for i, cat in enumerate(categories):
                if cat in sub.index:
                    r = sub.loc[cat]
                    xs.append(i + (j - 1.5) * width)
                    ys.append(r["DR%"])
                    lo.append(r["DR%"] - r["DR_low"])
                    hi.append(r["DR_high"] - r["DR%"])
            ax.bar(xs, ys, width, color=_COLOURS[cond], hatch=_HATCH[cond], edgecolor="white",
                   label=cond, yerr=[lo, hi], capsize=2, error_kw={"lw": 0.8, "ecolor": "0.2"})
        ax.set_xticks(range(len(categories)))
        ax.set_xticklabels([c + ("*" if REGENERATED_LABEL in origins.get(c, set()) else "")
                            for c in categories], fontsize=9)
        n_more = sum(c in MORE_STUDIED for c in categories)
        if 0 < n_more < len(categories):
            ax.axvline(n_more - 0.5, color="0.6", lw=0.8, ls=":")
        ax.set_ylim(0, 100)
        ax.set_ylabel("decisive responses (DR%)", fontsize=9)
        ax.set_title(model, fontsize=10)
        ax.grid(axis="y", color="0.9", lw=0.6)
        ax.set_axisbelow(True)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, ncol=4, fontsize=8, frameon=False, loc="outside upper center")
    fig.supxlabel("error bars: 95% bootstrap CI over source examples\n"
                  "left of the dotted line more-studied, right less-studied; "
                  "* regenerated from templates", fontsize=7, color="0.35")
    return fig


def export_augmented(store, path: Path, finalized: list | None = None) -> Path:
    """Every generated scenario with its provenance, one JSON object per line."""
    with open(path, "w", encoding="utf-8") as fh:
        for coords, value in list(_finalized(store)) if finalized is None else finalized:
            for aug in value["augmented"]:
                fh.write(json.dumps({**aug, "model_axis": coords["model"]},
                                    ensure_ascii=False) + "\n")
    return path


def write_report(store, run_dir: str | Path, options) -> list[Path]:
    run_dir = Path(run_dir)
    tables, figures = run_dir / "tables", run_dir / "figures"
    tables.mkdir(parents=True, exist_ok=True)
    figures.mkdir(parents=True, exist_ok=True)
    finalized = list(_finalized(store))  # each output carries every scenario: decode it once
    written = [export_augmented(store, run_dir / "augmented.jsonl", finalized)]
    rows = rows_frame(store, finalized)
    if rows.empty:
        return written
    n = options.n_resamples
    regenerated = sorted(set(rows.loc[rows["data_origin"] == REGENERATED_LABEL, "category"]))
    note = (f"Categories {', '.join(regenerated)}: {REGENERATED_LABEL} (not the official BBQ "
            "files). " if regenerated else "")
    note += "Cells: rate [95% bootstrap CI over source examples], percent of scored responses."

    def put(name: str, frame: pd.DataFrame, md: bool = True) -> None:
        frame.to_csv(tables / f"{name}.csv", index=False)
        written.append(tables / f"{name}.csv")
        if md:
            (tables / f"{name}.md").write_text(
                to_markdown(frame, index=False, digits=None) + (f"\n{note}\n" if note else ""),
                encoding="utf-8")
            written.append(tables / f"{name}.md")

    clean = rows[rows["exposure"] == "none"]
    if not clean.empty:
        long = decisive_rates(clean, ["model", "condition", "category"], n_resamples=n)
        long["data_origin"] = long["category"].map(
            clean.groupby("category")["data_origin"].first())
        put("dr_rates", long.round(2), md=False)
        put("table2", table2(clean, n))
        put("table3", table3(clean, n))
        if clean["mc_choice"].notna().any():
            mc = bbq_metrics(clean.assign(category="all"), ["model", "condition", "category"],
                             n_resamples=n)
            mc = pd.concat([mc, bbq_metrics(clean, ["model", "condition", "category"],
                                            n_resamples=n)])
            mc["data_origin"] = mc["category"].map(
                clean.groupby("category")["data_origin"].first()).fillna("mixed")
            put("bbq_mc", mc.round(4))
        origins = clean.groupby("category")["data_origin"].agg(set).to_dict()
        long_fig = long.dropna(subset=["DR%"])
        if not long_fig.empty:
            fig = dr_figure(long_fig, origins)
            for ext in ("png", "svg"):
                fig.savefig(figures / f"dr_by_condition.{ext}", dpi=200)
                written.append(figures / f"dr_by_condition.{ext}")
    scenarios = scenarios_frame(store, finalized)
    if not scenarios.empty:
        sc = scenarios[scenarios["exposure"] == "none"]
        if not sc.empty:
            table = pd.concat([pass_rates(sc, ["category"], n_resamples=n),
                               pass_rates(sc.assign(category="all"), ["category"],
                                          n_resamples=n)])
            table["pass% [CI]"] = [_ci(r["pass%"], r["pass_low"], r["pass_high"])
                                   for _, r in table.iterrows()]
            put("validator_pass", table.round(2))
    summary = summary_frame(store, finalized)
    if not summary.empty:
        reph = summary.groupby(["exposure", "model"]).agg(
            n_sources=("item", "size"), rephrase_ok=("rephrase_ok", "sum"),
            abstraction_ok=("abstraction_ok", "sum"), scenarios=("n_scenarios", "sum"),
            passed=("n_passed", "sum")).reset_index()
        put("rephrase", reph, md=False)
    effects = exposure_effects(rows, n_resamples=n)
    if not effects.empty:
        effects = effects.rename(columns={"diff": "diff (pp)"})
        put("exposure_effects", effects.round(2))
    return written
