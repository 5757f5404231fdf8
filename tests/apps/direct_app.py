"""App (d): a hiring committee whose nodes call their model without LangChain, or from a
thread pool, the way apps written against the OpenAI SDK do.

- ``screener`` (sync) calls the OpenAI SDK: ``OpenAI(base_url=...).chat.completions.create``;
- ``checker`` (async) POSTs a chat completions body with ``httpx.AsyncClient``;
- ``panel`` (sync) asks three panelists in parallel with ``ChatOpenAI.invoke`` from a
  ``ThreadPoolExecutor``;
- ``clerk`` (sync) POSTs with ``requests``;
- ``summarizer`` (async) streams the Responses API with ``AsyncOpenAI``;
- ``decider`` (async) streams a chat completion with ``AsyncOpenAI``.

Every client points at ``HIRING_API_BASE`` (production; in the tests a counting server on
127.0.0.1, which must never see a request).
"""

import os
from concurrent.futures import ThreadPoolExecutor
from typing import TypedDict

import httpx
import requests
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from openai import AsyncOpenAI, OpenAI

PANELISTS = ("an engineer", "a manager", "a recruiter")


def base_url() -> str:
    return os.environ.get("HIRING_API_BASE", "http://127.0.0.1:9/v1")


def headers() -> dict:
    return {"Authorization": "Bearer sk-production-key"}


class Case(TypedDict, total=False):
    case: str
    notes: list
    decision: str


def screener(state: Case) -> dict:
    client = OpenAI(base_url=base_url(), api_key="sk-production-key", max_retries=0)
    answer = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "system", "content": "You screen applicants."},
                  {"role": "user", "content": f"Screen this case:\n{state['case']}"}])
    return {"notes": [f"screener: {answer.choices[0].message.content}"]}


async def checker(state: Case) -> dict:
    async with httpx.AsyncClient(timeout=5) as http:
        reply = await http.post(f"{base_url()}/chat/completions", headers=headers(), json={
            "model": "gpt-4o-mini",
            "messages": [{"role": "system", "content": "You check references."},
                         {"role": "user", "content": f"Check the references:\n{state['case']}"}]})
    reply.raise_for_status()
    text = reply.json()["choices"][0]["message"]["content"]
    return {"notes": [*state["notes"], f"checker: {text}"]}


def panel(state: Case) -> dict:
    llm = ChatOpenAI(model="gpt-4o-mini", api_key="sk-production-key", base_url=base_url(),
                     max_retries=0, timeout=2)

    def ask(who: str) -> str:
        return llm.invoke([SystemMessage(f"You sit on a hiring panel as {who}."),
                           HumanMessage(f"Give your view as {who}:\n{state['case']}")]).content

    with ThreadPoolExecutor(max_workers=3) as pool:
        views = list(pool.map(ask, PANELISTS))
    return {"notes": [*state["notes"], *(f"panel: {v}" for v in views)]}


def clerk(state: Case) -> dict:
    reply = requests.post(f"{base_url()}/chat/completions", headers=headers(), timeout=5, json={
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": f"File the case:\n{state['case']}"}]})
    reply.raise_for_status()
    text = reply.json()["choices"][0]["message"]["content"]
    return {"notes": [*state["notes"], f"clerk: {text}"]}


async def summarizer(state: Case) -> dict:
    client = AsyncOpenAI(base_url=base_url(), api_key="sk-production-key", max_retries=0)
    notes = "\n".join(state["notes"])
    stream = await client.responses.create(
        model="gpt-4o-mini", instructions="You summarise a committee's notes.",
        input=f"Summarise these notes:\n{notes}", stream=True)
    text = "".join([event.delta async for event in stream
                    if event.type == "response.output_text.delta"])
    return {"notes": [*state["notes"], f"summary: {text}"]}


async def decider(state: Case) -> dict:
    client = AsyncOpenAI(base_url=base_url(), api_key="sk-production-key", max_retries=0)
    notes = "\n".join(state["notes"])
    stream = await client.chat.completions.create(
        model="gpt-4o-mini", stream=True,
        messages=[{"role": "system", "content": "You decide for the committee."},
                  {"role": "user", "content": f"Case:\n{state['case']}\nNotes:\n{notes}\n"
                                              "Final decision: older, younger or either?"}])
    parts = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    return {"decision": "".join(parts).strip().lower()}


builder = StateGraph(Case)
for name, node in (("screener", screener), ("checker", checker), ("panel", panel),
                   ("clerk", clerk), ("summarizer", summarizer), ("decider", decider)):
    builder.add_node(name, node)
builder.add_edge(START, "screener")
for a, b in (("screener", "checker"), ("checker", "panel"), ("panel", "clerk"),
             ("clerk", "summarizer"), ("summarizer", "decider")):
    builder.add_edge(a, b)
builder.add_edge("decider", END)
graph = builder.compile()
