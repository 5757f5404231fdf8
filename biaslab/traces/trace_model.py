"""The typed shape of a trace recorded elsewhere (`biaslab.traces.imported`), its named gaps,
and the small readings both formats share (roles, text parts, parameters, counts).

Whatever a file does not carry is a *gap*, counted by name (`GAP_NAMES`) through `counted`,
never filled in by a guess."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

__all__ = ["GAP_NAMES", "UNATTRIBUTED", "TracedCall", "Trace", "ImportedTraces", "json_or",
           "role_of", "text_of_parts", "sampling_params", "as_int", "first_int", "counted",
           "item_of", "when_of"]


GAP_NAMES = {
    "root": "no root span/run in the trace (its input and output are unknown)",
    "item": "the root's input is not a JSON object of the app's input keys",
    "output": "the root carries no output",
    "node": "a model call carries no LangGraph node (langgraph_node metadata)",
    "model": "a model call names no model",
    "messages": "a model call carries no input messages",
    "answer": "a model call carries no answer",
    "params": "a model call carries no invocation parameters",
    "input_tokens": "a model call carries no input token count",
    "output_tokens": "a model call carries no output token count",
}
"""Each gap's name and what it means (the import prints the counts with these words)."""


UNATTRIBUTED = "unattributed"
"""The node name of a model call whose trace names no node (counted as the ``node`` gap)."""


@dataclass(frozen=True)
class TracedCall:
    """One recorded model call, in the order the app made it."""

    node: str
    """The LangGraph node that made it (`UNATTRIBUTED` when the trace does not say)."""
    messages: list[dict[str, Any]]
    """OpenAI chat shape: ``role`` and ``content`` (and ``tool_calls``/``tool_call_id``)."""
    params: dict[str, Any]
    model: str
    """The model's name as recorded ("" when absent: a gap)."""
    answer: str | None
    input_tokens: int | None
    output_tokens: int | None
    start: str = ""
    """The recorded start time (sort key within a trace)."""


@dataclass(frozen=True)
class Trace:
    """One traced conversation: the app's input (an item), its final output, its model calls."""

    trace_id: str
    item: dict[str, Any] | None
    output: Any
    calls: tuple[TracedCall, ...]
    start: str = ""
    tags: tuple[str, ...] = ()
    """The root's tags (OpenInference's ``tag.tags``, LangSmith's ``tags``)."""

    @property
    def started(self) -> datetime | None:
        """When the trace began (UTC), read from its recorded start; None when unknown."""
        return when_of(self.start)


@dataclass
class ImportedTraces:
    """What a trace file holds, with what it lacks counted by name (see `GAP_NAMES`)."""

    format: str
    traces: list[Trace]
    gaps: Counter = field(default_factory=Counter)


def json_or(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


_ROLES = {"human": "user", "ai": "assistant", "chat": "user", "function": "tool",
          "humanmessage": "user", "aimessage": "assistant", "systemmessage": "system",
          "toolmessage": "tool", "model": "assistant"}


def role_of(role: Any) -> str:
    role = str(role or "").lower()
    return _ROLES.get(role, role)


def text_of_parts(content: Any) -> str:
    """GenAI ``parts`` ([{type: text, content}]) or a plain content as text."""
    if isinstance(content, list):
        return "".join(str(p.get("content", p.get("text", ""))) for p in content
                       if isinstance(p, dict) and p.get("type", "text") == "text")
    return "" if content is None else str(content)


_SECRET = re.compile(r"(?i)(api[_-]?key|secret|password|passwd|authori[sz]ation|bearer|"
                     r"access[_-]?token|credential)")


def sampling_params(params: dict[str, Any]) -> dict[str, Any]:
    """Invocation parameters without LangChain's class tag (``_type``), unset (None) values
    and anything named like a credential (an API key, a token): what was sent, not how the
    client was built, and never a secret in a run."""
    return {k: v for k, v in params.items()
            if k != "_type" and v is not None and not _SECRET.search(k)}


def as_int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and value != "" else None
    except (TypeError, ValueError):
        return None


def counted(call: TracedCall, gaps: Counter, *, no_node: bool, no_params: bool
             ) -> TracedCall:
    """`call`, its gaps counted (parameters recorded as empty are no gap: none were set)."""
    for name, missing in (("node", no_node), ("model", not call.model),
                          ("messages", not call.messages), ("answer", call.answer is None),
                          ("params", no_params),
                          ("input_tokens", call.input_tokens is None),
                          ("output_tokens", call.output_tokens is None)):
        if missing:
            gaps[name] += 1
    return call


def item_of(value: Any, gaps: Counter) -> dict[str, Any] | None:
    value = json_or(value)
    if isinstance(value, dict):
        return value
    gaps["item"] += 1
    return None


def first_int(*values: Any) -> int | None:
    return next((v for v in map(as_int, values) if v is not None), None)


def when_of(start: str) -> datetime | None:
    """A recorded start as UTC: OTLP's nanoseconds since the epoch, or an ISO timestamp."""
    text = start.strip()
    if text.isdigit():
        return datetime.fromtimestamp(int(text) / 1e9, tz=timezone.utc) if int(text) else None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
