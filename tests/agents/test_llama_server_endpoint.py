"""A protocol end to end through the `openai-compatible` provider against a real server:
llama.cpp's own HTTP server with SmolLM2 on 127.0.0.1 (`support_llama_server`), not a fake.
Its tokens, seeds and refusals are the server's; biaslab must record them as they came.

The protocol is roleplay at its smallest (one yes/no question, clean and exposed: two calls of
about a hundred tokens), so the test stays short on a busy machine."""

from __future__ import annotations

import pandas as pd
import pytest

from biaslab.cli import main
from biaslab.traces.store import RunStore
from support_runs import _tables

pytestmark = pytest.mark.local_model

WRONG_KEY_ENV = "BIASLAB_TEST_LLAMA_WRONG_KEY"


def _spec(tmp_path, server, key_env=None) -> str:
    """One BiasLens yes/no question with its role, clean and under the stereotype exposure."""
    path = tmp_path / "spec.toml"
    path.write_text(
        'name = "llama-server"\nprotocol = "roleplay"\nmodels = ["llama"]\n'
        '[run]\nseeds = [42]\nconcurrency = 1\nretry_base_s = 0.0\nmax_attempts = 2\n'
        '[conditions]\ndirections = ["stereotype"]\ntargets = ["target"]\n'
        '[options]\nattributes = ["age"]\ntypes = ["yes_no"]\nper_stratum = 1\nrepeats = 1\n'
        'conditions = ["role"]\nclassify_bias_types = false\nshort_max_tokens = 4\n'
        + server.model_alias("llama", **({"api_key_env": key_env} if key_env else {})))
    return str(path)


def test_a_protocol_through_a_real_openai_compatible_server_twice(llama_server, tmp_path,
                                                                  capsys):
    spec = _spec(tmp_path, llama_server)
    assert main(["run", spec, "--out", str(tmp_path / "A"), "--quiet"]) == 0
    store = RunStore(tmp_path / "A", readonly=True)
    cells, calls = store.cells(), store.calls()
    store.close()
    assert len(cells) == 2 and set(cells["status"]) == {"done"}  # clean and exposed
    assert len(calls) >= 2 and calls["error"].isna().all()
    # What the server said: its token counts (the exposed prompt is the longer one) and its
    # answer text, parsed or a recorded parse failure (never imputed).
    assert (calls["input_tokens"] > 20).all() and (calls["output_tokens"] > 0).all()
    by_exposure = calls.groupby("exposed")["input_tokens"].max()
    assert by_exposure[True] > by_exposure[False]
    assert calls["raw"].map(lambda r: isinstance(r, str) and r.strip() != "").all()
    for parsed, error in zip(calls["parsed"], calls["parse_error"]):
        assert (error is None and parsed in ("yes", "no")) or (parsed is None and error)
    assert calls["params"].map(lambda p: isinstance(p.get("seed"), int)).all()

    # The seed is the server's: each recorded request, sent again by hand with its seed, gets
    # the same text and the same token counts biaslab recorded.
    for call in calls.itertuples():
        status, body = llama_server.chat({"messages": call.messages,
                                          "seed": call.params["seed"],
                                          "max_tokens": call.params["max_tokens"]})
        assert status == 200
        assert body["choices"][0]["message"]["content"] == call.raw
        assert body["usage"]["prompt_tokens"] == call.input_tokens
        assert body["usage"]["completion_tokens"] == call.output_tokens

    answers = pd.read_csv(tmp_path / "A" / "tables" / "answers.csv")
    assert len(answers) == 2 and (answers["n_biased"] + answers["n_unbiased"]
                                  + answers["n_parse_failures"] + answers["n_unscored"] == 1).all()

    # Again, into a new directory: answered from the cache, not the server; the same tables.
    capsys.readouterr()
    assert main(["run", spec, "--out", str(tmp_path / "B"), "--quiet"]) == 0
    use = pd.read_csv(tmp_path / "B" / "cache_use.csv")
    assert use["calls"].sum() == len(calls) and use["model_calls"].sum() == 0
    tables = _tables(tmp_path / "A")
    assert "tables/answers.csv" in tables and _tables(tmp_path / "B") == tables


def test_a_request_the_server_refuses_fails_its_cell_in_one_line(llama_server, tmp_path,
                                                                 monkeypatch, capsys):
    wrong = "not-the-key-" + llama_server.api_key[::-1]
    monkeypatch.setenv(WRONG_KEY_ENV, wrong)
    spec = _spec(tmp_path, llama_server, key_env=WRONG_KEY_ENV)
    capsys.readouterr()
    code = main(["run", spec, "--out", str(tmp_path / "run"), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 1
    store = RunStore(tmp_path / "run", readonly=True)
    cells, calls = store.cells(), store.calls()
    store.close()
    assert set(cells["status"]) == {"error"}
    # llama.cpp's own refusal, "Invalid API Key" with HTTP 401, is not retried (a 4xx other
    # than 408/409/425/429), and is named in the cell's error.
    for error in cells["error"]:
        assert "401" in error and "Invalid API Key" in error
    assert calls.empty or calls["raw"].isna().all()
    assert "401" in out + err
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert wrong.encode() not in path.read_bytes(), path
