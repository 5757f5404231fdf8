"""Protocols by name: built in, from a user's file or module, or from an installed package.

A protocol is a graph family plus how to grid, seed and report it. Only `build` and `items` are
required; everything else (LLM nodes, estimates, a generic report) is derived from the graph.
User protocols load from a spec's ``plugins`` (files or modules), from ``protocol =
"pkg.module:Class"``, or from the ``biaslab.protocols`` entry-point group; the run records
where a protocol came from, so ``report`` and ``replay`` load the same code again.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Mapping

from langgraph.graph import StateGraph
from pydantic import BaseModel, ConfigDict

from biaslab.errors import UserError
from biaslab.graphs.llm_nodes import (LLMNode, TurnLoop, graph_llm_nodes, node_llm_nodes,
                                      turn_loops)
from biaslab.graphs.headlines import EXPOSED_VS_CLEAN, HeadlineTable
from biaslab.graphs.plugin_checks import checked_build, exit_error
from biaslab.graphs.report_sections import ReportSection
from biaslab.graphs.units import ITEM_UNIT, AnalysisUnit, Measure

if TYPE_CHECKING:
    from biaslab.evaluators.power import PowerContrast

__all__ = ["Protocol", "LLMNode", "ReportSection", "AnalysisUnit", "Measure", "NoOptions",
           "protocol", "get_protocol",
           "list_protocols", "load_plugin", "load_callable", "protocol_origin", "check_origin", "ENTRY_POINT_GROUP", "step_budget"]

ENTRY_POINT_GROUP = "biaslab.protocols"


class NoOptions(BaseModel):
    """A protocol without options: an ``[options]`` table must be empty."""

    model_config = ConfigDict(extra="forbid")


class Protocol:
    """Base class for a registered protocol.

    Subclasses set `name`, and may set `Options` (a pydantic model of the spec's ``[options]``
    table), `directions` (exposure direction → template slot values) and `unit` (what one
    paired observation is, see `AnalysisUnit`). They implement
    `build` and `items`; the other methods have defaults that read the graph.
    """

    name: ClassVar[str]
    Options: ClassVar[type[BaseModel]] = NoOptions
    directions: ClassVar[Mapping[str, Mapping[str, str]]] = {}
    exposure_template: ClassVar[str] = "exposures/covert_favor"
    """The template whose slots `directions` fill; a spec's [conditions] template overrides it."""
    default_conditions: ClassVar[Mapping[str, Any] | None] = None
    """The [conditions] table a spec without one runs (a protocol whose paper has no exposure
    arms: its own design), announced on stderr before the run; None: the spec defaults."""
    unit: ClassVar[AnalysisUnit] = ITEM_UNIT
    """What one paired observation is (record, question, dialogue...), its sensitive attribute
    and its measures: exposed and clean arms, and a run and its counterfactual, are compared
    on it. The default takes the cell's item as the unit and every output field as a measure."""
    judge_nodes: ClassVar[tuple[str, ...]] = ()
    """The LLM nodes whose answers are verdicts on other nodes' outputs (judges, raters): the
    panel that judge sensitivity re-weighs (``replay --mode rescore --sensitivity``). A node
    whose answer steers which calls come next does not belong here."""
    headline_tables: ClassVar[tuple[HeadlineTable, ...]] = (EXPOSED_VS_CLEAN,)
    """The report rows a finding rests on (`HeadlineTable`); judge sensitivity gives each
    one's band over the judge configurations."""

    def variants(self, options: BaseModel) -> list[str]:
        """Graph variants in the grid (e.g. pipelines); one, ``default``, unless overridden."""
        return ["default"]

    def build(self, variant: str, options: BaseModel | None = None) -> StateGraph:
        """The uncompiled graph for a variant (`options` may be None: use the defaults)."""
        raise NotImplementedError(f"protocol '{self.name}' must implement build()")

    def items(self, options: BaseModel) -> list[str]:
        """The grid's item axis (datasets, scenarios, questions...)."""
        raise NotImplementedError(f"protocol '{self.name}' must implement items()")

    def initial_state(self, variant: str, item: str, seed: int, options: BaseModel) -> dict:
        """The graph's input for one cell; by default ``{"item": item}``."""
        return {"item": item}

    def llm_nodes(self, variant: str, options: BaseModel | None = None) -> list[LLMNode]:
        """The variant's LLM nodes in graph order, read from the graph's declarations."""
        return graph_llm_nodes(self.build(variant, options))

    def estimate(self, variant: str, item: str, options: BaseModel) -> dict[str, float]:
        """Expected ``calls`` and ``tokens`` of one cell (an estimate, not a bound).

        The default counts each declared LLM node's ``calls`` per visit, times the turn cap for
        nodes inside a turn loop; a protocol with data-dependent routing should override it.
        """
        per_node = self.node_estimates(variant, options).values()
        return {"calls": sum(e["calls"] for e in per_node),
                "tokens": sum(e["tokens"] for e in per_node)}

    def node_estimates(self, variant: str, options: BaseModel) -> dict[str, dict[str, float]]:
        """Expected ``calls`` and ``tokens`` of each LLM node in one cell, from its declared
        ``calls`` per visit times the turn cap inside a turn loop (what a self-check re-ask
        of that node adds, one more call per call; `biaslab estimate`)."""
        builder = self.build(variant, options)
        in_loop = _loop_multipliers(builder)
        out: dict[str, dict[str, float]] = {}
        for node in graph_llm_nodes(builder):
            n = node.calls * in_loop.get(node.name, 1)
            e = out.setdefault(node.name, {"calls": 0.0, "tokens": 0.0})
            e["calls"] += n
            e["tokens"] += n * (_PROMPT_TOKENS + node.max_tokens)
        return out

    def power_contrasts(self, options: BaseModel) -> list["PowerContrast"]:
        """The main contrast(s) ``biaslab estimate --power`` sizes, for one model and seed.

        The default: the declared `unit`, exposed against clean on the same units, one unit
        per cell item, read as a 0/1 measure (`biaslab.evaluators.power`); a pilot run tells
        whether the measure is binary or numeric. `n` counts the units, not units × seeds: a
        seed re-asks the same unit (a deterministic model answers alike under every seed). Override it where a cell holds several
        units or the report's main test is another one (roleplay's role vs no role)."""
        from biaslab.evaluators.power import PowerContrast

        measure = self.unit.measures[0] if self.unit.measures else None
        name = getattr(measure, "name", measure)
        return [PowerContrast(f"exposed vs clean on the {self.unit.name}", self.unit.name,
                              "paired_binary", len(self.items(options)), measure=name,
                              seeds_averaged=True)]

    def rejudge(self, variant: str, item: str, outputs: Mapping[str, Any],
                verdict: Callable[[str, str, int], Any], options: BaseModel
                ) -> dict[str, Any] | None:
        """A cell's node outputs as they would be had its judge nodes given other verdicts,
        computed without running the graph, or None (the default): the protocol cannot, and
        judge sensitivity replays the graph with the judges on an answer sheet instead.

        A protocol may answer only when its judge verdicts feed nothing but pure nodes (no
        later model call depends on them), so the outputs it returns are exactly those the
        replay would record. Args: `outputs` maps each node to its recorded output (the last
        one of that node in the cell); `verdict(node, item, sample)` is the parsed verdict the
        configuration gives that judge call (None: no vote), for each judge call the cell
        recorded. Returns the outputs that change, by node."""
        return None

    def report(self, store: Any, run_dir: Path, options: BaseModel) -> list[Path]:
        """Protocol-specific tables and figures from the store alone (no model calls).

        The generic report (calls, errors, outputs, exposed vs clean) is written for every
        protocol by the experiments layer; this adds the protocol's own."""
        return []

    def headline(self, run_dir: Path) -> "pandas.DataFrame | None":
        """The one table to print on the terminal after `report` (read from the files it
        wrote under `run_dir`); None, the default, prints nothing but the file paths."""
        return None

    def exports(self) -> Mapping[str, Any]:
        """Export formats of this protocol for ``biaslab export --format NAME``: name →
        ``fn(store, out_dir, options) -> list of paths`` (e.g. a dataset in its benchmark's
        own schema). The default, none, leaves the trace's parquet and jsonl exports."""
        return {}

    def report_sections(self) -> list[ReportSection]:
        """Sections of ``report.html`` for the files `report` writes (titles, how to read them,
        viewer links). The default, none, still shows every table and figure generically."""
        return []

    def all_nodes(self) -> set[str]:
        options = self.Options()
        return {n.name for v in self.variants(options) for n in self.llm_nodes(v, options)}

    def parse_options(self, raw: Mapping[str, Any]) -> BaseModel:
        try:
            return self.Options(**raw)
        except Exception as exc:
            first = str(exc).splitlines()
            detail = " ".join(first[1:3]).strip() if len(first) > 1 else first[0]
            raise UserError(f"bad [options] for protocol '{self.name}': {detail}") from None


_PROMPT_TOKENS = 300  # a typical rendered prompt; estimates say they are estimates


def _loop_reach(builder: StateGraph) -> list[tuple[TurnLoop, set[str]]]:
    """Each turn loop with the nodes reachable from its first node before its last one."""
    successors: dict[str, set[str]] = {}
    for src, dst in builder.edges:
        successors.setdefault(src, set()).add(dst)
    for src, branches in builder.branches.items():
        for branch in branches.values():
            successors.setdefault(src, set()).update((branch.ends or {}).values())
    out = []
    for loop in turn_loops(builder):
        reach, frontier = {loop.first}, [loop.first]
        while frontier:
            node = frontier.pop()
            if node == loop.last:
                continue
            for nxt in successors.get(node, ()):
                if nxt not in reach:
                    reach.add(nxt)
                    frontier.append(nxt)
        out.append((loop, reach & set(builder.nodes)))
    return out


def _loop_multipliers(builder: StateGraph) -> dict[str, int]:
    """Node name → visits per cell for nodes inside a turn loop (between first and last)."""
    out: dict[str, int] = {}
    for loop, reach in _loop_reach(builder):
        for name in reach:
            for node in node_llm_nodes(builder, name):
                out[node.name] = max(out.get(node.name, 1), loop.max_turns)
    return out


def step_budget(builder: StateGraph) -> int:
    """LangGraph steps a cell of this graph may take: every node once, plus each turn loop's
    nodes once per turn (LangGraph's default of 25 stops a 10-turn dialogue half way)."""
    looped = sum(len(reach) * loop.max_turns for loop, reach in _loop_reach(builder))
    return max(25, len(builder.nodes) + looped + 10)


_PROTOCOLS: dict[str, type[Protocol]] = {}


def protocol(cls: type[Protocol]) -> type[Protocol]:
    """Class decorator: make a protocol available by its `name`."""
    known = _PROTOCOLS.get(cls.name)
    if (known is not None and known.__module__ != cls.__module__
            and known.__module__.startswith("biaslab.")):
        raise UserError(f"protocol name '{cls.name}' is taken by the built-in "
                        f"{known.__module__}; rename the protocol in {cls.__module__}")
    if not cls.__module__.startswith("biaslab."):  # a user's graph: checked where it is built
        cls.build = checked_build(cls.build)
    _PROTOCOLS[cls.name] = cls
    return cls


def _file_sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


@lru_cache(maxsize=None)
def _load_file(path: str, sha: str):
    name = f"biaslab_plugin_{Path(path).stem}_{hashlib.sha256(path.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"plugin {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # No __pycache__ beside the user's file: reading a spec writes nothing into the folders it
    # reads (a failed one leaves them as they were, tests/experiments/test_spec.py), however
    # the interpreter is set to treat bytecode. The file is small; compiling it is quick.
    was_off, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    except UserError:
        raise
    except SystemExit as exc:
        sys.modules.pop(name, None)
        raise exit_error(f"plugin {path}", exc) from None
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UserError(f"plugin {path} failed to import: {type(exc).__name__}: {exc}") from None
    finally:
        sys.dont_write_bytecode = was_off
    return module


def load_plugin(ref: str) -> None:
    """Import a plugin: a ``.py`` file (its @protocol classes register) or a module name."""
    if ref.endswith(".py") or "/" in ref:
        path = Path(ref).resolve()
        if not path.is_file():
            raise UserError(f"plugin file not found: {ref}")
        _load_file(str(path), _file_sha(path))
        return
    _import_module(ref)


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise UserError(f"cannot import protocol module '{name}': {exc}") from None
    except SystemExit as exc:
        raise exit_error(f"module '{name}'", exc) from None
    except Exception as exc:
        raise UserError(f"module '{name}' failed to import: {type(exc).__name__}: {exc}"
                        ) from None


def _from_reference(ref: str) -> type[Protocol]:
    """``pkg.module:Class`` or ``path/file.py:Class``."""
    target, _, attr = ref.rpartition(":")
    if target.endswith(".py"):
        load_plugin(target)
        path = Path(target).resolve()
        module = _load_file(str(path), _file_sha(path))
    else:
        module = _import_module(target)
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Protocol)):
        raise UserError(f"'{ref}' is not a biaslab Protocol class")
    if getattr(cls, "name", None) not in _PROTOCOLS:
        protocol(cls)
    return cls


def load_callable(ref: str, what: str):
    """A function named ``pkg.module:function`` or ``path/file.py:function`` (a scorer, a
    classifier of your own). One line naming `what` when it cannot be loaded."""
    target, colon, attr = ref.rpartition(":")
    if not colon or not target or not attr:
        raise UserError(f"{what}: '{ref}' must read module:function or file.py:function")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise UserError(f"{what}: file not found: {target}")
        module = _load_file(str(path), _file_sha(path))
    else:
        module = _import_module(target)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UserError(f"{what}: '{ref}' names no function")
    return fn


def _entry_point(name: str) -> type[Protocol] | None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                cls = ep.load()
            except Exception as exc:
                raise UserError(f"entry point '{name}' ({ep.value}) failed to load: "
                                f"{type(exc).__name__}: {exc}") from None
            if getattr(cls, "name", None) not in _PROTOCOLS:
                protocol(cls)
            return _PROTOCOLS.get(cls.name)
    return None


def get_protocol(name: str) -> Protocol:
    """A protocol by registered name, ``module:Class`` reference, or entry-point name."""
    import biaslab.graphs  # noqa: F401  (registers the built-in protocols)

    if ":" in name:
        return _from_reference(name)()
    if name not in _PROTOCOLS and _entry_point(name) is None:
        raise UserError(f"unknown protocol '{name}' (known: {', '.join(list_protocols())}; "
                        "a protocol of your own loads with plugins = [\"file.py\"] or "
                        "protocol = \"module:Class\")")
    return _PROTOCOLS[name]()


def list_protocols() -> Iterable[str]:
    """Names of the built-in, loaded and installed (entry-point) protocols."""
    import biaslab.graphs  # noqa: F401

    names = set(_PROTOCOLS)
    names.update(ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def protocol_origin(proto: Protocol) -> dict[str, Any]:
    """Where a protocol's code came from: module, file and a hash of the file's content."""
    cls = type(proto)
    try:
        path = inspect.getfile(cls)
    except (TypeError, OSError):
        path = None
    builtin = cls.__module__.startswith("biaslab.")
    return {"module": cls.__module__, "class": cls.__qualname__, "builtin": builtin,
            "file": path, "sha256": _file_sha(path) if path and Path(path).is_file() else None}


def check_origin(proto: Protocol, recorded: Mapping[str, Any] | None) -> str | None:
    """A warning when the protocol's code differs from the code the run recorded."""
    if not recorded or recorded.get("builtin"):
        return None
    now = protocol_origin(proto)
    if recorded.get("sha256") and now.get("sha256") != recorded.get("sha256"):
        return (f"protocol '{proto.name}' changed since the run was made ({now.get('file')} "
                f"hash {now.get('sha256')}, recorded {recorded.get('sha256')})")
    return None
