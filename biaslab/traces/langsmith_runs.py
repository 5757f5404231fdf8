"""LangSmith runs (the run JSON of its API and bulk export, `langsmith.schemas.Run`) as
traces: runs grouped by trace, the root's inputs and outputs, each ``llm`` run a model call."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from biaslab.errors import UserError
from biaslab.traces.trace_model import (UNATTRIBUTED, ImportedTraces, Trace, TracedCall,
                                        counted, first_int, item_of, role_of, sampling_params,
                                        text_of_parts)

__all__ = ["flatten_runs", "traces_of_runs"]


def flatten_runs(run: dict) -> Iterator[dict]:
    yield run
    for child in run.get("child_runs") or []:
        if isinstance(child, dict):
            yield from flatten_runs(child)


def _lc_message(m: Any) -> dict[str, Any] | None:
    """A LangChain message as LangSmith stores it (serialised constructor, ``type``/``content``
    dict, or OpenAI ``role``/``content``) in OpenAI's chat shape."""
    if not isinstance(m, dict):
        return None
    if m.get("lc") == 1 and isinstance(m.get("kwargs"), dict):
        kind = str((m.get("id") or ["", "message"])[-1])
        kwargs = m["kwargs"]
        return {"role": role_of(kwargs.get("type") or kind), "content": text_of_parts(
            kwargs.get("content"))}
    role = m.get("role") or m.get("type")
    if role is None:
        return None
    return {"role": role_of(role), "content": text_of_parts(m.get("content"))}


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
    params = sampling_params(params)
    outputs = run.get("outputs") if isinstance(run.get("outputs"), dict) else {}
    usage = ((outputs.get("llm_output") or {}).get("token_usage") or {}) if isinstance(
        outputs.get("llm_output"), dict) else {}
    meta_usage = _message_usage(outputs)
    ins = first_int(run.get("prompt_tokens"), usage.get("prompt_tokens"),
                     meta_usage.get("input_tokens"))
    outs = first_int(run.get("completion_tokens"), usage.get("completion_tokens"),
                      meta_usage.get("output_tokens"))
    node = meta.get("langgraph_node")
    return counted(TracedCall(node=str(node) if node else UNATTRIBUTED,
                               messages=_run_messages(run.get("inputs")), params=params,
                               model=str(model), answer=_run_answer(outputs),
                               input_tokens=ins, output_tokens=outs,
                               start=str(run.get("start_time") or "")), gaps,
                    no_node=not node, no_params="invocation_params" not in extra)


def traces_of_runs(runs: list[dict], path: Path) -> ImportedTraces:
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
            item = item_of(roots[0].get("inputs"), gaps)
            output = roots[0].get("outputs")
            if output is None:
                gaps["output"] += 1
        tags = roots[0].get("tags") if roots else None
        traces.append(Trace(trace_id=trace_id, item=item, output=output, calls=calls,
                            start=str(ordered[0].get("start_time") or ""),
                            tags=tuple(map(str, tags)) if isinstance(tags, list) else ()))
    traces.sort(key=lambda t: (t.start, t.trace_id))
    return ImportedTraces("langsmith", traces, gaps)
