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
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from biaslab.errors import UserError
from biaslab.traces.langsmith_runs import flatten_runs, traces_of_runs
from biaslab.traces.otel_spans import console_span, otlp_spans, traces_of_spans
from biaslab.traces.trace_model import (GAP_NAMES, UNATTRIBUTED, ImportedTraces, Trace,
                                        TracedCall, when_of)

__all__ = ["TracedCall", "Trace", "ImportedTraces", "read_trace_file", "GAP_NAMES",
           "UNATTRIBUTED", "looks_like_traces", "RecordedAnswers", "select_traces",
           "parse_when"]


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
        spans = [s for d in flat for s in (otlp_spans(d, path) if _kind(d) == "otlp"
                                           else [console_span(d, path)])]
        result = traces_of_spans(spans, "otlp-json" if "otlp" in kinds else "otel-console")
    elif kinds == {"langsmith"}:
        result = traces_of_runs([r for d in flat for r in flatten_runs(d)], path)
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


def parse_when(text: str, what: str) -> datetime:
    """A user's date or timestamp (ISO 8601; UTC unless it says otherwise)."""
    when = when_of(str(text)) if not str(text).strip().isdigit() else None
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
