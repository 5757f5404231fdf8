"""The roleplay protocol end to end on the synthetic scripted target: CLI run, report, strict
replay, a judge-only counterfactual, recovery of the injected bias, and bank generation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w

from biaslab.cli import main
from biaslab.experiments.reports import protocol_report
from biaslab.datasets import biaslens
from biaslab.evaluators import roleplay as rp
from biaslab.experiments.reports.roleplay import questions_frame
from biaslab.errors import UserError
from biaslab.graphs.registry import get_protocol
from biaslab.graphs.roleplay import RoleplayOptions
from biaslab.graphs.roleplay_synthetic import BIAS_RATES, STEREOTYPE_SHIFT
from biaslab.traces.store import RunStore
from support_runs import run_spec

REPO = Path(__file__).resolve().parents[2]


def roleplay_spec(**options) -> dict:
    return {"name": "rp", "protocol": "roleplay", "models": ["scripted:roleplay-synthetic"],
            "run": {"seeds": [42], "concurrency": 8, "retry_base_s": 0.0},
            "conditions": {"template": "roleplay/exposure", "directions": ["stereotype"],
                           "targets": ["target", "why_judge_1"]},
            "options": {"attributes": ["age", "gender", "race"], "per_stratum": 4,
                        "chunk_size": 4, **options}}


def _write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(spec))
    return path


def test_cli_run_report_strict_replay_and_judge_only_counterfactual(tmp_path, capsys,
                                                                    monkeypatch):
    spec = _write(tmp_path, roleplay_spec())
    run = tmp_path / "run"
    assert main(["run", str(spec), "--out", str(run), "--quiet"]) == 0
    tables = {p.name for p in (run / "tables").iterdir()}
    assert {"table3.csv", "table3.md", "table5.csv", "table6.csv", "overlap.csv",
            "per_attribute.csv", "top_roles.csv", "bias_types.csv", "oracle_agreement.csv",
            "exposure_effects.csv", "biased_counts.csv", "parse_failures.csv"} <= tables
    figures = {p.name for p in (run / "figures").iterdir()}
    for name in ("overlap_hist", "per_attribute", "bias_type_heatmap", "exposure_effects"):
        assert {f"{name}.png", f"{name}.svg"} <= figures
    store = RunStore(run, readonly=True)
    calls = store.calls()
    questions = questions_frame(store)
    store.close()
    # 3 attributes × 3 types × 4 questions, each answered 3 times per variant and arm
    target = calls[calls["node"] == "target"]
    assert target.groupby(["cell_id", "item"]).size().eq(3).all()
    clean_role = (questions["variant"] == "role") & (questions["condition"] == "none")
    assert clean_role.sum() == 36
    why = calls[calls["node"].str.startswith("why_judge_")]
    assert set(why["node"]) == {"why_judge_1", "why_judge_2", "why_judge_3"}
    assert why["item"].str.match(r"^(age|gender|race)-\d{4}#[0-2]$").all()
    assert (why.groupby("node")["sample"].first().to_dict()
            == {"why_judge_1": 0, "why_judge_2": 1, "why_judge_3": 2})
    table5 = pd.read_csv(run / "tables" / "table5.csv")
    assert table5["type"].tolist() == ["choice", "why", "yes_no", "overall"]
    assert (table5["biased_no_role"] == 0).all()  # the synthetic target needs its role
    assert (table5["decrease_rate"].dropna() == 1.0).all()  # all its bias goes with the role
    overall = table5.set_index("type").loc["overall"]
    assert overall.n_role == 36 and overall.biased_role == table5["biased_role"][:3].sum()
    judges = pd.read_csv(run / "tables" / "judge_votes.csv")
    # the judge exposed to 'stereotype' calls every answer fair: its own share shows it
    exposed = judges[(judges["condition"] == "why_judge_1:stereotype")
                     & (judges["variant"] == "role")].set_index("judge")
    assert exposed.loc["why_judge_1", "biased_share"] == 0.0
    assert exposed.loc["why_judge_2", "biased_share"] > 0

    capsys.readouterr()
    assert main(["report", str(run), "--no-figures"]) == 0
    assert "Table 5" in capsys.readouterr().out

    assert main(["replay", str(run), "--mode", "strict", "--out", str(tmp_path / "strict"),
                 "--quiet"]) == 0
    assert "node outputs identical, 0 model calls" in capsys.readouterr().out

    monkeypatch.setenv("BIASLAB_CACHE", "off")  # only the source trace may answer
    cf = tmp_path / "cf"
    assert main(["replay", str(run), "--mode", "counterfactual", "--node", "why_judge_1",
                 "--prompt", "roleplay/why_judge@strict", "--out", str(cf), "--quiet",
                 "--no-figures"]) == 0
    paid = int(re.search(r"counterfactual run in .*: (\d+) model calls",
                         capsys.readouterr().out).group(1))
    calls = RunStore(cf, readonly=True).calls()
    live = calls[~calls["cache_hit"]]
    judge_1 = calls[calls["node"] == "why_judge_1"]
    assert set(live["node"]) == {"why_judge_1"}  # no target, other judge or classifier call
    assert paid == len(live) == judge_1["cache_key"].nunique() > 0
    assert (judge_1["prompt_id"] == "roleplay/why_judge@strict").all()
    assert calls.loc[calls["node"] == "target", "cache_hit"].all()


def test_estimate_counts_the_calls_a_run_makes(tmp_path, capsys):
    spec_dict = roleplay_spec(per_stratum=2)
    spec = _write(tmp_path, spec_dict)
    assert main(["estimate", str(spec), "--json"]) == 0
    estimate = json.loads(capsys.readouterr().out)[0]
    run_spec(spec_dict, tmp_path / "run")
    store = RunStore(tmp_path / "run", readonly=True)
    calls = store.calls()
    store.close()
    # No re-asks on the scripted model, so every expected call is made (some are answered
    # from the cache: identical judge prompts, the unchanged answers of a judge's arm).
    assert estimate["calls_estimate"] == len(calls)
    assert estimate["by_variant"]["bias_type"]["calls"] == 3 * 3 * 2  # one per question


def test_oracle_reliability_against_imported_human_labels(tmp_path):
    run_spec(roleplay_spec(types=["why"], per_stratum=6, classify_bias_types=False),
             tmp_path / "run")
    store = RunStore(tmp_path / "run", readonly=True)
    frame = questions_frame(store)
    role = frame[(frame["variant"] == "role") & (frame["condition"] == "none")]
    # a human who marks exactly the synthetic target's justifying answers as biased
    labels = [{"qid": r.qid, "sample": k, "label": "biased" if "simply how" in raw else "fair"}
              for r in role.itertuples() for k, raw in enumerate(_raw_answers(store, r))]
    human = tmp_path / "human.csv"
    pd.DataFrame(labels).to_csv(human, index=False)
    options = RoleplayOptions(**{**roleplay_spec(types=["why"], per_stratum=6)["options"],
                                 "human_labels": str(human)})
    protocol_report(get_protocol("roleplay"), store, tmp_path / "run", options)
    store.close()
    table = pd.read_csv(tmp_path / "run" / "tables" / "oracle_agreement.csv")
    vs_human = table[table["reference"] == "human"].set_index("oracle")
    assert vs_human.loc["judge_ensemble", "n"] == len(labels) == 3 * 3 * 6
    assert vs_human.loc["judge_ensemble", "kappa"] == 1.0
    assert vs_human.loc["why_judge_2", "percent_agreement"] == 1.0
    # the keyword rule flags fair answers that say "due to": it agrees less
    assert vs_human.loc["keyword", "percent_agreement"] < 1.0
    (tmp_path / "bad.csv").write_text("qid,label\nage-0001,biased\n")
    with pytest.raises(UserError, match="missing column 'sample'"):
        protocol_report(get_protocol("roleplay"), RunStore(tmp_path / "run", readonly=True),
                        tmp_path / "run",
                        options.model_copy(update={"human_labels": str(tmp_path / "bad.csv")}))


def _raw_answers(store, row) -> list[str]:
    """The target's raw answers to one question in one cell, in sample order."""
    calls = [c for c in store.iter_calls(row.cell_id) if c.node == "target" and c.item == row.qid]
    return [c.raw for c in sorted(calls, key=lambda c: c.sample)]


def test_paper_and_smoke_specs_estimate():
    for scale in ("paper", "smoke"):
        assert main(["estimate", str(REPO / "experiments" / "roleplay.toml"), "--scale", scale,
                     "--json"]) == 0
    assert main(["estimate", str(REPO / "experiments" / "roleplay_generate.toml")]) == 0


def _expected_majority(p: float) -> float:
    return p ** 3 + 3 * p ** 2 * (1 - p)


def test_the_synthetic_targets_injected_bias_is_recovered_within_ci(tmp_path):
    """Per-answer bias p_a per attribute, only with the role statement: the per-attribute
    counts, the role/no-role z-test and the consistency table must recover it. Many intervals
    are checked, so each is a 99.9% interval."""
    spec = roleplay_spec(attributes=list(biaslens.ATTRIBUTES), types=["yes_no", "choice"],
                         per_stratum=30, chunk_size=30, classify_bias_types=False)
    spec["conditions"] = {"template": "roleplay/exposure", "directions": ["stereotype"],
                          "targets": ["target"]}
    result = run_spec(spec, tmp_path / "run")
    assert result.cells_failed == 0
    store = RunStore(tmp_path / "run", readonly=True)
    frame = questions_frame(store)
    store.close()
    clean = frame[frame["condition"] == "none"]
    role = clean[clean["variant"] == "role"]
    assert role["verdict"].map(lambda v: v is not None).all()

    counts = rp.biased_counts(role, ["attribute"], confidence=0.999).set_index("attribute")
    for attribute, p in BIAS_RATES.items():
        row = counts.loc[attribute]
        assert row.ci_low <= _expected_majority(p) <= row.ci_high, attribute

    test = rp.role_vs_no_role(clean, by=("model",), confidence=0.999).iloc[0]
    expected = np.mean([_expected_majority(BIAS_RATES[a]) for a in role["attribute"]])
    assert test.biased_no_role == 0 and test.p_value < 1e-10
    assert test.ci_low <= expected <= test.ci_high

    consistency = rp.consistency_table(role, by=("model",), confidence=0.999).iloc[0]
    p = role["attribute"].map(BIAS_RATES)
    for name, share in (("consistent", p ** 3 + (1 - p) ** 3),
                        ("two_biased", 3 * p ** 2 * (1 - p)), ("one_biased", 3 * p * (1 - p) ** 2)):
        expected_share = share.mean()  # shares of all questions (Table 6)
        assert (consistency[f"{name}_ci_low"] <= expected_share
                <= consistency[f"{name}_ci_high"]), name

    # the stereotype arm adds STEREOTYPE_SHIFT to every per-answer rate, on the same questions
    exposed = frame[(frame["condition"] == "target:stereotype") & (frame["variant"] == "role")]
    shifted = np.mean([_expected_majority(min(1.0, BIAS_RATES[a] + STEREOTYPE_SHIFT))
                       for a in exposed["attribute"]])
    rate, low, high = rp.rate_with_ci(int(exposed["verdict"].sum()), len(exposed), 0.999)
    assert low <= shifted <= high


def test_generation_builds_a_loadable_bank_and_counts_what_it_drops(tmp_path):
    spec = {"name": "gen", "protocol": "roleplay_generate",
            "models": ["scripted:roleplay-synthetic"],
            "run": {"seeds": [42], "concurrency": 4, "retry_base_s": 0.0},
            "conditions": {"template": "roleplay/exposure", "directions": ["stereotype"],
                           "targets": ["question_generator"]},
            "options": {"attributes": ["age", "gender"], "roles_per_attribute": 4,
                        "questions_per_role": 3}}
    spec_path = _write(tmp_path, spec)
    assert main(["run", str(spec_path), "--out", str(tmp_path / "run"), "--quiet",
                 "--no-figures"]) == 0
    stats = pd.read_csv(tmp_path / "run" / "tables" / "generation_stats.csv")
    clean = stats[stats["condition"] == "none"].set_index("item")
    # the scripted generator lists one near-duplicate role and one placeholder question per list
    assert clean["roles_generated"].tolist() == [4, 4]
    assert clean["roles_near_duplicate"].tolist() == [1, 1]
    assert clean["placeholder"].tolist() == [3 * 3, 3 * 3]  # roles_used × types
    assert (clean["questions_kept"] == clean["questions_generated"] - clean["placeholder"]
            - clean.get("duplicate", 0)).all()
    bank = tmp_path / "run" / "bank" / "scripted_roleplay-synthetic" / "none"
    loaded = biaslens.load_questions(bank)
    assert set(loaded["attribute"]) == {"age", "gender"}
    assert set(loaded["type"]) == {"yes_no", "choice", "why"}
    assert not loaded["question"].str.contains("Group A").any()
    assert (loaded["question"].map(biaslens.strip_role) == loaded["question_no_role"]).all()
    roles = biaslens.load_roles(bank)
    assert all(len(r) == 3 for r in roles.values())
    # a generated bank is answered by the roleplay protocol like the shipped one
    answer = roleplay_spec(bank_dir=str(bank), attributes=["age"], per_stratum=1)
    assert run_spec(answer, tmp_path / "answered").cells_failed == 0
