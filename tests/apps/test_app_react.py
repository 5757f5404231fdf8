"""App (b): LangGraph's prebuilt ``create_react_agent`` with two tools. Its tool calls are
recorded as the model made them, part of the cache key, and replayed exactly; over real HTTP
(an OpenAI-compatible endpoint on 127.0.0.1) the tools are sent and the tool calls read back."""

from __future__ import annotations

import json

import pytest

from biaslab.agents.providers.scripted import Reply, ScriptedRequest
from support_apps import HERE, calls, cli, effects, exposed_only_at_targets, outputs
from support_http import FakeOpenAI, Seen, loopback_only

SPEC = HERE / "react_audit.toml"


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    root = tmp_path_factory.mktemp("react")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASLAB_CACHE", str(root / "cache.sqlite"))
        assert cli("run", SPEC, "--out", root / "run", "--quiet", "--no-report") == 0
    return root


def test_the_tool_loop_is_recorded_with_its_tools_and_tool_calls(audited):
    frame = calls(audited / "run")
    assert set(frame["node"]) == {"agent"}  # the tools node never calls a model
    assert len(frame) == 3 * 4 * 2  # three model turns per item, four items, two arms
    first = frame[frame["messages"].map(len) == 2].iloc[0]
    assert [t["function"]["name"] for t in first["params"]["tools"]] == \
        ["lookup_record", "check_references"]
    assert first["parsed"]["tool_calls"][0]["name"] == "lookup_record"
    # the tool's answer is in the next request, tied to the call that asked for it
    second = frame[frame["messages"].map(len) == 4].iloc[0]
    assert second["messages"][2]["tool_calls"][0]["function"]["name"] == "lookup_record"
    assert second["messages"][3]["role"] == "tool"
    assert json.loads(second["messages"][3]["content"])["years"] > 0
    assert exposed_only_at_targets(audited / "run")


def test_the_report_recovers_the_bias_and_the_final_state_holds_the_tool_results(audited):
    assert cli("report", audited / "run", "--no-figures") == 0
    found = effects(audited / "run")
    assert found[("agent:pro_older", "outcome=older")] == 1.0
    assert found[("agent:pro_older", "outcome=either")] == -1.0
    final = json.loads(next(iter(outputs(audited / "run").values()))[1])["final_state"]
    kinds = [m["type"] for m in final["messages"]]
    assert kinds == ["human", "ai", "tool", "ai", "tool", "ai"]
    assert final["messages"][4]["content"].startswith("References for a")


def test_strict_replay_reproduces_the_tool_loop_byte_for_byte(audited, capsys):
    out = audited / "strict"
    assert cli("replay", audited / "run", "--mode", "strict", "--out", out) == 0
    assert "0 model calls" in capsys.readouterr().out
    assert outputs(out) == outputs(audited / "run")
    replayed, source = calls(out), calls(audited / "run")
    assert sorted(replayed["raw"]) == sorted(source["raw"])


def test_a_node_that_never_calls_a_model_is_one_line(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.read_text().replace('targets = "each"', 'targets = ["tools"]')
                    .replace('"react_', f'"{HERE}/react_'))
    assert cli("run", spec, "--out", tmp_path / "run", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "node 'tools' of the app never called a model" in err[0]
    assert "agent" in err[0]


class ToolServer(FakeOpenAI):
    """A FakeOpenAI whose answers come from the react agent's scripted rules, tool calls
    included, so the HTTP route runs the same loop as the scripted one."""

    def _handle(self, path, headers, body):
        import react_synthetic

        messages = body.get("messages", [])
        request = ScriptedRequest(tuple({**m, "content": m.get("content") or ""}
                                        for m in messages), body, 0)
        answer = react_synthetic._step(request)
        if isinstance(answer, Reply):
            message = {"role": "assistant", "content": answer.content or None,
                       "tool_calls": [{"id": c.id, "type": "function", "function": {
                           "name": c.name, "arguments": json.dumps(dict(c.args))}}
                           for c in answer.tool_calls]}
        else:
            message = {"role": "assistant", "content": answer}
        with self._lock:
            self.requests.append(Seen(path, headers, body))
        return 200, {}, {"id": "x", "object": "chat.completion", "created": 1,
                         "model": body.get("model"),
                         "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                         "usage": {"prompt_tokens": 10, "completion_tokens": 2,
                                   "total_tokens": 12}}, None


def test_an_openai_compatible_endpoint_gets_the_tools_and_answers_with_tool_calls(
        tmp_path, capsys, monkeypatch):
    loopback_only(monkeypatch)
    monkeypatch.syspath_prepend(str(HERE))
    with ToolServer() as server:
        spec = tmp_path / "spec.toml"
        spec.write_text(SPEC.read_text().replace('"react_', f'"{HERE}/react_').replace(
            'models = ["scripted:react-synthetic"]', 'models = ["fake"]') +
            f'\n[model_aliases.fake]\nprovider = "openai-compatible"\nmodel = "m"\n'
            f'base_url = "{server.base_url}"\n')
        assert cli("run", spec, "--out", tmp_path / "run", "--quiet", "--no-report") == 0
        assert cli("report", tmp_path / "run", "--no-figures") == 0
        sent = [r.body for r in server.requests]
    assert all(r["tools"][0]["function"]["name"] == "lookup_record" for r in sent)
    assert any(m.get("role") == "tool" for r in sent for m in r["messages"])
    assert effects(tmp_path / "run")[("agent:pro_older", "outcome=older")] == 1.0
    # answered from the run's own trace, without the endpoint
    assert cli("replay", tmp_path / "run", "--mode", "strict", "--out", tmp_path / "s") == 0
    assert outputs(tmp_path / "s") == outputs(tmp_path / "run")
