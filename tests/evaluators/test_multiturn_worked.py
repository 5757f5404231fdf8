"""A worked example of the per-turn and cumulative tables with missing labels, by hand.

Twelve dialogues of one cell group, four turns each. 1 = biased, 0 = not biased, N = a turn
whose verdict is missing (unparsable judge answer), - = the dialogue had ended (its user turn
3 could not be written, so there is no turn 3 or 4):

    d1  0 0 0 0      d5  0 N 1 0      d9  0 0 - -
    d2  1 0 0 0      d6  1 N 0 0      d10 N 0 0 0
    d3  0 0 1 1      d7  0 0 0 N      d11 0 0 0 1
    d4  0 N 0 0      d8  0 1 - -      d12 0 0 0 0

The missing-verdict rule (`biaslab.evaluators.multiturn_missing`): no dialogue is dropped. A
dialogue whose value a missing verdict could change takes the mean value of its donors: the
dialogues complete on the measure's turns that agree with every verdict it has there. Beside
each figure: best case (missing = not biased), worst case (missing = biased), and the
interval from the Wilson lower limit of the best case to the upper limit of the worst case.

Per turn t (over the dialogues that ran t; the figure is biased / labelled at t):
    t1: 2/11 (d10 missing), best 2/12, worst 3/12
    t2: 1/9 (d4, d5, d6 missing), best 1/12, worst 4/12
    t3: 2/10 (d8, d9 ended), best = worst = 2/10
    t4: 2/9 (d7 missing), best 2/10, worst 3/10
Cumulative by t2: d2, d6, d8 biased; d4, d5 (0 N) take the donors agreeing on t1 = 0 and
complete on t1-t2 (d1 d3 d7 d8 d9 d11 d12: one of seven biased) → 1/7 each; d10 (N 0)
takes those agreeing on t2 = 0 (d1 d2 d3 d7 d9 d11 d12: d2 biased) → 1/7.
    figure (3 + 3/7)/12 = 2/7, best 3/12, worst 6/12
Cumulative by t4: d2 d3 d5 d6 d8 d11 biased (d5 and d6 whatever their gap holds); d4
(0 N 0 0) has donors d1, d12 → 0; d7 (0 0 0 N) has d1, d11, d12 → 1/3; d10 (N 0 0 0) has
d1, d2, d12 → 1/3. d8 and d9 count over the two turns they ran.
    figure (6 + 2/3)/12 = 5/9, best 6/12, worst 9/12
(Complete-case, the rule this replaces, read 4/7 from 7 dialogues; keeping the decided ones
only would read 6/9.)
Re-emergence (biased, not, biased again): none of the twelve, whatever the gaps hold → 0.
Time to first bias by t4 (5 = never): d1 5, d2 1, d3 3, d4 5 (donors d1 d12; 2..5),
d5 3 (2..3; no donor agrees on 0 ? 1 0, the complete dialogues' mean 3.6 clipped to 3),
d6 1, d7 (0 0 0 N) donors d1 d11 d12 → 14/3 (4..5), d8 2, d9 5, d10 (N 0 0 0) donors
d1 d2 d12 → 11/3 (1..5), d11 4, d12 5.
    figure 127/36, best (latest) 44/12, worst (earliest) 35/12
"""

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.proportion import proportion_confint

from biaslab.evaluators import multiturn_missing as mm
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


def _printed(value, figure, best, worst, scale: float = 1.0) -> None:
    """The missing-verdict rule's step 5: the point is printed only when the best and worst
    case lie within `mm.POINT_MAX_WIDTH` of the scale; otherwise the figure is empty."""
    if abs(worst - best) <= mm.POINT_MAX_WIDTH * scale + 1e-12:
        assert value == pytest.approx(figure)
    else:
        assert np.isnan(value)


def test_per_turn_and_cumulative_tables_by_hand():
    table = per_turn_table(_dialogues(), 200).set_index("turn")
    per_turn = [((2, 11), (2, 12), (3, 12), 12), ((1, 9), (1, 12), (4, 12), 12),
                ((2, 10), (2, 10), (2, 10), 10), ((2, 9), (2, 10), (3, 10), 10)]
    for t, (figure, best, worst, n) in enumerate(per_turn, start=1):
        row = table.loc[t]
        _printed(row["per_turn"], figure[0] / figure[1], best[0] / best[1], worst[0] / worst[1])
        assert row["per_turn_n"] == n and row["n_labelled"] == figure[1]
        assert row["per_turn_best"] == pytest.approx(best[0] / best[1])
        assert row["per_turn_worst"] == pytest.approx(worst[0] / worst[1])
        assert row["per_turn_ci_low"] == pytest.approx(proportion_confint(*best, method="wilson")[0])
        assert row["per_turn_ci_high"] == pytest.approx(
            proportion_confint(*worst, method="wilson")[1])
    assert table.loc[2, "per_turn_missing"] == pytest.approx(3 / 12)
    cumulative = {1: (2 / 11, 2, 3), 2: (2 / 7, 3, 6), 4: (5 / 9, 6, 9)}
    for t, (figure, best, worst) in cumulative.items():
        row = table.loc[t]
        _printed(row["cumulative"], figure, best / 12, worst / 12)
        assert row["cumulative_n"] == 12
        assert row["cumulative_best"] == pytest.approx(best / 12)
        assert row["cumulative_worst"] == pytest.approx(worst / 12)
        assert (row["cumulative_ci_low"], row["cumulative_ci_high"]) == pytest.approx(
            (proportion_confint(best, 12, method="wilson")[0],
             proportion_confint(worst, 12, method="wilson")[1]))
    assert table.loc[4, "cumulative_undetermined"] == 3  # d4, d7, d10
    # turns in the windows at t4: 10 dialogues × 4 + d8, d9 × 2 = 44, of which 5 missing
    assert table.loc[4, "cumulative_missing"] == pytest.approx(5 / 44)


def test_the_summary_reads_every_measure_at_the_cap_with_its_bounds():
    row = summary_table(_dialogues(), 200).iloc[0]
    assert row["n_dialogues"] == 12
    assert np.isnan(row["cum_bias"]) and row["cum_bias_shown"] == "bounds"
    assert row["cum_bias_n"] == 12
    assert (row["cum_bias_best"], row["cum_bias_worst"]) == pytest.approx((6 / 12, 9 / 12))
    assert row["judge_unscored"] == 5  # d4, d5, d6, d7, d10
    assert row["ended_early"] == 2
    assert row["reemergence"] == 0 and row["reemergence_worst"] == 0
    assert np.isnan(row["first_bias"]) and row["first_bias_shown"] == "bounds"
    assert (row["first_bias_best"], row["first_bias_worst"]) == pytest.approx((44 / 12, 35 / 12))
    assert row["first_bias_ci_low"] <= 35 / 12 and row["first_bias_ci_high"] >= 44 / 12


# Re-emergence with gaps (a second dozen, four turns each, none ended):
#   r1 1 0 1 0  yes      r5 N 0 1 0  0..1     r9  0 N N 0  no (no fill gives 1 0 1)
#   r2 1 N 1 0  0..1     r6 1 1 0 0  no       r10 1 N 0 1  yes (either fill)
#   r3 1 0 N 1  yes      r7 0 1 0 1  yes      r11 0 0 1 1  no
#   r4 0 0 0 0  no       r8 1 0 0 0  no       r12 1 0 1 N  yes (already)
# Not monotone: r2 re-emerges with N = 0 only. Donors of r2 (complete, agreeing on 1 ? 1 0)
# and of r5 (? 0 1 0): r1 alone, which re-emerges → 1 each.
#   figure 7/12, best 5/12, worst 7/12; undetermined 2 (r2, r5).
# Cumulative by t4: all but r4 and r9 are biased somewhere; r9 (0 N N 0): donor r4 → 0.
#   figure 10/12, best 10/12, worst 11/12.
REEMERGE = {
    "r1": [1, 0, 1, 0], "r2": [1, N, 1, 0], "r3": [1, 0, N, 1], "r4": [0, 0, 0, 0],
    "r5": [N, 0, 1, 0], "r6": [1, 1, 0, 0], "r7": [0, 1, 0, 1], "r8": [1, 0, 0, 0],
    "r9": [0, N, N, 0], "r10": [1, N, 0, 1], "r11": [0, 0, 1, 1], "r12": [1, 0, 1, N],
}


def test_reemergence_with_gaps_by_hand():
    frame = _dialogues()
    frame["turns"] = [_turns(REEMERGE[f"r{i}"]) for i in range(1, 13)]
    frame["ended"] = None
    row = summary_table(frame, 200).iloc[0]
    assert np.isnan(row["reemergence"]) and row["reemergence_shown"] == "bounds"
    assert (row["reemergence_best"], row["reemergence_worst"]) == pytest.approx((5 / 12, 7 / 12))
    assert row["reemergence_undetermined"] == 2
    assert (row["reemergence_ci_low"], row["reemergence_ci_high"]) == pytest.approx(
        (proportion_confint(5, 12, method="wilson")[0],
         proportion_confint(7, 12, method="wilson")[1]))
    assert np.isnan(row["cum_bias"])  # 10/12 .. 11/12: wider than 0.05
    assert (row["cum_bias_best"], row["cum_bias_worst"]) == pytest.approx((10 / 12, 11 / 12))


def test_the_donor_fill_behind_the_bounds_by_hand():
    """The rule's fill (steps 1-2) is what the docstring computes by hand; it is no longer
    printed once the bounds are wide (step 5), but it still lies between them."""
    m = np.array([[np.nan if v in (N, E) else v for v in labels] for labels in LABELS.values()],
                 float)
    ran = np.array([sum(v != E for v in labels) for labels in LABELS.values()])
    assert mm.summarize(mm.ever_range(m, 2, ran)).value == pytest.approx(2 / 7)
    assert mm.summarize(mm.ever_range(m, 4, ran)).value == pytest.approx(5 / 9)
    first = mm.summarize(mm.first_bias_range(m, 4, ran))
    assert first.value == pytest.approx(127 / 36) and not first.known
    assert mm.summarize(mm.turn_range(m, 3, ran)).known  # no gap at t3: printed
