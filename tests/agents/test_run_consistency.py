"""A run is self-consistent: an identical request always gets the run's first answer.

The model here drifts on purpose (every call answers differently, like a batched llama.cpp server
without deterministic mode), so only the gateway's lookup order can keep a run consistent.
"""

from __future__ import annotations

import asyncio

from biaslab.agents.gateway import Gateway
from biaslab.agents.providers import ModelSpec
from biaslab.agents.providers.scripted import ScriptedChatModel, register_scripted
from biaslab.traces.cache import CachedResponse, CallCache, cache_key

DRIFT = "test-drifting-judge"
register_scripted(DRIFT, lambda: ScriptedChatModel(
    name_=DRIFT, latency_s=0.01, default=lambda req: f"FINAL: 0.{req.index + 1}"))

SPEC = ModelSpec(provider="scripted", model=DRIFT)
MESSAGES = [{"role": "system", "content": "You judge."}, {"role": "user", "content": "Decide."}]
PARAMS = {"max_tokens": 8, "seed": 42, "temperature": 0.0}


def _caches(tmp_path) -> tuple[CallCache, CallCache]:
    return CallCache.open_file(tmp_path / "run.sqlite"), CallCache.open_file(tmp_path / "shared")


def test_repeated_and_concurrent_identical_calls_get_the_first_answer(tmp_path):
    own, shared = _caches(tmp_path)
    gateway = Gateway(caches=[own, shared])

    async def run():
        together = await asyncio.gather(*(gateway.complete(SPEC, MESSAGES, PARAMS, 0)
                                          for _ in range(3)))  # in flight at once
        later = [await gateway.complete(SPEC, MESSAGES, PARAMS, 0) for _ in range(3)]
        other = await gateway.complete(SPEC, MESSAGES, PARAMS, 1)  # another sample is another call
        return together, later, other

    together, later, other = asyncio.run(run())
    assert [c.raw for c in together + later] == ["FINAL: 0.1"] * 6
    assert [c.cache_hit for c in together + later] == [False, True, True, True, True, True]
    assert other.raw == "FINAL: 0.2"  # the model does drift: only the lookup kept the answer
    assert gateway.model(SPEC).calls_answered == 2 and gateway.counters.model_calls == 2
    key = cache_key(SPEC.identity(), MESSAGES, PARAMS, 0)
    assert own.get(key).raw == shared.get(key).raw == "FINAL: 0.1"


def test_run_store_wins_over_the_shared_cache(tmp_path):
    own, shared = _caches(tmp_path)
    key = cache_key(SPEC.identity(), MESSAGES, PARAMS, 0)
    own.put(key, CachedResponse("FINAL: 0.97", 10, 3), {})      # what this run saw first
    shared.put(key, CachedResponse("FINAL: 0.35", 10, 3), {})   # what another run stored
    gateway = Gateway(caches=[own, shared])
    done = asyncio.run(gateway.complete(SPEC, MESSAGES, PARAMS, 0))
    assert done.raw == "FINAL: 0.97" and done.cache_hit
    assert gateway.counters.model_calls == 0


def test_a_shared_answer_becomes_the_runs_own(tmp_path):
    own, shared = _caches(tmp_path)
    key = cache_key(SPEC.identity(), MESSAGES, PARAMS, 0)
    shared.put(key, CachedResponse("FINAL: 0.35", 10, 3), {})
    gateway = Gateway(caches=[own, shared])
    assert asyncio.run(gateway.complete(SPEC, MESSAGES, PARAMS, 0)).raw == "FINAL: 0.35"
    assert own.get(key).raw == "FINAL: 0.35"  # copied, so the run replays from its own store
