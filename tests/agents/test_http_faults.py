"""Model calls that survive real network faults, over real HTTP.

Every test here goes through the provider's real client (``ChatOpenAI`` via the
``openai-compatible`` provider) to `support_http.FakeOpenAI` on 127.0.0.1, which resets
connections, truncates bodies, answers empty, rate-limits, fails with 5xx and answers slowly.
Retries use tiny backoffs, so the whole file runs in well under a minute.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import sqlite3
import time
from collections import Counter
from email.utils import formatdate
from pathlib import Path
from typing import Any

import openai
import pytest

try:  # the HTTP library the installed openai SDK uses (recent SDKs use the httpx2 fork)
    import httpx2 as http_lib
except ImportError:  # pragma: no cover - older SDKs
    import httpx as http_lib
import tomli_w

from biaslab.agents.gateway import CallFailure, Gateway, RetryPolicy, classify_error
from biaslab.agents.providers import ModelSpec
from biaslab.cli import main
from biaslab.traces.cache import CachedResponse, CallCache
from biaslab.traces.store import RunStore
from support_http import FAULTS, FakeOpenAI, Reply, synthetic_answer

KEY_ENV = "BIASLAB_TEST_KEY"
MESSAGES = [{"role": "user", "content": "Say hello."}]
PARAMS = {"temperature": 0.0, "max_tokens": 16, "seed": 42}
FAST = RetryPolicy(max_attempts=5, base_s=0.005, max_s=0.05)


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    """Never the user's cache, never a proxy, never a real key."""
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "shared-cache" / "calls.sqlite"))
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv(KEY_ENV, "sk-test-fault-key")


@pytest.fixture
def server():
    with FakeOpenAI() as fake:
        yield fake


def model_at(base_url: str, **extra) -> ModelSpec:
    return ModelSpec(provider="openai-compatible", model="fake-model", base_url=base_url,
                     api_key_env=KEY_ENV, alias="fake", **extra)


def call(gateway: Gateway, model: ModelSpec, messages=MESSAGES, sample: int = 0):
    return asyncio.run(gateway.complete(model, messages, PARAMS, sample, describe="the test call"))


# -- one fault kind at a time --------------------------------------------------------------------
def test_connection_reset_is_retried_and_each_attempt_recorded(server):
    server.queue(Reply(fault="reset"), Reply(fault="reset"))
    gateway = Gateway(retry=FAST)
    done = call(gateway, model_at(server.base_url))
    assert done.raw == "Hello there." and done.attempts == 3
    assert len(server.requests) == 3
    assert len(done.attempt_errors) == 2
    assert all("APIConnectionError" in e or "ConnectionError" in e for e in done.attempt_errors)
    assert done.attempt_errors[0].startswith("attempt 1: ")
    assert gateway.counters.retries == 2 and gateway.counters.errors == 0


def test_refused_connection_is_retried_then_fails_naming_the_call():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gateway = Gateway(retry=RetryPolicy(max_attempts=3, base_s=0.001))
    with pytest.raises(CallFailure) as info:
        # (user info without api_key_env: naming both is refused, see test_url_credentials)
        call(gateway, ModelSpec(provider="openai-compatible", model="fake-model", alias="fake",
                                base_url=f"http://user:url-secret@127.0.0.1:{port}/v1"))
    failure = info.value
    assert "url-secret" not in str(failure) + "".join(failure.attempt_errors)
    assert failure.transient and failure.attempts == 3 and len(failure.attempt_errors) == 3
    assert str(failure).startswith("the test call: ")
    assert "after 3 attempts" in str(failure)
    assert gateway.counters.retries == 2 and gateway.counters.errors == 1


@pytest.mark.parametrize("fault", ["truncated", "cut_json"])
def test_truncated_body_is_retried(server, fault):
    """A body cut short, whether the connection drops (Content-Length not reached) or the
    message is complete but its JSON is not: both are transient, never a bare JSONDecodeError."""
    server.queue(Reply(fault=fault))
    done = call(Gateway(retry=FAST), model_at(server.base_url))
    assert done.raw == "Hello there." and done.attempts == 2
    (error,) = done.attempt_errors
    assert ("JSONDecodeError" in error) if fault == "cut_json" else ("RemoteProtocolError" in error)


def test_truncated_body_that_persists_fails_naming_the_call(server):
    server.queue(*[Reply(fault="cut_json")] * 2)
    gateway = Gateway(retry=RetryPolicy(max_attempts=2, base_s=0.001))
    with pytest.raises(CallFailure, match=r"^the test call: JSONDecodeError: .*after 2 attempts"):
        call(gateway, model_at(server.base_url))


def test_empty_answer_is_retried_and_never_cached(server, tmp_path):
    run_cache = CallCache.open_file(tmp_path / "run.sqlite")
    shared = CallCache.open_file(tmp_path / "shared.sqlite")
    gateway = Gateway(caches=[run_cache, shared], retry=RetryPolicy(max_attempts=3, base_s=0.001))
    model = model_at(server.base_url)

    server.queue(*[Reply(fault="empty")] * 3)  # empty on every attempt: given back, uncached

    async def twice():
        done = await gateway.complete(model, MESSAGES, PARAMS, 0)
        assert done.raw == "" and done.attempts == 3 and len(done.attempt_errors) == 2
        assert len(run_cache) == 0 and len(shared) == 0
        return await gateway.complete(model, MESSAGES, PARAMS, 0)

    again = asyncio.run(twice())  # asked again, not replayed from a cache
    assert again.raw == "Hello there." and not again.cache_hit
    assert len(server.requests) == 4
    assert len(run_cache) == 1 and len(shared) == 1
    run_cache.close()
    shared.close()


def test_blank_cache_entries_from_older_runs_are_ignored_and_replaced(server, tmp_path):
    cache = CallCache.open_file(tmp_path / "old.sqlite")
    model = model_at(server.base_url)
    first = call(Gateway(caches=[cache], retry=FAST), model)
    cache.conn.execute("UPDATE cache SET raw = ' \n' WHERE key = ?", (first.cache_key,))
    assert cache.get(first.cache_key) is None

    again = call(Gateway(caches=[cache], retry=FAST), model)
    assert not again.cache_hit and len(server.requests) == 2
    assert cache.get(first.cache_key) == CachedResponse("Hello there.", again.input_tokens,
                                                        again.output_tokens)
    cache.close()


def test_retry_after_is_honoured_but_capped(server):
    server.queue(Reply(fault="429", headers={"Retry-After": "3600"}))
    gateway = Gateway(retry=RetryPolicy(base_s=0.001, max_s=0.001, max_retry_after_s=0.3))
    started = time.monotonic()
    done = call(gateway, model_at(server.base_url))
    waited = time.monotonic() - started
    assert done.attempts == 2 and "HTTP 429" in done.attempt_errors[0]
    assert 0.3 <= waited < 3


def test_retry_after_forms_and_the_default_cap():
    policy, rng = RetryPolicy(base_s=0.0), random.Random(0)
    assert policy.max_retry_after_s == 60.0
    assert policy.delay(0, 3600.0, rng) == 60.0
    assert policy.delay(0, 2.5, rng) == 2.5
    assert policy.delay(0, -5.0, rng) == 0.0

    def rate_limited(**headers):
        request = http_lib.Request("POST", "http://x/v1/chat/completions")
        response = http_lib.Response(429, headers=headers, request=request)
        return openai.RateLimitError("slow down", response=response, body=None)

    assert classify_error(rate_limited(**{"retry-after": "7"})) == (True, 429, 7.0)
    assert classify_error(rate_limited(**{"retry-after-ms": "1500"})) == (True, 429, 1.5)
    transient, status, seconds = classify_error(
        rate_limited(**{"retry-after": formatdate(time.time() + 30, usegmt=True)}))
    assert transient and status == 429 and 25 < seconds <= 31


def test_errors_are_classified_by_type_not_by_name():
    """langchain-openai re-raises the SDK's errors as subclasses with other names."""
    request = http_lib.Request("POST", "http://x/v1/chat/completions")

    class RenamedConnectionError(openai.APIConnectionError):
        pass

    def status_error(code):
        response = http_lib.Response(code, request=request)
        return openai.APIStatusError(f"HTTP {code}", response=response, body=None)

    assert classify_error(RenamedConnectionError(request=request))[0]
    assert classify_error(openai.APITimeoutError(request=request))[0]
    assert classify_error(ConnectionResetError(104, "reset"))[0]
    assert classify_error(json.JSONDecodeError("cut", "{", 1))[0]
    for code in (408, 409, 429, 500, 502, 503, 504):
        assert classify_error(status_error(code)) == (True, code, None)
    for code in (400, 401, 403, 404, 422):
        assert classify_error(status_error(code)) == (False, code, None)
    wrapped = RuntimeError("wrapper")
    wrapped.__cause__ = ConnectionResetError(104, "reset")
    assert classify_error(wrapped)[0]
    assert classify_error(ValueError("a bug")) == (False, None, None)


def test_slow_answer_past_the_timeout_is_retried(server):
    server.slow_s = 0.5
    server.queue(Reply(fault="slow"))
    gateway = Gateway(retry=FAST)
    done = call(gateway, model_at(server.base_url, timeout_s=0.15))
    assert done.raw == "Hello there." and done.attempts == 2
    assert "Timeout" in done.attempt_errors[0]
    assert gateway.counters.last_retry == "timeout after 0.15 s"  # the progress line's why


def test_an_endpoint_that_goes_away_for_a_while_is_ridden_out(server):
    """Calls in flight while the server resets every connection survive once it is back."""
    gateway = Gateway(concurrency=16, retry=RetryPolicy(max_attempts=20, base_s=0.02, max_s=0.2))
    model = model_at(server.base_url)
    server.down = True

    async def many():
        async def back_later():  # once every call has met the outage, and a while after
            while len({json.loads(b)["messages"][0]["content"]
                       for b in server.refused_while_down}) < 16:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            server.down = False
        asks = [gateway.complete(model, [{"role": "user", "content": f"q{i}"}], PARAMS, 0)
                for i in range(16)]
        return await asyncio.gather(back_later(), *asks)

    started = time.monotonic()
    _, *done = asyncio.run(many())
    assert time.monotonic() - started >= 0.3
    assert all(d.raw == "Hello there." for d in done)
    assert all(d.attempts >= 2 and len(d.attempt_errors) == d.attempts - 1 for d in done)
    assert gateway.counters.errors == 0


def test_the_default_retry_budget_rides_out_a_ten_second_outage():
    """The run's default policy (what the runner builds from `[run]`) waits at least 30 s in
    all before a call gives up, whatever its random draws: a 10 s outage fails no call."""
    from biaslab.experiments.spec import RunSettings

    run = RunSettings()
    policy = RetryPolicy(max_attempts=run.max_attempts, base_s=run.retry_base_s)
    assert policy.min_total_wait_s == pytest.approx(30.75) and policy.min_total_wait_s >= 10
    rng = random.Random(7)
    for _ in range(2000):  # the least any sequence of draws waits
        waited = sum(policy.delay(k, None, rng) for k in range(policy.max_attempts - 1))
        assert waited >= policy.min_total_wait_s


# -- whole runs --------------------------------------------------------------------------------
def spec_dict(base_url: str, *, max_attempts: int = 5, pipelines=("E0", "E2"),
              concurrency: int = 16, directions=("pro_female",), **options) -> dict[str, Any]:
    return {
        "name": "faults",
        "protocol": "amplification",
        "models": ["fake"],
        "model_aliases": {"fake": {"provider": "openai-compatible", "model": "fake-model",
                                   "base_url": base_url, "api_key_env": KEY_ENV}},
        "run": {"seeds": [42], "concurrency": concurrency, "max_attempts": max_attempts,
                "retry_base_s": 0.002},
        "conditions": {"directions": list(directions), "targets": "all"},
        "options": {"datasets": ["math"], "pipelines": list(pipelines), "max_test": 20,
                    "batch_size": 5, "n_resamples": 200, **options},
    }


def write_spec(path: Path, data: dict) -> Path:
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


def records(run_dir: Path) -> list:
    store = RunStore(run_dir, readonly=True)
    try:
        return list(store.iter_calls())
    finally:
        store.close()


def cell_status(run_dir: Path) -> dict[str, tuple[str, str | None]]:
    store = RunStore(run_dir, readonly=True)
    try:
        return {row.cell_id: (row.status, row.error) for row in store.cells().itertuples()}
    finally:
        store.close()


def cache_entries(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT key, raw FROM cache"))
    finally:
        conn.close()


def body_id(seen) -> str:
    return json.dumps(seen.body, sort_keys=True)


def logical(recs) -> Counter:
    """A run's calls by what they are, not how they were answered."""
    return Counter((r.cell_id, r.node, r.item, r.sample, r.attempt, r.raw, r.parse_error)
                   for r in recs)


def test_failed_cell_keeps_the_answers_of_its_calls_still_in_flight(tmp_path, capsys):
    """One prediction batch is rejected while the cell's three other batches are still being
    answered: the cell fails, but their answers are recorded and cached, and --resume pays
    only for the rejected batch."""
    with FakeOpenAI() as server:
        def slow_answer(messages):
            time.sleep(0.3)
            return synthetic_answer(messages)
        server.responder = slow_answer
        doomed = "\n1."  # the first record of every batch; pick the batch holding one student
        first_student = {}

        def doom(messages):
            user = messages[-1]["content"]
            if "OUTPUT: [p1" not in user:
                return None
            first = user[user.index(doomed) + 1:].splitlines()[0]
            first_student.setdefault("row", first)
            return "400" if first == first_student["row"] else None
        server.doom = doom
        spec = write_spec(tmp_path / "one.toml", {
            **spec_dict(server.base_url, pipelines=("E0",)),
            "conditions": {"directions": ["pro_female"], "targets": "all"}})
        out = tmp_path / "run"
        assert main(["run", str(spec), "--out", str(out), "--quiet", "--no-report"]) == 1
        capsys.readouterr()

        statuses = cell_status(out)
        failed = {c: e for c, (s, e) in statuses.items() if s == "error"}
        assert failed and all("HTTP 400" in e for e in failed.values())
        first_pass = records(out)
        answered = {body_id(s) for s in server.answered()}
        paid = [r for r in first_pass if not r.cache_hit and r.raw]
        assert len(paid) == len(answered)  # every answer the server gave is recorded...
        run_cache = cache_entries(out / "run.sqlite")
        assert {r.cache_key for r in paid} <= set(run_cache)  # ...and cached
        for cell in failed:
            siblings = [r for r in first_pass if r.cell_id == cell and r.raw]
            assert len(siblings) == 3  # the other batches of the failed cell

        server.doom = None
        n_before = len(server.requests)
        assert main(["run", str(spec), "--out", str(out), "--quiet", "--no-report",
                     "--resume"]) == 0
        again = server.requests[n_before:]
        assert len(again) == len(failed)  # only the rejected batch of each failed cell
        assert not {body_id(s) for s in again} & answered


def test_run_with_mixed_faults_matches_a_fault_free_run_after_one_resume(tmp_path, capsys):
    """20% of requests meet a fault (429, 500, 503, reset, truncated or cut body, empty, slow).
    The run finishes with every cell done or failed with its reason, every request accounted
    for by exactly one call record, no paid answer lost; one --resume gives the fault-free
    run's tables."""
    with FakeOpenAI() as clean:
        clean.responder = synthetic_answer
        ref = tmp_path / "reference"
        spec = write_spec(tmp_path / "clean.toml", spec_dict(clean.base_url))
        assert main(["run", str(spec), "--out", str(ref), "--quiet", "--no-cache",
                     "--no-figures"]) == 0
        assert all(s == "done" for s, _ in cell_status(ref).values())
        assert not any(r.attempt_errors for r in records(ref))

    with FakeOpenAI(fault_rate=0.2, seed=7, slow_s=0.05) as server:
        server.responder = synthetic_answer
        # Also, in the first pass every judge call on one student (the first one judged)
        # fails for good, a 503 each attempt, so that some E2 cells fail for sure.
        judged = []

        def doom(messages):
            user = messages[-1]["content"]
            if "FINAL: p" not in user:
                return None
            student = user[user.index("Student: "):].splitlines()[0]
            judged.append(student)
            return "503" if student == judged[0] else None
        server.doom = doom
        server.queue(*(Reply(fault=kind) for kind in FAULTS))  # each kind at least once
        spec = write_spec(tmp_path / "faulty.toml", spec_dict(server.base_url))
        out = tmp_path / "faulty"
        rc = main(["run", str(spec), "--out", str(out), "--quiet", "--no-report"])
        err = capsys.readouterr().err
        statuses = cell_status(out)
        assert set(s for s, _ in statuses.values()) <= {"done", "error"}
        failed = {c: e for c, (s, e) in statuses.items() if s == "error"}
        assert rc == (1 if failed else 0)
        assert failed, "the doomed judge calls should fail some E2 cells"
        for error in failed.values():  # the call, what it met, and that it was retried
            assert "node '" in error and ("after 5 attempts" in error or
                                          "identical call in flight failed" in error), error
        assert any("HTTP 503" in error for error in failed.values())
        named = [line for line in err.splitlines() if line.strip().startswith("failed: ")]
        assert len(named) == min(3, len(failed))  # the CLI names the first few, with reasons
        assert all(line.split()[1].rstrip(":") in failed for line in named)
        injected = server.faults_injected()
        assert set(FAULTS) <= set(injected)
        drawn = [s for s in server.requests if s.source == "random"]
        assert 0.1 <= sum(1 for s in drawn if s.fault) / len(drawn) <= 0.35

        first_pass = records(out)
        # no duplicates: one record per call of each cell
        keys = Counter((r.cell_id, r.node, r.item, r.sample, r.attempt) for r in first_pass)
        assert max(keys.values()) == 1
        # no request lost: each one is an attempt of exactly one record
        assert sum(r.attempts for r in first_pass if not r.cache_hit) == len(server.requests)
        assert sum(len(r.attempt_errors) for r in first_pass) == \
            len(server.requests) - sum(1 for r in first_pass if not r.cache_hit and not r.error)
        # no paid answer lost: every answer is recorded once and cached in the run
        answered = [s for s in server.answered()]
        paid = [r for r in first_pass if not r.cache_hit and r.raw]
        assert len(paid) == len(answered) == len({body_id(s) for s in answered})
        run_cache = cache_entries(out / "run.sqlite")
        assert {r.cache_key for r in paid} == set(run_cache)
        assert all(raw.strip() for raw in run_cache.values())
        shared = cache_entries(Path(os.environ["BIASLAB_CACHE"]))
        assert set(shared) == set(run_cache)
        # every call that failed for good says why, attempt by attempt
        for r in first_pass:
            if r.error and r.attempts:
                assert len(r.attempt_errors) == r.attempts == 5, r

        server.doom = None
        n_before = len(server.requests)
        rc = main(["run", str(spec), "--out", str(out), "--quiet", "--resume", "--no-figures"])
        assert rc == 0, capsys.readouterr().err
        resumed = server.requests[n_before:]
        assert not {body_id(s) for s in resumed} & {body_id(s) for s in answered}

    assert all(s == "done" for s, _ in cell_status(out).values())
    final = records(out)
    assert logical(final) == logical(records(ref))
    tables = sorted(p.relative_to(ref) for p in (ref / "tables").rglob("*") if p.is_file())
    assert tables
    for table in tables:  # which cell paid and which hit the cache is in cache_use.csv
        assert (out / table).read_bytes() == (ref / table).read_bytes(), table


def test_an_outage_shorter_than_the_retry_budget_fails_no_cell(tmp_path, capsys):
    """The server resets every connection for a while, then comes back: with the budget scaled
    down (retry_base_s 0.02, 8 attempts: at least 1.27 s of waiting per call) a 1 s outage
    fails no cell; the defaults scale the same budget to 30.75 s."""
    import threading

    from biaslab.agents.gateway import RetryPolicy as Policy

    outage_s, base_s = 1.0, 0.02
    assert Policy(max_attempts=8, base_s=base_s).min_total_wait_s > outage_s
    with FakeOpenAI() as server:
        server.responder = synthetic_answer
        data = spec_dict(server.base_url, max_attempts=8, pipelines=("E0",))
        data["run"]["retry_base_s"] = base_s
        spec = write_spec(tmp_path / "spec.toml", data)
        server.down = True
        stop = threading.Event()

        def back_later():  # `outage_s` after the first request met the outage
            while not server.refused_while_down and not stop.wait(0.01):
                pass
            stop.wait(outage_s)
            server.down = False

        back = threading.Thread(target=back_later, daemon=True)
        back.start()
        try:
            code = main(["run", str(spec), "--out", str(tmp_path / "run"), "--quiet",
                         "--no-report", "--no-cache"])
        finally:
            stop.set()
            back.join(5)
        err = capsys.readouterr().err
        assert server.refused_while_down, "the run never met the outage"
    assert code == 0, err
    assert {status for status, _ in cell_status(tmp_path / "run").values()} == {"done"}
    recs = records(tmp_path / "run")
    assert any(r.attempt_errors for r in recs)  # calls met the outage and were retried
