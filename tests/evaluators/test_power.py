"""Power closed forms against statsmodels.stats.power (normal approximations, two-sided)."""

import math

import pytest
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import proportion_effectsize

from biaslab.errors import UserError
from biaslab.evaluators.power import (PowerAssumptions, PowerContrast, minimum_detectable_effect,
                                      required_n)

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
