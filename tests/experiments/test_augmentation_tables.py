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
from support_runs import bound_nodes, run_and_report_once

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
""" + bound_nodes(BOUND)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_and_report_once(tmp_path_factory.mktemp("aug-tables"), SPEC)


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


def test_table3_and_category_rates_average_the_target_models(run):
    long = pd.read_csv(run / "tables" / "dr_rates.csv")
    agg = pd.read_csv(run / "tables" / "category_rates.csv")
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


def test_figure3_is_the_mean_over_models_and_categories_of_each_study_group(run):
    long = pd.read_csv(run / "tables" / "dr_rates.csv")
    fig = pd.read_csv(run / "tables" / "figure3.csv")
    long["group"] = long["category"].map(bbq.study_group)
    cells = long.dropna(subset=["DR%"]).groupby(["group", "condition"])
    assert set(fig["group"]) == {"more-studied", "less-studied"}
    for _, row in fig.iterrows():
        part = cells.get_group((row["group"], row["condition"]))
        assert row["n_cells"] == len(part) == 2 * row["n_categories"]
        assert row["n_models"] == 2
        assert row["DR%"] == pytest.approx(part["DR%"].mean(), abs=0.01)
        assert row["DR_low"] <= row["DR%"] <= row["DR_high"]
    assert (run / "figures" / "figure3.png").stat().st_size > 5_000


def test_figure3_worked_example():
    # OCOQ, two targets. more-studied: m1 gender 1 of 2 decisive (50%), m1 race 0 of 1 (0%),
    # m2 gender 2 of 2 (100%), m2 race 1 of 1 (100%): mean of the four cells 62.5% (pooled
    # over the 6 responses it would read 4/6 = 66.7%). less-studied: age, m1 1 of 4 (25%),
    # m2 3 of 4 (75%): 50%. One unscored response (dr None) counts nowhere.
    from biaslab.experiments.reports.augmentation import figure3

    def responses(model, category, items, drs):
        return [{"model": model, "category": category, "item": i, "dr": d,
                 "condition": "OCOQ", "data_origin": "official"} for i, d in zip(items, drs)]

    rows = pd.DataFrame(
        responses("m1", "gender", ["g1", "g2"], [1, 0])
        + responses("m1", "race", ["r1", "r2"], [0, None])
        + responses("m2", "gender", ["g1", "g2"], [1, 1]) + responses("m2", "race", ["r1"], [1])
        + responses("m1", "age", ["a1", "a2", "a3", "a4"], [1, 0, 0, 0])
        + responses("m2", "age", ["a1", "a2", "a3", "a4"], [1, 1, 1, 0]))
    out = figure3(rows, n_resamples=300).set_index("group")
    assert out.loc["more-studied", "DR%"] == pytest.approx(62.5)
    assert out.loc["more-studied", "AR%"] == pytest.approx(37.5)
    assert (out.loc["more-studied", "n_cells"], out.loc["more-studied", "n_sources"],
            out.loc["more-studied", "n"]) == (4, 3, 6)
    assert out.loc["less-studied", "DR%"] == pytest.approx(50.0)
    assert out.loc["less-studied", "n_cells"] == 2


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


# -- exposure and counterfactual reporting beyond DR ------------------------------------------
def test_pass_rate_effects_worked_example():
    # Two sources, 4 variants each. Clean: s1 keeps 4 of 4 put to the validators, s2 keeps 2
    # of 4. Exposed: s1 keeps 2 of 4, s2 keeps 2 of 2 (two failed a rule check first).
    # kept%: clean (100 + 50) / 2 = 75, exposed (50 + 50) / 2 = 50 -> -25 pp.
    # validator_pass%: clean (100 + 50) / 2 = 75, exposed (50 + 100) / 2 = 75 -> 0 pp.
    from biaslab.evaluators.augmentation import pass_rate_effects

    frame = pd.DataFrame({"exposure": ["none", "none", "validator_1:x", "validator_1:x"],
                          "item": ["s1", "s2", "s1", "s2"], "seed": 1, "requested": 4,
                          "reached": [4, 4, 4, 2], "kept": [4, 2, 2, 2],
                          "rephrase_ok": [1, 0, 1, 1]})
    out = pass_rate_effects(frame, n_resamples=300).set_index("measure")
    assert out.loc["kept%", "reference_mean"] == 75 and out.loc["kept%", "arm_mean"] == 50
    assert out.loc["kept%", "diff (pp)"] == -25 and out.loc["kept%", "n_pairs"] == 2
    assert out.loc["validator_pass%", "diff (pp)"] == 0
    assert out.loc["rephrase_ok%", "diff (pp)"] == 50
    assert out.loc["kept%", "kept_reference"] == 6 and out.loc["kept%", "kept_arm"] == 4


def test_a_biased_validator_cuts_the_kept_scenarios_with_a_ci(run):
    scenes = [json.loads(x) for x in (run / "augmented.jsonl").read_text().splitlines()]
    ours = [s for s in scenes if s["model_axis"] == BOUND]
    kept = {arm: sum(s["passed"] for s in ours if s["exposure"] == arm)
            for arm in ("none", "validator_1:stereotype")}
    table = pd.read_csv(run / "tables" / "pass_rate_effects.csv")
    assert set(table["generation"]) == {BOUND}  # both targets share one generation
    row = table[(table["exposure"] == "validator_1:stereotype")
                & (table["measure"] == "kept%")].iloc[0]
    assert row["kept_reference"] == kept["none"] > row["kept_arm"] == kept["validator_1:stereotype"]
    # 18 sources x 3 variants: the mean per-source kept share is the pooled share
    assert row["n_pairs"] == 18
    assert row["diff (pp)"] == pytest.approx(
        100 * (kept["validator_1:stereotype"] - kept["none"]) / 54, abs=0.01)
    assert row["ci_low"] <= row["diff (pp)"] <= row["ci_high"] < 0


def test_counterfactual_compares_dr_ar_and_pass_rates(run, tmp_path):
    cf = tmp_path / "cf"
    assert main(["replay", str(run), "--mode", "counterfactual", "--node", "validator_2",
                 "--model", "scripted:augmentation-strict-validator", "--out", str(cf),
                 "--no-figures"]) == 0
    passes = pd.read_csv(cf / "tables" / "compare_pass.csv")
    kept = passes[(passes["measure"] == "kept%") & (passes["exposure"] == "none")].iloc[0]
    # the strict validator keeps nothing: the whole clean share is lost
    assert kept["arm_mean"] == 0 and kept["diff (pp)"] == -kept["reference_mean"] < 0
    assert kept["ci_high"] < 0 and kept["kept_arm"] == 0 and kept["n_pairs"] == 18
    rates = pd.read_csv(cf / "tables" / "compare_rates.csv")
    mine = rates[(rates["model"] == BOUND) & (rates["exposure"] == "none")].set_index(
        "condition")
    assert mine.loc["OCOQ", "DR diff (pp)"] == 0 and mine.loc["OCOQ", "n_pairs"] == 18
    assert mine.loc["OCOQ", "AR%_counterfactual"] == 100
    # the augmented conditions lose every source: no pair, and the counts say why
    assert mine.loc["ASOQ", "n_pairs"] == 0 and mine.loc["ASOQ", "n_sources_counterfactual"] == 0
    assert mine.loc["ASOQ", "n_sources_source"] > 0


# -- human labels against the validators ------------------------------------------------------
def test_human_agreement_worked_example():
    # Scenarios: A kept, people say unanswerable (agree); B kept, people say answerable (the
    # filter let it through); C rejected, answerable (agree); D rejected, unanswerable. E: two
    # annotators split (a tie, left out); Z: not among the voted scenarios (unmatched).
    # Ensemble (rejected = answerable) F, F, T, T vs people F, T, T, F: agree 2/4 = 50%;
    # Cohen's kappa: p_o = 0.5, p_e = 0.5·0.5 + 0.5·0.5 = 0.5 -> 0.
    from biaslab.evaluators.augmentation import human_agreement

    votes = pd.DataFrame({"item": list("ABCDE"), "variant": 0, "seed": 1,
                          "passed": [True, True, False, False, True],
                          "validator_1": ["not_answerable", "not_answerable", "answerable",
                                          "answerable", "not_answerable"]})
    human = pd.DataFrame({"item": list("ABCDEEZ"), "variant": 0,
                          "annotator": ["x"] * 5 + ["y", "x"],
                          "label": [False, True, True, False, True, False, True]})
    out = human_agreement(human, votes, ["validator_1"], n_resamples=300).set_index(
        "comparison")
    row = out.loc["ensemble_vs_human"]
    assert row["n_items"] == 4 and row["agree%"] == 50 and row["cohens_kappa"] == 0
    assert row["kept_but_answerable"] == 1 and row["rejected_but_not"] == 1
    assert row["human_ties"] == 1 and row["n_unmatched"] == 1
    assert out.loc["validator_1_vs_human", "agree%"] == 50
    assert out.loc["annotators", "n_items"] == 1 and out.loc["annotators", "agree%"] == 0


def test_report_reads_human_labels_from_the_run_directory(run):
    scenes = [json.loads(x) for x in (run / "augmented.jsonl").read_text().splitlines()]
    voted = [s for s in scenes if s["exposure"] == "none" and s["model_axis"] == BOUND
             and s["stopped_at"] in (None, "validators")][:8]
    # people agree with the filter on all but the first scenario
    labels = ["item,variant,label"] + [
        f"{s['source_id']},{s['variant']},{'no' if s['passed'] != (i == 0) else 'yes'}"
        for i, s in enumerate(voted)]
    (run / "human_labels.csv").write_text("\n".join(labels) + "\n")
    try:
        assert main(["report", str(run), "--no-figures"]) == 0  # the fixture's figures stay
        table = pd.read_csv(run / "tables" / "human_agreement.csv").set_index("comparison")
    finally:
        (run / "human_labels.csv").unlink()
    row = table.loc["ensemble_vs_human"]
    assert row["n_items"] == 8 and row["agree%"] == pytest.approx(100 * 7 / 8)
    assert row["kept_but_answerable"] + row["rejected_but_not"] == 1


def test_a_bad_human_label_file_is_one_line_before_the_run(tmp_path, capsys):
    bad = tmp_path / "labels.csv"
    bad.write_text("item,variant,label\nreligion:1,0,maybe\n")
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.replace("n_resamples = 300", f'n_resamples = 300\nhuman_labels = "{bad}"'))
    assert main(["run", str(spec), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "maybe" in err[0] and "labels.csv" in err[0]
