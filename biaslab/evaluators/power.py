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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from scipy.optimize import brentq
from scipy.stats import norm

from biaslab.errors import UserError

__all__ = ["PowerContrast", "PowerAssumptions", "Design", "DESIGNS", "z_sum",
           "minimum_detectable_effect", "required_n", "check_effect", "DEFAULT_SD",
           "DEFAULT_BASELINE"]

Design = Literal["two_proportions", "paired_binary", "paired_mean", "group_difference"]
DESIGNS: tuple[str, ...] = ("two_proportions", "paired_binary", "paired_mean",
                            "group_difference")
DEFAULT_BASELINE = 0.5
"""The reference arm's rate when neither a pilot nor ``--baseline`` says: the rate at which a
binary measure is noisiest, so the MDE is the largest it can be."""
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
    """

    label: str
    unit: str
    design: Design
    n: int
    n_other: int | None = None
    measure: str | None = None
    pool_seeds: bool = True
    groups: tuple[str, str] | None = None

    def __post_init__(self):
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
