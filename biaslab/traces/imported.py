"""Traces recorded elsewhere: an app's OpenTelemetry spans or LangSmith runs, read as typed
conversations, so that biaslab can judge what the app really did without running it.

Two formats are read:

- **OpenTelemetry spans** as OTLP JSON (``resourceSpans`` → ``scopeSpans`` → ``spans``, one
  export request per line or one document, as the SDK's and the collector's file exporters write
  them), or the Python SDK's ``ConsoleSpanExporter`` output (one span object after another).
  Model calls are read from the GenAI semantic conventions (``gen_ai.*``) and from OpenInference's
  (``llm.*``, ``input.value``/``output.value``, ``metadata`` with ``langgraph_node``).
- **LangSmith runs** (the run JSON of its API and bulk export: ``id``, ``trace_id``,
  ``parent_run_id``, ``run_type``, ``inputs``, ``outputs``, ``extra``), as a JSON list, JSON
  lines, or runs nested in ``child_runs``.

Whatever a file does not carry (a model name, token counts, the node of a call, the root's
input) is a *gap*: counted by name in `ImportedTraces.gaps`, never filled in by a guess. A file
that is not one of these formats, or is damaged, raises `UserError` naming the file.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from biaslab.errors import UserError

__all__ = ["TracedCall", "Trace", "ImportedTraces", "read_trace_file", "GAP_NAMES",
           "UNATTRIBUTED", "looks_like_traces", "RecordedAnswers", "select_traces",
           "parse_when"]

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
        return _when(self.start)


@dataclass
class ImportedTraces:
    """What a trace file holds, with what it lacks counted by name (see `GAP_NAMES`)."""

    format: str
    traces: list[Trace]
    gaps: Counter = field(default_factory=Counter)


# -- reading the file ---------------------------------------------------------------------------


def _documents(path: Path) -> list[Any]:
    """Every JSON value in the file: one document, JSON lines, or pretty-printed objects one
    after another (the console exporter's output)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read trace file {path}: {exc}") from None
    decoder = json.JSONDecoder()
    docs, pos = [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: not JSON at line {exc.lineno} column {exc.colno} "
                            f"({exc.msg}); a trace file is OTLP JSON, console-exporter spans "
                            "or LangSmith runs") from None
        docs.append(value)
    if not docs:
        raise UserError(f"{path} is empty: no spans or runs to import")
    return docs


def read_trace_file(path: str | Path) -> ImportedTraces:
    """The traces of an OTLP JSON, console-exporter or LangSmith file.

    Raises:
        UserError: unreadable or damaged file, or one that holds neither spans nor runs.
    """
    path = Path(path)
    docs = _documents(path)
    flat: list[Any] = []
    for doc in docs:
        if isinstance(doc, list):
            flat.extend(doc)
        elif isinstance(doc, dict) and isinstance(doc.get("runs"), list):
            flat.extend(doc["runs"])
        else:
            flat.append(doc)
    kinds = {_kind(d) for d in flat}
    if kinds == {"otlp"} or kinds == {"console"} or kinds == {"otlp", "console"}:
        spans = [s for d in flat for s in (_otlp_spans(d, path) if _kind(d) == "otlp"
                                           else [_console_span(d, path)])]
        result = _from_spans(spans, "otlp-json" if "otlp" in kinds else "otel-console")
    elif kinds == {"langsmith"}:
        result = _from_runs([r for d in flat for r in _flatten_runs(d)], path)
    else:
        foreign = next((d for d in flat if _kind(d) is None), flat[0])
        what = (f"an object with keys {', '.join(sorted(foreign)[:5])}"
                if isinstance(foreign, dict) else f"a JSON {type(foreign).__name__}")
        mixed = " (OpenTelemetry spans and LangSmith runs mixed)" if kinds >= {"langsmith"} \
            and len(kinds) > 1 and None not in kinds else ""
        raise UserError(f"{path} is no trace file biaslab reads{mixed}: it holds {what}, "
                        "neither OTLP JSON (resourceSpans), console-exporter spans nor "
                        "LangSmith runs (id, run_type)")
    if not result.traces:
        raise UserError(f"{path} holds no traces")
    return result


def _kind(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("resourceSpans"), list):
        return "otlp"
    if isinstance(doc.get("context"), dict) and "name" in doc and "attributes" in doc:
        return "console"
    if "run_type" in doc and "id" in doc and ("start_time" in doc or "trace_id" in doc):
        return "langsmith"  # (an app's input state may well have an id and a run_type)
    return None


# -- OpenTelemetry ---------------------------------------------------------------------------------


@dataclass
class _Span:
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


def _otlp_spans(doc: dict, path: Path) -> list[_Span]:
    spans = []
    try:
        for rs in doc["resourceSpans"]:
            for ss in rs.get("scopeSpans", rs.get("instrumentationLibrarySpans", [])):
                for s in ss.get("spans", []):
                    spans.append(_Span(
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


def _console_span(doc: dict, path: Path) -> _Span:
    try:
        ctx = doc["context"]
        return _Span(trace_id=str(ctx["trace_id"]), span_id=str(ctx["span_id"]),
                     parent_id=str(doc.get("parent_id") or ""), name=str(doc["name"]),
                     start=str(doc.get("start_time") or ""),
                     attributes=_attributes(doc.get("attributes") or {}),
                     events=[(str(e.get("name", "")), _attributes(e.get("attributes") or {}))
                             for e in doc.get("events") or []])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"{path}: damaged console-exporter span ({type(exc).__name__}: "
                        f"{exc})") from None


def _json_or(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _is_llm(span: _Span) -> bool:
    a = span.attributes
    kind = a.get("openinference.span.kind")
    if kind is not None:
        return str(kind).upper() == "LLM"
    return any(k.startswith("gen_ai.") for k in a) and (
        "gen_ai.request.model" in a or "gen_ai.operation.name" in a or "gen_ai.system" in a)


def _metadata(span: _Span) -> dict[str, Any]:
    meta = _json_or(span.attributes.get("metadata"))
    return meta if isinstance(meta, dict) else {}


def _span_node(span: _Span, by_id: dict[str, _Span]) -> str | None:
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
        message = {"role": _role(row.get("message.role", "")),
                   "content": row.get("message.content")}
        if message["content"] is None:
            parts = [row[k] for k in sorted(row) if k.startswith("message.contents.")
                     and k.endswith("message_content.text")]
            message["content"] = "".join(map(str, parts)) if parts else ""
        out.append(message)
    return out


_ROLES = {"human": "user", "ai": "assistant", "chat": "user", "function": "tool",
          "humanmessage": "user", "aimessage": "assistant", "systemmessage": "system",
          "toolmessage": "tool", "model": "assistant"}


def _role(role: Any) -> str:
    role = str(role or "").lower()
    return _ROLES.get(role, role)


def _genai_parts(content: Any) -> str:
    """GenAI ``parts`` ([{type: text, content}]) or a plain content as text."""
    if isinstance(content, list):
        return "".join(str(p.get("content", p.get("text", ""))) for p in content
                       if isinstance(p, dict) and p.get("type", "text") == "text")
    return "" if content is None else str(content)


def _genai_messages(value: Any) -> list[dict[str, Any]]:
    value = _json_or(value)
    if not isinstance(value, list):
        return []
    out = []
    for m in value:
        if isinstance(m, dict):
            content = m.get("parts", m.get("content"))
            out.append({"role": _role(m.get("role")), "content": _genai_parts(content)})
    return out


def _genai_call(span: _Span) -> tuple[list, str | None]:
    """Messages and answer from the GenAI conventions: ``gen_ai.input.messages`` /
    ``gen_ai.output.messages``, ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*``, or the
    ``gen_ai.content.prompt``/``completion`` events and ``gen_ai.{system,user,...}.message``
    and ``gen_ai.choice`` events."""
    a = span.attributes
    messages = _genai_messages(a.get("gen_ai.input.messages"))
    answers = _genai_messages(a.get("gen_ai.output.messages"))
    if not messages:
        messages = [{"role": _role(r.get("role")), "content": _genai_parts(r.get("content"))}
                    for r in _indexed(a, "gen_ai.prompt")]
    if not answers:
        answers = [{"role": _role(r.get("role")), "content": _genai_parts(r.get("content"))}
                   for r in _indexed(a, "gen_ai.completion")]
    for name, ev in span.events:
        if not messages and name == "gen_ai.content.prompt":
            messages = _genai_messages(ev.get("gen_ai.prompt"))
        elif not answers and name == "gen_ai.content.completion":
            answers = _genai_messages(ev.get("gen_ai.completion"))
    if not messages:
        for name, ev in span.events:
            if name.startswith("gen_ai.") and name.endswith(".message"):
                messages.append({"role": _role(ev.get("role", name.split(".")[1])),
                                 "content": _genai_parts(ev.get("content"))})
    if not answers:
        for name, ev in span.events:
            if name == "gen_ai.choice":
                msg = _json_or(ev.get("message"))
                content = msg.get("content") if isinstance(msg, dict) else ev.get("content")
                answers.append({"role": "assistant", "content": _genai_parts(content)})
    answer = answers[0]["content"] if answers else None
    return messages, answer


_SECRET = re.compile(r"(?i)(api[_-]?key|secret|password|passwd|authori[sz]ation|bearer|"
                     r"access[_-]?token|credential)")


def _sampling(params: dict[str, Any]) -> dict[str, Any]:
    """Invocation parameters without LangChain's class tag (``_type``), unset (None) values
    and anything named like a credential (an API key, a token): what was sent, not how the
    client was built, and never a secret in a run."""
    return {k: v for k, v in params.items()
            if k != "_type" and v is not None and not _SECRET.search(k)}


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and value != "" else None
    except (TypeError, ValueError):
        return None


def _span_call(span: _Span, by_id: dict[str, _Span], gaps: Counter) -> TracedCall:
    a = span.attributes
    messages = _oi_messages(a, "llm.input_messages")
    outputs = _oi_messages(a, "llm.output_messages")
    answer = outputs[0]["content"] if outputs else None
    if not messages or answer is None:
        g_messages, g_answer = _genai_call(span)
        messages = messages or g_messages
        answer = answer if answer is not None else g_answer
    params = _json_or(a.get("llm.invocation_parameters"))
    params = dict(params) if isinstance(params, dict) else {}
    for key, value in a.items():
        if key.startswith("gen_ai.request.") and key != "gen_ai.request.model":
            params.setdefault(key[len("gen_ai.request."):], value)
    model = (a.get("gen_ai.request.model") or a.get("llm.model_name")
             or a.get("gen_ai.response.model") or params.get("model")
             or params.get("model_name") or _metadata(span).get("ls_model_name") or "")
    params = _sampling(params)
    node = _span_node(span, by_id)
    ins = _int(a.get("gen_ai.usage.input_tokens", a.get("gen_ai.usage.prompt_tokens",
                                                        a.get("llm.token_count.prompt"))))
    outs = _int(a.get("gen_ai.usage.output_tokens", a.get("gen_ai.usage.completion_tokens",
                                                          a.get("llm.token_count.completion"))))
    recorded_params = "llm.invocation_parameters" in a or any(
        k.startswith("gen_ai.request.") and k != "gen_ai.request.model" for k in a)
    return _counted(TracedCall(node=node or UNATTRIBUTED, messages=messages, params=params,
                               model=str(model), answer=answer, input_tokens=ins,
                               output_tokens=outs, start=span.start), gaps,
                    no_node=node is None, no_params=not recorded_params)


def _counted(call: TracedCall, gaps: Counter, *, no_node: bool, no_params: bool
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


def _item_of(value: Any, gaps: Counter) -> dict[str, Any] | None:
    value = _json_or(value)
    if isinstance(value, dict):
        return value
    gaps["item"] += 1
    return None


def _from_spans(spans: list[_Span], fmt: str) -> ImportedTraces:
    gaps: Counter = Counter()
    by_trace: dict[str, list[_Span]] = {}
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
            item = _item_of(root.attributes.get("input.value"), gaps)
            output = _json_or(root.attributes.get("output.value"))
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


# -- LangSmith -----------------------------------------------------------------------------------


def _flatten_runs(run: dict) -> Iterator[dict]:
    yield run
    for child in run.get("child_runs") or []:
        if isinstance(child, dict):
            yield from _flatten_runs(child)


def _lc_message(m: Any) -> dict[str, Any] | None:
    """A LangChain message as LangSmith stores it (serialised constructor, ``type``/``content``
    dict, or OpenAI ``role``/``content``) in OpenAI's chat shape."""
    if not isinstance(m, dict):
        return None
    if m.get("lc") == 1 and isinstance(m.get("kwargs"), dict):
        kind = str((m.get("id") or ["", "message"])[-1])
        kwargs = m["kwargs"]
        return {"role": _role(kwargs.get("type") or kind), "content": _genai_parts(
            kwargs.get("content"))}
    role = m.get("role") or m.get("type")
    if role is None:
        return None
    return {"role": _role(role), "content": _genai_parts(m.get("content"))}


def _run_messages(inputs: Any) -> list[dict[str, Any]]:
    if not isinstance(inputs, dict):
        return []
    raw = inputs.get("messages")
    if isinstance(raw, list) and raw and isinstance(raw[0], list):
        raw = raw[0]  # one prompt per batch entry; a chat call has one
    if isinstance(raw, list):
        return [m for m in map(_lc_message, raw) if m is not None]
    prompts = inputs.get("prompts")
    if isinstance(prompts, list) and prompts:
        return [{"role": "user", "content": str(prompts[0])}]
    return []


def _run_answer(outputs: Any) -> str | None:
    if not isinstance(outputs, dict):
        return None
    gens = outputs.get("generations")
    if isinstance(gens, list) and gens:
        first = gens[0][0] if isinstance(gens[0], list) and gens[0] else gens[0]
        if isinstance(first, dict):
            message = _lc_message(first.get("message"))
            if message is not None and message["content"]:
                return message["content"]
            if first.get("text") is not None:
                return str(first["text"])
    for key in ("output", "content", "text"):
        if isinstance(outputs.get(key), str):
            return outputs[key]
    if isinstance(outputs.get("output"), dict):
        message = _lc_message(outputs["output"])
        return message["content"] if message else None
    return None


def _first_int(*values: Any) -> int | None:
    return next((v for v in map(_int, values) if v is not None), None)


def _message_usage(outputs: dict) -> dict[str, Any]:
    """The answer message's ``usage_metadata`` (LangChain's token counts), if recorded."""
    gens = outputs.get("generations")
    try:
        first = gens[0][0] if isinstance(gens[0], list) else gens[0]
        message = first["message"]
        usage = (message.get("kwargs") or message).get("usage_metadata")
    except (TypeError, KeyError, IndexError, AttributeError):
        return {}
    return usage if isinstance(usage, dict) else {}


def _run_call(run: dict, gaps: Counter) -> TracedCall:
    extra = run.get("extra") if isinstance(run.get("extra"), dict) else {}
    meta = extra.get("metadata") if isinstance(extra.get("metadata"), dict) else {}
    params = dict(extra.get("invocation_params") or {}) if isinstance(
        extra.get("invocation_params"), dict) else {}
    model = (params.get("model") or params.get("model_name") or meta.get("ls_model_name")
             or "")
    params = _sampling(params)
    outputs = run.get("outputs") if isinstance(run.get("outputs"), dict) else {}
    usage = ((outputs.get("llm_output") or {}).get("token_usage") or {}) if isinstance(
        outputs.get("llm_output"), dict) else {}
    meta_usage = _message_usage(outputs)
    ins = _first_int(run.get("prompt_tokens"), usage.get("prompt_tokens"),
                     meta_usage.get("input_tokens"))
    outs = _first_int(run.get("completion_tokens"), usage.get("completion_tokens"),
                      meta_usage.get("output_tokens"))
    node = meta.get("langgraph_node")
    return _counted(TracedCall(node=str(node) if node else UNATTRIBUTED,
                               messages=_run_messages(run.get("inputs")), params=params,
                               model=str(model), answer=_run_answer(outputs),
                               input_tokens=ins, output_tokens=outs,
                               start=str(run.get("start_time") or "")), gaps,
                    no_node=not node, no_params="invocation_params" not in extra)


def _from_runs(runs: list[dict], path: Path) -> ImportedTraces:
    gaps: Counter = Counter()
    by_id: dict[str, dict] = {}
    for run in runs:
        if not isinstance(run.get("run_type"), str):
            raise UserError(f"{path}: damaged LangSmith run {run.get('id')!r} (run_type is "
                            "not a string)")
        by_id[str(run["id"])] = run

    def trace_of(run: dict) -> str:
        if run.get("trace_id"):
            return str(run["trace_id"])
        seen = 0
        while run.get("parent_run_id") and str(run["parent_run_id"]) in by_id and seen < 1000:
            run = by_id[str(run["parent_run_id"])]
            seen += 1
        return str(run["id"])

    by_trace: dict[str, list[dict]] = {}
    for run in by_id.values():
        by_trace.setdefault(trace_of(run), []).append(run)
    traces = []
    for trace_id, members in by_trace.items():
        ordered = sorted(members, key=lambda r: str(r.get("start_time") or ""))
        roots = [r for r in ordered if not r.get("parent_run_id")]
        calls = tuple(_run_call(r, gaps) for r in ordered if r["run_type"] == "llm")
        if not roots:
            gaps["root"] += 1
            item, output = None, None
        else:
            item = _item_of(roots[0].get("inputs"), gaps)
            output = roots[0].get("outputs")
            if output is None:
                gaps["output"] += 1
        tags = roots[0].get("tags") if roots else None
        traces.append(Trace(trace_id=trace_id, item=item, output=output, calls=calls,
                            start=str(ordered[0].get("start_time") or ""),
                            tags=tuple(map(str, tags)) if isinstance(tags, list) else ()))
    traces.sort(key=lambda t: (t.start, t.trace_id))
    return ImportedTraces("langsmith", traces, gaps)


# -- a trace file as an app audit's items and recorded answers ----------------------------------


def looks_like_traces(text: str) -> bool:
    """Whether an items file's text is a trace file rather than JSON lines of input states:
    its first JSON value is OTLP JSON, a console-exporter span or a LangSmith run (or a list
    of runs)."""
    try:
        first, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except ValueError:
        return False
    if isinstance(first, list) and first:
        first = first[0]
    return _kind(first) is not None or (isinstance(first, dict)
                                        and isinstance(first.get("runs"), list))


class RecordedAnswers:
    """The answers one trace recorded, looked up by what a new call sends.

    A call is answered from the trace only where its node, its messages (byte for byte, as
    canonical JSON) and its model (the recorded model name mapped by ``[traces] model_map`` to
    the model the run binds to the node) are the recorded call's; the n-th identical request of
    a node gets the n-th such recorded answer. Parameters are not compared: biaslab sends its
    own seed and token cap, which no trace holds."""

    def __init__(self, calls: tuple[TracedCall, ...], model_map: dict[str, str]):
        self._answers: dict[tuple[str, str, str], list[TracedCall]] = {}
        for call in calls:
            mapped = model_map.get(call.model)
            if mapped and call.answer is not None:
                key = (call.node, mapped, _canonical_messages(call.messages))
                self._answers.setdefault(key, []).append(call)

    def __len__(self) -> int:
        return sum(map(len, self._answers.values()))

    def answer(self, node: str, model: str, messages: list[dict[str, Any]],
               sample: int) -> TracedCall | None:
        found = self._answers.get((node, model, _canonical_messages(messages)), [])
        return found[sample] if sample < len(found) else None


def _canonical_messages(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# -- choosing traces: a date range, a tag ---------------------------------------------------------


def _when(start: str) -> datetime | None:
    """A recorded start as UTC: OTLP's nanoseconds since the epoch, or an ISO timestamp."""
    text = start.strip()
    if text.isdigit():
        return datetime.fromtimestamp(int(text) / 1e9, tz=timezone.utc) if int(text) else None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def parse_when(text: str, what: str) -> datetime:
    """A user's date or timestamp (ISO 8601; UTC unless it says otherwise)."""
    when = _when(str(text)) if not str(text).strip().isdigit() else None
    if when is None:
        raise UserError(f"{what} '{text}' is no ISO date or timestamp (e.g. 2026-12-01 or "
                        "2026-12-01T08:00:00Z)")
    return when


def select_traces(found: ImportedTraces, *, since: str | None = None,
                  until: str | None = None, tag: str | None = None) -> ImportedTraces:
    """The traces that began in [`since`, `until`) and carry `tag`; the gaps stay those of
    the whole file. A date filter over a trace without a start time is refused, never
    guessed.

    Raises:
        UserError: a date that does not parse, a trace without a start under a date filter,
            or no trace left.
    """
    if since is None and until is None and tag is None:
        return found
    low = parse_when(since, "since") if since is not None else None
    high = parse_when(until, "until") if until is not None else None
    if low is not None or high is not None:
        undated = [t for t in found.traces if t.started is None]
        if undated:
            raise UserError(f"{len(undated)} trace(s) carry no start time (first: "
                            f"{undated[0].trace_id}); a date range cannot place them")
    kept = [t for t in found.traces
            if (low is None or t.started >= low) and (high is None or t.started < high)
            and (tag is None or tag in t.tags)]
    if not kept:
        raise UserError(f"no trace of {len(found.traces)} began in the range "
                        f"[{since or '...'}, {until or '...'}) with tag {tag or '(any)'}")
    return replace(found, traces=kept)
