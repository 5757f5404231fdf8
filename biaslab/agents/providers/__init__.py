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
only the variable's name, so a key can never be written to a spec, trace, report or log. URL
credentials (user info, ``?key=``) are likewise never recorded: `ModelSpec.public` names the
variable that supplies them again (``url_env``), and `ModelSpec.check_ready` requires it.
User info is sent as Basic auth and replaces a provider's default key; with an explicit
``api_key_env`` as well it is refused, since an endpoint gets one Authorization header.
Provider SDKs are imported lazily so that each stays optional.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from urllib.parse import urlsplit
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from biaslab.errors import UserError

__all__ = ["ModelSpec", "build_chat_model", "PROVIDERS", "parse_model", "strip_credentials",
           "is_credential_param", "client_url_parts"]

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
        url_env: name of an environment variable holding the endpoint's full URL with its
            credentials (``http://user:KEY@host/v1``, ``…/v1?key=KEY``). It is the only way
            a recorded run (``run --resume RUN_DIR``, ``replay``) gets URL credentials back,
            since none is ever written; `public` names it whenever the URL had some.
        temperature: sampling temperature (0 = greedy); None (the default) sends none, so the
            provider samples at its own default (the embedded model at llama.cpp's, with the
            call's seed, so a run stays reproducible).
        max_tokens: default cap on generated tokens; nodes may ask for fewer.
        rps: requests per second allowed to this endpoint (None = unlimited).
        timeout_s: per-call timeout.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    provider: str
    model: str = ""
    base_url: str | None = None
    api_key_env: str | None = None
    url_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
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

    @field_validator("base_url")
    @classmethod
    def _parsable_url(cls, value: str | None) -> str | None:
        """A URL the HTTP client could not parse (``http://[::1/v1``, a port of letters)
        fails here, with the spec, not as a traceback inside the run."""
        problem = _url_problem(value) if value is not None else None
        if problem:
            raise ValueError(problem)
        return value

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
        """The URL calls go to, credentials included: `url_env`'s value when it is set, else
        `base_url`, else the provider's default (``VLLM_BASE_URL``...)."""
        if self.url_env and os.environ.get(self.url_env):
            return os.environ[self.url_env]
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
            from biaslab.agents.providers.local import (deterministic_default,
                                                        resolve_model_path, threads_default)
            model = _file_identity(resolve_model_path(self.model or None))
            # The thread count changes the answers (issue 48): a cache written on 2 threads
            # must not answer a run on 1. Always present, so the keys of the days when the
            # count followed the machine are never read back as today's 1-thread answers.
            extra["threads"] = threads_default()
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
        url_env = self.url_credentials_env()
        if url_env:  # so that a resume knows the URL had credentials, and where they are
            data["url_env"] = url_env
        if self.alias and self.alias == self.model_copy(update={"alias": None}).label:
            del data["alias"]  # an alias that repeats the default label says nothing
        return data

    def key_env(self) -> str | None:
        return self.api_key_env or _HOSTED.get(self.provider, (None, None))[1]

    def url_credentials_env(self) -> str | None:
        """The environment variable that supplies this endpoint's URL credentials: `url_env`;
        else, for a URL with credentials, the provider variable it came from
        (``VLLM_BASE_URL``...) or ``BIASLAB_URL_<LABEL>`` for one written in the spec; None
        for a URL without credentials."""
        if self.url_env:
            return self.url_env
        url = self.resolved_base_url()
        if not url or strip_credentials(url) == url:
            return None
        if not self.base_url:
            if self.provider == "openai":
                return "OPENAI_BASE_URL"
            default = _HOSTED.get(self.provider, (None,))[0]
            if default and default.startswith("$"):
                return default[1:].partition("|")[0]
        return "BIASLAB_URL_" + re.sub(r"[^A-Za-z0-9]+", "_", self.label).strip("_").upper()

    def _check_url(self) -> None:
        """URL credentials come from `url_env` when it is named, and never from two places."""
        problem = _url_problem(self.resolved_base_url() or "http://ok")
        if problem:  # a URL from the environment (the spec's own was checked when parsed)
            where = self.url_env or "the environment"
            raise UserError(f"model '{self.label}': the URL it is sent to (from {where}) "
                            f"{problem}")
        if self.url_env:
            value = os.environ.get(self.url_env)
            if not value:
                raise UserError(f"model '{self.label}' authenticates through its URL: set "
                                f"{self.url_env} to its full URL, credentials included "
                                "(biaslab never writes them down, so a resumed or replayed "
                                "run reads them from there)")
            if self.base_url and strip_credentials(value) != strip_credentials(self.base_url):
                raise UserError(f"{self.url_env} points at {strip_credentials(value)}, but "
                                f"model '{self.label}' is at {strip_credentials(self.base_url)}")
        url = self.resolved_base_url()
        if url and self.api_key_env and "@" in urlsplit(url).netloc:
            raise UserError(f"model '{self.label}' has both user info in its URL and "
                            f"api_key_env = \"{self.api_key_env}\"; an endpoint gets one "
                            "Authorization header: keep one of them")

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
            self._check_url()
            if not self.model:
                raise UserError(f"model spec '{self.provider}:' needs a model name after the colon")
            if self.provider == "openai-compatible" and not self.resolved_base_url():
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


def is_credential_param(name: str) -> bool:
    """Whether a URL query parameter of this name carries a credential (``key``, ``token``...)."""
    return bool(_SECRET_PARAM.fullmatch(name))


def client_url_parts(url: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """`url` as an OpenAI client takes it: the base URL without user info or query, the query
    as default query parameters (the SDK appends ``/chat/completions`` to the base URL, so a
    query left in it would end up before the path), and the user info as a Basic
    ``Authorization`` header, which replaces the Bearer key."""
    import base64
    from urllib.parse import parse_qsl, unquote, urlunsplit

    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    headers: dict[str, str] = {}
    if "@" in parts.netloc:
        userinfo = parts.netloc.rsplit("@", 1)[0]
        user, _, password = userinfo.partition(":")
        token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=netloc, query="", fragment="")), query, headers


def _url_problem(url: str) -> str | None:
    """Why the HTTP client could not use `url` (never echoing it: it may hold credentials),
    or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (parsing the port is the check)
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    return None


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
        # The timeout goes to the model, which starts it once the call has a server: the
        # gateway's own would count the wait for one (issue 48).
        return LocalChatModel(model_path=spec.model or None, temperature=spec.temperature,
                              max_tokens=spec.max_tokens, timeout_s=spec.timeout_s)
    if spec.provider == "scripted":
        from biaslab.agents.providers.scripted import resolve_scripted
        return resolve_scripted(spec.model)
    import openai
    from langchain_openai import ChatOpenAI
    env = spec.key_env()
    key = (os.environ.get(env) if env else None) or "not-needed"
    url = spec.resolved_base_url()
    base_url, query, headers = client_url_parts(url) if url else (None, {}, {})
    # An HTTP client of its own: langchain-openai otherwise shares one pooled client per
    # endpoint across the process, whose connections die with the first run's event loop
    # (a second run in the same process then fails with "Event loop is closed").
    # temperature None: ChatOpenAI then leaves it out of the request (the endpoint's default).
    return ChatOpenAI(model=spec.model, base_url=base_url, api_key=key,
                      default_query=query or None, default_headers=headers or None,
                      temperature=spec.temperature, max_tokens=spec.max_tokens,
                      timeout=spec.timeout_s, max_retries=0,
                      http_async_client=openai.DefaultAsyncHttpxClient())
