"""From a spec to a validated grid: protocol × condition × model × seed × item.

Everything a run could trip over later (unknown protocol, node, prompt or slot; missing API
key; unreadable data) is checked here, before the first model call. Cells are generated lazily,
so a grid of a million cells costs no memory up front.
"""

from __future__ import annotations


import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Iterator

from langgraph.graph import StateGraph
from pydantic import BaseModel

from biaslab.agents.context import Bindings, CellContext, EarlierTurns, bound_prompt
from biaslab.agents.gateway import Gateway
from biaslab.agents.providers import PROVIDERS, ModelSpec, parse_model
from biaslab.errors import UserError
from biaslab.experiments.spec import (ConditionSettings, ExperimentSpec, MitigationSettings,
                                      NodeSettings)
from biaslab.graphs.llm_nodes import LLMNode, turn_loops
from biaslab.graphs.registry import Protocol, get_protocol, load_plugin, step_budget
from biaslab.prompts.exposure import (CLEAN, Condition, exposure_conditions, mitigation_arms,
                                      with_mitigation)
from biaslab.prompts.group_swap import GroupSwap, Lexicon
from biaslab.prompts.registry import PromptRegistry

__all__ = ["Cell", "Plan", "make_plan"]


@dataclass(frozen=True)
class Cell:
    """One unit of work and of resume: a graph run for one grid point."""

    ord: int
    variant: str
    item: str
    condition: Condition
    model: ModelSpec
    seed: int
    protocol: str

    id: str = field(init=False, repr=False, compare=False)
    """``variant/item/condition/model/seed=N``: the cell's name in the store (made once)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", f"{self.variant}/{self.item}/{self.condition.id}/"
                                       f"{self.model.label}/seed={self.seed}")

    @property
    def coords(self) -> dict[str, Any]:
        coords = {"protocol": self.protocol, "variant": self.variant, "item": self.item,
                  "target": self.condition.target, "direction": self.condition.direction,
                  "model": self.model.label, "seed": self.seed}
        if self.condition.mitigations:  # unmitigated cells keep the coordinates they had
            coords["mitigation"] = self.condition.mitigation
        return coords


@dataclass(frozen=True)
class EarlierPlan:
    """The settings of the turns before `turn` (``spec.from_turn``), resolved."""

    turn: int
    prompts: PromptRegistry
    node_models: dict[str, ModelSpec]
    node_prompts: dict[str, str]
    arms: dict[str, dict[str, Condition]]
    """Variant → arm id → the exposures of that arm's earlier turns (clean when absent)."""

    def for_cell(self, cell: "Cell") -> EarlierTurns:
        return EarlierTurns(self.turn, Bindings(cell.model, self.node_models, self.node_prompts),
                            self.prompts, self.arms[cell.variant].get(cell.condition.id, CLEAN))


@dataclass
class Plan:
    spec: ExperimentSpec
    protocol: Protocol
    options: BaseModel
    prompts: PromptRegistry
    models: list[ModelSpec]
    node_models: dict[str, ModelSpec]
    node_prompts: dict[str, str]
    conditions: dict[str, list[Condition]] = field(default_factory=dict)
    llm_nodes: dict[str, list[LLMNode]] = field(default_factory=dict)
    """Variant → its declared LLM nodes, read once from the built graph."""
    earlier: EarlierPlan | None = None
    """With ``spec.from_turn``: how the turns before it are made."""
    group_swap: GroupSwap | None = None
    """With ``spec.swap_groups``: the nodes that see group terms swapped (judge-bias probe)."""
    _bindings: dict[ModelSpec, Bindings] = field(default_factory=dict, init=False, repr=False,
                                                 compare=False)

    @property
    def exposure_template(self) -> str:
        """The spec's exposure template, else the protocol's default."""
        return self.spec.conditions.template or self.protocol.exposure_template

    def compile(self, variant: str, builder: StateGraph | None = None):
        """The compiled graph of a variant (one per run; every cell of it shares it)."""
        builder = builder or self.protocol.build(variant, self.options)
        return builder.compile().with_config(recursion_limit=step_budget(builder))

    def bindings(self, model: ModelSpec) -> Bindings:
        found = self._bindings.get(model)  # (the same for every cell of a model: made once)
        if found is None:
            found = self._bindings[model] = Bindings(model=model, node_models=self.node_models,
                                                     node_prompts=self.node_prompts)
        return found

    def context(self, cell: "Cell", gateway: Gateway) -> CellContext:
        """The run context one cell's nodes see."""
        return CellContext(cell_id=cell.id, seed=cell.seed, bindings=self.bindings(cell.model),
                           gateway=gateway, prompts=self.prompts, condition=cell.condition,
                           coords=cell.coords, options=self.options,
                           earlier=self.earlier.for_cell(cell) if self.earlier else None,
                           group_swap=self.group_swap)

    def cells(self) -> Iterator[Cell]:
        """Cells in a cache-friendly order: each clean arm runs before its exposed arms."""
        n = 0
        for variant in self.protocol.variants(self.options):
            for item, model, seed in itertools.product(self.protocol.items(self.options),
                                                       self.models, self.spec.run.seeds):
                for condition in self.conditions[variant]:
                    yield Cell(n, variant, item, condition, model, seed, self.protocol.name)
                    n += 1

    def n_cells_per_condition(self) -> int:
        """Cells of one variant and one condition: items × models × seeds."""
        return len(self.protocol.items(self.options)) * len(self.models) * len(self.spec.run.seeds)

    def n_cells(self) -> int:
        per = self.n_cells_per_condition()
        return sum(len(self.conditions[v]) * per for v in self.protocol.variants(self.options))

    def fingerprint(self) -> str:
        """A hash of everything that decides what the cells compute: the spec (less the run's
        concurrency and retry settings), the models, options and the content of every bound
        prompt. A resume with a different fingerprint would mix two experiments."""
        spec = self.spec.model_dump(exclude={"scale", "run", "models", "model_aliases",
                                             "description", "name"})
        spec["seeds"] = self.spec.run.seeds
        if spec.get("from_turn") is None:  # runs from before the field keep their fingerprint
            spec.pop("from_turn", None)
        if spec.get("swap_groups") is None:  # likewise runs from before the judge-bias probe
            spec.pop("swap_groups", None)
        if not spec.get("mitigations"):  # likewise runs from before [mitigations]
            spec.pop("mitigations", None)
        for name, m in (spec.get("mitigations") or {}).items():  # the position in effect
            m["position"] = _mitigation_position(self.prompts, name, self.spec.mitigations[name])
        prompts = {f"{variant}.{node.name}": self.prompts.get(
            bound_prompt(self.node_prompts.get(node.name), node.prompt)).content_hash
            for variant, nodes in self.llm_nodes.items() for node in nodes}
        if self.earlier is not None:
            prompts.update({f"before.{variant}.{node.name}": self.earlier.prompts.get(
                bound_prompt(self.earlier.node_prompts.get(node.name), node.prompt)).content_hash
                for variant, nodes in self.llm_nodes.items() for node in nodes})
        payload = {"spec": spec, "models": [m.public() for m in self.all_model_specs()],
                   "options": self.options.model_dump(), "prompts": prompts,
                   "exposure": self.prompts.get(self.exposure_template).content_hash}
        if self.spec.mitigations:
            payload["mitigations"] = {
                name: self.prompts.get(_mitigation_template(name, m)).content_hash
                for name, m in self.spec.mitigations.items()}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()
                              ).hexdigest()[:16]

    def all_model_specs(self) -> list[ModelSpec]:
        earlier = list(self.earlier.node_models.values()) if self.earlier else []
        return [*self.models, *self.node_models.values(), *earlier]


def make_plan(spec: ExperimentSpec, *, models: list[str] | None = None,
              all_nodes: bool = False, check_keys: bool = True) -> Plan:
    """Resolve and validate a spec. Raises `UserError` naming the first problem.

    Args:
        models: replaces the spec's model axis (``--model``). Nodes the spec binds to a model
            of their own (``[nodes.judge] model = ...``) keep it, unless `all_nodes`.
        all_nodes: with `models`, every node runs on the new model too (``--all-nodes``); the
            recorded spec then binds no node, so a resumed run does the same.
    """
    if all_nodes:
        if not models:
            raise UserError("--all-nodes goes with --model (it puts every node on that model)")
        spec = spec.model_copy(update={"nodes": {
            name: settings.model_copy(update={"model": None})
            for name, settings in spec.nodes.items()}})
    for plugin in spec.plugins:
        load_plugin(plugin)
    proto = get_protocol(spec.protocol)
    spec = _protocol_default_conditions(spec, proto)
    options = proto.parse_options(spec.options)
    prompts = PromptRegistry(spec.prompt_overrides)
    aliases = model_aliases(spec)
    model_specs = [parse_model(m, aliases) for m in (models or spec.models)]
    labels = [m.label for m in model_specs]
    for label in labels:
        if labels.count(label) > 1:
            raise UserError(f"the model axis names '{label}' twice; give each model its own "
                            "[model_aliases.<name>] table so their cells stay apart")
    prepare = getattr(proto, "prepare_plan", None)
    if prepare is not None:  # an audited app: its LLM nodes are found by running it once
        spec, options = prepare(spec, options, model_specs, aliases)
    if not proto.variants(options):
        raise UserError(f"protocol '{proto.name}' has no variant to run with these [options] "
                        "(is a list of variants, such as pipelines, empty?)")
    llm_nodes = {v: proto.llm_nodes(v, options) for v in proto.variants(options)}
    known_nodes = {n.name for nodes in llm_nodes.values() for n in nodes}
    node_models, node_prompts = _node_bindings(spec.nodes, proto, known_nodes, aliases)
    plan = Plan(spec, proto, options, prompts, model_specs, node_models, node_prompts,
                llm_nodes=llm_nodes)
    _check_prompts(proto, options, llm_nodes, prompts, node_prompts)
    plan.conditions = _arm_grid(spec.conditions, proto, options, llm_nodes, prompts,
                                plan.exposure_template)
    if spec.mitigations:
        plan.conditions = _mitigation_grid(spec.mitigations, proto, llm_nodes, prompts,
                                           plan.conditions)
    if spec.from_turn is not None:
        plan.earlier = _earlier_turns(spec, proto, options, llm_nodes, aliases)
    if spec.swap_groups is not None:
        plan.group_swap = _group_swap(spec, proto, known_nodes)
    if not proto.items(options):
        raise UserError(f"protocol '{proto.name}' has no items to run with these [options] "
                        "(is a list of items, such as datasets, empty?): the grid has 0 cells")
    if check_keys:
        for model in plan.all_model_specs():
            model.check_ready()
    for variant in proto.variants(options):  # fails early on unreadable data
        for item in proto.items(options):
            proto.initial_state(variant, item, spec.run.seeds[0], options)
    return plan


def _protocol_default_conditions(spec: ExperimentSpec, proto: Protocol) -> ExperimentSpec:
    """A spec with no [conditions] table runs the protocol's own default grid when it has one
    (`Protocol.default_conditions`), written into the spec (so spec.toml and a resume hold
    it) and said on stderr before anything runs."""
    if "conditions" in spec.model_fields_set or proto.default_conditions is None:
        return spec
    import sys

    settings = ConditionSettings(**proto.default_conditions)
    arms = "the clean arm only" if settings.targets == [] else \
        f"exposure targets {settings.targets!r} and the clean arm"
    print(f"biaslab: {proto.name}: the spec has no [conditions] table, so each variant runs "
          f"{arms} (the paper's design); add a [conditions] table for exposure arms",
          file=sys.stderr)
    return spec.model_copy(update={"conditions": settings})


def _group_swap(spec: ExperimentSpec, proto: Protocol, known_nodes: set[str]) -> GroupSwap:
    """``spec.swap_groups`` resolved: its nodes checked against the graph's LLM nodes."""
    swap = spec.swap_groups
    unknown = [n for n in swap.nodes if n not in known_nodes]
    if unknown:
        raise UserError(f"swap_groups (--swap-groups --node): protocol '{proto.name}' has no "
                        f"LLM node '{unknown[0]}' (nodes: {', '.join(sorted(known_nodes))})")
    bad = [p for p in swap.pairs if len(p) != 2]
    if bad:
        raise UserError(f"swap_groups.pairs: {bad[0]!r} is not a pair of two terms")
    name = swap.lexicon if "/" not in swap.lexicon else swap.lexicon.rpartition("/")[2]
    return GroupSwap(frozenset(swap.nodes),
                     Lexicon(name.removesuffix(".toml"), tuple((a, b) for a, b in swap.pairs)))


def _node_bindings(nodes: dict[str, NodeSettings], proto: Protocol, known_nodes: set[str],
                   aliases: dict[str, ModelSpec], where: str = "nodes"
                   ) -> tuple[dict[str, ModelSpec], dict[str, str]]:
    node_models, node_prompts = {}, {}
    for node, settings in nodes.items():
        if node not in known_nodes:
            raise UserError(f"[{where}.{node}]: protocol '{proto.name}' has no LLM node "
                            f"'{node}' (nodes: {', '.join(sorted(known_nodes))})")
        if settings.model:
            node_models[node] = parse_model(settings.model, aliases)
        if settings.prompt:
            node_prompts[node] = settings.prompt
    return node_models, node_prompts


def _check_prompts(proto: Protocol, options: BaseModel, llm_nodes: dict[str, list[LLMNode]],
                   prompts: PromptRegistry, node_prompts: dict[str, str]) -> None:
    for variant in proto.variants(options):
        for node in llm_nodes[variant]:
            template = prompts.get(bound_prompt(node_prompts.get(node.name), node.prompt))
            template.check_slots(node.slots, node.name)
            unused = [slot for slot in node.required if slot not in template.slots]
            if unused:
                raise UserError(f"prompt {template.ref} ({template.source}) bound to node "
                                f"'{node.name}' in {proto.name} variant '{variant}' never uses "
                                f"slot '{unused[0]}', which that node requires")


def _arm_grid(c: ConditionSettings, proto: Protocol, options: BaseModel,
              llm_nodes: dict[str, list[LLMNode]], prompts: PromptRegistry,
              exposure_template: str, where: str = "conditions") -> dict[str, list[Condition]]:
    """Each variant's arms: clean, plus each target set × direction of `c`."""
    known_nodes = {n.name for nodes in llm_nodes.values() for n in nodes}
    directions = proto.directions
    if c.directions is not None:
        unknown = [d for d in c.directions if d not in directions]
        if unknown:
            raise UserError(f"unknown exposure direction '{unknown[0]}' for protocol "
                            f"'{proto.name}' (known: {', '.join(directions)})")
        directions = {d: directions[d] for d in c.directions}
    if directions:  # a protocol without directions has only its clean arm
        template = prompts.get(exposure_template)
        for values in directions.values():
            template.check_slots(values, "exposure")
    grid = {}
    for variant in proto.variants(options):
        names = [n.name for n in llm_nodes[variant]]
        targets = c.targets
        if isinstance(targets, str) and targets not in ("all", "singletons", "each_and_all"):
            targets = [targets]
        if isinstance(targets, list):  # a listed target may not exist in every variant
            listed = targets
            targets = [t for t in listed if set(t.split("+")) <= set(names)]
            unknown = [t for t in listed if not set(t.split("+")) <= known_nodes]
            if unknown:
                raise UserError(f"[{where}] target '{unknown[0]}' names no LLM node of "
                                f"'{proto.name}' (nodes: {', '.join(sorted(known_nodes))})")
        grid[variant] = exposure_conditions(names, directions, targets=targets,
                                            template=exposure_template, position=c.position,
                                            include_clean=c.include_clean)
    return grid


def _mitigation_template(name: str, settings: MitigationSettings) -> str:
    return settings.template or f"mitigations/{name}"


def _mitigation_position(prompts: PromptRegistry, name: str, settings: MitigationSettings
                         ) -> str:
    """The spec's position, else the template's own (a self-check's ``after-answer``), else
    ``system-append``."""
    return (settings.position or prompts.get(_mitigation_template(name, settings)).position
            or "system-append")


def _mitigation_grid(mitigations: dict[str, MitigationSettings], proto: Protocol,
                     llm_nodes: dict[str, list[LLMNode]], prompts: PromptRegistry,
                     grid: dict[str, list[Condition]]) -> dict[str, list[Condition]]:
    """Exposure arms × mitigation arms: each exposure arm (clean included) first without a
    mitigation, as before, then once with each mitigation arm of its variant."""
    known_nodes = {n.name for nodes in llm_nodes.values() for n in nodes}
    for name, m in mitigations.items():
        template = prompts.get(_mitigation_template(name, m))
        template.check_slots(m.slots, f"mitigation '{name}'")
        listed = [m.targets] if isinstance(m.targets, str) else list(m.targets)
        for entry in listed:
            if entry in ("all", "singletons", "each_and_all"):
                continue
            unknown = [n for n in entry.split("+") if n not in known_nodes]
            if unknown:
                raise UserError(f"[mitigations.{name}] target '{unknown[0]}' is not an LLM "
                                f"node of '{proto.name}' (nodes: {', '.join(sorted(known_nodes))})")
    out = {}
    for variant, conditions in grid.items():
        names = [n.name for n in llm_nodes[variant]]
        arms = []
        for name, m in mitigations.items():
            targets = m.targets
            if isinstance(targets, str) and targets not in ("all", "singletons", "each_and_all"):
                targets = [targets]
            if isinstance(targets, list):  # a listed node may not exist in every variant
                targets = [t for t in targets if set(t.split("+")) <= set(names)]
            arms += mitigation_arms(names, name, targets=targets,
                                    template=_mitigation_template(name, m),
                                    position=_mitigation_position(prompts, name, m),
                                    slots=m.slots)
        out[variant] = [c for base in conditions
                        for c in [base, *(with_mitigation(base, arm, mit) for arm, mit in arms)]]
    return out


def _earlier_turns(spec: ExperimentSpec, proto: Protocol, options: BaseModel,
                   llm_nodes: dict[str, list[LLMNode]], aliases: dict[str, ModelSpec]
                   ) -> "EarlierPlan":
    """The settings of the turns before ``spec.from_turn.turn``, checked like the spec's own.

    Raises:
        UserError: the protocol has no turns, or no dialogue of it reaches that turn.
    """
    ft = spec.from_turn
    longest = max((loop.max_turns for v in proto.variants(options)
                   for loop in turn_loops(proto.build(v, options))), default=0)
    if not longest:
        raise UserError(f"from_turn (--from-turn): protocol '{proto.name}' has no turns (none "
                        "of its graphs has a turn loop); make the change without it")
    if ft.turn > longest:
        raise UserError(f"from_turn (--from-turn) {ft.turn}: no dialogue of protocol '{proto.name}' reaches "
                        f"turn {ft.turn} here (the longest has {longest} turns)")
    known_nodes = {n.name for nodes in llm_nodes.values() for n in nodes}
    overrides = spec.prompt_overrides if ft.prompt_overrides_before is None \
        else ft.prompt_overrides_before
    prompts = PromptRegistry(overrides)
    node_models, node_prompts = _node_bindings(
        spec.nodes if ft.nodes_before is None else ft.nodes_before, proto, known_nodes,
        aliases, where="from_turn.nodes_before")
    _check_prompts(proto, options, llm_nodes, prompts, node_prompts)
    arms: dict[str, dict[str, Condition]] = {v: {} for v in proto.variants(options)}
    if ft.conditions_before is not None:
        c = ft.conditions_before
        grid = _arm_grid(c, proto, options, llm_nodes, prompts,
                         c.template or proto.exposure_template, where="from_turn.conditions_before")
        arms = {v: {cond.id: cond for cond in conds} for v, conds in grid.items()}
    return EarlierPlan(ft.turn, prompts, node_models, node_prompts, arms)


def model_aliases(spec: ExperimentSpec) -> dict[str, ModelSpec]:
    """The spec's ``[model_aliases.<name>]`` tables as models. A name that reads as a model
    string of another model (a provider, ``local``, or ``provider:model``) is refused: the
    alias would silently replace that model wherever the spec or a flag names it. (A run's
    recorded spec keys each resolved model by its own label, which names itself.)"""
    for name, table in spec.model_aliases.items():
        provider, colon, model = name.partition(":")
        if provider not in PROVIDERS or not isinstance(table, dict):
            continue
        names_itself = table.get("provider") == provider and (
            not colon or str(table.get("model", "")) == model)
        if not names_itself:
            raise UserError(f"model_aliases.{name}: the name shadows the provider "
                            f"'{provider}' (the model string '{name}' would mean this alias "
                            "instead); give the alias a name of its own")
    return {name: parse_model({**table, "alias": table.get("alias", name)})
            for name, table in spec.model_aliases.items()}
