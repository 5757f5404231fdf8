"""Stand-in people are rejected by what they are, not by a list of spellings (issue 44): a
person named only by position, letter, number, slot or a placeholder name; real names and
groups pass. Through the CLI, a generator that writes such people is stopped at the
transform, counted in ``rule_rejections.csv`` and never exported."""

import json
import re

import pandas as pd
import pytest

from biaslab.cli import main
from biaslab.graphs.augmentation_checks import placeholder_person, variant_failures
from biaslab.graphs.augmentation_synthetic import STAND_INS
from support_runs import AUGMENTATION_GENERATORS, bound_nodes

STAND_IN_TABLE = [
    # by position
    "the first individual", "the second individual", "the first person", "The second person",
    "the former", "the latter", "the other one", "the 2nd participant", "the last speaker",
    # by letter
    "Person A", "person B", "Mr. X", "Ms. Y", "Dr. A", "Candidate B", "X",
    # by number
    "Speaker 2", "Group 3", "Individual 2", "Participant #4", "Respondent 12", "person one",
    # slots
    "[NAME]", "[Person 1]", "{NAME}", "NAME1", "GROUP",
    # generic placeholder names
    "Jane Doe", "John Doe", "Joe Bloggs", "John Q. Public",
    # nothing but generic words
    "someone", "the other person", "another group", "an individual", "the people",
]
REAL_PEOPLE = [
    "grandfather", "Japanese man", "78-year-old", "person in a wheelchair", "Swiss",
    "the man I met", "Muslim woman", "Zoroastrian", "Jain", "Andorran", "the first man",
    "Generation X", "Gen Z", "Mr. Nguyen", "Dr. Patel", "Type 2 diabetic", "the older woman",
    "a person who uses a wheelchair", "the Christian", "gay man", "Latino", "Native American",
    "the poor person", "the other woman", "first-generation immigrant", "transgender woman",
    "Mary", "John", "Doe-eyed teenager", "the new mother", "group of nurses",
]


@pytest.mark.parametrize("description", STAND_IN_TABLE)
def test_stand_ins_are_rejected(description):
    assert placeholder_person(description)


@pytest.mark.parametrize("description", REAL_PEOPLE)
def test_real_people_and_groups_pass(description):
    assert not placeholder_person(description)


def test_a_stand_in_is_rejected_as_a_new_person_of_a_variant():
    text = "I saw the first individual and the grandfather outside the Walmart."
    assert variant_failures(text, ("the first individual", "grandfather")) == \
        ["placeholder_person"]
    text = "Mr. Nguyen and the grandfather met outside the Walmart."
    assert variant_failures(text, ("Mr. Nguyen", "grandfather")) == []


SPEC = """
name = "aug-standins"
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
""" + bound_nodes("scripted:augmentation-standins", AUGMENTATION_GENERATORS)


def test_cli_stand_ins_are_rejected_counted_and_never_exported(tmp_path):
    spec = tmp_path / "standins.toml"
    spec.write_text(SPEC)
    run = tmp_path / "run"
    assert main(["run", str(spec), "--out", str(run), "--quiet", "--no-report"]) == 0
    assert main(["report", str(run), "--no-figures"]) == 0

    scenes = [json.loads(x) for x in (run / "augmented.jsonl").read_text().splitlines()]
    assert len(scenes) == 6 * 3
    for s in scenes:
        if s["variant"] in (0, 1):
            assert s["stopped_at"] == "transform" and not s["passed"]
            assert "transform:placeholder_person" in s["failed_checks"]
        else:
            assert s["passed"], s["failed_checks"]
    rejected = pd.read_csv(run / "tables" / "rule_rejections.csv")
    counts = {(r.step, r.check): r.n_rejected for r in rejected.itertuples()}
    assert counts[("transform", "placeholder_person")] == 12

    out = tmp_path / "bbq"
    assert main(["export", str(run), "--format", "bbq", "--out", str(out)]) == 0
    exported = [json.loads(line) for path in out.glob("*.jsonl")
                for line in path.read_text().splitlines() if line.strip()]
    assert exported
    for record in exported:
        text = json.dumps(record)
        assert not [s for s in STAND_INS if re.search(rf"\b{re.escape(s)}\b", text)], \
            record["context"]
