"""Power before anyone pays: the smallest effect a protocol's main contrast can detect at its
sample size, and the sample size an effect needs.

A protocol declares its main contrast as a `PowerContrast` (``Protocol.power_contrasts``);
`minimum_detectable_effect` and `required_n` answer for it, two-sided at level `alpha` and the
given power, with normal approximations (closed forms; the tests check them against
``statsmodels.stats.power``, ``bench/power_simulation.py`` against simulated tests):

- ``two_proportions``: two independent arms' rates (roleplay's Table 5 z-test). The effect is
  read on Cohen's arcsine scale ``h = 2 asin √p1 − 2 asin √p0``, as
  ``statsmodels.stats.proportion.proportion_effectsize`` does, with ``n`` per arm.
- ``paired_binary``: a 0/1 measure on the same units in both arms (a dialogue ever biased).
  The test is on the per-unit differences; their variance is ``v0 + v1 − 2ρ√(v0 v1)`` with
  ``v = p(1 − p)`` and ρ the within-unit correlation. ρ = 0 (the default) is conservative:
  pairing only ever lowers the variance when units that are biased clean stay biased exposed.
- ``paired_mean``: a numeric measure on the same units, from the SD of the per-unit
  differences (a pilot's, or an assumption stated with the result).
- ``group_difference``: a difference of two groups' mean per-unit changes (amplification's
  FBS = mean change of the favoured group − mean change of the other), from each group's SD
  of the per-unit change and size.

Effects are absolute: a rate difference (0.05 = 5 percentage points) or a difference in the
measure's own units.

**The test the report runs.** At small n a normal approximation promises more than the test
that is actually run delivers (exact McNemar on 12 pairs reaches 70% power at the normal
MDE, not 80%). So each design is also sized with its report's test (`TESTS`), computed
without approximation by `achieved_power`:

- ``two_proportions``: the pooled two-proportion z test (Table 5's), its power summed exactly
  over both arms' binomial counts (rejecting where |z| ≥ z_{1−α/2});
- ``paired_binary``: the paired t test on the per-unit differences (−1, 0 or +1), as the
  generic ``exposed_vs_clean.csv`` runs it (the protocols' paired bootstraps behave like it),
  its power summed exactly over the counts (n01, n10) of units that moved 0 → 1 and 1 → 0,
  which are trinomial with cell probabilities p01 and p10 from the two rates and ρ; a
  contrast may declare ``test="mcnemar_exact"`` instead (as model comparisons run it):
  D = n01 + n10 ~ Bin(n, p01 + p10) and, given D, n01 ~ Bin(D, p01 / (p01 + p10)), summed
  over the exact test's rejection region;
- ``paired_mean``: the paired t test (noncentral t with n − 1 degrees of freedom);
- ``group_difference``: Welch's t test (noncentral t, Welch–Satterthwaite degrees of freedom).

`exact_minimum_detectable_effect` and `exact_required_n` search for the smallest effect and
n at which that power reaches the target; ``biaslab estimate`` prints them with the power
they achieve, beside the normal approximation's. Tests: ``tests/evaluators/test_power.py``
checks them against a simulation with a fixed seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from biaslab.errors import UserError

# scipy is imported inside the functions that compute: it costs ~0.7 s at the start of every
# `biaslab` command that plans a run, and only power and MDE figures need it.

__all__ = ["TESTS", "DEFAULT_TESTS", "achieved_power", "exact_minimum_detectable_effect", "exact_required_n",
           "PowerContrast", "PowerAssumptions", "Design", "DESIGNS", "z_sum",
           "minimum_detectable_effect", "required_n", "check_effect", "DEFAULT_SD",
           "DEFAULT_BASELINE"]

Design = Literal["two_proportions", "paired_binary", "paired_mean", "group_difference"]
DESIGNS: tuple[str, ...] = ("two_proportions", "paired_binary", "paired_mean",
                            "group_difference")
DEFAULT_BASELINE = 0.5
"""The reference arm's rate when neither a pilot nor ``--baseline`` says: the rate at which a
binary measure is noisiest, so the MDE is the largest it can be."""
TESTS: dict[str, str] = {"z_pooled": "two-proportion z test", "paired_t": "paired t test",
                         "mcnemar_exact": "exact McNemar test", "welch_t": "Welch t test"}
"""The tests `achieved_power` computes the power of, in words."""
DEFAULT_TESTS: dict[str, str] = {"two_proportions": "z_pooled", "paired_binary": "paired_t",
                                 "paired_mean": "paired_t", "group_difference": "welch_t"}
"""Each design's test unless a contrast names another."""
DEFAULT_SD = 0.5
"""The SD of a per-unit change when no pilot says (0/1 predictions of which about a quarter
change between arms)."""


@dataclass(frozen=True)
class PowerContrast:
    """A protocol's main contrast, as power analysis needs it.

    Attributes:
        label: the contrast in words (``role vs no role, why questions``).
        unit: what `n` counts (``answer``, ``dialogue``, ``source example``, ``record``).
        design: one of `DESIGNS` (see the module's docstring).
        n: units per arm (two proportions), pairs (paired designs) or units of the first
            group (group difference), for one model and one seed.
        n_other: the second group's units (group difference only).
        measure: the unit's measure a pilot is read from (a field of ``Protocol.unit``).
        pool_seeds: whether the report pools the spec's seeds into one comparison (n grows
            with the seeds) or compares each seed on its own.
        groups: the two groups of a group difference (favoured first), as a pilot names them.
        test: the report's test, a key of `TESTS` (default: the design's, `DEFAULT_TESTS`).
        seeds_averaged: the report averages a unit's seeds into one value (seeds re-ask the
            same unit): `n` does not grow with the seeds.
        max_effect: the largest effect the measure can show at all, where it is bounded
            (a difference of two groups' mean changes of a 0/1 label: 2); an ``--mde`` at or
            beyond it is refused, not answered with a meaningless n.
    """

    label: str
    unit: str
    design: Design
    n: int
    n_other: int | None = None
    measure: str | None = None
    pool_seeds: bool = True
    groups: tuple[str, str] | None = None
    seeds_averaged: bool = False
    test: str | None = None
    max_effect: float | None = None

    def __post_init__(self):
        if self.test is None:
            object.__setattr__(self, "test", DEFAULT_TESTS[self.design])
        if self.test not in TESTS:
            raise ValueError(f"unknown power test {self.test!r} (known: {sorted(TESTS)})")
        if self.design not in DESIGNS:
            raise ValueError(f"unknown power design {self.design!r} (known: {DESIGNS})")
        if self.design == "group_difference" and self.n_other is None:
            raise ValueError("a group_difference contrast needs n_other")

    @property
    def binary(self) -> bool:
        return self.design in ("two_proportions", "paired_binary")


@dataclass(frozen=True)
class PowerAssumptions:
    """What the answer rests on besides n; each says where it came from (`source`).

    Attributes:
        baseline: the reference arm's rate (binary designs).
        correlation: within-unit correlation of a paired binary measure.
        sd: SD of the per-unit change (paired mean) or of the first group's change (group
            difference); `sd_other` the second group's.
        source: ``assumed`` or the pilot run it was read from.
    """

    baseline: float = DEFAULT_BASELINE
    correlation: float = 0.0
    sd: float = DEFAULT_SD
    sd_other: float | None = None
    source: str = "assumed"


def z_sum(alpha: float = 0.05, power: float = 0.8) -> float:
    """``z_{1−α/2} + z_{power}``: how many standard errors an effect must be to be detected
    (2.80 at α = 0.05 and 80%). The far tail of a two-sided test is left out (< 1e-5 here)."""
    from scipy.stats import norm

    if not 0 < alpha < 1 or not 0 < power < 1:
        raise UserError(f"alpha and power must lie in (0, 1), got {alpha} and {power}")
    return float(norm.ppf(1 - alpha / 2) + norm.ppf(power))


def _paired_variance(p0: float, p1: float, rho: float) -> float:
    v0, v1 = p0 * (1 - p0), p1 * (1 - p1)
    return max(v0 + v1 - 2 * rho * math.sqrt(v0 * v1), 1e-12)


def _group_variance(contrast: PowerContrast, a: PowerAssumptions, scale: float = 1.0) -> float:
    sd_b = a.sd if a.sd_other is None else a.sd_other
    return a.sd ** 2 / (contrast.n * scale) + sd_b ** 2 / (contrast.n_other * scale)


def minimum_detectable_effect(contrast: PowerContrast, assumptions: PowerAssumptions,
                              *, n: int | None = None, alpha: float = 0.05,
                              power: float = 0.8) -> float:
    """The smallest absolute effect detected with `power` at `n` units (default the
    contrast's); an increase over the baseline for binary designs. NaN when no effect up to a
    rate of 1 is detectable (too few units for that baseline)."""
    from scipy.optimize import brentq

    n = contrast.n if n is None else n
    if n < 2:
        return math.nan
    z, p0 = z_sum(alpha, power), assumptions.baseline
    if contrast.design == "two_proportions":
        angle = math.asin(math.sqrt(p0)) + z / math.sqrt(n / 2) / 2
        return math.sin(angle) ** 2 - p0 if angle <= math.pi / 2 else math.nan
    if contrast.design == "paired_binary":
        def gap(delta: float) -> float:
            return delta - z * math.sqrt(_paired_variance(p0, p0 + delta, assumptions.correlation)
                                         / n)
        top = 1 - p0
        if top <= 0 or gap(top) < 0:
            return math.nan
        return float(brentq(gap, 1e-12, top, xtol=1e-10))
    if contrast.design == "paired_mean":
        return z * assumptions.sd / math.sqrt(n)
    scale = n / contrast.n
    return z * math.sqrt(_group_variance(contrast, assumptions, scale))


def check_effect(contrast: PowerContrast, effect: float, assumptions: PowerAssumptions) -> None:
    """One line (UserError) for an effect the design cannot have."""
    if contrast.binary:
        if not 0 < effect < 1:
            raise UserError(f"--mde {effect}: for a rate ({contrast.label}) the effect must lie "
                            "in (0, 1), e.g. 0.05 for 5 percentage points")
        if assumptions.baseline + effect > 1:
            raise UserError(f"--mde {effect}: baseline {assumptions.baseline:g} + effect "
                            "exceeds a rate of 1 (lower --baseline or the effect)")
    elif not effect > 0 or not math.isfinite(effect):
        raise UserError(f"--mde {effect}: the effect must be a positive number")
    elif contrast.max_effect is not None and effect >= contrast.max_effect:
        raise UserError(f"--mde {effect}: {contrast.label} is bounded (it cannot reach "
                        f"{contrast.max_effect:g}); give an effect below that, e.g. 0.1")


def required_n(contrast: PowerContrast, effect: float, assumptions: PowerAssumptions, *,
               alpha: float = 0.05, power: float = 0.8) -> int:
    """Units needed (per arm, pairs, or the first group's with the second in the same ratio)
    to detect an absolute `effect` with `power`; rounded up."""
    check_effect(contrast, effect, assumptions)
    z, p0 = z_sum(alpha, power), assumptions.baseline
    if contrast.design == "two_proportions":
        h = 2 * math.asin(math.sqrt(p0 + effect)) - 2 * math.asin(math.sqrt(p0))
        need = 2 * (z / h) ** 2
    elif contrast.design == "paired_binary":
        need = z ** 2 * _paired_variance(p0, p0 + effect, assumptions.correlation) / effect ** 2
    elif contrast.design == "paired_mean":
        need = (z * assumptions.sd / effect) ** 2
    else:  # both groups scaled by the same factor k: var = var(at n) / k
        need = contrast.n * z ** 2 * _group_variance(contrast, assumptions) / effect ** 2
    return max(2, math.ceil(need - 1e-9))


# --------------------------------------------------------------------------- exact power


_EXACT_SEARCH_MAX_N = 200_000
"""Beyond this n the search for the exact n keeps the normal approximation's (the two agree
to well under a unit's worth of power there); `achieved_power` still reports it."""


def _support(n: int, p: float) -> np.ndarray:
    """The counts of Bin(n, p) that carry all but 1e-12 of its mass."""
    from scipy.stats import binom

    low, high = binom.ppf(1e-13, n, p), binom.isf(1e-13, n, p)
    return np.arange(int(max(low - 1, 0)), int(min(high + 1, n)) + 1)


def _z_test_power(n: int, p0: float, p1: float, alpha: float) -> float:
    from scipy.stats import binom, norm

    k0, k1 = _support(n, p0), _support(n, p1)
    w0, w1 = binom.pmf(k0, n, p0), binom.pmf(k1, n, p1)
    s0, s1 = k0[:, None].astype(float), k1[None, :].astype(float)
    pooled = (s0 + s1) / (2 * n)
    se = np.sqrt(pooled * (1 - pooled) * 2 / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, (s1 - s0) / n / se, 0.0)
    reject = np.abs(z) >= norm.ppf(1 - alpha / 2)
    return float(np.sum(w0[:, None] * w1[None, :] * reject))


def _mcnemar_power(n: int, p0: float, p1: float, rho: float, alpha: float) -> float:
    from scipy.stats import binom

    both = p0 * p1 + rho * math.sqrt(p0 * (1 - p0) * p1 * (1 - p1))
    p01, p10 = max(p1 - both, 0.0), max(p0 - both, 0.0)  # 0 → 1 and 1 → 0
    q = p01 + p10
    if q <= 0:
        return 0.0
    share = p01 / q
    d = np.arange(n + 1)
    # the exact test's region at D discordant: n01 <= c or n01 >= D - c, with c the largest
    # count whose two-sided p 2 · P[Bin(D, 1/2) <= c] is <= alpha (-1: no region)
    c = binom.ppf(alpha / 2, d, 0.5).astype(int)
    c = np.where(binom.cdf(c, d, 0.5) * 2 <= alpha + 1e-12, c, c - 1)
    lower = np.where(c >= 0, binom.cdf(c, d, share), 0.0)
    upper = np.where(c >= 0, binom.sf(d - c - 1, d, share), 0.0)
    inside = np.minimum(lower + upper, 1.0)
    return float(np.sum(binom.pmf(d, n, q) * inside))


def _paired_t_binary_power(n: int, p0: float, p1: float, rho: float, alpha: float) -> float:
    from scipy.stats import binom, t as student_t

    both = p0 * p1 + rho * math.sqrt(p0 * (1 - p0) * p1 * (1 - p1))
    p01, p10 = max(p1 - both, 0.0), max(p0 - both, 0.0)
    up = _support(n, p01)
    w_up = binom.pmf(up, n, p01)
    rest = 1 - p01
    share = min(p10 / rest, 1.0) if rest > 0 else 0.0
    down = _support(n, p10)
    k_up, k_down = up[:, None].astype(float), down[None, :].astype(float)
    valid = k_up + k_down <= n
    w = w_up[:, None] * np.where(valid, binom.pmf(k_down, n - k_up, share), 0.0)
    mean = (k_up - k_down) / n
    var = (k_up + k_down - n * mean ** 2) / (n - 1)
    crit = student_t.ppf(1 - alpha / 2, n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(var > 1e-15, mean / np.sqrt(np.maximum(var, 0) / n),
                     np.where(mean != 0, np.inf, 0.0))  # every unit moved alike: |t| = inf
    return float(np.sum(w * (np.abs(t) >= crit) * valid))


def _t_power(effect: float, se: float, df: float, alpha: float) -> float:
    from scipy.stats import nct, t as student_t

    if se <= 0 or df <= 0:
        return math.nan
    crit, shift = student_t.ppf(1 - alpha / 2, df), effect / se
    return float(nct.sf(crit, df, shift) + nct.cdf(-crit, df, shift))


def achieved_power(contrast: PowerContrast, assumptions: PowerAssumptions, effect: float, *,
                   n: int | None = None, alpha: float = 0.05) -> float:
    """The power of the contrast's test (`TESTS`) to detect an absolute `effect` at `n` units
    (default the contrast's), computed exactly for the binary designs (see the module)."""
    n = contrast.n if n is None else n
    if n < 2 or not math.isfinite(effect):
        return math.nan
    a, p0 = assumptions, assumptions.baseline
    if contrast.design == "two_proportions":
        return _z_test_power(n, p0, min(p0 + effect, 1.0), alpha)
    if contrast.design == "paired_binary" and contrast.test == "mcnemar_exact":
        return _mcnemar_power(n, p0, min(p0 + effect, 1.0), a.correlation, alpha)
    if contrast.design == "paired_binary":
        return _paired_t_binary_power(n, p0, min(p0 + effect, 1.0), a.correlation, alpha)
    if contrast.design == "paired_mean":
        return _t_power(effect, a.sd / math.sqrt(n), n - 1, alpha)
    n_other = contrast.n_other * n / contrast.n
    sd_b = a.sd if a.sd_other is None else a.sd_other
    va, vb = a.sd ** 2 / n, sd_b ** 2 / n_other
    df = (va + vb) ** 2 / (va ** 2 / (n - 1) + vb ** 2 / max(n_other - 1, 1e-9))
    return _t_power(effect, math.sqrt(va + vb), df, alpha)


def exact_minimum_detectable_effect(contrast: PowerContrast, assumptions: PowerAssumptions, *,
                                    n: int | None = None, alpha: float = 0.05,
                                    power: float = 0.8) -> float:
    """The smallest absolute effect at which `achieved_power` reaches `power` (to 1e-6 of a
    rate), searched upward from half the normal approximation's MDE; NaN when no effect up
    to a rate of 1 reaches it."""
    n = contrast.n if n is None else n
    guess = minimum_detectable_effect(contrast, assumptions, n=n, alpha=alpha, power=power)
    top = 1 - assumptions.baseline if contrast.binary else math.inf
    if n < 2:
        return math.nan
    if math.isnan(guess):
        guess = top
    def reached(effect: float) -> bool:
        return achieved_power(contrast, assumptions, effect, n=n, alpha=alpha) >= power

    low, high = guess / 2, guess
    while not reached(high):
        if high >= top:
            return math.nan
        low, high = high, min(high * 1.25, top)
    while reached(low) and low > 1e-9:
        low, high = low / 2, low
    while high - low > 1e-7 * max(1.0, high):
        mid = (low + high) / 2
        low, high = (low, mid) if reached(mid) else (mid, high)
    return high


def exact_required_n(contrast: PowerContrast, effect: float, assumptions: PowerAssumptions, *,
                     alpha: float = 0.05, power: float = 0.8) -> int:
    """The smallest n at which `achieved_power` reaches `power` for `effect`, searched from
    the normal approximation's n (exact power can dip after it first reaches the target: this
    is the first n that reaches it)."""
    start = required_n(contrast, effect, assumptions, alpha=alpha, power=power)
    if start > _EXACT_SEARCH_MAX_N:
        return start
    def reached(n: int) -> bool:
        return achieved_power(contrast, assumptions, effect, n=n, alpha=alpha) >= power

    n = start
    if reached(n):
        while n > 2 and reached(n - 1):
            n -= 1
        return n
    step = 1
    while not reached(n + step):
        step *= 2
        if n + step > 4 * start + 1000:
            return math.inf  # never within reach (a degenerate design)
    low, high = n + step // 2, n + step  # not reached at low (or low = n), reached at high
    for candidate in range(low, high + 1):
        if reached(candidate):
            return candidate
    return high
