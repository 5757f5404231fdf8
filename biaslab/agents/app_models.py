"""Every chat-model call of an audited app, routed through biaslab's gateway.

An app under audit builds its own chat models (a ``ChatOpenAI`` at import, ``init_chat_model``
in a factory, a model inside a node) and calls them any way LangChain allows: ``invoke``,
``ainvoke``, ``stream``, ``astream``, ``batch``, through ``bind_tools`` or
``with_structured_output``. All of these end in one of two methods of LangChain's
``BaseChatModel``: ``_generate_with_cache`` (sync) or ``_agenerate_with_cache`` (async), once
streaming is turned off. While a cell of the app runs (`intercepting`), both are replaced on
the base class, so whatever class the app built and wherever it built it, the call

1. is attributed to the app's node by LangGraph's run metadata: the node's name
   (``langgraph_node``) with the names of the subgraphs above it, read from
   ``langgraph_checkpoint_ns`` (``team/member``);
2. gets the cell's exposures and mitigations for that node, at their positions;
3. goes to the cell's model for that node (the model axis, or ``[nodes.NAME]``) through the
   gateway: cached, retried, counted, replayable, recorded as a `CallRecord`;
4. comes back to the app as the ``AIMessage`` it expects, tool calls included, and for a
   structured-output request what langchain-openai would add (``parsed``, ``refusal``;
   `biaslab.agents.structured_output`).

The app's own endpoint is never contacted: its model object is only read for its name in
errors. A call made while the patch is on but outside any audited cell (another thread that
did not inherit the cell's context) is refused rather than sent. Nothing stays patched once
no audited cell runs. Calls through other clients (the OpenAI SDK, raw HTTP) take the same
`answer_call` from `biaslab.agents.app_egress`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from biaslab.agents.app_threads import roomy_default_executor
from biaslab.agents.ask import call_seed, complete_recorded
from biaslab.agents.class_patch import ClassPatch
from biaslab.agents.context import CellContext
from biaslab.agents.structured_output import openai_answer_fields, response_format_param
from biaslab.agents.tool_answers import decode_answer, openai_tool_calls, refusal_of
from biaslab.errors import ModelCallError
from biaslab.prompts.exposure import apply_exposures
from biaslab.traces.cache import CachedResponse
from biaslab.traces.records import CallRecord

__all__ = ["AppCalls", "AppAnswer", "answer_call", "active_calls", "intercepting",
           "to_openai_messages", "message_text", "node_path", "APP_PROMPT", "REQUEST_KEYS"]

APP_PROMPT = "app_audit/app_node"
"""The prompt id an app's node is recorded under: its prompt is the app's own, not biaslab's."""

REQUEST_KEYS = ("tools", "tool_choice", "parallel_tool_calls", "response_format", "stop",
                "strict")
"""Request arguments of the app's call that are part of the recorded call and its cache key
(what ``bind_tools`` and ``with_structured_output`` bind); others (callbacks, tracing
labels) are no part of what the model is asked."""


@dataclass
class AppCalls:
    """One cell of an audited app: where its calls go and what they were.

    Attributes:
        ctx: the cell's context (model bindings, arm, gateway, trace buffer).
        loop: the event loop the gateway runs on (sync calls from worker threads use it).
        prefix: the checkpoint namespace the app is invoked in (biaslab's own wrapper node's,
            or "" where the app runs as a top-level graph); calls' namespaces below it name
            the app's nodes.
        nodes: node path → calls made, in order of first call (the discovery pass reads it).
    """

    ctx: CellContext
    loop: asyncio.AbstractEventLoop
    prefix: str = ""
    nodes: dict[str, int] = field(default_factory=dict)
    recorded: Any = None
    """The answers the item's trace recorded (`biaslab.traces.imported.RecordedAnswers`),
    when the audit's items come from a trace file: a call identical to a recorded one is
    answered from it (`Gateway.seed`)."""
    _seen: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        roomy_default_executor(self.loop)  # sync nodes wait on it (agents.app_threads)

    def sample_of(self, node: str, request: str) -> int:
        """The how-many-th identical request of `node` this is in the cell: a node asking the
        same thing twice (self-consistency) gets two samples, not one cached answer twice."""
        key = f"{node}\x00{request}"
        with self._lock:
            n = self._seen.get(key, 0)
            self._seen[key] = n + 1
            self.nodes[node] = self.nodes.get(node, 0) + 1
        return n


_ACTIVE: contextvars.ContextVar[AppCalls | None] = contextvars.ContextVar(
    "biaslab_app_calls", default=None)


def node_path(metadata: Mapping[str, Any] | None, prefix: str = "") -> str:
    """The app node a call belongs to: subgraph names and the node's, joined by ``/``, below
    the namespace `prefix` the app was invoked in."""
    metadata = metadata or {}
    ns = str(metadata.get("langgraph_checkpoint_ns") or metadata.get("checkpoint_ns") or "")
    segments = [segment for segment in ns.split("|") if segment]
    above = [segment for segment in prefix.split("|") if segment]
    if segments[:len(above)] == above:
        segments = segments[len(above):]
    parts = [segment.partition(":")[0] for segment in segments]
    node = metadata.get("langgraph_node")
    if node and (not parts or parts[-1] != node):
        parts.append(str(node))
    return "/".join(parts) or "(outside any node)"


def message_text(content: Any) -> str:
    """A message's content as text: a string as it is, content blocks or parts (LangChain's,
    or the chat-completions wire's) as their text, in order."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks: their text, in order
        return "".join(b if isinstance(b, str) else str(b.get("text", "")) if isinstance(b, dict)
                       else str(b) for b in content)
    return "" if content is None else str(content)


def to_openai_messages(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as the chat completions shape the gateway records and sends."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool",
                "developer": "system", "chat": getattr(m, "role", "user")}.get(m.type, m.type)
        turn: dict[str, Any] = {"role": role, "content": message_text(m.content)}
        if m.type == "ai" and getattr(m, "tool_calls", None):
            turn["tool_calls"] = openai_tool_calls(m.tool_calls)
        if m.type == "tool":
            turn["tool_call_id"] = str(getattr(m, "tool_call_id", ""))
        out.append(turn)
    return out


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _request_args(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key in REQUEST_KEYS:
        value = kwargs.get(key)
        if value is None:
            continue
        if key == "response_format":  # the form the OpenAI API takes (structured_output)
            value = response_format_param(value)
        out[key] = _jsonable(value)
    return out


@dataclass(frozen=True)
class AppAnswer:
    """What the gateway answered one app call, for any client to shape as it expects."""

    content: str
    tool_calls: list[dict[str, Any]]
    input_tokens: int
    output_tokens: int
    cache_key: str
    sample: int
    model: str
    refusal: str | None = None


async def answer_call(calls: AppCalls, node: str, step: Any, sent: list[dict[str, Any]],
                      request: Mapping[str, Any], source: str) -> AppAnswer:
    """One model call of app node `node`, whatever client made it: `sent` (chat completions
    messages) with the node's exposures and mitigations, the cell's model for the node, the
    app's `request` arguments (`REQUEST_KEYS`, JSON already), through the gateway, recorded
    with `source` (``app:<client>``) as its prompt source."""
    ctx = calls.ctx
    exposures = ctx.condition.exposures_for(node)
    mitigations = tuple(m for m in ctx.condition.mitigations_for(node) if not m.after_answer)
    texts = [(e.position, e.text(ctx.prompts)) for e in exposures]
    texts += [(m.position, m.text(ctx.prompts)) for m in mitigations]
    if texts:
        sent = apply_exposures(sent, texts)
    spec = ctx.bindings.model_for(node)
    params: dict[str, Any] = {"max_tokens": spec.max_tokens, "seed": call_seed(ctx.seed, node, 0)}
    if spec.temperature is not None:
        params["temperature"] = spec.temperature
    params.update(request)
    request_text = json.dumps([sent, params], sort_keys=True, default=str)
    sample = calls.sample_of(node, request_text)
    if calls.recorded is not None:  # an audit of traced items: the trace answers what it holds
        found = calls.recorded.answer(node, spec.label, sent, sample)
        if found is not None:
            ctx.gateway.seed(spec, sent, params, sample, CachedResponse(
                found.answer, found.input_tokens or 0, found.output_tokens or 0))
    record = CallRecord(cell_id=ctx.cell_id, node=node, item=f"step-{step}" if step else "",
                        sample=sample, seed=params["seed"], exposure_id=ctx.condition.id,
                        exposed=bool(exposures),
                        exposure_prompts=[f"{ctx.prompts.get(e.template).ref}@"
                                          f"{ctx.prompts.get(e.template).content_hash}"
                                          for e in exposures],
                        prompt_id=APP_PROMPT, prompt_source=source,
                        messages=sent, model=ctx.gateway.public(spec), params=params)
    describe = f"app node '{node}' call {sample} in cell {ctx.cell_id}"
    done = await complete_recorded(ctx, spec, record, sample, describe)
    content, tool_calls = decode_answer(done.raw)
    refusal = refusal_of(done.raw)
    record.parsed = {"tool_calls": tool_calls} if tool_calls else \
        {"refusal": refusal} if refusal else None
    ctx.calls.append(record)
    return AppAnswer(content, tool_calls, done.input_tokens, done.output_tokens,
                     done.cache_key, sample, spec.label, refusal)


async def _complete(calls: AppCalls, model: BaseChatModel, messages: list[BaseMessage],
                    stop: list[str] | None, metadata: Mapping[str, Any] | None,
                    kwargs: Mapping[str, Any]) -> ChatResult:
    answer = await answer_call(calls, node_path(metadata, calls.prefix),
                               (metadata or {}).get("langgraph_step"),
                               to_openai_messages(messages),
                               _request_args({**kwargs, "stop": stop}),
                               f"app:{type(model).__name__}")
    usage = {"input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens,
             "total_tokens": answer.input_tokens + answer.output_tokens}
    tool_calls = answer.tool_calls
    # what langchain-openai would add for a structured-output request (parsed, refusal)
    extra, meta = openai_answer_fields(model, kwargs.get("response_format"), answer.content,
                                       answer.refusal)
    message = AIMessage(content=answer.content,
                        id=f"biaslab-{answer.cache_key[:16]}-{answer.sample}",
                        tool_calls=[{"id": c["id"], "name": c["name"], "args": c["args"],
                                     "type": "tool_call"} for c in tool_calls],
                        additional_kwargs=extra, usage_metadata=usage,
                        response_metadata={"model_name": answer.model,
                                           "finish_reason": "tool_calls" if tool_calls
                                           else "stop", **meta})
    return ChatResult(generations=[ChatGeneration(message=message)])


def active_calls() -> AppCalls | None:
    """The audited cell the running code belongs to (None outside any, or in a thread that
    did not inherit one's context)."""
    return _ACTIVE.get()


def _active(model: BaseChatModel) -> AppCalls:
    calls = _ACTIVE.get()
    if calls is None:
        raise ModelCallError(f"{type(model).__name__} was called outside an audited cell (a "
                             "thread that did not inherit the cell's context); biaslab "
                             "refuses to let it reach the app's own endpoint", status=400)
    return calls


def _metadata(run_manager: Any) -> Mapping[str, Any] | None:
    return getattr(run_manager, "metadata", None) if run_manager is not None else None


async def _agenerate_with_cache(self, messages, stop=None, run_manager=None, **kwargs):
    return await _complete(_active(self), self, messages, stop, _metadata(run_manager), kwargs)


def _generate_with_cache(self, messages, stop=None, run_manager=None, **kwargs):
    calls = _active(self)
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is calls.loop:
        raise ModelCallError(f"a sync {type(self).__name__}.invoke inside an async node of "
                             "the app would block the event loop the call needs; use "
                             "ainvoke there (sync nodes may call invoke)", status=400)
    future = asyncio.run_coroutine_threadsafe(
        _complete(calls, self, messages, stop, _metadata(run_manager), kwargs), calls.loop)
    return future.result()


def _no_streaming(self, **kwargs) -> bool:
    return False  # stream/astream fall back to (a)invoke, which the patch answers


_PATCHES = {"_agenerate_with_cache": _agenerate_with_cache,
            "_generate_with_cache": _generate_with_cache,
            "_should_stream": _no_streaming,
            "_should_use_protocol_streaming": _no_streaming}


_PATCH = ClassPatch(BaseChatModel, _PATCHES)


@contextlib.contextmanager
def intercepting(calls: AppCalls) -> Iterator[AppCalls]:
    """Route the chat-model calls made in this block (and in tasks and threads started from
    it with its context) to `calls`' cell."""
    _PATCH.install()
    token = _ACTIVE.set(calls)
    try:
        yield calls
    finally:
        _ACTIVE.reset(token)
        _PATCH.uninstall()
