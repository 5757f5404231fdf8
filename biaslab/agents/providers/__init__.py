"""Model providers: one spec string selects a LangChain chat model.

Spec strings:
    ``local`` / ``local:/path/model.gguf``  embedded llama.cpp (default SmolLM2-135M-Instruct)
    ``openai:<model>``                      api.openai.com, key in ``OPENAI_API_KEY``
    ``openrouter:<model>``                  openrouter.ai, key in ``OPENROUTER_API_KEY``
    ``vllm:<model>``                        ``VLLM_BASE_URL`` (default http://localhost:8000/v1)
    ``ollama:<model>``                      ``OLLAMA_BASE_URL`` (default http://localhost:11434/v1)
    ``openai-compatible:<model>``           any endpoint; give ``base_url`` in the spec's model table
    ``scripted:<name>``                     deterministic fake; a registered name or ``module:function``
                                            (``<name>@<option>`` for a fake that takes one)

Keys are read from the environment variable the spec names, at call time; a `ModelSpec` holds
only the variable's name, so a key can never be written to a spec, trace, report or log.
Provider SDKs are imported lazily so that each stays optional.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from biaslab.errors import UserError

__all__ = ["ModelSpec", "build_chat_model", "PROVIDERS", "parse_model", "strip_credentials"]

_HOSTED = {
    # provider: (default base url or env var holding it, default key env, key required)
    "openai": (None, "OPENAI_API_KEY", True),
    "openrouter": ("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", True),
    "vllm": ("$VLLM_BASE_URL|http://localhost:8000/v1", "VLLM_API_KEY", False),
    "ollama": ("$OLLAMA_BASE_URL|http://localhost:11434/v1", "OLLAMA_API_KEY", False),
    # No default key: an OpenAI key must never be sent to an arbitrary endpoint by accident.
    "openai-compatible": (None, None, False),
}
PROVIDERS: tuple[str, ...] = ("local", "scripted", *_HOSTED)


class ModelSpec(BaseModel):
    """Which model a node talks to, and how. Holds no secrets.

    Attributes:
        provider: one of `PROVIDERS`.
        model: model name, GGUF path (local) or scripted name.
        base_url: endpoint for OpenAI-compatible providers.
        api_key_env: name of the environment variable holding the key.
        temperature: sampling temperature (0 = greedy); None (the default) sends none, so the
            provider samples at its own default (the embedded model at llama.cpp's, with the
            call's seed, so a run stays reproducible).
        max_tokens: default cap on generated tokens; nodes may ask for fewer.
        rps: requests per second allowed to this endpoint (None = unlimited).
        timeout_s: per-call timeout.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str
    model: str = ""
    base_url: str | None = None
    api_key_env: str | None = None
    temperature: float | None = Field(default=None, ge=0)
    max_tokens: int = 512
    rps: float | None = Field(default=None, gt=0)
    timeout_s: float = Field(default=300.0, gt=0)
    alias: str | None = None
    """The spec's name for this model ([model_aliases.<alias>]); labels tables and cells."""
    price_in_per_mtok: float | None = Field(default=None, ge=0)
    """What you pay per million prompt tokens, for ``biaslab estimate``'s cost only: never
    sent to the endpoint, never recorded, no part of the cache key or the fingerprint."""
    price_out_per_mtok: float | None = Field(default=None, ge=0)
    """Likewise, per million generated tokens."""

    @property
    def label(self) -> str:
        """Short name for tables, figures and cell ids."""
        if self.alias:
            return self.alias
        if self.provider == "local":
            return "local" if not self.model else f"local:{os.path.basename(self.model)}"
        return f"{self.provider}:{self.model}"

    @property
    def endpoint(self) -> str:
        """Key for per-endpoint rate limits."""
        return self.resolved_base_url() or self.provider

    def resolved_base_url(self) -> str | None:
        if self.base_url:
            return self.base_url
        if self.provider == "openai":  # the SDK honours this variable; so must the cache key
            return os.environ.get("OPENAI_BASE_URL") or None
        default = _HOSTED.get(self.provider, (None,))[0]
        if default and default.startswith("$"):
            env, _, fallback = default[1:].partition("|")
            return os.environ.get(env, fallback)
        return default

    def identity(self) -> dict[str, Any]:
        """What makes two calls the same model call (part of the cache key)."""
        model = self.model
        extra: dict[str, Any] = {}
        if self.provider == "local":  # the file actually served, whichever way it was chosen
            from biaslab.agents.providers.local import deterministic_default, resolve_model_path
            model = _file_identity(resolve_model_path(self.model or None))
            if not deterministic_default():
                # Answers that depend on call order must never be replayed into a
                # deterministic run (nor the other way round); the default keeps its keys.
                extra["deterministic"] = False
        base_url = self.resolved_base_url()
        # Credentials in the URL are not part of what answers: the same endpoint with another
        # key gives the same answers, and the cache key is written next to the response.
        return {"provider": self.provider, "model": model,
                "base_url": strip_credentials(base_url) if base_url else None, **extra}

    def public(self) -> dict[str, Any]:
        """Everything safe to record, including the endpoint actually used (resolved from
        ``VLLM_BASE_URL`` and friends, so a replay does not depend on the shell). The spec
        never holds a key, and credentials written into a base URL (``https://user:pass@host``
        or ``?key=...``) are dropped."""
        data = self.model_dump(exclude_none=True, exclude=set(PRICE_FIELDS))
        base_url = self.resolved_base_url()
        if base_url:
            data["base_url"] = strip_credentials(base_url)
        if self.alias and self.alias == self.model_copy(update={"alias": None}).label:
            del data["alias"]  # an alias that repeats the default label says nothing
        return data

    def key_env(self) -> str | None:
        return self.api_key_env or _HOSTED.get(self.provider, (None, None))[1]

    def check_ready(self) -> None:
        """Fail before a run starts when a required key or endpoint is missing."""
        if self.provider not in PROVIDERS:
            raise UserError(f"unknown model provider '{self.provider}' "
                            f"(known: {', '.join(PROVIDERS)})")
        if self.provider == "local":
            from biaslab.agents.providers.local import resolve_model_path
            resolve_model_path(self.model or None)  # one-line UserError when missing
        if self.provider == "scripted":
            from biaslab.agents.providers.scripted import resolve_scripted
            resolve_scripted(self.model)
        if self.provider in _HOSTED:
            if not self.model:
                raise UserError(f"model spec '{self.provider}:' needs a model name after the colon")
            if self.provider == "openai-compatible" and not self.base_url:
                raise UserError(f"model '{self.label}' needs base_url (set it in the spec's "
                                "[models.<alias>] table)")
            env = self.key_env()
            required = _HOSTED[self.provider][2] or self.api_key_env is not None
            if required and not os.environ.get(env or ""):
                raise UserError(f"model '{self.label}' needs an API key in the environment "
                                f"variable {env} (it is not set)")


_SECRET_PARAM = re.compile(r"(api[_-]?key|apikey|key|token|access[_-]?token|auth|"
                           r"password|passwd|secret|sig|signature|code|.+[_-](key|token|secret))",
                           re.I)


PRICE_FIELDS = ("price_in_per_mtok", "price_out_per_mtok")
"""`ModelSpec` fields for cost estimates only (left out of `ModelSpec.public`)."""


def strip_credentials(url: str) -> str:
    """`url` without user info (``user:pass@``) and without query parameters that carry a
    credential (``?key=``, ``api_key=``, ``token=``...). Unchanged when it holds none."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[1] if "@" in parts.netloc else parts.netloc
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if not _SECRET_PARAM.fullmatch(k)]
    if netloc == parts.netloc and len(kept) == len(pairs):
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(kept)))


def _file_identity(path: str) -> str:
    """A model file's name, size and a hash of its first MiB: stable across machines for the
    same file, different for a different GGUF at the same path."""
    stat = os.stat(path)
    return _file_identity_of(path, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=32)
def _file_identity_of(path: str, size: int, mtime_ns: int) -> str:
    import hashlib

    with open(path, "rb") as handle:
        head = hashlib.sha256(handle.read(1 << 20)).hexdigest()[:16]
    return f"{os.path.basename(path)}:{size}:{head}"


def parse_model(spec: str | dict | ModelSpec, aliases: dict[str, ModelSpec] | None = None
                ) -> ModelSpec:
    """Turn a spec string, table or alias into a `ModelSpec`."""
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, dict):
        try:
            return ModelSpec(**spec)
        except ValidationError as exc:  # name the field only: a value could be a pasted key
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            hint = " (put keys in the environment and name the variable in api_key_env)" \
                if "key" in field.lower() else ""
            raise UserError(f"bad model table{' ' + spec['alias'] if 'alias' in spec else ''}: "
                            f"{field}: {err['msg']}{hint}") from None
    if aliases and spec in aliases:
        return aliases[spec]
    provider, _, model = spec.partition(":")
    if provider not in PROVIDERS:
        raise UserError(f"unknown model '{spec}': provider must be one of {', '.join(PROVIDERS)} "
                        "(e.g. local, openrouter:meta-llama/llama-3.1-8b-instruct)")
    return ModelSpec(provider=provider, model=model)


def build_chat_model(spec: ModelSpec):
    """Instantiate the LangChain chat model for a spec (SDK imported only when needed)."""
    spec.check_ready()
    if spec.provider == "local":
        from biaslab.agents.providers.local import LocalChatModel
        return LocalChatModel(model_path=spec.model or None, temperature=spec.temperature,
                              max_tokens=spec.max_tokens)
    if spec.provider == "scripted":
        from biaslab.agents.providers.scripted import resolve_scripted
        return resolve_scripted(spec.model)
    import openai
    from langchain_openai import ChatOpenAI
    env = spec.key_env()
    key = (os.environ.get(env) if env else None) or "not-needed"
    # An HTTP client of its own: langchain-openai otherwise shares one pooled client per
    # endpoint across the process, whose connections die with the first run's event loop
    # (a second run in the same process then fails with "Event loop is closed").
    # temperature None: ChatOpenAI then leaves it out of the request (the endpoint's default).
    return ChatOpenAI(model=spec.model, base_url=spec.resolved_base_url(), api_key=key,
                      temperature=spec.temperature, max_tokens=spec.max_tokens,
                      timeout=spec.timeout_s, max_retries=0,
                      http_async_client=openai.DefaultAsyncHttpxClient())
