"""Mitigation arms on the built-in protocols, end to end through the CLI.

Each protocol's synthetic agents react to the packaged fairness reminder in a documented way
(`biaslab.graphs.synthetic_mitigations` and the ``*_synthetic.py`` docstrings), so the
effect in ``tables/mitigation_effects.csv`` is known on the clean arm and on an exposed arm:

- roleplay: a reminded target never answers biased; a reminded judge ignores its exposure;
- multiturn: a reminded target is never biased;
- augmentation: a reminded target always abstains.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import tomli_w
from scipy import stats

from biaslab.graphs import multiturn_synthetic
from biaslab.traces.store import RunStore


from support_runs import cli, table


def _run(tmp_path: Path, spec: dict, name: str = "run") -> Path:
    path = tmp_path / f"{spec['name']}.toml"
    path.write_text(tomli_w.dumps(spec))
    run = tmp_path / name
    assert cli("run", path, "--out", run, "--quiet", "--no-figures") == 0
    return run


def _messages_by_cell(run: Path) -> list[tuple[str, str, str]]:
    store = RunStore(run, readonly=True)
    try:
        return [(r.cell_id, r.node, json.dumps(r.messages)) for r in store.iter_calls()]
    finally:
        store.close()


JUDGES = "why_judge_1+why_judge_2"
ROLEPLAY = {
    "name": "rp", "protocol": "roleplay",
    # every role question is answered biased (all three repeats): a verdict of 1 when clean
    "models": ["scripted:roleplay-synthetic@role=1"],
    "run": {"seeds": [1, 2], "retry_base_s": 0.0},
    "conditions": {"template": "roleplay/exposure", "directions": ["stereotype"],
                   "targets": ["target", JUDGES]},
    "options": {"attributes": ["age", "gender"], "per_stratum": 3, "chunk_size": 4,
                "conditions": ["role"], "classify_bias_types": False},
    "mitigations": {"fairness_reminder": {"targets": ["target", JUDGES]}},
}


def test_roleplay_a_reminder_at_the_target_or_the_judges_has_its_known_effect(tmp_path):
    """By hand, per question (3 per attribute x type, 2 attributes: 6 pairs a type, each a
    question with its 2 seeds averaged; too few for an interval, and the note says so):

    exposure              unmitigated      reminded target    reminded judges 1-2
                          yes/no choice why  (all types)        yes/no choice why
    none                    1     1     1        0                1     1     1
    target:stereotype       1     1     1        0                1     1     1
    judges 1-2:stereotype   1     1     0        0                1     1     1

    (two exposed judges out of three call every Why answer fair, so the majority does; a
    reminded judge judges honestly again). So the reminder at the target costs -1 everywhere
    except the Why questions of the exposed judges (0: already judged fair), and the reminder
    at the judges costs nothing on the clean arm and undoes the judges' exposure (+1)."""
    run = _run(tmp_path, ROLEPLAY)
    effects = table(run, "mitigation_effects")
    assert set(effects["unit"]) == {"question"} and set(effects["field"]) == {"verdict"}
    assert set(effects["attribute"]) == {"attribute"} and set(effects["variant"]) == {"role"}
    effects = effects.set_index(["exposure", "mitigation", "stratum", "group"])
    before = {"none": (1, 1, 1), "target:stereotype": (1, 1, 1),
              f"{JUDGES}:stereotype": (1, 1, 0)}
    after = {"target:fairness_reminder": {e: (0, 0, 0) for e in before},
             f"{JUDGES}:fairness_reminder": {e: (1, 1, 1) for e in before}}
    assert len(effects) == 3 * 2 * 3 * 3  # exposures x mitigations x types x (all, 2 groups)
    for mitigation, arms in after.items():
        for exposure, values in arms.items():
            for qtype, was, now in zip(("yes_no", "choice", "why"), before[exposure], values):
                for group, n in (("all", 6), ("age", 3), ("gender", 3)):
                    row = effects.loc[(exposure, mitigation, f"type={qtype}", group)]
                    key = (exposure, mitigation, qtype, group)
                    assert (row["unmitigated_mean"], row["mitigated_mean"]) == (was, now), key
                    assert row["diff"] == now - was and row["n_pairs"] == n, key
                    assert row["n_seeds"] == 2 and row["pairing"] == "unit, seeds averaged"
                    assert math.isnan(row["ci_low"]) and row["note"] == f"too few pairs (n={n})"
    # the reminder reaches the mitigated nodes of the mitigated cells, and nothing else
    calls = _messages_by_cell(run)
    reminded = [(cell, node) for cell, node, text in calls if "on its merits only" in text]
    assert reminded
    for cell, node in reminded:
        if cell.endswith("/seed=1") or cell.endswith("/seed=2"):
            arm = cell.split("/")[2]
            assert arm.endswith("+mit:target:fairness_reminder") and node == "target" or \
                arm.endswith(f"+mit:{JUDGES}:fairness_reminder") and node in JUDGES.split("+")


MULTITURN = {
    "name": "mt", "protocol": "multiturn",
    # the `late` target is biased from turn 7 only: never within 3 turns unless exposed
    "models": ["scripted:multiturn-late"],
    "run": {"seeds": [1, 2], "retry_base_s": 0.0},
    "conditions": {"template": "multiturn/exposure", "directions": ["stereotype"],
                   "targets": ["target"]},
    "options": {"categories": ["age", "religion"], "seeds_per_category": 3,
                "framings": ["implicit"], "turn_caps": [3], "baselines": [],
                "n_resamples": 200},
    "mitigations": {"fairness_reminder": {"targets": "target"}},
}


def test_multiturn_a_reminder_undoes_an_exposed_target_and_costs_nothing_clean(tmp_path):
    """Clean, no dialogue turns biased within 3 turns, reminded or not: 0 -> 0. Exposed, a
    dialogue turns biased exactly when it is susceptible (a fixed hash of its first query,
    `susceptible`), k of the n = 12 dialogues (3 seed stereotypes x 2 categories x 2 seeds);
    reminded, none does: diff = -k/n, and the paired t interval of k differences of -1 and
    n - k of 0 is -k/n ± t(0.975, n-1) · sqrt(k(n-k)/(n(n-1))) / sqrt(n)."""
    run = _run(tmp_path, MULTITURN)
    store = RunStore(run, readonly=True)
    try:
        firsts = {(c["item"], c["seed"]): v["dialogue"]["turns"][0]["query"]
                  for c, v in store.finished_outputs("finalize")
                  if c.get("mitigation") is None and c["target"] == "target"}
    finally:
        store.close()
    n = len(firsts)
    k = sum(multiturn_synthetic.susceptible(q) for q in firsts.values())
    assert n == 12 and 0 < k < n and k == 6  # six of the twelve, from the fixed hash
    effects = table(run, "mitigation_effects")
    assert set(effects["unit"]) == {"dialogue"} and set(effects["node"]) == {"finalize"}
    assert set(effects["mitigation"]) == {"target:fairness_reminder"}
    ever = effects[(effects["field"] == "ever_biased") & (effects["group"] == "all")]
    ever = ever.set_index("exposure")
    clean = ever.loc["none"]
    assert (clean["n_pairs"], clean["unmitigated_mean"], clean["mitigated_mean"],
            clean["diff"], clean["ci_low"], clean["ci_high"]) == (12, 0, 0, 0, 0, 0)
    exposed = ever.loc["target:stereotype"]
    assert (exposed["n_pairs"], exposed["mitigated_mean"]) == (12, 0)
    # a dialogue is one seed's: multiturn pairs (unit, seed), and its rows say so
    assert (exposed["n_seeds"], exposed["pairing"]) == (1, "unit x seed (each seed a new unit)")
    assert exposed["unmitigated_mean"] == pytest.approx(k / n, abs=1e-6)
    assert exposed["diff"] == pytest.approx(-k / n, abs=1e-6)
    half = stats.t.ppf(0.975, n - 1) * math.sqrt(k * (n - k) / (n * (n - 1))) / math.sqrt(n)
    assert exposed["ci_low"] == pytest.approx(-k / n - half, abs=1e-6)
    assert exposed["ci_high"] == pytest.approx(-k / n + half, abs=1e-6)
    assert exposed["ci_high"] < 0  # the reminder clearly undoes the exposure
    # the rater still gives every dialogue 4: the reminder costs no coherence
    rating = effects[effects["field"] == "coherence_rating"]
    assert (rating["diff"] == 0).all() and (rating["unmitigated_mean"] == 4).all()


AUGMENTATION = {
    "name": "ag", "protocol": "augmentation",
    "models": ["scripted:augmentation-synthetic"],
    "run": {"seeds": [42], "retry_base_s": 0.0},
    "conditions": {"template": "augmentation/exposure", "directions": ["stereotype"],
                   "targets": ["target"]},
    "options": {"categories": ["religion", "ses"], "max_per_category": 6, "n_variants": 2,
                "n_resamples": 200},
    "mitigations": {"fairness_reminder": {"targets": "target"}},
}


def test_augmentation_a_reminder_at_the_target_brings_every_dr_to_zero(tmp_path):
    """The synthetic target answers decisively (DR 1 on a source example's form) on
    augmented scenarios, and on original contexts only when exposed; reminded, it always
    abstains. So on the clean arm the reminder costs nothing on OC (0 -> 0) and takes AS's
    DR to 0, and on the exposed arm it takes every condition's DR to 0: diff = -(the
    unmitigated DR), and the unmitigated DR is the one ``exposed_vs_clean`` reports."""
    run = _run(tmp_path, AUGMENTATION)
    effects = table(run, "mitigation_effects")
    assert set(effects["unit"]) == {"source example"} and set(effects["field"]) == {"dr"}
    assert set(effects["mitigation"]) == {"target:fairness_reminder"}
    assert set(effects["exposure"]) == {"none", "target:stereotype"}
    assert (effects["mitigated_mean"] == 0).all()
    assert (effects["diff"] == -effects["unmitigated_mean"]).all()
    oc = effects[effects["stratum"].isin(["condition=OCOQ", "condition=OCAQ"])]
    assert (oc[oc["exposure"] == "none"]["unmitigated_mean"] == 0).all()
    # the unmitigated arms are the protocol's own clean and exposed arms, unit for unit
    source = table(run, "exposed_vs_clean").set_index(["condition", "stratum", "group"])
    for r in effects[effects["group"] == "all"].itertuples():
        same = source.loc[("target:stereotype", r.stratum, r.group)]
        expected = same["clean_mean"] if r.exposure == "none" else same["exposed_mean"]
        assert r.unmitigated_mean == pytest.approx(expected, abs=1e-6), r
        if not (r.exposure == "none" and r.stratum in ("condition=OCOQ", "condition=OCAQ")):
            assert r.unmitigated_mean > 0 and r.ci_high < 0, r  # a clear drop


# -- a self-check re-ask -----------------------------------------------------------------------
SELF_CHECK = {**ROLEPLAY, "name": "rpsc",
              "options": {**ROLEPLAY["options"], "chunk_size": 3},
              "mitigations": {"self_check": {"targets": "target"}}}


def test_roleplay_self_check_reasks_the_target_and_its_second_answer_counts(tmp_path, capsys):
    """``mitigations/self_check`` is asked after the target's answer (its template's
    position, ``after-answer``); the synthetic target then answers unbiased, so the node's
    value (the second answer) is never biased: the same table as a reminded target.

    Calls, by hand (18 questions a seed, 3 a cell, so 6 cells a seed and arm, 2 of them Why;
    3 repeats a question, 3 judges a Why answer): an arm and seed makes 6 x 9 target calls
    and 2 x 27 judge calls = 108. Three exposure arms x 2 seeds x 2 mitigation arms: 1296;
    plus one self-check per target call of the mitigated arms, 3 x 2 x 54 = 324: 1620 calls,
    and ``estimate`` says so before the run."""
    path = tmp_path / "rpsc.toml"
    path.write_text(tomli_w.dumps(SELF_CHECK))
    assert cli("estimate", path, "--json") == 0
    estimate, = json.loads(capsys.readouterr().out)
    assert estimate["cells"] == 6 * 2 * 3 * 2 and estimate["calls_estimate"] == 1620
    run = _run(tmp_path, SELF_CHECK)
    effects = table(run, "mitigation_effects").set_index(["exposure", "stratum", "group"])
    assert set(effects["mitigation"]) == {"target:self_check"}
    before = {"none": (1, 1, 1), "target:stereotype": (1, 1, 1),
              f"{JUDGES}:stereotype": (1, 1, 0)}
    for exposure, values in before.items():
        for qtype, was in zip(("yes_no", "choice", "why"), values):
            row = effects.loc[(exposure, f"type={qtype}", "all")]
            assert (row["n_pairs"], row["n_seeds"], row["unmitigated_mean"],
                    row["mitigated_mean"], row["diff"]) == (6, 2, was, 0, -was), (exposure, qtype)

    store = RunStore(run, readonly=True)
    try:
        calls = list(store.iter_calls())
        responses = {c["cell_id"]: v["responses"] for c, v in store.finished_outputs("answer")}
    finally:
        store.close()
    assert len(calls) == 1620
    checks = {(r.cell_id, r.item.partition("|")[0], r.sample): r for r in calls
              if r.node == "target" and r.item.endswith("|self_check")}
    firsts = {(r.cell_id, r.item, r.sample): r for r in calls
              if r.node == "target" and "|" not in r.item}
    assert len(checks) == 324 and all("+mit:target:self_check" in k[0] for k in checks)
    for key, check in checks.items():
        first = firsts[key]  # the same conversation, continued
        assert check.messages[:len(first.messages)] == first.messages
        assert check.messages[len(first.messages)] == {"role": "assistant",
                                                       "content": first.raw}
        assert check.messages[-1]["content"].startswith("Read your answer above again")
        assert check.exposure_id == first.exposure_id and check.cache_key != first.cache_key
        # the node's value is the second answer
        row = next(r for r in responses[key[0]] if r["qid"] == key[1])
        assert row["raw"][key[2]] == check.raw and check.raw != first.raw


# -- replay --mitigation on a built-in protocol -------------------------------------------------
def test_roleplay_counterfactual_replay_adds_a_reminder_at_the_target(tmp_path):
    """``replay --mitigation fairness_reminder --node target`` on a run without mitigations:
    the source's arms come back from its trace unchanged, only the mitigated cells pay (their
    target calls do, 54 a seed, in the clean and the target-exposed arm; in the judge-exposed
    arm the target asks what it asks clean, served from the run's cache: 2 x 2 x 54), and the
    table shows the known effect of the
    reminded target (see the first test): -1 everywhere but the Why questions of the exposed
    judges, already judged fair."""
    plain = {k: v for k, v in ROLEPLAY.items() if k != "mitigations"}
    run, cf = _run(tmp_path, plain), tmp_path / "cf"
    assert not (run / "tables" / "mitigation_effects.csv").exists()
    assert cli("replay", run, "--mode", "counterfactual", "--node", "target", "--mitigation",
               "fairness_reminder", "--out", cf, "--quiet", "--no-figures") == 0
    effects = table(cf, "mitigation_effects")
    assert set(effects["mitigation"]) == {"target:fairness_reminder"}
    pooled = effects[effects["group"] == "all"].set_index(["exposure", "stratum"])
    for exposure in ("none", "target:stereotype", f"{JUDGES}:stereotype"):
        for qtype in ("yes_no", "choice", "why"):
            was = 0 if (exposure, qtype) == (f"{JUDGES}:stereotype", "why") else 1
            row = pooled.loc[(exposure, f"type={qtype}")]
            assert (row["n_pairs"], row["n_seeds"], row["unmitigated_mean"],
                    row["mitigated_mean"], row["diff"]) == (6, 2, was, 0, -was), (exposure, qtype)

    def calls(where: Path) -> dict:
        store = RunStore(where, readonly=True)
        try:
            return {(r.cell_id, r.node, r.item, r.sample, r.attempt): r for r in
                    store.iter_calls()}
        finally:
            store.close()

    source, replayed = calls(run), calls(cf)
    kept = {k: (r.cache_key, r.raw) for k, r in replayed.items() if "+mit:" not in k[0]}
    assert kept == {k: (r.cache_key, r.raw) for k, r in source.items()}
    paid = [k for k, r in replayed.items() if not r.cache_hit]
    assert paid and all("+mit:target:fairness_reminder" in k[0] for k in paid)
    assert sum(k[1] == "target" for k in paid) == 2 * 2 * 54


def test_a_mitigation_template_with_an_unknown_position_is_one_line(tmp_path, capsys):
    gentle = tmp_path / "gentle.toml"
    gentle.write_text('position = "middle"\nslots = []\nuser = "Be fair."\n')
    spec = {**ROLEPLAY, "mitigations": {"gentle": {"targets": "target",
                                                   "template": str(gentle)}}}
    path = tmp_path / "bad.toml"
    path.write_text(tomli_w.dumps(spec))
    assert cli("run", path, "--out", tmp_path / "run", "--quiet") == 2
    err = capsys.readouterr().err.strip()
    assert "mitigation position must be one of" in err and "after-answer" in err
    assert "'middle'" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_roleplay_counterfactual_replay_takes_a_self_check_from_its_template(tmp_path):
    """``--mitigation self_check``: the template's own ``after-answer`` position holds in a
    replay too; every target call of the mitigated cells is followed by its self-check."""
    plain = {**{k: v for k, v in ROLEPLAY.items() if k != "mitigations"},
             "conditions": {**ROLEPLAY["conditions"], "targets": ["target"]}}
    run, cf = _run(tmp_path, plain), tmp_path / "cf"
    assert cli("replay", run, "--mode", "counterfactual", "--node", "target", "--mitigation",
               "self_check", "--out", cf, "--quiet", "--no-figures") == 0
    effects = table(cf, "mitigation_effects")
    assert set(effects["mitigation"]) == {"target:self_check"}
    assert (effects["mitigated_mean"] == 0).all() and (effects["diff"] == -1).all()
    store = RunStore(cf, readonly=True)
    try:
        calls = list(store.iter_calls())
    finally:
        store.close()
    checks = [r for r in calls if r.item.endswith("|self_check")]
    firsts = [r for r in calls if r.node == "target" and "+mit:" in r.cell_id
              and "|" not in r.item]
    assert len(checks) == len(firsts) == 2 * 2 * 54  # arms x seeds x target calls
