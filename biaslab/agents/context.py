"""The run context a node sees: who it talks to, with which prompt, under which exposures.

It is passed to LangGraph as ``context`` (``runtime.context`` in a node), never read from
globals, so one compiled graph serves every cell of a grid.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from biaslab.agents.gateway import Gateway
from biaslab.agents.providers import ModelSpec
from biaslab.prompts.exposure import CLEAN, Condition
from biaslab.prompts.group_swap import GroupSwap
from biaslab.prompts.registry import PromptRegistry, PromptTemplate
from biaslab.traces.records import CallRecord

__all__ = ["CellContext", "Bindings", "EarlierTurns", "turn_of", "TURN_ITEM", "bound_prompt"]

TURN_ITEM = re.compile(r"turn-(\d+)(?![0-9])")
"""How a call made inside a turn loop names its turn: its ``item`` starts ``turn-<n>`` (1-based)."""


def turn_of(item: str) -> int | None:
    """The turn a call belongs to, read from its ``item`` label (``turn-3`` → 3); None for a
    call outside every turn (a post-hoc rater of the whole dialogue, a single-shot node)."""
    found = TURN_ITEM.match(item or "")
    return int(found.group(1)) if found else None


def bound_prompt(binding: str | None, default: str) -> str:
    """The prompt id a node uses: its binding, else its default. A binding ``@variant`` means
    that variant of whichever prompt the node uses by default (``@terse`` on E0's and E1's
    prediction nodes is each one's own terse prompt), as ``replay --prompt @terse`` does."""
    if not binding:
        return default
    if binding.startswith("@"):
        return f"{default.partition('@')[0]}{binding}"
    return binding


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
        return bound_prompt(self.node_prompts.get(node), default)


@dataclass(frozen=True)
class EarlierTurns:
    """How the calls of turns before `turn` are made, when a change applies only from turn
    `turn` on (``biaslab replay --mode counterfactual --from-turn K``): with the source run's
    bindings, prompts and exposures, so those turns ask exactly what the source asked and are
    answered from its trace.

    Attributes:
        turn: the first turn made with the cell's own (changed) settings.
        bindings, prompts, condition: the settings of the turns before it.
    """

    turn: int
    bindings: Bindings
    prompts: PromptRegistry
    condition: Condition


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
    earlier: EarlierTurns | None = None
    """Settings of the turns before a change that applies from a later turn on; None: every
    call uses this context's own."""
    group_swap: GroupSwap | None = None
    """The judge-bias probe: nodes whose slot values and judged texts have their group terms
    swapped before rendering; None: every node sees its inputs as they are."""

    def for_call(self, item: str) -> "CellContext":
        """The context a call labelled `item` is made with: the earlier turns' settings for a
        call of a turn before `earlier.turn`, else this one. It shares this cell's trace buffer.
        A call outside every turn (`turn_of` is None) comes after the dialogue's turns, or
        stands alone, and is made with this context's own settings."""
        turn = turn_of(item)
        if self.earlier is None or turn is None or turn >= self.earlier.turn:
            return self
        return dataclasses.replace(self, bindings=self.earlier.bindings,
                                   prompts=self.earlier.prompts,
                                   condition=self.earlier.condition, earlier=None)

    def template(self, node: str, default: str) -> PromptTemplate:
        return self.prompts.get(self.bindings.prompt_for(node, default))
