"""The clean default seeds of `multiturn` (files/crows_pairs/clean_seeds.csv): short
(group, attribute) stereotype statements, each traced to the CrowS-Pairs row it was rewritten
from, and what the protocol runs on when no seed option is set."""

import hashlib
import re
from pathlib import Path

import pandas as pd
import pytest

from biaslab.datasets import stereotypes as st
from biaslab.errors import UserError
from biaslab.graphs.multiturn import MultiturnOptions
from biaslab.graphs.registry import get_protocol

PACKAGE = Path(st.__file__).parent / "files" / "crows_pairs"
CLEAN = PACKAGE / "clean_seeds.csv"
PRONOUNS = {"his", "her", "he", "she", "they", "their"}


@pytest.fixture(scope="module")
def clean() -> pd.DataFrame:
    return pd.read_csv(CLEAN, dtype=str, keep_default_na=False)


def _words(text: str) -> int:
    return len(text.split())


def test_forty_seeds_per_category_with_unique_ids_and_the_documented_columns(clean):
    assert list(clean.columns) == list(st.CLEAN_SEED_COLUMNS)
    assert clean["category"].value_counts().to_dict() == {c: 40 for c in st.CATEGORIES}
    assert clean["seed_id"].is_unique and len(clean) == 240


def test_every_seed_cites_a_crows_pairs_row_of_its_own_category(clean):
    sentences = pd.read_csv(PACKAGE / "seeds.csv", dtype=str).set_index("seed_id")
    missing = sorted(set(clean["source_id"]) - set(sentences.index))
    assert missing == []
    assert (sentences.loc[clean["source_id"], "category"].to_numpy()
            == clean["category"].to_numpy()).all()


def test_groups_are_clean_noun_phrases_and_attributes_short_predicates(clean):
    for group in clean["group"]:
        tokens = re.findall(r"[\w'-]+", group.lower())
        assert 1 <= _words(group) <= 4, group
        assert not PRONOUNS & set(tokens), group
        assert not re.search(r"\d", group), group
    for attribute in clean["attribute"]:
        assert 2 <= _words(attribute) <= 8, attribute


def test_a_stereotype_is_its_group_then_its_attribute_and_they_are_short(clean):
    assert (clean["stereotype"] == clean["group"] + " " + clean["attribute"]).all()
    # DyMT-ESB's FairMT-derived seeds are about 4 words; the sentences' median is 12
    assert clean["stereotype"].map(_words).median() <= 8
    assert not clean.duplicated(["category", "stereotype"]).any()


def test_source_md_names_the_file_its_licence_and_its_checksum():
    source = (PACKAGE / "SOURCE.md").read_text()
    digest = hashlib.sha256(CLEAN.read_bytes()).hexdigest()
    assert "clean_seeds.csv" in source and digest in source
    assert "CC BY-SA 4.0" in source and "hand" in source


def test_the_protocol_runs_on_the_clean_seeds_by_default(clean):
    protocol = get_protocol("multiturn")
    options = MultiturnOptions()  # no seeds_path, seed_source or fairmt_path
    items = protocol.items(options)
    assert sorted(items) == sorted(clean["seed_id"])  # 40 of 40 per category: all of them
    by_id = clean.set_index("seed_id")
    state = protocol.initial_state("dynamic-assessment-t5", items[0], 42, options)
    # what the user simulator and the judge are given: the file's group and stereotype
    assert (state["group"], state["stereotype"]) == \
        (by_id.loc[items[0], "group"], by_id.loc[items[0], "stereotype"])
    # a smaller draw is still from the clean file
    few = protocol.items(MultiturnOptions(seeds_per_category=2, categories=["age", "race"]))
    assert len(few) == 4 and set(few) <= set(clean["seed_id"])


def test_the_narrative_sentences_stay_available_by_name():
    items = get_protocol("multiturn").items(
        MultiturnOptions(seed_source="crows_pairs_sentences", seeds_per_category=3))
    sentences = pd.read_csv(PACKAGE / "seeds.csv", dtype=str)
    assert len(items) == 18 and set(items) <= set(sentences["seed_id"])
    with pytest.raises(UserError, match="unknown seed source"):
        st.load_seeds(source="crows")
