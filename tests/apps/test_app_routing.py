"""App (d): a supervisor routing with the default ``with_structured_output(Route)`` (pydantic,
no ``method``: langchain-openai's ``json_schema``), a plain-text screener, and a decider that
builds its model with ``init_chat_model`` and answers a ``Decision`` schema. Tested at the
user's boundary: ``biaslab run``, ``report``, strict and counterfactual replay, a second run,
and the same app named through a ``langgraph.json``."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from biaslab.agents.providers.scripted import Reply, ScriptedRequest
from support_apps import HERE, calls, cli, copy_app, effects, exposed_only_at_targets, outputs
from support_http import FakeOpenAI, Seen, loopback_only
from support_runs import _tables

SPEC = HERE / "routing_audit.toml"
FILES = ("routing_app.py", "routing_synthetic.py", "routing_items.jsonl", "routing_audit.toml")


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    root = tmp_path_factory.mktemp("routing")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASLAB_CACHE", str(root / "cache.sqlite"))
        assert cli("run", SPEC, "--out", root / "run", "--quiet", "--no-report") == 0
        assert cli("report", root / "run", "--no-figures") == 0
    return root


def test_the_schema_is_recorded_as_openai_takes_it_and_keys_the_call(audited):
    frame = calls(audited / "run")
    assert (frame.groupby("node").size() / 9).to_dict() == {"supervisor": 2, "screener": 1,
                                                            "decider": 1}
    route = frame[frame["node"] == "supervisor"].iloc[0]
    form = route["params"]["response_format"]
    assert form["type"] == "json_schema" and form["json_schema"]["name"] == "Route"
    assert form["json_schema"]["strict"] is True  # the SDK's strict form of the class
    schema = form["json_schema"]["schema"]
    assert schema["properties"]["next"]["enum"] == ["screener", "decider"]
    assert schema["additionalProperties"] is False and schema["required"] == ["next"]
    assert json.loads(route["raw"]) == {"next": "screener"}
    decide = frame[frame["node"] == "decider"].iloc[0]
    assert decide["params"]["response_format"]["json_schema"]["name"] == "Decision"
    assert "response_format" not in frame[frame["node"] == "screener"].iloc[0]["params"]
    assert exposed_only_at_targets(audited / "run")


def test_the_report_recovers_the_known_bias_exactly(audited):
    found = effects(audited / "run")
    assert found == {("screener:pro_older", "decision=older"): 1.0,
                     ("screener:pro_older", "decision=either"): -1.0,
                     ("decider:pro_older", "decision=older"): 1.0,
                     ("decider:pro_older", "decision=either"): -1.0}


def test_the_discovery_pass_is_counted(audited, tmp_path, monkeypatch, capsys):
    use = pd.read_csv(audited / "run" / "cache_use.csv")
    found = use[use["condition"] == "discovery"].set_index("node")
    # item r1, clean: two routing calls, one note, one decision; all paid
    assert found["calls"].to_dict() == {"supervisor": 2, "screener": 1, "decider": 1}
    assert found["model_calls"].sum() == 4
    grid = use[use["condition"] != "discovery"]
    assert grid["calls"].sum() == 36 and grid["model_calls"].sum() == 20  # r1 clean: cached
    assert "the discovery pass ran the first item clean: 4 calls, 4 of them paid" in \
        (audited / "run" / "report.html").read_text()
    # the CLI's summary counts every call that reached the model: 20 + 4
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "cache.sqlite"))
    capsys.readouterr()
    assert cli("run", SPEC, "--out", tmp_path / "A", "--no-figures") == 0
    said = capsys.readouterr()
    assert "\n  24 model calls, 16 cache hits" in said.out + said.err
    # the same spec again: nothing is paid, not even the discovery pass; the same tables
    assert cli("run", SPEC, "--out", tmp_path / "B", "--no-figures") == 0
    said = capsys.readouterr()
    assert "\n  0 model calls, 36 cache hits" in said.out + said.err
    use_b = pd.read_csv(tmp_path / "B" / "cache_use.csv")
    assert use_b["model_calls"].sum() == 0 and "discovery" not in set(use_b["condition"])
    assert _tables(tmp_path / "B") == _tables(tmp_path / "A") == _tables(audited / "run")


def test_strict_replay_makes_no_call_and_reproduces_every_output(audited, capsys):
    capsys.readouterr()
    assert cli("replay", audited / "run", "--mode", "strict", "--out", audited / "s") == 0
    assert "0 model calls" in capsys.readouterr().out
    assert outputs(audited / "s") == outputs(audited / "run")


def test_counterfactual_mitigation_at_the_decider(audited, capsys):
    out = audited / "cf"
    assert cli("replay", audited / "run", "--mode", "counterfactual", "--node", "decider",
               "--model", "scripted:routing-fair", "--out", out, "--quiet", "--no-figures") == 0
    frame = calls(out)
    assert set(frame.loc[~frame["cache_hit"], "node"]) == {"decider"}
    assert effects(out) == {("decider:pro_older", "decision=either"): 0.0,
                            ("screener:pro_older", "decision=either"): 0.0}


def test_the_app_named_through_langgraph_json(tmp_path, monkeypatch):
    (tmp_path / "project").mkdir()
    app = copy_app(tmp_path / "project", *FILES[:3])
    secret = "sk-env-file-secret-0123456789"
    (app / ".env").write_text(f'ROUTING_APP_KEY="{secret}"\n')
    (app / "langgraph.json").write_text(json.dumps({
        "dependencies": ["."], "graphs": {"committee": "./routing_app.py:graph"},
        "env": ".env"}))
    spec = tmp_path / "audit.toml"  # a spec elsewhere: paths relative to it and to the json
    spec.write_text(SPEC.read_text().replace('app = "routing_app.py:graph"',
                                             'app = "project/langgraph.json:committee"')
                    .replace('"routing_items.jsonl"', '"project/routing_items.jsonl"')
                    .replace('"routing_synthetic.py"', '"project/routing_synthetic.py"'))
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.setenv("ROUTING_APP_KEY", "")  # (so that the test leaves it unset)
    monkeypatch.delenv("ROUTING_APP_KEY")
    assert cli("run", spec, "--out", tmp_path / "run", "--quiet") == 0
    assert os.environ["ROUTING_APP_KEY"] == secret  # loaded for the app, as `langgraph dev` does
    assert effects(tmp_path / "run")[("decider:pro_older", "decision=older")] == 1.0
    for path in (tmp_path / "run").rglob("*"):  # the env file's value is recorded nowhere
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert secret.encode() not in (tmp_path / "app_nodes.json").read_bytes()


def test_a_langgraph_json_without_that_graph_is_one_line(tmp_path, capsys):
    copy_app(tmp_path, *FILES)
    (tmp_path / "langgraph.json").write_text(json.dumps({"graphs": {"a": "./routing_app.py:graph"}}))
    spec = tmp_path / "routing_audit.toml"
    spec.write_text(spec.read_text().replace("routing_app.py:graph", "langgraph.json:b"))
    capsys.readouterr()
    assert cli("run", spec, "--out", tmp_path / "run", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["biaslab: error: app: langgraph.json has no graph 'b' (its graphs: a)"] \
        or (len(err) == 1 and "has no graph 'b' (its graphs: a)" in err[0])


class SchemaServer(FakeOpenAI):
    """A FakeOpenAI that answers with the routing app's scripted rules: the JSON a model
    following the request's schema writes, or OpenAI's refusal shape (``content`` null,
    ``refusal`` set) where the rules refuse."""

    def _handle(self, path, headers, body):
        import routing_synthetic

        request = ScriptedRequest(tuple({**m, "content": m.get("content") or ""}
                                        for m in body.get("messages", [])), body, 0)
        text = request.text
        answer = (routing_synthetic._route if "Who works next" in text else
                  routing_synthetic._decide if "Final decision" in text else
                  routing_synthetic._screen)(request)
        if isinstance(answer, Reply):
            message = {"role": "assistant", "content": None, "refusal": answer.refusal}
        else:
            message = {"role": "assistant", "refusal": None,
                       "content": answer if isinstance(answer, str) else
                       answer.model_dump_json()}
        with self._lock:
            self.requests.append(Seen(path, headers, body))
        return 200, {}, {"id": "x", "object": "chat.completion", "created": 1,
                         "model": body.get("model"),
                         "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                         "usage": {"prompt_tokens": 10, "completion_tokens": 2,
                                   "total_tokens": 12}}, None


def test_over_http_the_endpoint_gets_openais_json_schema_and_a_refusal_stays_one(
        tmp_path, monkeypatch, capsys):
    loopback_only(monkeypatch)
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "cache.sqlite"))
    with SchemaServer() as server:
        spec = tmp_path / "spec.toml"
        spec.write_text(SPEC.read_text().replace('"routing_', f'"{HERE}/routing_').replace(
            'models = ["scripted:routing-synthetic"]', 'models = ["fake"]') +
            f'\n[model_aliases.fake]\nprovider = "openai-compatible"\nmodel = "m"\n'
            f'base_url = "{server.base_url}"\n')
        assert cli("run", spec, "--out", tmp_path / "run", "--quiet", "--no-figures") == 0
        sent = [r.body for r in server.requests]
        routes = [r["response_format"] for r in sent if "Who works next" in str(r["messages"])]
        assert routes and all(f["type"] == "json_schema" and f["json_schema"]["name"] == "Route"
                              and f["json_schema"]["strict"] is True for f in routes)
        assert effects(tmp_path / "run")[("decider:pro_older", "decision=older")] == 1.0

        # a refusal comes back as a refusal: recorded, cached, and raised to the app
        items = tmp_path / "refuse.jsonl"
        items.write_text('{"id": "z", "case": "Please refuse this case."}\n')
        spec.write_text(spec.read_text().replace(f'"{HERE}/routing_items.jsonl"',
                                                 f'"{items}"'))
        capsys.readouterr()
        assert cli("run", spec, "--out", tmp_path / "refused", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "OpenAIRefusalError" in err[0], err  # the app's parser raised it
    assert "I can't decide that." in err[0]
