"""Several cells in one LangGraph run: k disjoint copies ("lanes") of a protocol's graph.

Why: a LangGraph invocation costs about 0.4 ms of CPU before any node runs (config and
callback setup, the Pregel loop, a checkpoint per step), which is more than everything else a
one-call cell does. Packing k cells into one invocation pays that once per k cells.

Two forms, one meaning: every lane computes exactly what the graph computes alone; lanes only
share supersteps (a lane waits for the slowest lane of its batch at each step, and the runner
keeps more cells in flight to make up for it). A node that raises fails its own lane only: the
lane records the error and skips the rest of its graph. What each lane's nodes returned is
recorded in its `Lane` (``outputs``, ``error``) as LangGraph would stream it.

- **Grouped** (`_grouped`), for graphs without routers whose keys are plain last values (every
  lane takes the same path): the graph's own nodes and edges, each node one task that runs its
  lanes side by side, each key one `LaneValues` channel (lane → value). LangGraph's cost per
  run then barely grows with the lanes. A node that runs a graph of its own inside (an
  audited app), or reads its task's ``config``, keeps the per-lane form (`OWN_TASK`).
- **Per lane** (every other packable graph): lane ``j`` holds the graph's nodes as ``node#j``
  and its state keys as ``key#j``, with the same reducers, edges and routers; lanes share no
  channel.

Packing applies to graphs built from the parts biaslab's protocols use: a TypedDict state
(reducers allowed), function nodes, static and waiting edges and routers that name nodes.
`packing_obstacle` names what stops any other graph, which then runs one cell per invocation;
so do batches where a lane does something only a whole graph can (a ``Send``, a ``Command``).
"""

from __future__ import annotations

import asyncio
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Sequence, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.channels.base import BaseChannel
from langgraph.errors import EmptyChannelError, InvalidUpdateError
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

__all__ = ["Lane", "Lanes", "LaneFallback", "LaneValues", "OWN_TASK", "pack", "packing_obstacle", "lane_state",
           "run_packed"]

OWN_TASK = "biaslab_own_task"
"""Node metadata: the node runs a graph or a Runnable of its own inside (an audited app), which
takes its checkpoint namespace and callbacks from the node's LangGraph task, so each lane of
the node needs a task of its own (``add_node(..., metadata={OWN_TASK: True})``)."""

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
    outputs: list[tuple[str, Any]] = field(default_factory=list)
    """What the lane's nodes returned, ``(node, update)`` in the order they finished."""
    error: str | None = None
    """Why the lane failed (its first node failure), or None."""


@dataclass
class Lanes:
    """The packed graph's run context: one `Lane` per cell."""

    lanes: Sequence[Lane] = field(default_factory=list)


class LaneValues(BaseChannel):
    """One state key of every lane at once: lane → value, each lane's value a LangGraph
    `LastValue` of its own (set at most once per step, absent until set).

    Why: a packed graph's cost per run grows with its channels; one channel per key rather
    than per key and lane keeps it the same for 1 cell or 64."""

    __slots__ = ("value",)

    def __init__(self, typ: Any = dict, key: str = "") -> None:
        super().__init__(typ, key)
        self.value: dict[int, Any] = {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LaneValues)

    @property
    def ValueType(self) -> Any:
        return dict

    @property
    def UpdateType(self) -> Any:
        return dict

    def copy(self):
        made = LaneValues(self.typ, self.key)
        made.value = self.value
        return made

    def from_checkpoint(self, checkpoint: Any):
        made = LaneValues(self.typ, self.key)
        if isinstance(checkpoint, dict):  # (else LangGraph's marker for "no checkpoint")
            made.value = checkpoint
        return made

    def checkpoint(self) -> Any:
        return self.value

    def update(self, values: Sequence[dict[int, Any]]) -> bool:
        if not values:
            return False
        value = dict(self.value)  # a new dict: a checkpoint taken earlier keeps its own
        written: set[int] = set()
        for update in values:
            for j, item in update.items():
                if j in written:  # what LastValue says of two writes in one step
                    raise InvalidUpdateError(
                        f"At key '{self.key}' of lane {j}: Can receive only one value per step.")
                written.add(j)
                value[j] = item
        self.value = value
        return True

    def get(self) -> dict[int, Any]:
        if not self.value:
            raise EmptyChannelError()
        return self.value

    def is_available(self) -> bool:
        return bool(self.value)


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


def _renamed(update: dict | None, suffix: str) -> dict | None:
    if update is None:
        return None
    return {f"{key}{suffix}": value for key, value in update.items()}


def _runtime_kwargs(runnable, runtime: Runtime, lane: Lane) -> dict[str, Any]:
    return {"runtime": runtime.override(context=lane.context)} \
        if "runtime" in runnable.func_accepts else {}


async def _run_lane(runnable, j: int, lane: Lane, state: dict, config: RunnableConfig,
                    runtime: Runtime, node: str, grouped: bool) -> dict | None:
    """One node of lane `j` on its own `state` (under the graph's key names) and context.

    Its update is recorded in ``lane.outputs`` and returned under lane j's key names (under
    the graph's own in a `grouped` graph). A failure is recorded in ``lane.error``: the lane
    stops, the other lanes go on; in a graph with routers it is also returned as
    ``lane_error#j``, which the lane's routers read."""
    try:
        with lane.enter():
            update = await runnable.ainvoke(state, config,
                                            **_runtime_kwargs(runnable, runtime, lane))
        if update is not None and not isinstance(update, dict):
            raise LaneFallback(f"a node returned {type(update).__name__}, not a dict")
        returned = update if grouped else _renamed(update, f"{SEP}{j}")
    except (LaneFallback, *lane.fatal):
        raise
    except Exception as exc:  # this cell fails; the other lanes go on
        await lane.settle()
        lane.error = f"{type(exc).__name__}: {exc}"
        return None if grouped else {f"{ERROR}{SEP}{j}": lane.error}
    lane.outputs.append((node, update or None))  # as LangGraph streams it: {} is None
    return returned


def _split(state: dict[str, dict[int, Any]], k: int) -> list[dict[str, Any]]:
    """A grouped graph's state (key → lane → value) as each lane's own state."""
    lanes: list[dict[str, Any]] = [{} for _ in range(k)]
    for key, values in state.items():
        for j, value in values.items():
            lanes[j][key] = value
    return lanes


class _LaneNode:
    """Node ``name#j``: the graph's node on lane j's state and context.

    An object rather than a closure: LangGraph scans a function node's closure for subgraphs
    at compile time (milliseconds per node), and a packed graph has k times the nodes."""

    def __init__(self, spec, name: str, j: int):
        self.runnable, self.name = spec.runnable, name
        self.j, self.error_key = j, f"{ERROR}{SEP}{j}"

    async def __call__(self, state: dict, config: RunnableConfig,
                       runtime: Runtime[Lanes]) -> dict | None:
        if state.get(self.error_key) is not None:
            return None  # the lane failed earlier: the rest of its graph is skipped
        return await _run_lane(self.runnable, self.j, runtime.context.lanes[self.j],
                               lane_state(state, self.j), config, runtime, self.name, False)


class _GroupNode:
    """Node ``name`` of a graph without routers, run for every lane in one LangGraph task.

    Without routers every lane visits the same nodes in the same supersteps, so one task per
    node (the lanes' runs side by side in it) computes what a task per lane computes, and
    LangGraph's per-task cost (config, callbacks, retry wrapper, scheduling) is paid once per
    node instead of once per cell."""

    def __init__(self, spec, name: str, k: int):
        self.runnable, self.name, self.k = spec.runnable, name, k

    async def __call__(self, state: dict, config: RunnableConfig,
                       runtime: Runtime[Lanes]) -> dict:
        lanes = runtime.context.lanes
        live = [j for j in range(self.k) if lanes[j].error is None]
        states = _split(state, self.k)
        # each lane in its own task, so each keeps its own context variables (call scopes)
        results = await asyncio.gather(
            *(_run_lane(self.runnable, j, lanes[j], states[j], config, runtime, self.name, True)
              for j in live), return_exceptions=True)
        for result in results:  # a fallback or a fatal error, once every lane has landed
            if isinstance(result, BaseException):
                raise result
        merged: dict[str, dict[int, Any]] = {}
        for j, update in zip(live, results):
            for key, value in (update or {}).items():
                merged.setdefault(key, {})[j] = value
        return merged


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
    if _groupable(builder, keys):
        return _grouped(builder, keys, k)
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
            packed.add_node(named(node, j), _LaneNode(spec, node, j), input_schema=schema,
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


def _groupable(builder: StateGraph, keys: dict[str, Any]) -> bool:
    """Whether every lane of `builder` can share one task per node (`_grouped`): no routers
    (every lane takes the same path), plain last-value keys, no node that needs its own task
    (marked `OWN_TASK`, or reading its task's ``config``)."""
    return (not builder.branches and not any(_has_reducer(hint) for hint in keys.values())
            and not any((spec.metadata or {}).get(OWN_TASK) or "config" in spec.runnable.func_accepts
                        for spec in builder.nodes.values()))


def _has_reducer(hint: Any) -> bool:
    """Whether a state key is anything but a plain last value (a reducer, a channel)."""
    return bool(getattr(hint, "__metadata__", ()))


def _grouped(builder: StateGraph, keys: dict[str, Any], k: int) -> StateGraph:
    """`builder`'s nodes and edges, each node running every lane (`_GroupNode`) and each key
    one `LaneValues` channel: for graphs whose path does not depend on the state (no routers)
    and whose keys are plain last values."""
    schema = TypedDict(f"{builder.state_schema.__name__}Grouped{k}",  # type: ignore[operator]
                       {key: Annotated[dict, LaneValues()] for key in keys}, total=False)
    packed = StateGraph(schema, context_schema=Lanes)
    for node, spec in builder.nodes.items():
        packed.add_node(node, _GroupNode(spec, node, k), retry_policy=spec.retry_policy,
                        metadata=spec.metadata)
    for start, end in builder.edges:
        packed.add_edge(start, end)
    for starts, end in builder.waiting_edges:
        packed.add_edge(list(starts), end)
    return packed


def _packed_input(graph, states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The packed graph's input: key → lane → value when it is grouped, else ``key#j``."""
    if _is_grouped(graph):
        packed: dict[str, dict[int, Any]] = {}
        for j, state in enumerate(states):
            for key, value in state.items():
                packed.setdefault(key, {})[j] = value
        return packed
    return {f"{key}{SEP}{j}": value for j, state in enumerate(states)
            for key, value in state.items()}


def _is_grouped(graph) -> bool:
    graph = getattr(graph, "bound", graph)  # (a compiled graph .with_config)
    return any(isinstance(channel, LaneValues) for channel in graph.channels.values())


async def run_packed(graph, states: Sequence[dict[str, Any]], lanes: Lanes
                     ) -> tuple[list[list[tuple[str, Any]]], list[str | None]]:
    """Run a compiled `pack`ed graph, lane j starting from ``states[j]``.

    Returns each lane's ``(node, update)`` outputs in the order they came, and its error text
    (None when the lane finished); a lane's outputs stop at its failure."""
    packed = _packed_input(graph, states)
    for lane in lanes.lanes:
        lane.outputs, lane.error = [], None
    # What each lane did is recorded by its nodes (`_run_lane`): nothing is streamed.
    async for _ in graph.astream(packed, context=lanes, stream_mode="custom"):
        pass
    return [lane.outputs for lane in lanes.lanes], [lane.error for lane in lanes.lanes]
