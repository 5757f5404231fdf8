"""The routing app (default ``with_structured_output``, pydantic schemas) against a real
OpenAI-compatible server: llama.cpp's HTTP server with SmolLM2 on 127.0.0.1
(`support_llama_server`). Each schema is sent as OpenAI's ``json_schema`` response format,
which llama.cpp's server turns into constrained decoding, so the app gets ``parsed`` objects
from a real model. One case, the clean arm and the decider exposed: a few short calls."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from support_apps import HERE, calls, cli, copy_app, outputs
from support_runs import _tables

pytestmark = pytest.mark.local_model


def test_the_routing_app_through_a_real_server_twice_and_replayed(llama_server, tmp_path,
                                                                  capsys):
    copy_app(tmp_path, "routing_app.py")
    first = (HERE / "routing_items.jsonl").read_text().splitlines()[0]
    (tmp_path / "items.jsonl").write_text(first + "\n")
    spec = tmp_path / "audit.toml"
    spec.write_text(
        'name = "routing-real-server"\napp = "routing_app.py:graph"\nitems = "items.jsonl"\n'
        'models = ["llama"]\n[outcome]\nfield = "decision"\n'
        '[directions.pro_older]\nfavored = "older applicants"\nother = "younger applicants"\n'
        '[conditions]\ndirections = ["pro_older"]\ntargets = ["decider"]\n'
        '[run]\nseeds = [42]\nconcurrency = 1\nretry_base_s = 0.0\nmax_attempts = 2\n'
        + llama_server.model_alias("llama", max_tokens=48, temperature=0.0))
    assert cli("run", spec, "--out", tmp_path / "A", "--quiet") == 0
    frame = calls(tmp_path / "A")
    assert frame["error"].isna().all() and {"supervisor", "decider"} <= set(frame["node"])
    assert (frame["input_tokens"] > 10).all() and (frame["output_tokens"] > 0).all()
    structured = frame[frame["node"] != "screener"]
    for call in structured.itertuples():  # the schema went out as OpenAI's json_schema...
        form = call.params["response_format"]
        assert form["type"] == "json_schema"
        assert form["json_schema"]["name"] == ("Route" if call.node == "supervisor"
                                               else "Decision")
        answer = json.loads(call.raw)  # ...and the server's answer follows it
        allowed = form["json_schema"]["schema"]["properties"]
        assert set(answer) == set(allowed)
        key = next(iter(allowed))
        assert answer[key] in allowed[key]["enum"]
    table = pd.read_csv(tmp_path / "A" / "tables" / "outputs.csv")
    assert len(table) == 2  # the app got parsed Decisions back: an outcome in both arms
    assert set(table["out.outcome.decision"]) <= {"older", "younger", "either"}

    # what the server answers to each recorded request, sent again by hand
    for call in frame.itertuples():
        body = {"messages": call.messages, "seed": call.params["seed"],
                "max_tokens": call.params["max_tokens"], "temperature": 0.0}
        if "response_format" in call.params:
            body["response_format"] = call.params["response_format"]
        status, answer = llama_server.chat(body)
        assert status == 200
        assert answer["choices"][0]["message"]["content"] == call.raw

    # a second run sends nothing and writes the same tables; a strict replay re-executes it
    capsys.readouterr()
    assert cli("run", spec, "--out", tmp_path / "B", "--quiet") == 0
    use = pd.read_csv(tmp_path / "B" / "cache_use.csv")
    assert use["model_calls"].sum() == 0 and use["calls"].sum() == len(frame)
    assert _tables(tmp_path / "B") == _tables(tmp_path / "A")
    assert cli("replay", tmp_path / "A", "--mode", "strict", "--out", tmp_path / "S") == 0
    assert "0 model calls" in capsys.readouterr().out
    assert outputs(tmp_path / "S") == outputs(tmp_path / "A")
