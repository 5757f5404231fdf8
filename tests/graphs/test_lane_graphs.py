"""Packed graphs: k lanes in one LangGraph run compute what k separate runs compute."""

from __future__ import annotations

import asyncio
import contextlib
import operator
from dataclasses import dataclass
from typing import Annotated, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Send
from pydantic import BaseModel

from biaslab.graphs.lanes import (Lane, LaneFallback, Lanes, LaneValues, pack, packing_obstacle,
                                   run_packed)


class S(TypedDict, total=False):
    x: int
    n: int
    log: Annotated[list[str], operator.add]
    total: int


@dataclass
class Ctx:
    tag: str
    fail_at: int = -1


async def step(state: S, runtime: Runtime[Ctx]) -> dict:
    await asyncio.sleep(0.001 * state["x"])  # lanes finish their steps at different times
    if state.get("n", 0) == runtime.context.fail_at:
        raise ValueError(f"{runtime.context.tag} fails at {state.get('n', 0)}")
    return {"n": state.get("n", 0) + 1, "log": [f"{runtime.context.tag}:step"]}


def left(state: S) -> dict:
    return {"log": ["left"]}


async def right(state: S, runtime: Runtime[Ctx]) -> dict:
    return {"log": [f"right-{runtime.context.tag}"]}


def join(state: S) -> dict:
    return {"total": state.get("total", 0) + state["x"] * state["n"]}


def again(state: S) -> str:
    return "more" if state["n"] < state["x"] else "done"


def build() -> StateGraph:
    """A loop whose length depends on the input, a parallel fan-out, a join, a mapped router."""
    b = StateGraph(S, context_schema=Ctx)
    for name, fn in (("step", step), ("left", left), ("right", right), ("join", join)):
        b.add_node(name, fn)
    b.add_edge(START, "step")
    b.add_edge("step", "left")
    b.add_edge("step", "right")
    b.add_edge(["left", "right"], "join")
    b.add_conditional_edges("join", again, {"more": "step", "done": END})
    return b


async def single(x: int, ctx: Ctx):
    updates = []
    final = {}
    graph = build().compile()
    async for mode, chunk in graph.astream({"x": x}, context=ctx,
                                           stream_mode=["updates", "values"]):
        if mode == "updates":
            updates += [(node, update) for node, update in chunk.items()]
        else:
            final = chunk
    return final, updates


async def packed(xs: list[int], ctxs: list[Ctx]):
    settled = []

    def lane(j, ctx):
        async def settle():
            settled.append(j)
        return Lane(ctx, contextlib.nullcontext, settle)

    graph = pack(build(), len(xs)).compile()
    updates, errors = await run_packed(graph, [{"x": x} for x in xs],
                                       Lanes([lane(j, c) for j, c in enumerate(ctxs)]))
    return updates, errors, settled


def _fold(updates) -> dict:
    """The state the updates build (the log as a multiset: parallel nodes finish in any order)."""
    state = {}
    for _, update in updates:
        for key, value in (update or {}).items():
            state[key] = state.get(key, []) + value if key == "log" else value
    state["log"] = sorted(state.get("log", []))
    return state


def test_each_lane_computes_what_the_graph_computes_alone():
    xs = [3, 1, 2, 4]
    ctxs = [Ctx(f"c{j}") for j in range(len(xs))]
    lanes, errors, settled = asyncio.run(packed(xs, ctxs))
    assert errors == [None] * len(xs) and settled == []
    for x, ctx, got in zip(xs, ctxs, lanes):
        final, alone = asyncio.run(single(x, ctx))
        assert sorted(map(repr, got)) == sorted(map(repr, alone))  # same updates, node by node
        assert _fold(got) == {**_fold(alone)}
        assert final["total"] == x * sum(range(1, x + 1)) and final["n"] == x
        assert f"right-{ctx.tag}" in final["log"]  # each lane saw its own context


def test_a_failing_lane_stops_alone_and_settles():
    xs = [2, 3, 2]
    ctxs = [Ctx("a"), Ctx("b", fail_at=1), Ctx("c")]
    lanes, errors, settled = asyncio.run(packed(xs, ctxs))
    assert errors[0] is None and errors[2] is None
    assert errors[1] == "ValueError: b fails at 1" and settled == [1]
    # the failed lane kept what it did before the failure, and nothing after it
    assert [node for node, _ in lanes[1]].count("step") == 1
    for j in (0, 2):
        _, alone = asyncio.run(single(xs[j], ctxs[j]))
        assert sorted(map(repr, lanes[j])) == sorted(map(repr, alone))


def test_graphs_that_cannot_be_packed_say_why():
    class P(BaseModel):
        x: int = 0

    b = StateGraph(P)
    b.add_node("a", lambda s: {"x": 1})
    b.add_edge(START, "a")
    assert "not a TypedDict" in packing_obstacle(b)

    inner = build().compile()
    outer = StateGraph(S)
    outer.add_node("panel", inner)
    outer.add_edge(START, "panel")
    assert "not a function" in packing_obstacle(outer)
    with pytest.raises(ValueError, match="cannot pack"):
        pack(outer, 2)
    assert packing_obstacle(build()) is None


def test_a_send_from_a_router_asks_for_a_whole_graph_run():
    b = StateGraph(S)
    b.add_node("fan", lambda s: {"n": 0})
    b.add_node("one", lambda s: {"log": ["one"]})
    b.add_edge(START, "fan")
    b.add_conditional_edges("fan", lambda s: [Send("one", s)], ["one"])
    b.add_edge("one", END)
    graph = pack(b, 2).compile()
    lanes = Lanes([Lane(None, contextlib.nullcontext, None) for _ in range(2)])

    async def go():
        async for _ in graph.astream({"x#0": 1, "x#1": 2}, context=lanes):
            pass

    with pytest.raises(LaneFallback):
        asyncio.run(go())


# -- graphs without routers: one task per node for every lane, one channel per key ------------
class F(TypedDict, total=False):
    x: int
    a: int
    b: int
    total: int
    note: str


async def double(state: F, runtime: Runtime[Ctx]) -> dict:
    await asyncio.sleep(0.001 * state["x"])  # lanes finish at different times
    if runtime.context.fail_at == 0:
        raise ValueError(f"{runtime.context.tag} fails")
    return {"a": 2 * state["x"]}


def square(state: F) -> dict:
    return {"b": state["x"] ** 2}


def add(state: F) -> dict:
    return {"total": state["a"] + state["b"]}


def quiet(state: F) -> dict:
    return {}  # streamed by LangGraph as None


def straight() -> StateGraph:
    """A fan-out into two nodes, a join and a node that writes nothing: no router, no reducer."""
    b = StateGraph(F, context_schema=Ctx)
    for name, fn in (("double", double), ("square", square), ("add", add), ("quiet", quiet)):
        b.add_node(name, fn)
    b.add_edge(START, "double")
    b.add_edge(START, "square")
    b.add_edge(["double", "square"], "add")
    b.add_edge("add", "quiet")
    b.add_edge("quiet", END)
    return b


async def straight_alone(x: int, ctx: Ctx):
    updates = []
    async for chunk in straight().compile().astream({"x": x}, context=ctx, stream_mode="updates"):
        updates += list(chunk.items())
    return updates


def test_a_graph_without_routers_runs_its_lanes_in_one_task_per_node():
    k = 5
    compiled = pack(straight(), k).compile()
    lane_channels = [c for c in compiled.channels.values() if isinstance(c, LaneValues)]
    assert len(lane_channels) == len(F.__annotations__)  # one per key, not one per key and lane
    assert set(compiled.nodes) >= {"double", "square", "add", "quiet"}  # the graph's own names
    xs = [3, 1, 4, 1, 5]
    ctxs = [Ctx(f"c{j}", fail_at=0 if j == 2 else -1) for j in range(k)]
    settled = []

    async def settle_2():
        settled.append(2)

    lanes = Lanes([Lane(c, contextlib.nullcontext, settle_2) for c in ctxs])
    got, errors = asyncio.run(run_packed(compiled, [{"x": x} for x in xs], lanes))
    assert errors == [None, None, "ValueError: c2 fails", None, None] and settled == [2]
    for j, x in enumerate(xs):
        if j == 2:  # the failed lane kept what it did before (square ran beside double), no more
            assert [node for node, _ in got[j]] == ["square"]
            continue
        alone = asyncio.run(straight_alone(x, ctxs[j]))
        assert sorted(map(repr, got[j])) == sorted(map(repr, alone))
        assert ("quiet", None) in got[j] and ("add", {"total": 2 * x + x * x}) in got[j]


def test_two_writes_of_a_key_in_one_step_fail_as_they_do_alone():
    b = StateGraph(F)
    b.add_node("one", lambda s: {"a": 1})
    b.add_node("two", lambda s: {"a": 2})
    b.add_edge(START, "one")
    b.add_edge(START, "two")
    with pytest.raises(Exception, match="one value per step"):
        asyncio.run(straight_alone_of(b.compile(), {"x": 1}))
    lanes = Lanes([Lane(None, contextlib.nullcontext, None) for _ in range(2)])
    with pytest.raises(Exception, match="one value per step"):
        asyncio.run(run_packed(pack(b, 2).compile(), [{"x": 1}, {"x": 2}], lanes))


async def straight_alone_of(graph, state):
    async for _ in graph.astream(state):
        pass
