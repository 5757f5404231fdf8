"""Protocol ``roleplay_generate``: build a BiasLens-style question bank with LLMs.

    generate_roles → dedupe_roles → generate_questions → filter_questions

One cell per demographic attribute: the ``role_generator`` lists N roles; near-duplicate roles
are dropped (and counted); for each kept role and each question type the
``question_generator`` writes M questions; questions that still hold placeholders ("Group A"),
lack the role statement or break their type's rule are dropped (and counted, by reason). The
report writes the bank in the shipped layout under ``bank/<model>/<condition>/``, ready for
``roleplay``'s ``bank_dir`` option. Exposing the question generator shows how a biased
generator changes the bank (compare the banks of the clean and exposed arms).
"""

from __future__ import annotations

import asyncio
import difflib
import re
from pathlib import Path
from typing import Any, Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from pydantic import BaseModel, ConfigDict, Field

from biaslab.agents.ask import ask
from biaslab.agents.context import CellContext
from biaslab.agents.parsers import OutputConstraint, ParseError
from biaslab.datasets import biaslens
from biaslab.graphs.llm_nodes import LLMNode, declare_llm
from biaslab.graphs.registry import Protocol, protocol
from biaslab.graphs.roleplay import DIRECTIONS

__all__ = ["RoleplayGenerate", "GenerateOptions", "numbered_list", "near_duplicates", "role_key",
           "filter_question", "PLACEHOLDER"]

ROLE_PROMPT = "roleplay/role_generator"
QUESTION_PROMPT = "roleplay/question_generator"
RULE_PROMPTS = {t: f"roleplay/question_rule_{t}" for t in biaslens.QUESTION_TYPES}
EXAMPLE_PROMPTS = {t: f"roleplay/question_example_{t}" for t in biaslens.QUESTION_TYPES}
"""Each type's example patterns: the example section of the paper's generator prompt (§3.3,
Figure 4), in our own words, with an invitation to go beyond them."""
PLACEHOLDER = re.compile(r"\bgroup\s+[A-Z]\b|\[[^\]]*group[^\]]*\]|<[^>]*group[^>]*>|"
                         r"\bgroup\s+[XYZ12]\b", re.I)


Attribute = Literal[biaslens.ATTRIBUTES]  # type: ignore[valid-type]


class GenerateOptions(BaseModel):
    """The spec's ``[options]`` table for ``roleplay_generate``."""

    model_config = ConfigDict(extra="forbid")

    attributes: list[Attribute] = list(biaslens.ATTRIBUTES)
    types: list[Literal["yes_no", "choice", "why"]] = list(biaslens.QUESTION_TYPES)
    roles_per_attribute: int = Field(default=50, ge=1, le=200)
    """N: roles asked for per attribute."""
    questions_per_role: int = Field(default=20, ge=1, le=50)
    """M: questions asked for per role and type."""
    max_roles: int | None = Field(default=None, ge=1)
    """Write questions for at most this many of the kept roles (smoke runs)."""
    near_duplicate_ratio: float = Field(default=0.95, gt=0, le=1)
    """Roles whose `role_key` is at least this similar (difflib ratio) to a kept role's are
    dropped as near-duplicates (1.0: only equal keys)."""


class GenerateState(TypedDict, total=False):
    attribute: str
    generated_roles: list[str]
    roles: list[str]
    dropped_roles: list[dict[str, str]]
    raw_questions: list[dict[str, Any]]
    questions: list[dict[str, Any]]
    stats: dict[str, int]


def numbered_list(text: str) -> list[str]:
    """The items of a numbered list ("1. ...", "2) ..."), in order.

    Raises:
        ParseError: no numbered line.
    """
    items = [m.group(1).strip() for m in re.finditer(r"^\s*\d+\s*[.)]\s*(.+?)\s*$", text, re.M)]
    items = [i.strip("*\"' ") for i in items if i.strip("*\"' ")]
    if not items:
        raise ParseError("no numbered list (1. ..., 2. ...) found")
    return items


_GENERIC_WORDS = {"people", "individuals", "individual", "persons", "person", "folks", "the",
                  "a", "an", "of", "who", "are", "with"}


def role_key(role: str) -> str:
    """A role's name reduced for comparison: lower case; hyphens, punctuation, spaces, plural
    "s" and generic words ("people", "individuals", "the"...) removed. "Non-binary people" and
    "nonbinary individuals" share the key ``nonbinary``."""
    words = re.sub(r"[^a-z0-9 ]+", " ", role.lower().replace("-", "")).split()
    words = [w[:-1] if w.endswith("s") and len(w) > 3 else w
             for w in words if w not in _GENERIC_WORDS]
    return "".join(words) or role.lower()


def near_duplicates(roles: list[str], ratio: float) -> tuple[list[str], list[dict[str, str]]]:
    """Keep the first of each group of near-duplicate roles.

    Two roles are near-duplicates when their `role_key` values are equal or have a difflib
    similarity ratio of at least `ratio`. The default 0.95 drops nothing from the published
    bank, whereas 0.9 would already merge "transgender women" with "transgender men".

    Returns:
        (kept roles, dropped roles as ``{"role", "duplicate_of"}``).
    """
    kept: list[str] = []
    dropped: list[dict[str, str]] = []
    for role in roles:
        key = role_key(role)
        match = next((k for k in kept
                      if difflib.SequenceMatcher(None, key, role_key(k)).ratio() >= ratio),
                     None)
        if match is None:
            kept.append(role)
        else:
            dropped.append({"role": role, "duplicate_of": match})
    return kept, dropped


def filter_question(question: str, qtype: str) -> str | None:
    """Why a generated question is dropped (``placeholder``, ``no_role_statement``,
    ``not_why``, ``no_options``, ``no_neutral_option``), or None when it is kept."""
    if PLACEHOLDER.search(question):
        return "placeholder"
    if not biaslens.has_role_statement(question):
        return "no_role_statement"
    rest = biaslens.strip_role(question)
    if qtype == "why" and not re.match(r"why\b", rest, re.I):
        return "not_why"
    if qtype == "choice":
        options = biaslens.choice_options(question)
        if len(options) < 3:
            return "no_options"
        if not re.search(r"cannot|can't|no choice|neither|none", options[-1].text, re.I):
            return "no_neutral_option"
    return None


# -- constrained decoding (local models only): numbered lists in the required shape ---------
def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def role_list_grammar(n: int) -> OutputConstraint:
    """GBNF for exactly n numbered role names."""
    lines = " ".join(f'"{i + 1}. " name "\\n"' for i in range(n))
    return OutputConstraint(grammar=f"root ::= {lines}\nname ::= [A-Za-z] [A-Za-z '-]{{2,40}}\n")


def question_list_grammar(role: str, qtype: str, m: int) -> OutputConstraint:
    """GBNF for m numbered questions that open with the role statement and follow their type's
    shape (Why: "why ..."; Choice: two groups and the neutral option)."""
    head = f"Suppose you are a {role}, " + ("why " if qtype == "why" else "")
    lines = " ".join(f'"{i + 1}. " {_literal(head)} body "\\n"' for i in range(m))
    if qtype == "choice":
        body = ('body ::= [^\\n()?]{8,120} "? (A) " group " (B) " group '
                '" (C) I cannot make any choice"\ngroup ::= [^\\n()]{2,40}\n')
    else:
        body = 'body ::= [^\\n()?]{8,150} "?"\n'
    return OutputConstraint(grammar=f"root ::= {lines}\n{body}")


# -- nodes ---------------------------------------------------------------------------------
async def generate_roles(state: GenerateState, runtime: Runtime[CellContext]) -> dict:
    ctx = runtime.context
    opts: GenerateOptions = ctx.options
    answer = await ask(ctx, "role_generator", {"attribute": state["attribute"],
                                               "n": opts.roles_per_attribute},
                       prompt=ROLE_PROMPT, parser=numbered_list, item=state["attribute"],
                       constraint=role_list_grammar(opts.roles_per_attribute),
                       max_tokens=16 * opts.roles_per_attribute + 16)
    answer.raise_for_error(f"role_generator on {state['attribute']}")
    return {"generated_roles": list(answer.value) if answer.ok else []}


declare_llm(generate_roles, LLMNode("role_generator", ROLE_PROMPT, ("attribute", "n"),
                                    required=("attribute",), max_tokens=800))


def dedupe_roles(state: GenerateState, runtime: Runtime[CellContext]) -> dict:
    opts: GenerateOptions = runtime.context.options
    # a comma would end the role statement early and split the role file's line
    names = [" ".join(r.replace(",", " ").split()) for r in state["generated_roles"]]
    kept, dropped = near_duplicates(names, opts.near_duplicate_ratio)
    return {"roles": kept[:opts.max_roles] if opts.max_roles else kept, "dropped_roles": dropped}


async def generate_questions(state: GenerateState, runtime: Runtime[CellContext]) -> dict:
    ctx = runtime.context
    opts: GenerateOptions = ctx.options
    rules = {t: ctx.prompts.get(RULE_PROMPTS[t]).user.strip() for t in opts.types}
    examples = {t: ctx.prompts.get(EXAMPLE_PROMPTS[t]).user.strip() for t in opts.types}

    async def one(role: str, qtype: str) -> dict[str, Any]:
        answer = await ask(ctx, "question_generator",
                           {"role": role, "attribute": state["attribute"],
                            "m": opts.questions_per_role, "rule": rules[qtype],
                            "examples": examples[qtype]},
                           prompt=QUESTION_PROMPT, parser=numbered_list,
                           constraint=question_list_grammar(role, qtype,
                                                            opts.questions_per_role),
                           item=f"{role}|{qtype}", max_tokens=80 * opts.questions_per_role)
        answer.raise_for_error(f"question_generator on {role} / {qtype}")
        return {"role": role, "type": qtype, "lines": list(answer.value) if answer.ok else None}

    jobs = [one(role, qtype) for role in state["roles"] for qtype in opts.types]
    return {"raw_questions": list(await asyncio.gather(*jobs))}


declare_llm(generate_questions, LLMNode("question_generator", QUESTION_PROMPT,
                                        ("role", "attribute", "m", "rule", "examples"),
                                        required=("role", "rule"), max_tokens=1200))


def filter_questions(state: GenerateState) -> dict:
    """Keep well-formed questions; count every drop by reason."""
    stats = {"roles_generated": len(state["generated_roles"]),
             "roles_near_duplicate": len(state["dropped_roles"]),
             "roles_used": len(state["roles"]), "lists_unparsable": 0,
             "questions_generated": 0, "questions_kept": 0, "duplicate": 0}
    kept, seen = [], set()
    for batch in state["raw_questions"]:
        if batch["lines"] is None:
            stats["lists_unparsable"] += 1
            continue
        for line in batch["lines"]:
            stats["questions_generated"] += 1
            reason = filter_question(line, batch["type"])
            if reason is None and line in seen:
                reason = "duplicate"
            if reason:
                stats[reason] = stats.get(reason, 0) + 1
                continue
            seen.add(line)
            kept.append({"attribute": state["attribute"], "role": batch["role"],
                         "type": batch["type"], "question": line})
    stats["questions_kept"] = len(kept)
    return {"questions": kept, "stats": stats}


def build_generation() -> StateGraph:
    builder = StateGraph(GenerateState, context_schema=CellContext)
    builder.add_node("generate_roles", generate_roles)
    builder.add_node("dedupe_roles", dedupe_roles)
    builder.add_node("generate_questions", generate_questions)
    builder.add_node("filter_questions", filter_questions)
    builder.add_edge(START, "generate_roles")
    builder.add_edge("generate_roles", "dedupe_roles")
    builder.add_edge("dedupe_roles", "generate_questions")
    builder.add_edge("generate_questions", "filter_questions")
    builder.add_edge("filter_questions", END)
    return builder


@protocol
class RoleplayGenerate(Protocol):
    """Role generation → question generation → filtering, one cell per attribute."""

    name = "roleplay_generate"
    exposure_template = "roleplay/exposure"
    Options = GenerateOptions
    directions = DIRECTIONS

    def build(self, variant: str, options: GenerateOptions | None = None) -> StateGraph:
        return build_generation()

    def items(self, options: GenerateOptions) -> list[str]:
        return list(options.attributes)

    def initial_state(self, variant: str, item: str, seed: int, options: GenerateOptions
                      ) -> dict:
        return {"attribute": item}

    def estimate(self, variant: str, item: str, options: GenerateOptions) -> dict[str, float]:
        """One role list, then one question list per role (after ~5% near-duplicates) × type."""
        roles = options.roles_per_attribute * 0.95
        if options.max_roles:
            roles = min(roles, options.max_roles)
        lists = roles * len(options.types)
        return {"calls": 1 + lists,
                "tokens": (150 + 12 * options.roles_per_attribute)
                + lists * (260 + 45 * options.questions_per_role)}
