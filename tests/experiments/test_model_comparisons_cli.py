"""``tables/model_comparisons.csv`` through the CLI: two scripted models of known difference are
told apart after the family's adjustment, two identical ones differ by exactly nothing, on a
built-in protocol (roleplay) and on the README's composed one (review)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import tomli_w

from biaslab.cli import main
from biaslab.evaluators.exposure_effects import MIN_PAIRS_FOR_CI
from biaslab.evaluators.model_comparisons import MCNEMAR, holm

ROOT = Path(__file__).resolve().parents[2]
STRONG = "scripted:roleplay-synthetic@role=0.6"
WEAK = "scripted:roleplay-synthetic@role=0.1"
WEAK_AGAIN = "scripted:roleplay-synthetic@role=0.1,no_role=0"  # the same model, spelt otherwise


def _table(run: Path) -> pd.DataFrame:
    text = {"stratum": str, "attribute": str, "group": str, "note": str, "test": str}
    return pd.read_csv(run / "tables" / "model_comparisons.csv", dtype=text).fillna(
        {k: "" for k in text})


def test_roleplay_tells_a_strong_model_from_a_weak_one_and_twins_apart_by_nothing(tmp_path):
    """Per answer with the role statement: 0.6 (strong) and 0.1 (weak); a question is biased
    when 2 of its 3 answers are, 3p² − 2p³: 0.648 and 0.028, so B − A = +0.62 with the role
    and 0 without (no model is biased without it)."""
    spec = {"name": "pairs", "protocol": "roleplay", "models": [WEAK, STRONG, WEAK_AGAIN],
            "run": {"seeds": [42], "concurrency": 8, "retry_base_s": 0.0},
            "conditions": {"targets": []},
            "options": {"types": ["yes_no", "choice"], "per_stratum": 3, "chunk_size": 20,
                        "classify_bias_types": False}}
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(spec))
    run = tmp_path / "run"
    assert main(["run", str(path), "--out", str(run), "--quiet"]) == 0
    table = _table(run)
    assert (run / "figures" / "model_comparisons.png").stat().st_size > 0
    assert (run / "figures" / "model_comparisons.svg").stat().st_size > 0
    assert set(table["unit"]) == {"question"} and set(table["measure"]) == {"verdict"}
    # pairs in spec order, A the earlier: (weak, strong), (weak, twin), (strong, twin)
    assert set(zip(table["model_a"], table["model_b"])) == {(WEAK, STRONG), (WEAK, WEAK_AGAIN),
                                                            (STRONG, WEAK_AGAIN)}
    pooled = table[table["group"] == "all"].set_index(["variant", "stratum", "model_a",
                                                        "model_b"])
    # 11 attributes × 3 questions per type: 33 pairs; per attribute 3, too few for a test
    assert (pooled["n_pairs"] == 33).all() and (pooled["test"] == MCNEMAR).all()
    thin = table[table["group"] != "all"]
    assert (thin["n_pairs"] == 3).all() and thin["p"].isna().all() and thin["ci_low"].isna().all()
    assert (thin["note"] == "too few pairs (n=3)").all() and thin["family_size"].isna().all()
    # the family: 2 variants × 2 types × 3 pairs, every pooled row
    assert (pooled["family_size"] == 12).all() and pooled["p"].notna().sum() == 12
    # adjusted over that one family (the CSV keeps 6 significant digits)
    assert pooled["p_holm"].to_numpy() == pytest.approx(holm(pooled["p"]), rel=1e-5)

    # the means are the protocol's own Table 5 rates, read independently
    table5 = pd.read_csv(run / "tables" / "table5.csv").set_index(["model", "type"])
    for t in ("yes_no", "choice"):
        for a, b in ((WEAK, STRONG), (WEAK, WEAK_AGAIN), (STRONG, WEAK_AGAIN)):
            row = pooled.loc[("role", f"type={t}", a, b)]
            assert row["mean_a"] == pytest.approx(table5.loc[(a, t), "biased_role"] / 33,
                                                  rel=1e-5)
            assert row["mean_b"] == pytest.approx(table5.loc[(b, t), "biased_role"] / 33,
                                                  rel=1e-5)
        known = pooled.loc[("role", f"type={t}", WEAK, STRONG)]
        assert 0.3 < known["diff"] < 0.9 and known["ci_low"] > 0  # +0.62 injected
        assert known["p_holm"] < 0.05 and known["p_bh"] < 0.05
        flipped = pooled.loc[("role", f"type={t}", STRONG, WEAK_AGAIN)]
        assert flipped["diff"] == -known["diff"] and flipped["p"] == known["p"]
        twins = pooled.loc[("role", f"type={t}", WEAK, WEAK_AGAIN)]
        assert (twins["diff"], twins["ci_low"], twins["ci_high"], twins["p"]) == (0, 0, 0, 1)
    no_role = pooled.loc["no_role"]
    assert (no_role["diff"] == 0).all() and (no_role["p_holm"] == 1).all()

    # the report shows it, and re-writing the report writes the same table
    before = (run / "tables" / "model_comparisons.csv").read_bytes()
    assert main(["report", str(run)]) == 0
    assert (run / "tables" / "model_comparisons.csv").read_bytes() == before
    assert "Model against model" in (run / "report.html").read_text()


OLDER = '''
"""A reviewer that always recommends the older applicant, whatever it is shown."""
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted

register_scripted("review-older", lambda: ScriptedChatModel(name_="review-older", rules=[
    Rule(r"Final recommendation", lambda request: '{"choice": "older"}'),
    Rule(r".", lambda request: "I lean toward the older applicant."),
]))
'''


def test_a_composed_protocol_compares_its_models_on_its_own_unit(tmp_path):
    """The README's review chain, clean and with the reviser exposed pro-older: the synthetic
    reviewer says "either" clean and "older" exposed; the second always says "older". A pair
    is a case, its 3 seeds averaged (a deterministic model answers alike under each): 4 pairs,
    too few for a test, although 12 case × seed rows differ (counted as pairs they would have
    claimed p = 2 · ½¹² = 1/2048)."""
    where = tmp_path / "mine"
    shutil.copytree(ROOT / "experiments" / "examples", where)
    (where / "review_older.py").write_text(textwrap.dedent(OLDER))
    spec = (where / "review.toml").read_text().replace(
        'plugins = ["review_chain.py", "review_synthetic.py"]',
        'plugins = ["review_chain.py", "review_synthetic.py", "review_older.py"]').replace(
        'models = ["openrouter:openai/gpt-4o-mini", "openrouter:meta-llama/llama-3.1-8b-instruct"]',
        'models = ["scripted:review-synthetic", "scripted:review-older"]').replace(
        'directions = ["pro_older", "pro_younger"]', 'directions = ["pro_older"]').replace(
        'targets = "singletons"', 'targets = ["revise"]')
    assert "review_older.py" in spec and "scripted:review-older" in spec
    (where / "review.toml").write_text(spec)
    run = tmp_path / "run"
    assert main(["run", str(where / "review.toml"), "--out", str(run), "--quiet"]) == 0
    table = _table(run).set_index(["measure", "condition"])
    assert set(table["unit"]) == {"case"} and set(table["node"]) == {"revise"}
    assert (table["model_a"] == "scripted:review-synthetic").all()
    assert (table["n_pairs"] == 4).all() and (table["n_seeds"] == 3).all()
    assert table["p"].isna().all() and (table["note"] == "too few pairs (n=4)").all()
    clean = table.loc[("decision=older", "none")]
    assert (clean["mean_a"], clean["mean_b"], clean["diff"]) == (0, 1, 1)
    exposed = table.loc[("decision=older", "revise:pro_older")]
    assert (exposed["mean_a"], exposed["mean_b"], exposed["diff"]) == (1, 1, 0)


TWIN = '''
"""The synthetic amplification agent under a second name: a model identical to the first."""
from biaslab.agents.providers.scripted import register_scripted
from biaslab.graphs.amplification_synthetic import make_agent

register_scripted("amplification-twin", make_agent)
'''
# each built-in protocol, smoke-sized, with two models
PAIRS = {
    "amplification": {
        "models": ["scripted:amplification-synthetic", "scripted:amplification-twin"],
        "plugins": ["twin.py"],
        "conditions": {"directions": ["pro_female"], "targets": ["prediction"]},
        "options": {"pipelines": ["E1"], "max_test": 24, "n_resamples": 200}},
    "multiturn": {
        "models": ["scripted:multiturn-reemerge", "scripted:multiturn-never"],
        "conditions": {"template": "multiturn/exposure", "directions": ["stereotype"],
                       "targets": ["target"]},
        "options": {"categories": ["age", "religion"], "seeds_per_category": 6,
                    "framings": ["implicit"], "turn_caps": [3], "baselines": [],
                    "n_resamples": 200}},
    "augmentation": {
        "models": ["scripted:augmentation-synthetic", "scripted:augmentation-abstainer"],
        "conditions": {"template": "augmentation/exposure", "directions": ["stereotype"],
                       "targets": ["target"]},
        "options": {"categories": ["religion", "ses"], "max_per_category": 6,
                    "n_variants": 2, "n_resamples": 200}},
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_every_built_in_protocol_compares_two_models_on_its_unit(tmp_path, name):
    from biaslab.graphs.registry import get_protocol

    (tmp_path / "twin.py").write_text(textwrap.dedent(TWIN))
    spec = {"name": name, "protocol": name, "run": {"seeds": [42], "retry_base_s": 0.0},
            **PAIRS[name]}
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(spec))
    run = tmp_path / "run"
    assert main(["run", str(path), "--out", str(run), "--quiet"]) == 0
    table = _table(run)
    unit = get_protocol(name).unit
    assert len(table) > 0 and set(table["unit"]) == {unit.name}
    assert set(table["node"]) == {unit.node}
    tested = table[table["p"].notna()]
    for family, rows in tested.groupby("family"):
        assert family in ("pooled", "per group")
        assert set(rows["group"] == "all") == {family == "pooled"}
        assert (rows["family_size"] == len(rows)).all()  # no label complement here
    assert (tested["n_pairs"] >= MIN_PAIRS_FOR_CI).all() and tested["ci_low"].notna().all()
    assert (table.loc[table["p"].isna(), "n_pairs"] < MIN_PAIRS_FOR_CI).all()
    assert (tested["p_holm"] >= tested["p_bh"] - 1e-12).all()  # Holm is the stricter
    assert (tested["p_bh"] >= tested["p"] - 1e-12).all()
    if name == "multiturn":  # clean, one re-emerges in most dialogues, the other never
        clean = tested[(tested["measure"] == "ever_biased") & (tested["condition"] == "none")
                       & (tested["group"] == "all")].iloc[0]
        assert clean["model_b"] == "scripted:multiturn-never" and clean["mean_b"] == 0
        assert clean["diff"] < 0 and clean["test"] == MCNEMAR and clean["p_holm"] < 0.05
    if name == "amplification":  # twins: every difference is 0, p_final by the bootstrap
        assert (table["diff"] == 0).all() and (tested["p"] == 1).all()
        assert set(tested.loc[tested["measure"] == "p_final", "test"]) == {"paired_bootstrap"}
        assert set(tested.loc[tested["measure"] == "predicted_fail", "test"]) == {MCNEMAR}


def test_holm_equals_statsmodels_on_ties_zeros_ones_and_nans():
    """`holm` is computed in numpy (statsmodels' own Holm ends with a full gc.collect());
    statsmodels' ``multipletests(method="holm")`` is the reference."""
    import numpy as np
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(48)
    families = [rng.random(n) for n in (1, 2, 5, 40)]
    families += [np.array([0.01, 0.04, 0.04, 0.03, 0.5]), np.array([0.0, 1.0, 0.2, 0.0]),
                 np.round(rng.random(30), 1), np.array([0.02, np.nan, 0.01])]
    for p in families:
        np.testing.assert_allclose(holm(p), multipletests(p, method="holm")[1], rtol=0,
                                   atol=1e-15, equal_nan=True)
    assert holm([]).size == 0
