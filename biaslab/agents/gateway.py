"""The one path every model call takes: cache → replay source → rate limit → retry → model.

Keeping this in one place is what makes runs cheap to redo: any call whose content address is
already known (in this run, a shared cache, or a replayed trace) is answered without a model,
and identical calls in flight at the same time are paid for once.

Failures are classified by exception type (the openai SDK's and httpx's hierarchies), not by
name: a dropped, refused or reset connection, a timeout, a truncated body, an empty answer,
408/409/425/429 and 5xx are retried with backoff; every failed attempt is kept on the call's
record. Only answers with text are cached (`biaslab.traces.cache.is_cacheable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import random
import re
import secrets
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, Iterator, Literal, Sequence

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, convert_to_messages

from biaslab.agents.app_guard import own_traffic
from biaslab.agents.providers import ModelSpec, build_chat_model
from biaslab.agents.redaction import redact, secrets_of
from biaslab.agents.providers.answer_sheet import is_answer_sheet
from biaslab.agents.structured_output import provider_kwargs
from biaslab.agents.tool_answers import encode_answer, from_openai_tool_calls
from biaslab.errors import ModelCallError, ReplayMiss
from biaslab.traces.cache import CachedResponse, CallCache, identity_json, is_cacheable, keyed_by

__all__ = ["Gateway", "Completion", "RetryPolicy", "RunCounters", "classify_error", "ReplayMode",
           "CallFailure", "CallScope"]

ReplayMode = Literal["live", "strict", "offline"]
_LC = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}
_TRANSIENT_STATUS = frozenset({408, 409, 425, 429})  # and every 5xx
_OWN_PROVIDERS = ("local", "scripted")  # in-process: an unknown exception there is a bug


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with half jitter for transient failures.

    Each wait is half its step fixed and half random (``step/2 + uniform(0, step/2)``, the step
    doubling from `base_s` up to `max_s`), so a call never gives up before `min_total_wait_s`
    seconds of waiting: an outage shorter than that is ridden out whatever the draws (with
    full jitter, a call that drew short waits failed a 10 s outage now and then). The random
    half keeps processes that share an endpoint from retrying in lockstep.

    Transient: timeouts, dropped or refused connections, truncated or unreadable response
    bodies, empty answers, 408/409/425/429 and 5xx. Other 4xx are not retried. A Retry-After
    the endpoint sends is honoured, but never beyond `max_retry_after_s`: a misconfigured proxy
    asking for an hour must not stall a run.

    Attributes:
        max_attempts: attempts per call, the first one included.
        base_s: first backoff step; it doubles per attempt up to `max_s`.
        max_s: cap on one backoff step.
        max_retry_after_s: cap on the wait a Retry-After header can impose.
    """

    max_attempts: int = 5
    base_s: float = 0.5
    max_s: float = 30.0
    max_retry_after_s: float = 60.0

    def step(self, attempt: int) -> float:
        """The backoff step after failed attempt number `attempt` (0-based)."""
        return min(self.max_s, self.base_s * 2 ** attempt)

    @property
    def min_total_wait_s(self) -> float:
        """The least a call waits in all, over its retries, before it gives up: an outage
        shorter than this never fails a call. (With the run defaults, 8 attempts from 0.5 s:
        30.75 s.)"""
        return sum(self.step(k) / 2 for k in range(self.max_attempts - 1))

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number `attempt` (0-based)."""
        step = self.step(attempt)
        backoff = step / 2 + rng.uniform(0, step / 2)
        if retry_after is None:
            return backoff
        return max(backoff, min(max(retry_after, 0.0), self.max_retry_after_s))


class CallFailure(ModelCallError):
    """A call that failed for good, with what each attempt met.

    Attributes:
        attempts: transport attempts made.
        attempt_errors: one line per failed attempt, in order (the last one is why it gave up).
        cache_key: the call's content address.
    """

    def __init__(self, message: str, *, attempts: int, attempt_errors: Sequence[str],
                 cache_key: str, **kwargs):
        super().__init__(message, **kwargs)
        self.attempts = attempts
        self.attempt_errors = list(attempt_errors)
        self.cache_key = cache_key


class EmptyAnswer(Exception):
    """The endpoint answered 200 with no text: a failed attempt, never a cache entry."""


def _transient_types() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the network or the endpoint failed this time".

    By type, not by name: langchain-openai re-raises the SDK's errors as subclasses with other
    names, and the SDK wraps httpx (or its fork httpx2) errors. Each library is optional.
    """
    types: list[type[BaseException]] = [TimeoutError, asyncio.TimeoutError, ConnectionError,
                                         json.JSONDecodeError, EmptyAnswer]
    with contextlib.suppress(ImportError):
        import openai
        types += [openai.APIConnectionError,  # resets, refused, protocol errors, timeouts
                  openai.APIResponseValidationError]  # a 200 whose body is not a completion
    for name in ("httpx", "httpx2"):
        with contextlib.suppress(ImportError):
            module = __import__(name)
            types += [module.TimeoutException, module.NetworkError, module.RemoteProtocolError]
    return tuple(types)


_TRANSIENT_TYPES: tuple[type[BaseException], ...] | None = None


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and what it explicitly wraps (``raise ... from``)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__


def _status(exc: BaseException) -> int | None:
    if isinstance(exc, ModelCallError):
        return exc.status
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        status = getattr(getattr(exc, "response", None), "status_code", None)
    # Only an error status counts: langchain-openai also attaches the 200 response to errors
    # raised while reading its body (a truncated JSON).
    return status if isinstance(status, int) and 400 <= status <= 599 else None


def _retry_after(exc: BaseException) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    try:
        if headers.get("retry-after-ms") is not None:
            return float(headers.get("retry-after-ms")) / 1000
        value = headers.get("retry-after")
    except (TypeError, ValueError, AttributeError):
        return None
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        pass
    try:
        return parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def classify_error(exc: BaseException) -> tuple[bool, int | None, float | None]:
    """(transient, status, retry_after) for an exception raised by a provider.

    An HTTP status decides when there is one (408/409/425/429 and 5xx are transient, other
    codes not); otherwise the exception's type, or that of an exception it wraps.
    """
    global _TRANSIENT_TYPES
    if isinstance(exc, ModelCallError):
        return exc.transient, exc.status, exc.retry_after
    if _TRANSIENT_TYPES is None:
        _TRANSIENT_TYPES = _transient_types()
    for link in _causes(exc):
        status = _status(link)
        if status is not None:
            return status in _TRANSIENT_STATUS or status >= 500, status, _retry_after(link)
        if isinstance(link, _TRANSIENT_TYPES):
            return True, None, None
    return False, None, None


def _describe_error(exc: BaseException, spec: ModelSpec) -> str:
    """One line naming what went wrong, for records and messages: no traceback, and no
    credential in any form (`biaslab.agents.redaction`), even one the endpoint echoed."""
    status = _status(exc)
    inner = [type(e).__name__ for e in list(_causes(exc))[1:]]
    # Redacted before it is cut short, so that no part of a secret survives at the cut.
    text = redact(" ".join(str(exc).split()), secrets_of([spec]))[:300]
    where = f" [{' <- '.join(inner[:3])}]" if inner else ""
    return f"{f'HTTP {status} ' if status else ''}{type(exc).__name__}: {text}{where}"


def retry_reason(exc: BaseException, spec: ModelSpec, status: int | None) -> str:
    """A few words on why a call is retried, for the progress line (``timeout after 300 s``,
    ``HTTP 503``, ``empty answer``, ``ConnectionError``): a bare count says nothing."""
    if status is not None:
        return f"HTTP {status}"
    if isinstance(exc, EmptyAnswer):
        return "empty answer"
    if isinstance(exc, TimeoutError):
        return f"timeout after {spec.timeout_s:g} s"
    return type(exc).__name__


# -- the call itself ------------------------------------------------------------------------------
# Each model is called below LangChain's Runnable layer: `ainvoke` would build a callback
# manager, a run tree and (for ChatOpenAI) hop to a thread to parse the response, on every call,
# for listeners a run never has. The chat model object stays the configuration.


async def _send_scripted(model, messages, kwargs) -> tuple[str, dict[str, int]]:
    return await model.acomplete(messages, kwargs)


async def _send_lc(model, messages, kwargs) -> tuple[str, dict[str, int]]:
    """Any other LangChain chat model (the embedded one): its `_agenerate`, no callbacks."""
    if all(m.keys() <= {"role", "content"} for m in messages):
        turns = [_LC[m["role"]](content=m["content"]) for m in messages]
    else:  # tool calls and tool results (an audited app): LangChain reads OpenAI's shape
        turns = convert_to_messages(messages)
    result = await model._agenerate(turns, **kwargs)
    message = result.generations[0].message
    raw = message.content if isinstance(message.content, str) else str(message.content)
    refusal = (getattr(message, "additional_kwargs", None) or {}).get("refusal")
    if getattr(message, "tool_calls", None) or refusal:
        raw = encode_answer(raw, getattr(message, "tool_calls", None) or [], refusal)
    return raw, dict(getattr(message, "usage_metadata", None) or {})


async def _send_openai(model, messages, kwargs) -> tuple[str, dict[str, int]]:
    """A ChatOpenAI's own AsyncOpenAI client, with the request ChatOpenAI would build.

    The payload is the model's default parameters (model name, temperature, max tokens,
    ``model_kwargs``, ``extra_body``...) updated with the call's, ``max_tokens`` sent as
    ``max_completion_tokens`` and system turns as ``developer`` for o-series models, exactly as
    `ChatOpenAI._get_request_payload` does for plain text messages. It goes through the
    client's generic ``post`` (same connection pool, headers, key, timeout and HTTP errors) and
    reads the JSON itself: the typed ``create`` walks every parameter through its TypedDict
    transforms and builds a pydantic response, about half of a bare client's CPU per call.
    """
    payload = {**model._default_params, **kwargs}
    payload.pop("stream", None)
    extra_body = payload.pop("extra_body", None) or {}
    if "max_tokens" in payload:
        payload["max_completion_tokens"] = payload.pop("max_tokens")
    if model.model_name and re.match(r"^o\d", model.model_name):
        messages = [{**m, "role": "developer"} if m["role"] == "system" else m for m in messages]
    data = await model.root_async_client.post(
        "/chat/completions", body={**payload, **extra_body, "messages": messages}, cast_to=object)
    if not isinstance(data, dict):  # a 200 whose body is not JSON: like a truncated one
        raise json.JSONDecodeError("the endpoint's answer is not a JSON object", str(data)[:200], 0)
    if data.get("error"):  # some gateways answer 200 with an error object and no choices
        raise ValueError(f"the endpoint answered with an error: {data['error']}")
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise ValueError("the endpoint's answer has no 'choices'")
    message = (choices[0] or {}).get("message") if choices else None
    raw = (message or {}).get("content") or ""
    raw = raw if isinstance(raw, str) else json.dumps(raw)
    if (message or {}).get("tool_calls") or (message or {}).get("refusal"):
        # an audited app's tool loop, or a refused structured output (agents.tool_answers)
        raw = encode_answer(raw, from_openai_tool_calls(message.get("tool_calls")),
                            message.get("refusal"))
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return raw, {}
    tin, tout = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return raw, {"input_tokens": tin, "output_tokens": tout,
                 "total_tokens": int(usage.get("total_tokens") or tin + tout)}


def _sender(model):
    """The fastest faithful way to call `model`: a subclass that overrides `_agenerate`, a
    streaming or Responses-API ChatOpenAI, or any other chat model goes through `_agenerate`."""
    from biaslab.agents.providers.scripted import ScriptedChatModel

    kind = type(model)
    if isinstance(model, ScriptedChatModel) and kind._agenerate is ScriptedChatModel._agenerate:
        return _send_scripted
    with contextlib.suppress(ImportError):
        from langchain_openai import ChatOpenAI
        if isinstance(model, ChatOpenAI) and kind._agenerate is ChatOpenAI._agenerate \
                and not model.streaming and not model._use_responses_api({}):
            return _send_openai
    return _send_lc


class CallScope:
    """The model calls one cell has started, including those still in flight after it failed.

    A node that fans out (prediction batches, E2 judges) leaves its other calls running when
    one fails. The runner waits for them (`settle`) before it writes the failed cell, so every
    answer the endpoint returned is recorded and cached, never paid for twice.
    """

    def __init__(self) -> None:
        self.active = 0
        self._idle: asyncio.Event | None = None  # made only when someone waits (rare)

    def _enter(self) -> None:
        self.active += 1

    def _exit(self) -> None:
        self.active -= 1
        if self.active == 0 and self._idle is not None:
            self._idle.set()

    async def settle(self) -> None:
        """Return once no call of this scope is in flight (retries included)."""
        while self.active:
            if self._idle is None:
                self._idle = asyncio.Event()
            self._idle.clear()
            await self._idle.wait()


_SCOPE: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar(
    "biaslab_call_scope", default=None)


class _RateLimiter:
    """At most `rps` call starts per second for one endpoint."""

    def __init__(self, rps: float):
        self.interval = 1.0 / rps
        self.next_at = 0.0
        self.lock = asyncio.Lock()

    async def wait(self) -> None:
        async with self.lock:
            now = time.monotonic()
            wait = self.next_at - now
            self.next_at = max(now, self.next_at) + self.interval
        if wait > 0:
            await asyncio.sleep(wait)


@dataclass
class RunCounters:
    """What the progress bar shows; counts only, so memory does not grow with the run."""

    calls: int = 0
    model_calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    errors: int = 0
    parse_failures: int = 0
    tokens: int = 0
    last_retry: str = ""
    """Why the latest retry happened, in a few words (`retry_reason`): the progress line's."""


@dataclass(frozen=True)
class Completion:
    raw: str
    input_tokens: int
    output_tokens: int
    cache_key: str
    cache_hit: bool
    attempts: int
    latency_s: float
    attempt_errors: tuple[str, ...] = ()
    """One line per failed attempt before this answer, in order."""


@dataclass
class Gateway:
    """Answers model calls for one run.

    Args:
        caches: where responses are looked up and stored (the run store's cache first).
        replay: read-only caches of a source run, consulted before any model.
        mode: ``live`` calls models on a miss; ``strict`` raises `ReplayMiss` on a miss;
            ``offline`` refuses every model call (rescoring).
        concurrency: maximum model calls in flight across the run.
    """

    caches: Sequence[CallCache] = ()
    replay: Sequence[CallCache] = ()
    mode: ReplayMode = "live"
    concurrency: int = 4
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    counters: RunCounters = field(default_factory=RunCounters)
    on_store: Any = None  # callable(key, CachedResponse, model_public) that persists a response
    verdict_key: bytes = field(default_factory=lambda: secrets.token_bytes(16), repr=False)
    """What judges' verdict markers are derived from (`biaslab.agents.verdicts`): the run's key
    (`biaslab.traces.verdict_key`); a gateway made without one gets a random key of its own."""
    batch_writes: bool = False
    """Whether answers are written to the caches after the first (the shared cache) in batches
    (`CallCache.put_later`), flushed by `flush` and when the cache closes: a transaction per
    batch instead of one per call. The runner flushes as often as it commits the run store."""

    def __post_init__(self):
        self._models: dict[ModelSpec, Any] = {}
        self._senders: dict[ModelSpec, Any] = {}
        self._facts: dict[ModelSpec, tuple[dict[str, Any], dict[str, Any], str]] = {}
        self._limiters: dict[str, _RateLimiter] = {}
        self._inflight: dict[str, asyncio.Future] = {}
        self._semaphore: asyncio.Semaphore | None = None
        # Jitter must differ between processes sharing an endpoint, or they retry in lockstep.
        self._rng = random.Random()

    def model(self, spec: ModelSpec):
        if spec not in self._models:
            self._models[spec] = build_chat_model(spec)
        return self._models[spec]

    def _spec_facts(self, spec: ModelSpec) -> tuple[dict[str, Any], dict[str, Any], str]:
        """The model's identity, its public form and the identity's part of the cache key."""
        facts = self._facts.get(spec)
        if facts is None:  # once per run: both resolve endpoints, and identity stats a file
            identity = spec.identity()
            facts = self._facts[spec] = (identity, spec.public(), identity_json(identity))
        return facts

    def public(self, spec: ModelSpec) -> dict[str, Any]:
        """`ModelSpec.public`, as resolved when this run first used the model (for records)."""
        return self._spec_facts(spec)[1]

    def _lookup(self, key: str) -> CachedResponse | None:
        """Find a response; one found elsewhere is copied into the run's own cache, so every
        run directory can be replayed from its own store alone."""
        own = self.caches[0] if self.caches else None
        for cache in (*self.caches[:1], *self.replay, *self.caches[1:]):
            hit = cache.get(key)
            if hit is not None:
                if own is not None and cache is not own:
                    self._store(own, key, hit, None)
                return hit
        return None

    def _store(self, cache: CallCache, key: str, response: CachedResponse,
               model: dict[str, Any] | None) -> None:
        if self.on_store is not None and cache is self.caches[0]:
            self.on_store(key, response, model or {})
        elif self.batch_writes:
            cache.put_later(key, response, model or {})
        else:
            cache.put(key, response, model or {})

    def seed(self, spec: ModelSpec, messages: list[dict[str, Any]], params: dict[str, Any],
             sample: int, response: CachedResponse) -> bool:
        """Put an answer recorded elsewhere (an app's trace, `biaslab.traces.imported`) under
        this call's content address in the run's own cache, unless an answer is there already:
        the call that follows is then a cache hit, paid by nobody. Returns whether it was put."""
        if not self.caches:
            return False
        identity, _, identity_key = self._spec_facts(spec)
        key = keyed_by(identity_key, messages, params, sample)
        if self._lookup(key) is not None:
            return False
        self._store(self.caches[0], key, response, identity)
        return True

    def flush(self) -> None:
        """Write what `batch_writes` holds back (the shared cache's new answers)."""
        for cache in self.caches[1:]:
            cache.flush()

    @contextlib.contextmanager
    def scope(self, scope: CallScope | None = None) -> Iterator[CallScope]:
        """Track the calls made inside this block, and in tasks started from it (a cell), in
        `scope` (a cell's nodes run in several blocks when cells share a graph run) or a new one."""
        scope = scope if scope is not None else CallScope()
        token = _SCOPE.set(scope)
        try:
            yield scope
        finally:
            _SCOPE.reset(token)

    async def complete(self, spec: ModelSpec, messages: list[dict[str, str]],
                       params: dict[str, Any], sample: int, *, describe: str = "") -> Completion:
        """One call by content address. `describe` names the call in errors.

        Raises:
            CallFailure: the call failed for good; it says what each attempt met.
            ReplayMiss: strict or offline mode, and no recorded answer.
        """
        scope = _SCOPE.get()
        if scope is not None:
            scope._enter()
        try:
            return await self._complete(spec, messages, params, sample, describe)
        finally:
            if scope is not None:
                scope._exit()

    async def _complete(self, spec: ModelSpec, messages, params, sample, describe) -> Completion:
        identity, _, identity_key = self._spec_facts(spec)
        key = keyed_by(identity_key, messages, params, sample)
        self.counters.calls += 1
        hit = self._lookup(key)
        if hit is None and key in self._inflight:
            try:
                hit = await asyncio.shield(self._inflight[key])
            except CallFailure as exc:  # its attempts are recorded once, by the call that made them
                raise CallFailure(f"{describe or 'model call ' + key[:12]}: the identical call "
                                  f"in flight failed: {exc}", status=exc.status,
                                  retry_after=exc.retry_after, transient=exc.transient,
                                  attempts=0, attempt_errors=(), cache_key=key) from exc
        if hit is not None:
            self.counters.cache_hits += 1
            return Completion(hit.raw, hit.input_tokens, hit.output_tokens, key, True, 0, 0.0)
        if self.mode == "strict" and not is_answer_sheet(spec.provider, spec.model):
            # (an answer sheet answers from recorded calls: judge sensitivity's replays)
            raise ReplayMiss(f"strict replay: the source trace has no call for {describe} "
                             f"(cache key {key[:12]})")
        if self.mode == "offline":
            raise ReplayMiss(f"rescoring makes no model calls, but {describe} was not recorded")
        future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            completion = await self._call_model(spec, messages, params, key, describe)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters re-raise it, nobody else must
            raise
        finally:
            self._inflight.pop(key, None)
        response = CachedResponse(completion.raw, completion.input_tokens, completion.output_tokens)
        future.set_result(response)
        if is_cacheable(response):  # an empty answer is asked again next time, never replayed
            for cache in self.caches:
                self._store(cache, key, response, identity)
        return completion

    async def _call_model(self, spec: ModelSpec, messages, params, key, describe) -> Completion:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.concurrency)
        model = self.model(spec)
        send = self._senders.get(spec)
        if send is None:
            send = self._senders[spec] = _sender(model)
        kwargs = {k: v for k, v in params.items() if v is not None}
        if spec.provider not in _OWN_PROVIDERS:
            kwargs.pop("grammar", None)
            kwargs.pop("json_schema", None)
        try:  # a structured-output schema in the form this provider's endpoint takes
            kwargs = provider_kwargs(spec.provider, kwargs)
        except ModelCallError as exc:  # a request this provider cannot answer at all
            self.counters.errors += 1
            raise CallFailure(f"{describe or 'model call ' + key[:12]}: {exc}", status=exc.status,
                              attempts=0, attempt_errors=[str(exc)], cache_key=key) from exc
        # The embedded model times its calls itself, from when one has a server: a call queued
        # behind others is waiting, not failing (issue 48).
        timeout_s = None if spec.provider == "local" else spec.timeout_s
        limiter = None
        if spec.rps:
            limiter = self._limiters.setdefault(spec.endpoint, _RateLimiter(spec.rps))
        errors: list[str] = []
        attempt = 0
        while True:
            attempt += 1
            try:
                async with self._semaphore:
                    if limiter:
                        await limiter.wait()
                    started = time.monotonic()
                    # marked as biaslab's own: an audited app's cell refuses other traffic
                    async with asyncio.timeout(timeout_s):  # no extra task, unlike wait_for
                        with own_traffic():
                            raw, usage = await send(model, messages, kwargs)
                    latency = time.monotonic() - started
                if not raw.strip() and attempt < self.retry.max_attempts:
                    self.counters.tokens += int(usage.get("total_tokens", 0))  # paid all the same
                    raise EmptyAnswer("the endpoint answered with no text")
                break
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:  # classified below
                transient, status, retry_after = classify_error(exc)
                if not (transient or status is not None or isinstance(exc, ModelCallError)
                        or spec.provider not in _OWN_PROVIDERS):
                    raise  # a bug in our own in-process model: keep its traceback
                if isinstance(exc, asyncio.TimeoutError) and not str(exc):
                    exc = TimeoutError(f"no answer within {spec.timeout_s:g}s")
                errors.append(f"attempt {attempt}: {_describe_error(exc, spec)}")
                if not transient or attempt >= self.retry.max_attempts:
                    self.counters.errors += 1
                    what = describe or f"model call {key[:12]}"
                    raise CallFailure(
                        f"{what}: {_describe_error(exc, spec)} (after {attempt} "
                        f"attempt{'s' * (attempt > 1)})", status=status,
                        retry_after=retry_after, transient=transient, attempts=attempt,
                        attempt_errors=errors, cache_key=key) from exc
                self.counters.retries += 1
                self.counters.last_retry = retry_reason(exc, spec, status)
                await asyncio.sleep(self.retry.delay(attempt - 1, retry_after, self._rng))
        completion = Completion(raw, int(usage.get("input_tokens", 0)),
                                int(usage.get("output_tokens", 0)), key, False, attempt, latency,
                                tuple(errors))
        self.counters.model_calls += 1
        self.counters.tokens += completion.input_tokens + completion.output_tokens
        return completion
