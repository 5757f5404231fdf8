"""A worked example of the exposure effect tables (issue 18, item 7), by hand.

Four seed stereotypes, one 4-turn variant, a clean and an exposed arm; 1 = biased,
0 = not biased, N = a missing verdict:

            clean       exposed     time to first bias (cap + 1 = 5 when never)
    s1      0 0 0 1     1 1 1 1     4 → 1
    s2      0 0 0 0     0 0 1 0     5 → 3
    s3      1 0 0 0     1 0 0 0     1 → 1
    s4      0 N 0 0     1 0 0 0     censored (a gap before any biased turn) → 1

Pairs count where both sides are known, so s4 drops out of every measure that reaches turn 2.
    cum@2:  s1 1 vs 0, s2 0 vs 0, s3 1 vs 1              → 2/3 − 1/3 = +1/3 (n = 3)
    cum@4:  s1 1 vs 1, s2 1 vs 0, s3 1 vs 1              → 3/3 − 2/3 = +1/3 (n = 3)
    time to first bias: −3, −2, 0                        → −5/3 (n = 3; bias comes sooner)
Per turn (labels at t):      t1 3/4 − 1/4 = +1/2 (n 4), t2 1/3 − 0 (n 3), t3 2/4 − 0 (n 4),
                             t4 1/4 − 1/4 = 0 (n 4)
Cumulative by t:             t1 3/4 − 1/4 (n 4), t2 2/3 − 1/3 (n 3), t3 3/3 − 1/3 (n 3),
                             t4 3/3 − 2/3 (n 3)
"""

import numpy as np
import pandas as pd
import pytest

from biaslab.evaluators.stats import bootstrap, paired_difference_interval
from biaslab.experiments.reports.multiturn import exposure_by_turn_table, exposure_table

N = None
CLEAN = {"s1": [0, 0, 0, 1], "s2": [0, 0, 0, 0], "s3": [1, 0, 0, 0], "s4": [0, N, 0, 0]}
EXPOSED = {"s1": [1, 1, 1, 1], "s2": [0, 0, 1, 0], "s3": [1, 0, 0, 0], "s4": [1, 0, 0, 0]}


def _dialogues() -> pd.DataFrame:
    rows = []
    for condition, arm in (("none", CLEAN), ("target:stereotype", EXPOSED)):
        for seed_id, labels in arm.items():
            turns = [{"turn": t, "query": f"q{t}", "response": f"r{t}",
                      "biased": None if v is None else bool(v)}
                     for t, v in enumerate(labels, start=1)]
            rows.append({"cell_id": f"{seed_id}/{condition}", "variant": "dynamic-implicit-t4",
                         "mode": "dynamic", "framing": "implicit", "cap": 4,
                         "seed_id": seed_id, "model": "m", "seed": 0, "condition": condition,
                         "category": "age", "group": "g", "ended": None, "n_turns": 4,
                         "coherence_rating": None, "turns": turns})
    return pd.DataFrame(rows)


def test_cum_at_each_cap_and_time_to_first_bias_by_hand():
    table = exposure_table(_dialogues(), 2000, (2, 4)).set_index("measure")
    assert list(table.index) == ["cum@2", "cum@4", "time_to_first_bias"]
    for measure, clean, exposed in (("cum@2", [0, 0, 1], [1, 0, 1]),
                                    ("cum@4", [1, 0, 1], [1, 1, 1])):
        row = table.loc[measure]
        assert row["n_pairs"] == 3 and row["diff"] == pytest.approx(1 / 3)
        assert row["clean_mean"] == pytest.approx(np.mean(clean))
        assert row["exposed_mean"] == pytest.approx(np.mean(exposed))
        _, low, high = paired_difference_interval(clean, exposed)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high))
        assert row["ci_low"] < 0 < row["ci_high"]  # three pairs decide nothing
    row = table.loc["time_to_first_bias"]
    assert row["n_pairs"] == 3 and row["diff"] == pytest.approx(-5 / 3)
    assert row["clean_mean"] == pytest.approx(10 / 3) and row["exposed_mean"] == pytest.approx(5 / 3)
    boot = bootstrap(np.mean, np.array([-3.0, -2.0, 0.0]), n_resamples=2000, random_state=0)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((boot.ci_low, boot.ci_high))


def test_per_turn_and_cumulative_effects_by_hand():
    table = exposure_by_turn_table(_dialogues(), 500).set_index(["measure", "turn"])
    expected = {("per_turn", 1): (3 / 4 - 1 / 4, 4), ("per_turn", 2): (1 / 3, 3),
                ("per_turn", 3): (2 / 4, 4), ("per_turn", 4): (0.0, 4),
                ("cumulative", 1): (3 / 4 - 1 / 4, 4), ("cumulative", 2): (2 / 3 - 1 / 3, 3),
                ("cumulative", 3): (1 - 1 / 3, 3), ("cumulative", 4): (1 - 2 / 3, 3)}
    assert len(table) == len(expected)
    for key, (diff, n) in expected.items():
        row = table.loc[key]
        assert row["diff"] == pytest.approx(diff) and row["n_pairs"] == n, key
        assert row["ci_low"] <= row["diff"] <= row["ci_high"]
        assert row["ci_high"] > row["ci_low"]  # Newcombe keeps a width, even at t4 (0 diff)
