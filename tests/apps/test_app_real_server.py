"""An unmodified app audited against a real OpenAI-compatible server: the hiring app of
experiments/examples/app_audit, its own ChatOpenAI pointed at a dead port, every call routed
through biaslab's `openai-compatible` provider to llama.cpp's HTTP server with SmolLM2 on
127.0.0.1 (`support_llama_server`). Tokens, seeds and answers are the server's.

One case, the clean arm and the chair exposed: six calls of a few tokens, so the test stays
short on a busy machine. A 135M model is no credible chair; what is checked is the machinery:
every call reaches the server and comes back recorded, and neither a second run nor a strict
replay sends anything."""

from __future__ import annotations

import pandas as pd
import pytest

from support_apps import EXAMPLE, calls, cli, copy_app, outputs
from support_runs import _tables

pytestmark = pytest.mark.local_model


def _spec(tmp_path, server) -> str:
    copy_app(tmp_path, "hiring_app.py", source=EXAMPLE)
    first_case = (EXAMPLE / "cases.jsonl").read_text().splitlines()[0]
    (tmp_path / "cases.jsonl").write_text(first_case + "\n")
    spec = tmp_path / "audit.toml"
    spec.write_text(
        'name = "hiring-app-real-server"\napp = "hiring_app.py:graph"\nitems = "cases.jsonl"\n'
        'models = ["llama"]\n'
        '[outcome]\nfield = "decision"\ngroup = "applicant_gender"\n'
        '[directions.pro_older]\nfavored = "older applicants"\nother = "younger applicants"\n'
        '[conditions]\ndirections = ["pro_older"]\ntargets = ["chair"]\n'
        '[run]\nseeds = [42]\nconcurrency = 1\nretry_base_s = 0.0\nmax_attempts = 2\n'
        + server.model_alias("llama", max_tokens=8, temperature=0.0))
    return str(spec)


def test_an_unmodified_app_through_a_real_server_twice_and_replayed(llama_server, tmp_path,
                                                                   capsys):
    spec = _spec(tmp_path, llama_server)
    assert cli("run", spec, "--out", tmp_path / "A", "--quiet") == 0
    frame = calls(tmp_path / "A")
    # the discovery pass's calls answer the clean cell, so the run records 2 arms x 3 nodes
    assert set(frame["node"]) == {"reviewer_a", "reviewer_b", "chair"}
    assert len(frame) == 6 and frame["error"].isna().all()
    assert (frame["input_tokens"] > 10).all() and (frame["output_tokens"] > 0).all()
    assert frame["raw"].map(lambda r: isinstance(r, str) and r.strip() != "").all()
    # the exposure reached the chair's system turn in the exposed arm, and no other call
    exposed = frame[frame["exposed"]]
    assert list(exposed["node"]) == ["chair"]
    assert "older applicants" in exposed.iloc[0]["messages"][0]["content"]

    # what the server answers to each recorded request, sent again by hand with its seed
    for call in frame.itertuples():
        status, body = llama_server.chat({"messages": call.messages,
                                          "seed": call.params["seed"],
                                          "max_tokens": call.params["max_tokens"],
                                          "temperature": 0.0})
        assert status == 200
        assert body["choices"][0]["message"]["content"] == call.raw
        assert body["usage"]["completion_tokens"] == call.output_tokens

    # a second run into a new directory: no request reaches the server, the same tables
    capsys.readouterr()
    assert cli("run", spec, "--out", tmp_path / "B", "--quiet") == 0
    use = pd.read_csv(tmp_path / "B" / "cache_use.csv")
    assert use["calls"].sum() == len(frame) and use["model_calls"].sum() == 0
    assert _tables(tmp_path / "B") == _tables(tmp_path / "A")

    # a strict replay re-executes the app from the trace, byte for byte, with no model call
    assert cli("replay", tmp_path / "A", "--mode", "strict", "--out", tmp_path / "S") == 0
    assert "0 model calls" in capsys.readouterr().out
    assert outputs(tmp_path / "S") == outputs(tmp_path / "A")
