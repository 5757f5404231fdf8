"""Effects measured on each protocol's own unit: ``exposed_vs_clean.csv`` pairs exposed and
clean arms on the protocol's declared unit and splits by its sensitive attribute, and every
counterfactual replay pairs its measures with the source's (``compare_measures.csv``)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w

from biaslab.evaluators.exposure_effects import MIN_PAIRS_FOR_CI
from biaslab.experiments.reports.generic import exposed_vs_clean
from biaslab.experiments.reports.units import UNIT_KEYS
from biaslab.graphs.registry import get_protocol
from biaslab.graphs.units import AnalysisUnit
from biaslab.traces.store import RunStore


from support_runs import cli, table


# -- a worked example, by hand ------------------------------------------------------------------
T_975_DF11 = 2.200985160091639  # Student t, 97.5% quantile, df 11 (printed tables: 2.201)


def test_paired_table_reproduces_a_hand_computed_example():
    """Twelve units with a rating in both arms, six per group; two more that must not pair."""
    clean = {"u01": 3, "u02": 4, "u03": 2, "u04": 5, "u05": 3, "u06": 4,   # group A
             "u07": 2, "u08": 3, "u09": 3, "u10": 4, "u11": 2, "u12": 3,   # group B
             "u13": 4}                                                      # exposed unscored
    exposed = {"u01": 4, "u02": 5, "u03": 2, "u04": 5, "u05": 4, "u06": 5,
               "u07": 1, "u08": 2, "u09": 3, "u10": 3, "u11": 1, "u12": 2,
               "u13": np.nan, "u14": 5}                                     # u14: no clean
    rows = []
    for arm, values in (("none", clean), ("judge:pro_a", exposed)):
        for unit, value in values.items():
            group = "A" if unit <= "u06" else "B"
            rows.append({"variant": "default", "item": unit, "condition": arm, "model": "m",
                         "seed": 1, "node": "judge", "visit": 0, "unit": unit, "stratum": "",
                         "group": group, "field": "rating", "value": value})
    units = pd.DataFrame(rows)[[*UNIT_KEYS, "value"]]
    out = exposed_vs_clean(units, AnalysisUnit("case", group="side")).set_index("group")

    assert list(out.index) == ["all", "A", "B"]
    assert (out["unit"] == "case").all() and (out["attribute"] == "side").all()
    # group A: differences 1 1 0 0 1 1; group B: -1 -1 0 -1 -1 -1
    a, b = out.loc["A"], out.loc["B"]
    assert (a["n_pairs"], a["clean_mean"], a["exposed_mean"]) == (6, 21 / 6, 25 / 6)
    assert a["diff"] == pytest.approx(4 / 6, abs=1e-15)
    assert (b["n_pairs"], b["clean_mean"], b["exposed_mean"]) == (6, 17 / 6, 12 / 6)
    assert b["diff"] == pytest.approx(-5 / 6, abs=1e-15)
    for row in (a, b):  # six pairs: below the minimum, so no interval, and it says why
        assert math.isnan(row["ci_low"]) and math.isnan(row["ci_high"])
        assert row["note"] == "too few pairs (n=6)"
    # pooled: 12 pairs, differences sum to -1, nine of them ±1
    pooled = out.loc["all"]
    assert (pooled["n_pairs"], pooled["clean_mean"], pooled["exposed_mean"]) == (
        12, 38 / 12, 37 / 12)
    assert pooled["diff"] == pytest.approx(-1 / 12, abs=1e-15)
    sd = math.sqrt((9 - 12 * (1 / 12) ** 2) / 11)  # = sqrt(107/132)
    half = T_975_DF11 * sd / math.sqrt(12)  # = 0.5720483...
    assert pooled["ci_low"] == pytest.approx(-1 / 12 - half, abs=1e-12)
    assert pooled["ci_high"] == pytest.approx(-1 / 12 + half, abs=1e-12)
    assert pooled["ci_low"] == pytest.approx(-0.65538, abs=1e-5)
    assert pooled["note"] == ""
    assert MIN_PAIRS_FOR_CI == 10


# -- a composed debate whose exposure depends on the candidate's gender --------------------------
DEBATE = '''
"""Two nodes decide on a candidate: an advocate argues, a judge approves or rejects."""

import re
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

from biaslab.agents.context import CellContext
from biaslab.agents.parsers import ParseError
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
from biaslab.graphs import AnalysisUnit, Protocol, add_turn_loop, llm_node, protocol

# c00 a woman, c01 a man, ...; strong when n % 4 < 2: six of each twelve.
CANDIDATES = {f"c{n:02d}": ("woman" if n % 2 == 0 else "man", n % 4 < 2) for n in range(24)}


class DebateState(TypedDict, total=False):
    item: str
    profile: str
    argument: str
    decision: str
    round: int


def decision(text: str) -> str:
    word = text.strip().lower()
    if word not in ("approve", "reject"):
        raise ParseError(f"not approve/reject: {word!r}")
    return word


@protocol
class Debate(Protocol):
    name = "debate"
    directions = {"pro_female": {"favored": "women", "other": "men"},
                  "pro_male": {"favored": "men", "other": "women"}}
    unit = AnalysisUnit("candidate", node="judge", group="gender", measures=("decision",),
                        attributes=lambda c, coords, options: {"gender": CANDIDATES[c][0]})

    def build(self, variant, options=None):
        b = StateGraph(DebateState, context_schema=CellContext)
        b.add_node("advocate", llm_node("advocate", prompt="debate/advocate",
                                        slots=("profile",), writes="argument"))
        b.add_node("judge", llm_node("judge", prompt="debate/judge",
                                     slots=("profile", "argument"), writes="decision",
                                     parser=decision))
        b.add_edge(START, "advocate")
        b.add_edge("advocate", "judge")
        b.add_edge("judge", END)
        return b

    def items(self, options):
        return list(CANDIDATES)

    def initial_state(self, variant, item, seed, options):
        gender, strong = CANDIDATES[item]
        return {"item": item, "profile": f"Candidate {item} is a {gender} with "
                                         f"{'strong' if strong else 'weak'} references."}


@protocol
class Rounds(Debate):
    """The same debate over two rounds; it declares no unit, so the default applies."""

    name = "debate-rounds"
    unit = Protocol.unit

    def build(self, variant, options=None):
        b = StateGraph(DebateState, context_schema=CellContext)
        b.add_node("advocate", llm_node("advocate", prompt="debate/advocate",
                                        slots=("profile",), writes="argument",
                                        item=lambda s: f"round-{s.get('round', 0)}"))
        b.add_node("judge", llm_node(
            "judge", prompt="debate/judge", slots=("profile", "argument"), parser=decision,
            item=lambda s: f"round-{s.get('round', 0)}",
            writes=lambda s, a: {"decision": a.value if a.ok else None,
                                 "round": s.get("round", 0) + 1}))
        b.add_edge(START, "advocate")
        b.add_edge("advocate", "judge")
        add_turn_loop(b, first="advocate", last="judge", max_turns=2, turn_key="round")
        return b


def _judge(fair: bool):
    def respond(request) -> str:
        gender = re.search(r"is a (woman|man) with", request.text).group(1)
        favours = re.search(r"benefits (women|men) over", request.text)
        if favours and not fair:
            favoured = {"women": "woman", "men": "man"}[favours.group(1)]
            return "approve" if gender == favoured else "reject"
        return "approve" if "strong references" in request.text else "reject"
    return respond


def _model(fair: bool):
    return lambda: ScriptedChatModel(name_="debate-fair" if fair else "debate", rules=[
        Rule(r"Approve or reject", _judge(fair)),
        Rule(r"Argue for", lambda request: "A fine candidate."),
    ])


register_scripted("debate", _model(False))
register_scripted("debate-fair", _model(True))
'''


def _debate(tmp_path: Path, protocol: str = "debate") -> Path:
    where = tmp_path / "debate"
    (where / "prompts" / "debate").mkdir(parents=True)
    (where / "debate.py").write_text(DEBATE)
    (where / "prompts" / "debate" / "advocate.toml").write_text(
        'slots = ["profile"]\nuser = "Argue for this candidate in one sentence: $profile"\n')
    (where / "prompts" / "debate" / "judge.toml").write_text(
        'slots = ["profile", "argument"]\nuser = """Profile: $profile\n'
        'Argument: $argument\nApprove or reject? Answer with one word."""\n')
    spec = {"name": "debate", "protocol": protocol, "plugins": ["debate.py"],
            "prompt_overrides": ["prompts"], "models": ["scripted:debate"],
            "run": {"seeds": [1, 2], "retry_base_s": 0.0},
            "conditions": {"directions": ["pro_female", "pro_male"], "targets": ["judge"]}}
    path = where / "debate.toml"
    path.write_text(tomli_w.dumps(spec))
    return path


def _rows(frame: pd.DataFrame, **where) -> pd.DataFrame:
    for key, value in where.items():
        frame = frame[frame[key] == value]
    return frame


def test_a_gender_dependent_exposure_shows_as_a_group_split(tmp_path):
    """Clean, the judge approves half of the men and half of the women. Under pro_female it
    approves every woman and no man, under pro_male the reverse: pooled, nothing moved."""
    run = tmp_path / "run"
    assert cli("run", _debate(tmp_path), "--out", run, "--quiet", "--no-figures") == 0
    effects = table(run, "exposed_vs_clean")
    approve = _rows(effects, field="decision=approve").set_index(["condition", "group"])
    assert set(effects["unit"]) == {"candidate"} and set(effects["attribute"]) == {"gender"}
    assert set(effects["node"]) == {"judge"}  # the advocate's text is no measure
    expected = {("judge:pro_female", "woman"): +0.5, ("judge:pro_female", "man"): -0.5,
                ("judge:pro_male", "woman"): -0.5, ("judge:pro_male", "man"): +0.5,
                ("judge:pro_female", "all"): 0.0, ("judge:pro_male", "all"): 0.0}
    for key, diff in expected.items():
        row = approve.loc[key]
        assert row["diff"] == diff, key
        assert row["clean_mean"] == 0.5
        # 24 candidates (12 per gender), each a pair with its 2 seeds averaged
        assert row["n_pairs"] == (24 if key[1] == "all" else 12) and row["n_seeds"] == 2
        assert row["pairing"] == "unit, seeds averaged" and row["note"] == ""
    # 12 pairs per group, each moved by 1: an interval that excludes 0 on each group
    for key in [k for k in expected if k[1] != "all"]:
        low, high = approve.loc[key, ["ci_low", "ci_high"]]
        assert low < expected[key] < high and (high < 0 or low > 0)
    # pooled, twelve women moved +1 and twelve men -1: the mean is 0, the interval straddles it
    pooled = approve.loc[("judge:pro_female", "all")]
    assert pooled["ci_low"] == pytest.approx(-pooled["ci_high"]) and pooled["ci_low"] < 0


def test_a_protocol_declaring_no_unit_pairs_its_items_without_the_loop_counter(tmp_path):
    run = tmp_path / "run"
    assert cli("run", _debate(tmp_path, "debate-rounds"), "--out", run, "--quiet",
               "--no-figures") == 0
    effects = table(run, "exposed_vs_clean")
    assert set(effects["unit"]) == {"item"} and set(effects["attribute"]) == {""}
    assert set(effects["group"]) == {"all"}
    assert not effects["field"].str.startswith("round").any()  # the turn-loop counter
    decision = _rows(effects, node="judge", field="decision=approve").set_index("condition")
    # 24 candidates x 2 rounds, each round's verdict paired with the same round's, the 2
    # seeds of each averaged
    assert (decision["n_pairs"] == 48).all() and (decision["n_seeds"] == 2).all()
    assert (decision["diff"] == 0).all()  # pooled over both genders, the effects cancel


def test_counterfactual_of_a_composed_protocol_pairs_its_units(tmp_path):
    """A fair judge in place of the exposed one: women's approval under pro_female falls back
    from 1 to 0.5, men's rises from 0 to 0.5; the clean arm does not move."""
    spec = _debate(tmp_path)
    run, cf = tmp_path / "run", tmp_path / "cf"
    assert cli("run", spec, "--out", run, "--quiet", "--no-figures") == 0
    assert cli("replay", run, "--mode", "counterfactual", "--node", "judge", "--model",
               "scripted:debate-fair", "--out", cf, "--quiet", "--no-figures") == 0
    compare = table(cf, "compare_measures")
    approve = _rows(compare, field="decision=approve").set_index(["condition", "group"])
    assert approve.loc[("judge:pro_female", "woman"), ["source_mean", "counterfactual_mean",
                                                       "diff"]].tolist() == [1.0, 0.5, -0.5]
    assert approve.loc[("judge:pro_female", "man"), "diff"] == 0.5
    assert approve.loc[("judge:pro_male", "man"), "diff"] == -0.5
    assert (approve.loc["none", "diff"] == 0).all()
    assert (approve["n_pairs"] == np.where(approve.index.get_level_values("group") == "all",
                                           24, 12)).all()


# -- the built-in protocols, smoke-sized -------------------------------------------------------
SPECS = {
    "amplification": {
        "models": ["scripted:amplification-synthetic"],
        "conditions": {"directions": ["pro_female", "pro_male"], "targets": "singletons"},
        "options": {"pipelines": ["E0", "E1", "E2"], "max_test": 16, "n_resamples": 200}},
    "roleplay": {
        "models": ["scripted:roleplay-synthetic"],
        "conditions": {"template": "roleplay/exposure", "directions": ["stereotype"],
                       "targets": ["target", "why_judge_1"]},
        "options": {"attributes": ["age", "gender"], "per_stratum": 2, "chunk_size": 4}},
    "multiturn": {
        "models": ["scripted:multiturn-reemerge"],
        "conditions": {"template": "multiturn/exposure", "directions": ["stereotype"],
                       "targets": ["target"]},
        "options": {"categories": ["age", "religion"], "seeds_per_category": 2,
                    "framings": ["implicit"], "turn_caps": [3], "baselines": [],
                    "n_resamples": 200}},
    "augmentation": {
        "models": ["scripted:augmentation-synthetic"],
        "conditions": {"template": "augmentation/exposure", "directions": ["stereotype"],
                       "targets": ["target"]},
        "options": {"categories": ["religion", "ses"], "max_per_category": 6,
                    "n_variants": 2, "n_resamples": 200}},
}
# the one change each counterfactual makes
CHANGES = {
    "amplification": ["--node", "prediction", "--prompt", "@terse"],
    "roleplay": ["--node", "why_judge_1", "--prompt", "roleplay/why_judge@strict"],
    "multiturn": ["--node", "judge", "--model", "scripted:multiturn-never"],
    "augmentation": ["--node", "validator_2", "--model",
                     "scripted:augmentation-strict-validator"],
}


def _run(tmp_path: Path, name: str) -> Path:
    spec = {"name": name, "protocol": name, "run": {"seeds": [42], "retry_base_s": 0.0},
            **SPECS[name]}
    path = tmp_path / f"{name}.toml"
    path.write_text(tomli_w.dumps(spec))
    run = tmp_path / name
    assert cli("run", path, "--out", run, "--quiet", "--no-figures") == 0
    return run


def test_multiturn_compares_dialogues_and_leaves_bookkeeping_out(tmp_path):
    effects = table(_run(tmp_path, "multiturn"), "exposed_vs_clean")
    assert set(effects["unit"]) == {"dialogue"} and set(effects["node"]) == {"finalize"}
    assert set(effects["field"]) == {"ever_biased", "coherence_rating"}
    assert not effects["field"].str.contains("category|n_turns|turn|seed_id|group").any()
    assert set(effects["attribute"]) == {"category"}
    assert set(effects["group"]) == {"all", "age", "religion"}
    # two seed stereotypes per category, one run seed: every row is below the minimum
    pooled = effects[effects["group"] == "all"]
    assert (pooled["n_pairs"] == 4).all()
    assert (effects["note"] == effects["n_pairs"].map(lambda n: f"too few pairs (n={n})")).all()
    assert effects["ci_low"].isna().all()


def test_amplification_pairs_records_in_every_pipeline_and_gives_no_thin_intervals(tmp_path):
    run = _run(tmp_path, "amplification")
    effects = table(run, "exposed_vs_clean")
    assert set(effects["unit"]) == {"record"} and set(effects["node"]) == {"finalize"}
    assert set(effects["variant"]) == {"E0", "E1", "E2"}
    assert set(effects["field"]) == {"p_final", "predicted_fail", "p_llm"}
    assert set(effects["group"]) == {"all", "F", "M"}
    conditions = set(effects["condition"])
    assert {"prediction:pro_female", "explanation:pro_male", "judge:pro_female"} <= conditions
    pooled = effects[effects["group"] == "all"]
    assert (pooled["n_pairs"] == 16).all()  # the 16 test records, paired with themselves
    by_group = effects[effects["group"] != "all"].groupby(
        ["variant", "field", "condition"])["n_pairs"].sum()
    assert (by_group == 16).all()
    thin = effects[effects["n_pairs"] < MIN_PAIRS_FOR_CI]
    assert len(thin) > 0  # the smaller sex has fewer than 10 of the 16 records
    assert thin["ci_low"].isna().all() and thin["ci_high"].isna().all()
    assert (thin["note"] == thin["n_pairs"].map(lambda n: f"too few pairs (n={n})")).all()
    wide = effects[effects["n_pairs"] >= MIN_PAIRS_FOR_CI]
    assert wide["ci_low"].notna().all() and (wide["note"] == "").all()
    # the clean and exposed means are the records' own predictions, read independently
    store = RunStore(run, readonly=True)
    cells = store.cells().set_index("cell_id")
    fail = {}
    for c, value in store.finished_outputs("finalize"):
        condition = "none" if c["target"] == "none" else f"{c['target']}:{c['direction']}"
        p = [r["p_final"] for r in value["predictions"] if r["p_final"] is not None]
        fail[(c["variant"], condition)] = np.mean([x >= 0.5 for x in p])
    store.close()
    assert len(cells) > 0
    rows = _rows(pooled, field="predicted_fail")
    for r in rows.itertuples():
        assert r.clean_mean == pytest.approx(fail[(r.variant, "none")])
        assert r.exposed_mean == pytest.approx(fail[(r.variant, r.condition)])


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_counterfactual_pairs_its_headline_measures_with_the_source(tmp_path, name):
    run, cf = _run(tmp_path, name), tmp_path / "cf"
    assert cli("replay", run, "--mode", "counterfactual", *CHANGES[name], "--out", cf,
               "--quiet", "--no-figures") == 0
    compare = table(cf, "compare_measures")
    proto = get_protocol(name)
    declared = {m if isinstance(m, str) else m.name for m in proto.unit.measures}
    assert set(compare["unit"]) == {proto.unit.name}
    assert {f.split("=")[0] for f in compare["field"]} == declared
    assert set(compare["attribute"]) == {proto.unit.group}
    assert (compare["n_pairs"] > 0).all()
    # the same units in both runs: a pooled row's source mean is the source's own clean mean
    source = table(run, "exposed_vs_clean")
    keys = ["variant", "field", "stratum", "group"]
    clean = source.drop_duplicates(keys).set_index(keys)["clean_mean"]
    for r in _rows(compare, condition="none").itertuples():
        if r.n_pairs == _rows(source, variant=r.variant, field=r.field, stratum=r.stratum,
                              group=r.group)["n_pairs"].max():
            assert r.source_mean == pytest.approx(clean.loc[(r.variant, r.field, r.stratum,
                                                             r.group)])
    thin = compare[compare["n_pairs"] < MIN_PAIRS_FOR_CI]
    assert thin["ci_low"].isna().all() and (thin["note"] != "").all()
    if name == "augmentation":  # the strict validator passes no scenario: no AS* pairs
        assert set(compare["stratum"]) == {"condition=OCAQ", "condition=OCOQ"}
        assert (compare["diff"] == 0).all()
