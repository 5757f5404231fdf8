"""The judge configurations and the sensitivity band, on votes and rows written out by hand."""

from __future__ import annotations

import math

import pandas as pd

from biaslab.evaluators.judge_sensitivity import (Vote, configurations, sensitivity_bands,
                                                  strict_majority_answer)

BIASED, FAIR, NONE = Vote("BIASED", "biased"), Vote("FAIR", "fair"), Vote(None, None)


def test_the_configurations_of_a_panel():
    names = [c.name for c in configurations(["a", "b", "c"])]
    assert names == ["recorded", "only:a", "only:b", "only:c", "drop:a", "drop:b", "drop:c",
                     "majority", "unanimous"]
    # two members: dropping one leaves the other, which only:<other> already is
    assert [c.name for c in configurations(["a", "b"])] == [
        "recorded", "only:a", "only:b", "majority", "unanimous"]


def test_each_rule_on_one_slot():
    by_name = {c.name: c for c in configurations(["a", "b", "c"])}
    votes = {"a": BIASED, "b": BIASED, "c": FAIR}
    assert by_name["recorded"].answer(votes) is None  # each node keeps its own answer
    assert by_name["only:c"].answer(votes) == FAIR
    assert by_name["drop:c"].answer(votes) == BIASED     # a and b agree
    assert by_name["drop:a"].answer(votes) == NONE       # b and c: a tie, no verdict
    assert by_name["majority"].answer(votes) == BIASED   # 2 of 3
    assert by_name["unanimous"].answer(votes) == NONE
    assert by_name["unanimous"].answer({"a": FAIR, "b": FAIR, "c": FAIR}) == FAIR


def test_a_strict_majority_counts_unparsed_votes():
    assert strict_majority_answer([BIASED, NONE, FAIR]) == NONE      # 1 of 3 is no majority
    assert strict_majority_answer([BIASED, BIASED, NONE]) == BIASED  # 2 of 3
    assert strict_majority_answer([BIASED, NONE]) == NONE            # 1 of 2
    assert strict_majority_answer([BIASED, FAIR, FAIR, BIASED]) == NONE  # 2 of 4: a tie
    assert strict_majority_answer([]) == NONE


def test_numeric_verdicts_take_the_median_member():
    p = [Vote(f"FINAL: {x}", x) for x in (0.2, 0.9, 0.7)]
    assert strict_majority_answer(p) == p[2]                             # median 0.7
    assert strict_majority_answer(p[:2]) == p[0]                         # lower median
    assert strict_majority_answer([p[0], NONE, NONE]) == NONE            # 1 of 3 answered


def _long(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["table", "row", "configuration", "value", "ci_low",
                                       "ci_high", "p"])


def test_band_sign_and_significance_flips():
    nan = math.nan
    long = _long([
        # row 1: p decides significance; only:b turns the sign, drop:a loses significance
        ("t", "r1", "recorded", 0.30, 0.1, 0.5, 0.01),
        ("t", "r1", "only:b", -0.10, -0.3, 0.1, 0.40),
        ("t", "r1", "drop:a", 0.20, -0.01, 0.41, 0.06),
        ("t", "r1", "majority", 0.30, 0.1, 0.5, 0.01),
        # row 2: no p column value, the CI decides; one configuration gave no value
        ("t", "r2", "recorded", 0.10, -0.05, 0.25, nan),
        ("t", "r2", "only:b", 0.40, 0.20, 0.60, nan),
        ("t", "r2", "drop:a", nan, nan, nan, nan),
        # row 3: a zero is no sign, so 0 against + is no flip
        ("t", "r3", "recorded", 0.0, nan, nan, nan),
        ("t", "r3", "only:b", 0.2, nan, nan, nan),
    ])
    bands = sensitivity_bands(long).set_index("row")
    r1 = bands.loc["r1"]
    assert (r1.recorded, r1.band_low, r1.band_high, r1.n_configurations) == (0.3, -0.1, 0.3, 4)
    assert r1.sign_flips and r1.significance_flips and r1.recorded_significant
    assert r1.flipped_by == "only:b drop:a"
    r2 = bands.loc["r2"]
    assert (r2.band_low, r2.band_high, r2.n_configurations) == (0.1, 0.4, 2)
    assert not r2.sign_flips and r2.significance_flips and r2.flipped_by == "only:b"
    r3 = bands.loc["r3"]
    assert not r3.sign_flips and not r3.significance_flips and r3.flipped_by == ""
    assert r3.recorded_significant is None
