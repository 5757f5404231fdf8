"""`ask`: render a node's prompt, apply its exposures, call its model, parse, re-ask, record.

Every LLM node — agent, judge, user simulator, augmenter — calls models only through here, so
every call is traced the same way and every node can be exposed or have its prompt swapped.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from biaslab.agents.context import CellContext
from biaslab.agents.parsers import OutputConstraint, ParseError, Parser
from biaslab.agents.providers import ModelSpec
from biaslab.agents.verdicts import (MARKER_TOKENS, VERDICT_PROMPT, VerdictMarker, marker_for,
                                     parse_marked)
from biaslab.errors import ModelCallError
from biaslab.prompts.exposure import apply_exposures
from biaslab.prompts.registry import Message
from biaslab.traces.records import CallRecord

__all__ = ["ask", "Answer", "CallFailed", "REASK_PROMPT", "call_seed"]

REASK_PROMPT = "common/reask"


@functools.lru_cache(maxsize=1 << 14)
def call_seed(seed: int, node: str, sample: int) -> int:
    """The seed a call of `node` sends: one per (cell seed, node, repeat).

    Two nodes are two agents, even when they share a model and a prompt (three validators, three
    judges bound to one model): each gets its own seed, so its own cache key and its own sample.
    Repeats of one node get distinct seeds too. The seed depends on nothing else (not the lane,
    shard or call order), so a run stays reproducible."""
    digest = hashlib.sha256(f"{seed}:{node}:{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 2**31


class CallFailed(RuntimeError):
    """A model call failed for good (after its retries): the cell is marked ``error`` and
    ``--resume`` retries it. An unparsable answer is different: a recorded parse failure in a
    finished cell."""


@dataclass(frozen=True)
class Answer:
    """A node's parsed answer, or why there is none (never a guessed value)."""

    value: Any = None
    raw: str | None = None
    parse_error: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.parse_error is None and self.error is None

    def raise_for_error(self, what: str) -> "Answer":
        """Raise `CallFailed` naming `what` if the call failed for good; else return self."""
        if self.error:
            raise CallFailed(f"{what}: {self.error}")
        return self


async def complete_recorded(ctx: CellContext, spec, record: CallRecord, sample: int,
                            describe: str):
    """Send `record`'s messages through the cell's gateway and write what came back (answer,
    cache key, tokens, latency, attempts) into `record`. A call that fails for good is recorded
    with its error and appended to the cell's calls before the error is raised again, so no
    failed call leaves a hole in the trace; a successful one is left for the caller to parse
    and append."""
    try:
        done = await ctx.gateway.complete(spec, record.messages, record.params, sample,
                                          describe=describe)
    except ModelCallError as exc:
        record.error = str(exc)
        record.attempts = getattr(exc, "attempts", 0)
        record.attempt_errors = list(getattr(exc, "attempt_errors", ()))
        record.cache_key = getattr(exc, "cache_key", "")
        ctx.calls.append(record)
        raise
    record.raw = done.raw
    record.cache_key, record.cache_hit = done.cache_key, done.cache_hit
    record.input_tokens, record.output_tokens = done.input_tokens, done.output_tokens
    record.latency_s, record.attempts = done.latency_s, done.attempts
    record.attempt_errors = list(done.attempt_errors)
    return done


async def ask(ctx: CellContext, node: str, slots: Mapping[str, Any], *, prompt: str,
              parser: Parser, constraint: OutputConstraint | None = None, item: str = "",
              sample: int = 0, reasks: int = 1, max_tokens: int | None = None,
              model: ModelSpec | None = None, judged: Sequence[str] = (),
              history: Sequence[Message] = (), reviewed: int = 0,
              verdict: bool | None = None) -> Answer:
    """One LLM decision of `node`, with up to `reasks` re-asks on a parse failure.

    Args:
        ctx: the cell's context (bindings, exposures, gateway, trace buffer).
        node: the node's name; selects its prompt, model and exposures.
        slots: values the node offers to its template.
        prompt: the node's default prompt id (a binding may swap it).
        item: names the sub-call when a node makes several (a batch, a record, a turn).
        sample: repeat index for k-repeat answers; each sample gets its own seed.
        model: a model for this call only (a member of a judge ensemble); default: the
            node's bound model.
        judged: the texts a judge, validator or oracle is judging. Such a call reads its
            answer only from its verdict channel (`biaslab.agents.verdicts`): unless
            constrained decoding holds the answer to its format (a local model with a
            `constraint`: the whole output is the structured answer), the prompt asks for the
            answer between markers derived from the prompt and the run's verdict key, and only
            what stands between them is parsed. Nothing a judged text says, however the judge
            quotes it, can be read as (or cancel) the verdict. The record keeps the raw answer.
        verdict: whether this is such a call; default: whether `judged` holds any text.
        history: turns sent after the rendered prompt; a self-check's are the node's answer
            and the request to review it (set by `ask` itself, below).
        reviewed: how many of the node's self-checks `history` already holds.

    A mitigation arm at `AFTER_ANSWER` (a self-check, ``mitigations/self_check``) asks its
    text after the node's parsed answer, as the next turns of the same conversation with the
    same model; the node's value is the answer to that, parsed (and re-asked) the same way.
    Both calls are recorded, the second with item ``<item>|<mitigation name>``.

    A call of a turn before a change's first turn (``CellContext.earlier``) is made with the
    earlier turns' settings (`CellContext.for_call`); its record still names the cell's arm.
    """
    arm = ctx.condition.id
    cell_ctx, given_slots, given_judged = ctx, slots, judged
    ctx = ctx.for_call(item)
    template = ctx.template(node, prompt)
    # The judge-bias probe: the node sees its inputs with group terms swapped.
    group_swap, swapped_terms = "", 0
    if ctx.group_swap is not None and ctx.group_swap.applies_to(node):
        lexicon = ctx.group_swap.lexicon
        slots, swapped_terms = lexicon.swap_value(dict(slots))
        group_swap = lexicon.ref
    messages = template.render(slots)
    exposures = ctx.condition.exposures_for(node)
    exposure_templates = [ctx.prompts.get(e.template) for e in exposures]
    exposure_prompts = [f"{t.ref}@{t.content_hash}" for t in exposure_templates]
    if exposures:
        messages = apply_exposures(messages, [(e.position, e.text(ctx.prompts)) for e in exposures])
    # A mitigation is applied like an exposure, after it (a reminder answers the instruction
    # it follows); a cell without one renders exactly as before.
    mitigations = ctx.condition.mitigations_for(node)
    reviews = [m for m in mitigations if m.after_answer][reviewed:]
    mitigations = tuple(m for m in mitigations if not m.after_answer)
    if mitigations:
        messages = apply_exposures(messages, [(m.position, m.text(ctx.prompts))
                                              for m in mitigations])
    spec = model or ctx.bindings.model_for(node)
    constrained = constraint is not None and spec.provider == "local"
    marker = None
    if (bool(judged) if verdict is None else verdict) and not constrained:
        messages, marker = _ask_for_marker(ctx, messages)
    base, messages = len(messages), [*messages, *history]
    # An unset temperature is the provider's own default: nothing is sent (the papers sample
    # at each model's default; 0 would make repeats and ensembles one answer).
    budget = max_tokens or spec.max_tokens
    params: dict[str, Any] = {"max_tokens": budget + MARKER_TOKENS if marker else budget,
                              "seed": call_seed(ctx.seed, node, sample)}
    if spec.temperature is not None:
        params["temperature"] = spec.temperature
    if constrained:
        params.update(constraint.params())
    answer = Answer(error="no attempt made")
    for attempt in range(reasks + 1):
        record = CallRecord(cell_id=ctx.cell_id, node=node, item=item, sample=sample,
                            attempt=attempt, seed=params["seed"], exposure_id=arm,
                            exposed=bool(exposures), exposure_prompts=exposure_prompts,
                            prompt_id=template.ref,
                            prompt_hash=template.content_hash,
                            prompt_source=template.origin, messages=messages,
                            group_swap=group_swap, swapped_terms=swapped_terms,
                            model=ctx.gateway.public(spec), params=params)
        describe = f"node '{node}' item '{item}' sample {sample} attempt {attempt} in cell " \
                   f"{ctx.cell_id} (prompt {template.ref})"
        try:
            done = await complete_recorded(ctx, spec, record, sample, describe)
        except ModelCallError as exc:
            return Answer(error=str(exc))
        try:
            value = parse_marked(parser, done.raw, marker) if marker else parser(done.raw)
        except ParseError as exc:
            record.parse_error = str(exc)
            ctx.calls.append(record)
            ctx.gateway.counters.parse_failures += 1
            answer = Answer(raw=done.raw, parse_error=str(exc))
            reask = ctx.prompts.get(REASK_PROMPT).render({"error": str(exc)})[-1]
            messages = [*messages, {"role": "assistant", "content": done.raw}, reask]
            continue
        record.parsed = value
        ctx.calls.append(record)
        if reviews:  # a self-check: its request follows this answer, in the same conversation
            review = reviews[0]
            turns = [*messages[base:], {"role": "assistant", "content": done.raw},
                     *review.render_after(ctx.prompts)]
            return await ask(cell_ctx, node, given_slots, prompt=prompt, parser=parser,
                             constraint=constraint, item=f"{item}|{review.name}",
                             sample=sample, reasks=reasks, max_tokens=max_tokens, model=model,
                             judged=given_judged, history=turns, reviewed=reviewed + 1,
                             verdict=verdict)
        return Answer(value=value, raw=done.raw)
    return answer


def _ask_for_marker(ctx: CellContext, messages: list[Message]
                    ) -> tuple[list[Message], VerdictMarker]:
    """`messages` with the request for this call's verdict markers at the end of the last user
    message (after any exposure or mitigation, so it is the last thing the judge reads), and
    those markers: derived from the prompt as rendered so far and the run's key."""
    marker = marker_for(ctx.gateway.verdict_key, messages)
    request = ctx.prompts.get(VERDICT_PROMPT).render({"open": marker.open,
                                                      "close": marker.close})[-1]["content"]
    last = messages[-1]
    if last["role"] == "user":
        return [*messages[:-1], {**last, "content": f"{last['content']}\n\n{request}"}], marker
    return [*messages, {"role": "user", "content": request}], marker
