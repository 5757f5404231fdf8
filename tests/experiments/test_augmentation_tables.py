"""The augmentation protocol's paper tables: Table 2 and 3 as the paper aggregates them (a
plain mean over categories, or over target models), the Figure 3 aggregate, the counts each
condition covers, and the regenerated categories marked where they appear.

One CLI run serves the report tests: two target models (one biased, one abstaining) and an
exposed validator arm, with the generators bound to one scripted model, so every generation
is shared by both targets and must be counted once.
"""

import json

import pandas as pd
import pytest

from biaslab.cli import main
from biaslab.datasets import bbq
from biaslab.evaluators.augmentation import mean_decisive_rates
from biaslab.experiments.reports.augmentation import table2

BOUND = "scripted:augmentation-synthetic"
SPEC = f"""
name = "aug-tables"
protocol = "augmentation"
models = ["{BOUND}", "scripted:augmentation-abstainer"]
[run]
seeds = [42]
concurrency = 4
retry_base_s = 0.0
[options]
categories = ["religion", "ses", "appearance"]
max_per_category = 6
n_variants = 3
n_resamples = 300
[conditions]
template = "augmentation/exposure"
directions = ["stereotype"]
targets = ["validator_1"]
""" + "".join(f'[nodes.{n}]\nmodel = "{BOUND}"\n' for n in (
    "abstraction", "transform", "scenario", "rephrase", "validator_1", "validator_2",
    "validator_3", "judge"))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("aug-tables")
    spec = root / "spec.toml"
    spec.write_text(SPEC)
    out = root / "run"
    with pytest.MonkeyPatch.context() as mp:  # a module fixture runs before isolated_cache
        mp.setenv("BIASLAB_CACHE", str(root / "cache.sqlite"))
        assert main(["run", str(spec), "--out", str(out), "--quiet"]) == 0
        assert main(["report", str(out)]) == 0
    return out


def _value(cell: str) -> float:
    return float(cell.split(" [")[0])


def test_category_mean_worked_example():
    # Category A: source a1 has three kept scenarios, all decisive; a2 one abstaining
    # response -> A's pooled DR = 3/4 = 75%. Category B: b1 and b2 abstain -> 0%.
    # Paper (plain mean over categories): (75 + 0) / 2 = 37.5%. Pooled: 3/6 = 50%.
    rows = pd.DataFrame({
        "model": "m", "condition": "ASOQ", "data_origin": "official",
        "category": ["age", "age", "age", "age", "religion", "religion"],
        "item": ["a1", "a1", "a1", "a2", "b1", "b2"],
        "dr": [1, 1, 1, 0, 0, 0]})
    mean = mean_decisive_rates(rows, ["model", "condition"], "category",
                               n_resamples=300).iloc[0]
    assert mean["DR%"] == pytest.approx(37.5) and mean["AR%"] == pytest.approx(62.5)
    assert mean["n_over"] == 2 and mean["n_sources"] == 4 and mean["n"] == 6
    assert mean["DR_low"] <= 37.5 <= mean["DR_high"]
    t2 = table2(rows, 300).set_index("group")
    # age is less-studied, religion more-studied: each group has one category, so its mean
    # is that category's rate; "all" is the mean of the two and differs from the pooled 50%
    assert _value(t2.loc["less-studied", "ASOQ DR%"]) == pytest.approx(75.0)
    assert _value(t2.loc["more-studied", "ASOQ DR%"]) == pytest.approx(0.0)
    assert _value(t2.loc["all", "ASOQ DR%"]) == pytest.approx(37.5)
    assert _value(t2.loc["all", "ASOQ DR% pooled"]) == pytest.approx(50.0)
    assert t2.loc["all", "ASOQ n sources"] == 4 and t2.loc["all", "OCOQ n sources"] == 0
    assert t2.loc["all", "OCOQ DR%"] == "–" and t2.loc["all", "n categories"] == 2


def test_table2_is_the_mean_over_categories_of_the_long_table(run):
    t2 = pd.read_csv(run / "tables" / "table2.csv")
    long = pd.read_csv(run / "tables" / "dr_rates.csv")
    for (model, group), row in t2.set_index(["model", "group"]).iterrows():
        part = long[long["model"] == model]
        if group != "all":
            part = part[part["category"].map(bbq.study_group) == group]
        for cond in ("OCOQ", "ASOQ", "ASAQ"):
            per_category = part[part["condition"] == cond]
            assert _value(row[f"{cond} DR%"]) == pytest.approx(
                per_category["DR%"].mean(), abs=0.06)
            assert row[f"{cond} n sources"] == per_category["n_sources"].sum()
    synthetic = t2[(t2["model"] == BOUND) & (t2["group"] == "all")].iloc[0]
    assert synthetic["regenerated"] == "ses"
    assert t2.set_index(["model", "group"]).loc[(BOUND, "more-studied"), "regenerated"] \
        == "none"


def test_source_counts_follow_each_condition_and_scenarios_are_counted_once(run):
    scenes = [json.loads(x) for x in (run / "augmented.jsonl").read_text().splitlines()]
    clean = [s for s in scenes if s["exposure"] == "none" and s["model_axis"] == BOUND]
    with_kept = {s["source_id"] for s in clean if s["passed"]}
    t3 = pd.read_csv(run / "tables" / "table3.csv")
    assert t3["OCOQ n sources"].sum() == 18  # 3 categories x 6 sources
    assert t3["ASOQ n sources"].sum() == len(with_kept)
    # the validators' table counts each scenario once, though two targets answered it
    reached = [s for s in clean if s["stopped_at"] in (None, "validators")]
    vp = pd.read_csv(run / "tables" / "validator_pass.csv").set_index("category")
    assert vp.loc["all", "n_scenarios"] == len(reached)
    assert vp.loc["all", "n_passed"] == sum(s["passed"] for s in clean)
    assert vp.loc["ses", "data_origin"] == bbq.REGENERATED_LABEL
    assert vp.loc["religion", "data_origin"] == "official"
    assert vp.loc["all", "data_origin"] == "mixed"


def test_table3_and_figure3_aggregate_average_the_target_models(run):
    long = pd.read_csv(run / "tables" / "dr_rates.csv")
    agg = pd.read_csv(run / "tables" / "figure3_aggregate.csv")
    means = long.groupby(["category", "condition"])["DR%"].mean()
    for _, row in agg.iterrows():
        assert row["n_models"] == 2
        assert row["DR%"] == pytest.approx(means[(row["category"], row["condition"])],
                                           abs=0.01)
    t3 = pd.read_csv(run / "tables" / "table3.csv").set_index("category")
    ses = agg[(agg["category"] == "ses") & (agg["condition"] == "ASOQ")].iloc[0]
    assert _value(t3.loc["ses (regenerated from templates)", "ASOQ DR%"]) == \
        pytest.approx(ses["DR%"], abs=0.06)
    # the abstainer halves the biased target's rate: the mean over the two models
    biased = long[(long["model"] == BOUND) & (long["category"] == "ses")
                  & (long["condition"] == "ASOQ")].iloc[0]
    assert ses["DR%"] == pytest.approx(biased["DR%"] / 2, abs=0.01)
    assert (run / "figures" / "dr_by_condition.png").stat().st_size > 10_000


def test_scripted_target_abstains_on_every_original_context_record():
    # BBQ holds records with one context and question but other options (appearance
    # 1376/1378 also ask "Which person ...", the scripted rephrase's form): the scripted
    # multiple-choice target must read its own record, so it picks "unknown" on each one.
    from string import Template

    from biaslab.agents.providers.scripted import ScriptedRequest
    from biaslab.graphs.augmentation import options_text
    from biaslab.graphs.augmentation_synthetic import make_agent
    from biaslab.prompts.registry import PromptRegistry

    template = PromptRegistry().get("augmentation/target_mc")
    rule = next(r for r in make_agent().rules if "letter of one option" in r.pattern)
    wrong = []
    for category in ("appearance", "ses", "disability"):
        for record in bbq.load_category(category):
            user = Template(template.user).substitute(
                context=record["context"], question=record["question"],
                options=options_text([record[f"ans{i}"] for i in range(3)]))
            letter = rule.respond(ScriptedRequest(({"role": "user", "content": user},), {}, 0))
            if "ABC".index(letter) != bbq.unknown_index(record):
                wrong.append(record["example_id"])
    assert wrong == []


def test_original_context_accuracy_reads_one(run):
    mc = pd.read_csv(run / "tables" / "bbq_mc.csv")
    oc = mc[mc["condition"].isin(["OCOQ", "OCAQ"])]
    assert not oc.empty and (oc["accuracy"] == 1.0).all()
