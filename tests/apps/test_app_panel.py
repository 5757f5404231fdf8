"""App (c): a supervisor routing with structured output (a tool call), a research team
subgraph fanning out with ``Send`` and calling ``batch`` from a sync node, and a decider that
builds its own model inside the node. Subgraph nodes are named by their path."""

from __future__ import annotations

import pandas as pd
import pytest

from support_apps import HERE, calls, cli, effects, exposed_only_at_targets, outputs

SPEC = HERE / "panel_audit.toml"


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    root = tmp_path_factory.mktemp("panel")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASLAB_CACHE", str(root / "cache.sqlite"))
        assert cli("run", SPEC, "--out", root / "run", "--quiet", "--no-report") == 0
        assert cli("report", root / "run", "--no-figures") == 0
    return root


def test_calls_are_attributed_to_subgraph_paths_fan_out_and_router(audited):
    frame = calls(audited / "run")
    per_cell = frame.groupby("node").size() / 9  # three items x three arms
    assert per_cell.to_dict() == {"supervisor": 2, "research_team/screener": 4,
                                  "research_team/summarizer": 1, "decider": 1}
    route = frame[frame["node"] == "supervisor"].iloc[0]
    assert route["params"]["tool_choice"]["function"]["name"] == "Route"
    assert route["parsed"]["tool_calls"][0]["name"] == "Route"
    assert exposed_only_at_targets(audited / "run")


def test_the_report_recovers_the_bias_at_both_exposed_nodes(audited):
    found = effects(audited / "run")
    for arm in ("research_team/screener:pro_older", "decider:pro_older"):
        assert found[(arm, "decision=older")] == 1.0
        assert found[(arm, "decision=either")] == -1.0


def test_strict_replay_makes_no_call(audited, capsys):
    assert cli("replay", audited / "run", "--mode", "strict", "--out", audited / "s") == 0
    assert "0 model calls" in capsys.readouterr().out
    assert outputs(audited / "s") == outputs(audited / "run")


def test_a_fair_decider_removes_every_effect_and_only_its_calls_are_new(audited, capsys):
    out = audited / "cf"
    capsys.readouterr()
    assert cli("replay", audited / "run", "--mode", "counterfactual", "--node", "decider",
               "--model", "scripted:panel-fair", "--out", out, "--quiet", "--no-figures") == 0
    frame = calls(out)
    assert set(frame.loc[~frame["cache_hit"], "node"]) == {"decider"}
    found = effects(out)
    assert found == {("decider:pro_older", "decision=either"): 0.0,
                     ("research_team/screener:pro_older", "decision=either"): 0.0}
    measures = pd.read_csv(out / "tables" / "compare_measures.csv")
    assert len(measures) > 0


def test_node_paths_below_the_namespace_the_app_runs_in():
    from biaslab.agents.app_models import node_path

    meta = {"langgraph_checkpoint_ns": "app:1|team:2|member:3", "langgraph_node": "member"}
    assert node_path(meta, "app:1") == "team/member"
    assert node_path({**meta, "langgraph_checkpoint_ns": "team:2|member:3"}, "app:1") == \
        "team/member"  # an app that runs as a top-level graph (its own checkpointer)
    assert node_path({"langgraph_checkpoint_ns": "chair:9", "langgraph_node": "chair"}, "") == \
        "chair"
