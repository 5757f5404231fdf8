"""LLM nodes are declared once, on the node itself, and read back from the graph.

Exposure arms, prompt bindings, slot checks, estimates and the run fingerprint all need to know
which nodes of a graph talk to a model. Rather than listing them a second time beside the graph,
a node function carries an `LLMNode` (``llm_node`` attaches it, ``llm_agent`` decorates a
hand-written node), and `graph_llm_nodes` reads them from the built graph in graph order,
descending into compiled subgraphs.
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from langgraph.graph import START, StateGraph

from biaslab.errors import UserError

__all__ = ["LLMNode", "TurnLoop", "declare_llm", "graph_llm_nodes", "llm_agent", "turn_loops",
           "register_turn_loop", "graph_order", "node_llm_nodes"]

ATTRIBUTE = "biaslab_llm_nodes"


@dataclass(frozen=True)
class LLMNode:
    """An LLM node as the grid sees it.

    Attributes:
        name: the name the node passes to ``ask``; binds its prompt, model and exposures.
        prompt: the default prompt id.
        slots: the slot names the node offers to any template bound to it.
        required: slots every bound template must use, or the node silently changes meaning
            (a prediction prompt without ``explanation`` turns E1 into E0).
        calls: expected model calls per visit of the node (batches, repeats, ensembles), for
            estimates; re-asks are not counted.
        max_tokens: expected reply length, for token estimates.
    """

    name: str
    prompt: str
    slots: tuple[str, ...]
    required: tuple[str, ...] = ()
    calls: float = 1.0
    max_tokens: int = 128

    def __post_init__(self):
        missing = [s for s in self.required if s not in self.slots]
        if missing:
            raise ValueError(f"LLM node '{self.name}': required slot '{missing[0]}' is not "
                             f"among the slots it offers {list(self.slots)}")


@dataclass(frozen=True)
class TurnLoop:
    """A loop from `last` back to `first`, run at most `max_turns` times; `turn_key` is the
    state key counting its turns (bookkeeping, never a measured output)."""

    first: str
    last: str
    max_turns: int
    turn_key: str = ""


_LOOPS: "weakref.WeakKeyDictionary[StateGraph, list[TurnLoop]]" = weakref.WeakKeyDictionary()


def declare_llm(fn: Callable, *nodes: LLMNode) -> Callable:
    """Attach LLM node declarations to a node function (one node may hold several LLM nodes,
    e.g. the members of a judge ensemble that are exposed one at a time)."""
    setattr(fn, ATTRIBUTE, tuple(nodes))
    return fn


def llm_agent(name: str, *, prompt: str, offers: Iterable[str], requires: Iterable[str] = (),
              calls: float = 1.0, max_tokens: int = 128) -> Callable[[Callable], Callable]:
    """Decorator for a hand-written node that calls ``ask(ctx, name, ...)`` itself.

    Example::

        @llm_agent("judge", prompt="mine/judge", offers=("answer",), requires=("answer",))
        async def judge(state, runtime): ...
    """
    node = LLMNode(name, prompt, tuple(offers), tuple(requires), calls, max_tokens)
    return lambda fn: declare_llm(fn, node)


def register_turn_loop(builder: StateGraph, loop: TurnLoop) -> None:
    _LOOPS.setdefault(builder, []).append(loop)


def turn_loops(builder: StateGraph) -> list[TurnLoop]:
    """The turn loops `add_turn_loop` wired into this builder."""
    return list(_LOOPS.get(builder, ()))


def _declared(spec: Any) -> tuple[LLMNode, ...]:
    runnable = spec.runnable
    for fn in (getattr(runnable, "func", None), getattr(runnable, "afunc", None), runnable):
        found = getattr(fn, ATTRIBUTE, None)
        if found:
            return found
    return ()


def _subgraph(spec: Any) -> StateGraph | None:
    builder = getattr(spec.runnable, "builder", None)
    return builder if isinstance(builder, StateGraph) else None


def graph_order(builder: StateGraph) -> list[str]:
    """Node names breadth-first from START along plain and conditional edges; nodes that
    cannot be reached follow in insertion order."""
    successors: dict[str, list[str]] = {}
    for src, dst in sorted(builder.edges):
        successors.setdefault(src, []).append(dst)
    for src, branches in builder.branches.items():
        for branch in branches.values():
            successors.setdefault(src, []).extend((branch.ends or {}).values())
    for starts, dst in getattr(builder, "waiting_edges", ()):
        for src in starts:
            successors.setdefault(src, []).append(dst)
    seen: list[str] = []
    queue = deque([START])
    while queue:
        node = queue.popleft()
        for nxt in successors.get(node, []):
            if nxt in builder.nodes and nxt not in seen:
                seen.append(nxt)
                queue.append(nxt)
    return seen + [n for n in builder.nodes if n not in seen]


def node_llm_nodes(builder: StateGraph, name: str) -> list[LLMNode]:
    """The LLM nodes declared by one node of `builder` (all of them, for a subgraph)."""
    spec = builder.nodes[name]
    sub = _subgraph(spec)
    return graph_llm_nodes(sub) if sub is not None else list(_declared(spec))


def graph_llm_nodes(builder: StateGraph) -> list[LLMNode]:
    """Every declared LLM node of a graph (and its compiled subgraphs), in graph order.

    Raises:
        UserError: two declarations share a name with different prompts or slots.
    """
    found: dict[str, LLMNode] = {}
    for name in graph_order(builder):
        for node in node_llm_nodes(builder, name):
            if node.name in found and found[node.name] != node:
                raise UserError(f"two LLM nodes are named '{node.name}' with different "
                                "declarations; give each its own name")
            found.setdefault(node.name, node)
    return list(found.values())
