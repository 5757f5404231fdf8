"""Rule checks run before the validators and reject broken generations, which are counted.

``scripted:augmentation-sloppy`` breaks in the three ways seen on the embedded smoke run: its
transform leaves a ``<new description>`` placeholder (variant 1), the scenario of variant 2 is
off-topic, and its rephrase is a statement. Its validators accept everything, so without the
rule checks all of this would count as success.
"""

import json

import pandas as pd
import pytest
from statsmodels.stats.proportion import proportion_confint

from biaslab.agents.parsers import ParseError
from biaslab.cli import main
from biaslab.graphs.augmentation import rephrase_parser
from biaslab.graphs.augmentation_checks import (question_failures, scenario_failures,
                                                variant_failures)
from biaslab.traces.store import RunStore
from support_runs import AUGMENTATION_GENERATORS, bound_nodes

SITUATION = "I saw a grandson and their grandfather last week outside the Walmart."
PEOPLE = ("grandson", "grandfather")


def test_each_kind_of_broken_generation_is_rejected():
    assert variant_failures(SITUATION, PEOPLE) == []
    assert variant_failures(SITUATION, ("<new description>", "grandfather")) == \
        ["placeholder_left", "group_not_named"]
    assert "placeholder_left" in variant_failures("I saw a <replaces grandson>.", PEOPLE)
    assert variant_failures(SITUATION, ("grandson", "Grandson")) == ["same_groups"]

    scene = (f"{SITUATION} The grandson checked the map while the grandfather waved at a "
             "passing car near the Walmart doors.")
    assert scenario_failures(scene, SITUATION, PEOPLE) == []
    off_topic = "Rain fell over the harbour all morning, and the ferries waited."
    assert scenario_failures(off_topic, SITUATION, PEOPLE) == ["option_missing", "off_topic"]
    # names both people but is about something else entirely
    assert scenario_failures("The grandson and the grandfather. Ferries, harbour, rain.",
                             SITUATION, PEOPLE) == ["off_topic"]
    assert scenario_failures(None, SITUATION, PEOPLE) == ["empty"]

    assert question_failures("Which person was uncomfortable with the phone?") == []
    assert question_failures("Somebody in the story did this.") == ["not_a_question"]
    parse = rephrase_parser("Who was not comfortable using the phone?", PEOPLE)
    with pytest.raises(ParseError, match="not a question"):
        parse("The person who was not comfortable with the phone.")
    with pytest.raises(ParseError, match="placeholder"):
        parse("Who was <rephrased question>?")


SPEC = """
name = "aug-sloppy"
protocol = "augmentation"
models = ["scripted:augmentation-synthetic"]
[run]
seeds = [42]
concurrency = 4
retry_base_s = 0.0
[options]
categories = ["age", "religion"]
max_per_category = 3
n_variants = 3
n_resamples = 200
[conditions]
include_clean = true
targets = []
""" + bound_nodes("scripted:augmentation-sloppy", AUGMENTATION_GENERATORS)


def test_cli_rule_checks_reject_and_count_broken_generations(tmp_path):
    spec = tmp_path / "sloppy.toml"
    spec.write_text(SPEC)
    run = tmp_path / "run"
    assert main(["run", str(spec), "--out", str(run), "--quiet", "--no-report"]) == 0
    assert main(["report", str(run), "--no-figures"]) == 0

    scenes = [json.loads(x) for x in (run / "augmented.jsonl").read_text().splitlines()]
    assert len(scenes) == 6 * 3
    by_variant = {k: [s for s in scenes if s["variant"] == k] for k in range(3)}
    for s in by_variant[0]:  # placeholder left: stopped before any scenario was written
        assert s["stopped_at"] == "transform" and s["scenario"] is None
        assert "transform:placeholder_left" in s["failed_checks"]
        assert not s["passed"] and s["validator_votes"] == {}
    for s in by_variant[1]:  # off-topic: written, rejected, never shown to the validators
        assert s["stopped_at"] == "scenario" and s["validator_votes"] == {}
        assert {"scenario:off_topic", "scenario:option_missing"} <= set(s["failed_checks"])
    assert all(s["passed"] for s in by_variant[2])

    calls = RunStore(run, readonly=True).calls()
    assert set(calls.loc[calls["node"] == "scenario", "item"]) == {"v1", "v2"}
    assert set(calls.loc[calls["node"] == "validator_1", "item"]) == {"v2"}
    targets = calls[calls["node"] == "target"]
    # the non-question rephrase is rejected (and re-asked once): no OCAQ/ASAQ is answered
    assert set(targets["item"]) == {"OCOQ", "ASOQ-v2"}
    assert calls.loc[calls["node"] == "rephrase", "parse_error"].str.contains(
        "not a question").all()

    rejected = pd.read_csv(run / "tables" / "rule_rejections.csv")
    counts = {(r.step, r.check): r.n_rejected for r in rejected.itertuples()}
    assert counts[("transform", "placeholder_left")] == 6
    assert counts[("scenario", "off_topic")] == 6
    assert counts[("rephrase", "not_a_question")] == 6

    steps = pd.read_csv(run / "tables" / "generation_steps.csv")
    steps = steps[steps["category"] == "all"].set_index("step")
    # 6 sources x 3 variants = 18 requested; 12 through the transform, 6 through the scenario
    # checks, all 6 through the (accepting) validators; 0 of 6 rephrasings
    expected = {"transform": (18, 12), "scenario": (12, 6), "validators": (6, 6),
                "overall": (18, 6), "rephrase": (6, 0), "abstraction": (6, 6)}
    for step, (n_in, n_passed) in expected.items():
        row = steps.loc[step]
        assert (row["n_in"], row["n_passed"]) == (n_in, n_passed), step
        low, high = proportion_confint(n_passed, n_in, method="wilson")
        assert row["pass_low"] == pytest.approx(100 * low, abs=0.01)
        assert row["pass_high"] == pytest.approx(100 * high, abs=0.01)


def test_every_placeholder_person_is_rejected():
    from biaslab.graphs.augmentation_checks import placeholder_person

    stand_ins = ["[NAME]", "[Person 1]", "{NAME}", "Group X", "Group Y", "group A", "Person B",
                 "Individual 2", "NAME1", "X", "someone", "the other person", "another group"]
    real = ["grandfather", "Japanese man", "78-year-old", "person in a wheelchair", "Swiss",
            "the man I met", "Muslim woman"]
    assert [d for d in stand_ins if not placeholder_person(d)] == []
    assert [d for d in real if placeholder_person(d)] == []
    assert variant_failures("I saw a grandson and [NAME] last week.", ("grandson", "[NAME]")) \
        == ["placeholder_person"]
    assert variant_failures("Group X and Group Y met.", ("Group X", "Group Y")) == \
        ["placeholder_person"]
    # real people, but the passage or the scenario still holds a stand-in
    assert variant_failures(f"{SITUATION} Person A waved.", PEOPLE) == ["placeholder_person"]
    scene = f"{SITUATION} The grandson and the grandfather talked while [NAME] watched."
    assert scenario_failures(scene, SITUATION, PEOPLE) == ["placeholder_person"]
    assert question_failures("Who did [NAME] meet?") == ["placeholder_person"]
    with pytest.raises(ParseError, match="stand-in person"):
        rephrase_parser("Who was not comfortable using the phone?", PEOPLE)(
            "Was Group X uncomfortable with the phone?")


PLACEHOLDER_SPEC = SPEC.replace('name = "aug-sloppy"', 'name = "aug-placeholder"').replace(
    "scripted:augmentation-sloppy", "scripted:augmentation-placeholder")


def test_cli_placeholder_people_are_rejected_counted_and_never_exported(tmp_path):
    spec = tmp_path / "placeholder.toml"
    spec.write_text(PLACEHOLDER_SPEC)
    run = tmp_path / "run"
    assert main(["run", str(spec), "--out", str(run), "--quiet", "--no-report"]) == 0
    assert main(["report", str(run), "--no-figures"]) == 0

    scenes = [json.loads(x) for x in (run / "augmented.jsonl").read_text().splitlines()]
    assert len(scenes) == 6 * 3
    for s in scenes:
        if s["variant"] in (0, 1):  # "[NAME]" / "Group X", "Group Y" as the new people
            assert s["stopped_at"] == "transform" and s["scenario"] is None
            assert "transform:placeholder_person" in s["failed_checks"]
        else:  # real people, "[NAME]" in the scenario
            assert s["stopped_at"] == "scenario"
            assert s["failed_checks"] == ["scenario:placeholder_person"]
        assert not s["passed"] and s["validator_votes"] == {}
    calls = RunStore(run, readonly=True).calls()
    assert calls[calls["node"].str.startswith("validator")].empty
    assert set(calls.loc[calls["node"] == "target", "item"]) == {"OCOQ", "OCAQ"}

    rejected = pd.read_csv(run / "tables" / "rule_rejections.csv")
    counts = {(r.step, r.check): r.n_rejected for r in rejected.itertuples()}
    assert counts == {("transform", "placeholder_person"): 12,
                      ("scenario", "placeholder_person"): 6}
    steps = pd.read_csv(run / "tables" / "generation_steps.csv")
    steps = steps[steps["category"] == "all"].set_index("step")
    assert (steps.loc["overall", "n_in"], steps.loc["overall", "n_passed"]) == (18, 0)

    out = tmp_path / "bbq"
    assert main(["export", str(run), "--format", "bbq", "--out", str(out)]) == 0
    assert not any(line.strip() for path in out.glob("*.jsonl")
                   for line in path.read_text().splitlines())
