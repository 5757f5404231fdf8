"""Intervals shared by the ``multiturn`` measures (`biaslab.evaluators.multiturn`) and its
missing-verdict rule (`biaslab.evaluators.multiturn_missing`): one home, so neither module
imports the other.

Which interval for which value:

- a share of dialogues (every value 0 or 1): Wilson (`ratio_ci`), which keeps a width at 0
  and 1;
- a mean of other values: a percentile bootstrap over dialogues (`ratio_ci`);
- a rating on a fixed scale (coherence 1-5): `rating_ci`, a percentile bootstrap on the
  rating's own scale whatever its values (a rating of 1 is not a "success": a proportion
  interval would leave the scale), degenerate ``[v, v]`` when every rating is the same (no
  resample can differ) and named in ``RATING_CI_METHOD``;
- a paired difference: Newcombe's paired score interval for 0/1 sides, else a paired
  bootstrap (`paired_effect`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from biaslab.evaluators.stats import paired_difference_interval, wilson_interval

__all__ = ["Ratio", "ratio_ci", "rating_ci", "pooled_mean_ci", "paired_effect", "known_pairs",
           "reemerges", "RATING_CI_METHOD", "RATING_CI_DEGENERATE"]

RATING_CI_METHOD = "percentile bootstrap over dialogues on the rating scale"
RATING_CI_DEGENERATE = "degenerate: every rating equal"


@dataclass(frozen=True)
class Ratio:
    """A dialogue-level ratio with its 95% interval over `n` dialogues (NaNs when n == 0)."""

    value: float
    ci_low: float
    ci_high: float
    n: int


def ratio_ci(values: Sequence[float], *, n_resamples: int = 2000, confidence: float = 0.95,
             random_state: int = 0) -> Ratio:
    """Mean of per-dialogue values (NaN dropped) with its interval: Wilson when every value
    is 0 or 1 (a share of dialogues), else a percentile bootstrap over dialogues."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return Ratio(np.nan, np.nan, np.nan, 0)
    if np.isin(x, (0.0, 1.0)).all():
        low, high = wilson_interval(int(x.sum()), len(x), confidence)
        return Ratio(float(x.mean()), low, high, len(x))
    if len(x) < 2 or np.ptp(x) == 0:  # no spread: every resample gives the same mean
        return Ratio(float(x.mean()), float(x.mean()) if len(x) >= 2 else np.nan,
                     float(x.mean()) if len(x) >= 2 else np.nan, len(x))
    # The same draws as `stats.bootstrap(np.mean, x)` (one index matrix from the same seed),
    # vectorised: a report computes thousands of these CIs.
    rng = np.random.default_rng(random_state)
    means = x[rng.integers(0, len(x), size=(n_resamples, len(x)))].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return Ratio(float(x.mean()), float(low), float(high), len(x))


def pooled_mean_ci(values_per_dialogue: Sequence[Sequence[float]], *, n_resamples: int = 2000,
                   confidence: float = 0.95, random_state: int = 0) -> Ratio:
    """Mean over every value of every dialogue (each query or reply weighs the same, as a
    mean "across all user queries" does), with a percentile bootstrap that resamples
    dialogues whole (the turns of one dialogue are not independent). `n` counts the values;
    dialogues without a value add nothing."""
    groups = [np.asarray([v for v in g if v is not None and not np.isnan(v)], float)
              for g in values_per_dialogue]
    groups = [g for g in groups if len(g)]
    if not groups:
        return Ratio(np.nan, np.nan, np.nan, 0)
    sums = np.array([g.sum() for g in groups])
    counts = np.array([len(g) for g in groups], float)
    value = float(sums.sum() / counts.sum())
    if len(groups) < 2:
        return Ratio(value, np.nan, np.nan, int(counts.sum()))
    rng = np.random.default_rng(random_state)
    idx = rng.integers(0, len(groups), size=(n_resamples, len(groups)))
    means = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return Ratio(value, float(min(low, value)), float(max(high, value)), int(counts.sum()))




def known_pairs(first, second, names: str) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays aligned on the same dialogues, less the pairs with a NaN on either side."""
    a, b = np.asarray(first, float), np.asarray(second, float)
    if a.shape != b.shape:
        raise ValueError(f"{names} must be aligned on the same dialogues")
    keep = ~(np.isnan(a) | np.isnan(b))
    return a[keep], b[keep]


def paired_effect(exposed, clean, *, n_resamples: int = 2000, confidence: float = 0.95,
                  random_state: int = 0) -> Ratio:
    """mean(exposed − clean) over the dialogues known in both arms (a NaN on either side drops
    the pair), with a paired interval: Newcombe's paired score interval when both sides are
    0/1 (it keeps a width when every pair agrees), else a paired percentile bootstrap over
    dialogues. 0 means the exposure changed nothing on average; `n` counts the pairs."""
    a, b = known_pairs(exposed, clean, "exposed and clean")
    if len(a) == 0:
        return Ratio(np.nan, np.nan, np.nan, 0)
    if np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all():
        diff, low, high = paired_difference_interval(b, a, confidence)
        return Ratio(float(diff), low, high, len(a))
    d = a - b
    if len(d) < 2 or np.ptp(d) == 0:  # no spread: every resample gives the same mean
        return Ratio(float(d.mean()), *(2 * [float(d.mean()) if len(d) >= 2 else np.nan]),
                     len(d))
    rng = np.random.default_rng(random_state)
    means = d[rng.integers(0, len(d), size=(n_resamples, len(d)))].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return Ratio(float(d.mean()), float(low), float(high), len(d))




def reemerges(seq) -> float:
    """1.0 when the labels `seq` (in turn order, none missing) go biased → not biased →
    biased, else 0.0."""
    state = 0  # 0: no bias yet; 1: biased seen; 2: then a non-biased reply
    for v in seq:
        if state == 0 and v == 1:
            state = 1
        elif state == 1 and v == 0:
            state = 2
        elif state == 2 and v == 1:
            return 1.0
    return 0.0




def rating_ci(values: Sequence[float], *, scale: tuple[float, float] = (1.0, 5.0),
              n_resamples: int = 2000, confidence: float = 0.95, random_state: int = 0
              ) -> tuple[Ratio, str]:
    """Mean of per-dialogue ratings on `scale` (NaN dropped) with a percentile bootstrap
    interval over dialogues, on the scale itself (never a proportion interval). Returns the
    ratio and its method: `RATING_CI_METHOD`, or `RATING_CI_DEGENERATE` when every rating is
    the same (the interval is then the point: no resample can differ; honest, not a claim
    of certainty about other dialogues). A single rating has no interval (NaN)."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    low_end, high_end = scale
    if ((x < low_end) | (x > high_end)).any():
        raise ValueError(f"ratings must lie on {low_end}..{high_end}")
    if len(x) == 0:
        return Ratio(np.nan, np.nan, np.nan, 0), RATING_CI_METHOD
    mean = float(x.mean())
    if len(x) < 2:
        return Ratio(mean, np.nan, np.nan, 1), RATING_CI_METHOD
    if np.ptp(x) == 0:
        return Ratio(mean, mean, mean, len(x)), RATING_CI_DEGENERATE
    rng = np.random.default_rng(random_state)
    means = x[rng.integers(0, len(x), size=(n_resamples, len(x)))].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return Ratio(mean, float(max(low, low_end)), float(min(high, high_end)), len(x)), \
        RATING_CI_METHOD
