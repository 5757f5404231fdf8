"""Model against model, paired on units: McNemar's exact test, the paired bootstrap and the
family's Holm and Benjamini–Hochberg adjustments. The product code calls statsmodels for the
tests and adjustments, so the reference here is the hand computation; the bootstrap is checked
against scipy's."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests

from biaslab.evaluators.model_comparisons import (BOOTSTRAP, MCNEMAR,
                                                  bootstrap_mean_difference, compare_models)

# -- a worked example, by hand: twelve units, two models, three 0/1 measures ---------------------
#           u01 u02 u03 u04 u05 u06 u07 u08 u09 u10 u11 u12
BIASED_A = [0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 1, 0]
BIASED_B = [1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 1, 0]   # n01 = 6 (A 0, B 1), n10 = 1
REFUSED_A = [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
REFUSED_B = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]  # n01 = 7, n10 = 0
CORRECT_A = [0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
CORRECT_B = [1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]  # n01 = 2, n10 = 2


def _frame() -> pd.DataFrame:
    rows = []
    for field, a, b in (("biased", BIASED_A, BIASED_B), ("refused", REFUSED_A, REFUSED_B),
                        ("correct", CORRECT_A, CORRECT_B),
                        ("thin", [0, 1, 0, 1, 0, 1], [1, 1, 1, 1, 1, 1])):  # 6 units only
        for model, values in (("A", a), ("B", b)):
            rows += [{"field": field, "unit": f"u{i + 1:02d}", "model": model, "value": v}
                     for i, v in enumerate(values)]
    rows.append({"field": "biased", "unit": "u13", "model": "A", "value": 1})  # no B: unpaired
    rows.append({"field": "biased", "unit": "u14", "model": "A", "value": 1})
    rows.append({"field": "biased", "unit": "u14", "model": "B", "value": np.nan})  # unscored
    return pd.DataFrame(rows)


def test_mcnemar_and_both_adjustments_reproduce_a_hand_computed_example():
    out = compare_models(_frame(), value="value", model="model", pair_on=["unit"],
                         by=["field"], models=["A", "B"]).set_index("field")
    biased, refused, correct, thin = (out.loc[f] for f in ("biased", "refused", "correct",
                                                            "thin"))
    # biased: 12 pairs (u13 has no B, u14's B is unscored), means 4/12 and 9/12
    assert (biased["n_pairs"], biased["mean_a"], biased["mean_b"]) == (12, 4 / 12, 9 / 12)
    assert biased["diff"] == pytest.approx(5 / 12, abs=1e-15)
    assert biased["ci_low"] <= 5 / 12 <= biased["ci_high"]
    # McNemar exact: 7 discordant, the smaller side 1: 2 · P[Bin(7, ½) ≤ 1] = 2 · 8/128
    assert biased["test"] == MCNEMAR and biased["p"] == pytest.approx(0.125, abs=1e-15)
    assert refused["p"] == pytest.approx(2 / 128, abs=1e-15)  # 2 · P[Bin(7, ½) = 0]
    assert correct["p"] == 1.0  # 2 · P[Bin(4, ½) ≤ 2] = 22/16, capped at 1
    assert correct["diff"] == 0.0
    for row, a, b in ((biased, BIASED_A, BIASED_B), (refused, REFUSED_A, REFUSED_B),
                      (correct, CORRECT_A, CORRECT_B)):
        table = pd.crosstab(pd.Series(a), pd.Series(b)).reindex(
            index=[0, 1], columns=[0, 1], fill_value=0).to_numpy()
        assert row["p"] == pytest.approx(mcnemar(table, exact=True).pvalue, abs=1e-15)
    # the family: three tests (the thin measure is not one); sorted 1/64, 1/8, 1
    assert math.isnan(thin["p"]) and math.isnan(thin["ci_low"]) and math.isnan(thin["p_holm"])
    assert thin["note"] == "too few pairs (n=6)" and math.isnan(thin["family_size"])
    assert (out.loc[["biased", "refused", "correct"], "family_size"] == 3).all()
    # Holm: 3 · 1/64, 2 · 1/8, 1 · 1
    assert refused["p_holm"] == pytest.approx(3 / 64, abs=1e-15)
    assert biased["p_holm"] == pytest.approx(0.25, abs=1e-15)
    assert correct["p_holm"] == 1.0
    # BH: 1/64 · 3/1, 1/8 · 3/2, 1 · 3/3
    assert refused["p_bh"] == pytest.approx(3 / 64, abs=1e-15)
    assert biased["p_bh"] == pytest.approx(3 / 16, abs=1e-15)
    assert correct["p_bh"] == 1.0
    tested = out.loc[["biased", "refused", "correct"]]
    for method, column in (("holm", "p_holm"), ("fdr_bh", "p_bh")):
        expected = multipletests(tested["p"], method=method)[1]
        np.testing.assert_allclose(tested[column], expected, rtol=0, atol=1e-15)


def test_pairs_follow_the_given_model_order_and_the_difference_is_b_minus_a():
    out = compare_models(_frame(), value="value", model="model", pair_on=["unit"],
                         by=["field"], models=["B", "A"]).set_index("field")
    assert (out["model_a"] == "B").all() and (out["model_b"] == "A").all()
    assert out.loc["biased", "diff"] == pytest.approx(-5 / 12, abs=1e-15)
    assert out.loc["biased", "p"] == pytest.approx(0.125, abs=1e-15)  # symmetric


def test_a_non_binary_measure_gets_the_bootstrap_agreeing_with_scipy():
    """For a mean difference of roughly normal per-unit differences, the percentile bootstrap's
    interval is scipy's percentile bootstrap (up to resampling noise) and its p is the paired t
    test's (up to resampling noise and the bootstrap's small-sample narrowness)."""
    rng = np.random.default_rng(11)
    a = rng.normal(3.0, 1.0, size=300)
    b = a + rng.normal(0.12, 1.0, size=300)
    low, high, p = bootstrap_mean_difference(b - a)
    ref = scipy_stats.bootstrap((b - a,), np.mean, method="percentile", n_resamples=9_999,
                                random_state=0).confidence_interval
    assert low == pytest.approx(ref.low, abs=0.01) and high == pytest.approx(ref.high, abs=0.01)
    t_p = scipy_stats.ttest_rel(b, a).pvalue
    assert 0.001 < t_p < 0.2  # the example sits where the two tests can be told apart
    assert p == pytest.approx(t_p, rel=0.1)
    # p < 0.05 exactly when the 95% interval excludes 0
    assert (p < 0.05) == (low > 0 or high < 0)
    # the same seed writes the same numbers
    assert bootstrap_mean_difference(b - a) == (low, high, p)

    frame = pd.DataFrame({"unit": [*range(300)] * 2, "model": ["A"] * 300 + ["B"] * 300,
                          "value": [*a, *b]})
    row = compare_models(frame, value="value", model="model", pair_on=["unit"], by=[]).iloc[0]
    assert row["test"] == BOOTSTRAP and (row["ci_low"], row["ci_high"], row["p"]) == (low, high, p)
    assert row["family_size"] == 1 and row["p_holm"] == row["p_bh"] == p


def test_identical_models_differ_by_nothing_and_a_constant_shift_is_not_zero():
    d = np.zeros(20)
    assert bootstrap_mean_difference(d) == (0.0, 0.0, 1.0)
    low, high, p = bootstrap_mean_difference(d + 0.5)
    assert (low, high) == (0.5, 0.5) and p == pytest.approx(2 / 10_000)
