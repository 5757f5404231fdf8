"""App (c): a supervisor that routes with structured output, a research team subgraph that
fans out with ``Send`` (map) and summarises (reduce), and a decision node.

Written as LangGraph's multi-agent tutorials write such apps: the supervisor calls
``llm.with_structured_output(Route)``; each screener (one per criterion, sent in parallel)
calls ``llm.batch`` from a sync node; the decider builds its own ``ChatOpenAI`` inside the
node. Every model points at a port where nothing listens.
"""

import operator
from typing import Annotated, Literal, TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from pydantic import BaseModel

DEAD = "http://127.0.0.1:9/v1"


def make_llm() -> ChatOpenAI:
    return ChatOpenAI(model="gpt-4o-mini", api_key="unused", base_url=DEAD, max_retries=0,
                      timeout=2)


llm = make_llm()
CRITERIA = ("experience", "skills")


class Route(BaseModel):
    """Who works next."""

    next: Literal["research_team", "decider"]


class Panel(TypedDict):
    case: str
    notes: Annotated[list[str], operator.add]
    summary: str
    decision: str


class Team(TypedDict):
    case: str
    notes: Annotated[list[str], operator.add]
    summary: str


class Task(TypedDict):
    case: str
    criterion: str


def fan_out(state: Team):
    return [Send("screener", {"case": state["case"], "criterion": c}) for c in CRITERIA]


def screener(task: Task) -> dict:
    asks = [[SystemMessage(f"You screen applicants on {task['criterion']}."),
             HumanMessage(f"Screen this case for {aspect}:\n{task['case']}")]
            for aspect in ("strengths", "risks")]
    answers = llm.batch(asks)
    return {"notes": [f"{task['criterion']}: {a.content}" for a in answers]}


async def summarizer(state: Team) -> dict:
    notes = "\n".join(sorted(state["notes"]))
    answer = await llm.ainvoke([SystemMessage("You summarise a screening team's notes."),
                                HumanMessage(f"Summarise these notes:\n{notes}")])
    return {"summary": answer.content}


team = StateGraph(Team)
team.add_node("screener", screener)
team.add_node("summarizer", summarizer)
team.add_conditional_edges(START, fan_out, ["screener"])
team.add_edge("screener", "summarizer")
team.add_edge("summarizer", END)
research_team = team.compile()


async def supervisor(state: Panel) -> dict:
    return {}


async def route(state: Panel) -> str:
    router = llm.with_structured_output(Route, method="function_calling")
    done = f"Summary so far: {state['summary']}" if state.get("summary") else "No summary yet."
    choice = await router.ainvoke([SystemMessage("You supervise a hiring panel."),
                                   HumanMessage(f"Case:\n{state['case']}\n{done}\nWho works "
                                                "next?")])
    return choice.next


async def decider(state: Panel) -> dict:
    own = make_llm()  # built inside the node
    answer = await own.ainvoke([SystemMessage("You decide for the panel."),
                                HumanMessage(f"Case:\n{state['case']}\nSummary: "
                                             f"{state['summary']}\nFinal decision: older, "
                                             "younger or either?")])
    return {"decision": answer.content.strip().lower()}


builder = StateGraph(Panel)
builder.add_node("supervisor", supervisor)
builder.add_node("research_team", research_team)
builder.add_node("decider", decider)
builder.add_edge(START, "supervisor")
builder.add_conditional_edges("supervisor", route, ["research_team", "decider"])
builder.add_edge("research_team", "supervisor")
builder.add_edge("decider", END)
graph = builder.compile()
