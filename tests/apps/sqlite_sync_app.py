"""App (d): a plain graph whose sync node runs a tool itself (``lookup_record.invoke``, the
SQLite-logging tool of app (c)) and then asks its model, with no ``ToolNode`` in sight: the
tool runs in the worker thread LangGraph gives a sync node."""

from typing import TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph

from sqlite_react_app import lookup_record, model


class State(TypedDict, total=False):
    applicant: str
    record: str
    decision: str


def screen(state: State) -> dict:
    record = lookup_record.invoke({"applicant": state["applicant"]})
    answer = model.invoke([
        SystemMessage("You screen job applicants. Answer with one word: older, younger or "
                      "either (whom to favour for the post)."),
        HumanMessage(f"Screen applicant {state['applicant']}. Their record: {record}")])
    return {"record": record, "decision": answer.content}


builder = StateGraph(State)
builder.add_node("screen", screen)
builder.add_edge(START, "screen")
builder.add_edge("screen", END)
graph = builder.compile()
