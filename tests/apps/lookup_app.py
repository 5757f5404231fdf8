"""App (e): a screening app that reads each applicant's record from a records service before
its model decides: ``lookup`` GETs it with ``httpx`` (a key in the query string, as some
services want), ``registry`` checks it with ``urllib``, and ``decider`` asks a ``ChatOpenAI``.
The service's address comes from ``RECORDS_URL``."""

import os
import urllib.request
from typing import TypedDict

import httpx
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph


class Case(TypedDict, total=False):
    case: str
    record: str
    registered: str
    decision: str


def records_url() -> str:
    return os.environ.get("RECORDS_URL", "http://127.0.0.1:9")


def lookup(state: Case) -> dict:
    reply = httpx.get(f"{records_url()}/records?api_key=sk-records-secret&case=1", timeout=5)
    return {"record": reply.text}


def registry(state: Case) -> dict:
    with urllib.request.urlopen(f"{records_url()}/registry", timeout=5) as reply:
        return {"registered": reply.read().decode()}


async def decider(state: Case) -> dict:
    llm = ChatOpenAI(model="gpt-4o-mini", api_key="unused", base_url="http://127.0.0.1:9/v1",
                     max_retries=0)
    answer = await llm.ainvoke([HumanMessage(f"Case: {state['case']}\nRecord: "
                                             f"{state['record']}\nFinal decision: older, "
                                             "younger or either?")])
    return {"decision": answer.content.strip().lower()}


builder = StateGraph(Case)
builder.add_node("lookup", lookup)
builder.add_node("registry", registry)
builder.add_node("decider", decider)
builder.add_edge(START, "lookup")
builder.add_edge("lookup", "registry")
builder.add_edge("registry", "decider")
builder.add_edge("decider", END)
graph = builder.compile()
