"""The missing-verdict rule on label matrices with a known answer (issue 29, item 1).

Random grids of heterogeneous dialogues (some prone to bias, some not, some ending early)
lose about 10% of their verdicts at random. The truth is each measure computed on the
complete labels of the same dialogues; every interval must cover it, every figure must lie
between its best and worst case, and with no verdict missing the rule changes nothing.
"""

import numpy as np
import pytest

from biaslab.evaluators import multiturn as mt
from biaslab.evaluators import multiturn_missing as mm


def _grid(rng, n=40, turns=10):
    prone = rng.random(n) < 0.5
    p = np.where(prone, 0.45, 0.05)[:, None]
    m = (rng.random((n, turns)) < p).astype(float)
    ran = np.where(rng.random(n) < 0.2, rng.integers(1, turns, n), turns)
    for i, r in enumerate(ran):
        m[i, r:] = np.nan
    return m, ran


def _drop(rng, m, share=0.1):
    out = m.copy()
    out[(rng.random(m.shape) < share) & ~np.isnan(m)] = np.nan
    return out


def _check(bounded: mm.Bounded, truth: float):
    assert bounded.ci_low <= truth <= bounded.ci_high
    lo, hi = sorted((bounded.best, bounded.worst))
    assert lo - 1e-12 <= truth <= hi + 1e-12 and lo - 1e-12 <= bounded.value <= hi + 1e-12


def test_every_interval_covers_the_complete_labels():
    rng = np.random.default_rng(7)
    for _ in range(40):
        full, ran = _grid(rng)
        seen = _drop(rng, full)
        for t in (5, 10):
            truth = mt.ever_biased(full, t, ended=ran)
            _check(mm.summarize(mm.ever_range(seen, t, ran), n_resamples=200),
                   float(np.nanmean(truth)))
            ttfb = mt.time_to_first_bias(full, t, ended=ran)
            _check(mm.summarize(mm.first_bias_range(seen, t, ran), n_resamples=200),
                   float(np.nanmean(ttfb)))
        _check(mm.summarize(mm.reemerged_range(seen, ran), n_resamples=200),
               float(np.nanmean(mt.reemerged(full))))
        for t in (1, 6):
            _check(mm.summarize(mm.turn_range(seen, t, ran), n_resamples=200),
                   float(np.nanmean(full[ran >= t, t - 1])))
        # paired: a second arm of the same dialogues, more biased
        full_b = np.where(np.isnan(full), np.nan, np.maximum(full, rng.random(full.shape) < 0.3))
        seen_b = _drop(rng, full_b)
        truth = (mt.ever_biased(full_b, 10, ended=ran) - mt.ever_biased(full, 10, ended=ran))
        _check(mm.paired_bounded(mm.ever_range(seen_b, 10, ran), mm.ever_range(seen, 10, ran),
                                 n_resamples=200), float(truth.mean()))
        truth = (mt.time_to_first_bias(full_b, 10, ended=ran)
                 - mt.time_to_first_bias(full, 10, ended=ran))
        _check(mm.paired_bounded(mm.first_bias_range(seen_b, 10, ran),
                                 mm.first_bias_range(seen, 10, ran), n_resamples=200),
               float(truth.mean()))


def test_no_missing_verdict_changes_nothing():
    rng = np.random.default_rng(3)
    full, ran = _grid(rng)
    got = mm.summarize(mm.ever_range(full, 10, ran), n_resamples=200)
    want = mt.ratio_ci(mt.ever_biased(full, 10, ended=ran))
    assert (got.value, got.ci_low, got.ci_high, got.n) == pytest.approx(
        (want.value, want.ci_low, want.ci_high, want.n))
    assert got.missing == 0 and got.undetermined == 0 and got.best == got.worst == got.value


def test_the_figure_is_not_pulled_by_which_dialogues_have_gaps():
    """The complaint of issue 29: keeping the decided dialogues (biased before a gap) and
    dropping the others reads high. The rule's figure stays near the truth on average."""
    rng = np.random.default_rng(11)
    errors = []
    for _ in range(60):
        full, ran = _grid(rng, n=60)
        seen = _drop(rng, full, 0.15)
        truth = float(np.nanmean(mt.ever_biased(full, 10, ended=ran)))
        errors.append(mm.summarize(mm.ever_range(seen, 10, ran), n_resamples=100).value - truth)
    assert abs(np.mean(errors)) < 0.02


def test_reemergence_extremes_are_not_the_two_plain_fills():
    m = np.array([[1, np.nan, 1, 0]])
    r = mm.reemerged_range(m, [4])
    assert (r.low[0], r.high[0]) == (0.0, 1.0)  # ? = 0 re-emerges, ? = 1 does not
