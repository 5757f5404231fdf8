"""A real OpenAI-compatible endpoint for the tests: llama.cpp's own HTTP server (``xllamacpp``)
serving the SmolLM2 GGUF on 127.0.0.1, with a key of its own.

Every other hosted-path test talks to a fake server (``support_http``); this one is what vLLM,
Ollama or llama.cpp's ``llama-server`` put on a port: real tokenisation and token counts, real
seeds, real refusals (a 401 for a wrong key, a 400 for a request over the context). It runs no
network beyond 127.0.0.1.

Use the fixture (registered in ``tests/conftest.py``, so any test can ask for it)::

    def test_something(llama_server):
        llama_server.base_url      # "http://127.0.0.1:PORT/v1"
        llama_server.model_alias("llama")   # a [model_aliases.llama] TOML table for a spec
        status, body = llama_server.chat({"messages": [...], "max_tokens": 8})

It sets ``llama_server.key_env`` in the environment for the session, so ``biaslab`` (in this
process or a subprocess) sends the key; the key itself never appears in a spec. Outside pytest,
``with start_llama_server() as server:`` gives the same object. It skips (never fails) where
xllamacpp or the SmolLM2 wheel is missing. One server per test session: loading takes ~3 s.
"""

from __future__ import annotations

import json
import os
import secrets
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

__all__ = ["LlamaServer", "start_llama_server", "llama_server", "KEY_ENV"]

KEY_ENV = "BIASLAB_TEST_LLAMA_SERVER_KEY"
"""The environment variable that holds the server's key while the fixture lives."""


@dataclass(frozen=True)
class LlamaServer:
    """A running llama.cpp server: where it listens and the key it wants."""

    base_url: str
    """``http://127.0.0.1:PORT/v1``: what a spec's ``base_url`` (or ``VLLM_BASE_URL``) takes."""
    api_key: str
    key_env: str
    model_path: str
    n_ctx: int

    def model_table(self, **extra: Any) -> dict[str, Any]:
        """The model as a spec's model table (``provider = "openai-compatible"``)."""
        return {"provider": "openai-compatible", "model": "smollm2-135m-instruct",
                "base_url": self.base_url, "api_key_env": self.key_env, **extra}

    def model_alias(self, alias: str, **extra: Any) -> str:
        """``[model_aliases.<alias>]`` as TOML, for a spec that lists ``models = ["<alias>"]``."""
        lines = [f"[model_aliases.{alias}]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in self.model_table(**extra).items()]
        return "\n".join(lines) + "\n"

    def chat(self, body: dict[str, Any], *, key: str | None = None,
             timeout_s: float = 120.0) -> tuple[int, dict[str, Any]]:
        """POST ``/chat/completions`` directly (not through biaslab): (status, JSON body)."""
        request = urllib.request.Request(
            f"{self.base_url}/chat/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json",
                     "Authorization": f"Bearer {self.api_key if key is None else key}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")


@contextmanager
def start_llama_server(*, n_ctx: int = 2048, n_threads: int = 2,
                       model_path: str | None = None) -> Iterator[LlamaServer]:
    """Start llama.cpp's server on a free 127.0.0.1 port with a random key.

    One slot and no prompt reuse, as biaslab's embedded model runs (docs/models.md): an
    identical request then gets identical text, so a seed means what it says.
    Raises ImportError / biaslab's UserError where xllamacpp or the model is missing."""
    import xllamacpp

    from biaslab.agents.providers.local import resolve_model_path

    path = resolve_model_path(model_path)
    params = xllamacpp.CommonParams()
    params.model.path = path
    params.n_ctx = n_ctx
    params.n_parallel = 1
    params.cpuparams.n_threads = n_threads
    params.cpuparams_batch.n_threads = n_threads
    params.cache_prompt = False
    params.cache_ram_mib = 0
    params.hostnames = ["127.0.0.1"]
    params.port = 0  # a free port, which the server reports
    params.verbosity = -1
    params.ui = False
    key = secrets.token_hex(16)
    params.api_keys = [key]
    server = xllamacpp.Server(params)
    address = server.listening_address.rstrip("/")
    if not address.startswith("http://127.0.0.1:"):
        raise RuntimeError(f"llama.cpp server listens on {address}, not on 127.0.0.1")
    try:
        yield LlamaServer(base_url=f"{address}/v1", api_key=key, key_env=KEY_ENV,
                          model_path=path, n_ctx=n_ctx)
    finally:
        del server  # (xllamacpp stops the listener when the object goes)


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    """A real llama.cpp server with SmolLM2 on 127.0.0.1, its key in `KEY_ENV`; skips where
    xllamacpp or the model wheel is not installed."""
    pytest.importorskip("xllamacpp")
    from biaslab.errors import UserError

    try:
        # One thread: the suite's other worker (`make test` runs `pytest -n`) holds the other
        # core, and llama.cpp's threads spin at their barriers against it.
        manager = start_llama_server(n_threads=1)
        server = manager.__enter__()
    except UserError as exc:  # no SmolLM2 wheel
        pytest.skip(f"no local model for the llama.cpp server: {exc}")
    previous = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = server.api_key
    try:
        yield server
    finally:
        if previous is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = previous
        manager.__exit__(None, None, None)
