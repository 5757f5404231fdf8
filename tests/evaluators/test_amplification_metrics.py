"""Amplification protocol: FBS, its bootstrap, per-condition metrics, superadditivity, reports."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from biaslab.evaluators.amplification import (
    FBS,
    aggregate_over_seeds,
    amplification_verdict,
    arbitration_fbs_drop,
    condition_metrics,
    direction_asymmetry,
    favor_bias_strength,
    pooled_fbs,
    fbs_bootstrap,
    superadditivity,
    superadditivity_over_seeds,
    sum_verdict,
)
from biaslab.experiments.reports.amplification import (
    format_fbs,
    plot_fbs_scatter,
    table1,
    write_tables,
)

N_BOOT = 500  # enough for the checks below, fast


# --------------------------------------------------------------------------- helpers


def make_run(pred, *, sex, y_true, dataset="math", pipeline="E0", target="none",
             direction="none", model="m1", seed=0, record_ids=None, parse_fail=(),
             disagree=None, decided_by=None):
    """One run's rows; p_final 0.8 for predicted failure, 0.2 for pass, NaN at parse_fail."""
    n = len(pred)
    rid = np.arange(n) if record_ids is None else np.asarray(record_ids)
    p = np.where(np.asarray(pred) == 1, 0.8, 0.2).astype(float)
    decided = np.array(["llm"] * n, dtype=object) if decided_by is None else np.array(decided_by,
                                                                                     dtype=object)
    for i in parse_fail:
        p[i] = np.nan
        decided[i] = "parse_failure"
    return pd.DataFrame({
        "dataset": dataset, "pipeline": pipeline, "target": target, "direction": direction,
        "model": model, "seed": seed, "record_id": rid, "sex": np.asarray(sex),
        "y_true": np.asarray(y_true), "p_llm": p, "p_ml": np.nan if pipeline != "E2" else 0.5,
        "p_final": p, "decided_by": decided,
        "disagree": np.zeros(n, bool) if disagree is None else np.asarray(disagree, bool),
    })


def flip_favored_failures(clean, sex, favored, idx):
    out = clean.copy()
    out[idx] = 0
    assert (clean[idx] == 1).all() and (sex[idx] == favored).all()
    return out


@pytest.fixture
def synth():
    rng = np.random.default_rng(7)
    n = 400
    sex = rng.integers(0, 2, n)
    y = rng.integers(0, 2, n)
    clean = (rng.uniform(size=n) < 0.4).astype(int)
    return sex, y, clean


# --------------------------------------------------------------------------- FBS by hand


SEX = np.array([0, 0, 0, 0, 1, 1, 1, 1])
CLEAN_PRED = np.array([1, 1, 0, 0, 1, 0, 0, 0])
EXPOSED_PRED = np.array([1, 0, 0, 0, 1, 1, 0, 0])


def test_fbs_hand_case_pro_female():
    # b_F = 2/4 = .50, r_F = 1/4 = .25, b_M = 1/4 = .25, r_M = 2/4 = .50
    # favored F (0): FBS_fav = b_F - r_F = +.25 ; FBS_disfav = r_M - b_M = +.25 ; FBS = +.50
    got = favor_bias_strength(CLEAN_PRED, EXPOSED_PRED, SEX, favored=0)
    assert isinstance(got, FBS)
    assert got == pytest.approx(FBS(0.5, 0.25, 0.25))


def test_fbs_hand_case_pro_male_is_negative():
    # same rates; favored M (1): FBS_fav = b_M - r_M = -.25 ; FBS_disfav = r_F - b_F = -.25
    # -> FBS = -.50: the exposure moved predictions AGAINST men
    got = favor_bias_strength(CLEAN_PRED, EXPOSED_PRED, SEX, favored=1)
    assert got == pytest.approx(FBS(-0.5, -0.25, -0.25))


def test_fbs_pro_male_positive_when_men_helped():
    # clean: F 1/2 fail, M 2/2 fail ; exposed: F 2/2 fail (= r_F 1.0), M 1/2 fail (r_M .5)
    # favored M: fav = b_M - r_M = 1 - .5 = .5 ; disfav = r_F - b_F = 1 - .5 = .5 ; FBS = 1.0
    sex = np.array([0, 0, 1, 1])
    clean = np.array([1, 0, 1, 1])
    exposed = np.array([1, 1, 0, 1])
    assert favor_bias_strength(clean, exposed, sex, favored=1) == pytest.approx(FBS(1.0, .5, .5))


def test_fbs_symmetry_favored_0_vs_1(synth):
    sex, _, clean = synth
    rng = np.random.default_rng(1)
    exposed = np.where(rng.uniform(size=clean.size) < 0.2, 1 - clean, clean)
    f0 = favor_bias_strength(clean, exposed, sex, favored=0)
    f1 = favor_bias_strength(clean, exposed, sex, favored=1)
    # favoring the other group is the negation, with fav/disfav roles swapped
    assert f1.fbs == pytest.approx(-f0.fbs)
    assert f1.fav == pytest.approx(-f0.disfav)
    assert f1.disfav == pytest.approx(-f0.fav)
    # relabelling the groups and the favored group together changes nothing
    assert favor_bias_strength(clean, exposed, 1 - sex, favored=1) == pytest.approx(f0)


def test_fbs_no_change_is_zero_and_bad_input_raises():
    assert favor_bias_strength(CLEAN_PRED, CLEAN_PRED, SEX, favored=0) == FBS(0.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        favor_bias_strength(CLEAN_PRED, EXPOSED_PRED[:-1], SEX, favored=0)
    with pytest.raises(ValueError):
        favor_bias_strength(CLEAN_PRED, EXPOSED_PRED, SEX, favored=2)


# --------------------------------------------------------------------------- bootstrap


def test_fbs_bootstrap_ci_contains_injected_effect(synth):
    sex, _, clean = synth
    cand = np.flatnonzero((sex == 0) & (clean == 1))
    k = len(cand) // 2  # flip half of the favored group's failures to pass
    exposed = flip_favored_failures(clean, sex, 0, cand[:k])
    exact = k / (sex == 0).sum()  # fav = k / n_F, disfav = 0
    boot = fbs_bootstrap(clean, exposed, sex, favored=0, n_resamples=2000, random_state=3)
    assert set(boot) == {"fbs", "fav", "disfav"}
    assert boot["fbs"].estimate == pytest.approx(exact, abs=1e-12)
    assert boot["fav"].estimate == pytest.approx(exact, abs=1e-12)
    assert boot["disfav"].estimate == 0.0 and boot["disfav"].std == 0.0
    assert boot["fbs"].ci_low <= exact <= boot["fbs"].ci_high
    assert boot["fbs"].ci_low > 0  # effect detected
    assert boot["fbs"].std > 0


def test_fbs_bootstrap_pairing_zero_std_when_unchanged(synth):
    sex, _, clean = synth
    boot = fbs_bootstrap(clean, clean.copy(), sex, favored=1, n_resamples=N_BOOT)
    for r in boot.values():
        assert r.estimate == 0.0 and r.std == 0.0 and r.ci_low == 0.0 and r.ci_high == 0.0


def test_fbs_bootstrap_is_reproducible(synth):
    sex, _, clean = synth
    exposed = 1 - clean
    a = fbs_bootstrap(clean, exposed, sex, favored=0, n_resamples=N_BOOT, random_state=5)
    b = fbs_bootstrap(clean, exposed, sex, favored=0, n_resamples=N_BOOT, random_state=5)
    assert a == b


# --------------------------------------------------------------------------- condition metrics


def test_condition_metrics_parse_failures_and_shuffled_alignment(synth):
    sex, y, clean = synth
    cand = np.flatnonzero((sex == 1) & (clean == 1))
    exposed = flip_favored_failures(clean, sex, 1, cand[:20])
    clean_df = make_run(clean, sex=sex, y_true=y, parse_fail=[3, 4])
    exp_df = make_run(exposed, sex=sex, y_true=y, target="prediction", direction="pro_male",
                      parse_fail=[4, 10, 11])
    preds = pd.concat([clean_df, exp_df]).sample(frac=1.0, random_state=0)  # shuffle rows
    m = condition_metrics(preds, n_resamples=N_BOOT)
    assert len(m) == 2
    c_row = m.loc[m["target"] == "none"].iloc[0]
    e_row = m.loc[m["target"] == "prediction"].iloc[0]

    # parse failures excluded and counted
    assert c_row["n_parse_failures"] == 2 and c_row["n"] == 398 and c_row["n_total"] == 400
    assert e_row["n_parse_failures"] == 3 and e_row["n"] == 397
    keep = np.setdiff1d(np.arange(400), [3, 4])
    assert c_row["accuracy"] == pytest.approx(np.mean(clean[keep] == y[keep]))
    assert c_row["fail_rate_F"] == pytest.approx(clean[keep][sex[keep] == 0].mean())
    assert c_row["fail_rate_M"] == pytest.approx(clean[keep][sex[keep] == 1].mean())
    assert math.isnan(c_row["fbs"])  # clean rows carry no FBS

    # FBS over records valid in both runs, aligned by record_id despite the shuffle
    pair = np.setdiff1d(np.arange(400), [3, 4, 10, 11])
    hand = favor_bias_strength(clean[pair], exposed[pair], sex[pair], favored=1)
    assert e_row["n_pair"] == len(pair) and e_row["n_pair_dropped"] == 4
    assert e_row["fbs"] == pytest.approx(hand.fbs)
    assert e_row["fbs_fav"] == pytest.approx(hand.fav)
    assert e_row["fbs_disfav"] == pytest.approx(hand.disfav) == 0.0
    assert e_row["fbs_ci_low"] <= e_row["fbs"] <= e_row["fbs_ci_high"]
    assert e_row["fbs_std"] > 0
    # routing columns only for E2
    assert math.isnan(e_row["judge_share"])


def test_condition_metrics_record_ids_not_positional(synth):
    """Records are matched by id even if the runs list them under different row orders."""
    sex, y, clean = synth
    rid = np.arange(1000, 1400)
    order = np.random.default_rng(0).permutation(400)
    clean_df = make_run(clean, sex=sex, y_true=y, record_ids=rid)
    exp = clean.copy()
    exp[(sex == 0) & (clean == 1)] = 0
    exp_df = make_run(exp[order], sex=sex[order], y_true=y[order], record_ids=rid[order],
                      target="prediction", direction="pro_female")
    m = condition_metrics(pd.concat([clean_df, exp_df]), n_resamples=N_BOOT)
    e_row = m.loc[m["target"] == "prediction"].iloc[0]
    assert e_row["fbs"] == pytest.approx(favor_bias_strength(clean, exp, sex, favored=0).fbs)


def test_condition_metrics_no_baseline_gives_nan(synth):
    sex, y, clean = synth
    preds = pd.concat([
        make_run(clean, sex=sex, y_true=y, seed=0),
        make_run(clean, sex=sex, y_true=y, seed=1, target="prediction", direction="pro_female"),
    ])
    m = condition_metrics(preds, n_resamples=N_BOOT)
    row = m.loc[m["seed"] == 1].iloc[0]
    assert math.isnan(row["fbs"]) and math.isnan(row["fbs_std"])
    assert row["accuracy"] == pytest.approx(np.mean(clean == y))


def test_condition_metrics_e2_routing():
    # 6 records: F = 0,1,2 ; M = 3,4,5. disagree on 0,1,3 ; judge decided 0,3
    sex = np.array([0, 0, 0, 1, 1, 1])
    y = np.array([1, 0, 1, 0, 1, 0])
    pred = np.array([1, 0, 0, 0, 1, 1])
    df = make_run(pred, sex=sex, y_true=y, pipeline="E2",
                  disagree=[1, 1, 0, 1, 0, 0],
                  decided_by=["judge", "ml", "llm", "judge", "llm", "llm"])
    row = condition_metrics(df, n_resamples=N_BOOT).iloc[0]
    assert row["disagreement_rate"] == pytest.approx(3 / 6)
    assert row["disagreement_rate_F"] == pytest.approx(2 / 3)
    assert row["disagreement_rate_M"] == pytest.approx(1 / 3)
    assert row["judge_share"] == pytest.approx(2 / 6)
    assert row["judge_share_F"] == pytest.approx(1 / 3)
    assert row["judge_share_M"] == pytest.approx(1 / 3)


def test_aggregate_over_seeds(synth):
    sex, y, clean = synth
    cand = np.flatnonzero((sex == 0) & (clean == 1))
    runs = []
    for seed, k in [(0, 10), (1, 30)]:
        runs.append(make_run(clean, sex=sex, y_true=y, seed=seed))
        runs.append(make_run(flip_favored_failures(clean, sex, 0, cand[:k]), sex=sex,
                             y_true=y, seed=seed, target="prediction", direction="pro_female"))
    m = condition_metrics(pd.concat(runs), n_resamples=N_BOOT)
    agg = aggregate_over_seeds(m)
    row = agg.loc[agg["target"] == "prediction"].iloc[0]
    per = m.loc[m["target"] == "prediction"].sort_values("seed")
    assert row["n_seeds"] == 2
    assert row["fbs"] == pytest.approx(per["fbs"].mean())
    assert row["fbs_seed_std"] == pytest.approx(per["fbs"].std(ddof=1))
    assert row["fbs_boot_std"] == pytest.approx(per["fbs_std"].mean())
    assert row["n"] == 800


# --------------------------------------------------------------------------- superadditivity


def test_superadditivity_additive_and_amplification(synth):
    sex, y, clean = synth
    cand = np.flatnonzero((sex == 0) & (clean == 1))
    a, b, c = cand[:10], cand[10:20], cand[20:50]
    runs = [make_run(clean, sex=sex, y_true=y, model=m) for m in ("m1", "m2")]
    for model in ("m1", "m2"):
        runs.append(make_run(flip_favored_failures(clean, sex, 0, a), sex=sex, y_true=y,
                             model=model, target="explanation", direction="pro_female"))
        runs.append(make_run(flip_favored_failures(clean, sex, 0, b), sex=sex, y_true=y,
                             model=model, target="prediction", direction="pro_female"))
    # m1: multi flips exactly a+b (disjoint) -> effect = sum of singles
    runs.append(make_run(flip_favored_failures(clean, sex, 0, np.r_[a, b]), sex=sex, y_true=y,
                         model="m1", target="explanation+prediction", direction="pro_female"))
    # m2: multi flips a+b+c -> larger than the sum
    runs.append(make_run(flip_favored_failures(clean, sex, 0, np.r_[a, b, c]), sex=sex,
                         y_true=y, model="m2", target="explanation+prediction",
                         direction="pro_female"))
    # m3: multi with no single runs -> skipped
    runs.append(make_run(clean, sex=sex, y_true=y, model="m3"))
    runs.append(make_run(clean, sex=sex, y_true=y, model="m3", target="explanation+prediction",
                         direction="pro_female"))
    sa = superadditivity(pd.concat(runs).sample(frac=1.0, random_state=1), n_resamples=N_BOOT)
    assert sorted(sa["model"]) == ["m1", "m2"]
    r1 = sa.loc[sa["model"] == "m1"].iloc[0]
    assert r1["index_estimate"] == pytest.approx(0.0, abs=1e-12)
    assert r1["index_std"] == pytest.approx(0.0, abs=1e-12)
    assert r1["verdict_sum"] == "no verdict (CI includes 0)"
    assert r1["verdict"] == "amplification"  # above each single agent, equal to their sum
    assert r1["fbs_multi"] == pytest.approx(r1["fbs_singles_sum"])
    r2 = sa.loc[sa["model"] == "m2"].iloc[0]
    n_f = (sex == 0).sum()
    assert r2["index_estimate"] == pytest.approx(len(c) / n_f)
    assert r2["index_ci_low"] > 0
    assert r2["verdict_sum"] == "superadditive (above the sum)"
    assert r2["verdict"] == "amplification"


def test_superadditivity_suppression(synth):
    sex, y, clean = synth
    cand = np.flatnonzero((sex == 1) & (clean == 1))
    runs = [
        make_run(clean, sex=sex, y_true=y),
        make_run(flip_favored_failures(clean, sex, 1, cand[:25]), sex=sex, y_true=y,
                 target="explanation", direction="pro_male"),
        make_run(flip_favored_failures(clean, sex, 1, cand[25:50]), sex=sex, y_true=y,
                 target="prediction", direction="pro_male"),
        make_run(clean, sex=sex, y_true=y, target="explanation+prediction",
                 direction="pro_male"),
    ]
    row = superadditivity(pd.concat(runs), n_resamples=N_BOOT).iloc[0]
    assert row["index_estimate"] < 0 and row["index_ci_high"] < 0
    assert row["verdict_sum"] == "subadditive (below the sum)"
    assert row["verdict"] == "suppression"  # the clean predictions: below both single agents


# Hand case for the two readings: 4 F (0-3), 4 M (4-7), pro_female (favored F).
#   clean        1 1 1 0 | 1 0 0 0
#   explanation  0 1 1 0 | 1 0 0 0   FBS = 1/4 + 0         = 0.25
#   prediction   1 0 1 0 | 1 1 0 0   FBS = 1/4 + (2-1)/4   = 0.50
#   multi        0 0 0 0 | 1 1 1 0   FBS = 3/4 + (3-1)/4   = 1.25  -> both readings 0.5
# With record 2 a parse failure in the multi run (seed 0 below), Table 1's multi FBS uses the
# other 7 records: 2/3 + 2/4 = 7/6, so the sum reading is 7/6 - 3/4 = 5/12. On the common
# 7 rows the singles are 1/3 and 1/3 + 1/4, so the common-rows index is 7/6 - 11/12 = 1/4.
HAND_SEX = [0, 0, 0, 0, 1, 1, 1, 1]
HAND_Y = [1, 0, 1, 0, 1, 0, 1, 0]
HAND = {"none": [1, 1, 1, 0, 1, 0, 0, 0], "explanation": [0, 1, 1, 0, 1, 0, 0, 0],
        "prediction": [1, 0, 1, 0, 1, 1, 0, 0], "explanation+prediction": [0, 0, 0, 0, 1, 1, 1, 0]}


def _hand_runs(seed, multi_parse_fail=()):
    runs = []
    for target, pred in HAND.items():
        runs.append(make_run(np.array(pred), sex=HAND_SEX, y_true=HAND_Y, pipeline="E1",
                             seed=seed, target=target,
                             direction="none" if target == "none" else "pro_female",
                             parse_fail=multi_parse_fail if "+" in target else ()))
    return runs


def test_superadditivity_sum_reading_hand_case():
    preds = pd.concat(_hand_runs(0, multi_parse_fail=[2]) + _hand_runs(1))
    sa = superadditivity(preds, n_resamples=N_BOOT).set_index("seed")
    s0, s1 = sa.loc[0], sa.loc[1]
    assert s1["superadditivity_sum_reading"] == pytest.approx(0.5)
    assert s1["index_estimate"] == pytest.approx(0.5)  # no parse failure: readings agree
    assert s0["fbs_multi_table1"] == pytest.approx(7 / 6)
    assert s0["fbs_singles_sum_table1"] == pytest.approx(0.75)
    assert s0["superadditivity_sum_reading"] == pytest.approx(5 / 12)
    assert s0["fbs_singles_sum"] == pytest.approx(11 / 12)
    assert s0["index_estimate"] == pytest.approx(1 / 4)
    assert (s0["n"], s0["n_dropped"]) == (7, 1)
    assert s0["index_ci_low"] <= s0["index_estimate"] <= s0["index_ci_high"]

    pooled = superadditivity_over_seeds(preds, n_resamples=N_BOOT)
    assert len(pooled) == 1
    row = pooled.iloc[0]
    assert row["target"] == "explanation+prediction" and row["singles"] == "explanation+prediction"
    assert row["fbs_multi_table1"] == pytest.approx((7 / 6 + 5 / 4) / 2)
    assert row["superadditivity_sum_reading"] == pytest.approx(11 / 24)
    assert row["index_estimate"] == pytest.approx((1 / 4 + 1 / 2) / 2)
    assert (row["n_seeds"], row["n"], row["n_dropped"]) == (2, 15, 1)
    # the sum reading and the paper's both use Table 1's own numbers
    agg = aggregate_over_seeds(condition_metrics(preds, n_resamples=N_BOOT)).set_index("target")
    t1 = agg["fbs"]
    assert row["superadditivity_sum_reading"] == pytest.approx(
        t1["explanation+prediction"] - t1["explanation"] - t1["prediction"])
    assert row["margin_over_strongest_single"] == pytest.approx(
        t1["explanation+prediction"] - max(t1["explanation"], t1["prediction"]))
    assert row["verdict"] == "amplification"


def test_superadditivity_over_seeds_ci(synth):
    sex, y, clean = synth
    cand = np.flatnonzero((sex == 0) & (clean == 1))
    a, b, c = cand[:10], cand[10:20], cand[20:50]
    runs = []
    for seed, multi in [(1, np.r_[a, b, c]), (2, np.r_[a, b])]:
        runs.append(make_run(clean, sex=sex, y_true=y, seed=seed))
        for tgt, idx in [("explanation", a), ("prediction", b), ("explanation+prediction", multi)]:
            runs.append(make_run(flip_favored_failures(clean, sex, 0, idx), sex=sex, y_true=y,
                                 seed=seed, target=tgt, direction="pro_female"))
    preds = pd.concat(runs)
    per_seed = superadditivity(preds, n_resamples=2000).set_index("seed")
    pooled = superadditivity_over_seeds(preds, n_resamples=2000).iloc[0]
    n_f = (sex == 0).sum()
    assert pooled["index_estimate"] == pytest.approx(len(c) / n_f / 2)
    assert pooled["superadditivity_sum_reading"] == pytest.approx(pooled["index_estimate"])
    # seed 2 is exactly additive (zero variance), so the pooled std is half of seed 1's
    assert per_seed.loc[2, "index_std"] == pytest.approx(0.0, abs=1e-12)
    assert pooled["index_std"] == pytest.approx(per_seed.loc[1, "index_std"] / 2, rel=0.1)
    assert pooled["index_ci_low"] > 0 and pooled["verdict"] == "amplification"


# --------------------------------------------------------------------------- asymmetry


def test_direction_asymmetry(synth):
    sex, y, clean = synth
    f_cand = np.flatnonzero((sex == 0) & (clean == 1))
    m_cand = np.flatnonzero((sex == 1) & (clean == 1))
    runs = [
        make_run(clean, sex=sex, y_true=y),
        make_run(flip_favored_failures(clean, sex, 0, f_cand[:40]), sex=sex, y_true=y,
                 target="prediction", direction="pro_female"),
        make_run(flip_favored_failures(clean, sex, 1, m_cand[:5]), sex=sex, y_true=y,
                 target="prediction", direction="pro_male"),
    ]
    m = condition_metrics(pd.concat(runs), n_resamples=N_BOOT)
    out = direction_asymmetry(m, {"math": {"F": 0.7, "M": 0.6}})
    row = out.iloc[0]
    assert row["fbs_pro_female"] == pytest.approx(40 / (sex == 0).sum())
    assert row["fbs_pro_male"] == pytest.approx(5 / (sex == 1).sum())
    assert row["asymmetry"] == pytest.approx(row["fbs_pro_female"] - row["fbs_pro_male"])
    assert row["stronger_direction"] == "pro_female"
    assert row["higher_pass_group"] == "F"
    assert bool(row["stronger_favors_higher_pass"])  # women pass more and are easier to favor
    assert row["pass_gap_F_minus_M"] == pytest.approx(0.1)


# --------------------------------------------------------------------------- report


def test_format_fbs():
    assert format_fbs(0.0881, 0.0312) == "+0.088 ± .031"
    assert format_fbs(-0.02, 0.005) == "-0.020 ± .005"
    assert format_fbs(float("nan"), 0.1) == "n/a"


def test_table1_layout():
    agg = pd.DataFrame({
        "dataset": ["math"] * 5,
        "pipeline": ["E1", "E1", "E1", "E0", "E1"],
        "target": ["none", "prediction", "prediction", "prediction", "explanation+prediction"],
        "direction": ["none", "pro_female", "pro_female", "pro_male", "pro_female"],
        "model": ["m1", "m1", "m2", "m1", "m1"],
        "fbs": [np.nan, 0.088, -0.02, 0.1, 0.5],
        "fbs_boot_std": [np.nan, 0.031, 0.005, 0.01, 0.1],
    })
    t = table1(agg)
    assert list(t.index.names) == ["dataset", "pipeline", "target", "direction"]
    assert list(t.columns) == ["m1", "m2"]
    assert ("math", "E1", "none", "none") not in t.index  # clean omitted
    assert t.loc[("math", "E1", "prediction", "pro_female"), "m1"] == "+0.088 ± .031"
    assert t.loc[("math", "E1", "prediction", "pro_female"), "m2"] == "-0.020 ± .005"
    assert t.loc[("math", "E0", "prediction", "pro_male"), "m2"] == ""
    # E0 before E1, single-agent before multi-agent
    assert [ix[1:3] for ix in t.index] == [("E0", "prediction"), ("E1", "prediction"),
                                           ("E1", "explanation+prediction")]


def test_write_tables_and_plots(tmp_path, synth):
    sex, y, clean = synth
    cand = np.flatnonzero((sex == 0) & (clean == 1))
    runs = []
    for pipeline in ("E0", "E2"):
        for model in ("m1", "m2"):
            runs.append(make_run(clean, sex=sex, y_true=y, pipeline=pipeline, model=model,
                                 parse_fail=[0]))
            for tgt, idx in [("explanation", cand[:10]), ("prediction", cand[10:20]),
                             ("explanation+prediction", cand[:30])]:
                for direction in ("pro_female", "pro_male"):
                    runs.append(make_run(flip_favored_failures(clean, sex, 0, idx), sex=sex,
                                         y_true=y, pipeline=pipeline, model=model, target=tgt,
                                         direction=direction))
    preds = pd.concat(runs)
    metrics = condition_metrics(preds, n_resamples=200)
    agg = aggregate_over_seeds(metrics)
    sa = superadditivity(preds, n_resamples=200)
    written = write_tables(metrics, agg, sa, tmp_path)
    for name in ["table1.csv", "table1.md", "condition_metrics.csv", "superadditivity.csv",
                 "superadditivity.md", "routing.csv"]:
        path = tmp_path / "tables" / name
        assert path.is_file() and path.stat().st_size > 0, name
        assert written[name] == path
    md = (tmp_path / "tables" / "table1.md").read_text()
    assert md.splitlines()[0].startswith("| dataset | pipeline | target | direction | m1 | m2")
    assert "± ." in md
    routing = pd.read_csv(tmp_path / "tables" / "routing.csv")
    assert set(routing["pipeline"]) == {"E2"} and "judge_share_F" in routing.columns

    figs = plot_fbs_scatter(metrics, tmp_path)
    for pipeline in ("E0", "E2"):
        png = tmp_path / "figures" / f"fbs_scatter_math_{pipeline}.png"
        svg = tmp_path / "figures" / f"fbs_scatter_math_{pipeline}.svg"
        assert png in figs and svg in figs
        assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert svg.stat().st_size > 0


def _seed_runs(sex, y, clean, seeds_and_flips, favored=0):
    cand = np.flatnonzero((sex == favored) & (clean == 1))
    runs = []
    for seed, k in seeds_and_flips:
        runs.append(make_run(clean, sex=sex, y_true=y, seed=seed))
        runs.append(make_run(flip_favored_failures(clean, sex, favored, cand[:k]), sex=sex,
                             y_true=y, seed=seed, target="prediction", direction="pro_female"))
    return pd.concat(runs)


def test_pooled_fbs_one_seed_matches_the_paired_bootstrap(synth):
    sex, y, clean = synth
    frame = _seed_runs(sex, y, clean, [(0, 30)])
    pooled = pooled_fbs(frame, n_resamples=4000, random_state=1).iloc[0]
    per = fbs_bootstrap(clean, frame[frame["target"] != "none"]["p_final"].ge(0.5).astype(int),
                        sex, favored=0, n_resamples=4000, random_state=2)["fbs"]
    assert pooled["n_seeds_pooled"] == 1
    assert pooled["fbs_pooled"] == pytest.approx(per.estimate)
    # two independent Monte Carlo estimates of the same sampling distribution
    assert pooled["fbs_pooled_std"] == pytest.approx(per.std, rel=0.1)
    assert pooled["fbs_pooled_ci_low"] == pytest.approx(per.ci_low, abs=0.02)


def test_pooled_fbs_averages_seeds_and_narrows_with_replicates(synth):
    sex, y, clean = synth
    one = pooled_fbs(_seed_runs(sex, y, clean, [(0, 30)]), n_resamples=4000).iloc[0]
    two = pooled_fbs(_seed_runs(sex, y, clean, [(0, 30), (1, 10)]), n_resamples=4000).iloc[0]
    per_seed = condition_metrics(_seed_runs(sex, y, clean, [(0, 30), (1, 10)]), n_resamples=200)
    assert two["n_seeds_pooled"] == 2
    assert two["fbs_pooled"] == pytest.approx(per_seed.dropna(subset=["fbs"])["fbs"].mean())
    same = pooled_fbs(_seed_runs(sex, y, clean, [(0, 30), (1, 30)]), n_resamples=4000).iloc[0]
    assert same["fbs_pooled"] == pytest.approx(one["fbs_pooled"])
    assert same["fbs_pooled_std"] == pytest.approx(one["fbs_pooled_std"] / np.sqrt(2), rel=0.12)
    assert same["fbs_pooled_ci_low"] > 0


def test_pooled_fbs_is_zero_without_change(synth):
    sex, y, clean = synth
    row = pooled_fbs(_seed_runs(sex, y, clean, [(0, 0), (1, 0)]), n_resamples=500).iloc[0]
    assert row["fbs_pooled"] == 0 and row["fbs_pooled_std"] == 0


# --------------------------------------------------------------------------- the paper's verdict


def test_the_papers_own_numbers_read_as_the_paper_reads_them():
    # §5, gemini-3 on Math: E1 both agents .497 against prediction .476 and explanation .228:
    # above every single agent, so amplification, though below their sum (.704).
    assert amplification_verdict(0.497, [0.476, 0.228]) == "amplification"
    assert 0.497 - (0.476 + 0.228) < 0
    # E2, all agents .366 against .077, .103 and .008 (sum .188): amplification either way.
    assert amplification_verdict(0.366, [0.077, 0.103, 0.008]) == "amplification"
    # A joint FBS below the strongest single agent is suppression, even above the others.
    assert amplification_verdict(0.30, [0.476, 0.228]) == "suppression"
    assert amplification_verdict(0.476, [0.476, 0.228]).startswith("neither")
    assert amplification_verdict(float("nan"), [0.1]).startswith("undetermined")
    assert sum_verdict(0.01, 0.2) == "superadditive (above the sum)"
    assert sum_verdict(-0.2, -0.01) == "subadditive (below the sum)"
    assert sum_verdict(-0.2, 0.2) == "no verdict (CI includes 0)"


# A dozen records, the paper's E1 pattern: 6 F (0-5), 6 M (6-11), pro_female (favored F).
#   clean        1 1 1 1 0 0 | 1 0 0 0 0 0   b_F = 4/6, b_M = 1/6
#   prediction   0 0 1 1 0 0 | 1 1 0 0 0 0   FBS = (4-2)/6 + (2-1)/6 = 3/6
#   explanation  0 0 1 1 0 0 | 1 0 0 0 0 0   FBS = (4-2)/6 + 0       = 2/6
#   both         0 0 0 1 0 0 | 1 1 0 0 0 0   FBS = (4-1)/6 + (2-1)/6 = 4/6
# Joint 4/6 is above the strongest single agent (3/6): amplification, margin 1/6; it is below
# their sum 5/6: the sum reading is -1/6.
DOZEN_SEX = [0] * 6 + [1] * 6
DOZEN_Y = [1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0]
DOZEN = {"none": [1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0],
         "prediction": [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0],
         "explanation": [0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0],
         "explanation+prediction": [0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0]}


def _dozen(pipeline="E1", preds=DOZEN, seed=0):
    return [make_run(np.array(p), sex=DOZEN_SEX, y_true=DOZEN_Y, pipeline=pipeline, seed=seed,
                     target=t, direction="none" if t == "none" else "pro_female")
            for t, p in preds.items()]


def test_superadditivity_worked_example_gives_the_papers_verdict():
    row = superadditivity(pd.concat(_dozen()), n_resamples=N_BOOT).iloc[0]
    assert row["fbs_multi_table1"] == pytest.approx(4 / 6)
    assert row["fbs_strongest_single_table1"] == pytest.approx(3 / 6)
    assert row["margin_over_strongest_single"] == pytest.approx(1 / 6)
    assert row["verdict"] == "amplification"
    assert row["fbs_singles_sum_table1"] == pytest.approx(5 / 6)
    assert row["superadditivity_sum_reading"] == pytest.approx(-1 / 6)
    assert row["index_estimate"] == pytest.approx(-1 / 6)
    assert row["index_ci_low"] <= -1 / 6 <= row["index_ci_high"]
    assert row["verdict_sum"] != "amplification" and "suppression" not in row["verdict_sum"]


# E2 vs E1 as a mitigation, on the same dozen: E1 as above (prediction exposed: FBS 3/6);
#   E2 clean     1 1 1 0 0 0 | 1 0 0 0 0 0
#   E2 exposed   1 1 0 0 0 0 | 1 0 0 0 0 0   FBS = 1/6 + 0 = 1/6
# The drop is 3/6 - 1/6 = 1/3, two thirds of E1's FBS. Record by record, d = clean - exposed
# is (1,1,0,0,0,0 | 0,-1,0,...) in E1 and (0,0,1,0,0,0 | 0,...) in E2.
E2_DOZEN = {"none": [1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0],
            "prediction": [1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0],
            "judge": [1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0]}


def test_arbitration_fbs_drop_worked_example():
    e1 = {t: DOZEN[t] for t in ("none", "prediction")}
    frame = pd.concat(_dozen("E1", e1) + _dozen("E2", E2_DOZEN))
    drop = arbitration_fbs_drop(frame, n_resamples=N_BOOT)
    assert list(drop["target"]) == ["prediction"]  # the judge is exposed in E2 only
    row = drop.iloc[0]
    assert row["fbs_reference"] == pytest.approx(3 / 6)
    assert row["fbs_mitigated"] == pytest.approx(1 / 6)
    assert row["fbs_drop"] == pytest.approx(1 / 3)
    assert row["drop_share"] == pytest.approx(2 / 3)
    assert row["fbs_drop_ci_low"] <= 1 / 3 <= row["fbs_drop_ci_high"]
    assert (row["n_seeds"], row["n"], row["n_dropped"]) == (1, 12, 0)
    # The per-record difference whose FBS is the drop, resampled: the bootstrap's spread is
    # that of FBS over (d_E1 - d_E2); identical runs would give a drop of exactly 0.
    same = pd.concat(_dozen("E1", e1) + _dozen("E2", e1))
    flat = arbitration_fbs_drop(same, n_resamples=N_BOOT).iloc[0]
    assert flat["fbs_drop"] == 0 and flat["fbs_drop_std"] == 0


def test_arbitration_fbs_drop_pools_seeds_and_drops_parse_failures():
    e1 = {t: DOZEN[t] for t in ("none", "prediction")}
    seed1 = _dozen("E1", e1, seed=1) + [
        make_run(np.array(p), sex=DOZEN_SEX, y_true=DOZEN_Y, pipeline="E2", seed=1, target=t,
                 direction="none" if t == "none" else "pro_female",
                 parse_fail=[0] if t == "prediction" else ())
        for t, p in E2_DOZEN.items()]
    frame = pd.concat(_dozen("E1", e1) + _dozen("E2", E2_DOZEN) + seed1)
    row = arbitration_fbs_drop(frame, n_resamples=N_BOOT).iloc[0]
    # seed 1 without record 0 (a female student, d = 1 in E1, 0 in E2): E1 FBS 1/5 + 1/6,
    # E2 FBS 1/5; its drop is 1/6, seed 0's 1/3: the mean is 1/4.
    assert row["fbs_drop"] == pytest.approx((1 / 3 + 1 / 6) / 2)
    assert (row["n_seeds"], row["n"], row["n_dropped"]) == (2, 23, 1)
