"""The run context a node sees: who it talks to, with which prompt, under which exposures.

It is passed to LangGraph as ``context`` (``runtime.context`` in a node), never read from
globals, so one compiled graph serves every cell of a grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from biaslab.agents.gateway import Gateway
from biaslab.agents.providers import ModelSpec
from biaslab.prompts.exposure import CLEAN, Condition
from biaslab.prompts.registry import PromptRegistry, PromptTemplate
from biaslab.traces.records import CallRecord

__all__ = ["CellContext", "Bindings"]


@dataclass(frozen=True)
class Bindings:
    """Per-node choices of prompt and model; nodes not named use their defaults.

    Attributes:
        model: the cell's model (the grid's model axis).
        node_models: node name → model for that node only (e.g. a fixed judge).
        node_prompts: node name → prompt id, ``id@variant`` or file path.
    """

    model: ModelSpec
    node_models: Mapping[str, ModelSpec] = field(default_factory=dict)
    node_prompts: Mapping[str, str] = field(default_factory=dict)

    def model_for(self, node: str) -> ModelSpec:
        return self.node_models.get(node, self.model)

    def prompt_for(self, node: str, default: str) -> str:
        return self.node_prompts.get(node, default)


@dataclass
class CellContext:
    """Everything one cell's nodes need; its `calls` list is the cell's trace buffer."""

    cell_id: str
    seed: int
    bindings: Bindings
    gateway: Gateway
    prompts: PromptRegistry
    condition: Condition = CLEAN
    coords: Mapping[str, Any] = field(default_factory=dict)
    options: Any = None
    calls: list[CallRecord] = field(default_factory=list)

    def template(self, node: str, default: str) -> PromptTemplate:
        return self.prompts.get(self.bindings.prompt_for(node, default))
