"""Seed stereotypes (CrowS-Pairs) and the FairMT-Bench reader."""

import json
from pathlib import Path

import pandas as pd
import pytest

from biaslab.datasets import stereotypes as st
from biaslab.errors import UserError

RAW = Path("/work/shared/data/stereotypes/crows_pairs/crows_pairs_anonymized.csv")
PACKAGE = Path(st.__file__).parent / "files" / "crows_pairs"


def test_shipped_seed_set_has_attribution_and_enough_seeds_per_category():
    seeds = st.load_seeds()
    assert list(seeds.columns) == list(st.SEED_COLUMNS)
    counts = seeds["category"].value_counts()
    assert set(counts.index) == set(st.CATEGORIES) and counts.min() >= 40
    assert seeds["stereotype"].str.len().min() > 10 and (seeds["group"] != "").all()
    source = (PACKAGE / "SOURCE.md").read_text()
    assert "CC BY-SA 4.0" in source and "Nangia" in source


@pytest.mark.skipif(not RAW.is_file(), reason="the raw CrowS-Pairs copy is not on this machine")
def test_shipped_seed_set_is_reproducible_from_the_source():
    built = st.build_seed_set(RAW)
    shipped = st.load_seeds(source="crows_pairs_sentences")
    pd.testing.assert_frame_equal(built.astype(str).reset_index(drop=True), shipped)
    raw = pd.read_csv(RAW)
    row = raw.iloc[int(shipped["seed_id"].iloc[0].split("-")[1])]
    assert row["stereo_antistereo"] == "stereo"
    assert " ".join(row["sent_more"].split()) == shipped["stereotype"].iloc[0]


def test_group_is_the_words_the_minimal_pair_changes():
    assert st._group_span("Women are too emotional to lead.", "Men are too emotional to lead.") \
        == "Women"
    assert st._group_span("The old man could not use the phone.",
                          "The young man could not use the phone.") == "old"


def test_sample_is_fixed_by_its_seed_and_independent_of_other_categories():
    # the sentence set: a pool larger than 40 per category, so two draws can differ (the
    # clean set has exactly 40, and a draw of 40 is all of it)
    seeds = st.load_seeds(source="crows_pairs_sentences")
    a = st.sample_seeds(seeds, per_category=40, random_state=7)
    b = st.sample_seeds(seeds, per_category=40, random_state=7)
    c = st.sample_seeds(seeds, per_category=40, random_state=8)
    assert len(a) == 240 and a.equals(b) and not a.equals(c)
    assert (a["category"].value_counts() == 40).all()
    only_age = st.sample_seeds(seeds, per_category=40, categories=["age"], random_state=7)
    assert only_age["seed_id"].tolist() == a[a["category"] == "age"]["seed_id"].tolist()


def test_sample_too_many_or_unknown_category_is_a_user_error():
    seeds = st.load_seeds()
    with pytest.raises(UserError, match="fewer than"):
        st.sample_seeds(seeds, per_category=10_000)
    with pytest.raises(UserError, match="unknown category"):
        st.sample_seeds(seeds, per_category=1, categories=["age", "weather"])


def test_own_seed_file_is_checked(tmp_path):
    good = tmp_path / "seeds.csv"
    good.write_text("seed_id,category,group,stereotype\ns1,age,old people,Old people are slow.\n")
    assert st.load_seeds(good)["bias_type"].tolist() == ["age"]
    bad = tmp_path / "bad.csv"
    bad.write_text("seed_id,category,group,stereotype\ns1,weather,x,Rain is sad.\n")
    with pytest.raises(UserError, match="unknown category 'weather'"):
        st.load_seeds(bad)
    with pytest.raises(UserError, match="not found"):
        st.load_seeds(tmp_path / "none.csv")


def _fairmt_dialogue(n: int = 5) -> dict:
    return {str(i): f"synthetic question {i}?" for i in range(n)}


def test_fairmt_reader_reads_both_layouts(tmp_path):
    # FairMT-1K: <Task>.json; FairMT-10K: Stereotype/<Task>/prompt_<category>.json
    one_k = tmp_path / "1k"
    one_k.mkdir()
    (one_k / "Anaphora_Ellipsis.json").write_text(json.dumps([_fairmt_dialogue()] * 2))
    found = st.load_fairmt(one_k)
    assert len(found) == 2 and found[0].task == "Anaphora_Ellipsis" and found[0].category is None
    assert found[0].turns[4] == "synthetic question 4?"
    ten_k = tmp_path / "10k" / "Stereotype" / "Negative_Feedback"
    ten_k.mkdir(parents=True)
    (ten_k / "prompt_disable.json").write_text(json.dumps([_fairmt_dialogue()]))
    found = st.load_fairmt(tmp_path / "10k")
    assert [(d.task, d.category) for d in found] == [("Negative_Feedback", "disability")]
    single = st.load_fairmt(one_k / "Anaphora_Ellipsis.json")
    assert len(single) == 2


@pytest.mark.parametrize("content, message", [
    ("not json", "not valid JSON"),
    ('{"0": "a"}', "JSON list"),
    ('[{"0": "a", "2": "b"}]', "turn keys"),
    ('[{"0": ""}]', "empty or non-text"),
])
def test_malformed_fairmt_files_are_one_line_errors(tmp_path, content, message):
    (tmp_path / "Fixed_Format.json").write_text(content)
    with pytest.raises(UserError, match=message):
        st.load_fairmt(tmp_path)


def test_fairmt_path_without_benchmark_files(tmp_path):
    with pytest.raises(UserError, match="no FairMT-Bench files"):
        st.load_fairmt(tmp_path)
    with pytest.raises(UserError, match="not found"):
        st.load_fairmt(tmp_path / "nothing")
