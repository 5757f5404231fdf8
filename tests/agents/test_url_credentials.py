"""Credentials over real HTTP: URL credentials come back from the environment on resume and
replay (or the run stops naming the variable), ``…/v1?key=KEY`` reaches the right path, user
info and ``api_key_env`` have one defined winner, and no error text keeps a credential, even
one the endpoint echoes.

Every run goes through ``biaslab`` against a `support_http.FakeOpenAI` on 127.0.0.1 that
answers 401 unless it gets the credential it expects, echoing the Authorization header and
the query string back, as some gateways do.
"""

from __future__ import annotations

import base64
import tomllib
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import pytest
import tomli_w

from biaslab.cli import main
from biaslab.traces.store import RunStore
from support_http import FakeOpenAI, loopback_only, synthetic_answer

KEY = "sk-bearer-9f8e7d6c5b4a"
USER, PASSWORD = "alice", "pw-3c2b1a0f9e8d"
BASIC = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
TOKEN = "tok-5e4d3c2b1a09"
SECRETS = (KEY, PASSWORD, BASIC, TOKEN)


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    loopback_only(monkeypatch)
    for name in ("VLLM_API_KEY", "VLLM_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


class Guarded(FakeOpenAI):
    """Answers only requests that carry `accept` (``Authorization`` value or a query item);
    anything else gets a 401 whose message echoes what it was sent. `paths` keeps every
    request's full path, query included."""

    def __init__(self, accept: set[str], **kwargs):
        super().__init__(**kwargs)
        self.accept = accept
        self.paths: list[str] = []
        self.responder = synthetic_answer

    def _handle(self, path, headers, body):
        self.paths.append(path)
        query = urlsplit(path).query
        sent = {headers.get("authorization", "")} | {f"{k}={v[0]}" for k, v in
                                                       parse_qs(query).items()}
        status, out_headers, payload, fault = super()._handle(urlsplit(path).path, headers, body)
        if not sent & self.accept:
            return 401, {}, {"error": {
                "message": f"Incorrect API key provided: {headers.get('authorization')} "
                           f"(query: {query}; url: {path})", "type": "invalid_request_error",
                "code": "invalid_api_key"}}, None
        return status, out_headers, payload, fault


def model(base_url: str, **extra) -> dict:
    """An endpoint's model table. Aliases that share an endpoint need a model name each: the
    cache key holds no credential, so one question to one model is one call."""
    return {"provider": "openai-compatible", "model": "m", "base_url": base_url, **extra}


def spec_file(tmp_path: Path, models: dict[str, dict], name: str = "spec.toml") -> Path:
    spec = {"name": "creds", "protocol": "amplification", "models": list(models),
            "model_aliases": models,
            "run": {"seeds": [42], "concurrency": 4, "max_attempts": 1, "retry_base_s": 0.0},
            "conditions": {"directions": ["pro_female"], "targets": "all"},
            "options": {"datasets": ["math"], "pipelines": ["E0"], "max_test": 10,
                        "batch_size": 5, "n_resamples": 100}}
    path = tmp_path / name
    path.write_text(tomli_w.dumps(spec), encoding="utf-8")
    return path


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if "cells →" not in line]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("biaslab: error: "), err
    return lines[0]


def with_userinfo(base_url: str) -> str:
    return base_url.replace("http://", f"http://{USER}:{PASSWORD}@")


def no_secret_in(*texts_or_dirs) -> None:
    for item in texts_or_dirs:
        if isinstance(item, Path):
            for path in item.rglob("*"):
                if path.is_file():
                    data = path.read_bytes()
                    for secret in SECRETS:
                        assert secret.encode() not in data, (path, secret)
                        assert quote(secret, safe="").encode() not in data, (path, secret)
        else:
            for secret in SECRETS:
                assert secret not in item, secret


def cells(out: Path):
    store = RunStore(out, readonly=True)
    try:
        return store.cells(), store.calls()
    finally:
        store.close()


# -- URL credentials on resume and replay --------------------------------------------------------
def test_a_resumed_run_reads_url_credentials_from_the_environment_or_stops(
        tmp_path, capsys, monkeypatch):
    with Guarded({f"Basic {BASIC}"}) as server:
        server.down = True  # the first run's calls all fail: its cells wait for a resume
        spec = spec_file(tmp_path, {"studio": model(with_userinfo(server.base_url))})
        out = tmp_path / "run"
        code, _, err = cli(capsys, "run", spec, "--out", out, "--quiet", "--no-report")
        assert code == 1, err
        server.down = False
        recorded = tomllib.loads((out / "spec.toml").read_text())["resolved_models"]["studio"]
        assert recorded["base_url"] == server.base_url
        assert recorded["url_env"] == "BIASLAB_URL_STUDIO"

        # No variable: one line naming it, before any call.
        code, _, err = cli(capsys, "run", "--resume", out, "--quiet")
        line = one_line_error(code, err)
        assert "BIASLAB_URL_STUDIO" in line and "studio" in line
        code, _, err = cli(capsys, "replay", out, "--mode", "counterfactual", "--directions",
                           "pro_male", "--out", tmp_path / "cf", "--quiet")
        assert "BIASLAB_URL_STUDIO" in one_line_error(code, err)
        assert not server.requests and not (tmp_path / "cf").exists()

        # A variable for another endpoint is refused too.
        monkeypatch.setenv("BIASLAB_URL_STUDIO", "http://alice:pw@127.0.0.1:1/v1")
        code, _, err = cli(capsys, "run", "--resume", out, "--quiet")
        assert "BIASLAB_URL_STUDIO points at http://127.0.0.1:1/v1" in one_line_error(code, err)
        assert not server.requests

        monkeypatch.setenv("BIASLAB_URL_STUDIO", with_userinfo(server.base_url))
        code, _, err = cli(capsys, "run", "--resume", out, "--quiet", "--no-report")
        assert code == 0, err
        code, _, err = cli(capsys, "replay", out, "--mode", "counterfactual", "--directions",
                           "pro_male", "--out", tmp_path / "cf", "--quiet")
        assert code == 0, err
        assert len(server.requests) > 4  # the resume's 4 calls and the counterfactual's new ones
        assert {s.headers["authorization"] for s in server.requests} == {f"Basic {BASIC}"}
    resumed, _ = cells(out)
    assert set(resumed["status"]) == {"done"}
    no_secret_in(out, tmp_path / "cf", err)


def test_url_env_supplies_the_credentials_from_the_first_run(tmp_path, capsys, monkeypatch):
    with Guarded({f"token={TOKEN}"}) as server:
        monkeypatch.setenv("STUDIO_URL", f"{server.base_url}?token={TOKEN}")
        spec = spec_file(tmp_path, {"studio": model(server.base_url, url_env="STUDIO_URL")})
        out = tmp_path / "run"
        code, _, err = cli(capsys, "run", spec, "--out", out, "--quiet", "--no-report")
        assert code == 0, err
        monkeypatch.delenv("STUDIO_URL")
        code, _, err = cli(capsys, "run", "--resume", out, "--quiet")
        assert "STUDIO_URL" in one_line_error(code, err)
    assert len(server.requests) == 4
    no_secret_in(out, tmp_path / spec.name)


def test_credentials_from_a_providers_url_variable_are_needed_there_again(
        tmp_path, capsys, monkeypatch):
    """vllm's endpoint from VLLM_BASE_URL, with user info: the run records that variable as
    the one to set, and a resume without it stops naming it."""
    with Guarded({f"Basic {BASIC}"}) as server:
        monkeypatch.setenv("VLLM_BASE_URL", with_userinfo(server.base_url))
        spec = spec_file(tmp_path, {"v": {"provider": "vllm", "model": "m"}})
        out = tmp_path / "run"
        server.down = True
        code, _, err = cli(capsys, "run", spec, "--out", out, "--quiet", "--no-report")
        assert code == 1, err
        server.down = False
        recorded = tomllib.loads((out / "spec.toml").read_text())["resolved_models"]["v"]
        assert (recorded["base_url"], recorded["url_env"]) == (server.base_url, "VLLM_BASE_URL")
        monkeypatch.delenv("VLLM_BASE_URL")
        code, _, err = cli(capsys, "run", "--resume", out, "--quiet")
        assert "set VLLM_BASE_URL" in one_line_error(code, err)
        monkeypatch.setenv("VLLM_BASE_URL", with_userinfo(server.base_url))
        code, _, err = cli(capsys, "run", "--resume", out, "--quiet", "--no-report")
        assert code == 0, err
    assert len(server.requests) == 4
    assert {s.headers["authorization"] for s in server.requests} == {f"Basic {BASIC}"}
    no_secret_in(out)


# -- the ?key= form ------------------------------------------------------------------------------
def test_a_query_credential_reaches_chat_completions_with_its_query(tmp_path, capsys):
    with Guarded({f"key={TOKEN}"}) as server:
        url = f"{server.base_url}?key={TOKEN}&api-version=2024-06-01"
        out = tmp_path / "run"
        code, _, err = cli(capsys, "run", spec_file(tmp_path, {"q": model(url)}), "--out", out,
                           "--quiet", "--no-report")
        assert code == 0, err
    assert len(server.paths) == 4
    for path in server.paths:
        parts = urlsplit(path)
        assert parts.path == "/v1/chat/completions"
        assert parse_qs(parts.query) == {"key": [TOKEN], "api-version": ["2024-06-01"]}
    recorded = tomllib.loads((out / "spec.toml").read_text())["resolved_models"]["q"]
    assert recorded["base_url"] == f"{server.base_url}?api-version=2024-06-01"
    assert recorded["url_env"] == "BIASLAB_URL_Q"
    no_secret_in(out, err)


# -- user info and api_key_env ------------------------------------------------------------------
def test_user_info_with_an_api_key_env_is_refused_before_any_call(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setenv("STUDIO_KEY", KEY)
    with Guarded({f"Basic {BASIC}"}) as server:
        spec = spec_file(tmp_path, {"studio": model(with_userinfo(server.base_url),
                                                    api_key_env="STUDIO_KEY")})
        code, _, err = cli(capsys, "run", spec, "--out", tmp_path / "run", "--quiet")
        line = one_line_error(code, err)
        assert "user info" in line and "STUDIO_KEY" in line
        assert not server.requests and not (tmp_path / "run").exists()
    no_secret_in(err)


def test_user_info_wins_over_a_providers_default_key(tmp_path, capsys, monkeypatch):
    """vllm reads VLLM_API_KEY when it is set; a URL with user info sends Basic auth instead,
    and the key is sent nowhere."""
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    with Guarded({f"Basic {BASIC}"}) as server:
        spec = spec_file(tmp_path, {"v": {"provider": "vllm", "model": "m",
                                          "base_url": with_userinfo(server.base_url)}})
        out = tmp_path / "run"
        code, _, err = cli(capsys, "run", spec, "--out", out, "--quiet", "--no-report")
        assert code == 0, err
    assert {s.headers["authorization"] for s in server.requests} == {f"Basic {BASIC}"}
    assert not any(KEY in str(s.headers) or KEY in path
                   for s, path in zip(server.requests, server.paths))


# -- echoed credentials -------------------------------------------------------------------------
def test_credentials_an_endpoint_echoes_are_scrubbed_from_every_error(tmp_path, capsys,
                                                                      monkeypatch):
    """A Bearer key, Basic user info and a ?token= query, each refused with a 401 that echoes
    it: the cells fail with the 401 named, and no form of any secret is stored or printed."""
    monkeypatch.setenv("STUDIO_KEY", KEY)
    with Guarded(set()) as server:  # refuses everything
        spec = spec_file(tmp_path, {
            "bearer": model(server.base_url, api_key_env="STUDIO_KEY", model="m1"),
            "basic": model(with_userinfo(server.base_url), model="m2"),
            "query": model(f"{server.base_url}?token={TOKEN}", model="m3")})
        out = tmp_path / "run"
        code, stdout, err = cli(capsys, "run", spec, "--out", out, "--quiet")
        assert code == 1, err
        seen = {s.headers.get("authorization") for s in server.requests}
        assert {f"Bearer {KEY}", f"Basic {BASIC}"} <= seen  # the secrets were really sent
        assert any(TOKEN in path for path in server.paths)
        code, more_out, more_err = cli(capsys, "run", "--resume", out, "--quiet")
    failed, calls = cells(out)
    assert set(failed["status"]) == {"error"} and len(failed) == 6
    assert failed["error"].str.contains("HTTP 401").all()
    assert failed["error"].str.contains("Incorrect API key provided: ").all()
    assert calls["error"].str.contains(r"\*\*\*").all()
    assert "failed:" in err and "HTTP 401" in err
    no_secret_in(out, stdout, err, more_out, more_err)


def test_redact_worked_example(monkeypatch):
    """Each form, by hand: the key and the URL's secrets by value (raw, base64 and
    percent-encoded), and the generic shapes whatever their value."""
    from biaslab.agents.providers import ModelSpec
    from biaslab.agents.redaction import redact, secrets_of

    monkeypatch.setenv("STUDIO_KEY", "sk-abcdef")
    specs = [ModelSpec(provider="openai-compatible", model="m", api_key_env="STUDIO_KEY",
                       base_url="http://h/v1?token=t%2Fsecret&api-version=2"),
             ModelSpec(provider="openai-compatible", model="m",
                       base_url="http://bob:pa%24s@h/v1")]
    secrets = secrets_of(specs)
    # bob:pa$s in base64 is Ym9iOnBhJHM=; "bob" is too short to match by value
    assert {"sk-abcdef", "t/secret", "t%2Fsecret", "pa$s", "pa%24s", "Ym9iOnBhJHM="} <= \
        set(secrets) and "bob" not in secrets
    text = ("401: key sk-abcdef, auth Ym9iOnBhJHM= from http://bob:pa%24s@h/v1?"
            "token=t%2Fsecret&api-version=2; also Bearer other-token-123, Basic b3RoZXI6eHl6 "
            "and http://carol:hunter22@x/v1?access_token=zzz9&page=2")
    assert redact(text, secrets) == (
        "401: key ***, auth *** from http://***@h/v1?token=***&api-version=2; also "
        "Bearer ***, Basic *** and http://***@x/v1?access_token=***&page=2")
