"""A deterministic chat model for tests, examples and benchmarks.

It answers by rules over the rendered prompt (regex → text, or a callable), so a test can build
an agent with a known bias: e.g. lower a probability only when the exposure text is present.
Faults (timeouts, 429/500/400 errors, malformed text) can be injected for the first n matching
calls, to exercise retries and parse-failure recording.

Like a model that follows its instructions, a scripted model answers a judge's prompt, which
asks for the answer between verdict markers (`biaslab.agents.verdicts`), with its rule's text
between those markers, unless the text already holds them. A rule that writes more than its
verdict (a judge that quotes what it judged, as real judges do) returns a `Verdict`: only what
it marks as the verdict goes between the markers, so a quoting test double does not put its
quote inside them (a verdict span holds exactly one verdict, or it is a parse failure).

A rule may answer a structured-output request with a dict or a pydantic object: it becomes the
JSON text a model following the schema writes (``json_schema``, ``json_mode``), or, when the
request forces a tool (``function_calling``, LangChain's generic structured output), that
tool's call with those arguments. ``request.schema`` is the JSON schema the request asks for.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import PrivateAttr

from biaslab.agents.structured_output import schema_of, structured_text
from biaslab.agents.tool_answers import Reply, ToolCall, encode_answer
from biaslab.agents.verdicts import answer_in_marker, requested_marker
from biaslab.errors import ModelCallError, UserError

__all__ = ["ScriptedChatModel", "Rule", "Verdict", "Fault", "ScriptedRequest", "register_scripted",
           "resolve_scripted", "Reply", "ToolCall"]


@dataclass(frozen=True)
class ScriptedRequest:
    """What a rule's callable sees."""

    messages: tuple[dict[str, str], ...]
    kwargs: dict[str, Any]
    index: int  # how many calls this model answered before
    _texts: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def _joined(self, what: str, make: Callable[[], str]) -> str:
        """A text made once per request (rules, faults and usage each read it)."""
        text = self._texts.get(what)
        if text is None:
            text = self._texts[what] = make()
        return text

    @property
    def system(self) -> str:
        return self._joined("system", lambda: "\n".join(m["content"] for m in self.messages if m["role"] == "system"))

    @property
    def user(self) -> str:
        return self._joined("user", lambda: "\n".join(m["content"] for m in self.messages if m["role"] == "user"))

    @property
    def text(self) -> str:
        return self._joined("text", lambda: "\n".join(f"{m['role']}: {m['content']}" for m in self.messages))

    @property
    def tools(self) -> list[str]:
        """The names of the tools the request offers (an app's ``bind_tools``)."""
        return [(t.get("function") or t).get("name", "") for t in self.kwargs.get("tools") or ()
                if isinstance(t, dict)]

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON schema the request asks the answer to follow (``response_format``), or
        None for a text request (``{"type": "object"}`` for plain JSON mode)."""
        return schema_of(self.kwargs.get("response_format"))

    @property
    def forced_tool(self) -> str | None:
        """The tool the request makes the model call (``tool_choice`` naming one, or
        ``required``/``any`` with one tool offered), or None."""
        choice = self.kwargs.get("tool_choice")
        if isinstance(choice, dict):
            return (choice.get("function") or {}).get("name") or choice.get("name")
        if choice in ("required", "any") and len(self.tools) == 1:
            return self.tools[0]
        if isinstance(choice, str) and choice in self.tools:
            return choice
        return None

    @property
    def tool_results(self) -> list[str]:
        """The tool results the conversation holds so far, in order (``tool`` turns)."""
        return [m["content"] for m in self.messages if m["role"] == "tool"]


@dataclass(frozen=True)
class Verdict:
    """A judge's answer in parts: `answer` is its verdict, the only part written between the
    markers its prompt asks for; `before` and `after` stand outside them (a quote of what it
    judged, a restatement). `after` may be another `Verdict`: a judge that writes a second
    pair of markers (around a quoted claim, say)."""

    answer: str
    before: str = ""
    after: "str | Verdict" = ""

    def text(self, prompt: str) -> str:
        """The answer as the judge writes it for `prompt` (its markers, where it asks for
        them)."""
        after = self.after.text(prompt) if isinstance(self.after, Verdict) else self.after
        marker = requested_marker(prompt)
        return self.before + (marker.wrap(self.answer) if marker else self.answer) + after


Responder = str | Callable[[ScriptedRequest], Any]
"""A text answer, a `Verdict` (a judge's answer with text outside its markers), a `Reply` with
tool calls or a refusal (an audited app's tool loop), or a dict or pydantic object answering a
structured-output request."""


@dataclass(frozen=True)
class Rule:
    """Answer `respond` when `pattern` matches the prompt text (``role: content`` lines)."""

    pattern: str
    respond: Responder


@dataclass
class Fault:
    """Fail the first `times` calls whose prompt matches `match` (all calls when None).

    kind: ``timeout`` raises TimeoutError; ``429``/``500``/``400`` raise `ModelCallError` with
    that status; ``malformed`` answers `text` instead of the rule's answer.
    """

    kind: Literal["timeout", "429", "500", "503", "400", "malformed"]
    times: int = 1
    match: str | None = None
    retry_after: float | None = None
    text: str = "Sorry, I can't help with that."
    seen: int = field(default=0, compare=False)


def _as_dict(message: BaseMessage) -> dict[str, str]:
    role = {"human": "user", "ai": "assistant"}.get(message.type, message.type)
    return {"role": role, "content": str(message.content)}


class ScriptedChatModel(BaseChatModel):
    """Rules are tried in order; the first match answers. No match uses `default` or fails."""

    rules: list[Any] = []
    default: Any = None
    latency_s: float = 0.0
    faults: list[Any] = []
    name_: str = "scripted"
    answers_in_markers: bool = True
    """Whether a judge's answer is put between the markers its prompt asks for (module
    docstring); an answer sheet, whose recorded answers hold them already, says False."""
    _count: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return "biaslab-scripted"

    @property
    def calls_answered(self) -> int:
        """How many calls reached this model (faults included)."""
        return self._count

    def _text(self, messages: Sequence[dict[str, str]], kwargs: dict[str, Any]
              ) -> tuple[str, dict[str, int]]:
        """The answer's text and token usage for role/content messages (faults applied)."""
        counter = self.__pydantic_private__  # (a private attribute, read and set without pydantic)
        request = ScriptedRequest(tuple(messages), dict(kwargs), counter["_count"])
        counter["_count"] += 1
        text = None
        for fault in self.faults:
            if fault.seen >= fault.times:
                continue
            if fault.match is not None and not re.search(fault.match, request.text):
                continue
            fault.seen += 1
            if fault.kind == "timeout":
                raise TimeoutError("scripted timeout")
            if fault.kind == "malformed":
                text = fault.text
                break
            status = int(fault.kind)
            raise ModelCallError(f"scripted HTTP {status}", status=status,
                                 retry_after=fault.retry_after, transient=status == 429 or status >= 500)
        if text is None:
            text = self._respond(request)
            structured = None if isinstance(text, (str, Reply, Verdict)) \
                else structured_text(text)
            if isinstance(text, Verdict):
                text = text.text(request.user)
            elif structured is not None:  # a schema's answer: its JSON, or the forced tool's call
                forced = request.forced_tool
                text = Reply(tool_calls=[ToolCall(forced, json.loads(structured), "call_1")]) \
                    if forced else structured
            elif self.answers_in_markers and not isinstance(text, Reply):
                text = answer_in_marker(request.user, text)
        if isinstance(text, Reply):  # tool calls or a refusal, as one text (agents.tool_answers)
            text = encode_answer(text.content, text.tool_calls, text.refusal)
        usage = {"input_tokens": max(1, len(request.text) // 4),
                 "output_tokens": max(1, len(text) // 4)}
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        return text, usage

    async def acomplete(self, messages: Sequence[dict[str, str]], kwargs: dict[str, Any]
                        ) -> tuple[str, dict[str, int]]:
        """What the gateway calls: `_agenerate` without LangChain messages and results, so a
        benchmark on this model measures biaslab, not message-object construction."""
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return self._text(messages, kwargs)

    def _answer(self, messages: Sequence[BaseMessage], kwargs: dict[str, Any]) -> ChatResult:
        text, usage = self._text([_as_dict(m) for m in messages], kwargs)
        message = AIMessage(content=text, usage_metadata=usage,
                            response_metadata={"model_name": self.name_, "finish_reason": "stop"})
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _respond(self, request: ScriptedRequest) -> str:
        for rule in self.rules:
            if re.search(rule.pattern, request.text, flags=re.S):
                return rule.respond(request) if callable(rule.respond) else rule.respond
        if self.default is None:
            raise ModelCallError(f"scripted model '{self.name_}': no rule matches the prompt "
                                 f"{request.text[:120]!r}", status=400)
        return self.default(request) if callable(self.default) else self.default

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        if self.latency_s:
            time.sleep(self.latency_s)
        return self._answer(messages, kwargs)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return self._answer(messages, kwargs)


_REGISTRY: dict[str, Callable[[], ScriptedChatModel]] = {}
_WITH_OPTION: dict[str, Callable[[str], ScriptedChatModel]] = {}


def register_scripted(name: str, factory: Callable[[], ScriptedChatModel], *,
                      with_option: Callable[[str], ScriptedChatModel] | None = None) -> None:
    """Make ``scripted:<name>`` resolve to a fresh model from `factory`.

    `with_option` lets one spec string set a knob of the fake (an injected effect size, say):
    ``scripted:<name>@<text>`` resolves to ``with_option(text)``, which raises `UserError` on a
    text it cannot read. The whole string names the model, so each setting has its own label
    and cache key."""
    _REGISTRY[name] = factory
    if with_option is not None:
        _WITH_OPTION[name] = with_option


def resolve_scripted(name: str) -> ScriptedChatModel:
    """``scripted:<name>``: a registered factory (``<name>@<option>`` where it takes one), or
    an importable ``module:function``."""
    if name in _REGISTRY:
        return _REGISTRY[name]()
    base, at, option = name.partition("@")
    if at and base == "answer-sheet":  # recorded answers, for judge sensitivity
        from biaslab.agents.providers.answer_sheet import answer_sheet_model
        return answer_sheet_model(option)
    if at and base in _WITH_OPTION:
        return _WITH_OPTION[base](option)
    if at and base in _REGISTRY:
        raise UserError(f"scripted model '{base}' takes no '@' option (got '{name}')")
    module_name, _, attr = name.partition(":")
    if attr:
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise UserError(f"scripted model '{name}': cannot import it ({exc})") from None
        return factory()
    # Protocols register their synthetic agents when they are loaded; loading them is the job
    # of the layer that resolves a run's models (the plan, the CLI), never of this one.
    raise UserError(f"unknown scripted model '{name}' (registered: {sorted(_REGISTRY)}; "
                    "or give module:function)")
