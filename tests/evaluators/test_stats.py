"""Tests for biaslab.evaluators.stats against reference implementations and published values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from sklearn.metrics import cohen_kappa_score
from statsmodels.stats.inter_rater import fleiss_kappa as sm_fleiss_kappa
from statsmodels.stats.proportion import proportions_ztest

from biaslab.evaluators.stats import (
    BootstrapResult,
    ZTestResult,
    bootstrap,
    cohens_kappa,
    fleiss_kappa,
    fleiss_kappa_from_counts,
    gwet_ac1,
    gwet_ac1_from_counts,
    paired_bootstrap,
    two_proportion_ztest,
)

# ------------------------------------------------------------------------ bootstrap


def test_bootstrap_mean_matches_analytic_normal_ci():
    rng = np.random.default_rng(123)
    x = rng.normal(loc=3.0, scale=2.0, size=2000)
    se = x.std(ddof=1) / math.sqrt(len(x))

    res = bootstrap(np.mean, x, random_state=7)

    assert res.estimate == pytest.approx(x.mean())
    # Bootstrap SE of the mean is s*sqrt((n-1)/n)/sqrt(n); Monte Carlo error on 10k resamples ~0.7%.
    assert res.std == pytest.approx(se, rel=0.03)
    assert res.mean == pytest.approx(x.mean(), abs=0.05 * se)
    # Percentile quantiles carry ~0.03 se of Monte Carlo error; allow 0.1 se.
    assert res.ci_low == pytest.approx(x.mean() - 1.96 * se, abs=0.1 * se)
    assert res.ci_high == pytest.approx(x.mean() + 1.96 * se, abs=0.1 * se)
    assert res.n_resamples == 10_000 and res.confidence == 0.95 and res.n_dropped == 0


def test_bootstrap_confidence_level_narrows_interval():
    x = np.random.default_rng(1).normal(size=300)
    wide = bootstrap(np.mean, x, confidence=0.99, random_state=0)
    narrow = bootstrap(np.mean, x, confidence=0.80, random_state=0)
    assert wide.ci_low < narrow.ci_low < narrow.ci_high < wide.ci_high


def test_bootstrap_is_deterministic_per_random_state():
    x = np.random.default_rng(5).exponential(size=200)
    a = bootstrap(np.median, x, n_resamples=2000, random_state=11)
    b = bootstrap(np.median, x, n_resamples=2000, random_state=11)
    c = bootstrap(np.median, x, n_resamples=2000, random_state=12)
    assert a == b
    assert (a.mean, a.std, a.ci_low, a.ci_high) != (c.mean, c.std, c.ci_low, c.ci_high)
    # A Generator is accepted and consumed: same seed -> same result as the int seed.
    g = bootstrap(np.median, x, n_resamples=2000, random_state=np.random.default_rng(11))
    assert g == a


def test_paired_bootstrap_preserves_pairing():
    rng = np.random.default_rng(3)
    b = rng.normal(size=500)
    a = b + 0.25  # every pair differs by exactly the same amount
    res = paired_bootstrap(lambda u, v: np.mean(u - v), a, b, random_state=0)
    assert res.estimate == pytest.approx(0.25)
    # Up to float rounding the difference is constant, so every resample gives 0.25.
    assert res.std < 1e-12
    assert res.ci_low == pytest.approx(0.25) and res.ci_high == pytest.approx(0.25)
    # Whereas each margin on its own varies across resamples.
    assert bootstrap(np.mean, a, random_state=0).std > 0.01


def test_paired_bootstrap_with_group_labels_and_2d_items():
    # (clean_pred, exposed_pred, group): flip rate of group "x" minus that of group "y".
    rng = np.random.default_rng(9)
    n = 400
    clean = rng.integers(0, 2, n)
    group = np.where(rng.random(n) < 0.5, "x", "y")
    flip_p = np.where(group == "x", 0.3, 0.1)
    exposed = np.where(rng.random(n) < flip_p, 1 - clean, clean)

    def flip_gap(c, e, g):
        flips = c != e
        return flips[g == "x"].mean() - flips[g == "y"].mean()

    res = paired_bootstrap(flip_gap, clean, exposed, group, random_state=0)
    assert res.estimate == pytest.approx(flip_gap(clean, exposed, group))
    assert res.excludes(0.0)

    # 2-D arrays are resampled along axis 0 (rows are items).
    pairs = np.stack([clean, exposed], axis=1)
    res2 = bootstrap(lambda m, g: flip_gap(m[:, 0], m[:, 1], g), pairs, group, random_state=0)
    assert res2 == res


def test_bootstrap_matches_scipy_percentile_paired():
    rng = np.random.default_rng(2024)
    b = rng.normal(size=150)
    a = 0.5 * b + rng.normal(loc=0.3, size=150)

    ours = paired_bootstrap(lambda u, v: np.mean(u - v), a, b, random_state=1)
    ref = scipy.stats.bootstrap(
        (a, b),
        lambda u, v, axis=-1: np.mean(u - v, axis=axis),
        paired=True,
        vectorized=True,
        method="percentile",
        n_resamples=10_000,
        confidence_level=0.95,
        rng=np.random.default_rng(2),
    )
    # Two independent Monte Carlo runs: each 2.5%/97.5% quantile has error ~0.03 SE,
    # so 0.15 SE is a ~4-sigma tolerance on their difference.
    se = ref.standard_error
    assert ours.std == pytest.approx(se, rel=0.05)
    assert ours.ci_low == pytest.approx(ref.confidence_interval.low, abs=0.15 * se)
    assert ours.ci_high == pytest.approx(ref.confidence_interval.high, abs=0.15 * se)


def test_bootstrap_drops_nan_resamples():
    # With 3 items, a resample misses item 0 with probability (2/3)^3 ~ 0.30.
    values = np.array([1.0, 2.0, 3.0])
    flags = np.array([True, False, False])

    def mean_of_flagged(v, f):
        return v[f].mean() if f.any() else float("nan")

    res = bootstrap(mean_of_flagged, values, flags, n_resamples=2000, random_state=0)
    assert 0.2 * 2000 < res.n_dropped < 0.4 * 2000
    assert res.mean == pytest.approx(1.0) and res.std == pytest.approx(0.0)


def test_bootstrap_all_nan_raises():
    with pytest.raises(ValueError, match="finite"):
        bootstrap(lambda x: float("nan"), [1.0, 2.0], n_resamples=10, random_state=0)


@pytest.mark.parametrize("fn", [bootstrap, paired_bootstrap])
def test_mismatched_lengths_raise(fn):
    with pytest.raises(ValueError, match=r"same length.*\[3, 2\]"):
        fn(lambda a, b: 0.0, [1, 2, 3], [1, 2])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_resamples": 1}, "n_resamples"),
        ({"n_resamples": 10.0}, "n_resamples"),
        ({"confidence": 1.0}, "confidence"),
        ({"confidence": 0.0}, "confidence"),
        ({"random_state": "seed"}, "random_state"),
        ({"random_state": True}, "random_state"),
    ],
)
def test_bootstrap_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bootstrap(np.mean, [1.0, 2.0, 3.0], **kwargs)


def test_bootstrap_rejects_empty_input():
    with pytest.raises(ValueError, match="at least one"):
        bootstrap(np.mean)
    with pytest.raises(ValueError, match="length 0"):
        bootstrap(np.mean, [])


def test_excludes():
    r = BootstrapResult(estimate=0.5, mean=0.5, std=0.1, ci_low=0.2, ci_high=0.8,
                        n_resamples=100, confidence=0.95)
    assert r.excludes() and r.excludes(0.1) and r.excludes(0.81)
    assert not r.excludes(0.2) and not r.excludes(0.5) and not r.excludes(0.8)


# -------------------------------------------------------------------------- z test


@pytest.mark.parametrize(
    "sa, na, sb, nb",
    [(5, 20, 10, 25), (45, 100, 30, 100), (0, 50, 3, 40), (999, 1000, 990, 1000), (7, 7, 3, 9)],
)
@pytest.mark.parametrize("alternative", ["two-sided", "larger", "smaller"])
def test_ztest_matches_statsmodels(sa, na, sb, nb, alternative):
    res = two_proportion_ztest(sa, na, sb, nb, alternative=alternative)
    z_ref, p_ref = proportions_ztest([sa, sb], [na, nb], alternative=alternative)
    assert isinstance(res, ZTestResult)
    assert res.z == pytest.approx(z_ref, rel=1e-12)
    assert res.p_value == pytest.approx(p_ref, rel=1e-9)
    assert res.diff == pytest.approx(sa / na - sb / nb)


def test_ztest_random_against_statsmodels():
    rng = np.random.default_rng(42)
    for _ in range(50):
        na, nb = rng.integers(5, 500, size=2)
        sa, sb = rng.integers(1, na), rng.integers(1, nb)
        res = two_proportion_ztest(int(sa), int(na), int(sb), int(nb))
        z_ref, p_ref = proportions_ztest([sa, sb], [na, nb])
        assert res.z == pytest.approx(z_ref, rel=1e-12)
        assert res.p_value == pytest.approx(p_ref, rel=1e-9, abs=1e-300)


def test_ztest_degenerate_is_nan():
    res = two_proportion_ztest(0, 20, 0, 30)
    assert math.isnan(res.z) and math.isnan(res.p_value) and res.diff == 0.0


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((5, 0, 1, 10), {}, "n_a"),
        ((11, 10, 1, 10), {}, "successes_a"),
        ((1, 10, -1, 10), {}, "successes_b"),
        ((1.5, 10, 1, 10), {}, "successes_a"),
        ((1, 10, 1, 10), {"alternative": "greater"}, "alternative"),
    ],
)
def test_ztest_rejects_bad_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        two_proportion_ztest(*args, **kwargs)


# ---------------------------------------------------------------------- Cohen's kappa


def test_cohens_kappa_matches_sklearn_random():
    rng = np.random.default_rng(0)
    for n_cat in (2, 3, 5):
        for _ in range(10):
            a = rng.integers(0, n_cat, 80)
            # Correlated second rater: copies a 60% of the time.
            b = np.where(rng.random(80) < 0.6, a, rng.integers(0, n_cat, 80))
            assert cohens_kappa(a, b) == pytest.approx(cohen_kappa_score(a, b), abs=1e-12)


def test_cohens_kappa_string_labels_and_extremes():
    a = ["bias", "none", "bias", "unsure", "none", "bias"]
    b = ["bias", "none", "none", "unsure", "none", "bias"]
    assert cohens_kappa(a, b) == pytest.approx(cohen_kappa_score(a, b))
    assert cohens_kappa(a, a) == pytest.approx(1.0)
    assert cohens_kappa([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert math.isnan(cohens_kappa(["x"] * 4, ["x"] * 4))


def test_cohens_kappa_label_types_are_not_coerced():
    # An int rater and a str rater share no labels; numpy stacking would have turned 1 into "1".
    assert cohens_kappa(np.array([1, 0, 1, 0]), np.array(["1", "0", "1", "0"])) < 0.5
    assert cohens_kappa([1, 0, 1, 0], ["1", "0", "1", "0"]) < 0.5
    # Typed arrays and object lists give the same answer.
    a, b = ["x", "y", "x", "z", "x"], ["x", "y", "y", "z", "x"]
    assert cohens_kappa(np.array(a), np.array(b)) == pytest.approx(cohens_kappa(a, b))
    assert cohens_kappa(np.array(a, dtype=object), b) == pytest.approx(cohens_kappa(a, b))


def test_bootstrap_of_kappa_ci_contains_estimate():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 3, 500)
    b = np.where(rng.random(500) < 0.7, a, rng.integers(0, 3, 500))
    res = paired_bootstrap(cohens_kappa, a, b, n_resamples=2000, random_state=0)
    assert res.ci_low < cohens_kappa(a, b) < res.ci_high


def test_cohens_kappa_rejects_bad_input():
    with pytest.raises(ValueError, match="same length"):
        cohens_kappa([1, 2], [1])
    with pytest.raises(ValueError, match="missing"):
        cohens_kappa([1, None], [1, 2])
    with pytest.raises(ValueError, match="missing"):
        cohens_kappa(np.array([1.0, np.nan]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="1-D"):
        cohens_kappa([[1, 2]], [[1, 2]])


# ---------------------------------------------------------------------- Fleiss' kappa

# Fleiss (1971) worked example as reproduced in Wikipedia "Fleiss' kappa": 10 items,
# 14 raters, 5 categories; P_bar = 0.378, P_e = 0.213, kappa = 0.210.
FLEISS_1971 = np.array([
    [0, 0, 0, 0, 14],
    [0, 2, 6, 4, 2],
    [0, 0, 3, 5, 6],
    [0, 3, 9, 2, 0],
    [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0],
    [3, 2, 6, 3, 0],
    [2, 5, 3, 2, 2],
    [6, 5, 2, 1, 0],
    [0, 2, 2, 3, 7],
])


def _counts_to_ratings(table: np.ndarray) -> np.ndarray:
    return np.array([np.repeat(np.arange(table.shape[1]), row) for row in table])


def test_fleiss_kappa_published_example():
    assert fleiss_kappa_from_counts(FLEISS_1971) == pytest.approx(0.210, abs=0.0005)
    assert fleiss_kappa_from_counts(FLEISS_1971) == pytest.approx(sm_fleiss_kappa(FLEISS_1971), abs=1e-12)
    # Same data as raw labels; rater order within an item must not matter.
    ratings = _counts_to_ratings(FLEISS_1971)
    shuffled = np.random.default_rng(0).permuted(ratings, axis=1)
    assert fleiss_kappa(shuffled) == pytest.approx(0.210, abs=0.0005)


def test_fleiss_kappa_matches_statsmodels_random():
    rng = np.random.default_rng(7)
    labels = np.array(["neg", "neu", "pos"], dtype=object)
    for _ in range(20):
        n_items, n_raters = rng.integers(5, 60), rng.integers(2, 8)
        truth = rng.integers(0, 3, n_items)
        noisy = np.where(rng.random((n_items, n_raters)) < 0.7, truth[:, None],
                         rng.integers(0, 3, (n_items, n_raters)))
        ratings = labels[noisy]
        table = np.stack([(noisy == k).sum(axis=1) for k in range(3)], axis=1)
        assert fleiss_kappa(ratings) == pytest.approx(sm_fleiss_kappa(table), abs=1e-12)


def test_fleiss_kappa_rejects_bad_input():
    with pytest.raises(ValueError, match="same number of raters"):
        fleiss_kappa_from_counts([[2, 0], [1, 2]])
    with pytest.raises(ValueError, match="2-D"):
        fleiss_kappa([1, 2, 3])
    with pytest.raises(ValueError, match="2 raters"):
        fleiss_kappa([[1], [2]])
    with pytest.raises(ValueError, match="non-negative integer"):
        fleiss_kappa_from_counts([[2.5, 0.5], [1, 2]])


# ------------------------------------------------------------------------ Gwet's AC1


def _gwet_ac1_loop(ratings) -> float:
    """Direct transcription of Gwet (2008) eqs. for AC1, item by item, as an oracle."""
    cats = sorted({v for row in ratings for v in row})
    q = len(cats)
    n = len(ratings)
    pa = 0.0
    pi = dict.fromkeys(cats, 0.0)
    for row in ratings:
        r = len(row)
        for k in cats:
            rik = sum(1 for v in row if v == k)
            pa += rik * (rik - 1) / (r * (r - 1)) / n
            pi[k] += rik / r / n
    pe = sum(p * (1 - p) for p in pi.values()) / (q - 1)
    return (pa - pe) / (1 - pe)


def test_gwet_ac1_hand_computed_two_raters():
    # 10 items, 2 raters. Agreement on 8 items -> p_a = 0.8.
    # Rater A says 1 seven times, rater B says 1 seven times -> pi_1 = 14/20 = 0.7, pi_0 = 0.3.
    # p_e = (0.7*0.3 + 0.3*0.7) / (2 - 1) = 0.42; AC1 = (0.8 - 0.42) / 0.58 = 19/29.
    a = [1, 1, 1, 1, 1, 1, 1, 0, 0, 0]
    b = [1, 1, 1, 1, 1, 1, 0, 0, 0, 1]
    assert gwet_ac1(np.column_stack([a, b])) == pytest.approx(19 / 29, abs=1e-12)


def test_gwet_ac1_hand_computed_three_categories():
    # 4 items x 3 raters, categories a/b/c.
    # Per-item agreement sum_k r(r-1)/(3*2): [aaa]=1, [aab]=1/3, [bbc]=1/3, [abc]=0 -> p_a = 5/12.
    # pi: a = (1 + 2/3 + 0 + 1/3)/4 = 1/2, b = (0 + 1/3 + 2/3 + 1/3)/4 = 1/3, c = (0+0+1/3+1/3)/4 = 1/6.
    # p_e = (1/2*1/2 + 1/3*2/3 + 1/6*5/6) / 2 = (9/36 + 8/36 + 5/36) / 2 = 11/36.
    # AC1 = (5/12 - 11/36) / (1 - 11/36) = (4/36) / (25/36) = 4/25.
    ratings = [["a", "a", "a"], ["a", "a", "b"], ["b", "b", "c"], ["a", "b", "c"]]
    assert gwet_ac1(ratings) == pytest.approx(4 / 25, abs=1e-12)


# A 2x2 "high agreement" table of the kind Gwet (2008) uses to show the kappa paradox
# (125 subjects: both +: 118, A+ B-: 5, A- B+: 2, both -: 0). The values below are computed by
# hand and match irrCAC (see test_agreement_vs_irrcac.py): AC1 0.94078.
GWET_2008 = np.array([[1, 1]] * 118 + [[1, 0]] * 5 + [[0, 1]] * 2)


def test_gwet_2008_paradox_table():
    a, b = GWET_2008[:, 0], GWET_2008[:, 1]
    # Values recomputed here from the table (not copied): p_a = 118/125 = 0.944;
    # pi_+ = (123 + 120) / 250 = 0.972, p_e = 2 * 0.972 * 0.028 = 0.054432,
    # AC1 = (0.944 - 0.054432) / (1 - 0.054432) = 0.94078 (Gwet's AC1 ~ 0.941 for this table).
    # Cohen: p_e = 0.984*0.96 + 0.016*0.04 = 0.94528, kappa = -0.00128/0.05472 = -0.02339.
    # Scott's pi / Fleiss (pooled marginals): p_e = 0.972^2 + 0.028^2, pi = -0.02880.
    assert gwet_ac1(GWET_2008) == pytest.approx(0.9408, abs=0.0005)
    assert gwet_ac1(GWET_2008) == pytest.approx(_gwet_ac1_loop(GWET_2008.tolist()), abs=1e-12)
    assert cohens_kappa(a, b) == pytest.approx(cohen_kappa_score(a, b), abs=1e-12)
    assert cohens_kappa(a, b) == pytest.approx(-0.0234, abs=0.0005)
    assert fleiss_kappa(GWET_2008) == pytest.approx(-0.0288, abs=0.0005)
    # The paradox itself: 94.4% raw agreement, kappa below zero, AC1 near raw agreement.
    assert np.mean(a == b) == pytest.approx(0.944)


def test_gwet_ac1_matches_loop_oracle_random():
    rng = np.random.default_rng(11)
    for _ in range(20):
        n_items, n_raters, q = rng.integers(3, 40), rng.integers(2, 6), rng.integers(2, 5)
        truth = rng.integers(0, q, n_items)
        noisy = np.where(rng.random((n_items, n_raters)) < 0.6, truth[:, None],
                         rng.integers(0, q, (n_items, n_raters)))
        if len(np.unique(noisy)) < 2:
            continue
        assert gwet_ac1(noisy) == pytest.approx(_gwet_ac1_loop(noisy.tolist()), abs=1e-12)


def test_gwet_ac1_from_counts_agrees_with_labels():
    ratings = _counts_to_ratings(FLEISS_1971)
    assert gwet_ac1_from_counts(FLEISS_1971) == pytest.approx(gwet_ac1(ratings), abs=1e-12)
    assert gwet_ac1(ratings) == pytest.approx(_gwet_ac1_loop(ratings.tolist()), abs=1e-12)


def test_gwet_ac1_categories_argument():
    ratings = [["yes", "yes"], ["yes", "yes"], ["yes", "yes"]]
    # One observed category: chance agreement undefined.
    assert math.isnan(gwet_ac1(ratings))
    # Declaring the full category set makes it well defined: perfect agreement.
    assert gwet_ac1(ratings, categories=["yes", "no"]) == pytest.approx(1.0)
    # An unused declared category changes Q and hence AC1.
    r2 = [["a", "a"], ["a", "b"], ["b", "b"], ["a", "a"]]
    assert gwet_ac1(r2) != pytest.approx(gwet_ac1(r2, categories=["a", "b", "c"]))
    with pytest.raises(ValueError, match="not in categories"):
        gwet_ac1(r2, categories=["a"])


def test_agreement_rejects_missing_labels():
    with pytest.raises(ValueError, match="missing"):
        gwet_ac1([["a", None], ["a", "b"]])
    with pytest.raises(ValueError, match="missing"):
        fleiss_kappa([[1.0, float("nan")], [1.0, 2.0]])
