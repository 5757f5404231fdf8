"""The one path every model call takes: cache → replay source → rate limit → retry → model.

Keeping this in one place is what makes runs cheap to redo: any call whose content address is
already known (in this run, a shared cache, or a replayed trace) is answered without a model,
and identical calls in flight at the same time are paid for once.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from biaslab.agents.providers import ModelSpec, build_chat_model
from biaslab.errors import ModelCallError, ReplayMiss
from biaslab.traces.cache import CachedResponse, CallCache, cache_key

__all__ = ["Gateway", "Completion", "RetryPolicy", "RunCounters", "classify_error", "ReplayMode"]

ReplayMode = Literal["live", "strict", "offline"]
_LC = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter for transient failures.

    Timeouts, 429 (waiting at least its Retry-After) and 5xx are retried; other 4xx are not.
    """

    max_attempts: int = 5
    base_s: float = 0.5
    max_s: float = 30.0

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        backoff = rng.uniform(0, min(self.max_s, self.base_s * 2 ** attempt))
        return max(backoff, retry_after or 0.0)


def classify_error(exc: BaseException) -> tuple[bool, int | None, float | None]:
    """(transient, status, retry_after) for an exception raised by a provider."""
    if isinstance(exc, ModelCallError):
        return exc.transient, exc.status, exc.retry_after
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return True, None, None
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    retry_after = None
    if response is not None:
        try:
            retry_after = float(response.headers.get("retry-after"))
        except (TypeError, ValueError, AttributeError):
            retry_after = None
    if status is None and type(exc).__name__ in ("APIConnectionError", "APITimeoutError"):
        return True, None, None
    if isinstance(status, int):
        return status in (408, 429) or status >= 500, status, retry_after
    return False, None, None


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


@dataclass(frozen=True)
class Completion:
    raw: str
    input_tokens: int
    output_tokens: int
    cache_key: str
    cache_hit: bool
    attempts: int
    latency_s: float


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

    def __post_init__(self):
        self._models: dict[ModelSpec, Any] = {}
        self._limiters: dict[str, _RateLimiter] = {}
        self._inflight: dict[str, asyncio.Future] = {}
        self._semaphore: asyncio.Semaphore | None = None
        # Jitter must differ between processes sharing an endpoint, or they retry in lockstep.
        self._rng = random.Random()

    def model(self, spec: ModelSpec):
        if spec not in self._models:
            self._models[spec] = build_chat_model(spec)
        return self._models[spec]

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
        else:
            cache.put(key, response, model or {})

    async def complete(self, spec: ModelSpec, messages: list[dict[str, str]],
                       params: dict[str, Any], sample: int, *, describe: str = "") -> Completion:
        """One call by content address. `describe` names the call in errors."""
        key = cache_key(spec.identity(), messages, params, sample)
        self.counters.calls += 1
        hit = self._lookup(key)
        if hit is None and key in self._inflight:
            hit = await asyncio.shield(self._inflight[key])
        if hit is not None:
            self.counters.cache_hits += 1
            return Completion(hit.raw, hit.input_tokens, hit.output_tokens, key, True, 0, 0.0)
        if self.mode == "strict":
            raise ReplayMiss(f"strict replay: the source trace has no call for {describe} "
                             f"(cache key {key[:12]})")
        if self.mode == "offline":
            raise ReplayMiss(f"rescoring makes no model calls, but {describe} was not recorded")
        future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            completion = await self._call_model(spec, messages, params, key)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters re-raise it, nobody else must
            raise
        finally:
            self._inflight.pop(key, None)
        response = CachedResponse(completion.raw, completion.input_tokens, completion.output_tokens)
        future.set_result(response)
        for cache in self.caches:
            self._store(cache, key, response, spec.identity())
        return completion

    async def _call_model(self, spec: ModelSpec, messages, params, key) -> Completion:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.concurrency)
        model = self.model(spec)
        lc_messages = [_LC[m["role"]](content=m["content"]) for m in messages]
        kwargs = {k: v for k, v in params.items() if v is not None}
        if spec.provider not in ("local", "scripted"):
            kwargs.pop("grammar", None)
            kwargs.pop("json_schema", None)
        limiter = None
        if spec.rps:
            limiter = self._limiters.setdefault(spec.endpoint, _RateLimiter(spec.rps))
        attempt = 0
        while True:
            attempt += 1
            try:
                async with self._semaphore:
                    if limiter:
                        await limiter.wait()
                    started = time.monotonic()
                    message = await asyncio.wait_for(model.ainvoke(lc_messages, **kwargs),
                                                     timeout=spec.timeout_s)
                    latency = time.monotonic() - started
                break
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:  # classified below; bugs are re-raised as-is
                transient, status, retry_after = classify_error(exc)
                if not transient and status is None and not isinstance(exc, ModelCallError):
                    raise
                if not transient or attempt >= self.retry.max_attempts:
                    self.counters.errors += 1
                    raise ModelCallError(f"{type(exc).__name__}: {exc} (after {attempt} "
                                         f"attempt{'s' * (attempt > 1)})", status=status,
                                         transient=transient) from exc
                self.counters.retries += 1
                await asyncio.sleep(self.retry.delay(attempt - 1, retry_after, self._rng))
        usage = getattr(message, "usage_metadata", None) or {}
        raw = message.content if isinstance(message.content, str) else str(message.content)
        completion = Completion(raw, int(usage.get("input_tokens", 0)),
                                int(usage.get("output_tokens", 0)), key, False, attempt, latency)
        self.counters.model_calls += 1
        self.counters.tokens += completion.input_tokens + completion.output_tokens
        return completion
