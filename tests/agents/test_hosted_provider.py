"""Hosted (OpenAI-compatible) models end to end, against a fake server on 127.0.0.1.

The fake server (`support_http.FakeOpenAI`) speaks just enough of the chat-completions API for
langchain-openai's ``ChatOpenAI``: it records every request and answers from a per-test script,
so a test can make it rate-limit (429 + Retry-After), fail (500), reject (400), or answer the
amplification protocol's prompts like the synthetic agent does. Nothing here touches a real
host, the user's response cache or a real API key. Network faults are in test_http_faults.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from biaslab.agents.gateway import Gateway, RetryPolicy
from biaslab.agents.providers import ModelSpec, parse_model
from biaslab.cli import main
from biaslab.errors import ModelCallError, UserError
from biaslab.experiments.plan import make_plan
from biaslab.experiments.runner import run_plan
from biaslab.experiments.spec import spec_from_dict
from biaslab.traces.cache import CallCache
from biaslab.traces.store import RunStore
from support_http import FakeOpenAI, Reply, synthetic_answer, tokens

SECRET = "sk-test-SECRET-123"
KEY_ENV = "BIASLAB_TEST_KEY"
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello."}]
PARAMS = {"temperature": 0.0, "max_tokens": 16, "seed": 42}


# -- fixtures and helpers ----------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    """Never the user's cache, never a proxy, never a real key."""
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "shared-cache" / "calls.sqlite"))
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy", "OPENAI_API_KEY", "OPENROUTER_API_KEY", "OPENAI_BASE_URL",
                 "BIASLAB_MISSING_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv(KEY_ENV, SECRET)


@pytest.fixture
def server():
    fake = FakeOpenAI()
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


def alias_table(server: FakeOpenAI, **extra) -> dict[str, Any]:
    return {"provider": "openai-compatible", "model": "fake-model", "base_url": server.base_url,
            "api_key_env": KEY_ENV, **extra}


def spec_dict(server: FakeOpenAI | None, *, models=("fake",), alias: dict | None = None,
              **run) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "hosted-test",
        "protocol": "amplification",
        "models": list(models),
        "run": {"seeds": [42], "retry_base_s": 0.01, **run},
        "conditions": {"directions": ["pro_female"], "targets": "all"},
        "options": {"datasets": ["math"], "pipelines": ["E0"], "max_test": 10,
                    "n_resamples": 200},
    }
    if alias is not None or server is not None:
        data["model_aliases"] = {"fake": alias if alias is not None else alias_table(server)}
    return data


def complete(gateway: Gateway, model: ModelSpec, messages=MESSAGES, params=PARAMS):
    return asyncio.run(gateway.complete(model, messages, params, 0, describe="test call"))


def fake_model(server: FakeOpenAI) -> ModelSpec:
    """The alias resolved the way a run resolves it: spec → plan → model axis."""
    plan = make_plan(spec_from_dict(spec_dict(server)))
    (model,) = plan.models
    return model


def shared_cache_files() -> list[Path]:
    """The cross-run cache the runner used (``$BIASLAB_CACHE`` plus its -wal/-shm)."""
    path = Path(os.environ["BIASLAB_CACHE"])
    return sorted(path.parent.glob(path.name + "*"))


def assert_no_secret_on_disk(*roots: Path) -> None:
    files = [p for root in roots for p in ([root] if root.is_file() else root.rglob("*"))
             if p.is_file()]
    assert files, f"nothing to scan under {roots}"
    for path in files:
        data = path.read_bytes()
        assert SECRET.encode() not in data, path
        assert SECRET.encode("utf-16-le") not in data, path


# -- gateway → ChatOpenAI → fake server ------------------------------------------------------
def test_alias_resolves_to_openai_compatible_spec(server):
    model = fake_model(server)
    assert model.provider == "openai-compatible"
    assert model.model == "fake-model"
    assert model.resolved_base_url() == server.base_url
    assert model.key_env() == KEY_ENV
    assert SECRET not in json.dumps(model.public())
    assert SECRET not in repr(model)


def test_gateway_call_returns_text_and_usage(server):
    server.responder = lambda messages: "Hello from the fake server."
    model = fake_model(server)
    cache = CallCache.open_file(":memory:")
    gateway = Gateway(caches=[cache], retry=RetryPolicy(base_s=0.01))
    done = complete(gateway, model)

    assert done.raw == "Hello from the fake server."
    assert not done.cache_hit and done.attempts == 1
    expected_in = sum(tokens(m["content"]) for m in MESSAGES)
    assert done.input_tokens == expected_in
    assert done.output_tokens == tokens("Hello from the fake server.")
    assert gateway.counters.model_calls == 1
    assert gateway.counters.tokens == done.input_tokens + done.output_tokens

    (seen,) = server.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    assert seen.body["model"] == "fake-model"
    assert [(m["role"], m["content"]) for m in seen.body["messages"]] == \
        [(m["role"], m["content"]) for m in MESSAGES]
    assert seen.body.get("seed") == 42
    assert seen.body.get("temperature") == 0.0
    assert 16 in (seen.body.get("max_tokens"), seen.body.get("max_completion_tokens"))
    assert not {"grammar", "json_schema"} & set(seen.body)

    # The same call again is answered from the cache, without the server.
    again = complete(gateway, model)
    assert again.cache_hit and again.raw == done.raw
    assert len(server.requests) == 1
    cache.close()


def test_429_with_retry_after_is_retried(server):
    server.queue(Reply(429, {"Retry-After": "0"}))
    gateway = Gateway(retry=RetryPolicy(base_s=0.01))
    done = complete(gateway, fake_model(server))
    assert done.raw == "Hello there."
    assert done.attempts == 2
    assert len(server.requests) == 2
    assert gateway.counters.retries == 1 and gateway.counters.errors == 0


def test_retry_after_is_honoured(server):
    server.queue(Reply(429, {"Retry-After": "0.3"}))
    gateway = Gateway(retry=RetryPolicy(base_s=0.001, max_s=0.001))
    started = time.monotonic()
    done = complete(gateway, fake_model(server))
    assert done.attempts == 2
    assert time.monotonic() - started >= 0.3
    assert len(server.requests) == 2


def test_500_is_retried(server):
    server.queue(Reply(500))
    gateway = Gateway(retry=RetryPolicy(base_s=0.01))
    done = complete(gateway, fake_model(server))
    assert done.raw == "Hello there."
    assert done.attempts == 2
    assert len(server.requests) == 2


def test_persistent_503_gives_up_after_max_attempts(server):
    server.queue(*[Reply(503)] * 3)
    gateway = Gateway(retry=RetryPolicy(max_attempts=3, base_s=0.01))
    with pytest.raises(ModelCallError) as info:
        complete(gateway, fake_model(server))
    assert info.value.status == 503 and info.value.transient
    assert "after 3 attempts" in str(info.value)
    assert len(server.requests) == 3
    assert gateway.counters.errors == 1 and gateway.counters.retries == 2


def test_400_is_not_retried(server):
    server.queue(Reply(400))
    gateway = Gateway(retry=RetryPolicy(base_s=0.01))
    with pytest.raises(ModelCallError) as info:
        complete(gateway, fake_model(server))
    assert info.value.status == 400 and not info.value.transient
    assert "after 1 attempt)" in str(info.value)
    assert len(server.requests) == 1
    assert SECRET not in str(info.value)


def test_failed_call_is_not_cached(server):
    server.queue(Reply(400))
    cache = CallCache.open_file(":memory:")
    gateway = Gateway(caches=[cache], retry=RetryPolicy(base_s=0.01))
    model = fake_model(server)

    async def twice():
        with pytest.raises(ModelCallError):
            await gateway.complete(model, MESSAGES, PARAMS, 0)
        assert len(cache) == 0
        return await gateway.complete(model, MESSAGES, PARAMS, 0)

    assert asyncio.run(twice()).raw == "Hello there."
    assert len(server.requests) == 2
    assert len(cache) == 1
    cache.close()


def test_two_runs_in_one_process_share_no_dead_connections(server):
    """Each run has its own event loop; a pooled connection from an earlier run's loop must
    not be reused (regression: the second run failed with 'Event loop is closed')."""
    model = fake_model(server)
    for seed in range(3):
        gateway = Gateway(retry=RetryPolicy(base_s=0.01))
        done = complete(gateway, model, params={**PARAMS, "seed": seed})
        assert done.raw == "Hello there." and done.attempts == 1
    assert len(server.requests) == 3


# -- secrets: a whole run through the fake server ------------------------------------------------
def _check_run_outputs(store_dir: Path) -> None:
    store = RunStore(store_dir, readonly=True)
    try:
        counts = store.counts()
        assert counts["cells_done"] == 2 and counts["cells_error"] == 0
        assert counts["parse_failures"] == 0 and counts["call_errors"] == 0
        calls = list(store.iter_calls())
        assert len(calls) == 2
        assert {c.model["provider"] for c in calls} == {"openai-compatible"}
        assert all(c.model.get("api_key_env") == KEY_ENV for c in calls)
        # The synthetic rule answered through HTTP: the favoured arm's females fail less.
        outputs = {cid: v for cid, _, node, v in store.iter_outputs(node="prediction")}
        assert len(outputs) == 2
        assert all(None not in v["p_llm"] for v in outputs.values())
        clean = [v for cid, v in outputs.items() if "/none/" in cid]
        exposed = [v for cid, v in outputs.items() if "/prediction:pro_female/" in cid]
        assert len(clean) == 1 and len(exposed) == 1
        assert sum(exposed[0]["p_llm"]) < sum(clean[0]["p_llm"])
    finally:
        store.close()


def _check_requests(server: FakeOpenAI, n: int) -> None:
    assert len(server.requests) == n
    assert {s.headers.get("authorization") for s in server.requests} == {f"Bearer {SECRET}"}
    prompts = {json.dumps(s.body["messages"], sort_keys=True) for s in server.requests}
    assert len(prompts) == 2  # the clean and the exposed prediction call (retries repeat one)
    assert sum("benefits female students over" in p for p in prompts) == 1


def test_run_plan_uses_key_but_never_writes_it(server, tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    server.responder = synthetic_answer
    server.queue(Reply(429, {"Retry-After": "0"}), Reply(500))  # retries on the way
    plan = make_plan(spec_from_dict(spec_dict(server, concurrency=2)))
    assert plan.n_cells() == 2
    run_dir = tmp_path / "run"
    result = asyncio.run(run_plan(plan, run_dir, progress=False))

    assert result.cells_run == 2 and result.cells_failed == 0, result.summary()
    assert result.counters.model_calls == 2 and result.counters.retries == 2
    _check_requests(server, 4)
    _check_run_outputs(run_dir)

    from biaslab.experiments.reports import write_reports

    written = write_reports(plan, RunStore(run_dir, readonly=True), run_dir)
    assert written
    assert (run_dir / "spec.toml").exists() and (run_dir / "run.sqlite").exists()
    spec_text = (run_dir / "spec.toml").read_text()
    assert KEY_ENV in spec_text and SECRET not in spec_text

    shared = shared_cache_files()
    assert shared, "the shared cache should live where BIASLAB_CACHE points"
    assert_no_secret_on_disk(run_dir, *shared)
    out, err = capsys.readouterr()
    assert SECRET not in out and SECRET not in err
    assert SECRET not in caplog.text
    for record in caplog.records:
        assert SECRET not in record.getMessage()


def test_cli_run_uses_key_but_never_writes_it(server, tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    server.responder = synthetic_answer
    spec_path = tmp_path / "hosted.toml"
    spec_path.write_text(tomli_w.dumps(spec_dict(server)), encoding="utf-8")
    out_dir = tmp_path / "cli-run"

    rc = main(["run", str(spec_path), "--out", str(out_dir), "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "wrote" in out
    _check_requests(server, 2)
    _check_run_outputs(out_dir)
    assert any(p.suffix == ".csv" or p.suffix == ".md" for p in out_dir.rglob("*"))
    assert_no_secret_on_disk(out_dir, *shared_cache_files())
    assert SECRET not in out and SECRET not in err
    assert SECRET not in caplog.text

    # Resuming calls nothing more and still writes no key.
    rc = main(["run", str(spec_path), "--out", str(out_dir), "--resume", "--quiet"])
    out2, err2 = capsys.readouterr()
    assert rc == 0, err2
    assert len(server.requests) == 2
    assert SECRET not in out2 + err2
    assert_no_secret_on_disk(out_dir)


def test_failed_calls_record_errors_without_the_key(server, tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    server.responder = synthetic_answer
    server.queue(Reply(400), Reply(400))
    plan = make_plan(spec_from_dict(spec_dict(server)))
    run_dir = tmp_path / "run"
    result = asyncio.run(run_plan(plan, run_dir, progress=False))
    assert result.counters.errors == 2
    assert len(server.requests) == 2  # 400 is never retried
    store = RunStore(run_dir, readonly=True)
    try:
        errors = [c.error for c in store.iter_calls() if c.error]
        assert len(errors) == 2 and all("400" in e for e in errors)
    finally:
        store.close()
    assert_no_secret_on_disk(run_dir)
    out, err = capsys.readouterr()
    assert SECRET not in out + err + caplog.text


# -- missing keys: one line, exit 2, nothing created ----------------------------------------------
def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("biaslab: error: ")
    return lines[0]


def test_missing_key_env_exits_2_before_anything(server, tmp_path, capsys):
    spec = spec_dict(server, alias=alias_table(server, api_key_env="BIASLAB_MISSING_KEY"))
    spec_path = tmp_path / "missing.toml"
    spec_path.write_text(tomli_w.dumps(spec), encoding="utf-8")
    out_dir = tmp_path / "never"

    rc = main(["run", str(spec_path), "--out", str(out_dir)])
    out, err = capsys.readouterr()
    assert rc == 2
    line = _one_error_line(err)
    assert "BIASLAB_MISSING_KEY" in line
    assert not out_dir.exists()
    assert not (out_dir / "run.sqlite").exists()
    assert server.requests == []


def test_openrouter_without_key_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    spec_path = tmp_path / "openrouter.toml"
    spec_path.write_text(tomli_w.dumps(spec_dict(None, models=["openrouter:some/model"])),
                         encoding="utf-8")
    out_dir = tmp_path / "never"

    rc = main(["run", str(spec_path), "--out", str(out_dir)])
    assert rc == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "OPENROUTER_API_KEY" in line and "openrouter:some/model" in line
    assert not out_dir.exists()

    # The same through --model, and `estimate` needs no key at all.
    rc = main(["run", str(spec_path), "--model", "openrouter:other/model", "--out", str(out_dir)])
    assert rc == 2
    assert "OPENROUTER_API_KEY" in _one_error_line(capsys.readouterr().err)
    assert not out_dir.exists()
    assert main(["estimate", str(spec_path)]) == 0
    assert "cells" in capsys.readouterr().out


def test_openrouter_key_read_from_env_at_build_time(monkeypatch):
    model = parse_model("openrouter:some/model")
    with pytest.raises(UserError, match="OPENROUTER_API_KEY"):
        model.check_ready()
    monkeypatch.setenv("OPENROUTER_API_KEY", SECRET)
    model.check_ready()
    assert model.resolved_base_url() == "https://openrouter.ai/api/v1"
    assert SECRET not in json.dumps(model.public()) and SECRET not in repr(model)
