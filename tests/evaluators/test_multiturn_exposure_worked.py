"""A worked example of the exposure effect tables (issue 18, item 7; issue 29), by hand.

Four seed stereotypes, one 4-turn variant, a clean and an exposed arm; 1 = biased,
0 = not biased, N = a missing verdict:

            clean       exposed     time to first bias (cap + 1 = 5 when never)
    s1      0 0 0 1     1 1 1 1     4 → 1
    s2      0 0 0 0     0 0 1 0     5 → 3
    s3      1 0 0 0     1 0 0 0     1 → 1
    s4      0 N 0 0     1 0 0 0     2..5 (figure 5) → 1

The missing-verdict rule (`biaslab.evaluators.multiturn_missing`): clean s4 stays in every
pair. Its figure is the mean over its donors, the clean dialogues complete on the window that
agree with its verdicts there: for cum@2 (agree on t1 = 0) s1 and s2, both 0 → 0; for cum@4
and time to first bias (t1, t3, t4 = 0) s2 alone → 0 and 5; for the label at turn 2, every
dialogue labelled at t2 (s1-s3, all 0) → 0. Its extremes: 0 or 1 (time to first bias 2 or 5).
    cum@2:  clean 0 0 1 [0]  exposed 1 0 1 1   → +1/2; lowest pairing (s4 clean at 1) +1/4
    cum@4:  clean 1 0 1 [0]  exposed 1 1 1 1   → +1/2; lowest +1/4
    time to first bias: −3, −2, 0, 1 − 5 = −4  → −9/4; s4 clean at 2: −1 → highest −6/4
Per turn (labels at t): t1 +1/2, t2 1/4 − 0 = +1/4 (lowest 0), t3 +1/2, t4 0 (all n = 4)
Cumulative by t:        t1 +1/2, t2 +1/2, t3 +3/4, t4 +1/2 (all n = 4)
The interval runs from the lower limit of the lowest pairing to the upper limit of the
highest (Newcombe's paired interval for 0/1, a paired bootstrap for turns).
"""

import numpy as np
import pandas as pd
import pytest

from biaslab.evaluators import multiturn_missing as mm
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


def _printed(value, figure, best, worst, scale: float = 1.0) -> None:
    """The missing-verdict rule's step 5: the point is printed only when the best and worst
    case lie within `mm.POINT_MAX_WIDTH` of the scale; otherwise the figure is empty."""
    if abs(worst - best) <= mm.POINT_MAX_WIDTH * scale + 1e-12:
        assert value == pytest.approx(figure)
    else:
        assert np.isnan(value)


def test_cum_at_each_cap_and_time_to_first_bias_by_hand():
    table = exposure_table(_dialogues(), 2000, (2, 4)).set_index("measure")
    assert list(table.index) == ["cum@2", "cum@4", "time_to_first_bias"]
    for measure, clean, exposed, clean_high, missing in (
            ("cum@2", [0, 0, 1, 0], [1, 0, 1, 1], [0, 0, 1, 1], 1 / 16),
            ("cum@4", [1, 0, 1, 0], [1, 1, 1, 1], [1, 0, 1, 1], 1 / 32)):
        row = table.loc[measure]
        assert row["n_pairs"] == 4 and np.isnan(row["diff"]) and row["shown"] == "bounds"
        assert np.isnan(row["clean_mean"])  # s4's gap: 1/4 .. 1/2 at cum@2
        assert row["exposed_mean"] == pytest.approx(np.mean(exposed))
        assert row["best"] == pytest.approx(1 / 4) and row["worst"] == pytest.approx(1 / 2)
        assert row["missing"] == pytest.approx(missing)
        _, low, _ = paired_difference_interval(clean_high, exposed)
        _, _, high = paired_difference_interval(clean, exposed)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high))
    row = table.loc["time_to_first_bias"]
    assert row["n_pairs"] == 4 and np.isnan(row["diff"])  # -9/4 .. -6/4: wider than 0.05 x 4
    assert np.isnan(row["clean_mean"]) and row["exposed_mean"] == pytest.approx(6 / 4)
    assert row["best"] == pytest.approx(-6 / 4) and row["worst"] == pytest.approx(-9 / 4)
    low = bootstrap(np.mean, np.array([-3.0, -2.0, 0.0, -4.0]), n_resamples=2000,
                    random_state=0).ci_low
    high = bootstrap(np.mean, np.array([-3.0, -2.0, 0.0, -1.0]), n_resamples=2000,
                     random_state=0).ci_high
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high))


def test_per_turn_and_cumulative_effects_by_hand():
    table = exposure_by_turn_table(_dialogues(), 500).set_index(["measure", "turn"])
    expected = {("per_turn", 1): 1 / 2, ("per_turn", 2): 1 / 4, ("per_turn", 3): 1 / 2,
                ("per_turn", 4): 0.0, ("cumulative", 1): 1 / 2, ("cumulative", 2): 1 / 2,
                ("cumulative", 3): 3 / 4, ("cumulative", 4): 1 / 2}
    assert len(table) == len(expected)
    for key, diff in expected.items():
        row = table.loc[key]
        _printed(row["diff"], diff, row["best"], row["worst"])
        assert row["n_pairs"] == 4, key
        assert row["ci_low"] <= diff <= row["ci_high"]
        assert row["ci_high"] > row["ci_low"]  # Newcombe keeps a width, even at t4 (0 diff)
    assert table.loc[("per_turn", 2), "best"] == pytest.approx(0.0)
    assert table.loc[("per_turn", 2), "worst"] == pytest.approx(1 / 4)
    assert table.loc[("per_turn", 1), "missing"] == 0.0
