"""Sampling as the papers sample, checked on the wire: what each request carries.

A spec that sets no temperature sends none (the endpoint samples at its own default); the
repeats of one answer carry distinct seeds; three nodes bound to one model with the same
prompt (roleplay's Why judges, augmentation's validators) make three calls, not one cached
answer shared by three "members".
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path

import pytest
import tomli_w

import biaslab.graphs  # noqa: F401  (registers the synthetic models answered below)
from biaslab.agents.providers.scripted import resolve_scripted
from biaslab.cli import main
from biaslab.prompts.registry import PromptRegistry
from support_http import FakeOpenAI, loopback_only


@pytest.fixture(autouse=True)
def _loopback(monkeypatch):
    loopback_only(monkeypatch)


def answers_like(name: str):
    """The endpoint answers as ``scripted:<name>`` would (the protocol's synthetic agents)."""
    model = resolve_scripted(name)
    return lambda messages: asyncio.run(model.acomplete(messages, {}))[0]


def run(tmp_path: Path, spec: dict, capsys) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(spec), encoding="utf-8")
    code = main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet", "--no-report"])
    assert code == 0, capsys.readouterr().err


def by_prompt(requests, prompt_id: str):
    """Requests made from template `prompt_id` (its system text), grouped by their messages."""
    marker = PromptRegistry().get(prompt_id).system.split("$")[0].strip()[:40]
    assert marker
    groups = defaultdict(list)
    for seen in requests:
        system = seen.body["messages"][0]["content"]
        if seen.body["messages"][0]["role"] == "system" and system.startswith(marker):
            groups[json.dumps(seen.body["messages"])].append(seen.body)
    return groups


def endpoint(server: FakeOpenAI) -> dict:
    return {"provider": "openai-compatible", "model": "m", "base_url": server.base_url}


def test_roleplay_sends_no_temperature_and_distinct_seeds_for_repeats_and_judges(tmp_path,
                                                                                 capsys):
    with FakeOpenAI() as server:
        server.responder = answers_like("roleplay-synthetic")
        judges = {f"why_judge_{i}": {"model": "fake"} for i in (1, 2, 3)}
        run(tmp_path, {"name": "rp", "protocol": "roleplay", "models": ["fake"],
                       "model_aliases": {"fake": endpoint(server)},
                       "run": {"seeds": [42], "concurrency": 4, "retry_base_s": 0.0},
                       "nodes": judges,
                       "options": {"attributes": ["age"], "per_stratum": 1, "repeats": 3,
                                   "classify_bias_types": False}}, capsys)
        requests = list(server.requests)
    assert requests
    assert all("temperature" not in seen.body for seen in requests)
    # The target answers each question 3 times: one prompt, three requests, three seeds.
    repeats = [bodies for bodies in by_prompt(requests, "roleplay/answer_role").values() if len(bodies) > 1]
    assert repeats
    for bodies in repeats:
        assert len({b["seed"] for b in bodies}) == len(bodies)
    # Each Why answer is judged by 3 judges on one model, as its own sample even where two
    # answers are word for word the same: 3 requests per answer, every one with its own seed.
    judged = [bodies for text, bodies in by_prompt(requests, "roleplay/why_judge").items()]
    assert judged
    for bodies in judged:
        assert len(bodies) % 3 == 0 and len({b["seed"] for b in bodies}) == len(bodies)


def test_a_temperature_the_spec_sets_is_sent(tmp_path, capsys):
    with FakeOpenAI() as server:
        server.responder = answers_like("roleplay-synthetic")
        run(tmp_path, {"name": "rp", "protocol": "roleplay", "models": ["fake"],
                       "model_aliases": {"fake": {**endpoint(server), "temperature": 0.7}},
                       "run": {"seeds": [42], "concurrency": 4, "retry_base_s": 0.0},
                       "nodes": {f"why_judge_{i}": {"model": "fake"} for i in (1, 2, 3)},
                       "options": {"attributes": ["age"], "per_stratum": 1, "repeats": 1,
                                   "classify_bias_types": False}}, capsys)
        assert {seen.body.get("temperature") for seen in server.requests} == {0.7}


def test_three_validators_on_one_model_make_three_calls(tmp_path, capsys):
    with FakeOpenAI() as server:
        server.responder = answers_like("augmentation-synthetic")
        nodes = {n: {"model": "fake"} for n in ("abstraction", "transform", "scenario",
                                                "rephrase", "validator_1", "validator_2",
                                                "validator_3", "judge")}
        run(tmp_path, {"name": "aug", "protocol": "augmentation", "models": ["fake"],
                       "model_aliases": {"fake": endpoint(server)},
                       "run": {"seeds": [42], "concurrency": 4, "retry_base_s": 0.0},
                       "nodes": nodes, "conditions": {"include_clean": True, "targets": []},
                       "options": {"categories": ["age"], "max_per_category": 1,
                                   "n_variants": 1, "n_resamples": 200}}, capsys)
        requests = list(server.requests)
    assert all("temperature" not in seen.body for seen in requests)
    validations = by_prompt(requests, "augmentation/validator")
    assert validations
    for bodies in validations.values():
        assert len(bodies) == 3 and len({b["seed"] for b in bodies}) == 3
