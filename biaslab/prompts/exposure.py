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
           "apply_exposures", "CLEAN", "condition_id", "Mitigation", "mitigation_arms",
           "with_mitigation", "NO_MITIGATION", "MITIGATION_MARK", "split_condition_id",
           "AFTER_ANSWER", "MITIGATION_POSITIONS"]

Position = Literal["system-append", "system-replace", "user-prefix", "user-suffix"]
POSITIONS: tuple[str, ...] = ("system-append", "system-replace", "user-prefix", "user-suffix")
AFTER_ANSWER = "after-answer"
"""A mitigation's position that is no injection: its text is asked after the node's answer
(the answer and the text as the next turns), and the node's value is the answer to that (a
self-check re-ask)."""
MITIGATION_POSITIONS: tuple[str, ...] = (*POSITIONS, AFTER_ANSWER)


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
        return instruction_text(registry, self.template, self.slots)


def instruction_text(registry: PromptRegistry, template: str, slots: Mapping[str, str]) -> str:
    """The text an exposure or a mitigation adds: every message of its template, rendered
    with its slots, as one block."""
    return "\n\n".join(m["content"] for m in registry.get(template).render(slots))


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
    mitigation: str = "none"
    """The mitigation arm (``<nodes>:<name>``), or ``none``; kept apart from the exposure so
    that an arm is exposure × mitigation and the unmitigated arm keeps its old id."""
    mitigations: tuple["Mitigation", ...] = ()

    @property
    def id(self) -> str:
        base = condition_id(self.target, self.direction) if self.exposures else "none"
        return condition_id(base, "", self.mitigation) if self.mitigations else base

    def exposures_for(self, node: str) -> tuple[Exposure, ...]:
        return tuple(e for e in self.exposures if node in e.targets)

    def mitigations_for(self, node: str) -> tuple["Mitigation", ...]:
        return tuple(m for m in self.mitigations if node in m.targets)


CLEAN = Condition(target="none", direction="none")


NO_MITIGATION = "none"
MITIGATION_MARK = "+mit:"
"""Joins an arm's exposure id and its mitigation: ``prediction:pro_female+mit:judge:reminder``."""


def _no_mitigation(mitigation: object) -> bool:
    # A cell recorded before mitigations existed has no coordinate: NaN or None in a frame.
    return mitigation is None or mitigation != mitigation or str(mitigation) in ("", "none")


def condition_id(target: str, direction: str, mitigation: object = None) -> str:
    """The id of the arm exposing `target` in `direction`, as recorded cells name it:
    ``none`` for the clean arm, else ``<target>:<direction>``; with a mitigation arm,
    ``+mit:<mitigation>`` follows (``none+mit:judge:fairness_reminder``). Called with an arm
    id as `target` and an empty `direction`, it adds the mitigation to that id."""
    base = target if direction == "" else ("none" if target == "none"
                                           else f"{target}:{direction}")
    return base if _no_mitigation(mitigation) else f"{base}{MITIGATION_MARK}{mitigation}"


def split_condition_id(arm: str) -> tuple[str, str]:
    """An arm id as (exposure id, mitigation arm); the mitigation is ``none`` when absent."""
    exposure, mark, mitigation = str(arm).partition(MITIGATION_MARK)
    return exposure, mitigation if mark else NO_MITIGATION


@dataclass(frozen=True)
class Mitigation:
    """A debiasing instruction for some nodes: the mirror of an `Exposure`.

    Attributes:
        name: the mitigation's name in the spec (``fairness_reminder``); names the arm.
        targets: node names that receive the text.
        template: prompt id of the instruction (its ``user`` text is what is injected).
        position: where the text goes in the rendered messages, or `AFTER_ANSWER`: asked
            after the node's answer, whose value is then the answer to it.
        slots: values for the template's slots.
    """

    name: str
    targets: frozenset[str]
    template: str
    position: str = "system-append"
    slots: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.position not in MITIGATION_POSITIONS:
            raise UserError(f"mitigation position must be one of {list(MITIGATION_POSITIONS)}, "
                            f"got '{self.position}'")

    @property
    def after_answer(self) -> bool:
        """Whether it is a re-ask after the node's answer rather than an injected text."""
        return self.position == AFTER_ANSWER

    def render_after(self, registry: PromptRegistry) -> list[Message]:
        """What an `AFTER_ANSWER` mitigation sends after the node's answer: its text (all of
        its template's texts) as one user turn."""
        return [{"role": "user", "content": self.text(registry)}]

    def text(self, registry: PromptRegistry) -> str:
        return instruction_text(registry, self.template, self.slots)


def mitigation_arms(llm_nodes: Sequence[str], name: str, *, targets: str | Sequence,
                    template: str, position: str = "system-append",
                    slots: Mapping[str, str] | None = None) -> list[tuple[str, Mitigation]]:
    """One mitigation's arms for a graph: (arm id ``<nodes>:<name>``, `Mitigation`) per
    target set (same keywords and lists as exposure targets), in graph order."""
    arms = []
    for combo in _target_sets(llm_nodes, targets) if llm_nodes else []:
        arms.append((f"{'+'.join(combo)}:{name}",
                     Mitigation(name=name, targets=frozenset(combo), template=template,
                                position=position, slots=dict(slots or {}))))
    return arms


def with_mitigation(condition: Condition, arm: str, mitigation: Mitigation) -> Condition:
    """`condition` (any exposure arm, clean included) with `mitigation` added as arm `arm`."""
    return Condition(target=condition.target, direction=condition.direction,
                     exposures=condition.exposures, mitigation=arm, mitigations=(mitigation,))


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
