"""Model specs: parsing, what is recorded, and which key goes where."""

import pytest

from biaslab.agents.providers import ModelSpec, parse_model
from biaslab.errors import UserError


def test_openai_compatible_never_borrows_the_openai_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-travel")
    spec = ModelSpec(provider="openai-compatible", model="m", base_url="http://127.0.0.1:9/v1")
    assert spec.key_env() is None
    from biaslab.agents.providers import build_chat_model
    model = build_chat_model(spec)
    assert model.openai_api_key.get_secret_value() == "not-needed"


def test_public_spec_drops_credentials_in_urls():
    spec = ModelSpec(provider="openai-compatible", model="m",
                     base_url="https://user:hunter2@proxy.example/v1", api_key_env="K")
    assert spec.public()["base_url"] == "https://proxy.example/v1"
    assert "hunter2" not in str(spec.public())


def test_alias_labels_cells_and_keeps_cache_identity():
    a = parse_model({"provider": "vllm", "model": "q", "alias": "q-hot", "temperature": 0.7})
    b = parse_model("vllm:q")
    assert a.label == "q-hot" and b.label == "vllm:q"
    assert a.identity() == b.identity()  # temperature is a call parameter, not the identity


def test_local_identity_is_the_file_served(tmp_path, monkeypatch):
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + b"\0" * 64)
    default = parse_model("local").identity()
    custom = parse_model(f"local:{other}").identity()
    monkeypatch.setenv("BIASLAB_LOCAL_MODEL", str(other))
    via_env = parse_model("local").identity()
    assert default != custom and custom == via_env


def test_local_identity_names_the_thread_count(monkeypatch):
    """The thread count changes the embedded model's answers (issue 48): it is in the identity,
    always (1 unless ``BIASLAB_LOCAL_THREADS`` says otherwise), so no cache key is shared
    between settings."""
    from biaslab.traces.cache import cache_key

    monkeypatch.delenv("BIASLAB_LOCAL_THREADS", raising=False)
    default = parse_model("local").identity()
    monkeypatch.setenv("BIASLAB_LOCAL_THREADS", "2")
    two = parse_model("local").identity()
    assert default["threads"] == 1 and two["threads"] == 2
    messages, params = [{"role": "user", "content": "hi"}], {"seed": 1}
    assert cache_key(default, messages, params, 0) != cache_key(two, messages, params, 0)
    for bad in ("two", "0"):
        monkeypatch.setenv("BIASLAB_LOCAL_THREADS", bad)
        with pytest.raises(UserError, match="BIASLAB_LOCAL_THREADS must be a whole number"):
            parse_model("local").identity()


def test_local_servers_default_to_four_per_usable_core(monkeypatch):
    """Up to four single-threaded servers per core the process may use, at most 8 (issue 48:
    beside CPU-bound programs the model's threads keep a fair share); the count is not in the
    identity, since each call is computed alone on one of identical servers."""
    from biaslab.agents.providers import local

    monkeypatch.delenv("BIASLAB_LOCAL_INSTANCES", raising=False)
    for cores, expected in ((1, 4), (2, 8), (3, 8), (16, 8)):
        monkeypatch.setattr(local.os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert local.instances_default() == expected
    before = parse_model("local").identity()
    monkeypatch.setenv("BIASLAB_LOCAL_INSTANCES", "2")
    assert local.instances_default() == 2
    assert parse_model("local").identity() == before


def test_unknown_provider_is_one_line():
    with pytest.raises(UserError, match="unknown model 'claude:x'"):
        parse_model("claude:x")


def test_local_identity_separates_order_dependent_answers(monkeypatch):
    """With determinism off the local model's answers depend on call order, so they get their
    own cache keys; the default's keys stay what they were (existing caches still hit)."""
    from biaslab.traces.cache import cache_key

    monkeypatch.delenv("BIASLAB_LOCAL_DETERMINISTIC", raising=False)
    default = parse_model("local").identity()
    monkeypatch.setenv("BIASLAB_LOCAL_DETERMINISTIC", "1")
    explicit_on = parse_model("local").identity()
    monkeypatch.setenv("BIASLAB_LOCAL_DETERMINISTIC", "0")
    off = parse_model("local").identity()
    assert default == explicit_on
    assert set(default) == {"provider", "model", "base_url", "threads"}
    messages, params = [{"role": "user", "content": "hi"}], {"seed": 1}
    assert cache_key(off, messages, params, 0) != cache_key(default, messages, params, 0)
    monkeypatch.setenv("BIASLAB_LOCAL_DETERMINISTIC", "maybe")
    with pytest.raises(UserError, match="BIASLAB_LOCAL_DETERMINISTIC must be 1 or 0"):
        parse_model("local").identity()
