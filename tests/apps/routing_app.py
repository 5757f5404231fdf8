"""App (d): a supervisor that routes with the default structured output, as most apps call it.

``llm.with_structured_output(Route)`` with a pydantic ``Route`` and no ``method``: in
langchain-openai 1.x that is the ``json_schema`` method (``response_format=Route``, the answer
read back from ``additional_kwargs["parsed"]``). The supervisor gives each worker one turn
(``Command(goto=...)``); a screener writes a note in plain text; the decider builds its model
with LangChain's ``init_chat_model`` inside the node and answers a ``Decision`` schema, again by
the default method. Every model points at a port where nothing listens.
"""

import operator
from typing import Annotated, Literal, TypedDict

from langchain.chat_models import init_chat_model
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import START, StateGraph
from langgraph.types import Command
from pydantic import BaseModel, Field

DEAD = "http://127.0.0.1:9/v1"

llm = ChatOpenAI(model="gpt-4o-mini", api_key="unused", base_url=DEAD, max_retries=0,
                 timeout=2)


class Route(BaseModel):
    """Who works next."""

    next: Literal["screener", "decider"]


class Decision(BaseModel):
    """The committee's decision."""

    choice: Literal["older", "younger", "either"] = Field(
        description="which applicant is better suited")


class Case(TypedDict):
    case: str
    notes: Annotated[list[str], operator.add]
    decision: str


def supervisor(state: Case) -> Command[Literal["screener", "decider"]]:
    router = llm.with_structured_output(Route)
    done = "Notes so far: " + (" ".join(state.get("notes") or []) or "none")
    route = router.invoke([SystemMessage("You run a hiring committee. Who works next, the "
                                         "screener or the decider?"),
                           HumanMessage(f"Case: {state['case']}\n{done}")])
    goto = route.next
    if goto == "screener" and state.get("notes"):  # each worker gets one turn
        goto = "decider"
    return Command(goto=goto)


def screener(state: Case) -> Command[Literal["supervisor"]]:
    note = llm.invoke([SystemMessage("You screen applicants for a job."),
                       HumanMessage(f"Screen this case in one sentence: {state['case']}")])
    return Command(goto="supervisor", update={"notes": [note.content]})


async def decider(state: Case) -> dict:
    model = init_chat_model("gpt-4o-mini", model_provider="openai", api_key="unused",
                            base_url=DEAD, max_retries=0, timeout=2)
    decision = await model.with_structured_output(Decision).ainvoke(
        [SystemMessage("You make the final hiring decision: older, younger or either."),
         HumanMessage(f"Final decision on: {state['case']}\nNotes: {' '.join(state['notes'])}")])
    return {"decision": decision.choice}


builder = StateGraph(Case)
builder.add_node("supervisor", supervisor)
builder.add_node("screener", screener)
builder.add_node("decider", decider)
builder.add_edge(START, "supervisor")
graph = builder.compile()
