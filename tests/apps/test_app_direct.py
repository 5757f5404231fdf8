"""App (d): nodes that call their model without LangChain (the OpenAI SDK sync and async,
streaming and the Responses API, raw ``httpx`` and ``requests`` POSTs) and a node that fans out
``ChatOpenAI`` calls over a ``ThreadPoolExecutor``. Every call goes through biaslab's gateway,
attributed to its node, and production (a counting server on 127.0.0.1 that every client of
the app points at) sees no request through run, report, strict and counterfactual replay."""

from __future__ import annotations

import json

import pytest

from support_apps import HERE, calls, cli, effects, exposed_only_at_targets, outputs
from support_http import FakeOpenAI, loopback_only

SPEC = HERE / "direct_audit.toml"
PER_CELL = {"screener": 1, "checker": 1, "panel": 3, "clerk": 1, "summarizer": 1, "decider": 1}
CELLS = 3 * 4  # three items x (clean + three exposed nodes)


@pytest.fixture(scope="module")
def production():
    with FakeOpenAI() as server:
        yield server


@pytest.fixture(scope="module")
def audited(tmp_path_factory, production):
    root = tmp_path_factory.mktemp("direct")
    with pytest.MonkeyPatch.context() as mp:
        loopback_only(mp)
        mp.setenv("HIRING_API_BASE", production.base_url)
        mp.setenv("BIASLAB_CACHE", str(root / "cache.sqlite"))
        assert cli("run", SPEC, "--out", root / "run", "--quiet", "--no-report") == 0
        assert cli("report", root / "run", "--no-figures") == 0
        yield root
    assert production.requests == []


def test_every_client_is_routed_and_attributed_to_its_node(audited, production):
    frame = calls(audited / "run")
    assert (frame.groupby("node").size() / CELLS).to_dict() == PER_CELL
    sources = frame.groupby("node")["prompt_source"].agg(set).to_dict()
    assert sources == {"screener": {"app:openai-sdk"}, "checker": {"app:httpx"},
                       "panel": {"app:ChatOpenAI"}, "clerk": {"app:requests"},
                       "summarizer": {"app:openai-sdk"}, "decider": {"app:openai-sdk"}}
    # the Responses API's instructions and input arrive as chat turns
    summary = frame[frame["node"] == "summarizer"].iloc[0]
    assert [m["role"] for m in summary["messages"]] == ["system", "user"]
    assert summary["messages"][1]["content"].startswith("Summarise these notes:")
    # the three panelists of one cell asked in parallel threads, each its own call
    panel = frame[frame["node"] == "panel"]
    assert panel.groupby("cell_id").size().eq(3).all()
    assert exposed_only_at_targets(audited / "run")
    assert production.requests == []


def test_the_report_recovers_the_bias_at_each_exposed_node(audited):
    found = effects(audited / "run")
    for node in ("checker", "panel", "decider"):
        assert found[(f"{node}:pro_older", "decision=older")] == 1.0
        assert found[(f"{node}:pro_older", "decision=either")] == -1.0
    final = json.loads(next(iter(outputs(audited / "run").values()))[1])["final_state"]
    assert final["decision"] in ("older", "either")  # the streamed answer, joined
    assert len(final["notes"]) == 7


def test_strict_replay_sends_nothing_and_counts_every_call(audited, production, capsys):
    capsys.readouterr()
    assert cli("replay", audited / "run", "--mode", "strict", "--out", audited / "s") == 0
    out = capsys.readouterr().out
    assert "0 model calls" in out
    assert outputs(audited / "s") == outputs(audited / "run")
    replayed = calls(audited / "s")
    assert len(replayed) == sum(PER_CELL.values()) * CELLS and replayed["cache_hit"].all()
    assert production.requests == []


def test_a_fair_decider_removes_every_effect_and_only_its_calls_are_new(audited, production,
                                                                        capsys):
    out = audited / "cf"
    assert cli("replay", audited / "run", "--mode", "counterfactual", "--node", "decider",
               "--model", "scripted:direct-fair", "--out", out, "--quiet", "--no-figures") == 0
    frame = calls(out)
    assert set(frame.loc[~frame["cache_hit"], "node"]) == {"decider"}
    assert set(effects(out).values()) == {0.0}
    assert production.requests == []
