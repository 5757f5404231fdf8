"""The tables of docs/protocols/roleplay.md §5a, from an imported BiasLens release.

    biaslab import biaslens ../shared/data/biaslens ../shared/data/biaslens/biaslens_answers_4models.tar.xz --out runs/released
    biaslab report runs/released
    biaslab replay runs/released --mode rescore --sensitivity --out runs/released-sensitivity
    python bench/released_run_tables.py runs/released runs/released-sensitivity

prints, as Markdown:

1. role against no role per model × question type (Table 5 of the run), each p adjusted with
   Holm and Benjamini–Hochberg over the 18 model × type tests, and over the 6 per-model
   overall tests (the paper's RQ5 claim, §5.5);
2. every pair of models on the same questions (the report's ``model_comparisons.csv``,
   McNemar exact, adjusted within the pooled family): how many of the 15 pairs per
   variant × type differ after Holm and after BH, and which do not;
3. the Why rows under each configuration of the authors' three judges (each alone, leave one
   out, majority, unanimity; ``recorded`` is their own majority): biased questions with and
   without the role, the difference, and whether it stays significant after Holm over the
   6 models; then each model's overall difference per configuration;
4. power of the role vs no-role z-test at the bank's size, the no-role rates of the run as
   baselines (`biaslab.evaluators.power`).

Only the run's files are read; nothing is computed but the adjustments and the power.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from statsmodels.stats.multitest import multipletests

from biaslab.evaluators.power import (PowerAssumptions, PowerContrast, achieved_power,
                                      exact_minimum_detectable_effect)

CONFIGS = ("recorded", "only:why_judge_1", "only:why_judge_2", "only:why_judge_3",
           "drop:why_judge_1", "drop:why_judge_2", "drop:why_judge_3", "majority",
           "unanimous")
TYPES = ("yes_no", "choice", "why")
ALPHA = 0.05


def _adjust(p: pd.Series) -> tuple[pd.Series, pd.Series]:
    ok = p.notna()
    holm, bh = pd.Series(float("nan"), index=p.index), pd.Series(float("nan"), index=p.index)
    if ok.any():
        holm[ok] = multipletests(p[ok], method="holm")[1]
        bh[ok] = multipletests(p[ok], method="fdr_bh")[1]
    return holm, bh


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _p(x: float) -> str:
    return "n/a" if pd.isna(x) else (f"{x:.2g}" if x >= 1e-300 else "<1e-300")


def _verdict(diff: float, p_adj: float) -> str:
    if pd.isna(p_adj) or p_adj >= ALPHA:
        return "no"
    return "yes, fewer without" if diff > 0 else "yes, **more** without"


def role_table(table5: pd.DataFrame) -> str:
    lines = []
    for family, part in (("per type (18 tests)", table5[table5["type"] != "overall"]),
                         ("overall per model (6 tests)", table5[table5["type"] == "overall"])):
        part = part.copy()
        part["p_holm"], part["p_bh"] = _adjust(part["p_value"])
        lines += [f"**{family}**", "",
                  "| model | type | biased, role | biased, no role | diff [95% CI] | p | "
                  "p Holm | p BH | significant after Holm |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in part.itertuples():
            lines.append(
                f"| {r.model} | {r.type} | {int(r.biased_role):,} ({_pct(r.rate_role)}) | "
                f"{int(r.biased_no_role):,} ({_pct(r.rate_no_role)}) | {r.diff:+.3f} "
                f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}] | {_p(r.p_value)} | {_p(r.p_holm)} | "
                f"{_p(r.p_bh)} | {_verdict(r.diff, r.p_holm)} |")
        lines.append("")
    return "\n".join(lines)


def comparisons_table(path: Path, table5: pd.DataFrame) -> str:
    frame = pd.read_csv(path)
    pooled = frame[(frame["group"] == "all") & (frame["family"] == "pooled")]
    sizes = pooled["family_size"].dropna()
    family = f"{int(sizes.max())} tests" if len(sizes) else "no test (too few pairs)"
    lines = [f"Family: {family} (the pooled rows).", "",
             "| variant | type | pairs | differ (Holm) | differ (BH) | the same after Holm | "
             "models, most biased first (Table 5's rate) |", "|---|---|---|---|---|---|---|"]
    for (variant, stratum), part in pooled.groupby(["variant", "stratum"], sort=True):
        same = part[~(part["p_holm"] < ALPHA)]
        qtype = stratum.removeprefix("type=")
        rates = table5[table5["type"] == qtype].set_index("model")[f"rate_{variant}"]
        means = rates[rates.index.isin(set(part["model_a"]) | set(part["model_b"]))]
        order = " > ".join(f"{m} {_pct(v)}" for m, v in means.sort_values(
            ascending=False).items())
        lines.append(f"| {variant} | {stratum.removeprefix('type=')} | {len(part)} | "
                     f"{int((part['p_holm'] < ALPHA).sum())} | "
                     f"{int((part['p_bh'] < ALPHA).sum())} | "
                     f"{', '.join(f'{a}–{b}' for a, b in zip(same['model_a'], same['model_b'])) or 'none'}"
                     f" | {order} |")
    return "\n".join(lines) + "\n"


def sensitivity_tables(base: Path) -> str:
    rows = []
    for config in CONFIGS:
        path = base / "evals" / "judge_sensitivity" / config.replace(":", "-") / "tables" / \
            "table5.csv"
        if path.is_file():
            rows.append(pd.read_csv(path).assign(configuration=config))
    if not rows:
        return "(no judge sensitivity tables found)\n"
    frame = pd.concat(rows)
    why = frame[frame["type"] == "why"].copy()
    adjusted = []
    for _, part in why.groupby("configuration", sort=False):
        part = part.copy()
        part["p_holm"], part["p_bh"] = _adjust(part["p_value"])
        adjusted.append(part)
    why = pd.concat(adjusted)
    models = sorted(why["model"].unique())
    lines = ["**Why questions: biased with the role / without it (difference; significant "
             f"after Holm over the {len(models)} models?)**", "",
             "| configuration | " + " | ".join(models) + " |",
             "|---|" + "---|" * len(models)]
    for config in CONFIGS:
        part = why[why["configuration"] == config].set_index("model")
        if part.empty:
            continue
        cells = []
        for m in models:
            r = part.loc[m]
            mark = "✓" if r["p_holm"] < ALPHA and r["diff"] > 0 else (
                "✗" if not r["p_holm"] < ALPHA else "✓ (more without)")
            cells.append(f"{int(r['biased_role']):,} / {int(r['biased_no_role']):,} "
                         f"({r['diff']:+.3f}) {mark}")
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    overall = frame[frame["type"] == "overall"]
    lines += ["", "**All types: the difference with − without the role, per model "
              f"(Holm over the {len(models)} models: ✓ significant)**", "",
              "| configuration | " + " | ".join(models) + " |",
              "|---|" + "---|" * len(models)]
    for config in CONFIGS:
        part = overall[overall["configuration"] == config].copy()
        if part.empty:
            continue
        part["p_holm"], _ = _adjust(part["p_value"])
        part = part.set_index("model")
        lines.append(f"| {config} | " + " | ".join(
            f"{part.loc[m, 'diff']:+.3f} {'✓' if part.loc[m, 'p_holm'] < ALPHA else '✗'}"
            for m in models) + " |")
    ranks = []
    for config in CONFIGS:
        part = why[why["configuration"] == config]
        if len(part):
            order = part.sort_values("rate_role", ascending=False)["model"]
            ranks.append(f"| {config} | {' > '.join(order)} |")
    lines += ["", "**Why questions with the role: models, most biased first**", "",
              "| configuration | order |", "|---|---|", *ranks]
    return "\n".join(lines) + "\n"


def power_table(table5: pd.DataFrame) -> str:
    lines = ["| type | questions per arm | no-role rate (min–max over models) | MDE at 80% "
             "power, α 0.05 (exact z-test), at the lowest / highest rate | smallest observed "
             "|diff| | power at it |", "|---|---|---|---|---|---|"]
    for qtype in TYPES:
        part = table5[table5["type"] == qtype]
        if part.empty:
            continue
        n = int(part["n_role"].min())
        contrast = PowerContrast(f"role vs no role, {qtype}", "question", "two_proportions",
                                 n, measure="verdict", seeds_averaged=True)
        mdes = [exact_minimum_detectable_effect(contrast, PowerAssumptions(baseline=b))
                for b in (part["rate_no_role"].min(), part["rate_no_role"].max())]
        smallest = part.loc[part["diff"].abs().idxmin()]
        power = achieved_power(contrast, PowerAssumptions(baseline=smallest["rate_no_role"]),
                               abs(smallest["diff"]))
        lines.append(f"| {qtype} | {n:,} | {_pct(part['rate_no_role'].min())}–"
                     f"{_pct(part['rate_no_role'].max())} | {100 * mdes[0]:.2f} / "
                     f"{100 * mdes[1]:.2f} points | {abs(smallest['diff']) * 100:.2f} points "
                     f"({smallest['model']}) | {power:.0%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the imported run, reported")
    parser.add_argument("sensitivity", type=Path, nargs="?",
                        help="where --sensitivity wrote (its --out; default: the run)")
    args = parser.parse_args(argv)
    tables = args.run / "tables"
    if not (tables / "table5.csv").is_file():
        print(f"{tables / 'table5.csv'} not found: run biaslab report {args.run} first",
              file=sys.stderr)
        return 2
    table5 = pd.read_csv(tables / "table5.csv")
    print("### Role against no role (the authors' judges, their majority)\n")
    print(role_table(table5))
    print("### Models against each other on the same questions\n")
    print(comparisons_table(tables / "model_comparisons.csv", table5))
    print("### The choice of judge\n")
    print(sensitivity_tables(args.sensitivity or args.run))
    print("### Power of the role vs no-role test at the bank's size\n")
    print(power_table(table5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
