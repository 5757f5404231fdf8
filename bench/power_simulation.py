"""Check `biaslab estimate --power` by simulation: at each design's MDE, the test the report
runs rejects in about 80% of simulated runs.

For each design, the script takes a stated n, asks `biaslab.evaluators.power` for the MDE at
80% power and α = 0.05, then simulates RUNS runs with exactly that effect from a known
generating process, applies the test the report applies, and counts the rejections:

- two proportions (roleplay, Table 5): answers drawn independently, biased with rate p0
  without the role and p0 + MDE with it, as ``scripted:roleplay-synthetic@role=..,no_role=..``
  draws them (one hashed draw per answer); the test is `two_proportion_ztest`.
- paired binary (multiturn dialogues, augmentation sources): each unit's clean and exposed
  0/1 reading from a bivariate Bernoulli with rates p0 and p0 + MDE and correlation ρ (a
  susceptible unit tends to stay biased); the test is a paired t test on the differences, as
  ``exposed_vs_clean.csv`` computes it.
- group difference (amplification FBS): per record, predictions change between runs by
  sampling noise both ways, and the exposure adds passes to the favoured group only, as
  ``scripted:amplification-synthetic`` lowers only the favoured group's failure; the SDs of
  the per-record changes are the process's own (a pilot's, in effect), the shift is solved so
  that FBS equals the MDE at those SDs, and the test is a Welch z test on FBS.

No model is called. Usage: ``python bench/power_simulation.py [--runs 400] [--seed 0]``;
it prints one line per design and exits 1 when one misses 80% by more than 5 points.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from scipy import stats

from biaslab.evaluators.power import (PowerAssumptions, PowerContrast,
                                      minimum_detectable_effect)
from biaslab.evaluators.stats import two_proportion_ztest

ALPHA, TARGET, TOLERANCE = 0.05, 0.8, 0.05


def two_proportions(rng, runs: int, n: int = 3000, p0: float = 0.2) -> tuple[float, float]:
    c = PowerContrast("role vs no role", "answer", "two_proportions", n)
    mde = minimum_detectable_effect(c, PowerAssumptions(baseline=p0))
    hits = 0
    for _ in range(runs):
        a, b = rng.binomial(n, p0 + mde), rng.binomial(n, p0)
        hits += two_proportion_ztest(int(a), n, int(b), n).p_value < ALPHA
    return mde, hits / runs


def _bivariate_bernoulli(rng, n, p0, p1, rho):
    """Pairs with marginals p0, p1 and correlation rho (exact joint table)."""
    cov = rho * math.sqrt(p0 * (1 - p0) * p1 * (1 - p1))
    p11 = p0 * p1 + cov
    table = np.array([1 - p0 - p1 + p11, p1 - p11, p0 - p11, p11])  # 00, 01, 10, 11
    cells = rng.choice(4, size=n, p=table / table.sum())
    return (cells >= 2).astype(float), (cells % 2).astype(float)  # clean, exposed


def paired_binary(rng, runs: int, n: int = 240, p0: float = 0.3, rho: float = 0.4
                  ) -> tuple[float, float]:
    c = PowerContrast("exposed vs clean", "dialogue", "paired_binary", n)
    mde = minimum_detectable_effect(c, PowerAssumptions(baseline=p0, correlation=rho))
    hits = 0
    for _ in range(runs):
        clean, exposed = _bivariate_bernoulli(rng, n, p0, p0 + mde, rho)
        hits += stats.ttest_1samp(exposed - clean, 0.0).pvalue < ALPHA
    return mde, hits / runs


def group_difference(rng, runs: int, n_f: int = 200, n_m: int = 200, noise: float = 0.1
                     ) -> tuple[float, float]:
    """A record's prediction changes between two runs by sampling noise alone (+1 or −1 with
    probability `noise` each); the exposure adds a pass for `shift` more of the favoured
    group (+1 with probability noise + shift), as the synthetic agent lowers only the
    favoured group's failure. FBS = shift; the SDs are the process's own (a pilot's, in
    effect), and shift is solved so that it equals the MDE at those SDs."""
    c = PowerContrast("FBS", "record", "group_difference", n_f, n_m)
    sd_m = math.sqrt(2 * noise)
    shift = 0.1
    for _ in range(50):  # the favoured SD depends on the effect: shift = MDE(SD(shift))
        sd_f = math.sqrt(2 * noise + shift - shift ** 2)
        shift = minimum_detectable_effect(c, PowerAssumptions(sd=sd_f, sd_other=sd_m))
    hits = 0
    for _ in range(runs):
        fav = rng.choice([-1.0, 0.0, 1.0], size=n_f,
                         p=[noise, 1 - 2 * noise - shift, noise + shift])
        other = rng.choice([-1.0, 0.0, 1.0], size=n_m, p=[noise, 1 - 2 * noise, noise])
        fbs = fav.mean() - other.mean()
        se = math.sqrt(fav.var(ddof=1) / n_f + other.var(ddof=1) / n_m)
        hits += se > 0 and abs(fbs / se) > stats.norm.ppf(1 - ALPHA / 2)
    return shift, hits / runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    ok = True
    for name, fn, setting in (
            ("two proportions (roleplay)", two_proportions, "n = 3000 answers per arm, p0 0.2"),
            ("paired binary (multiturn)", paired_binary, "n = 240 dialogues, p0 0.3, rho 0.4"),
            ("group difference (FBS)", group_difference, "n = 200 + 200 records")):
        mde, power = fn(rng, args.runs)
        ok &= abs(power - TARGET) <= TOLERANCE
        print(f"{name:30s} {setting:38s} MDE {mde:.4f}  empirical power {power:.3f} "
              f"over {args.runs} runs")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
