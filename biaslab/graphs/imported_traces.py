"""``imported-traces``: the protocol of a run written by ``biaslab import traces``.

Its cells are conversations an app had elsewhere, read from a trace file
(`biaslab.traces.imported`), not runs of a graph: each cell holds the traced model calls under
their nodes and, like an app audit's cell, one ``app`` output with the outcome (unit, group,
measure) and the final state. So `report`, `view` and ``replay --mode rescore`` (judges over a
node's recorded answers) read it as they read an app audit. There is no app to run again:
a strict or counterfactual replay of it is refused with one line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel, ConfigDict

from biaslab.agents.app_models import APP_PROMPT
from biaslab.agents.parsers import quoted_blocks
from biaslab.agents.providers.scripted import (Rule, ScriptedChatModel, ScriptedRequest,
                                               register_scripted)
from biaslab.errors import UserError
from biaslab.graphs.llm_nodes import LLMNode
from biaslab.graphs.registry import Protocol, protocol
from biaslab.graphs.units import AnalysisUnit

__all__ = ["ImportedTraces", "ImportedOptions", "IMPORTED_NODE", "IMPORTED_PROTOCOL",
           "RECORDED_MODEL", "OUTCOME_BY_GROUP"]

IMPORTED_NODE = "app"
"""The output node of each imported cell (as an app audit's: outcome and final state)."""
IMPORTED_PROTOCOL = "imported-traces"
OUTCOME_BY_GROUP = "tables/outcome_by_group.csv"
"""Per group (the item key ``--group`` names) and outcome value: the traced units."""
RECORDED_MODEL = "scripted:recorded-traffic"
"""The run's model axis: the app's own models as recorded (each call record names its model).
It answers nothing: every answer of an imported run is the trace's."""

register_scripted("recorded-traffic",
                  lambda: ScriptedChatModel(rules=[], default=None, name_="recorded-traffic"))


def _praise_tilt(request: ScriptedRequest) -> str:
    text = dict(quoted_blocks(request.user)).get("quoted-text", "")
    tilted = re.search(r"\b(strong|excellent|outstanding|leadership)\b", text, re.I)
    return json.dumps({"label": "favors_male" if tilted else "neutral",
                       "justification": "praise read as tilt" if tilted else "plain"})


register_scripted("traces-neutral-judge", lambda: ScriptedChatModel(
    name_="traces-neutral-judge", rules=[Rule(r"<quoted-text>", json.dumps(
        {"label": "neutral", "justification": "no tilt"}))]))
"""A synthetic ``evaluators/group_tilt`` judge that calls every text neutral, and one with a
known fault that reads praise as favouring men: the two-judge panel that runs
docs/traces.md's judge sensitivity without a key (``--judges scripted:traces-neutral-judge
scripted:traces-praise-judge``). They judge nothing real; a real audit names real judges."""
register_scripted("traces-praise-judge", lambda: ScriptedChatModel(
    name_="traces-praise-judge", rules=[Rule(r"<quoted-text>", _praise_tilt)]))


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

    def report(self, store, run_dir: Path, options: ImportedOptions) -> list[Path]:
        """``tables/outcome_by_group.csv``, for an import with ``--group``: per group (and
        ``all``) and value of the measure, the traced units that ended with it and their share
        of the group's units (a unit without a measure counts under an empty value)."""
        import pandas as pd

        if not options.group:
            return []
        measure = self.measure(options)
        rows = [{"group": out["outcome"].get(options.group), "value": out["outcome"].get(measure)}
                for _, _, _, out in store.iter_outputs(node=IMPORTED_NODE)
                if isinstance(out, dict) and isinstance(out.get("outcome"), dict)]
        frame = pd.DataFrame(rows, columns=["group", "value"]).astype(object)
        frame = frame.where(frame.notna(), "")
        frame["value"] = [v if isinstance(v, str) else json.dumps(v, sort_keys=True)
                          for v in frame["value"]]
        frame["group"] = frame["group"].astype(str)
        table = []
        for group, part in [("all", frame), *sorted(frame.groupby("group"))]:
            for value, n in part["value"].value_counts(sort=False).sort_index().items():
                table.append({"group": group, "measure": measure, "value": value,
                              "units": int(n), "share": n / len(part)})
        path = Path(run_dir) / OUTCOME_BY_GROUP
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(table, columns=["group", "measure", "value", "units", "share"]).to_csv(
            path, index=False)
        return [path]
