"""The run store's cache writes wait for its commit and its misses skip the table while it was
empty at open; the shared cache writes in batches. Neither may lose or hide an answer."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest

from biaslab.traces.cache import CachedResponse, CallCache, cache_key, identity_json, keyed_by
from biaslab.traces.shared_cache import open_shared_cache
from biaslab.traces.store import RunStore


def key(i: int) -> str:
    return hashlib.sha256(f"call {i}".encode()).hexdigest()


def answer(i: int) -> CachedResponse:
    return CachedResponse(f"answer {i}", 10, 2)


def table_keys(path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {k for (k,) in conn.execute("SELECT key FROM cache")}
    finally:
        conn.close()


def test_a_run_stores_answers_with_its_commit_and_finds_them_before_and_after(tmp_path):
    store = RunStore(tmp_path / "run")
    model = {"provider": "scripted", "model": "m"}
    for i in range(50):
        store.put_cache(key(i), answer(i), model)
    assert store.cache.get(key(7)) == answer(7)  # held, not yet written: still an answer
    assert store.cache.get(key(99)) is None
    store.commit()
    assert table_keys(store.path) == {key(i) for i in range(50)}
    assert store.cache.get(key(7)) == answer(7)
    store.put_cache(key(7), CachedResponse("a second answer", 1, 1), model)  # the first stays
    store.close()
    again = RunStore(tmp_path / "run")  # not empty at open: every lookup asks the table
    assert again.cache._written is None
    assert again.cache.get(key(7)) == answer(7) and len(again.cache) == 50
    again.close()


def test_answers_a_merge_writes_by_sql_are_found(tmp_path):
    source = RunStore(tmp_path / "shard")
    source.put_cache(key(1), answer(1), {})
    source.close()
    main = RunStore(tmp_path / "run")
    assert main.cache.get(key(1)) is None  # empty at open, never written here
    main.merge_from(tmp_path / "shard")
    assert main.cache.get(key(1)) == answer(1)
    main.close()


def test_the_shared_cache_writes_in_batches_and_keeps_every_answer(tmp_path):
    path = tmp_path / "shared.sqlite"
    cache = open_shared_cache(path)
    for i in range(20):
        cache.put_later(key(i), answer(i), {"m": 1})
    assert cache.get(key(3)) == answer(3)
    assert table_keys(path) == set()  # nothing written before the flush
    cache.flush()
    assert table_keys(path) == {key(i) for i in range(20)}
    cache.put_later(key(20), answer(20), {"m": 1})
    cache.close()  # closing flushes
    assert key(20) in table_keys(path)
    other = CallCache.open_file(path)
    assert other.get(key(20)) == answer(20)
    other.close()


def test_cache_keys_are_the_hash_of_the_canonical_payload():
    """Keys stay what every earlier store holds: sha256 of the canonical JSON of the model
    identity, messages, params and sample (computed here the long way)."""
    identity = {"provider": "openai-compatible", "model": "m", "base_url": "http://x/v1", "é": [1]}
    messages = [{"role": "user", "content": "¿Quién? \u2603", "tool_calls": [{"b": 1, "a": 2}]}]
    params = {"seed": 7, "max_tokens": 16, "temperature": 0.7, "grammar": None}
    payload = json.dumps({"m": identity, "x": messages, "p": params, "s": 2}, sort_keys=True,
                         ensure_ascii=False, separators=(",", ":"))
    expected = hashlib.sha256(payload.encode()).hexdigest()
    assert cache_key(identity, messages, params, 2) == expected
    assert keyed_by(identity_json(identity), messages, params, 2) == expected


@pytest.mark.parametrize("messages", [
    [{"role": "system", "content": "Judge."}, {"role": "user", "content": "Is \"it\" fair?"}],
    [], [{"role": "user", "content": "é \u2028 \x00 \\ 😀 \n\t"}],
    [{"content": "x", "role": "user", "name": "extra key"}], [{"content": 3, "role": "user"}],
    [{"role": "user", "content": "ok"}, "not a dict"]])
@pytest.mark.parametrize("params", [
    {"seed": 7, "max_tokens": 16}, {}, {"temperature": 0.7, "seed": 1}, {"flag": True},
    {"grammar": None, "seed": 2}, {"json_schema": {"b": 1, "a": [1, 2]}, "seed": 3},
    {"é": "ü", "big": 10 ** 30, "neg": -5}, {1: 2}])
def test_the_usual_keys_take_a_short_path_to_the_same_bytes(messages, params):
    """The common message and parameter shapes are encoded without the JSON encoder; every
    shape, usual or not, gives the key computed the long way."""
    identity = {"provider": "scripted", "model": "m"}
    payload = json.dumps({"m": identity, "x": messages, "p": params, "s": 0}, sort_keys=True,
                         ensure_ascii=False, separators=(",", ":"))
    assert keyed_by(identity_json(identity), messages, params, 0) == \
        hashlib.sha256(payload.encode()).hexdigest()


def test_keys_that_are_not_hashes_are_still_found(tmp_path):
    store = RunStore(tmp_path / "run")
    store.put_cache("kgood", answer(1), {})
    assert store.cache.get("kgood") == answer(1) and store.cache.get(key(2)) is None
    store.commit()
    assert store.cache.get("kgood") == answer(1)
    store.close()
