"""An unmodified LangGraph app, audited like a protocol: ``app = "hiring_app.py:graph"``.

The app is loaded as it is (a compiled graph, an uncompiled ``StateGraph`` or a zero-argument
function returning one) and run once per cell on one item of ``items`` (a JSON-lines file of
input states). Its chat-model calls are routed through the gateway by
`biaslab.agents.app_models` and attributed to the app's own nodes, so the exposure grid,
mitigations, ``[nodes.NAME]`` model bindings, recording and replay act on the app's nodes by
name. The cell's output is the app's outcome (``[outcome] field`` of the final state, or a
function of it) with the unit and group read from the item, and the final state itself; the
generic report pairs the outcome of each unit in the clean and the exposed arms. The LangChain
tools the app runs are recorded (the output's ``tools``) and, in replays, answered from the
record (`biaslab.agents.app_tools`).

Which nodes call a model is known only by running the app: before the grid is made, one
discovery pass runs the first item clean on the first model (`AppAudit.prepare_plan`). Its
calls go to the shared response cache, so the run's first cell is answered from it, and its
result (the nodes, their calls and tokens) is kept in the resolved spec (``options.discovered``)
and beside the shared cache, so it is paid once; `report` and `replay` never repeat it.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from pydantic import BaseModel, ConfigDict, Field

from biaslab.agents.app_egress import guarding
from biaslab.agents.app_guard import parse_allow_hosts
from biaslab.agents.app_models import APP_PROMPT, AppCalls, intercepting
from biaslab.agents.app_tools import (TOOL_SETTINGS, AppTools, ToolSetting, recording_tools,
                                      tool_rows)
from biaslab.agents.context import Bindings, CellContext
from biaslab.agents.gateway import Gateway, RetryPolicy, RunCounters
from biaslab.agents.providers import ModelSpec, parse_model
from biaslab.errors import ModelCallError, UserError
from biaslab.graphs.langgraph_config import is_langgraph_ref, resolve_langgraph_ref
from biaslab.graphs.llm_nodes import LLMNode
from biaslab.graphs.lanes import OWN_TASK
from biaslab.graphs.registry import (Protocol, _file_sha, _import_module, _load_file, protocol)
from biaslab.graphs.units import AnalysisUnit
from biaslab.prompts.exposure import CLEAN
from biaslab.prompts.registry import PromptRegistry
from biaslab.traces.cache import shared_cache_path
from biaslab.traces.shared_cache import open_shared_cache

__all__ = ["AppAudit", "AppOptions", "APP_NODE", "DISCOVERY_CONDITION", "check_unambiguous",
           "app_spec_options", "concrete_ref", "load_app", "read_items", "outcome_of",
           "state_json"]

DISCOVERY_CONDITION = "discovery"
"""The condition ``cache_use.csv`` lists the discovery pass's calls under."""
APP_NODE = "app"
"""biaslab's one node around the app: its output holds the outcome and the final state."""
_TARGET_KEYWORDS = ("all", "singletons", "each_and_all", "each")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class AppOptions(BaseModel):
    """What an app spec's top-level keys become (`app_spec_options`)."""

    model_config = ConfigDict(extra="forbid")

    app: str = ""
    """``file.py:attribute`` (relative to the spec) or ``module:attribute``."""
    items_file: str = ""
    """One input state per line, a JSON object."""
    outcome_field: str | None = None
    """A dotted path into the final state (list indexes allowed: ``messages.-1.content``)."""
    outcome_parse: str | None = None
    """``file.py:function`` or ``module:function`` of the final state, returning the outcome."""
    unit: str | None = None
    """The item key naming the unit; default ``id`` when every item has one, else the line."""
    group: str | None = None
    """The item key naming the unit's group, for per-group effects."""
    directions: dict[str, dict[str, str]] = {}
    """The exposure template's slot values, per direction."""
    traces_model_map: dict[str, str] = {}
    """``[traces] model_map``: a recorded model name → the model (label) the run binds to
    the node; where items come from a trace file, a call identical to a recorded call of a
    mapped model is answered from the trace (docs/traces.md)."""
    traces_filter: dict[str, str] = {}
    """``[traces] since``, ``until`` and ``tag``: which traces of the file are the items."""
    recursion_limit: int = Field(default=100, ge=1, le=10_000)
    """LangGraph steps one item may take."""
    allow_hosts: list[str] = []
    """Hosts (``host`` or ``host:port``) the app's own code may reach while a cell runs,
    besides its model calls, which biaslab answers (`biaslab.agents.app_egress`)."""
    tools: ToolSetting = "replay"
    """What a replay does with a tool call its source never made (`biaslab.agents.app_tools`):
    ``replay`` fails the cell, ``live`` runs the tool. A recorded call is always answered from
    the record, and a first run runs every tool it has not run before."""
    discovered: dict[str, Any] | None = None
    """Set by the discovery pass: ``nodes`` (node → calls on the first item, in order of
    first call), ``tokens`` (node → tokens) and the ``item`` and ``model`` it ran; and
    ``accounting`` (its calls and paid calls per node) when the pass ran for this run rather
    than being read from the memo, for ``cache_use.csv``."""


def _check_directions(directions: Any) -> None:
    """A direction that favours nobody (``favored = ""``) or the group it also names as
    ``other`` would expose the app to a tilt toward no one: refused, not run as if it meant
    something."""
    if not isinstance(directions, dict):
        return  # the options model names the shape it expects
    for name, slots in directions.items():
        if not isinstance(slots, dict):
            continue
        favored, other = slots.get("favored"), slots.get("other")
        if isinstance(favored, str) and not favored.strip():
            raise UserError(f"[directions.{name}]: favored is empty; name the group the "
                            "exposure favours")
        if isinstance(other, str) and not other.strip():
            raise UserError(f"[directions.{name}]: other is empty; name the group the "
                            "exposure disfavours")
        if isinstance(favored, str) and isinstance(other, str) \
                and favored.strip().casefold() == other.strip().casefold():
            raise UserError(f"[directions.{name}]: favored and other are both '{favored}'; "
                            "a direction favours one group over another")


def app_spec_options(data: Mapping[str, Any]) -> dict[str, Any]:
    """An app spec's top-level ``app``, ``items``, ``[outcome]`` and ``[directions.*]`` as
    the options of protocol ``app-audit``; the rest of the spec is as for any protocol."""
    if data.get("protocol") not in (None, AppAudit.name):
        raise UserError("a spec names either app = \"...\" (an app to audit) or protocol = "
                        "\"...\", not both")
    if data.get("options"):
        raise UserError("an app spec takes no [options]: its settings are app, items, "
                        "[outcome] and [directions.*]")
    outcome = data.get("outcome")
    if not isinstance(outcome, dict) or not (outcome.get("field") or outcome.get("parse")):
        raise UserError("an app spec needs an [outcome] table with field = \"<key of the "
                        "final state>\" or parse = \"file.py:function\"")
    unknown = set(outcome) - {"field", "parse", "unit", "group"}
    if unknown:
        raise UserError(f"[outcome]: unknown key '{sorted(unknown)[0]}' (keys: field, parse, "
                        "unit, group)")
    if "items" not in data:
        raise UserError("an app spec needs items = \"cases.jsonl\" (one input state per line)")
    _check_directions(data.get("directions") or {})
    options = {"app": data["app"], "items_file": data["items"],
               "outcome_field": outcome.get("field"), "outcome_parse": outcome.get("parse"),
               "unit": outcome.get("unit"), "group": outcome.get("group"),
               "directions": data.get("directions") or {},
               "recursion_limit": data.get("recursion_limit"),
               "allow_hosts": [str(rule) for rule in parse_allow_hosts(data.get("allow_hosts"))]
               or None, "tools": data.get("tools"), **_traces_table(data.get("traces"))}
    if "tools" in data and data["tools"] not in TOOL_SETTINGS:
        raise UserError(f"tools = {data['tools']!r}: must be \"replay\" (a replay answers "
                        "tools from the record and refuses new calls) or \"live\"")
    rest = {k: v for k, v in data.items()
            if k not in ("app", "items", "outcome", "directions", "options", "protocol",
                         "recursion_limit", "allow_hosts", "tools", "traces")}
    # "each": every node that calls a model, alone (the core's "singletons")
    if isinstance(rest.get("conditions"), dict) and rest["conditions"].get("targets") == "each":
        rest["conditions"] = {**rest["conditions"], "targets": "singletons"}
    for name, m in (rest.get("mitigations") or {}).items():
        if isinstance(m, dict) and m.get("targets") == "each":
            rest["mitigations"] = {**rest["mitigations"], name: {**m, "targets": "singletons"}}
    return {**rest, "protocol": AppAudit.name,
            "options": {k: v for k, v in options.items() if v is not None}}


def _traces_table(table: Any) -> dict[str, Any]:
    """``[traces] model_map = {"recorded name" = "model label"}``, ``since``, ``until`` and
    ``tag``, checked, as options."""
    if table is None:
        return {}
    keys = {"model_map", "since", "until", "tag"}
    if not isinstance(table, dict) or set(table) - keys or not isinstance(
            table.get("model_map", {}), dict):
        raise UserError("[traces] takes model_map = {\"<recorded model>\" = \"<model of the "
                        "run>\"}, since, until (ISO dates) and tag")
    return {"traces_model_map": {str(k): str(v) for k, v in table.get("model_map", {}).items()},
            "traces_filter": {k: str(table[k]) for k in ("since", "until", "tag") if k in table}}


# -- loading the app and its items ----------------------------------------------------------------


def concrete_ref(ref: str) -> str:
    """The app's ``file.py:attribute`` or ``module:attribute``; a ``langgraph.json:NAME``
    resolved as LangGraph's tooling reads it (`biaslab.graphs.langgraph_config`)."""
    return resolve_langgraph_ref(ref) if is_langgraph_ref(ref) else ref


def _loaded(ref: str):
    ref = concrete_ref(ref)
    target, colon, attr = ref.rpartition(":")
    if not colon or not target or not attr:
        raise UserError(f"app: '{ref}' must read file.py:attribute or module:attribute")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise UserError(f"app: file not found: {target}")
        if str(path.parent) not in sys.path:  # its sibling modules import, as under `python app.py`
            sys.path.append(str(path.parent))
        try:
            module = _load_file(str(path), _file_sha(path))
        except UserError as exc:
            raise UserError(f"app {ref}: {exc}") from None
    else:
        module = _import_module(target)
    if not hasattr(module, attr):
        raise UserError(f"app: {target} has no attribute '{attr}'")
    return getattr(module, attr)


_APPS: dict[str, Any] = {}


def load_app(ref: str):
    """The app's compiled graph: a compiled graph, a ``StateGraph`` (compiled here) or a
    zero-argument function returning either. One line when it is none of these."""
    from langgraph.pregel import Pregel

    ref = concrete_ref(ref)
    key = ref
    if ref.partition(":")[0].endswith(".py"):
        path = Path(ref.rpartition(":")[0])
        key = f"{ref}@{_file_sha(path) if path.is_file() else ''}"
    if key in _APPS:
        return _APPS[key]
    value = _loaded(ref)
    if callable(value) and not isinstance(value, (Pregel, StateGraph)):
        try:  # a factory; LangGraph's tooling also passes one a config (RunnableConfig)
            value = value({"configurable": {}}) if _takes_config(value) else value()
        except UserError:
            raise
        except Exception as exc:
            raise UserError(f"app {ref}: calling it failed: {type(exc).__name__}: {exc}"
                            ) from None
    if isinstance(value, StateGraph):
        try:
            value = value.compile()
        except Exception as exc:
            raise UserError(f"app {ref}: the StateGraph does not compile: "
                            f"{type(exc).__name__}: {exc}") from None
    if not isinstance(value, Pregel):
        raise UserError(f"app {ref} is not a LangGraph graph (got {type(value).__name__}); "
                        "name a compiled graph, a StateGraph, or a function returning one")
    _APPS[key] = value
    return value


def _takes_config(factory) -> bool:
    import inspect

    try:
        params = [p for p in inspect.signature(factory).parameters.values()
                  if p.default is inspect.Parameter.empty
                  and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return False
    return len(params) == 1


def graph_nodes(app, prefix: str = "") -> list[str]:
    """The app's node names, subgraph nodes as ``parent/child``, from its structure (nodes
    that run a subgraph inside their own code are found by the discovery pass instead)."""
    builder = getattr(app, "builder", None)
    names = list(builder.nodes) if isinstance(builder, StateGraph) else \
        [n for n in getattr(app, "nodes", {}) if not n.startswith("__")]
    out = []
    for name in names:
        out.append(f"{prefix}{name}")
        runnable = builder.nodes[name].runnable if isinstance(builder, StateGraph) else None
        if runnable is not None and isinstance(getattr(runnable, "builder", None), StateGraph):
            out += graph_nodes(runnable, f"{prefix}{name}/")
    return out


def check_unambiguous(paths: list[str], app: str) -> None:
    """One line when two nodes of the app's structure share a path: a top-level node named
    ``review/a`` and node ``a`` of subgraph ``review`` would be recorded, exposed and
    mitigated as one node."""
    seen: set[str] = set()
    for path in paths:
        if path in seen:
            raise UserError(f"app {app}: two nodes are both '{path}' (a node whose name holds "
                            "'/' and a node of a subgraph); biaslab names a subgraph's nodes "
                            "parent/child, so rename one of them")
        seen.add(path)


def _input_keys(app) -> set[str] | None:
    """The state keys the app's graph takes as input; None when it cannot say."""
    builder = getattr(app, "builder", None)
    schemas = getattr(builder, "schemas", None)
    if isinstance(builder, StateGraph) and isinstance(schemas, dict) \
            and builder.input_schema in schemas:
        return set(schemas[builder.input_schema])
    try:
        schema = app.get_input_jsonschema()
    except Exception:  # a graph whose input schema LangGraph cannot describe: not checked
        return None
    props = schema.get("properties") if isinstance(schema, dict) else None
    return set(props) if isinstance(props, dict) else None


_ITEMS: dict[tuple[str, str, str | None, str | None], tuple[list[str], dict[str, dict]]] = {}


def read_items(options: AppOptions) -> tuple[list[str], dict[str, dict]]:
    """(unit ids in file order, unit id → input state). One line naming the line for a
    line that is not a JSON object, an item missing a key the others have (or the unit or
    group key), a key that is no input of the graph, or a unit id given twice."""
    path = Path(options.items_file)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"items file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read items file {path}: {exc}") from None
    key = (str(path), hashlib.sha256(text.encode()).hexdigest(), options.unit, options.group,
           tuple(sorted(options.traces_filter.items())))
    if key in _ITEMS:
        return _ITEMS[key]
    rows: list[tuple[int, dict]] = []
    filters = tuple(sorted(options.traces_filter.items()))
    for n, line in enumerate(_trace_lines(path, text, filters) or text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise UserError(f"{path} line {n}: not JSON ({exc})") from None
        if not isinstance(row, dict):
            raise UserError(f"{path} line {n}: an item must be a JSON object (one input "
                            f"state), got {type(row).__name__}")
        rows.append((n, row))
    if not rows:
        raise UserError(f"{path} holds no items")
    unit = options.unit or ("id" if all("id" in r for _, r in rows) else None)
    first = set(rows[0][1])
    for n, row in rows:
        for needed in filter(None, (options.unit, options.group)):
            if needed not in row:
                raise UserError(f"{path} line {n}: the item has no key '{needed}' "
                                f"([outcome] {'unit' if needed == options.unit else 'group'})")
        missing = sorted(first - set(row))
        if missing:
            raise UserError(f"{path} line {n}: the item lacks key '{missing[0]}', which the "
                            f"graph's input takes (line {rows[0][0]} has it)")
    ids, items = [], {}
    for n, row in rows:
        uid = str(row[unit]) if unit else str(n)
        if uid in items:
            raise UserError(f"{path} line {n}: unit '{uid}' is given twice")
        ids.append(uid)
        items[uid] = row
    _ITEMS[key] = (ids, items)
    return ids, items


def _trace_lines(path: Path, text: str, filters: tuple) -> list[str] | None:
    """An items file that is a trace file (docs/traces.md): each trace's root input as one
    JSON line (a trace whose input is no JSON object stays as its JSON, refused below)."""
    from biaslab.traces.imported import looks_like_traces

    if not looks_like_traces(text):
        return None
    return [json.dumps(t.item) for t in _read_traces(str(path), _sha(text), filters)]


def _recorded(options: AppOptions, item: str):
    """The recorded answers of `item`'s trace (None unless the items are a trace file)."""
    from biaslab.traces.imported import RecordedAnswers, looks_like_traces

    path = Path(options.items_file)
    text = path.read_text(encoding="utf-8")
    if not options.traces_model_map or not looks_like_traces(text):
        return None
    ids, _ = read_items(options)
    traces = _read_traces(str(path), _sha(text), tuple(sorted(options.traces_filter.items())))
    return RecordedAnswers(traces[ids.index(item)].calls, options.traces_model_map)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@functools.lru_cache(maxsize=8)
def _read_traces(path: str, sha: str, filters: tuple):
    """The traces of an items trace file that `filters` (``[traces]`` since/until/tag) keep."""
    from biaslab.traces.imported import read_trace_file, select_traces

    return select_traces(read_trace_file(path), **dict(filters)).traces


# -- the outcome and the final state --------------------------------------------------------------


class OutcomeMissing(Exception):
    """The final state has no value where ``[outcome] field`` points."""


def _dig(value: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(value, Mapping):
            if part not in value:
                raise OutcomeMissing(part)
            value = value[part]
        elif isinstance(value, (list, tuple)) and re.fullmatch(r"-?\d+", part):
            try:
                value = value[int(part)]
            except IndexError:
                raise OutcomeMissing(part) from None
        elif hasattr(value, part):
            value = getattr(value, part)
        else:
            raise OutcomeMissing(part)
    return value


def outcome_of(final: Any, options: AppOptions, parse: Callable | None) -> Any:
    """The outcome read from the final state: a number, a bool or a short label (text is
    stripped; a message is its content)."""
    value = parse(final) if parse is not None else _dig(final, options.outcome_field or "")
    content = getattr(value, "content", None)
    if content is not None and not isinstance(value, (str, Mapping)):
        value = content
    if isinstance(value, str):
        value = value.strip()
    if value is None:
        raise OutcomeMissing(options.outcome_field or "")
    return value


def state_json(value: Any) -> Any:
    """The final state as JSON: messages as their type, content, tool calls and name, with
    the ids LangGraph draws at random left out (they differ on every run, replay or not)."""
    from langchain_core.messages import BaseMessage

    if isinstance(value, BaseMessage):
        data = value.model_dump(exclude={"response_metadata", "usage_metadata"}
                                if value.type != "ai" else set())
        if isinstance(data.get("id"), str) and _UUID.match(data["id"]):
            data.pop("id")
        return state_json({k: v for k, v in data.items() if v not in (None, {}, [], "")
                           or k == "content"})
    if isinstance(value, Mapping):
        return {str(k): state_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [state_json(v) for v in value]
    if isinstance(value, BaseModel):
        return state_json(value.model_dump())
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _namespace() -> str:
    """The checkpoint namespace the app is invoked in now: biaslab's wrapper node's inside a
    cell, none in the discovery pass."""
    from langchain_core.runnables.config import var_child_runnable_config

    config = var_child_runnable_config.get() or {}
    ns = (config.get("configurable") or {}).get("checkpoint_ns") \
        or (config.get("metadata") or {}).get("langgraph_checkpoint_ns") or ""
    return str(ns)


class AppState(TypedDict, total=False):
    item: str
    outcome: dict
    final_state: Any
    http: list  # the app's exchanges with the hosts the spec allows (`app_traffic`)
    tools: list  # the tools it ran, or was answered for from the record (`app_tools`)


# -- the protocol ---------------------------------------------------------------------------------


@protocol
class AppAudit(Protocol):
    """An unmodified LangGraph app: its nodes are the LLM nodes, one cell runs one item."""

    name = "app-audit"
    Options = AppOptions
    setup_counters: RunCounters | None = None
    """What the discovery pass cost, when it ran while this plan was made (the runner adds it
    to the run's counters, so ``N model calls`` counts every call that reached a model)."""

    def parse_options(self, raw: Mapping[str, Any]) -> AppOptions:
        options = super().parse_options(raw)
        if not options.app or not options.items_file:
            raise UserError("an app audit needs app = \"file.py:graph\" and items = "
                            "\"items.jsonl\" at the top of its spec")
        self.directions = options.directions
        measure = self.measure(options)
        self.unit = AnalysisUnit(name=options.unit or "item", node=APP_NODE, rows="outcome",
                                 id="unit", group=options.group,
                                 measures=(measure,))
        load_app(options.app)
        ids, _ = read_items(options)
        keys = _input_keys(load_app(options.app))
        if keys is not None:
            _, items = read_items(options)
            for uid in ids:
                extra = sorted(set(items[uid]) - keys - {options.unit, options.group, "id"})
                if extra:
                    raise UserError(f"{options.items_file}: key '{extra[0]}' of item '{uid}' "
                                    f"is no input of the app's graph (its inputs: "
                                    f"{', '.join(sorted(keys))})")
        if options.outcome_parse:
            self._parse(options)
        return options

    @staticmethod
    def measure(options: AppOptions) -> str:
        field = options.outcome_field
        if field and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", field):
            return field
        return "outcome"

    def _parse(self, options: AppOptions) -> Callable | None:
        if not options.outcome_parse:
            return None
        from biaslab.graphs.registry import load_callable

        return load_callable(options.outcome_parse, "[outcome] parse")

    def items(self, options: AppOptions) -> list[str]:
        return read_items(options)[0]

    def initial_state(self, variant: str, item: str, seed: int, options: AppOptions) -> dict:
        return {"item": item}

    def build(self, variant: str, options: AppOptions | None = None) -> StateGraph:
        """One node, ``app``, that runs the app on the cell's item with every chat-model call
        routed through the gateway."""
        assert options is not None
        proto = self

        async def run_app(state: Mapping, runtime: Runtime[CellContext]) -> dict:
            return await proto.run_item(options, state["item"], runtime.context)

        builder = StateGraph(AppState)
        # The app takes its namespace (which names its calls) from this node's task.
        builder.add_node(APP_NODE, run_app, metadata={OWN_TASK: True})
        builder.add_edge(START, APP_NODE)
        builder.add_edge(APP_NODE, END)
        return builder

    async def run_item(self, options: AppOptions, item: str, ctx: CellContext,
                       calls: AppCalls | None = None) -> dict:
        """The app on one item: its outcome (with unit and group) and its final state."""
        app = load_app(options.app)
        row = read_items(options)[1][item]
        calls = calls or AppCalls(ctx, asyncio.get_running_loop())
        calls.prefix = _namespace()
        calls.recorded = _recorded(options, item)
        keys = _input_keys(app)  # the unit's id and group are biaslab's unless the app reads them
        state = {k: v for k, v in row.items() if keys is None or k in keys}
        # A thread of its own for an app compiled with a checkpointer (which needs one); the
        # id is no part of any call, so a fresh one per invocation changes nothing recorded.
        config: dict[str, Any] = {"recursion_limit": options.recursion_limit}
        if getattr(app, "checkpointer", None):
            config["configurable"] = {"thread_id": f"biaslab-{uuid.uuid4()}"}
        allow = parse_allow_hosts(options.allow_hosts)
        tools = AppTools(ctx, calls.loop, options.tools, calls.prefix, options.app)
        with intercepting(calls), recording_tools(tools), \
                guarding(calls, allow, strict=ctx.gateway.mode != "live") as guard:
            try:
                final = await app.ainvoke(state, config)
            except Exception:
                tools.raise_refusal()  # a refused tool, caught by the app, is the cause
                raise
        tools.raise_refusal()  # even where the app caught its tool's error and went on
        try:
            value = outcome_of(final, options, self._parse(options))
        except OutcomeMissing:
            what = options.outcome_field or f"the value of {options.outcome_parse}"
            raise OutcomeMissing(f"item '{item}': the final state has no '{what}' ([outcome] "
                                 "field)") from None
        outcome = {"unit": item, self.measure(options): value}
        if options.group:
            outcome[options.group] = row.get(options.group)
        out = {"outcome": outcome, "final_state": state_json(final)}
        if guard.traffic:  # what the app sent to the hosts the spec allows
            out["http"] = guard.traffic
        if tools.records:  # the tools it ran (or was answered for), in order
            out["tools"] = tools.records
        return out

    # -- nodes, found by running the first item ---------------------------------------------------

    def llm_nodes(self, variant: str, options: AppOptions | None = None) -> list[LLMNode]:
        """The nodes that called a model in the discovery pass, in the app's graph order
        (nodes found only by running, inside a node's own code, after it by name)."""
        found = (options.discovered or {}).get("nodes", {}) if options else {}
        order = graph_nodes(load_app(options.app)) if found else []
        rank = {name: i for i, name in enumerate(order)}
        ranked = sorted(found, key=lambda n: (rank.get(n, rank.get(n.split("/")[0], len(rank))),
                                              n.count("/"), n))
        return [LLMNode(name, APP_PROMPT, ()) for name in ranked]

    def node_estimates(self, variant: str, options: AppOptions) -> dict[str, dict[str, float]]:
        """Calls and tokens of each node on the discovery pass's item (an estimate: another
        item may take another route through the app)."""
        found = options.discovered or {}
        return {name: {"calls": float(n), "tokens": float(found.get("tokens", {}).get(name, 0))}
                for name, n in found.get("nodes", {}).items()}

    def estimate(self, variant: str, item: str, options: AppOptions) -> dict[str, float]:
        per_node = self.node_estimates(variant, options).values()
        return {"calls": sum(e["calls"] for e in per_node),
                "tokens": sum(e["tokens"] for e in per_node)}

    def all_nodes(self) -> set[str]:
        return set()

    # -- its own tables: the traffic it sent, the tools it ran ----------------------------------

    def report(self, store, run_dir: Path, options: AppOptions) -> list[Path]:
        """``tables/app_http.csv`` (what the app sent to the hosts the spec allows),
        ``tables/tool_calls.csv`` (every tool execution of every cell) and, for an audit of
        traced items, ``tables/trace_check.csv`` (does the clean arm reproduce the trace?),
        each when there is anything to show."""
        from biaslab.graphs.app_trace_check import write_trace_check
        from biaslab.graphs.app_traffic import write_app_http

        written = list(write_app_http(store, run_dir, APP_NODE))
        written += write_trace_check(store, run_dir, options)
        frame = _tool_frame(store)
        if not frame.empty:
            path = Path(run_dir) / "tables" / "tool_calls.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            frame.to_csv(path, index=False)
            written.append(path)
        return written

    def report_sections(self):
        from biaslab.graphs.app_traffic import APP_HTTP_SECTION

        return [APP_HTTP_SECTION]

    def exports(self) -> Mapping[str, Any]:
        return {"tools": _export_tools}

    def prepare_plan(self, spec, options: AppOptions, models: list[ModelSpec],
                     aliases: Mapping[str, ModelSpec]):
        """Check the spec's node names against the app, run the discovery pass when the spec
        does not hold its result yet, and check that every named node calls a model.

        Returns the spec with ``options.discovered`` set, and its options."""
        app = load_app(options.app)
        structural = graph_nodes(app)
        check_unambiguous(structural, options.app)
        named = _named_nodes(spec)
        tops = {n.split("/")[0] for n in structural}
        for where, name in named:
            if name.split("/")[0] not in tops:
                raise UserError(f"{where}: the app has no node '{name}' (its nodes: "
                                f"{', '.join(structural)})")
        for name, settings in spec.nodes.items():
            if settings.prompt:
                raise UserError(f"[nodes.{name}] prompt: an audited app's prompts are its own; "
                                "bind a model here, or expose or mitigate the node instead")
        prompts = PromptRegistry(spec.prompt_overrides)
        for name, m in (spec.mitigations or {}).items():
            position = m.position or prompts.get(m.template or f"mitigations/{name}").position
            if position == "after-answer":
                raise UserError(f"[mitigations.{name}]: an after-answer self-check needs a node "
                                "that parses its own answer; an app's nodes take a position "
                                "such as system-append or user-prefix")
        self.setup_counters = None
        if options.discovered is None:
            found, paid = _discover(self, spec, options, models, aliases)
            if paid is not None:  # the pass ran now: this run's accounting counts it
                found = {**found, "accounting": paid[0]}
                self.setup_counters = paid[1]
            spec = spec.model_copy(update={"options": {**spec.options, "discovered": found}})
            options = self.parse_options(spec.options)
        recorded = options.discovered.get("app_sha")
        if recorded and recorded != _app_sha(options):
            print(f"biaslab: warning: the app {options.app} changed since its nodes were found "
                  f"(hash {_app_sha(options)}, recorded {recorded}); a replay of a run made "
                  "with the old code may not match it", file=sys.stderr)
        nodes = options.discovered.get("nodes", {})
        for where, name in named:
            if name not in nodes:
                raise UserError(
                    f"{where}: node '{name}' of the app never called a model on item "
                    f"'{options.discovered.get('item')}' (nodes that call one: "
                    f"{', '.join(nodes) or 'none'})")
        return spec, options

    def setup_calls(self, options: AppOptions) -> list[dict[str, Any]]:
        """The discovery pass's calls per node, as rows of ``cache_use.csv`` (condition
        ``discovery``): none when the run found its nodes in the memo or the spec."""
        paid = (options.discovered or {}).get("accounting") or {}
        model = paid.get("model", "")
        return [{"variant": self.variants(options)[0], "node": node,
                 "condition": DISCOVERY_CONDITION, "model": model, "calls": n,
                 "model_calls": paid.get("model_calls", {}).get(node, 0),
                 "cache_hits": n - paid.get("model_calls", {}).get(node, 0)}
                for node, n in (paid.get("calls") or {}).items()]


def _tool_frame(store):
    import pandas as pd

    rows = [row for cell_id, _, _, value in store.iter_outputs(node=APP_NODE)
            if isinstance(value, dict) for row in tool_rows(cell_id, value)]
    return pd.DataFrame(rows, columns=["cell_id", "seq", "node", "tool", "occurrence", "args",
                                       "result", "status", "error"])


def _export_tools(store, out_dir: Path, options: AppOptions) -> list[Path]:
    """``biaslab export --format tools``: the tool executions as JSON lines."""
    path = Path(out_dir) / "tool_calls.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    _tool_frame(store).to_json(path, orient="records", lines=True, force_ascii=False)
    return [path]


def _named_nodes(spec) -> list[tuple[str, str]]:
    """(where, node name) for every node a spec names: targets, mitigations, [nodes.*]."""
    out = []
    targets = spec.conditions.targets
    if isinstance(targets, str):
        targets = [] if targets in _TARGET_KEYWORDS else [targets]
    for entry in targets:
        out += [("[conditions] targets", n) for n in entry.split("+")]
    for name, m in (spec.mitigations or {}).items():
        listed = [m.targets] if isinstance(m.targets, str) else list(m.targets)
        for entry in listed:
            if entry not in _TARGET_KEYWORDS:
                out += [(f"[mitigations.{name}] targets", n) for n in entry.split("+")]
    out += [(f"[nodes.{name}]", name) for name in spec.nodes]
    return out


def _app_sha(options: AppOptions) -> str:
    """The app file's content hash ("" for an app imported as a module)."""
    path = Path(concrete_ref(options.app).rpartition(":")[0])
    return _file_sha(path) if path.suffix == ".py" and path.is_file() else ""


def _memo_path() -> Path | None:
    shared = shared_cache_path()
    return shared.with_name("app_nodes.json") if shared else None


def _discover(proto: AppAudit, spec, options: AppOptions, models: list[ModelSpec],
              aliases: Mapping[str, ModelSpec]
              ) -> tuple[dict[str, Any], tuple[dict[str, Any], RunCounters] | None]:
    """Run the first item clean on the first model, recording which nodes call a model;
    (what it found, what it cost, or None when the memo answered and it did not run).

    Kept beside the shared cache (``app_nodes.json``), keyed by the app's and items' content,
    the model and the seed, and its calls in the shared cache: a second run pays nothing."""
    first = proto.items(options)[0]
    seed = spec.run.seeds[0]
    node_models = {name: parse_model(s.model, aliases) for name, s in spec.nodes.items()
                   if s.model}
    app_ref = concrete_ref(options.app)
    app_file = Path(app_ref.rpartition(":")[0])
    key = hashlib.sha256(json.dumps({
        "app": app_ref, "app_sha": _file_sha(app_file) if app_file.is_file() else "",
        "item": read_items(options)[1][first],
        "model": models[0].public(), "nodes": {k: v.public() for k, v in node_models.items()},
        "seed": seed, "outcome": [options.outcome_field, options.outcome_parse]},
        sort_keys=True, default=str).encode()).hexdigest()
    memo = _memo_path()
    known = {}
    if memo is not None and memo.is_file():
        try:
            known = json.loads(memo.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}
        if isinstance(known, dict) and isinstance(known.get(key), dict):
            return known[key], None
    found, paid = _run_discovery(proto, spec, options, first, seed, models[0], node_models)
    if memo is not None:
        try:
            known = known if isinstance(known, dict) else {}
            known[key] = found
            memo.parent.mkdir(parents=True, exist_ok=True)
            memo.write_text(json.dumps(known, sort_keys=True), encoding="utf-8")
        except OSError:
            pass  # a memo that cannot be written costs one more pass, never the run
    return found, paid


def _run_discovery(proto: AppAudit, spec, options: AppOptions, first: str, seed: int,
                   model: ModelSpec, node_models: dict[str, ModelSpec]
                   ) -> tuple[dict[str, Any], tuple[dict[str, Any], RunCounters]]:
    """(what the pass found, (its calls per node for ``cache_use.csv``, its counters))."""
    shared = shared_cache_path()

    async def go() -> tuple[dict[str, Any], tuple[dict[str, Any], RunCounters]]:
        cache = open_shared_cache(shared) if shared else None
        try:
            gateway = Gateway(caches=[cache] if cache else [],
                              concurrency=spec.run.concurrency,
                              retry=RetryPolicy(max_attempts=spec.run.max_attempts,
                                                base_s=spec.run.retry_base_s))
            ctx = CellContext(cell_id=f"discovery/{first}", seed=seed,
                              bindings=Bindings(model, node_models, {}), gateway=gateway,
                              prompts=PromptRegistry(spec.prompt_overrides), condition=CLEAN)
            calls = AppCalls(ctx, asyncio.get_running_loop())
            try:
                await proto.run_item(options, first, ctx, calls)
            except OutcomeMissing as exc:
                raise UserError(f"{exc}; the discovery pass ran item '{first}' clean") from None
            except ModelCallError as exc:
                raise UserError(f"the discovery pass (item '{first}', clean, model "
                                f"{model.label}) failed: {exc}") from None
            except UserError:
                raise
            except Exception as exc:
                raise UserError(f"the app failed on item '{first}' in the discovery pass: "
                                f"{type(exc).__name__}: {exc}") from None
            tokens: dict[str, float] = {}
            made: dict[str, int] = {}
            paid: dict[str, int] = {}
            for record in ctx.calls:
                tokens[record.node] = tokens.get(record.node, 0) + record.input_tokens \
                    + record.output_tokens
                made[record.node] = made.get(record.node, 0) + 1
                paid[record.node] = paid.get(record.node, 0) + (not record.cache_hit)
            found = {"item": first, "model": model.label, "seed": seed,
                     "nodes": dict(calls.nodes), "tokens": tokens, "app_sha": _app_sha(options)}
            return found, ({"model": model.label, "calls": made, "model_calls": paid},
                           gateway.counters)
        finally:
            if cache is not None:
                cache.close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(go())
    out: dict[str, Any] = {}

    def in_thread():  # make_plan called from inside an event loop (biaslab.run in a notebook)
        try:
            out["found"] = asyncio.run(go())
        except BaseException as exc:  # re-raised in the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["found"]
