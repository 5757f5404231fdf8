"""A minimal protocol for benchmarks: one LLM node, a large item axis, nothing else.

``bench-flat`` has a single graph variant ``answer`` (START → answer → END) whose only node
makes one call through `ask` (so the gateway, the exposure plumbing, the call record and the
store all take their normal path). Its item axis is ``item-0 … item-(n_items-1)``, so the grid
grows with one option and each cell does the same, tiny amount of work. It is registered when
this module is imported and is never part of the library.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel, ConfigDict, Field

from biaslab.agents.context import CellContext
from biaslab.agents.providers.scripted import ScriptedChatModel, register_scripted
from biaslab.graphs.compose import llm_node, text_answer
from biaslab.graphs.registry import Protocol, protocol

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
PROMPT = "bench/echo"
ECHO_MODEL = "bench-echo"  # scripted:bench-echo, zero latency, answers "ok"


class FlatOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n_items: int = Field(default=100, ge=1)


class FlatState(TypedDict, total=False):
    item: str
    answer: str | None


@protocol
class Flat(Protocol):
    name = "bench-flat"
    Options = FlatOptions
    directions = {"pro_a": {"favored": "group A", "other": "group B"}}

    def variants(self, options):
        return ["answer"]

    def build(self, variant, options=None):
        builder = StateGraph(FlatState, context_schema=CellContext)
        builder.add_node("answer", llm_node("answer", prompt=PROMPT,
                                            slots=("item",),
                                            parser=text_answer, writes="answer", max_tokens=4))
        builder.add_edge(START, "answer")
        builder.add_edge("answer", END)
        return builder

    def items(self, options):
        return [f"item-{i}" for i in range(options.n_items)]

    def initial_state(self, variant, item, seed, options):
        return {"item": item}

    def estimate(self, variant, item, options):
        return {"calls": 1, "tokens": 40}

    def report(self, store, run_dir, options):  # pragma: no cover - benchmarks report nothing
        return []


def make_echo() -> ScriptedChatModel:
    return ScriptedChatModel(name_=ECHO_MODEL, default="ok")


register_scripted(ECHO_MODEL, make_echo)


def flat_spec_dict(n_items: int) -> dict:
    """Two cells per item: the clean arm and one exposed arm."""
    return {"name": f"bench-flat-{n_items}", "protocol": "bench-flat",
            "models": [f"scripted:{ECHO_MODEL}"], "prompt_overrides": [str(PROMPTS_DIR)],
            "conditions": {"directions": ["pro_a"]}, "options": {"n_items": n_items}}
