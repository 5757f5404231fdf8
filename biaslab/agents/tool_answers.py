"""Answers with tool calls, as one text: what the gateway caches, records and replays.

biaslab's gateway, cache and records hold a call's answer as text (``raw``). An audited app's
model may answer with tool calls instead of (or beside) text; such an answer is kept as one
JSON object under a key no model writes by chance::

    {"biaslab_tool_calls": [{"id": "call_1", "name": "lookup", "args": {"q": "x"}}],
     "content": ""}

so the cache key, the cache entry and the record of a tool-calling answer are as exact as those
of a text answer, and a strict replay hands the app the very same tool calls. A refusal of a
structured-output request (OpenAI's ``message.refusal``) is kept the same way, as
``{"biaslab_refusal": "I can't help with that.", "content": ""}``, so the app gets it back as
a refusal, never as text to parse. Plain text answers stay plain text. Requests use OpenAI's chat message shape (``role``, ``content``,
``tool_calls``, ``tool_call_id``), which the OpenAI-compatible endpoints take as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["ToolCall", "Reply", "encode_answer", "decode_answer", "refusal_of",
           "openai_tool_calls", "from_openai_tool_calls", "TOOL_CALLS_KEY", "REFUSAL_KEY"]

TOOL_CALLS_KEY = "biaslab_tool_calls"
REFUSAL_KEY = "biaslab_refusal"


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an answer: the tool's name, its arguments and the call's id."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    id: str = ""


@dataclass(frozen=True)
class Reply:
    """What a scripted model answers when it calls tools or refuses a structured-output
    request (a plain string answers text; a dict or a pydantic object answers a schema)."""

    content: str = ""
    tool_calls: Sequence[ToolCall] = ()
    refusal: str | None = None


def encode_answer(content: str, tool_calls: Sequence[Mapping[str, Any] | ToolCall],
                  refusal: str | None = None) -> str:
    """The answer as the gateway keeps it: `content` alone when there is no tool call and no
    refusal."""
    if refusal:
        return json.dumps({REFUSAL_KEY: str(refusal), "content": content or ""},
                          sort_keys=True, ensure_ascii=False)
    if not tool_calls:
        return content
    calls = []
    for i, call in enumerate(tool_calls):
        if isinstance(call, ToolCall):
            call = {"id": call.id, "name": call.name, "args": dict(call.args)}
        calls.append({"id": call.get("id") or f"call_{i + 1}", "name": call["name"],
                      "args": dict(call.get("args") or {})})
    return json.dumps({TOOL_CALLS_KEY: calls, "content": content or ""}, sort_keys=True,
                      ensure_ascii=False)


def refusal_of(raw: str) -> str | None:
    """The refusal a kept answer holds, or None."""
    if raw.startswith("{") and REFUSAL_KEY in raw:
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if isinstance(data, dict) and isinstance(data.get(REFUSAL_KEY), str):
            return data[REFUSAL_KEY]
    return None


def decode_answer(raw: str) -> tuple[str, list[dict[str, Any]]]:
    """(text, tool calls as ``{"id", "name", "args"}``) of a kept answer (a refusal's text is
    its ``content``, usually empty: read the refusal with `refusal_of`)."""
    if refusal_of(raw) is not None:
        return str(json.loads(raw).get("content") or ""), []
    if raw.startswith("{") and TOOL_CALLS_KEY in raw:
        try:
            data = json.loads(raw)
        except ValueError:
            return raw, []
        if isinstance(data, dict) and isinstance(data.get(TOOL_CALLS_KEY), list):
            return str(data.get("content") or ""), list(data[TOOL_CALLS_KEY])
    return raw, []


def openai_tool_calls(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``{"id", "name", "args"}`` calls in the chat completions request shape."""
    return [{"id": c.get("id") or "", "type": "function",
             "function": {"name": c["name"],
                          "arguments": json.dumps(c.get("args") or {}, sort_keys=True,
                                                  ensure_ascii=False)}} for c in calls]


def from_openai_tool_calls(calls: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """A chat completion's ``tool_calls`` as ``{"id", "name", "args"}`` (arguments that are
    not a JSON object are kept under ``{"__raw__": text}``, never dropped)."""
    out = []
    for call in calls or ():
        function = call.get("function") or {}
        text = function.get("arguments") or "{}"
        try:
            args = json.loads(text) if isinstance(text, str) else dict(text)
        except ValueError:
            args = {"__raw__": text}
        if not isinstance(args, dict):
            args = {"__raw__": text}
        out.append({"id": call.get("id") or "", "name": function.get("name") or "",
                    "args": args})
    return out
