"""The augmentation report beyond DR: BBQ export, paired condition contrasts, validator calls.

One run serves all tests: two target models and an exposure arm, with the generators bound
to the swapper, so the same scenarios appear 2 × 2 times in ``augmented.jsonl`` and must be
exported once each.
"""

import json

import numpy as np
import pandas as pd
import pytest

from biaslab.cli import main
from biaslab.datasets import bbq
from biaslab.evaluators.augmentation import condition_contrasts
from biaslab.traces.store import RunStore
from support_runs import bound_nodes, run_and_report_once

SPEC = """
name = "aug-export"
protocol = "augmentation"
models = ["scripted:augmentation-swapper", "scripted:augmentation-abstainer"]
[run]
seeds = [42]
concurrency = 4
retry_base_s = 0.0
[options]
categories = ["age", "religion"]
max_per_category = 5
n_variants = 2
n_resamples = 300
[conditions]
template = "augmentation/exposure"
directions = ["fairness"]
targets = ["target"]
""" + bound_nodes("scripted:augmentation-swapper")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_and_report_once(tmp_path_factory.mktemp("aug-export"), SPEC)


def bbq_rule_target(record: dict):
    """Our own port of BBQ's target rule (``analysis_scripts/BBQ_results_metadata.R``,
    non-intersectional part), independent of `bbq.stereotyped_index`: the stereotyped groups
    joined with ", " and normalised (man/boy/men → M, woman/women/girl/girls → F, the trans
    lists → trans, "low SES"/"high SES" → lowSES/highSES); each option's label normalised
    (man/boy → M, woman/girl → F, the first "M-"/"F-" removed); an option is the target when
    its label occurs in the groups (Age: equal, old/nonOld only), on Nationality also when
    its text does; "African" never matches a list naming "African American"; a trans list
    matches labels starting "trans". The first such option, else None."""
    groups = ", ".join(str(g) for g in record["additional_metadata"]["stereotyped_groups"])
    low = groups.lower()
    if low in ("man", "boy", "men"):
        groups = "M"
    elif low in ("woman", "women", "girl", "girls"):
        groups = "F"
    elif low in ("transgender women, transgender men", "transgender men", "transgender women",
                 "transgender women, transgender men, trans"):
        groups = "trans"
    groups = {"low SES": "lowSES", "high SES": "highSES"}.get(groups, groups)
    for i in range(3):
        text, info = (str(x) for x in record["answer_info"][f"ans{i}"])
        info = {"man": "M", "boy": "M", "woman": "F", "girl": "F"}.get(info, info)
        info = info.replace("M-", "", 1).replace("F-", "", 1)
        if info == "unknown" or not info:
            continue
        found = info.lower() in groups.lower()
        if record["category"] == "Age":
            found = info in ("old", "nonOld") and info == groups
        if record["category"] == "Nationality" and text.lower() in groups.lower():
            found = True
        if text == "African" and "african american" in groups.lower():
            found = False
        if groups == "trans" and info.startswith("trans"):
            found = True
        if found:
            return i
    return None


NEW_GROUPS_SPEC = """
name = "aug-new-groups"
protocol = "augmentation"
models = ["scripted:augmentation-misflagger"]
[run]
seeds = [42]
concurrency = 4
retry_base_s = 0.0
[options]
categories = ["nationality", "age"]
max_per_category = 5
n_variants = 2
n_resamples = 200
[conditions]
include_clean = true
targets = []
"""


def test_export_with_new_groups_lets_bbqs_rule_find_the_stereotyped_person(tmp_path):
    run = run_and_report_once(tmp_path, NEW_GROUPS_SPEC)
    out = tmp_path / "bbq"
    assert main(["export", str(run), "--format", "bbq", "--out", str(out)]) == 0
    scenes = {(s["source_id"], s["variant"]): s for s in map(
        json.loads, (run / "augmented.jsonl").read_text().splitlines()) if s["passed"]}
    loaded = [*bbq.load_category("nationality", str(out)), *bbq.load_category("age", str(out))]
    assert len(loaded) == len(scenes) > 0
    rules = set()
    for record in loaded:
        meta = record["additional_metadata"]
        scene = scenes[(meta["source_item"], meta["variant"])]
        rules |= {m["decided_by"] for m in scene["group_mapping"]}
        # BBQ's own rule, ported here, finds the run's stereotyped person in every record
        assert bbq_rule_target(record) == scene["stereotyped"], (record["answer_info"], meta)
        if scene["stereotyped"] is not None:
            assert record[f"ans{scene['stereotyped']}"] == scene["options"][scene["stereotyped"]]
    assert rules == {"source", "stereotyped_groups", "generator"}
    new = [r for r in loaded if r["category"] == "Nationality"
           and any(m["decided_by"] != "source" for m in r["additional_metadata"]["group_mapping"])]
    assert len(new) >= 4
    for record in new:
        people = [v for v in record["answer_info"].values() if v[1] != "unknown"]
        # a new nationality carries its own region, not the old person's
        for text, label in people:
            if text == "Swiss":
                assert label == "Europe"
        assert "Swiss" not in record["additional_metadata"]["stereotyped_groups"]


def test_export_bbq_round_trips_through_the_bbq_reader(run, tmp_path):
    out = tmp_path / "bbq"
    assert main(["export", str(run), "--format", "bbq", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["Age.jsonl", "Religion.jsonl", "templates"]

    scenes = [json.loads(x) for x in (run / "augmented.jsonl").read_text().splitlines()]
    clean = [s for s in scenes if s["exposure"] == "none"]
    assert len(scenes) == 4 * len(clean) / 2  # 2 models x 2 arms repeat every scenario
    passed = {(s["source_id"], s["variant"]): s for s in clean if s["passed"]}
    loaded = [*bbq.load_category("age", str(out)), *bbq.load_category("religion", str(out))]
    assert len(loaded) == len(passed) > 0  # one record per validated scenario
    for record in loaded:
        meta = record["additional_metadata"]
        source = passed[(meta["source_item"], meta["variant"])]
        assert record["context"] == source["scenario"]
        assert record["question"] == source["question"]
        assert [record[f"ans{i}"] for i in range(3)] == source["options"]
        assert record["label"] == bbq.unknown_index(record) == source["label"]
        # BBQ's own stereotype rules find the stereotyped person where the swap put them
        assert bbq.stereotyped_index(record) == bbq_rule_target(record) == source["stereotyped"]
        assert meta["source_example_id"] == source["source_example_id"]
        assert meta["group_mapping"] == source["group_mapping"]
        assert meta["generator"]["models"]["transform"] == "scripted:augmentation-swapper"
        assert meta["data_origin"] == "augmented by biaslab"
        assert record["question_polarity"] in ("neg", "nonneg")
    assert sorted(r["example_id"] for r in loaded if r["category"] == "Age") == \
        list(range(sum(r["category"] == "Age" for r in loaded)))


def test_export_rejects_an_unknown_format_with_one_line(run, capsys):
    assert main(["export", str(run), "--format", "csv"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "known: parquet, jsonl, bbq" in err[0]


def test_condition_contrasts_table_pairs_the_same_sources(run):
    table = pd.read_csv(run / "tables" / "condition_contrasts.csv")
    assert set(table["contrast"]) == {"OCAQ-OCOQ", "ASOQ-OCOQ", "ASAQ-OCOQ", "ASOQ-OCAQ",
                                      "ASAQ-OCAQ", "ASAQ-ASOQ"}
    row = table[(table["model"] == "scripted:augmentation-swapper")
                & (table["contrast"] == "ASOQ-OCOQ")].iloc[0]
    assert row["DR%_a"] == 0.0 and row["ci_low"] > 0 and row["diff (pp)"] == row["DR%_b"]
    assert (table.loc[table["model"] == "scripted:augmentation-abstainer", "diff (pp)"]
            == 0).all()


def test_condition_contrasts_worked_example():
    # Three sources. s1: OCOQ 0, ASOQ variants 1 and 0 -> 50%; s2: OCOQ 1 -> 100%, ASOQ 1
    # -> 100%; s3: OCOQ 0 only (no passing scenario). ASOQ−OCOQ pairs s1 and s2:
    # mean of (50 − 0, 100 − 100) = 25 pp over n_sources = 2; s3 is left out.
    # The unpaired difference of means would be 75 − 33.3 = 41.7 pp.
    rows = pd.DataFrame({
        "model": "m", "seed": 1,
        "item": ["s1", "s1", "s1", "s2", "s2", "s3"],
        "condition": ["OCOQ", "ASOQ", "ASOQ", "OCOQ", "ASOQ", "OCOQ"],
        "dr": [0, 1, 0, 1, 1, 0]})
    out = condition_contrasts(rows, ["model"], pairs=[("OCOQ", "ASOQ")], n_resamples=500)
    row = out.iloc[0]
    assert row["contrast"] == "ASOQ-OCOQ" and row["n_sources"] == 2
    assert row["diff (pp)"] == pytest.approx(25.0)
    assert row["DR%_a"] == pytest.approx(50.0) and row["DR%_b"] == pytest.approx(75.0)
    # the paired bootstrap over the two sources: the mean of {50, 0} resampled lies in [0, 50]
    assert 0.0 <= row["ci_low"] <= 25.0 <= row["ci_high"] <= 50.0


def test_validators_on_one_model_are_three_distinct_calls(run):
    calls = RunStore(run, readonly=True).calls()
    votes = calls[calls["node"].str.startswith("validator_")]
    for (_, item), part in votes.groupby(["cell_id", "item"]):
        assert sorted(part["node"]) == ["validator_1", "validator_2", "validator_3"]
        assert part["seed"].nunique() == 3 and part["cache_key"].nunique() == 3
    # each validator's call is paid once (the other targets and arms reuse it), and no
    # validator's answer stands in for another's
    paid = votes[~votes["cache_hit"]]
    assert paid["cache_key"].is_unique and set(paid["cache_key"]) == set(votes["cache_key"])
    assert paid.groupby("item")["node"].nunique().eq(3).all()
    agreement = pd.read_csv(run / "tables" / "validator_agreement.csv").iloc[0]
    # the scripted validators are deterministic on the text: they always agree
    assert agreement["all_agree%"] == 100.0 and agreement["gwet_ac1"] == pytest.approx(1.0)
    assert np.isfinite(agreement["n_scenarios"]) and agreement["n_scenarios"] > 0
