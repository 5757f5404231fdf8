"""Generic group-fairness and performance metrics, fairlearn-style.

Every function takes ``(y_true, y_pred, *, sensitive_features)`` (or the subset it needs) like
:mod:`fairlearn.metrics`. Predictions are binary labels unless a name says scores. In the
protocols of this package label 1 means *predicted failure*, so a group's selection rate is its
predicted failure rate.

The group-gap functions are thin wrappers over fairlearn that turn "undefined" into NaN instead of
raising or warning, so one degenerate cell never aborts a whole experiment table.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fairlearn.metrics import (MetricFrame, false_positive_rate, selection_rate,
                               true_positive_rate)
from fairlearn.metrics import demographic_parity_difference as _fl_dp_difference
from fairlearn.metrics import equalized_odds_difference as _fl_eo_difference
from sklearn.metrics import accuracy_score, roc_auc_score

__all__ = [
    "GroupGaps",
    "group_gaps",
    "predicted_failure_rate_by_group",
    "demographic_parity_difference",
    "equalized_odds_difference",
    "accuracy",
    "roc_auc",
]

ArrayLike = Any


def _as_1d(a: ArrayLike) -> np.ndarray:
    return np.asarray(a).reshape(-1)


def _py(v: Any) -> Hashable:
    """numpy scalar -> plain Python scalar, so dict keys compare as ``0``/``1``/``"F"``."""
    return v.item() if isinstance(v, np.generic) else v


def predicted_failure_rate_by_group(
    y_true: ArrayLike, y_pred: ArrayLike, *, sensitive_features: ArrayLike
) -> dict[Hashable, float]:
    """Share of positive (failure) predictions within each group.

    ``rate_g = #{i in g : y_pred_i = 1} / #{i in g}`` (fairlearn ``selection_rate`` by group).
    ``y_true`` is only passed through to :class:`fairlearn.metrics.MetricFrame`.

    Returns:
        ``{group: rate}`` for every group that occurs in ``sensitive_features``, keys as plain
        Python scalars. Equal rates across groups = demographic parity.
    """
    y_pred = _as_1d(y_pred)
    y_true = _as_1d(y_true) if y_true is not None else np.zeros_like(y_pred)
    mf = MetricFrame(metrics=selection_rate, y_true=y_true, y_pred=y_pred,
                     sensitive_features=_as_1d(sensitive_features))
    return {_py(g): float(v) for g, v in mf.by_group.items()}


def _fairlearn_or_nan(metric, y_true, y_pred, sensitive_features) -> float:
    """Call a fairlearn difference metric; NaN where it is undefined (no rows, empty rates)."""
    y_pred = _as_1d(y_pred)
    if y_pred.size == 0:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return float(metric(_as_1d(y_true), y_pred,
                                sensitive_features=_as_1d(sensitive_features)))
        except (ValueError, ZeroDivisionError):
            return float("nan")


def demographic_parity_difference(
    y_true: ArrayLike, y_pred: ArrayLike, *, sensitive_features: ArrayLike
) -> float:
    """Largest gap in predicted-positive rate between groups.

    ``DP = max_g P(y_pred=1 | g) - min_g P(y_pred=1 | g)`` (fairlearn, ``between_groups``).
    0 = every group is predicted to fail equally often; 1 = one group always, another never.
    NaN when there are no rows.
    """
    return _fairlearn_or_nan(_fl_dp_difference, y_true, y_pred, sensitive_features)


def equalized_odds_difference(
    y_true: ArrayLike, y_pred: ArrayLike, *, sensitive_features: ArrayLike
) -> float:
    """Worst between-group gap in true-positive rate or false-positive rate.

    ``EO = max(max_g TPR_g - min_g TPR_g, max_g FPR_g - min_g FPR_g)`` (fairlearn, ``worst_case``).
    0 = the classifier errs the same way for every group given the true outcome. NaN when a
    rate is undefined (e.g. a group with no true failures or no true passes).
    """
    return _fairlearn_or_nan(_fl_eo_difference, y_true, y_pred, sensitive_features)


@dataclass(frozen=True)
class GroupGaps:
    """The three group measures of one set of binary predictions (see :func:`group_gaps`)."""

    rates: dict[Hashable, float]
    """:func:`predicted_failure_rate_by_group`."""
    dp_diff: float
    """:func:`demographic_parity_difference`."""
    eo_diff: float
    """:func:`equalized_odds_difference`."""


def group_gaps(y_true: ArrayLike, y_pred: ArrayLike, *,
               sensitive_features: ArrayLike) -> GroupGaps:
    """Rates by group, demographic parity and equalized odds differences at once.

    The same numbers as the three functions called one by one, from one
    :class:`fairlearn.metrics.MetricFrame` holding the metrics they build their own frames of
    (``selection_rate``; ``true_positive_rate`` and ``false_positive_rate``, in that order, as
    fairlearn's ``equalized_odds_difference`` takes the larger gap of the two). Why: a frame
    costs ~25 ms whatever it holds, and a report asks this once per condition (issue 48).
    Where the shared frame cannot be built (fairlearn raises), each measure is computed on
    its own, so that one undefined measure is NaN without taking the others along.
    """
    y_pred = _as_1d(y_pred)
    if y_pred.size == 0:
        return GroupGaps({}, float("nan"), float("nan"))
    y_true = _as_1d(y_true) if y_true is not None else np.zeros_like(y_pred)
    groups = _as_1d(sensitive_features)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            frame = MetricFrame(metrics={"selection_rate": selection_rate,
                                         "tpr": true_positive_rate,
                                         "fpr": false_positive_rate},
                                y_true=y_true, y_pred=y_pred, sensitive_features=groups)
            gaps = frame.difference(method="between_groups")
            rates = {_py(g): float(v) for g, v in frame.by_group["selection_rate"].items()}
            return GroupGaps(rates, float(gaps["selection_rate"]),
                             float(max(gaps[["tpr", "fpr"]])))
        except (ValueError, ZeroDivisionError):
            pass
    return GroupGaps(predicted_failure_rate_by_group(y_true, y_pred,
                                                     sensitive_features=groups),
                     demographic_parity_difference(y_true, y_pred, sensitive_features=groups),
                     equalized_odds_difference(y_true, y_pred, sensitive_features=groups))


def accuracy(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Share of correct labels, ``mean(y_pred == y_true)``; NaN when there are no rows."""
    y_true = _as_1d(y_true)
    if y_true.size == 0:
        return float("nan")
    return float(accuracy_score(y_true, _as_1d(y_pred)))


def roc_auc(y_true: ArrayLike, y_score: ArrayLike) -> float:
    """Area under the ROC curve of scores ``y_score`` (probability of failure).

    ``AUC = P(score of a random positive > score of a random negative)`` (ties count 1/2).
    0.5 = chance, 1 = perfect ranking. NaN (not an error) when ``y_true`` holds one class only.
    """
    y_true = _as_1d(y_true)
    if np.unique(y_true).size < 2:
        return float("nan")
    return float(roc_auc_score(y_true, _as_1d(y_score)))
