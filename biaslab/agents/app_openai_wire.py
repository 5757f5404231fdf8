"""OpenAI's wire format, both ways, for the app calls biaslab answers below LangChain.

An app that calls the OpenAI SDK or POSTs to an OpenAI-compatible endpoint itself sends a JSON
body and expects a JSON body (or a server-sent event stream) back. `app_egress` answers such a
request through the gateway; this module reads the request (chat completions or the Responses
API) into the chat completions messages and request arguments the gateway records, and writes
the gateway's answer as the endpoint would have: a ``chat.completion`` with ``choices``,
``usage`` and ``tool_calls``, its ``chat.completion.chunk`` stream, or a ``response`` object
and its events. Ids are derived from the call's cache key, and timestamps are 0, so a strict
replay hands the app byte-identical answers.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from biaslab.agents.app_models import REQUEST_KEYS, AppAnswer, message_text
from biaslab.agents.tool_answers import openai_tool_calls

__all__ = ["BadRequest", "chat_request", "chat_completion", "chat_stream", "responses_request",
           "response_object", "response_stream"]


class BadRequest(ValueError):
    """A body biaslab cannot read as a model call (the cell fails, saying why)."""


def _body(raw: bytes | str | None) -> dict[str, Any]:
    try:
        data = json.loads(raw or b"")
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise BadRequest("the body is not a JSON object")
    return data


def chat_request(raw: bytes | str | None) -> tuple[list[dict[str, Any]], dict[str, Any], bool]:
    """(messages, request arguments, whether a stream is asked for) of a chat completions
    body. The app's own model name and sampling settings are not kept: the cell's model
    spec's are sent, as for LangChain calls."""
    data = _body(raw)
    turns = data.get("messages")
    if not isinstance(turns, list) or not turns:
        raise BadRequest("a chat completions body needs a non-empty 'messages' list")
    messages = []
    for turn in turns:
        if not isinstance(turn, dict) or "role" not in turn:
            raise BadRequest("each message needs a 'role'")
        role = "system" if turn["role"] == "developer" else str(turn["role"])
        out: dict[str, Any] = {"role": role, "content": message_text(turn.get("content"))}
        if turn.get("tool_calls"):
            out["tool_calls"] = turn["tool_calls"]
        if role == "tool":
            out["tool_call_id"] = str(turn.get("tool_call_id", ""))
        messages.append(out)
    request = {k: data[k] for k in REQUEST_KEYS if data.get(k) is not None}
    return messages, request, bool(data.get("stream"))


def _usage(answer: AppAnswer) -> dict[str, int]:
    return {"prompt_tokens": answer.input_tokens, "completion_tokens": answer.output_tokens,
            "total_tokens": answer.input_tokens + answer.output_tokens}


def _id(answer: AppAnswer, prefix: str) -> str:
    return f"{prefix}-biaslab-{answer.cache_key[:16]}-{answer.sample}"


def chat_completion(answer: AppAnswer) -> dict[str, Any]:
    """The answer as a ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content,
                               "refusal": None}
    if answer.tool_calls:
        message["tool_calls"] = openai_tool_calls(answer.tool_calls)
        message["content"] = answer.content or None
    return {"id": _id(answer, "chatcmpl"), "object": "chat.completion", "created": 0,
            "model": answer.model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if answer.tool_calls else "stop"}],
            "usage": _usage(answer)}


def _sse(events: list[tuple[str | None, dict[str, Any]]]) -> bytes:
    out = []
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        out.append(f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n")
    return "".join(out).encode()


def chat_stream(answer: AppAnswer) -> bytes:
    """The answer as the server-sent events of a streamed chat completion: the text in one
    chunk, each tool call in one, then the finish reason with the usage, then ``[DONE]``."""
    head = {"id": _id(answer, "chatcmpl"), "object": "chat.completion.chunk", "created": 0,
            "model": answer.model}
    first = {"role": "assistant", "content": answer.content}
    chunks = [{**head, "choices": [{"index": 0, "delta": first, "logprobs": None,
                                    "finish_reason": None}]}]
    for i, call in enumerate(openai_tool_calls(answer.tool_calls)):
        chunks.append({**head, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": i, **call}]}, "logprobs": None, "finish_reason": None}]})
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                        "finish_reason": "tool_calls" if answer.tool_calls
                                        else "stop"}], "usage": _usage(answer)})
    return _sse([(None, c) for c in chunks]) + b"data: [DONE]\n\n"


# -- the Responses API -----------------------------------------------------------------------------


def _responses_tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for tool in tools or ():
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise BadRequest(f"only function tools can be audited, not {tool!r:.80}")
        out.append({"type": "function", "function": {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}})
    return out


def responses_request(raw: bytes | str | None
                      ) -> tuple[list[dict[str, Any]], dict[str, Any], bool]:
    """(messages, request arguments, stream?) of a Responses API body, in chat completions
    form: ``instructions`` a system turn, ``input`` text a user turn, input items as turns
    (function calls and their outputs as tool calls and tool turns), function tools as chat
    tools, a ``text.format`` JSON schema as a ``response_format``."""
    data = _body(raw)
    if data.get("previous_response_id"):
        raise BadRequest("previous_response_id (a conversation kept by the endpoint) cannot be "
                         "audited: send the turns as input")
    messages: list[dict[str, Any]] = []
    if data.get("instructions"):
        messages.append({"role": "system", "content": message_text(data["instructions"])})
    items = data.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequest("a Responses API body needs 'input' (text or a list of items)")
    for item in items:
        if not isinstance(item, dict):
            raise BadRequest("each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item.get("role") == "developer" else str(item.get("role", "user"))
            messages.append({"role": role, "content": message_text(item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id", ""), "type": "function",
                    "function": {"name": item.get("name", ""),
                                 "arguments": item.get("arguments", "{}")}}
            if messages and messages[-1]["role"] == "assistant" and \
                    "tool_calls" in messages[-1]:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": message_text(item.get("output")),
                             "tool_call_id": str(item.get("call_id", ""))})
        else:
            raise BadRequest(f"input items of type '{kind}' cannot be audited")
    request: dict[str, Any] = {}
    if data.get("tools"):
        request["tools"] = _responses_tools(data["tools"])
    choice = data.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        request["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        request["tool_choice"] = choice
    if data.get("parallel_tool_calls") is not None:
        request["parallel_tool_calls"] = data["parallel_tool_calls"]
    fmt = (data.get("text") or {}).get("format") if isinstance(data.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        request["response_format"] = {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        request["response_format"] = {"type": "json_object"}
    return messages, request, bool(data.get("stream"))


def _output_items(answer: AppAnswer) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if answer.content or not answer.tool_calls:
        items.append({"type": "message", "id": _id(answer, "msg"), "status": "completed",
                      "role": "assistant",
                      "content": [{"type": "output_text", "text": answer.content,
                                   "annotations": []}]})
    for i, call in enumerate(answer.tool_calls):
        items.append({"type": "function_call", "id": f"{_id(answer, 'fc')}-{i}",
                      "call_id": call["id"] or f"call_{i + 1}", "name": call["name"],
                      "arguments": json.dumps(call["args"], sort_keys=True,
                                              ensure_ascii=False),
                      "status": "completed"})
    return items


def response_object(answer: AppAnswer, status: str = "completed",
                    output: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The answer as a Responses API ``response`` object."""
    return {"id": _id(answer, "resp"), "object": "response", "created_at": 0,
            "status": status, "model": answer.model, "error": None,
            "incomplete_details": None, "instructions": None, "metadata": {},
            "output": _output_items(answer) if output is None else output,
            "parallel_tool_calls": True, "temperature": None, "top_p": None,
            "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": answer.input_tokens,
                      "output_tokens": answer.output_tokens,
                      "total_tokens": answer.input_tokens + answer.output_tokens,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def response_stream(answer: AppAnswer) -> bytes:
    """The answer as the Responses API's streamed events: created, each output item added
    (a message's text in one delta) and done, completed."""
    events: list[tuple[str, dict[str, Any]]] = []

    def emit(name: str, **data: Any) -> None:
        events.append((name, {"type": name, "sequence_number": len(events), **data}))

    emit("response.created", response=response_object(answer, "in_progress", []))
    for index, item in enumerate(_output_items(answer)):
        if item["type"] == "message":
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "content": []})
            part = {"type": "output_text", "text": "", "annotations": []}
            emit("response.content_part.added", item_id=item["id"], output_index=index,
                 content_index=0, part=part)
            emit("response.output_text.delta", item_id=item["id"], output_index=index,
                 content_index=0, delta=answer.content, logprobs=[])
            emit("response.output_text.done", item_id=item["id"], output_index=index,
                 content_index=0, text=answer.content, logprobs=[])
            emit("response.content_part.done", item_id=item["id"], output_index=index,
                 content_index=0, part={**part, "text": answer.content})
        else:
            emit("response.output_item.added", output_index=index, item=item)
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.completed", response=response_object(answer))
    return _sse(events)


def error_body(message: str) -> Mapping[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error"}}
