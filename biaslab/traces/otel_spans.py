"""OpenTelemetry spans (OTLP JSON, or the Python SDK's console exporter) as traces.

Model calls are read from OpenInference's attributes (``llm.*``, ``input.value`` /
``output.value``, ``metadata`` with LangGraph's ``langgraph_node``) and from the GenAI semantic
conventions (``gen_ai.*``); docs/traces.md lists which attribute gives what."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from biaslab.errors import UserError
from biaslab.traces.trace_model import (UNATTRIBUTED, ImportedTraces, Trace, TracedCall,
                                        as_int, counted, item_of, json_or, role_of,
                                        sampling_params, text_of_parts)

__all__ = ["Span", "otlp_spans", "console_span", "traces_of_spans"]


@dataclass
class Span:
    """One span as read, whichever exporter wrote it: ids, name, start, attributes, events."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]


def _any_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` object as a Python value (int64s arrive as strings in JSON)."""
    if not isinstance(value, dict):
        return value
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [_any_value(v) for v in (value["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in value:
        return _attributes((value["kvlistValue"] or {}).get("values", []))
    return None


def _attributes(pairs: Any) -> dict[str, Any]:
    if isinstance(pairs, dict):  # the console exporter writes a plain mapping
        return dict(pairs)
    if not isinstance(pairs, list):
        raise ValueError("attributes are neither a list of key/value objects nor a mapping")
    return {p["key"]: _any_value(p.get("value")) for p in pairs}


def otlp_spans(doc: dict, path: Path) -> list[Span]:
    spans = []
    try:
        for rs in doc["resourceSpans"]:
            for ss in rs.get("scopeSpans", rs.get("instrumentationLibrarySpans", [])):
                for s in ss.get("spans", []):
                    spans.append(Span(
                        trace_id=str(s["traceId"]), span_id=str(s["spanId"]),
                        parent_id=str(s.get("parentSpanId") or ""), name=str(s.get("name", "")),
                        start=str(s.get("startTimeUnixNano", "")).rjust(24, "0"),
                        attributes=_attributes(s.get("attributes", [])),
                        events=[(str(e.get("name", "")), _attributes(e.get("attributes", [])))
                                for e in s.get("events", [])]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = f"lacks {exc}" if isinstance(exc, KeyError) else \
            f"has a malformed field: {type(exc).__name__}: {exc}"
        raise UserError(f"{path}: damaged OTLP JSON (a span {what})") from None
    return spans


def console_span(doc: dict, path: Path) -> Span:
    try:
        ctx = doc["context"]
        return Span(trace_id=str(ctx["trace_id"]), span_id=str(ctx["span_id"]),
                     parent_id=str(doc.get("parent_id") or ""), name=str(doc["name"]),
                     start=str(doc.get("start_time") or ""),
                     attributes=_attributes(doc.get("attributes") or {}),
                     events=[(str(e.get("name", "")), _attributes(e.get("attributes") or {}))
                             for e in doc.get("events") or []])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"{path}: damaged console-exporter span ({type(exc).__name__}: "
                        f"{exc})") from None


def _is_llm(span: Span) -> bool:
    a = span.attributes
    kind = a.get("openinference.span.kind")
    if kind is not None:
        return str(kind).upper() == "LLM"
    return any(k.startswith("gen_ai.") for k in a) and (
        "gen_ai.request.model" in a or "gen_ai.operation.name" in a or "gen_ai.system" in a)


def _metadata(span: Span) -> dict[str, Any]:
    meta = json_or(span.attributes.get("metadata"))
    return meta if isinstance(meta, dict) else {}


def _span_node(span: Span, by_id: dict[str, Span]) -> str | None:
    seen = 0
    while span is not None and seen < 1000:
        node = _metadata(span).get("langgraph_node") or span.attributes.get(
            "langgraph.node") or span.attributes.get("metadata.langgraph_node")
        if node:
            return str(node)
        span = by_id.get(span.parent_id)
        seen += 1
    return None


def _indexed(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """``prefix.N.rest`` attributes as a list of dicts keyed by ``rest``."""
    rows: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix + "."):
            continue
        index, _, rest = key[len(prefix) + 1:].partition(".")
        if index.isdigit() and rest:
            rows.setdefault(int(index), {})[rest] = value
    return [rows[i] for i in sorted(rows)]


def _oi_messages(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    out = []
    for row in _indexed(attrs, prefix):
        message = {"role": role_of(row.get("message.role", "")),
                   "content": row.get("message.content")}
        if message["content"] is None:
            parts = [row[k] for k in sorted(row) if k.startswith("message.contents.")
                     and k.endswith("message_content.text")]
            message["content"] = "".join(map(str, parts)) if parts else ""
        out.append(message)
    return out


def _genai_messages(value: Any) -> list[dict[str, Any]]:
    value = json_or(value)
    if not isinstance(value, list):
        return []
    out = []
    for m in value:
        if isinstance(m, dict):
            content = m.get("parts", m.get("content"))
            out.append({"role": role_of(m.get("role")), "content": text_of_parts(content)})
    return out


def _genai_call(span: Span) -> tuple[list, str | None]:
    """Messages and answer from the GenAI conventions: ``gen_ai.input.messages`` /
    ``gen_ai.output.messages``, ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*``, or the
    ``gen_ai.content.prompt``/``completion`` events and ``gen_ai.{system,user,...}.message``
    and ``gen_ai.choice`` events."""
    a = span.attributes
    messages = _genai_messages(a.get("gen_ai.input.messages"))
    answers = _genai_messages(a.get("gen_ai.output.messages"))
    if not messages:
        messages = [{"role": role_of(r.get("role")), "content": text_of_parts(r.get("content"))}
                    for r in _indexed(a, "gen_ai.prompt")]
    if not answers:
        answers = [{"role": role_of(r.get("role")), "content": text_of_parts(r.get("content"))}
                   for r in _indexed(a, "gen_ai.completion")]
    for name, ev in span.events:
        if not messages and name == "gen_ai.content.prompt":
            messages = _genai_messages(ev.get("gen_ai.prompt"))
        elif not answers and name == "gen_ai.content.completion":
            answers = _genai_messages(ev.get("gen_ai.completion"))
    if not messages:
        for name, ev in span.events:
            if name.startswith("gen_ai.") and name.endswith(".message"):
                messages.append({"role": role_of(ev.get("role", name.split(".")[1])),
                                 "content": text_of_parts(ev.get("content"))})
    if not answers:
        for name, ev in span.events:
            if name == "gen_ai.choice":
                msg = json_or(ev.get("message"))
                content = msg.get("content") if isinstance(msg, dict) else ev.get("content")
                answers.append({"role": "assistant", "content": text_of_parts(content)})
    answer = answers[0]["content"] if answers else None
    return messages, answer


def _span_call(span: Span, by_id: dict[str, Span], gaps: Counter) -> TracedCall:
    a = span.attributes
    messages = _oi_messages(a, "llm.input_messages")
    outputs = _oi_messages(a, "llm.output_messages")
    answer = outputs[0]["content"] if outputs else None
    if not messages or answer is None:
        g_messages, g_answer = _genai_call(span)
        messages = messages or g_messages
        answer = answer if answer is not None else g_answer
    params = json_or(a.get("llm.invocation_parameters"))
    params = dict(params) if isinstance(params, dict) else {}
    for key, value in a.items():
        if key.startswith("gen_ai.request.") and key != "gen_ai.request.model":
            params.setdefault(key[len("gen_ai.request."):], value)
    model = (a.get("gen_ai.request.model") or a.get("llm.model_name")
             or a.get("gen_ai.response.model") or params.get("model")
             or params.get("model_name") or _metadata(span).get("ls_model_name") or "")
    params = sampling_params(params)
    node = _span_node(span, by_id)
    ins = as_int(a.get("gen_ai.usage.input_tokens", a.get("gen_ai.usage.prompt_tokens",
                                                        a.get("llm.token_count.prompt"))))
    outs = as_int(a.get("gen_ai.usage.output_tokens", a.get("gen_ai.usage.completion_tokens",
                                                          a.get("llm.token_count.completion"))))
    recorded_params = "llm.invocation_parameters" in a or any(
        k.startswith("gen_ai.request.") and k != "gen_ai.request.model" for k in a)
    return counted(TracedCall(node=node or UNATTRIBUTED, messages=messages, params=params,
                               model=str(model), answer=answer, input_tokens=ins,
                               output_tokens=outs, start=span.start), gaps,
                    no_node=node is None, no_params=not recorded_params)


def traces_of_spans(spans: list[Span], fmt: str) -> ImportedTraces:
    gaps: Counter = Counter()
    by_trace: dict[str, list[Span]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    traces = []
    for trace_id, members in by_trace.items():
        by_id = {s.span_id: s for s in members}
        roots = sorted((s for s in members if not s.parent_id or s.parent_id not in by_id),
                       key=lambda s: s.start)
        true_roots = [s for s in roots if not s.parent_id]
        calls = tuple(_span_call(s, by_id, gaps)
                      for s in sorted(members, key=lambda s: s.start) if _is_llm(s))
        if not true_roots:
            gaps["root"] += 1
            item, output = None, None
        else:
            root = true_roots[0]
            item = item_of(root.attributes.get("input.value"), gaps)
            output = json_or(root.attributes.get("output.value"))
            if output is None:
                gaps["output"] += 1
        tags = true_roots[0].attributes.get("tag.tags") if true_roots else None
        traces.append(Trace(trace_id=_hex_id(trace_id), item=item, output=output, calls=calls,
                            start=roots[0].start if roots else "",
                            tags=tuple(map(str, tags)) if isinstance(tags, list) else ()))
    traces.sort(key=lambda t: (t.start, t.trace_id))
    return ImportedTraces(fmt, traces, gaps)


def _hex_id(value: str) -> str:
    """A trace id as hex: OTLP JSON writes hex, protobuf's JSON mapping base64, the console
    exporter ``0x``-prefixed hex; all name the same 16 bytes."""
    import base64
    import binascii

    if value.startswith("0x"):
        return value[2:]
    if len(value) == 32 and all(c in "0123456789abcdefABCDEF" for c in value):
        return value.lower()
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value
    return raw.hex() if len(raw) == 16 else value
