"""Tables, figure and export of the ``augmentation`` protocol, from the run store alone.

Under ``tables/`` (clean arm unless said otherwise; every rate with a 95% cluster-bootstrap CI
over source examples, cells read ``"41.2 [35.0, 47.9]"``):

* ``dr_rates.csv``: DR%/AR% per model × condition × category (the long table);
* ``table2.{csv,md}``: per model, DR% and AR% per condition for more-studied vs less-studied
  categories, as the paper computes them (the plain mean over categories; the pooled rate
  beside it), with the sources each condition covers (the paper's Table 2);
* ``table3.{csv,md}``: per category, DR% per condition, the mean over target models (Table 3);
  ``category_rates.csv`` holds the same numbers in long form (the first panel of
  ``dr_by_condition``);
* ``figure3.{csv,md}``: the paper's Figure 3, DR% per study group × condition, the mean over
  target models and categories (`figure3`; drawn in ``figures/figure3.{png,svg}``);
* ``validator_pass.{csv,md}``: share of the scenarios that reached the validators (through
  the rule checks) kept by the unanimous filter, per category;
* ``generation_steps.{csv,md}``: per step of the chain (abstraction, transform, scenario,
  validators, overall, rephrase) how many inputs passed, with Wilson 95% intervals;
* ``rule_rejections.csv``: what the rule checks rejected, per step and check;
* ``stereotype_decisions.csv``: per category and rule (BBQ's own description, BBQ's
  metadata, the generator's flag), how many new people it decided, and how often it
  overruled the generator's claim (`stereotype_decisions`);
* ``validator_agreement.{csv,md}``: Fleiss' kappa and Gwet's AC1 of the three validators;
* ``condition_contrasts.{csv,md}``: DR% differences between conditions (ASOQ−OCOQ, ...) on
  the *same* source examples, with paired bootstrap CIs and the sources each pair covers;
* ``bbq_mc.{csv,md}``: BBQ accuracy and ambiguous bias score s_AMB per model × condition ×
  category (the multiple-choice view);
* ``exposure_effects.{csv,md}``: DR% of every exposed node × direction minus clean, paired
  over the same source examples;
* ``pass_rate_effects.{csv,md}``: the same for the generation chain's pass rates (kept,
  validator pass, rephrase);
* ``human_agreement.{csv,md}``: the validators against people's labels of a sample of
  scenarios (``human_labels``), when given;
* ``rephrase.csv``: how many rephrasings passed the check (differs, names no answer).

Under ``figures/``: ``dr_by_condition.{png,svg}``, DR% per category and condition, the
aggregate over targets first, then one panel per target model (the paper's Figure 3).
A counterfactual replay adds ``compare_rates.csv`` and ``compare_pass.csv``
(`compare_augmentation`). The augmented set goes to ``augmented.jsonl`` in
the run directory: one line per generated scenario with its provenance and ``passed``.
`export_bbq` (``biaslab export RUN --format bbq``) writes the validated scenarios once each,
in BBQ's own schema.

Categories regenerated from templates are marked "regenerated from templates" in every table.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from biaslab.datasets import bbq
from biaslab.datasets.bbq import LESS_STUDIED, MORE_STUDIED, REGENERATED_LABEL, study_group
from biaslab.evaluators.augmentation import (CONDITION_ORDER, bbq_metrics, condition_contrasts,
                                             decisive_rates, exposure_effects,
                                             human_agreement, read_human_labels,
                                             mean_decisive_rates, pass_rate_effects,
                                             pass_rates, source_dr,
                                             rule_rejections, step_pass_rates,
                                             stereotype_decisions,
                                             validator_agreement)
from biaslab.evaluators.exposure_effects import paired_condition_effects
from biaslab.graphs.augmentation import VALIDATOR_LABELS, VALIDATORS, record_for
from biaslab.experiments.reports.markdown import to_markdown
from biaslab.prompts.exposure import condition_id

__all__ = ["rows_frame", "scenarios_frame", "summary_frame", "write_report", "export_augmented",
           "export_bbq", "bbq_people", "unique_generations", "table2", "table3", "category_rates",
           "dr_figure", "AGGREGATE_PANEL", "figure3", "figure3_plot", "STUDY_GROUPS", "generation_frame", "compare_augmentation",
           "SHARED_GENERATION"]

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
                         "stopped_at": aug.get("stopped_at"),
                         "failed_checks": tuple(aug.get("failed_checks", ())),
                         "relation": aug.get("relation"), "scenario": aug["scenario"],
                         "group_mapping": aug.get("group_mapping"),
                         "variant_context": aug["variant_context"],
                         **{k: v for k, v in aug["validator_votes"].items()}})
    return pd.DataFrame(rows)


def unique_generations(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The clean arm's rows with each generation once: when the generators are bound to
    fixed models every target model answers the same scenarios, and counting them once per
    target would multiply the denominators of pass rates."""
    clean = frame[frame["exposure"] == "none"]
    return clean.drop_duplicates(subset=[k for k in keys if k in clean.columns])


def summary_frame(store, finalized: list | None = None) -> pd.DataFrame:
    finalized = list(_finalized(store)) if finalized is None else finalized
    return pd.DataFrame([{**coords, **value["summary"]} for coords, value in finalized])


SHARED_GENERATION = "all targets (shared generation)"


def generation_frame(summary: pd.DataFrame, scenarios: pd.DataFrame, *,
                     per_model: bool = False) -> pd.DataFrame:
    """One row per (exposure, generation, item, seed) with the counts `pass_rate_effects`
    reads: ``requested``, ``reached`` (scenarios put to the validators), ``kept``,
    ``rephrase_ok``.

    ``generation`` names the models of the generation and validation nodes; target models
    that share them (the generators are bound in ``[nodes.*]``) share one generation, which
    is counted once, not once per target; `per_model` keeps one row per target model (and
    its ``model`` column) instead."""
    columns = ["exposure", *(["model"] if per_model else []), "generation", "item", "seed",
               "category", "requested", "reached", "kept", "rephrase_ok"]
    if summary.empty:
        return pd.DataFrame(columns=columns)
    frame = summary.copy()
    models = frame["generators"] if "generators" in frame else pd.Series(None, frame.index)
    frame["generation"] = [", ".join(sorted(set(m.values()))) if isinstance(m, dict) else own
                           for m, own in zip(models, frame["model"])]
    keys = ["exposure", "model", "seed", "item"]
    if scenarios.empty:
        frame["reached"] = 0
    else:
        put_to_validators = scenarios["stopped_at"].isna() | (scenarios["stopped_at"]
                                                              == "validators")
        reached = scenarios[put_to_validators].groupby(keys).size().rename("reached")
        frame = frame.merge(reached.reset_index(), on=keys, how="left")
        frame["reached"] = frame["reached"].fillna(0).astype(int)
    frame = frame.rename(columns={"n_requested": "requested", "n_passed": "kept"})
    frame["rephrase_ok"] = frame["rephrase_ok"].astype(int)
    if per_model:
        return frame[columns]
    return frame.drop_duplicates(["exposure", "generation", "item", "seed"])[columns]


def _label(category: str, origins: set[str]) -> str:
    return f"{category} ({REGENERATED_LABEL})" if REGENERATED_LABEL in origins else category


def _ci(value: float, low: float, high: float, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _regenerated(rows: pd.DataFrame) -> set[str]:
    """The categories whose records were regenerated from templates (not BBQ's files)."""
    return set(rows.loc[rows["data_origin"] == REGENERATED_LABEL, "category"])


def _origin_column(categories: pd.Series, frame: pd.DataFrame) -> list[str]:
    """Each category's data origin ("official" or "regenerated from templates"); a pooled
    row ("all") reads "mixed" when its categories come from both."""
    origins = frame.groupby("category")["data_origin"].first().to_dict()
    everything = set(origins.values())
    pooled = everything.pop() if len(everything) == 1 else "mixed"
    return [origins.get(c, pooled) for c in categories]


def _cell(rates: pd.DataFrame, keys: dict, column: str = "DR%") -> tuple[str, int]:
    """``rate [CI]`` of the one row of `rates` matching `keys`, and its source count."""
    hit = rates
    for k, v in keys.items():
        hit = hit[hit[k] == v]
    if hit.empty:
        return "–", 0
    r = hit.iloc[0]
    low, high = ("DR_low", "DR_high") if column == "DR%" else ("AR_low", "AR_high")
    return _ci(r[column], r[low], r[high]), int(r["n_sources"])


def table2(rows: pd.DataFrame, n_resamples: int) -> pd.DataFrame:
    """The paper's Table 2: per model × study group (+ all), DR% and AR% per condition.

    ``<COND> DR%`` is the paper's figure, the plain mean over the group's categories of each
    category's DR% (`mean_decisive_rates`); ``<COND> DR% pooled`` pools the group's
    responses instead (a category with more sources or more kept scenarios weighs more).
    ``<COND> n sources`` counts the sources with a scored response in that condition (the
    augmented conditions cover only the sources with a kept scenario); ``regenerated``
    names the group's categories that were regenerated from templates.
    """
    data = rows.assign(group=rows["category"].map(study_group))
    both = pd.concat([data, data.assign(group="all")])
    keys = ["model", "group", "condition"]
    mean = mean_decisive_rates(both, keys, "category", n_resamples=n_resamples)
    pooled = decisive_rates(both, keys, n_resamples=n_resamples)
    regenerated = _regenerated(rows)
    out = []
    for (model, group), part in both.groupby(["model", "group"], sort=True):
        row: dict[str, Any] = {"model": model, "group": group}
        at = {"model": model, "group": group}
        counts = {}
        for cond in CONDITION_ORDER:
            row[f"{cond} DR%"], counts[cond] = _cell(mean, {**at, "condition": cond})
            row[f"{cond} AR%"], _ = _cell(mean, {**at, "condition": cond}, "AR%")
        for cond in CONDITION_ORDER:
            row[f"{cond} DR% pooled"], _ = _cell(pooled, {**at, "condition": cond})
        for cond in CONDITION_ORDER:
            row[f"{cond} n sources"] = counts[cond]
        categories = set(part["category"])
        row["n categories"] = len(categories)
        row["regenerated"] = ", ".join(c for c in _CATEGORY_ORDER
                                       if c in categories & regenerated) or "none"
        out.append(row)
    frame = pd.DataFrame(out)
    order = {"more-studied": 0, "less-studied": 1, "all": 2}
    return frame.sort_values(["model", "group"], key=lambda s: s.map(order) if s.name ==
                             "group" else s).reset_index(drop=True)


def category_rates(rows: pd.DataFrame, n_resamples: int) -> pd.DataFrame:
    """DR% per category × condition over all target models, as Table 3 and the aggregate
    panel of Figure 3 read it: the plain mean over target models of each model's DR%
    (``DR%``, with ``n_over`` models), next to the rate pooled over the models' responses
    (``DR% pooled``). CIs resample source examples (every model answered the same ones)."""
    keys = ["category", "condition"]
    mean = mean_decisive_rates(rows, keys, "model", n_resamples=n_resamples)
    pooled = decisive_rates(rows, keys, n_resamples=n_resamples)
    pooled = pooled[keys + ["DR%", "DR_low", "DR_high"]].rename(
        columns={"DR%": "DR% pooled", "DR_low": "pooled_low", "DR_high": "pooled_high"})
    out = mean.rename(columns={"n_over": "n_models"}).merge(pooled, on=keys, how="left")
    out["data_origin"] = out["category"].map(rows.groupby("category")["data_origin"].first())
    rank = {c: i for i, c in enumerate(_CATEGORY_ORDER)}
    return out.sort_values(["category", "condition"], key=lambda s: s.map(rank) if s.name ==
                           "category" else s.map(CONDITION_ORDER.index)).reset_index(drop=True)


def table3(rates: pd.DataFrame) -> pd.DataFrame:
    """The paper's Table 3 from `category_rates`: per category, DR% per condition (the mean
    over target models; the pooled rate beside it), and the sources each condition covers;
    regenerated categories say so in their name."""
    out = []
    for category in [c for c in _CATEGORY_ORDER if c in set(rates["category"])]:
        part = rates[rates["category"] == category]
        origin = {str(part["data_origin"].iloc[0])}
        row: dict[str, Any] = {"category": _label(category, origin),
                               "group": study_group(category)}
        counts = {}
        for cond in CONDITION_ORDER:
            row[f"{cond} DR%"], counts[cond] = _cell(part, {"condition": cond})
        for cond in CONDITION_ORDER:
            hit = part[part["condition"] == cond]
            row[f"{cond} DR% pooled"] = ("–" if hit.empty else _ci(
                hit.iloc[0]["DR% pooled"], hit.iloc[0]["pooled_low"],
                hit.iloc[0]["pooled_high"]))
        for cond in CONDITION_ORDER:
            row[f"{cond} n sources"] = counts[cond]
        row["n models"] = int(part["n_models"].max())
        out.append(row)
    return pd.DataFrame(out)


STUDY_GROUPS = ("more-studied", "less-studied")


def figure3(rows: pd.DataFrame, n_resamples: int) -> pd.DataFrame:
    """The paper's Figure 3: DR% per study group × condition, averaged over target models
    and categories.

    For one study group g and condition c, every (model m, category k in g) cell has its own
    DR%(m, k, c) = 100 × decisive / scored over its responses; the figure's value is the
    plain mean of those cells (each model and each category weigh alike, however many sources
    or kept scenarios they have). With every cell present this equals the mean over models of
    Table 2's group DR%, and the mean over g's categories of Table 3's DR%. AR% = 100 − DR%.
    CI: percentile bootstrap over source examples (every model answered the same ones, so a
    resample keeps the models paired). ``n_cells`` counts the cells averaged, ``n_models`` and
    ``n_categories`` what they span, ``n_sources`` the sources with a scored response.
    """
    data = rows.assign(group=rows["category"].map(study_group),
                       cell=rows["model"].astype(str) + " | " + rows["category"].astype(str))
    keys = ["group", "condition"]
    mean = mean_decisive_rates(data, keys, "cell", n_resamples=n_resamples)
    spans = data.dropna(subset=["dr"]).groupby(keys).agg(
        n_models=("model", "nunique"), n_categories=("category", "nunique")).reset_index()
    out = mean.rename(columns={"n_over": "n_cells"}).merge(spans, on=keys, how="left")
    out["DR% [CI]"] = [_ci(r["DR%"], r["DR_low"], r["DR_high"]) for _, r in out.iterrows()]
    out["regenerated"] = out["group"].map(lambda g: ", ".join(
        c for c in _CATEGORY_ORDER if study_group(c) == g and c in _regenerated(rows)) or "none")
    order = {g: i for i, g in enumerate(STUDY_GROUPS)}
    out = out.sort_values(keys, key=lambda s: s.map(order) if s.name == "group"
                          else s.map(CONDITION_ORDER.index)).reset_index(drop=True)
    return out[["group", "condition", "DR%", "DR_low", "DR_high", "DR% [CI]", "AR%", "AR_low",
                "AR_high", "n_cells", "n_models", "n_categories", "n_sources", "n",
                "regenerated"]]


def figure3_plot(frame: pd.DataFrame) -> Figure:
    """Bars of `figure3`: one group of four condition bars per study group, 95% CIs."""
    fig = Figure(figsize=(5.5, 3.4), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    groups = [g for g in STUDY_GROUPS if g in set(frame["group"])]
    width = 0.8 / len(CONDITION_ORDER)
    for j, cond in enumerate(CONDITION_ORDER):
        sub = frame[frame["condition"] == cond].set_index("group")
        at = [(i, sub.loc[g]) for i, g in enumerate(groups) if g in sub.index]
        ax.bar([i + (j - 1.5) * width for i, _ in at], [r["DR%"] for _, r in at], width,
               color=_COLOURS[cond], hatch=_HATCH[cond], edgecolor="white", label=cond,
               yerr=[[r["DR%"] - r["DR_low"] for _, r in at],
                     [r["DR_high"] - r["DR%"] for _, r in at]],
               capsize=2, error_kw={"lw": 0.8, "ecolor": "0.2"})
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=9)
    ax.set_ylim(0, 100)
    ax.set_ylabel("decisive responses (DR%)", fontsize=9)
    ax.set_title("mean over target models and categories", fontsize=10)
    ax.grid(axis="y", color="0.9", lw=0.6)
    ax.set_axisbelow(True)
    ax.legend(ncol=4, fontsize=8, frameon=False, loc="upper center")
    fig.supxlabel("error bars: 95% bootstrap CI over source examples", fontsize=7, color="0.35")
    return fig


AGGREGATE_PANEL = "all targets (mean over models)"


def dr_figure(rates: pd.DataFrame, origins: dict[str, set],
              aggregate: pd.DataFrame | None = None) -> Figure:
    """Grouped bars: DR% per category (more-studied first), one bar per condition, 95% CIs.

    One panel per target model (`rates`, the long table); with `aggregate`
    (`category_rates`), a first panel with the paper's Figure 3 aggregate: each category's
    DR% as the mean over target models."""
    panels = ([(AGGREGATE_PANEL, aggregate)] if aggregate is not None else []) + \
        [(m, rates[rates["model"] == m]) for m in sorted(rates["model"].unique())]
    categories = [c for c in _CATEGORY_ORDER if c in set(rates["category"])]
    fig = Figure(figsize=(max(6.0, 1.1 * len(categories) + 2), 2.9 * len(panels) + 0.6),
                 constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    width = 0.8 / len(CONDITION_ORDER)
    for ax, (model, part) in zip(axes, panels):
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


_PATTERN_CHARS = re.compile(r"[()\[\]{}*+?^$|\\]")


def own_label(description: str) -> str:
    """The group label of a person BBQ's metadata does not know: the description itself,
    less the characters a regular expression reads specially (BBQ's script matches a label
    as a pattern: "person (in a wheelchair)" would not match its own text)."""
    label = " ".join(_PATTERN_CHARS.sub(" ", str(description)).split())
    return label or "unnamed"


def bbq_people(source: dict, aug: dict) -> tuple[dict, list[str]]:
    """BBQ's ``answer_info`` and ``stereotyped_groups`` of an exported scenario, written so
    that BBQ's own rule (`bbq.stereotyped_index`, the authors' metadata script: a person's
    group label, and on Nationality its text, matched against ``stereotyped_groups``) finds
    the person the run calls stereotyped (``aug["stereotyped"]``), and no one when the run
    has no stereotyped person (relation "lost" or "no_target").

    Each person option becomes [new description, group label]: the label BBQ's metadata gave
    the new person (``group_mapping[j]["group"]``: BBQ's own label for one of its
    descriptions, or the group its vocabulary gives); where the generator's flag decided (a
    group BBQ does not know: Zoroastrian, Jain, Andorran), the person's own description,
    with the characters a regular expression reads specially left out (BBQ's script matches
    labels as patterns). Never the source's label of the same role: that would file a
    Zoroastrian under "Muslim" in any per-group analysis (issue 44).
    ``stereotyped_groups`` starts as the source's list; an entry that
    would make BBQ's rule pick a person the run does not is dropped, and the stereotyped
    person's text (Nationality) or label (elsewhere) is added when the rule would miss it.

    Raises:
        RuntimeError: BBQ's rule still disagrees with the run (a defect, never user input).
    """
    category = source["category"]
    info = {k: list(v) for k, v in source["answer_info"].items()}
    people = [i for i in range(3) if i != bbq.unknown_index(source)]
    target, wanted = bbq.stereotyped_index(source), aug["stereotyped"]
    groups = [str(g) for g in source["additional_metadata"].get("stereotyped_groups", [])]
    for i, entry in zip(people, aug["group_mapping"]):
        label = entry.get("group")
        if label is None:
            label = own_label(entry["new"])
        info[f"ans{i}"] = [entry["new"], label]

    def hits(i: int, among: list[str]) -> bool:
        return bbq.option_is_stereotyped(category, info[f"ans{i}"][0], info[f"ans{i}"][1],
                                         among)

    for i in people:
        if i != wanted and hits(i, groups):
            groups = [g for g in groups if not hits(i, [g])]
    if wanted is not None and not hits(wanted, groups):
        text, label = info[f"ans{wanted}"]
        groups.append(text if category == "Nationality" else label)
    record = {"category": category, "answer_info": info,
              "additional_metadata": {"stereotyped_groups": groups}}
    if bbq.stereotyped_index(record) != wanted:
        raise RuntimeError(f"BBQ export of {aug['source_id']} variant {aug['variant']}: BBQ's "
                           f"rule finds option {bbq.stereotyped_index(record)}, the run "
                           f"{wanted}")
    return info, groups


def export_bbq(store, out_dir: Path, options, finalized: list | None = None) -> list[Path]:
    """The validated augmented scenarios as BBQ files: ``<BBQ name>.jsonl`` per category.

    One record per scenario that passed (the clean arm, each generation once, however many
    target models answered it), with BBQ's fields: the scenario as ``context``, the source's
    question, the remapped options as ``ans0..ans2``, ``label`` = the unknown option, and
    ``answer_info`` and ``stereotyped_groups`` from `bbq_people` (BBQ's own rule finds the
    run's stereotyped person in every record; the source's list stays in
    ``source_stereotyped_groups``), and
    ``additional_metadata`` holding the source's metadata plus the provenance: source example,
    variant, generator models and prompts, group mapping, stereotype relation, rephrased
    question, validator votes and seed. ``example_id`` numbers the records of a category.

    BBQ's own analysis (``analysis_scripts/BBQ_results_metadata.R``) ignores a record's
    ``stereotyped_groups``: it joins its template files on category and ``question_index``
    and reads their ``Known_stereotyped_groups``. So beside the JSONL, the export writes
    ``templates/new_templates - <Category>.csv`` in BBQ's template columns, one row per
    record (its own ``Q_id``, its scenario, question and stereotyped groups), and each
    record's ``question_index`` is that ``Q_id``: ``biaslab-<example_id>``, which no BBQ
    question index (a number) can equal, so the export can sit beside BBQ's own files
    without a join picking the wrong row. The source's index stays in
    ``additional_metadata.source_question_index``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    per_category: dict[str, list[dict]] = {}
    seen: set[tuple] = set()
    for coords, value in list(_finalized(store)) if finalized is None else finalized:
        if coords["exposure"] != "none":
            continue
        for aug in value["augmented"]:
            key = (aug["source_id"], aug["seed"], aug["variant"], aug["scenario"])
            if not aug["passed"] or key in seen:
                continue
            seen.add(key)
            source = record_for(aug["source_id"], options)
            answer_info, groups = bbq_people(source, aug)
            meta = {**{k: v for k, v in source["additional_metadata"].items()
                       if k != "data_origin"}, "stereotyped_groups": groups,
                    "source_stereotyped_groups": source["additional_metadata"].get(
                        "stereotyped_groups", []),
                    "data_origin": "augmented by biaslab",
                    "source_data_origin": aug["data_origin"],
                    "source_example_id": aug["source_example_id"],
                    "source_item": aug["source_id"], "variant": aug["variant"],
                    "source_question_index": source.get("question_index", ""),
                    "group_mapping": aug["group_mapping"],
                    "stereotype_relation": aug["relation"],
                    "generator": {"models": aug["models"], "prompts": aug["prompts"]},
                    "rephrased_question": aug["rephrased_question"],
                    "validator_votes": aug["validator_votes"], "seed": aug["seed"]}
            records = per_category.setdefault(source["category"], [])
            records.append({
                "example_id": len(records), "question_index": f"{QUESTION_INDEX_PREFIX}"
                                                              f"{len(records)}",
                "question_polarity": source["question_polarity"], "context_condition": "ambig",
                "category": source["category"], "answer_info": answer_info,
                "additional_metadata": meta, "context": aug["scenario"],
                "question": source["question"],
                **{f"ans{i}": aug["options"][i] for i in range(3)}, "label": aug["label"]})
    written = []
    for category, records in sorted(per_category.items()):
        path = out_dir / f"{category}.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for record in records:
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        written.append(path)
        written.append(write_bbq_templates(records, out_dir / "templates", category))
    return written


QUESTION_INDEX_PREFIX = "biaslab-"
"""The export's question indexes: BBQ's are numbers, so none of ours can equal one."""
TEMPLATE_COLUMNS = ["needs_val", "Q_id", "Category", "Ambiguous_Context",
                    "Disambiguating_Context", "Lexical_diversity",
                    "Question_negative_stereotype", "Question_non_negative", "Answer_negative",
                    "Answer_non_negative", "Relevant_social_values", "Known_stereotyped_groups",
                    "Stated_gender_info", "Notes"]
"""The columns of BBQ's template files (``templates/new_templates - <Category>.csv``)."""


def write_bbq_templates(records: list[dict], folder: Path, category: str) -> Path:
    """BBQ template rows for exported records, one per record: ``Q_id`` = its
    ``question_index``, ``Known_stereotyped_groups`` = its stereotyped groups as BBQ writes
    them (a JSON list), the scenario as the ambiguous context and the question under its
    polarity; what a template has and a scenario has not (slots, a disambiguating context,
    lexical variants) stays empty. BBQ's metadata script reads these by category and index."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"new_templates - {category}.csv"
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=TEMPLATE_COLUMNS)
        writer.writeheader()
        for r in records:
            meta = r["additional_metadata"]
            neg = r["question_polarity"] == "neg"
            writer.writerow({
                "Q_id": r["question_index"], "Category": category,
                "Ambiguous_Context": r["context"],
                "Question_negative_stereotype": r["question"] if neg else "",
                "Question_non_negative": "" if neg else r["question"],
                "Known_stereotyped_groups": json.dumps(meta["stereotyped_groups"],
                                                       ensure_ascii=False),
                "Notes": f"biaslab augmentation of {meta['source_item']} (BBQ question "
                         f"{meta['source_question_index']}), variant {meta['variant']}"})
    return path


def write_report(store, run_dir: str | Path, options) -> list[Path]:
    from biaslab.experiments.reports.figure_files import figures_wanted, save_figure

    run_dir = Path(run_dir)
    tables, figures = run_dir / "tables", run_dir / "figures"
    tables.mkdir(parents=True, exist_ok=True)
    if figures_wanted():
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
    bootstrap_cells = ("Cells: rate [95% bootstrap CI over source examples], percent of "
                       "scored responses.")
    note += bootstrap_cells

    def put(name: str, frame: pd.DataFrame, md: bool = True, cells: str | None = None) -> None:
        frame.to_csv(tables / f"{name}.csv", index=False)
        written.append(tables / f"{name}.csv")
        if md:
            text = note if cells is None else note.replace(bootstrap_cells, cells)
            (tables / f"{name}.md").write_text(
                to_markdown(frame, index=False, digits=None) + (f"\n{text}\n" if text else ""),
                encoding="utf-8")
            written.append(tables / f"{name}.md")

    clean = rows[rows["exposure"] == "none"]
    if not clean.empty:
        long = decisive_rates(clean, ["model", "condition", "category"], n_resamples=n)
        long["data_origin"] = long["category"].map(
            clean.groupby("category")["data_origin"].first())
        put("dr_rates", long.round(2), md=False)
        put("table2", table2(clean, n))
        per_category = category_rates(clean, n)
        put("category_rates", per_category.round(2), md=False)
        put("table3", table3(per_category))
        fig3 = figure3(clean, n)
        put("figure3", fig3.round(2))
        if fig3["DR%"].notna().any() and figures_wanted():
            plot = figure3_plot(fig3.dropna(subset=["DR%"]))
            written += save_figure(plot, [(figures / f"figure3.{ext}", {"dpi": 200})
                                          for ext in ("png", "svg")], tight=False)
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
        if not long_fig.empty and figures_wanted():
            fig = dr_figure(long_fig, origins, per_category.dropna(subset=["DR%"]))
            written += save_figure(fig, [(figures / f"dr_by_condition.{ext}", {"dpi": 200})
                                         for ext in ("png", "svg")], tight=False)
        contrasts = condition_contrasts(clean, ["model"], n_resamples=n)
        if not contrasts.empty:
            contrasts["diff [CI]"] = [_ci(r["diff (pp)"], r["ci_low"], r["ci_high"])
                                      for _, r in contrasts.iterrows()]
            put("condition_contrasts", contrasts.round(2),
                cells="Cells: DR% difference in percentage points [95% paired bootstrap CI "
                "over the source examples both conditions cover].")
    scenarios = scenarios_frame(store, finalized)
    summary = summary_frame(store, finalized)
    sc = (unique_generations(scenarios, ["item", "seed", "variant", "variant_context",
                                         "scenario", "stopped_at"])
          if not scenarios.empty else scenarios)
    sources = (unique_generations(summary, ["item", "seed", "abstraction",
                                            "rephrased_question", "n_requested", "n_variants"])
               if not summary.empty else summary)
    if not sc.empty:
        voted = sc[sc["stopped_at"].isna() | (sc["stopped_at"] == "validators")]
        if not voted.empty:
            table = pd.concat([pass_rates(voted, ["category"], n_resamples=n),
                               pass_rates(voted.assign(category="all"), ["category"],
                                          n_resamples=n)])
            table["pass% [CI]"] = [_ci(r["pass%"], r["pass_low"], r["pass_high"])
                                   for _, r in table.iterrows()]
            table["data_origin"] = _origin_column(table["category"], voted)
            put("validator_pass", table.round(2))
            agreement = pd.DataFrame([{"category": "all", **validator_agreement(
                voted, VALIDATORS, VALIDATOR_LABELS, n_resamples=n)}])
            put("validator_agreement", agreement.round(4),
                cells="Agreement over the scenarios all three validators labelled; CIs: "
                "bootstrap over scenarios.")
            human = getattr(options, "human_labels", None) or (run_dir / "human_labels.csv")
            if Path(human).is_file():
                put("human_agreement", human_agreement(
                    read_human_labels(human), voted, VALIDATORS, n_resamples=n).round(4),
                    cells="People's label (can the question be answered from the scenario?) "
                    "against the validators' (rejected = answerable); AC1 CI: bootstrap over "
                    "the labelled scenarios.")
            else:
                (tables / "human_agreement.md").write_text(
                    "No human labels: put a CSV with columns item, variant, label (yes = the "
                    "question can be answered from the scenario; optional annotator, seed) "
                    "at human_labels.csv in the run directory, or name it in [options] "
                    "human_labels, and run `biaslab report` again. augmented.jsonl lists "
                    "the scenarios (source_id, variant, scenario).\n", encoding="utf-8")
                written.append(tables / "human_agreement.md")
    if not sources.empty:
        steps = pd.concat([step_pass_rates(sc, sources, ["category"]),
                           step_pass_rates(sc.assign(category="all") if not sc.empty else sc,
                                           sources.assign(category="all"), ["category"])])
        steps["pass% [CI]"] = [_ci(r["pass%"], r["pass_low"], r["pass_high"])
                               for _, r in steps.iterrows()]
        put("generation_steps", steps.round(2),
            cells="Cells: percent of the step's inputs that passed [Wilson 95% interval].")
        put("rule_rejections", rule_rejections(sc, sources), md=False)
        if not sc.empty:
            decisions = pd.concat([stereotype_decisions(sc),
                                   stereotype_decisions(sc.assign(category="all"))])
            put("stereotype_decisions", decisions.round(2), md=False)
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
    generation = generation_frame(summary, scenarios)
    if (generation["exposure"] != "none").any():
        put("pass_rate_effects", pass_rate_effects(generation, by=["generation"],
                                                   n_resamples=n).round(2),
            cells="Cells: per-source pass rate of each exposed arm minus the clean arm's, "
            "in percentage points [95% paired bootstrap CI over source examples].")
    return written


def compare_augmentation(source, counterfactual, out_dir: str | Path, options) -> list[Path]:
    """A counterfactual against its source in this protocol's own measures.

    ``compare_rates.csv``: per model × exposure arm × condition, DR% and AR% in both runs
    over the sources scored in both (a source's rate over its responses there), the change
    (counterfactual − source, pp) with a paired bootstrap CI over sources, and how many
    sources each run scored (``n_sources_source``, ``n_sources_counterfactual``: a
    validator change moves the augmented conditions' coverage). ``compare_pass.csv``: the
    generation chain's pass rates (`pass_rate_effects`: kept, validator pass, rephrase) per
    exposure arm, counterfactual against source.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = options.n_resamples
    keys = ["exposure", "model", "seed", "condition"]
    per_run = []
    for name, store in (("source", source), ("counterfactual", counterfactual)):
        rows = rows_frame(store)
        if not rows.empty:
            per_run.append(source_dr(rows, keys).assign(run=name))
    columns = ["model", "exposure", "condition", "n_pairs", "n_sources_source",
               "n_sources_counterfactual", "DR%_source", "DR%_counterfactual", "DR diff (pp)",
               "DR_ci_low", "DR_ci_high", "AR%_source", "AR%_counterfactual", "AR diff (pp)",
               "AR_ci_low", "AR_ci_high"]
    table = pd.DataFrame(columns=columns)
    if len(per_run) == 2:
        both = pd.concat(per_run, ignore_index=True)
        covered = both.groupby(["run", "model", "exposure", "condition"])["item"].nunique()
        effects = paired_condition_effects(both, value="dr_pct", pair_on=["item", "seed"],
                                           condition="run", by=["model", "exposure",
                                                                "condition"],
                                           clean="source", n_resamples=n)
        found = {(e["model"], e["exposure"], e["condition"]) for _, e in effects.iterrows()}
        missing = [{"model": m, "exposure": x, "condition": c, "n_pairs": 0, "clean_mean": np.nan,
                    "exposed_mean": np.nan, "diff": np.nan, "ci_low": np.nan, "ci_high": np.nan}
                   for m, x, c in sorted({k[1:] for k in covered.index} - found)]
        records = []
        for _, e in pd.concat([effects, pd.DataFrame(missing)], ignore_index=True).iterrows():
            at = (e["model"], e["exposure"], e["condition"])
            records.append({
                "model": at[0], "exposure": at[1], "condition": at[2],
                "n_pairs": int(e["n_pairs"]),
                "n_sources_source": int(covered.get(("source", *at), 0)),
                "n_sources_counterfactual": int(covered.get(("counterfactual", *at), 0)),
                "DR%_source": e["clean_mean"], "DR%_counterfactual": e["exposed_mean"],
                "DR diff (pp)": e["diff"], "DR_ci_low": e["ci_low"], "DR_ci_high": e["ci_high"],
                "AR%_source": 100 - e["clean_mean"],
                "AR%_counterfactual": 100 - e["exposed_mean"], "AR diff (pp)": 0.0 - e["diff"],
                "AR_ci_low": 0.0 - e["ci_high"], "AR_ci_high": 0.0 - e["ci_low"]})
        table = pd.DataFrame(records, columns=columns)
        rank = {c: i for i, c in enumerate(CONDITION_ORDER)}
        table = table.sort_values(["model", "exposure", "condition"], key=lambda s: s.map(
            rank) if s.name == "condition" else s).reset_index(drop=True)
    rates_path = out / "compare_rates.csv"
    table.round(2).to_csv(rates_path, index=False)
    frames = [generation_frame(summary_frame(store), scenarios_frame(store), per_model=True)
              .assign(run=name)
              for name, store in (("source", source), ("counterfactual", counterfactual))]
    generation = pd.concat(frames, ignore_index=True)
    if generation.groupby("run")["generation"].nunique().le(1).all():
        # one generation shared by every target in each run: compare it once
        generation = (generation.drop_duplicates(["run", "exposure", "item", "seed"])
                      .assign(model=SHARED_GENERATION))
    passes = pass_rate_effects(generation, arm="run", reference="source",
                               by=["exposure", "model"], n_resamples=n)
    pass_path = out / "compare_pass.csv"
    passes.round(2).to_csv(pass_path, index=False)
    return [rates_path, pass_path]
