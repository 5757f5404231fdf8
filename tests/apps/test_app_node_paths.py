"""Node paths name one node each: a top-level node called ``review/a`` and node ``a`` of
subgraph ``review`` would both be ``review/a``, so exposing one would expose both. Such an app
is refused from its structure, in one line, before any model call."""

from __future__ import annotations

from support_apps import cli

APP = '''
from typing import TypedDict
from langchain_openai import ChatOpenAI
from langgraph.graph import START, StateGraph

llm = ChatOpenAI(model="gpt-4o-mini", api_key="unused", base_url="http://127.0.0.1:9/v1")


class S(TypedDict):
    case: str
    decision: str


def ask(state: S) -> dict:
    return {"decision": llm.invoke(state["case"]).content}


inner = StateGraph(S)
inner.add_node("a", ask)
inner.add_edge(START, "a")
outer = StateGraph(S)
outer.add_node("review", inner.compile())
outer.add_node("{name}", ask)
outer.add_edge(START, "review")
outer.add_edge("review", "{name}")
graph = outer.compile()
'''

SPEC = '''name = "paths"
app = "app.py:graph"
items = "items.jsonl"
models = ["scripted:never-called"]
[outcome]
field = "decision"
[conditions]
targets = ["review/a"]
'''


def _write(tmp_path, name: str):
    (tmp_path / "app.py").write_text(APP.replace("{name}", name))
    (tmp_path / "items.jsonl").write_text('{"id": "x", "case": "c"}\n')
    (tmp_path / "audit.toml").write_text(SPEC)
    return tmp_path / "audit.toml"


def test_two_nodes_on_one_path_are_refused_before_any_call(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "cache.sqlite"))
    spec = _write(tmp_path, "review/a")
    capsys.readouterr()
    assert cli("run", spec, "--out", tmp_path / "run", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "two nodes are both 'review/a'" in err[0], err
    assert not (tmp_path / "run" / "run.sqlite").exists()
    assert not (tmp_path / "app_nodes.json").exists()  # no discovery pass ran


def test_the_same_app_with_distinct_paths_gets_past_the_check(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "cache.sqlite"))
    spec = _write(tmp_path, "review_b")
    capsys.readouterr()
    assert cli("run", spec, "--out", tmp_path / "run", "--quiet") == 2
    err = capsys.readouterr().err
    assert "two nodes" not in err and "never-called" in err  # it went on, to the model
