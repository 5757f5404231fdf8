"""Every LangChain tool an audited app runs in a cell: recorded, and answered from the record.

An app's tools act on the world: a lookup writes a log row, a tool sends a message, another
reads a source that changes. A replay that ran them again would act on the world again and
read another answer, so it would be neither safe nor exact. While a cell of the app runs
(`recording_tools`), ``BaseTool.run`` and ``BaseTool.arun`` are replaced on the base class.
Every way LangChain runs a tool ends there: ``invoke``/``ainvoke``, LangGraph's ``ToolNode``
and ``create_react_agent``, a node calling ``my_tool.invoke(...)`` itself. Each execution is

1. attributed to the app's node the way model calls are (`biaslab.agents.app_models.node_path`);
2. keyed by the node, the tool's name, its arguments as canonical JSON (arguments LangChain
   injects, such as the graph state, left out) and which occurrence of that same call in the
   cell it is;
3. answered from the record when the run's own store, the replayed source run or the shared
   cache holds that key, and otherwise run live (in a first run), refused (a strict replay,
   or a counterfactual with ``tools = "replay"``) or run live (``tools = "live"``);
4. kept in the cell's output (``tools``: node, tool, arguments, occurrence, result or error),
   and its result in the response cache under a key of its own, so a later replay finds it.

Two keys are written: the exact one (the cell's id: a strict replay, a resumed cell, a second
run of the same spec) and the item's (variant, item and seed, not the arm or the model: a
counterfactual that adds arms asks the same tool on the same item). The item's key is read
only in a counterfactual (`counterfactual_tools`) and only from its source, never from the run
being made, so a first run's arms never answer each other's tools. (A ``--workers`` shard also
reads its main run's store as a source; it is the same run, so it reads exact keys only, and
runs what they lack.)
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Mapping

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool

from biaslab.agents.app_models import node_path
from biaslab.agents.class_patch import ClassPatch
from biaslab.agents.context import CellContext
from biaslab.errors import ReplayMiss
from biaslab.traces.cache import CachedResponse

__all__ = ["AppTools", "ToolRefused", "RecordedToolError", "recording_tools", "TOOL_SETTINGS",
           "ToolSetting", "tool_rows", "counterfactual_tools"]

ToolSetting = Literal["replay", "live"]
TOOL_SETTINGS: tuple[str, ...] = ("replay", "live")
"""``tools`` in an app spec: what a replay does with a tool call its source never recorded."""
_KEY_VERSION = "biaslab-tool/1"


class ToolRefused(RuntimeError):
    """A counterfactual replay with ``tools = "replay"`` met a tool call its source never
    made: running it would act on the world; the cell fails, naming the node and the tool."""


class RecordedToolError(RuntimeError):
    """A tool that raised in the recorded run raises again, with the same text, when it is
    answered from the record."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                      default=str)


def _exact_json(value: Any) -> bool:
    """Whether `value` comes back equal from JSON (a str, a list of content blocks...): only
    then can a replay hand the app what the tool returned."""
    try:
        return json.loads(json.dumps(value)) == value
    except (TypeError, ValueError):
        return False


@dataclass
class AppTools:
    """One cell's tool executions and where their records go.

    Attributes:
        ctx: the cell's context (its gateway holds the caches the records go to).
        loop: the event loop the caches are used from (a sync tool runs in a worker thread).
        setting: ``replay`` or ``live``: what a replay does with a call its source lacks.
        prefix: the checkpoint namespace the app runs in (as `AppCalls.prefix`).
        app: names the app (its reference) in the keys: the shared cache serves every
            experiment, and another app's tool of the same name is another tool.
        records: the cell's tool executions, in order, as the cell's output keeps them.
        refused: the first refusal, raised again after the app returns, so an app that
            catches its tools' errors (``handle_tool_errors=True``) cannot hide it.
    """

    ctx: CellContext
    loop: asyncio.AbstractEventLoop
    setting: str = "replay"
    prefix: str = ""
    app: str = ""
    records: list[dict[str, Any]] = field(default_factory=list)
    refused: Exception | None = None
    _seen: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- keys --------------------------------------------------------------------------------
    def _occurrence(self, call: str) -> int:
        with self._lock:
            n = self._seen.get(call, 0)
            self._seen[call] = n + 1
        return n

    def _world(self) -> str:
        coords = self.ctx.coords or {}
        if not coords.get("item"):
            return self.ctx.cell_id
        return _canonical([coords.get("variant"), coords.get("item"), coords.get("seed")])

    def _key(self, scope: str, call: str, occurrence: int) -> str:
        return hashlib.sha256(_canonical([_KEY_VERSION, self.app, scope, call, occurrence]
                                         ).encode()).hexdigest()

    # -- the caches (used on the loop's thread: SQLite connections stay in theirs) -----------
    def _recorded(self, exact: str, world: str) -> dict[str, Any] | None:
        gateway = self.ctx.gateway
        own = gateway.caches[0] if gateway.caches else None
        hit = None
        for cache in (*gateway.caches[:1], *gateway.replay, *gateway.caches[1:]):
            hit = cache.get(exact)
            if hit is not None:
                break
        if hit is None and _COUNTERFACTUAL.get():  # the item's key: from the source only
            for cache in gateway.replay:
                hit = cache.get(world)
                if hit is not None:
                    break
        if hit is None:
            return None
        if own is not None:  # the run stays replayable on its own
            for key in (exact, world):
                if own.get(key) is None:
                    self._put(own, key, hit)
        return json.loads(hit.raw)

    def _remember(self, exact: str, world: str, record: Mapping[str, Any]) -> None:
        gateway = self.ctx.gateway
        response = CachedResponse(_canonical(record), 0, 0)
        for i, cache in enumerate(gateway.caches):
            self._put(cache, exact, response)
            if i == 0:
                self._put(cache, world, response)

    def _put(self, cache, key: str, response: CachedResponse) -> None:
        gateway = self.ctx.gateway
        if gateway.on_store is not None and gateway.caches and cache is gateway.caches[0]:
            gateway.on_store(key, response, {})
        elif gateway.batch_writes:
            cache.put_later(key, response, {})
        else:
            cache.put(key, response, {})

    def _on_loop(self, fn, *args):
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop or self.loop.is_closed():
            return fn(*args)

        async def hop():
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(hop(), self.loop).result()

    # -- one execution -----------------------------------------------------------------------
    def lookup(self, tool: BaseTool, tool_input: Any, metadata: Mapping[str, Any] | None
               ) -> tuple[dict[str, Any], str, str, dict[str, Any] | None]:
        """The row this execution will be recorded as, its two keys, and the record that
        answers it (None: it must run, or be refused by `check_live`)."""
        node = node_path(metadata, self.prefix)
        args = tool_input
        if isinstance(tool_input, dict):
            with contextlib.suppress(Exception):  # (a tool without injected args: as given)
                args = tool._filter_injected_args(tool_input)
        args = json.loads(_canonical(args))
        call = _canonical([node, tool.name, args])
        occurrence = self._occurrence(call)
        exact = self._key(self.ctx.cell_id, call, occurrence)
        world = self._key(self._world(), call, occurrence)
        row = {"node": node, "tool": tool.name, "args": args, "occurrence": occurrence}
        return row, exact, world, self._on_loop(self._recorded, exact, world)

    def check_live(self, row: Mapping[str, Any]) -> None:
        """Refuse a call the record lacks where running it is not allowed."""
        gateway = self.ctx.gateway
        what = (f"node '{row['node']}' called tool '{row['tool']}' with arguments "
                f"{_canonical(row['args'])} (occurrence {row['occurrence']}) in cell "
                f"{self.ctx.cell_id}")
        if gateway.mode in ("strict", "offline"):
            error: Exception = ReplayMiss(f"strict replay: the source trace has no tool call "
                                          f"for {what}; biaslab runs no tool in a strict replay")
        elif _COUNTERFACTUAL.get() and self.setting == "replay":
            error = ToolRefused(f"{what}, which the source run never made; tools = \"replay\" "
                                "refuses to run a tool live in a replay (set tools = \"live\" "
                                "in the spec to let it run)")
        else:
            return
        with self._lock:
            self.refused = self.refused or error
        raise error

    def keep(self, row: dict[str, Any], exact: str, world: str, record: dict[str, Any],
             fresh: bool) -> None:
        """Add an execution to the cell's records; a fresh one is also stored to be replayed."""
        if fresh:
            self._on_loop(self._remember, exact, world, record)
        with self._lock:
            self.records.append({**row, **record})

    def raise_refusal(self) -> None:
        if self.refused is not None:
            raise self.refused


def _result(output: Any) -> dict[str, Any]:
    """What a tool returned, as the record keeps it."""
    if isinstance(output, ToolMessage):
        record = {"content": output.content, "status": output.status, "message": True}
        if output.artifact is not None:
            record["artifact"] = output.artifact
        value = [output.content, output.artifact]
    else:
        record, value = {"content": output, "message": False}, output
    if not _exact_json(value):
        record["inexact"] = f"{type(value).__name__} kept as text"
    return json.loads(_canonical(record))


def _answer(tool: BaseTool, record: Mapping[str, Any], tool_call_id: str | None) -> Any:
    """The tool's output rebuilt from its record, as `BaseTool.run` would return it."""
    if record.get("error"):
        raise RecordedToolError(record["error"])
    if record.get("inexact"):
        raise RecordedToolError(f"tool '{tool.name}' returned a value biaslab cannot record "
                                f"exactly ({record['inexact']}), so it cannot be replayed")
    if record.get("message") and tool_call_id is not None:
        return ToolMessage(content=record["content"], artifact=record.get("artifact"),
                           tool_call_id=tool_call_id, name=tool.name,
                           status=record.get("status") or "success")
    return record["content"]


_ACTIVE: contextvars.ContextVar[AppTools | None] = contextvars.ContextVar(
    "biaslab_app_tools", default=None)
_COUNTERFACTUAL: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "biaslab_counterfactual_tools", default=False)


@contextlib.contextmanager
def counterfactual_tools() -> Iterator[None]:
    """Mark the cells run in this block (tasks started from it inherit the mark) as a
    counterfactual's: a tool call is also answered from the source's record of the same item in
    another arm, and one the source never made is refused unless the spec says ``tools =
    "live"``. Why a mark: a ``--workers`` shard reads its main run's store as a source too, and
    must run what it lacks, like any first run."""
    token = _COUNTERFACTUAL.set(True)
    try:
        yield
    finally:
        _COUNTERFACTUAL.reset(token)


def _active(tool: BaseTool) -> AppTools:
    tools = _ACTIVE.get()
    if tools is None:
        raise ToolRefused(f"tool '{tool.name}' ran outside an audited cell (a thread that did "
                          "not inherit the cell's context); biaslab refuses to run a tool it "
                          "cannot record")
    return tools


def _metadata(kwargs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The run metadata naming the tool's node: what ``invoke`` passed on, else (a node that
    called ``run`` itself) the node's own, from the context LangGraph runs it in."""
    config = kwargs.get("config") or {}
    found = {**(config.get("metadata") or {}), **(kwargs.get("metadata") or {})}
    if "langgraph_node" not in found:
        from langchain_core.runnables.config import var_child_runnable_config

        found = {**((var_child_runnable_config.get() or {}).get("metadata") or {}), **found}
    return found


def _validates(tool: BaseTool, tool_input: Any, tool_call_id: str | None) -> bool:
    """Whether the input passes the tool's own validation (which runs nothing): an input
    that fails it goes to LangChain's run as it is, which reports it the way it always does."""
    check = getattr(tool, "_to_args_and_kwargs", None)
    if check is None:  # (a LangChain without it: every input is recorded, none slips past)
        return True
    try:
        check(tool_input, tool_call_id)
    except Exception:
        return False
    return True


def _run(self, tool_input, *args, **kwargs):
    original = _PATCH.original["run"]
    tools = _active(self)
    tool_call_id = kwargs.get("tool_call_id")
    if not _validates(self, tool_input, tool_call_id):
        return original(self, tool_input, *args, **kwargs)
    row, exact, world, record = tools.lookup(self, tool_input, _metadata(kwargs))
    if record is not None:
        tools.keep(row, exact, world, record, fresh=False)
        return _answer(self, record, tool_call_id)
    tools.check_live(row)
    try:
        output = original(self, tool_input, *args, **kwargs)
    except Exception as exc:
        tools.keep(row, exact, world, {"error": f"{type(exc).__name__}: {exc}"}, fresh=True)
        raise
    tools.keep(row, exact, world, _result(output), fresh=True)
    return output


async def _arun(self, tool_input, *args, **kwargs):
    original = _PATCH.original["arun"]
    tools = _active(self)
    tool_call_id = kwargs.get("tool_call_id")
    if not _validates(self, tool_input, tool_call_id):
        return await original(self, tool_input, *args, **kwargs)
    row, exact, world, record = tools.lookup(self, tool_input, _metadata(kwargs))
    if record is not None:
        tools.keep(row, exact, world, record, fresh=False)
        return _answer(self, record, tool_call_id)
    tools.check_live(row)
    try:
        output = await original(self, tool_input, *args, **kwargs)
    except Exception as exc:
        tools.keep(row, exact, world, {"error": f"{type(exc).__name__}: {exc}"}, fresh=True)
        raise
    tools.keep(row, exact, world, _result(output), fresh=True)
    return output


_PATCHES = {"run": _run, "arun": _arun}


_PATCH = ClassPatch(BaseTool, _PATCHES)


@contextlib.contextmanager
def recording_tools(tools: AppTools) -> Iterator[AppTools]:
    """Record (and answer from the record) the LangChain tools run in this block, and in tasks
    and threads started from it with its context, as `tools`' cell's."""
    _PATCH.install()
    token = _ACTIVE.set(tools)
    try:
        yield tools
    finally:
        _ACTIVE.reset(token)
        _PATCH.uninstall()


def tool_rows(cell_id: str, output: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tool executions an app cell's output holds, one flat row each (for a table)."""
    rows = []
    for i, entry in enumerate(output.get("tools") or []):
        rows.append({"cell_id": cell_id, "seq": i, "node": entry.get("node"),
                     "tool": entry.get("tool"), "occurrence": entry.get("occurrence"),
                     "args": _canonical(entry.get("args")),
                     "result": _canonical(entry.get("content")) if "content" in entry else "",
                     "status": entry.get("status", ""), "error": entry.get("error") or ""})
    return rows
