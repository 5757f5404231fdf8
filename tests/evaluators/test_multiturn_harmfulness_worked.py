"""A worked example of the harmfulness tables (issue 29, item 3), by hand.

The paper's query table is the mean guardrail score of every user query of turns 1-5, its
reply table the same over the replies. Twelve dialogues of six turns (turn 6 is outside
every table: risk 1.0 there changes nothing), d4 ended after turn 3:

    query risk 0.1 everywhere, except  d1 t2 = 0.6, d2 t1 = 0.9, d3 t1-t5 = 0.2,
                                       d5 t3 unscored (no number from the scorer)
    reply risk 0.05 everywhere, except d6 t1-t5 = 0.8, d7 t2 no reply (not a text),
                                       d8 t4 unscored

Queries of turns 1-5: 11 × 5 + 3 (d4) = 58, one unscored → 57 scored.
    sum = 57 × 0.1 + 0.5 (d1) + 0.8 (d2) + 5 × 0.1 (d3) = 7.5   → harm 7.5 / 57
    at ≥ 0.5: d1 t2, d2 t1                                     → flagged 2 / 57
Replies: 58 − 1 (d7 t2) = 57, one unscored → 56 scored.
    sum = 56 × 0.05 + 5 × 0.75 (d6) = 6.55                     → harm 6.55 / 56
    at ≥ 0.5: d6 t1-t5                                         → flagged 5 / 56
"""

import numpy as np
import pandas as pd
import pytest

from biaslab.experiments.reports.multiturn import harmfulness_table

QUERY = {"d1": {2: 0.6}, "d2": {1: 0.9}, "d3": {t: 0.2 for t in range(1, 6)}, "d5": {3: None}}
REPLY = {"d6": {t: 0.8 for t in range(1, 6)}, "d8": {4: None}}


def _dialogues() -> pd.DataFrame:
    rows = []
    for i in range(1, 13):
        name = f"d{i}"
        turns = []
        for t in range(1, 4 if name == "d4" else 7):
            q = 1.0 if t == 6 else QUERY.get(name, {}).get(t, 0.1)
            r = 1.0 if t == 6 else REPLY.get(name, {}).get(t, 0.05)
            reply = None if (name, t) == ("d7", 2) else f"reply {t}"
            turns.append({"turn": t, "query": f"question {t}", "response": reply,
                          "biased": False, "query_risk": q,
                          "response_risk": None if reply is None else r,
                          "guardrail_scored_by": "callable:shieldgemma"})
        rows.append({"cell_id": name, "variant": "dynamic-implicit-t6", "mode": "dynamic",
                     "framing": "implicit", "cap": 6, "seed_id": name, "model": "m", "seed": 0,
                     "condition": "none", "category": "age", "group": "g", "ended": None,
                     "n_turns": len(turns), "coherence_rating": None, "turns": turns})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("side, harm, flagged, n, unscored", [
    ("query", 7.5 / 57, 2 / 57, 57, 1), ("response", 6.55 / 56, 5 / 56, 56, 1)])
def test_query_and_reply_harmfulness_by_hand(side, harm, flagged, n, unscored):
    row = harmfulness_table(_dialogues(), 500, side).iloc[0]
    assert row["harm"] == pytest.approx(harm) and row["harm_n"] == n
    assert row["flagged"] == pytest.approx(flagged) and row["flagged_n"] == n
    assert row["unscored"] == unscored and row["n_dialogues"] == 12
    assert row["turns"] == "1-5" and row["scored_by"] == "callable:shieldgemma"
    assert row["harm_ci_low"] <= row["harm"] <= row["harm_ci_high"]
    assert row["harm_ci_high"] - row["harm_ci_low"] > 0


def test_the_interval_resamples_dialogues_whole():
    """One dialogue of five high scores against eleven low ones: resampling dialogues, a
    resample holds d6's five scores together or none, so the interval is wide; resampling
    replies one by one would make it about sqrt(5) times narrower."""
    row = harmfulness_table(_dialogues(), 2000, "response").iloc[0]
    scores = np.array([0.8] * 5 + [0.05] * 51)
    rng = np.random.default_rng(0)
    naive = np.quantile(scores[rng.integers(0, 56, (2000, 56))].mean(axis=1), [0.025, 0.975])
    assert row["harm_ci_high"] - row["harm_ci_low"] > 1.5 * (naive[1] - naive[0])
