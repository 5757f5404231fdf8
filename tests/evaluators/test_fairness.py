"""Fairness wrappers vs direct sklearn / fairlearn computations and hand masking per group."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fairlearn.metrics import demographic_parity_difference as fl_dp
from fairlearn.metrics import equalized_odds_difference as fl_eo
from sklearn.metrics import accuracy_score, roc_auc_score

from biaslab.evaluators import fairness as F


@pytest.fixture
def data():
    rng = np.random.default_rng(42)
    n = 300
    y_true = rng.integers(0, 2, n)
    score = np.clip(0.35 * y_true + rng.uniform(0, 0.65, n), 0, 1)
    y_pred = (score >= 0.5).astype(int)
    sex = rng.integers(0, 2, n)
    return y_true, y_pred, score, sex


def _hand_rates(y_pred, groups):
    return {g: y_pred[groups == g].mean() for g in np.unique(groups)}


def test_failure_rate_by_group_against_hand_masking(data):
    y_true, y_pred, _, sex = data
    got = F.predicted_failure_rate_by_group(y_true, y_pred, sensitive_features=sex)
    assert set(got) == {0, 1}
    for g, rate in _hand_rates(y_pred, sex).items():
        assert got[g] == pytest.approx(rate)
    assert all(type(k) is int for k in got)  # plain Python keys, not numpy scalars


def test_failure_rate_by_group_small_hand_case():
    # F (0): preds 1,1,0,0 -> 2/4 = 0.5 ; M (1): preds 1,0,0 -> 1/3
    y_pred = np.array([1, 1, 0, 0, 1, 0, 0])
    sex = np.array([0, 0, 0, 0, 1, 1, 1])
    got = F.predicted_failure_rate_by_group(np.zeros(7), y_pred, sensitive_features=sex)
    assert got == pytest.approx({0: 0.5, 1: 1 / 3})


def test_failure_rate_by_group_string_groups():
    got = F.predicted_failure_rate_by_group(
        [0, 1, 0, 1], [1, 1, 0, 1], sensitive_features=["F", "F", "M", "M"])
    assert got == pytest.approx({"F": 1.0, "M": 0.5})


def test_demographic_parity_against_fairlearn_and_hand(data):
    y_true, y_pred, _, sex = data
    got = F.demographic_parity_difference(y_true, y_pred, sensitive_features=sex)
    assert got == pytest.approx(fl_dp(y_true, y_pred, sensitive_features=sex))
    rates = _hand_rates(y_pred, sex)
    assert got == pytest.approx(max(rates.values()) - min(rates.values()))


def test_demographic_parity_zero_when_equal_rates():
    # both groups: 1 of 2 predicted to fail -> DP = 0
    assert F.demographic_parity_difference(
        [0, 0, 0, 0], [1, 0, 1, 0], sensitive_features=[0, 0, 1, 1]) == 0.0


def test_equalized_odds_against_fairlearn_and_hand(data):
    y_true, y_pred, _, sex = data
    got = F.equalized_odds_difference(y_true, y_pred, sensitive_features=sex)
    assert got == pytest.approx(fl_eo(y_true, y_pred, sensitive_features=sex))
    tpr = {g: y_pred[(sex == g) & (y_true == 1)].mean() for g in (0, 1)}
    fpr = {g: y_pred[(sex == g) & (y_true == 0)].mean() for g in (0, 1)}
    hand = max(abs(tpr[0] - tpr[1]), abs(fpr[0] - fpr[1]))
    assert got == pytest.approx(hand)


def test_empty_inputs_give_nan():
    assert math.isnan(F.demographic_parity_difference([], [], sensitive_features=[]))
    assert math.isnan(F.equalized_odds_difference([], [], sensitive_features=[]))
    assert math.isnan(F.accuracy([], []))


def test_accuracy_against_sklearn(data):
    y_true, y_pred, _, _ = data
    assert F.accuracy(y_true, y_pred) == pytest.approx(accuracy_score(y_true, y_pred))
    assert F.accuracy(y_true, y_pred) == pytest.approx(np.mean(y_true == y_pred))


def test_roc_auc_against_sklearn(data):
    y_true, _, score, _ = data
    assert F.roc_auc(y_true, score) == pytest.approx(roc_auc_score(y_true, score))


def test_roc_auc_single_class_is_nan_not_error():
    assert math.isnan(F.roc_auc([1, 1, 1], [0.2, 0.6, 0.9]))
    assert math.isnan(F.roc_auc([], []))


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _one_by_one(y, yhat, groups):
    try:
        rates = F.predicted_failure_rate_by_group(y, yhat, sensitive_features=groups)
    except ValueError as exc:
        rates = exc.__class__
    return (rates, F.demographic_parity_difference(y, yhat, sensitive_features=groups),
            F.equalized_odds_difference(y, yhat, sensitive_features=groups))


def test_group_gaps_equal_the_three_measures_one_by_one(data):
    """`group_gaps` (one fairlearn frame) gives exactly what the three wrappers give, on the
    fixture and on small and degenerate cases: one class only, one group only, no predicted
    failure, a group with no true failures, one row (fairlearn refuses it: both raise)."""
    y_true, y_pred, _, sex = data
    a = np.array
    cases = [(y_true, y_pred, sex),
             (a([1, 1, 1, 1]), a([1, 0, 1, 0]), a([0, 0, 1, 1])),  # one class only
             (a([1, 0, 1, 0]), a([0, 0, 0, 0]), a([0, 0, 1, 1])),  # no predicted failure
             (a([1, 0, 1, 0]), a([1, 1, 0, 1]), a([0, 0, 0, 0])),  # one group only
             (a([1, 1, 0, 0, 1]), a([1, 0, 0, 1, 1]), a([0, 0, 1, 1, 2])),  # no failure in 2
             (a([1]), a([1]), a([0])),  # one row: fairlearn refuses it
             (a([1, 0, 1]), a([1, 1, 0]), a(["F", "F", "M"]))]
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(2, 10))
        cases.append((rng.integers(0, 2, n), rng.integers(0, 2, n),
                      rng.integers(0, int(rng.integers(1, 4)), n)))
    compared = raised = 0
    for y, yhat, groups in cases:
        rates, dp, eo = _one_by_one(y, yhat, groups)
        if rates is ValueError:
            with pytest.raises(ValueError):
                F.group_gaps(y, yhat, sensitive_features=groups)
            raised += 1
            continue
        gaps = F.group_gaps(y, yhat, sensitive_features=groups)
        assert gaps.rates == rates and _same(gaps.dp_diff, dp) and _same(gaps.eo_diff, eo), \
            (y, yhat, groups, gaps, (rates, dp, eo))
        compared += 1
    assert compared >= 20 and raised >= 1  # both paths were taken
    empty = F.group_gaps([], [], sensitive_features=[])
    assert empty.rates == {} and math.isnan(empty.dp_diff) and math.isnan(empty.eo_diff)
