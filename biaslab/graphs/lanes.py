"""Several cells in one LangGraph run: k disjoint copies ("lanes") of a protocol's graph.

Why: a LangGraph invocation costs about 0.4 ms of CPU before any node runs (config and
callback setup, the Pregel loop, a checkpoint per step), which is more than everything else a
one-call cell does. Packing k cells into one invocation pays that once per k cells.

Lane ``j`` holds the graph's nodes as ``node#j`` and its state keys as ``key#j``, with the
same reducers, edges and routers. Lanes share no channel, so every lane computes exactly what
the graph computes alone; they only share supersteps (a lane waits for the slowest lane of its
batch at each step, and the runner keeps more cells in flight to make up for it). A node that
raises fails its own lane only: the lane records the error and skips the rest of its graph.

Packing applies to graphs built from the parts biaslab's protocols use: a TypedDict state
(reducers allowed), function nodes, static and waiting edges and routers that name nodes.
`packing_obstacle` names what stops any other graph, which then runs one cell per invocation;
so do batches where a lane does something only a whole graph can (a ``Send``, a ``Command``).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

__all__ = ["Lane", "Lanes", "LaneFallback", "pack", "packing_obstacle", "lane_state",
           "run_packed"]

SEP = "#"
ERROR = "lane_error"
"""State key of a lane's failure (``lane_error#j``): set once, it stops the lane."""


class LaneFallback(Exception):
    """A lane did something a packed graph cannot express: run the batch one cell at a time."""


@dataclass
class Lane:
    """One cell inside a packed run.

    Attributes:
        context: what the cell's nodes see as ``runtime.context``.
        enter: a context-manager factory wrapped around each of the lane's node runs (the
            runner tracks the cell's model calls with it).
        settle: awaited after a node of the lane failed, before the failure is recorded (its
            sibling calls still in flight land first).
        fatal: exception types that must stop the whole run, not just the lane.
    """

    context: Any
    enter: Callable[[], Any]
    settle: Callable[[], Any]
    fatal: tuple[type[BaseException], ...] = ()


@dataclass
class Lanes:
    """The packed graph's run context: one `Lane` per cell."""

    lanes: Sequence[Lane] = field(default_factory=list)


def packing_obstacle(builder: StateGraph) -> str | None:
    """Why `builder` cannot be packed, or None if it can."""
    schema = builder.state_schema
    if not (isinstance(schema, type) and typing.is_typeddict(schema)):
        return f"its state schema {getattr(schema, '__name__', schema)!r} is not a TypedDict"
    if builder.managed:
        return "its state uses managed values"
    if ERROR in _keys(builder):
        return f"its state has a key named '{ERROR}', which lanes use for failures"
    for name, spec in builder.nodes.items():
        if not hasattr(spec.runnable, "func_accepts"):
            return f"node '{name}' is not a function (a compiled subgraph or another Runnable)"
        if spec.input_schema is not schema:
            return f"node '{name}' reads its own input schema"
        if spec.ends or spec.defer or spec.cache_policy or getattr(spec, "is_error_handler", False) \
                or getattr(spec, "error_handler_node", None):
            return f"node '{name}' uses Command destinations, defer, a cache or error handlers"
    for start, branches in builder.branches.items():
        for branch in branches.values():
            if not hasattr(branch.path, "func_accepts"):
                return f"a router after '{start}' is not a function"
    return None


def _keys(builder: StateGraph) -> dict[str, Any]:
    return typing.get_type_hints(builder.state_schema, include_extras=True)


def _lane_schema(name: str, keys: dict[str, Any], j: int) -> type:
    fields = {f"{key}{SEP}{j}": hint for key, hint in keys.items()}
    fields[f"{ERROR}{SEP}{j}"] = str | None
    return TypedDict(f"{name}Lane{j}", fields, total=False)  # type: ignore[operator]


def lane_state(state: dict[str, Any], j: int) -> dict[str, Any]:
    """Lane `j`'s values in the packed state, under the graph's own key names (its failure
    marker left out: the graph's own nodes never see it)."""
    suffix = f"{SEP}{j}"
    n = len(suffix)
    return {key[:-n]: value for key, value in state.items()
            if key.endswith(suffix) and key[:-n] != ERROR}


def _renamed(update: Any, suffix: str) -> Any:
    if update is None:
        return None
    if not isinstance(update, dict):
        raise LaneFallback(f"a node returned {type(update).__name__}, not a dict")
    return {f"{key}{suffix}": value for key, value in update.items()}


def _runtime_kwargs(runnable, runtime: Runtime, lane: Lane) -> dict[str, Any]:
    return {"runtime": runtime.override(context=lane.context)} \
        if "runtime" in runnable.func_accepts else {}


class _LaneNode:
    """Node ``name#j``: the graph's node on lane j's state and context.

    An object rather than a closure: LangGraph scans a function node's closure for subgraphs
    at compile time (milliseconds per node), and a packed graph has k times the nodes."""

    def __init__(self, spec, j: int):
        self.runnable = spec.runnable
        self.j, self.suffix, self.error_key = j, f"{SEP}{j}", f"{ERROR}{SEP}{j}"

    async def __call__(self, state: dict, config: RunnableConfig,
                       runtime: Runtime[Lanes]) -> dict | None:
        if state.get(self.error_key) is not None:
            return None  # the lane failed earlier: the rest of its graph is skipped
        lane = runtime.context.lanes[self.j]
        try:
            with lane.enter():
                update = await self.runnable.ainvoke(
                    lane_state(state, self.j), config,
                    **_runtime_kwargs(self.runnable, runtime, lane))
            return _renamed(update, self.suffix)
        except (LaneFallback, *lane.fatal):
            raise
        except Exception as exc:  # this cell fails; the other lanes go on
            await lane.settle()
            return {self.error_key: f"{type(exc).__name__}: {exc}"}


def _router(branch, j: int, node_names: set[str], schema: type) -> Callable:
    path, ends = branch.path, branch.ends
    suffix, error_key = f"{SEP}{j}", f"{ERROR}{SEP}{j}"

    def target(result: Any) -> str:
        if not isinstance(result, str) or not (ends or result in node_names or result == END):
            raise LaneFallback(f"a router returned {result!r}")  # a Send, or an unknown name
        name = ends[result] if ends else result
        return END if name == END else f"{name}{suffix}"

    async def lane_router(state: dict, config, runtime: Runtime[Lanes]) -> Any:
        if state.get(error_key) is not None:
            return END
        lane = runtime.context.lanes[j]
        with lane.enter():
            result = await path.ainvoke(lane_state(state, j), config,
                                        **_runtime_kwargs(path, runtime, lane))
        if isinstance(result, (list, tuple)):
            return [target(r) for r in result]
        return target(result)

    lane_router.__annotations__["state"] = schema  # LangGraph then reads only this lane's keys
    return lane_router


def pack(builder: StateGraph, k: int) -> StateGraph:
    """A graph running `k` cells of `builder`'s graph side by side (see the module docstring).

    Raises:
        ValueError: the graph cannot be packed (`packing_obstacle` says why).
    """
    obstacle = packing_obstacle(builder)
    if obstacle:
        raise ValueError(f"cannot pack this graph: {obstacle}")
    keys = _keys(builder)
    name = builder.state_schema.__name__
    schemas = [_lane_schema(name, keys, j) for j in range(k)]
    fields: dict[str, Any] = {}
    for schema in schemas:
        fields.update(typing.get_type_hints(schema, include_extras=True))
    packed = StateGraph(TypedDict(f"{name}Lanes{k}", fields, total=False),  # type: ignore[operator]
                        context_schema=Lanes)
    node_names = set(builder.nodes)

    def named(node: str, j: int) -> str:
        return node if node in (START, END) else f"{node}{SEP}{j}"

    for j, schema in enumerate(schemas):
        for node, spec in builder.nodes.items():
            packed.add_node(named(node, j), _LaneNode(spec, j), input_schema=schema,
                            retry_policy=spec.retry_policy, metadata=spec.metadata)
        for start, end in builder.edges:
            packed.add_edge(named(start, j), named(end, j))
        for starts, end in builder.waiting_edges:
            packed.add_edge([named(s, j) for s in starts], named(end, j))
        for start, branches in builder.branches.items():
            for branch in branches.values():
                ends = None
                if branch.ends:
                    ends = [named(e, j) for e in dict.fromkeys(branch.ends.values())]
                packed.add_conditional_edges(named(start, j), _router(branch, j, node_names, schema),
                                             ends)
    return packed


def _lane_updates(chunk: dict[str, Any]) -> list[tuple[int, str, Any]]:
    """A packed run's ``updates`` chunk as (lane, node, update under the graph's own keys);
    a lane's failure comes as node ``None`` with the error text."""
    out = []
    for packed_name, update in chunk.items():
        node, _, lane = packed_name.rpartition(SEP)
        j = int(lane)
        if isinstance(update, dict):
            error = update.get(f"{ERROR}{SEP}{j}")
            if error is not None:
                out.append((j, None, error))
                continue
            update = lane_state(update, j)
        out.append((j, node, update))
    return out


async def run_packed(graph, states: Sequence[dict[str, Any]], lanes: Lanes
                     ) -> tuple[list[list[tuple[str, Any]]], list[str | None]]:
    """Run a compiled `pack`ed graph, lane j starting from ``states[j]``.

    Returns each lane's ``(node, update)`` outputs in the order they came, and its error text
    (None when the lane finished); a lane's outputs stop at its failure."""
    packed = {f"{key}{SEP}{j}": value for j, state in enumerate(states)
              for key, value in state.items()}
    outputs: list[list[tuple[str, Any]]] = [[] for _ in states]
    errors: list[str | None] = [None] * len(states)
    async for chunk in graph.astream(packed, context=lanes, stream_mode="updates"):
        for j, node, update in _lane_updates(chunk):
            if errors[j] is not None:
                continue
            if node is None:
                errors[j] = update
            else:
                outputs[j].append((node, update))
    return outputs, errors
