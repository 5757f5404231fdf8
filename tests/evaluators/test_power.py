"""Power closed forms against statsmodels.stats.power (normal approximations, two-sided), and
the exact power of the tests the reports run against simulations of those tests."""

import math

import numpy as np
import pytest
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import proportion_effectsize

from biaslab.errors import UserError
from biaslab.evaluators.power import (PowerAssumptions, PowerContrast, achieved_power,
                                      exact_minimum_detectable_effect, exact_required_n,
                                      minimum_detectable_effect, required_n)

ALPHA, POWER = 0.05, 0.8


def sd_of_difference(p0: float, p1: float, rho: float) -> float:
    v0, v1 = p0 * (1 - p0), p1 * (1 - p1)
    return math.sqrt(v0 + v1 - 2 * rho * math.sqrt(v0 * v1))


def test_two_proportions_mde_and_n_match_statsmodels():
    c = PowerContrast("role vs no role", "answer", "two_proportions", 1000)
    a = PowerAssumptions(baseline=0.3)
    mde = minimum_detectable_effect(c, a)
    # statsmodels' power at the MDE is 80% (its far tail adds < 1e-6)
    h = proportion_effectsize(0.3 + mde, 0.3)
    assert NormalIndPower().power(h, nobs1=1000, alpha=ALPHA, ratio=1) == pytest.approx(POWER,
                                                                                      abs=1e-4)
    need = NormalIndPower().solve_power(proportion_effectsize(0.35, 0.3), nobs1=None,
                                        alpha=ALPHA, power=POWER, ratio=1)
    assert required_n(c, 0.05, a) == math.ceil(need)


def test_paired_binary_matches_a_one_sample_test_on_the_differences():
    """Per-unit differences of two 0/1 readings with correlation rho: variance
    v0 + v1 - 2 rho sqrt(v0 v1); a one-sample normal test is NormalIndPower with ratio=0."""
    c = PowerContrast("exposed vs clean", "dialogue", "paired_binary", 240)
    a = PowerAssumptions(baseline=0.4, correlation=0.3)
    p0, p1 = 0.4, 0.5
    sd = sd_of_difference(p0, p1, 0.3)
    need = NormalIndPower().solve_power(0.1 / sd, nobs1=None, alpha=ALPHA, power=POWER, ratio=0)
    assert required_n(c, 0.1, a) == math.ceil(need)
    mde = minimum_detectable_effect(c, a)
    sd = sd_of_difference(p0, p0 + mde, 0.3)
    assert NormalIndPower().power(mde / sd, nobs1=240, alpha=ALPHA, ratio=0) == pytest.approx(
        POWER, abs=1e-4)
    # pairing helps: a positive correlation detects a smaller effect than none
    assert mde < minimum_detectable_effect(c, PowerAssumptions(baseline=0.4))


def test_paired_mean_and_group_difference_by_hand():
    z = 1.959964 + 0.841621  # z_{0.975} + z_{0.8}
    mean = PowerContrast("x", "item", "paired_mean", 100)
    assert minimum_detectable_effect(mean, PowerAssumptions(sd=2.0)) == pytest.approx(
        z * 2.0 / 10, rel=1e-5)
    # FBS: mean change of 43 favoured records minus that of 36 others, SDs 0.5 and 0.4
    fbs = PowerContrast("FBS", "record", "group_difference", 43, 36)
    a = PowerAssumptions(sd=0.5, sd_other=0.4)
    se = math.sqrt(0.25 / 43 + 0.16 / 36)
    assert minimum_detectable_effect(fbs, a) == pytest.approx(z * se, rel=1e-5)
    # NormalIndPower with the two groups' sizes and a common SD agrees
    common = PowerAssumptions(sd=0.5)
    d = minimum_detectable_effect(fbs, common) / 0.5
    assert NormalIndPower().power(d, nobs1=43, ratio=36 / 43, alpha=ALPHA) == pytest.approx(
        POWER, abs=1e-4)
    # doubling both groups: n needed for half the effect is 4 times the records
    assert required_n(fbs, minimum_detectable_effect(fbs, a) / 2, a) == pytest.approx(4 * 43,
                                                                                       abs=1)


def test_effects_outside_the_scale_are_one_line():
    c = PowerContrast("x", "answer", "two_proportions", 100)
    for bad in (0, 1, 1.5, -0.1):
        with pytest.raises(UserError, match="must lie in"):
            required_n(c, bad, PowerAssumptions())
    with pytest.raises(UserError, match="exceeds a rate of 1"):
        required_n(c, 0.3, PowerAssumptions(baseline=0.8))
    assert math.isnan(minimum_detectable_effect(c, PowerAssumptions(), n=1))


# -- the power of the test the report runs, against a simulation of that very test ---------------

def _simulated_power(design: str, n: int, p0: float, p1: float, test: str, reps: int = 4000
                     ) -> float:
    """The share of `reps` simulated experiments (fixed seed) that the named test rejects at
    α = 0.05: scipy's paired t, the binomial test on the discordant pairs (exact McNemar) or
    statsmodels' pooled z test, independent of the product's enumeration."""
    from scipy.stats import binom, ttest_rel
    from statsmodels.stats.proportion import proportions_ztest

    rng = np.random.default_rng(20261201)
    a = (rng.random((reps, n)) < p0).astype(float)
    b = (rng.random((reps, n)) < p1).astype(float)
    if design == "paired_binary" and test == "paired_t":
        d = b - a
        with np.errstate(invalid="ignore", divide="ignore"):
            p = ttest_rel(b, a, axis=1).pvalue
        # every unit moved alike: no spread, the interval is the shift itself
        return float(np.mean(np.where(d.std(axis=1) > 0, p <= ALPHA, d[:, 0] != 0)))
    if test == "mcnemar_exact":  # the two-sided binomial test of the discordant pairs
        up, down = ((a == 0) & (b == 1)).sum(axis=1), ((a == 1) & (b == 0)).sum(axis=1)
        p = np.minimum(1, 2 * np.minimum(binom.cdf(up, up + down, 0.5),
                                         binom.sf(up - 1, up + down, 0.5)))
        return float(np.mean((up + down > 0) & (p <= ALPHA)))
    hits = 0
    for x, y in zip(a, b):
        s = np.array([y.sum(), x.sum()])
        if 0 < s.sum() < 2 * n:
            hits += proportions_ztest(s, [n, n])[1] <= ALPHA
    return hits / reps


@pytest.mark.parametrize("design, test, n", [
    ("paired_binary", "paired_t", 12), ("paired_binary", "paired_t", 36),
    ("paired_binary", "mcnemar_exact", 36), ("two_proportions", "z_pooled", 30)])
def test_achieved_power_is_the_simulated_power_of_the_test_run(design, test, n):
    """At small n the normal MDE is not reached: exposed-vs-clean's paired t on 12 pairs has
    about 71% power there, 77% on 36; exact McNemar on 36 pairs 69%."""
    c = PowerContrast("x", "case", design, n, test=test)
    a = PowerAssumptions()
    mde = minimum_detectable_effect(c, a)
    exact = achieved_power(c, a, mde)
    simulated = _simulated_power(design, n, 0.5, 0.5 + mde, test)
    assert exact == pytest.approx(simulated, abs=0.025)  # 3.5 SEs of 4,000 replicates
    if design == "paired_binary":
        assert exact < 0.78  # the normal approximation promises 80%
    # sized with the test itself: the exact MDE reaches 80%, and a hair less does not
    sized = exact_minimum_detectable_effect(c, a)
    assert achieved_power(c, a, sized) >= POWER > achieved_power(c, a, sized - 1e-4)
    need = exact_required_n(c, mde, a)
    assert achieved_power(c, a, mde, n=need) >= POWER > achieved_power(c, a, mde, n=need - 1)


def test_exact_mcnemar_at_12_pairs_never_reaches_80_percent_from_a_coin_flip():
    """Baseline 0.5, every unit at most moving up: all discordant pairs lean one way, and the
    exact test needs 6 of them (2 · ½⁶ ≤ 0.05 < 2 · ½⁵); P[Bin(12, ½) ≥ 6] = 0.61 < 0.8."""
    c = PowerContrast("x", "case", "paired_binary", 12, test="mcnemar_exact")
    from scipy.stats import binom
    assert achieved_power(c, PowerAssumptions(), 0.5) == pytest.approx(binom.sf(5, 12, 0.5))
    assert math.isnan(exact_minimum_detectable_effect(c, PowerAssumptions()))
