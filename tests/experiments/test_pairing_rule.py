"""One pairing rule for every paired table: a pair is a unit, its seeds averaged first.

Worked by hand (docs/analysis.md#pairing): a deterministic model, whose seeds repeat one
answer, and a noisy one, whose seeds differ. The per-seed view is the named alternative.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from biaslab.evaluators.exposure_effects import SEED_PAIRING
from biaslab.experiments.reports.generic import exposed_vs_clean
from biaslab.experiments.reports.mitigations import mitigation_effects
from biaslab.experiments.reports.units import UNIT_KEYS
from biaslab.graphs.units import AnalysisUnit

T_975_DF9 = 2.262157162798205  # Student t, 97.5% quantile, df 9
T_975_DF19 = 2.0930240544083087  # df 19
UNIT = AnalysisUnit("case")


def _frame(arms: dict[str, dict[str, tuple]]) -> pd.DataFrame:
    """arms: condition -> case -> one value per seed (seeds 1, 2, ...)."""
    rows = []
    for condition, cases in arms.items():
        for case, values in cases.items():
            for seed, value in enumerate(values, start=1):
                rows.append({"variant": "default", "item": case, "condition": condition,
                             "model": "m", "seed": seed, "node": "judge", "visit": 0,
                             "unit": case, "stratum": "", "group": "all", "field": "older",
                             "value": value})
    return pd.DataFrame(rows)[[*UNIT_KEYS, "value"]]


def test_a_deterministic_model_is_four_pairs_not_twelve():
    """4 cases x 3 seeds, every seed the same answer: 0 clean, 1 exposed."""
    units = _frame({"none": {f"c{i}": (0, 0, 0) for i in range(4)},
                    "draft:pro_older": {f"c{i}": (1, 1, 1) for i in range(4)}})
    row = exposed_vs_clean(units, UNIT).iloc[0]
    assert (row["pairing"], row["n_pairs"], row["n_seeds"], row["diff"]) == (
        "unit, seeds averaged", 4, 3, 1.0)
    assert math.isnan(row["ci_low"]) and row["note"] == "too few pairs (n=4)"
    # the per-seed view: 12 "pairs", every difference 1, a zero-width interval
    per_seed = exposed_vs_clean(units, UNIT, pairing=SEED_PAIRING).iloc[0]
    assert (per_seed["pairing"], per_seed["n_pairs"], per_seed["n_seeds"]) == (
        "unit x seed", 12, 1)
    assert (per_seed["ci_low"], per_seed["ci_high"]) == (1.0, 1.0)


CLEAN = {"c0": (0, 0), "c1": (0, 1), "c2": (1, 1), "c3": (0, 0), "c4": (1, 0),
         "c5": (0, 0), "c6": (1, 1), "c7": (0, 1), "c8": (0, 0), "c9": (1, 0)}
EXPOSED = {"c0": (1, 1), "c1": (1, 1), "c2": (1, 1), "c3": (0, 1), "c4": (1, 1),
           "c5": (0, 0), "c6": (1, 0), "c7": (1, 1), "c8": (1, 0), "c9": (1, 1)}


def test_a_noisy_model_pairs_the_seed_means_of_ten_cases():
    """Per case, exposed minus clean of the two-seed means:
    c0 1, c1 .5, c2 0, c3 .5, c4 .5, c5 0, c6 -.5, c7 .5, c8 .5, c9 .5: mean 3.5/10 = 0.35;
    squared deviations sum to 1.525, so s = sqrt(1.525/9) and the interval is
    0.35 ± t(0.975, 9) · s / sqrt(10) = [0.0555, 0.6445]."""
    row = exposed_vs_clean(_frame({"none": CLEAN, "x:pro": EXPOSED}), UNIT).iloc[0]
    assert (row["n_pairs"], row["n_seeds"]) == (10, 2)
    assert (row["clean_mean"], row["exposed_mean"]) == pytest.approx((0.4, 0.75), abs=1e-12)
    assert row["diff"] == pytest.approx(0.35, abs=1e-12)
    half = T_975_DF9 * math.sqrt(1.525 / 9) / math.sqrt(10)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((0.35 - half, 0.35 + half),
                                                            abs=1e-12)
    assert row["ci_low"] == pytest.approx(0.0555, abs=1e-4) and row["note"] == ""
    # per seed: 20 differences (eight 1s, one -1, eleven 0s), the same mean, a narrower CI
    per_seed = exposed_vs_clean(_frame({"none": CLEAN, "x:pro": EXPOSED}), UNIT,
                                pairing=SEED_PAIRING).iloc[0]
    sd = math.sqrt((9 - 20 * 0.35 ** 2) / 19)
    assert per_seed["n_pairs"] == 20 and per_seed["diff"] == pytest.approx(0.35, abs=1e-12)
    assert per_seed["ci_high"] - 0.35 == pytest.approx(T_975_DF19 * sd / math.sqrt(20),
                                                       abs=1e-12)
    assert per_seed["ci_high"] - per_seed["ci_low"] < row["ci_high"] - row["ci_low"]


def test_a_seed_scored_in_one_arm_only_is_left_out_of_both_means():
    """c0's second seed has no exposed value: its pair averages seed 1 alone, in both arms."""
    exposed = {**EXPOSED, "c0": (1, float("nan"))}
    clean = {**CLEAN, "c0": (0, 1)}
    row = exposed_vs_clean(_frame({"none": clean, "x:pro": exposed}), UNIT).iloc[0]
    # c0 now differs by 1 - 0 (seed 1 only), as before; the clean mean still counts c0 as 0
    assert row["n_pairs"] == 10 and row["diff"] == pytest.approx(0.35, abs=1e-12)
    assert row["clean_mean"] == pytest.approx(0.4, abs=1e-12)


def test_mitigation_effects_follow_the_same_rule():
    units = _frame({"none": CLEAN, "none+mit:judge:fairness_reminder": EXPOSED})
    row = mitigation_effects(units, UNIT).iloc[0]
    assert (row["pairing"], row["n_pairs"], row["n_seeds"]) == ("unit, seeds averaged", 10, 2)
    assert row["diff"] == pytest.approx(0.35, abs=1e-12)
    assert mitigation_effects(units, UNIT, pairing=SEED_PAIRING).iloc[0]["n_pairs"] == 20


def test_a_protocol_whose_seeds_make_units_pairs_unit_and_seed():
    dialogue = AnalysisUnit("dialogue", seed_units=True)
    row = exposed_vs_clean(_frame({"none": CLEAN, "x:pro": EXPOSED}), dialogue).iloc[0]
    assert (row["pairing"], row["n_pairs"], row["n_seeds"]) == (
        "unit x seed (each seed a new unit)", 20, 1)
