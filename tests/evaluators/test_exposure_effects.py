"""Exposed vs clean on paired items, checked against hand computation."""

import numpy as np
import pandas as pd
import pytest

from biaslab.evaluators.exposure_effects import paired_condition_effects


def frame():
    rows = []
    clean = {"q1": 0, "q2": 1, "q3": 0, "q4": np.nan}
    exposed = {"q1": 1, "q2": 1, "q3": 1, "q4": 1, "q5": 1}  # q5 has no clean pair
    for item, v in clean.items():
        rows.append({"item": item, "model": "m", "condition": "none", "biased": v})
    for item, v in exposed.items():
        rows.append({"item": item, "model": "m", "condition": "target:stereotype", "biased": v})
    return pd.DataFrame(rows)


def test_difference_uses_only_complete_pairs():
    out = paired_condition_effects(frame(), value="biased", pair_on=["item", "model"],
                                   n_resamples=500)
    row = out.iloc[0]
    # pairs q1..q3 (q4 unscored in clean, q5 unpaired): clean 1/3, exposed 3/3
    assert row["n_pairs"] == 3
    assert row["clean_mean"] == pytest.approx(1 / 3)
    assert row["exposed_mean"] == pytest.approx(1.0)
    assert row["diff"] == pytest.approx(2 / 3)
    assert row["ci_low"] <= row["diff"] <= row["ci_high"]
    # a resample of 3 pairs with per-pair differences {1, 0, 1} spans 0 .. 1
    assert row["ci_low"] >= 0.0 and row["ci_high"] <= 1.0


def test_split_by_a_column_and_no_effect_gives_zero():
    data = pd.concat([frame().assign(model="a"), frame().assign(model="b")])
    data.loc[(data["model"] == "b") & (data["condition"] != "none"), "biased"] = \
        data.loc[(data["model"] == "b") & (data["condition"] == "none"), "biased"].tolist() + [0]
    out = paired_condition_effects(data, value="biased", pair_on=["item"], by=["model"],
                                   n_resamples=200).set_index("model")
    assert out.loc["a", "diff"] == pytest.approx(2 / 3)
    assert out.loc["b", "diff"] == 0.0 and out.loc["b", "ci_low"] == 0.0


def test_ambiguous_pairing_is_refused():
    data = pd.concat([frame(), frame()])
    with pytest.raises(ValueError, match="pair_on"):
        paired_condition_effects(data, value="biased", pair_on=["item", "model"])
