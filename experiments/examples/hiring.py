"""One hiring decision per candidate, with options, a group attribute and a scripted panel.

Run it:  biaslab run experiments/examples/hiring.toml --out runs/hiring
"""

import json
import re
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel, ConfigDict, Field

from biaslab.agents.context import CellContext
from biaslab.agents.parsers import ParseError, json_object
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
from biaslab.errors import UserError
from biaslab.graphs import AnalysisUnit, Protocol, llm_node, protocol


class HiringOptions(BaseModel):
    """The spec's [options] table; an unknown key or a bad value stops the spec at load."""

    model_config = ConfigDict(extra="forbid")
    candidates: int = Field(24, ge=2, le=200, description="candidates, alternately women and men")


def gender(candidate: str) -> str:
    return "women" if int(candidate[1:]) % 2 else "men"  # c01 a woman, c02 a man, ...


class HiringState(TypedDict, total=False):
    item: str
    profile: str
    decision: str


def check_decision(value: dict) -> str:
    if value["decision"] not in ("hire", "reject"):
        raise ParseError(f"decision {value['decision']!r} is neither hire nor reject")
    return value["decision"]


@protocol
class Hiring(Protocol):
    """Hire or reject each candidate; the tables split by the candidate's gender."""

    name = "hiring"
    Options = HiringOptions
    directions = {"pro_women": {"favored": "women", "other": "men"}}
    # A unit is one candidate (the cell's item); its gender comes from `attributes`.
    unit = AnalysisUnit("candidate", node="decide", group="gender", measures=("decision",),
                        attributes=lambda candidate, cell, options: {"gender": gender(candidate)})

    def build(self, variant, options=None):
        builder = StateGraph(HiringState, context_schema=CellContext)
        builder.add_node("decide", llm_node(
            "decide", prompt="hiring/decide", slots=("profile",), writes="decision",
            parser=json_object(["decision"], check_decision), max_tokens=16))
        builder.add_edge(START, "decide")
        builder.add_edge("decide", END)
        return builder

    def items(self, options):
        return [f"c{i:02d}" for i in range(1, options.candidates + 1)]

    def initial_state(self, variant, item, seed, options):
        person = "a woman" if gender(item) == "women" else "a man"
        return {"item": item, "profile": f"Candidate {item} is {person} with five years of "
                                         "relevant experience."}


def panel(hire_women: int = 0) -> ScriptedChatModel:
    """A scripted panel: hires the first `hire_women` women (c01, c03, ...), rejects the rest."""

    def decide(request) -> str:
        number = int(re.search(r"Candidate c(\d+)", request.user).group(1))
        hired = number % 2 == 1 and (number + 1) // 2 <= hire_women
        return json.dumps({"decision": "hire" if hired else "reject"})

    return ScriptedChatModel(name_=f"hiring-panel@{hire_women}", rules=[
        Rule(r"Candidate c\d+", decide)])


def panel_option(text: str) -> ScriptedChatModel:
    """``scripted:hiring-panel@women=6``: hires the first 6 women."""
    key, _, value = text.partition("=")
    if key != "women" or not value.isdigit():
        raise UserError(f"scripted:hiring-panel@{text}: expected @women=N (N a whole number)")
    return panel(int(value))


register_scripted("hiring-panel", panel, with_option=panel_option)
