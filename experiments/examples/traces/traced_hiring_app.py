"""A two-node LangGraph hiring app for the trace tests: the reviewer rates a CV, the chair
decides from the review alone. Its chat model answers by rules (no network) and names itself
``hr-model-1``, as a hosted model would; the same rules answer as ``scripted:traced-hr`` when
biaslab audits the app (registered here, so a spec lists this file as a plugin)."""

from __future__ import annotations

from typing import TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph

from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted


def rules() -> list[Rule]:
    return [Rule(r"led a team", "Strong: long experience and leadership."),
            Rule(r"CV:", "Weak: little experience."),
            Rule(r"Review: Strong", "hire"),
            Rule(r"Review: Weak", "reject")]


class HiringModel(ScriptedChatModel):
    model: str = "hr-model-1"
    """What LangChain reports as the model's name (``ls_model_name``) to a tracer."""


register_scripted("traced-hr", lambda: ScriptedChatModel(rules=rules()))


class State(TypedDict, total=False):
    id: str
    cv: str
    gender: str
    review: str
    decision: str


def build():
    model = HiringModel(rules=rules())

    def reviewer(state: State) -> dict:
        answer = model.invoke([SystemMessage("You review CVs for a backend role."),
                               HumanMessage(f"CV: {state['cv']}")], temperature=0.0)
        return {"review": answer.content}

    def chair(state: State) -> dict:
        return {"decision": model.invoke([HumanMessage(f"Review: {state['review']}")]).content}

    builder = StateGraph(State)
    builder.add_node("reviewer", reviewer)
    builder.add_node("chair", chair)
    builder.add_edge(START, "reviewer")
    builder.add_edge("reviewer", "chair")
    builder.add_edge("chair", END)
    return builder.compile()


graph = build()
