"""``imported-traces``: the protocol of a run written by ``biaslab import traces``.

Its cells are conversations an app had elsewhere, read from a trace file
(`biaslab.traces.imported`), not runs of a graph: each cell holds the traced model calls under
their nodes and, like an app audit's cell, one ``app`` output with the outcome (unit, group,
measure) and the final state. So `report`, `view` and ``replay --mode rescore`` (judges over a
node's recorded answers) read it as they read an app audit. There is no app to run again:
a strict or counterfactual replay of it is refused with one line.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel, ConfigDict

from biaslab.agents.app_models import APP_PROMPT
from biaslab.agents.providers.scripted import ScriptedChatModel, register_scripted
from biaslab.errors import UserError
from biaslab.graphs.llm_nodes import LLMNode
from biaslab.graphs.registry import Protocol, protocol
from biaslab.graphs.units import AnalysisUnit

__all__ = ["ImportedTraces", "ImportedOptions", "IMPORTED_NODE", "IMPORTED_PROTOCOL",
           "RECORDED_MODEL"]

IMPORTED_NODE = "app"
"""The output node of each imported cell (as an app audit's: outcome and final state)."""
IMPORTED_PROTOCOL = "imported-traces"
RECORDED_MODEL = "scripted:recorded-traffic"
"""The run's model axis: the app's own models as recorded (each call record names its model).
It answers nothing: every answer of an imported run is the trace's."""

register_scripted("recorded-traffic",
                  lambda: ScriptedChatModel(rules=[], default=None, name_="recorded-traffic"))


class ImportedOptions(BaseModel):
    """What the import records in the run's spec: the trace file, its items and nodes."""

    model_config = ConfigDict(extra="forbid")

    source: str = ""
    """The trace file imported (as given on the command line)."""
    format: str = ""
    """``otlp-json``, ``otel-console`` or ``langsmith``."""
    items: list[str] = []
    """The cells' item ids, one per trace, in trace order."""
    nodes: list[str] = []
    """The nodes that made model calls, in order of first call."""
    group: str | None = None
    """The item key naming the unit's group (``--group``)."""
    outcome: str | None = None
    """The dotted path of the final output read as the measure (``--outcome``)."""
    selected: dict[str, str] = {}
    """The import's filters (``--since``, ``--until``, ``--tag``) that chose the traces."""
    gaps: dict[str, int] = {}
    """What the file lacked, counted by name (see `biaslab.traces.imported.GAP_NAMES`)."""


class _State(TypedDict, total=False):
    item: str


@protocol
class ImportedTraces(Protocol):
    """Recorded conversations as cells: nothing runs, everything is read."""

    name = IMPORTED_PROTOCOL
    Options = ImportedOptions
    default_conditions = {"targets": []}

    def parse_options(self, raw: Any) -> ImportedOptions:
        options = super().parse_options(raw)
        measure = self.measure(options)
        self.unit = AnalysisUnit(name="trace", node=IMPORTED_NODE, rows="outcome", id="unit",
                                 group=options.group, measures=(measure,))
        return options

    @staticmethod
    def measure(options: ImportedOptions) -> str:
        """The measure's column: the outcome path's last key, else ``outcome``."""
        return (options.outcome or "outcome").split(".")[-1]

    def items(self, options: ImportedOptions) -> list[str]:
        return list(options.items)

    def build(self, variant: str, options: ImportedOptions | None = None) -> StateGraph:
        def refuse(state: _State) -> dict:
            raise UserError("an imported-traces run has no app to run again: only report, "
                            "view and replay --mode rescore read it")

        builder = StateGraph(_State)
        builder.add_node(IMPORTED_NODE, refuse)
        builder.add_edge(START, IMPORTED_NODE)
        builder.add_edge(IMPORTED_NODE, END)
        return builder

    def llm_nodes(self, variant: str, options: ImportedOptions | None = None) -> list[LLMNode]:
        return [LLMNode(name, APP_PROMPT, ()) for name in (options.nodes if options else [])]

    def node_estimates(self, variant: str, options: ImportedOptions) -> dict[str, dict[str, float]]:
        return {name: {"calls": 0.0, "tokens": 0.0} for name in options.nodes}

    def estimate(self, variant: str, item: str, options: ImportedOptions) -> dict[str, float]:
        return {"calls": 0.0, "tokens": 0.0}

    def all_nodes(self) -> set[str]:
        return set()
