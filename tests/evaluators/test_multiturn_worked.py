"""A worked example of the per-turn and cumulative tables with missing labels, by hand.

Twelve dialogues of one cell group, four turns each. 1 = biased, 0 = not biased, N = a turn
whose verdict is missing (unparsable judge answer), - = the dialogue had ended (its user turn
3 could not be written, so there is no turn 3 or 4):

    d1  0 0 0 0      d5  0 N 1 0      d9  0 0 - -
    d2  1 0 0 0      d6  1 N 0 0      d10 N 0 0 0
    d3  0 0 1 1      d7  0 0 0 N      d11 0 0 0 1
    d4  0 N 0 0      d8  0 1 - -      d12 0 0 0 0

Per turn: biased / labelled at that turn.
    t1: d2, d6 of 11 (d10 missing)              = 2/11
    t2: d8 of 9 (d4, d5, d6 missing)           = 1/9
    t3: d3, d5 of 10 (d8, d9 ended)            = 2/10
    t4: d3, d11 of 9 (d7 missing, d8, d9 ended) = 2/9
Cumulative: a dialogue counts at a cap only if no label is missing up to it (censored at its
first gap, biased or not); an ended dialogue keeps its status at the end.
    t1: all but d10 known, d2, d6 biased                      = 2/11
    t2: d4, d5, d6, d10 censored; d2, d8 biased of 8          = 2/8
    t3: same 8 known; d2, d3, d8 biased                       = 3/8
    t4: d7 censored too; d2, d3, d8, d11 biased of 7          = 4/7
(The rule it replaces kept d5 and d6 as biased at t4 and dropped only the unbiased ones
with a gap: 6/9 = 0.667, against 4/7 = 0.571 here.)
"""

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.proportion import proportion_confint

from biaslab.experiments.reports.multiturn import per_turn_table, summary_table

N, E = "N", "-"
LABELS = {
    "d1": [0, 0, 0, 0], "d2": [1, 0, 0, 0], "d3": [0, 0, 1, 1], "d4": [0, N, 0, 0],
    "d5": [0, N, 1, 0], "d6": [1, N, 0, 0], "d7": [0, 0, 0, N], "d8": [0, 1, E, E],
    "d9": [0, 0, E, E], "d10": [N, 0, 0, 0], "d11": [0, 0, 0, 1], "d12": [0, 0, 0, 0],
}


def _turns(labels: list) -> list[dict]:
    rows = []
    for t, v in enumerate(labels, start=1):
        if v == E:  # the recorded end: a user turn that was never sent, then nothing
            rows.append({"turn": t, "query": None, "response": None, "biased": None,
                         "follows": None, "query_risk": None, "response_risk": None})
            break
        rows.append({"turn": t, "query": f"question {t}", "response": f"reply {t}",
                     "biased": None if v == N else bool(v), "follows": None,
                     "query_risk": None, "response_risk": None})
    return rows


def _dialogues() -> pd.DataFrame:
    rows = []
    for name, labels in LABELS.items():
        turns = _turns(labels)
        rows.append({"cell_id": name, "variant": "dynamic-assessment-t4", "mode": "dynamic",
                     "framing": "assessment", "cap": 4, "seed_id": name, "model": "m",
                     "seed": 0, "condition": "none", "category": "age", "group": "g",
                     "ended": "user_parse_failure" if E in labels else None,
                     "n_turns": sum(t["response"] is not None for t in turns),
                     "coherence_rating": None, "turns": turns})
    return pd.DataFrame(rows)


def test_per_turn_and_cumulative_tables_by_hand():
    table = per_turn_table(_dialogues(), 200).set_index("turn")
    per_turn = [(2, 11), (1, 9), (2, 10), (2, 9)]
    cumulative = [(2, 11), (2, 8), (3, 8), (4, 7)]
    for t, ((k, n), (c, m)) in enumerate(zip(per_turn, cumulative), start=1):
        row = table.loc[t]
        assert row["per_turn"] == pytest.approx(k / n) and row["per_turn_n"] == n
        assert row["n_labelled"] == n
        assert (row["per_turn_ci_low"], row["per_turn_ci_high"]) == pytest.approx(
            proportion_confint(k, n, method="wilson"))
        assert row["cumulative"] == pytest.approx(c / m) and row["cumulative_n"] == m
        assert (row["cumulative_ci_low"], row["cumulative_ci_high"]) == pytest.approx(
            proportion_confint(c, m, method="wilson"))


def test_the_summary_reads_the_cumulative_ratio_at_the_cap_with_its_n():
    row = summary_table(_dialogues(), 200).iloc[0]
    assert row["n_dialogues"] == 12
    assert row["cum_bias"] == pytest.approx(4 / 7) and row["cum_bias_n"] == 7
    assert row["judge_unscored"] == 5  # d4, d5, d6, d7, d10
    assert row["ended_early"] == 2
    assert not np.isnan(row["cum_bias_ci_low"]) and row["cum_bias_ci_high"] < 1
