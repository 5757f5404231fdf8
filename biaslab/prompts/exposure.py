"""Bias exposure: a biased instruction injected into chosen LLM nodes at render time.

An `Exposure` says which nodes hear it, whom it favours, which template holds its text and
where the text goes. A `Condition` is one experimental arm: a set of exposures (empty for the
clean arm). Conditions are generated from a graph's list of LLM nodes, never written by hand, so
the arms of an experiment always match its topology.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal, Mapping, Sequence

from biaslab.errors import UserError
from biaslab.prompts.registry import Message, PromptRegistry

__all__ = ["Exposure", "Condition", "Position", "POSITIONS", "exposure_conditions",
           "apply_exposures", "CLEAN", "condition_id"]

Position = Literal["system-append", "system-replace", "user-prefix", "user-suffix"]
POSITIONS: tuple[str, ...] = ("system-append", "system-replace", "user-prefix", "user-suffix")


@dataclass(frozen=True)
class Exposure:
    """A biased instruction for some nodes.

    Attributes:
        targets: node names that receive the text.
        direction: the favoured group or direction, e.g. ``pro_female``; names the arm.
        template: prompt id of the instruction text (its ``user`` text is what is injected).
        position: where the text goes in the rendered messages.
        slots: values for the template's slots (e.g. the favoured group's name).
    """

    targets: frozenset[str]
    direction: str
    template: str = "exposures/covert_favor"
    position: Position = "system-append"
    slots: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.position not in POSITIONS:
            raise UserError(f"exposure position must be one of {list(POSITIONS)}, "
                            f"got '{self.position}'")

    def text(self, registry: PromptRegistry) -> str:
        template = registry.get(self.template)
        return "\n\n".join(m["content"] for m in template.render(self.slots))


@dataclass(frozen=True)
class Condition:
    """One arm of an experiment.

    Attributes:
        target: exposed nodes joined by ``+`` in graph order, or ``none``.
        direction: the exposures' direction, or ``none``.
        exposures: what is injected; empty for the clean arm.
    """

    target: str
    direction: str
    exposures: tuple[Exposure, ...] = ()

    @property
    def id(self) -> str:
        return condition_id(self.target, self.direction) if self.exposures else "none"

    def exposures_for(self, node: str) -> tuple[Exposure, ...]:
        return tuple(e for e in self.exposures if node in e.targets)


CLEAN = Condition(target="none", direction="none")


def condition_id(target: str, direction: str) -> str:
    """The id of the arm exposing `target` in `direction`, as recorded cells name it:
    ``none`` for the clean arm, else ``<target>:<direction>``."""
    return "none" if target == "none" else f"{target}:{direction}"


def _target_sets(llm_nodes: Sequence[str], targets) -> list[tuple[str, ...]]:
    if targets == "all":
        return [combo for r in range(1, len(llm_nodes) + 1)
                for combo in itertools.combinations(llm_nodes, r)]
    if targets == "singletons":
        return [(n,) for n in llm_nodes]
    if targets == "each_and_all":
        sets = [(n,) for n in llm_nodes]
        return sets + ([tuple(llm_nodes)] if len(llm_nodes) > 1 else [])
    if isinstance(targets, str):  # a single target such as "prediction" or "a+b"
        targets = [targets]
    out = []
    for entry in targets:
        names = tuple(entry.split("+")) if isinstance(entry, str) else tuple(entry)
        unknown = [n for n in names if n not in llm_nodes]
        if unknown:
            raise UserError(f"exposure target '{unknown[0]}' is not an LLM node of this graph "
                            f"(LLM nodes: {list(llm_nodes)})")
        out.append(tuple(n for n in llm_nodes if n in names))  # graph order
    return out


def exposure_conditions(llm_nodes: Sequence[str], directions: Mapping[str, Mapping[str, str]], *,
                        targets: str | Sequence = "all", template: str = "exposures/covert_favor",
                        position: Position = "system-append",
                        include_clean: bool = True) -> list[Condition]:
    """Every arm for a graph: clean, plus each target set × direction.

    Args:
        llm_nodes: the graph's LLM nodes in graph order.
        directions: direction name → slot values for the exposure template.
        targets: ``"all"`` (every non-empty subset), ``"singletons"``, ``"each_and_all"``,
            or an explicit list of node sets (``"a+b"`` strings or lists).

    Returns:
        The clean arm first (if asked), then arms ordered by target set then direction.
    """
    conditions = [CLEAN] if include_clean else []
    if not llm_nodes:
        return conditions
    for combo in _target_sets(llm_nodes, targets):
        for direction, slots in directions.items():
            exposure = Exposure(targets=frozenset(combo), direction=direction, template=template,
                                position=position, slots=dict(slots))
            conditions.append(Condition(target="+".join(combo), direction=direction,
                                        exposures=(exposure,)))
    return conditions


def apply_exposures(messages: list[Message], texts_by_position: Sequence[tuple[str, str]]
                    ) -> list[Message]:
    """Inject exposure texts into rendered messages; returns a new list.

    ``system-replace`` replaces the system text entirely; ``system-append`` adds a system
    message when the template has none, so the text always lands where the user asked.
    """
    out = [dict(m) for m in messages]
    for position, text in texts_by_position:
        system = next((m for m in out if m["role"] == "system"), None)
        user = next((m for m in reversed(out) if m["role"] == "user"), None)
        if position in ("system-append", "system-replace"):
            if system is None:
                out.insert(0, {"role": "system", "content": text})
            elif position == "system-replace":
                system["content"] = text
            else:
                system["content"] = f"{system['content'].rstrip()}\n\n{text}"
        elif position == "user-prefix":
            user["content"] = f"{text}\n\n{user['content']}"
        else:
            user["content"] = f"{user['content'].rstrip()}\n\n{text}"
    return out
