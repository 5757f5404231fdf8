"""Tables and figures of the ``roleplay`` protocol (BiasLens), from the run store alone.

Tables (``tables/``), each as CSV and most also as Markdown:

- ``table3``: biased questions per model × attribute × type (the paper's Table 3 layout), from
  the ``role`` variant's clean arm; ``biased_counts.csv`` has the paper's rates (undecided
  questions count as unbiased), the rates among decided questions, Wilson CIs, the spread
  between seeds and the bank-scaled estimate behind it;
- ``table5``: role vs no role per model × type plus a per-model ``overall`` row, with the
  paper's decrease rate (relative to the role rate), difference CI and the two-proportion
  z-test (Table 5);
- ``table6``: consistency across the repeats as shares of all questions: all answers agree,
  two biased, one biased (Table 6);
- ``overlap.csv``: how many models each bias-triggering question triggers;
- ``per_attribute.csv`` and ``top_roles.csv``;
- ``bias_types.csv``: questions biased in at least 4 models (the paper's count; option
  ``bias_type_min_models``) per attribute × bias type, in our own typology (the classifier's);
- ``judge_votes.csv`` / ``judge_pairs.csv``: each Why judge's biased share, unparsed votes and
  pivotal rate, and each pair's agreement, per model × variant × condition;
- ``oracle_agreement.csv``: Cohen's kappa and percent agreement between the Why oracles
  (judge ensemble, each judge, keyword rule) and human labels when given;
- ``exposure_effects.csv``: each exposed node × direction against clean on the same
  questions, with a paired bootstrap CI;
- ``answers.csv`` (one row per question × cell) and ``parse_failures.csv``.

Figures (``figures/``, PNG and SVG): ``overlap_hist``, ``per_attribute``,
``bias_type_heatmap`` and, with exposure arms, ``exposure_effects``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from biaslab.evaluators import roleplay as rp
from biaslab.evaluators.exposure_effects import paired_condition_effects
from biaslab.experiments.reports.generic import with_condition
from biaslab.experiments.reports.figure_files import figures_wanted
from biaslab.experiments.reports.markdown import to_markdown
from biaslab.prompts.registry import PromptRegistry

__all__ = ["questions_frame", "bias_type_frame", "bias_type_table", "write_report",
           "write_headline_tables",
           "write_generation_report", "headline", "oracle_reliability", "response_frame",
           "plot_overlap", "plot_per_attribute", "plot_bias_types", "plot_exposure",
           "PAPER_MIN_MODELS", "TYPOLOGY"]

# Okabe-Ito: colour-blind safe.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442",
           "#000000"]
CLEAN = "none"


def _cells(store) -> pd.DataFrame:
    cells = store.cells()
    if cells.empty:
        return cells
    return with_condition(cells[cells["status"] == "done"])


def questions_frame(store) -> pd.DataFrame:
    """One row per question × finished cell: the oracles' row plus the cell's coordinates
    (variant, model, seed, condition, target, direction)."""
    cells = _cells(store)
    if cells.empty:
        return pd.DataFrame()
    keys = ["variant", "model", "seed", "condition", "target", "direction"]
    coords = {r["cell_id"]: r for r in cells[["cell_id", *keys]].to_dict("records")}
    # Built column by column, never as one dict per row: a paper-size run has ~330k rows
    # (bench/roleplay_report_scale.py), and a dict per row would double the peak memory.
    columns: dict[str, list] = {key: [] for key in [*keys, "cell_id"]}
    n = 0
    for cell_id, _, _, value in store.iter_outputs(node="oracles"):
        if cell_id not in coords:
            continue
        scored = value.get("scored", [])
        for key in [*keys, "cell_id"]:
            columns[key].extend([coords[cell_id][key]] * len(scored))
        for row in scored:
            for key, field in row.items():
                column = columns.get(key)
                if column is None:
                    column = columns[key] = [None] * n
                column.append(field)
            n += 1
            for column in columns.values():  # fields this row lacks (Why-only ones)
                if len(column) < n:
                    column.append(None)
    frame = pd.DataFrame(columns) if n else pd.DataFrame()
    if not frame.empty:
        frame["verdict"] = frame["verdict"].astype(object).where(frame["verdict"].notna(), None)
    return frame


def bias_type_frame(store) -> pd.DataFrame:
    """The classifier's label per question and model (clean arm of ``bias_type``)."""
    cells = _cells(store)
    if cells.empty:
        return pd.DataFrame()
    clean = cells[(cells["variant"] == "bias_type") & (cells["condition"] == CLEAN)]
    models = clean.set_index("cell_id")["model"]
    rows = []
    for cell_id, _, _, value in store.iter_outputs(node="classify"):
        if cell_id in models.index:
            rows += [{**r, "model": models[cell_id]} for r in value.get("bias_types", [])]
    return pd.DataFrame(rows)


def response_frame(questions: pd.DataFrame) -> pd.DataFrame:
    """One row per Why answer: the judge ensemble's, each judge's and the keyword verdicts."""
    why = questions[questions["type"] == "why"] if len(questions) else questions
    rows = []
    for rec in why.itertuples(index=False):
        for sample, (label, keyword, votes) in enumerate(zip(rec.labels, rec.keyword,
                                                             rec.judge_votes)):
            row = {"model": rec.model, "variant": rec.variant, "condition": rec.condition,
                   "seed": rec.seed, "qid": rec.qid, "sample": sample,
                   "ensemble": None if label is None else label == "biased",
                   "keyword": keyword}
            for j, vote in enumerate(votes):
                row[f"why_judge_{j + 1}"] = None if vote is None else vote == "biased"
            rows.append(row)
    return pd.DataFrame(rows)


def oracle_reliability(responses: pd.DataFrame, human: pd.DataFrame | None = None
                       ) -> pd.DataFrame:
    """Agreement of the Why oracles, per model: ensemble vs keyword, and each oracle vs the
    human labels when given (clean arms only)."""
    rows = []
    if responses.empty:
        return pd.DataFrame(columns=["model", "oracle", "reference", "n", "n_dropped", "kappa",
                                     "percent_agreement"])
    clean = responses[responses["condition"] == CLEAN]
    judges = sorted(c for c in clean.columns if c.startswith("why_judge_"))
    for model, part in clean.groupby("model", sort=True):
        rows.append({"model": model, "oracle": "judge_ensemble", "reference": "keyword",
                     **rp.oracle_agreement(list(part["ensemble"]), list(part["keyword"]))})
        if human is None:
            continue
        keys = ["qid", "sample"] + [k for k in ("model", "variant") if k in human.columns]
        # labels without a variant column are labels of the role variant (the paper's setting)
        labelled = part if "variant" in human.columns else part[part["variant"] == "role"]
        merged = labelled.merge(human[keys + ["human"]], on=keys, how="inner")
        for oracle in ["judge_ensemble", "keyword", *judges]:
            column = "ensemble" if oracle == "judge_ensemble" else oracle
            rows.append({"model": model, "oracle": oracle, "reference": "human",
                         **rp.oracle_agreement(list(merged[column]), list(merged["human"]))})
    return pd.DataFrame(rows)


PAPER_MIN_MODELS = 4
"""The paper's heatmap counts the questions that draw bias out of more than 3 models."""
TYPOLOGY = "biaslab typology"
"""Our bias types (the labels of ``roleplay/bias_type``), not the paper's."""


def bias_type_table(base: pd.DataFrame, types: pd.DataFrame, min_models: int) -> pd.DataFrame:
    """Role attribute × bias type: distinct questions biased in at least `min_models` models
    (the paper's heatmap, with 4). Computed per seed, then averaged over seeds. A question's
    bias type is the label most models' classifier calls gave it."""
    label = (types.dropna(subset=["bias_type"]).groupby("qid")["bias_type"]
             .agg(lambda s: s.value_counts().index[0]))
    known = list(PromptRegistry().get("roleplay/bias_type").labels)
    seeds = base["seed"] if "seed" in base.columns else pd.Series(0, index=base.index)
    tables = []
    for _, part in base.groupby(seeds.to_numpy(), sort=True):
        biased = part[part["verdict"].map(lambda v: v is True)]
        hits = biased.groupby("qid").agg(attribute=("attribute", "first"),
                                         models=("model", "nunique"))
        hits = hits[hits["models"] >= min_models]
        hits = hits.assign(bias_type=hits.index.map(label).fillna("unclassified"))
        tables.append(pd.crosstab(hits["attribute"], hits["bias_type"]).astype(float))
    heat = pd.concat(tables).groupby(level=0).sum() / len(tables) if tables else pd.DataFrame()
    # every attribute and type keeps its row and column, so heatmaps of different runs line up
    heat = heat.reindex(index=sorted(set(base["attribute"])),
                        columns=known + [c for c in heat.columns if c not in known],
                        fill_value=0).fillna(0)
    heat.index.name, heat.columns.name = "attribute", "bias_type"
    whole = np.allclose(heat.to_numpy(), np.round(heat.to_numpy()))
    return heat.round().astype(int) if whole else heat


# -- writing ---------------------------------------------------------------------------------
def _save(fig: Figure, out: Path, name: str) -> list[Path]:
    if not figures_wanted():  # --no-figures: nothing drawn
        return []
    FigureCanvasAgg(fig)
    fig.tight_layout()
    paths = []
    for ext in ("png", "svg"):
        path = out / f"{name}.{ext}"
        fig.savefig(path, dpi=150 if ext == "png" else "figure")
        paths.append(path)
    return paths


def plot_overlap(overlap: pd.DataFrame, out: Path) -> list[Path]:
    if not figures_wanted():  # --no-figures: nothing drawn
        return []
    fig = Figure(figsize=(4.5, 3.2))
    ax = fig.add_subplot()
    if overlap.empty or overlap["questions"].sum() == 0:
        ax.text(0.5, 0.5, "no bias-triggering question", ha="center", va="center")
    else:
        ax.bar(overlap["n_models"].astype(str), overlap["questions"], color=PALETTE[0])
        for x, y in zip(overlap["n_models"].astype(str), overlap["questions"]):
            ax.annotate(str(y), (x, y), ha="center", va="bottom", fontsize=8)
    of = int(overlap["of_models"].iloc[0]) if len(overlap) else 0
    ax.set_xlabel(f"models triggered (of {of})")
    ax.set_ylabel("bias-triggering questions")
    ax.set_title("Overlap of biased questions across models", fontsize=10)
    return _save(fig, out, "overlap_hist")


def plot_per_attribute(counts: pd.DataFrame, out: Path) -> list[Path]:
    """Biased rate per attribute and model (grouped bars) with Wilson 95% CIs."""
    if not figures_wanted():  # --no-figures: nothing drawn
        return []
    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.add_subplot()
    if counts.empty:
        ax.text(0.5, 0.5, "no question answered", ha="center", va="center")
    attributes = sorted(counts["attribute"].unique()) if len(counts) else []
    models = list(dict.fromkeys(counts["model"])) if len(counts) else []
    width = 0.8 / max(len(models), 1)
    x = np.arange(len(attributes))
    for i, model in enumerate(models):
        part = counts[counts["model"] == model].set_index("attribute").reindex(attributes)
        rate = part["rate"].to_numpy(dtype=float) * 100
        # a NaN or rounding-negative half-width is no bar (matplotlib rejects negative yerr)
        low = np.clip(np.nan_to_num((part["rate"] - part["ci_low"]).to_numpy(dtype=float)),
                      0, None) * 100
        high = np.clip(np.nan_to_num((part["ci_high"] - part["rate"]).to_numpy(dtype=float)),
                       0, None) * 100
        ax.bar(x + (i - (len(models) - 1) / 2) * width, np.nan_to_num(rate), width,
               yerr=[low, high], capsize=2,
               color=PALETTE[i % len(PALETTE)], label=model, error_kw={"lw": 0.8})
    ax.set_xticks(x, attributes, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("biased questions (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Biased questions per attribute (role, clean; 95% Wilson CI)", fontsize=10)
    if models:
        ax.legend(fontsize=7, frameon=False, loc="upper right")
    return _save(fig, out, "per_attribute")


def plot_bias_types(table: pd.DataFrame, out: Path, min_models: int = 1) -> list[Path]:
    """Questions biased in at least `min_models` models, per role attribute × bias type."""
    if not figures_wanted():  # --no-figures: nothing drawn
        return []
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    if table.empty or not np.nansum(table.to_numpy(dtype=float)):
        ax.text(0.5, 0.5, f"no question biased in {min_models} or more models",
                ha="center", va="center")
        ax.set_axis_off()
        return _save(fig, out, "bias_type_heatmap")
    values = np.nan_to_num(table.to_numpy(dtype=float))
    image = ax.imshow(values, cmap="viridis", aspect="auto", vmin=0)
    ax.set_xticks(range(table.shape[1]), table.columns, rotation=40, ha="right", fontsize=7)
    ax.set_yticks(range(table.shape[0]), table.index, fontsize=7)
    top = values.max() if values.size else 0
    for (i, j), v in np.ndenumerate(values):
        if v:
            ax.text(j, i, f"{v:g}", ha="center", va="center", fontsize=6,
                    color="white" if v < top / 2 else "black")
    fig.colorbar(image, ax=ax, label=f"questions biased in ≥ {min_models} models")
    ax.set_xlabel(f"bias type ({TYPOLOGY}, by the classifier node)")
    ax.set_ylabel("role attribute")
    ax.set_title(f"Questions biased in ≥ {min_models} models: role attribute × bias type",
                 fontsize=10)
    return _save(fig, out, "bias_type_heatmap")


def plot_exposure(effects: pd.DataFrame, out: Path) -> list[Path]:
    """Paired exposed − clean differences with 95% CIs, one row per arm; coloured by
    direction."""
    if not figures_wanted():  # --no-figures: nothing drawn
        return []
    rows = effects.dropna(subset=["diff"]).reset_index(drop=True)
    rows = rows.assign(ci_low=rows["ci_low"].fillna(rows["diff"]),
                       ci_high=rows["ci_high"].fillna(rows["diff"]))
    several = rows["model"].nunique() > 1
    fig = Figure(figsize=(7.0, 1.2 + 0.3 * max(len(rows), 1)))
    ax = fig.add_subplot()
    labels = [(f"{r.model} · " if several else "") + f"{r.variant} · {r.type} · {r.condition}"
              for r in rows.itertuples()]
    directions = list(dict.fromkeys(c.split(":")[-1] for c in rows["condition"]))
    colour = {d: PALETTE[(i + 2) % len(PALETTE)] for i, d in enumerate(directions)}
    for i, r in enumerate(rows.itertuples()):
        c = colour[r.condition.split(":")[-1]]
        ax.errorbar([r.diff * 100], [i], xerr=[[max(r.diff - r.ci_low, 0) * 100],
                                               [max(r.ci_high - r.diff, 0) * 100]],
                    fmt="o", color=c, ecolor=c, capsize=2)
    ax.axvline(0, color="0.6", lw=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("biased rate, exposed − clean (points, 95% paired CI)", fontsize=8)
    ax.set_title("Exposure effects on the same questions", fontsize=9)
    return _save(fig, out, "exposure_effects")


def write_report(store, run_dir: str | Path, options) -> list[Path]:
    """Every roleplay table and figure under `run_dir`/tables and `run_dir`/figures."""
    run_dir = Path(run_dir)
    tables, figures = run_dir / "tables", run_dir / "figures"
    tables.mkdir(parents=True, exist_ok=True)
    if figures_wanted():
        figures.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def put(frame: pd.DataFrame, name: str, markdown: bool = False, index: bool = False) -> None:
        path = tables / f"{name}.csv"
        frame.to_csv(path, index=index)
        written.append(path)
        if markdown:
            md = tables / f"{name}.md"
            md.write_text(to_markdown(frame, index=index, digits=3), encoding="utf-8")
            written.append(md)

    questions = questions_frame(store)
    if questions.empty:
        return written
    flat = questions.drop(columns=[c for c in ("labels", "biased", "judge_votes", "keyword")
                                   if c in questions.columns])
    put(flat, "answers")
    parse = (questions.groupby(["model", "variant", "condition", "type"], sort=True)
             .agg(questions=("qid", "size"), answers_unparsed=("n_parse_failures", "sum"),
                  answers_unscored=("n_unscored", "sum"),
                  undecided=("verdict", lambda v: int(sum(x is None for x in v))))
             .reset_index())
    put(parse, "parse_failures")

    base = questions[(questions["variant"] == "role") & (questions["condition"] == CLEAN)]
    if not base.empty:
        put(rp.biased_counts(base, ["model", "attribute", "type"]), "biased_counts")
        put(rp.table3(base), "table3", markdown=True, index=True)
        counts = rp.biased_counts(base, ["model", "attribute"])
        written += plot_per_attribute(counts, figures)
        put(rp.per_attribute(base), "per_attribute", markdown=True)
        put(rp.top_roles(base, options.top_roles), "top_roles", markdown=True)
        overlap = rp.overlap_counts(base)
        put(overlap, "overlap")
        put(rp.overlap_by_type(base), "overlap_by_type")
        written += plot_overlap(overlap, figures)
        table6 = rp.consistency_table(base, repeats=options.repeats)
        put(table6, "table6", markdown=True)
        if not table6.empty:
            put(rp.model_average(table6), "table6_average", markdown=True)
    clean = questions[questions["condition"] == CLEAN]
    table5 = rp.role_vs_no_role(clean)
    if not table5.empty:
        put(table5, "table5", markdown=True)
        put(rp.model_average(table5), "table5_average", markdown=True)

    types = bias_type_frame(store)
    if not types.empty and not base.empty:
        min_models = getattr(options, "bias_type_min_models", PAPER_MIN_MODELS)
        heat = bias_type_table(base, types, min_models)
        put(heat, "bias_types", markdown=True, index=True)
        written += plot_bias_types(heat, figures, min_models)
        put(types, "bias_type_labels")

    human = rp.load_human_labels(options.human_labels) if options.human_labels else None
    responses = response_frame(questions)  # one row per Why answer: built once, used twice
    reliability = oracle_reliability(responses, human)
    if not reliability.empty:
        put(reliability, "oracle_agreement", markdown=True)
    if not responses.empty:
        judges = sorted(c for c in responses.columns if c.startswith("why_judge_"))
        put(rp.judge_votes_table(responses, judges), "judge_votes", markdown=True)
        put(rp.judge_pairs_table(responses, judges), "judge_pairs", markdown=True)

    if (questions["condition"] != CLEAN).any():
        # As in every rate here: an undecided question counts as unbiased, and a question is
        # the unit (averaged over its seeds first, never one pair per seed).
        frame = questions.assign(biased=(questions["verdict"] == True).astype(float))  # noqa: E712
        frame = frame.groupby(["model", "variant", "type", "condition", "qid"], sort=True,
                              as_index=False)["biased"].mean()
        effects = paired_condition_effects(frame, value="biased", pair_on=["qid"],
                                           by=["model", "variant", "type"], random_state=0)
        # a Why judge only sees Why answers: its arms on other types are trivially zero
        judged_elsewhere = (effects["condition"].str.startswith("why_judge")
                            & (effects["type"] != "why"))
        effects = effects[~judged_elsewhere].reset_index(drop=True)
        put(effects, "exposure_effects", markdown=True)
        if effects["diff"].notna().any():
            written += plot_exposure(effects, figures)
    return written


def write_headline_tables(store, run_dir: str | Path, options) -> list[Path]:
    """Only Table 5 (``table5.csv``, ``table5_average.csv``), as `write_report` writes it:
    the headline a judge-sensitivity configuration is read from."""
    tables = Path(run_dir) / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    questions = questions_frame(store)
    if questions.empty:
        return []
    table5 = rp.role_vs_no_role(questions[questions["condition"] == CLEAN])
    if table5.empty:
        return []
    written = []
    for name, frame in (("table5", table5), ("table5_average", rp.model_average(table5))):
        frame.to_csv(tables / f"{name}.csv", index=False)
        written.append(tables / f"{name}.csv")
    return written


def headline(run_dir: str | Path) -> pd.DataFrame | None:
    """Table 5 (role vs no role) when both variants ran, else the biased counts."""
    tables = Path(run_dir) / "tables"
    path = tables / "table5.csv"
    if path.is_file():
        frame = pd.read_csv(path)
        out = frame[["model", "type", "biased_role", "n_role", "biased_no_role", "n_no_role",
                     "decrease_rate", "diff", "ci_low", "ci_high", "p_value"]].copy()
        def shown(fmt: str):  # a rate with nothing to divide by is n/a, never "nan%"
            return lambda x: "n/a" if pd.isna(x) else format(x, fmt)

        out["decrease_rate"] = out["decrease_rate"].map(shown(".1%"))
        for col in ("diff", "ci_low", "ci_high"):
            out[col] = out[col].map(shown("+.3f"))
        out["p_value"] = out["p_value"].map(shown(".2g"))
        out.attrs["title"] = "Biased questions with and without the role statement (Table 5)"
        return out
    path = tables / "biased_counts.csv"
    if path.is_file():
        frame = pd.read_csv(path)
        out = frame.groupby(["model", "type"], sort=True)[["biased", "n"]].sum()
        out = out.reset_index()
        out.attrs["title"] = "Biased questions (role, clean)"
        return out
    return None


# -- the generation protocol --------------------------------------------------------------------
def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "x"


def write_generation_report(store, run_dir: str | Path, options) -> list[Path]:
    """``roleplay_generate``: the bank of each model × condition under ``bank/`` and
    ``tables/generation_stats.csv`` (roles generated / near-duplicate, questions generated,
    kept and dropped by reason)."""
    from biaslab.datasets.biaslens import write_bank

    run_dir = Path(run_dir)
    cells = _cells(store)
    written: list[Path] = []
    if cells.empty:
        return written
    coords = cells.set_index("cell_id")[["model", "condition", "item"]]
    stats, questions, roles = [], [], []
    for cell_id, _, node, value in store.iter_outputs():
        if cell_id not in coords.index:
            continue
        meta = coords.loc[cell_id].to_dict()
        if node == "filter_questions":
            stats.append({**meta, **value["stats"]})
            questions += [{**meta, **q} for q in value["questions"]]
        elif node == "dedupe_roles":
            roles.append({**meta, "roles": value["roles"],
                          "dropped": [d["role"] for d in value["dropped_roles"]]})
    tables = run_dir / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    stat_frame = pd.DataFrame(stats)
    counts = [c for c in stat_frame.columns if c not in ("model", "condition", "item")]
    stat_frame[counts] = stat_frame[counts].fillna(0).astype(int)
    path = tables / "generation_stats.csv"
    stat_frame.to_csv(path, index=False)
    written.append(path)
    question_frame = pd.DataFrame(questions)
    role_frame = pd.DataFrame(roles)
    for (model, condition), part in role_frame.groupby(["model", "condition"], sort=True):
        out = run_dir / "bank" / _safe(model) / _safe(condition)
        role_map = {r["item"]: list(r["roles"]) for r in part.to_dict("records")}
        qs = (question_frame[(question_frame["model"] == model)
                             & (question_frame["condition"] == condition)]
              if len(question_frame) else pd.DataFrame(columns=["attribute", "role", "type",
                                                                "question"]))
        written += write_bank(out, role_map, qs)
    return written
