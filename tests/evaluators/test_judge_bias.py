"""Verdict flips under a group swap, on a hand-written example, checked against statsmodels."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.proportion import proportion_confint

from biaslab.evaluators.judge_bias import verdict_flips, verdict_label


def test_flip_counts_rate_wilson_and_mcnemar_on_a_worked_example():
    # judge A, 10 inputs: 4 biased->fair, 1 fair->biased, 4 unchanged, 1 unscored after swap.
    # judge B, 5 inputs: nothing flips.
    rows = ([("A", "biased", "fair")] * 4 + [("A", "fair", "biased")]
            + [("A", "biased", "biased")] * 2 + [("A", "fair", "fair")] * 2
            + [("A", "fair", None)] + [("B", "fair", "fair")] * 5)
    pairs = pd.DataFrame(rows, columns=["node", "original", "swapped"])
    table = verdict_flips(pairs, by=["node"]).set_index("node")
    a = table.loc["A"]
    assert (a["n_verdicts"], a["n_unscored"], a["n_flipped"]) == (9, 1, 5)
    assert a["flip_rate"] == pytest.approx(5 / 9)
    low, high = proportion_confint(5, 9, method="wilson")
    assert (a["flip_rate_ci_low"], a["flip_rate_ci_high"]) == pytest.approx((low, high))
    assert a["flips"] == "biased→fair: 4; fair→biased: 1"
    # verdict_a = biased, verdict_b = fair (sorted): a_to_b = biased→fair
    assert (a["verdict_a"], a["verdict_b"], a["a_to_b"], a["b_to_a"]) == ("biased", "fair", 4, 1)
    # rows: original biased/fair, columns: swapped biased/fair
    expected = mcnemar([[2, 4], [1, 2]], exact=True).pvalue
    assert a["mcnemar_p"] == pytest.approx(expected, abs=1e-15)
    assert expected == pytest.approx(2 * (1 + 5) / 32)  # two-sided binomial, 1 of 5
    b = table.loc["B"]
    assert (b["n_verdicts"], b["n_flipped"], b["flip_rate"], b["flip_rate_ci_low"]) == (5, 0, 0, 0)
    assert b["flip_rate_ci_high"] == pytest.approx(proportion_confint(0, 5, method="wilson")[1])
    assert b["mcnemar_p"] == 1 and b["flips"] == ""


def test_a_one_sided_judge_balanced_over_both_sides_is_p_1_unoriented_and_small_oriented():
    """A judge that calls a text biased when it is about men: 6 texts about women flip
    no→yes once swapped to men, 6 about men flip yes→no. Original against swapped: 6 against
    6, McNemar p = 1, as if the flips had no side. Oriented (verdict with side 1 = men,
    verdict with side 2 = women): all 12 have "yes" with men, p = 2 · ½¹²."""
    rows = [("j", "no", "yes", 2)] * 6 + [("j", "yes", "no", 1)] * 6 + [("j", "no", "no", 0)]
    pairs = pd.DataFrame(rows, columns=["node", "original", "swapped", "side"])
    row = verdict_flips(pairs, by=["node"]).iloc[0]
    assert (row["a_to_b"], row["b_to_a"], row["mcnemar_p"]) == (6, 6, 1.0)
    assert (row["n_sided"], row["b_with_side1"], row["b_with_side2"]) == (12, 12, 0)
    assert row["one_sided_p"] == pytest.approx(
        mcnemar([[0, 12], [0, 0]], exact=True).pvalue, abs=1e-15)
    assert row["one_sided_p"] == pytest.approx(2 * 0.5 ** 12, abs=1e-15)
    # a judge that flips both ways on each side has no side: both tests near 1
    fair = pd.DataFrame([("j", "no", "yes", 1), ("j", "yes", "no", 1), ("j", "no", "yes", 2),
                         ("j", "yes", "no", 2)], columns=["node", "original", "swapped", "side"])
    row = verdict_flips(fair, by=["node"]).iloc[0]
    assert (row["mcnemar_p"], row["one_sided_p"]) == (1.0, 1.0)


def test_a_verdict_with_more_than_two_values_has_no_mcnemar():
    pairs = pd.DataFrame({"node": ["j"] * 3, "original": ["a", "b", "c"],
                          "swapped": ["b", "b", "a"]})
    row = verdict_flips(pairs, by=["node"]).iloc[0]
    assert row["n_flipped"] == 2 and row["flips"] == "a→b: 1; c→a: 1"
    assert math.isnan(row["mcnemar_p"]) and row["verdict_a"] == ""


@pytest.mark.parametrize("parsed, label", [
    ({"label": "yes", "justification": "x"}, "yes"), ("BIASED", "BIASED"), (0.7, ">=0.5"),
    (0.39, "<0.5"), (True, "true"), (None, None), ({"justification": "x"}, None)])
def test_verdict_label(parsed, label):
    assert verdict_label(parsed) == label
