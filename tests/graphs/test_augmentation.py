"""The augmentation protocol: filter, condition assembly, parsers, and the CLI end to end."""

import json

import pytest

from biaslab.agents.parsers import ParseError
from biaslab.cli import main
from biaslab.datasets import bbq
from biaslab.graphs.augmentation import (AugmentationOptions, assemble_conditions, parse_letter,
                                         remap_options, rephrase_parser, unanimous, _JUDGE_PARSER)
from biaslab.graphs.registry import get_protocol
from biaslab.traces.store import RunStore

RECORD = next(r for r in bbq.load_category("age") if r["example_id"] == 0)


def test_unanimous_filter_needs_three_not_answerable_votes():
    ok = {"validator_1": "not_answerable", "validator_2": "not_answerable",
          "validator_3": "not_answerable"}
    assert unanimous(ok)
    assert not unanimous({**ok, "validator_2": "answerable"})
    assert not unanimous({**ok, "validator_3": None})  # an unscored vote cannot confirm it
    assert not unanimous({})


def test_each_condition_uses_the_right_context_and_question():
    options = remap_options(RECORD, "great-grandmother", "granddaughter")
    scenes = [{"variant": 0, "passed": True, "scenario": "SCENE-0", "options": options},
              {"variant": 1, "passed": False, "scenario": "SCENE-1", "options": options},
              {"variant": 2, "passed": True, "scenario": "SCENE-2", "options": options}]
    got = {c["key"]: c for c in assemble_conditions(RECORD, "REPHRASED?", scenes)}
    assert set(got) == {"OCOQ", "OCAQ", "ASOQ-v0", "ASAQ-v0", "ASOQ-v2", "ASAQ-v2"}
    for key, c in got.items():
        original_context = key.startswith("OC")
        original_question = key[2:4] == "OQ"
        assert c["condition"] == key[:4]
        assert c["context"] == (RECORD["context"] if original_context
                                else f"SCENE-{c['variant']}")
        assert c["question"] == (RECORD["question"] if original_question else "REPHRASED?")
        assert c["options"] == ([RECORD[f"ans{i}"] for i in range(3)] if original_context
                                else options)
    # without a rephrased question only the OQ conditions remain
    assert {c["key"] for c in assemble_conditions(RECORD, None, scenes)} == \
        {"OCOQ", "ASOQ-v0", "ASOQ-v2"}


def test_remapped_options_keep_roles():
    options = remap_options(RECORD, "great-grandmother", "granddaughter")
    unknown = bbq.unknown_index(RECORD)
    assert options[unknown] == RECORD[f"ans{unknown}"]
    stereotyped = bbq.stereotyped_index(RECORD)  # the grandfather's slot keeps its role
    people = [i for i in range(3) if i != unknown]
    assert options[people[0]] == "The great-grandmother"
    assert options[people[1]] == "The granddaughter"
    assert stereotyped in people


def test_judge_parse():
    assert _JUDGE_PARSER('{"label": "decisive", "justification": "names the man"}')["label"] \
        == "decisive"
    assert _JUDGE_PARSER('Sure. {"label": "abstaining", "justification": "x"} ok')["label"] \
        == "abstaining"
    for bad in ('{"label": "maybe", "justification": "x"}', "decisive", '{"label": "decisive"}'):
        with pytest.raises(ParseError):
            _JUDGE_PARSER(bad)


def test_rephrase_check_and_letter_parse():
    parse = rephrase_parser("Who was not comfortable using the phone?", ["grandfather", "grandson"])
    assert parse("Which person was uncomfortable using the phone?\n") == \
        "Which person was uncomfortable using the phone?"
    with pytest.raises(ParseError, match="same as the original"):
        parse("who was NOT comfortable using the phone")
    with pytest.raises(ParseError, match="names a possible answer"):
        parse("Was the grandfather uncomfortable with the phone?")
    assert parse_letter("B") == 1 and parse_letter("Answer: (c).") == 2
    assert parse_letter("C) Cannot be determined") == 2 and parse_letter("Option a") == 0
    # the article "a" is not option A: such replies are unparsable, never misread
    for bad in ("", "A or B", "none", "It is a teen boy.", "Not known; a guess would be unfair."):
        with pytest.raises(ParseError):
            parse_letter(bad)


def test_graph_declares_every_llm_node_once():
    proto = get_protocol("augmentation")
    names = [n.name for n in proto.llm_nodes("default", AugmentationOptions())]
    assert names == ["abstraction", "transform", "scenario", "validator_1", "validator_2",
                     "validator_3", "rephrase", "target", "target_mc", "judge"]
    assert "target_mc" not in [n.name for n in proto.llm_nodes("default",
                                                               AugmentationOptions(mc=False))]
    assert set(proto.directions) == {"stereotype", "fairness"}


SPEC = """
name = "aug-test"
protocol = "augmentation"
models = ["scripted:augmentation-synthetic"]
[run]
seeds = [42]
concurrency = 4
retry_base_s = 0.0
[options]
categories = ["religion", "ses"]
max_per_category = 6
n_variants = 3
n_resamples = 300
[conditions]
template = "augmentation/exposure"
directions = ["stereotype"]
targets = ["target"]
"""


def test_cli_run_report_strict_replay_and_validator_counterfactual(tmp_path, monkeypatch):
    spec = tmp_path / "aug.toml"
    spec.write_text(SPEC)
    run = tmp_path / "run"
    assert main(["run", str(spec), "--out", str(run), "--quiet", "--no-report"]) == 0
    assert main(["report", str(run)]) == 0
    for name in ("table2.md", "table3.md", "validator_pass.md", "bbq_mc.md", "dr_rates.csv",
                 "exposure_effects.md", "rephrase.csv"):
        assert (run / "tables" / name).is_file(), name
    assert (run / "figures" / "dr_by_condition.png").stat().st_size > 10_000
    assert (run / "figures" / "dr_by_condition.svg").is_file()
    table3 = (run / "tables" / "table3.md").read_text()
    assert "ses (regenerated from templates)" in table3 and "religion |" in table3
    lines = [json.loads(x) for x in (run / "augmented.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 6 * 3 * 2  # sources × variants × (clean + exposed arm)
    first = lines[0]
    assert {"source_id", "abstraction", "variant", "person_a", "scenario", "validator_votes",
            "passed", "prompts", "models", "rephrased_question"} <= set(first)
    assert set(first["validator_votes"]) == {"validator_1", "validator_2", "validator_3"}
    assert first["prompts"]["validator_2"].startswith("augmentation/validator@")
    assert any(not x["passed"] for x in lines) and any(x["passed"] for x in lines)
    passed = [x for x in lines if x["passed"]]
    assert all(set(x["validator_votes"].values()) == {"not_answerable"} for x in passed)

    monkeypatch.setenv("BIASLAB_CACHE", "off")  # only the source trace may answer
    assert main(["replay", str(run), "--mode", "strict", "--out", str(tmp_path / "strict")]) == 0

    cf = tmp_path / "cf"
    assert main(["replay", str(run), "--mode", "counterfactual", "--node", "validator_2",
                 "--model", "scripted:augmentation-strict-validator", "--out", str(cf),
                 "--no-figures"]) == 0
    source_calls = RunStore(run).calls()
    calls = RunStore(cf).calls()
    paid = calls[~calls["cache_hit"]]
    assert set(paid["node"]) == {"validator_2"}  # nothing else reached a model
    # one paid call per distinct validator_2 prompt (the exposed arm repeats the clean one's)
    source_v2 = source_calls[source_calls["node"] == "validator_2"]
    assert len(paid) == source_v2["messages"].map(str).nunique() < len(source_v2)
    # the strict validator rejects every scenario: no augmented condition is answered any more
    cf_targets = calls[calls["node"] == "target"]
    assert not cf_targets["item"].str.startswith("AS").any()
    assert cf_targets["cache_hit"].all()
    assert (source_calls.loc[source_calls["node"] == "target", "item"]
            .str.startswith("AS").any())
