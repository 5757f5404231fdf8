"""Parts for composing topologies: LLM agent nodes, scikit-learn nodes, routers, turn loops.

Each LLM node declares itself once (its prompt and the slots it offers), so the graph alone
says which nodes can be exposed, rebound or estimated. See ``experiments/examples/`` for a
complete protocol of your own, run from the command line.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Sequence

from langgraph.graph import END, StateGraph
from langgraph.runtime import Runtime

from biaslab.agents.ask import ask
from biaslab.agents.context import CellContext
from biaslab.agents.parsers import OutputConstraint, ParseError, Parser
from biaslab.graphs.llm_nodes import LLMNode, TurnLoop, declare_llm, register_turn_loop

__all__ = ["llm_node", "sklearn_node", "add_turn_loop", "router", "text_answer"]


def text_answer(text: str) -> str:
    """Parser for free text: anything non-empty."""
    if not text.strip():
        raise ParseError("empty answer")
    return text.strip()


def llm_node(name: str, *, prompt: str,
             slots: Sequence[str] | Callable[[Mapping], Mapping[str, Any]],
             offers: Sequence[str] | None = None, requires: Sequence[str] = (),
             parser: Parser = text_answer, writes: str | Callable[[Mapping, Any], dict] | None = None,
             constraint: OutputConstraint | None = None, reasks: int = 1,
             max_tokens: int | None = None, item: Callable[[Mapping], str] | None = None,
             judged: Sequence[str] | Callable[[Mapping], Sequence[str]] = ()):
    """An agent node making one decision per visit, declared as an LLM node of its graph.

    A model call that fails for good (after its retries) raises `CallFailed`: the cell ends
    with status ``error`` and ``biaslab run --resume`` retries it. An answer that cannot be
    parsed after the re-asks writes None and is recorded as a parse failure.

    Args:
        name: node name; binds its prompt, model and exposures.
        prompt: default prompt id.
        slots: the state keys offered to the template (``("question", "turn")``), or a
            function state → slot values; a function needs `offers`.
        offers: the slot names a function `slots` returns (checked against bound templates).
        requires: slots every bound template must use.
        writes: state key for the parsed value, or (state, Answer) → state update.
        item: state → sub-call label (e.g. the turn number in a loop), so repeated visits
            are distinct calls.
        judged: for a judge, critic or validator: the slot names holding the texts it judges
            (``("draft",)``), or a function state → those texts. Its answer is then read
            only from its verdict channel (`biaslab.agents.verdicts`), so nothing a judged
            text says (a look-alike ``{"choice": ...}``, however the judge quotes it) is read
            as the judge's own. Quote them between ``<quoted-...>`` tags in the template:
            their values are then escaped (`biaslab.prompts.registry.escape_quoted`).
    """
    if callable(slots):
        if offers is None:
            raise TypeError(f"llm_node '{name}': a slots function needs offers=(slot names)")
        make_slots = slots
    else:
        keys = tuple(slots)
        offers = keys if offers is None else offers
        make_slots = lambda state: {k: state.get(k) for k in keys}  # noqa: E731
    if not callable(judged) and set(judged) - set(offers):
        raise TypeError(f"llm_node '{name}': judged={sorted(set(judged) - set(offers))} are not "
                        f"among its slots {list(offers)}")

    def judged_texts(state: Mapping, values: Mapping[str, Any]) -> list[str]:
        texts = judged(state) if callable(judged) else [values.get(k) for k in judged]
        return [str(t) for t in texts if t is not None]

    async def node(state: Mapping, runtime: Runtime[CellContext]) -> dict:
        values = make_slots(state)
        answer = await ask(runtime.context, name, values, prompt=prompt,
                           parser=parser, constraint=constraint, reasks=reasks,
                           max_tokens=max_tokens, item=item(state) if item else "",
                           judged=judged_texts(state, values), verdict=bool(judged))
        # A call that failed for good fails the cell (status error, resumable), as in every
        # built-in protocol; an unparsable answer is a recorded parse failure (value None).
        answer.raise_for_error(f"node '{name}'")
        if callable(writes):
            return writes(state, answer)
        return {writes or name: answer.value if answer.ok else None}

    node.__name__ = name
    return declare_llm(node, LLMNode(name, prompt, tuple(offers), tuple(requires),
                                     max_tokens=max_tokens or 128))


def sklearn_node(name: str, *, fit: Callable[[Mapping], Any], features: Callable[[Mapping], Any],
                 writes: str):
    """A non-LLM predictor: ``fit(state)`` returns a fitted estimator (cache it there if
    costly); ``features(state)`` the rows to score. Writes P(class 1) per row as a list."""

    async def node(state: Mapping) -> dict:
        def work():
            estimator = fit(state)
            return [float(p) for p in estimator.predict_proba(features(state))[:, 1]]

        return {writes: await asyncio.to_thread(work)}

    node.__name__ = name
    return node


def router(predicate: Callable[[Mapping], bool], if_true: str, if_false: str):
    """A conditional edge function choosing between two named nodes."""

    def route(state: Mapping) -> str:
        return if_true if predicate(state) else if_false

    route.__name__ = f"route_{if_true}_or_{if_false}"
    return route


def add_turn_loop(builder: StateGraph, *, first: str, last: str, max_turns: int, turn_key: str,
                  stop: Callable[[Mapping], bool] = lambda state: False, exit_to: str = END
                  ) -> None:
    """Loop ``last → first`` until `max_turns` turns ran or `stop(state)` holds.

    The turn counter lives in ``state[turn_key]`` and must be advanced by a node in the loop
    (e.g. ``last`` returns ``{turn_key: state[turn_key] + 1}``).
    """

    def next_turn(state: Mapping) -> str:
        if state.get(turn_key, 0) >= max_turns or stop(state):
            return exit_to
        return first

    next_turn.__name__ = f"loop_{last}_to_{first}"
    builder.add_conditional_edges(last, next_turn, [first, exit_to])
    register_turn_loop(builder, TurnLoop(first, last, max_turns, turn_key))
