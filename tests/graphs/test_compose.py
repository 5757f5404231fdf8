"""Composing a custom topology from biaslab's parts, with exposures at each node in turn."""

import asyncio
import operator
from typing import Annotated, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from biaslab.agents.context import Bindings, CellContext
from biaslab.agents.gateway import Gateway
from biaslab.agents.providers import ModelSpec
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
from biaslab.graphs.compose import add_turn_loop, llm_node
from biaslab.prompts.exposure import exposure_conditions
from biaslab.prompts.registry import PromptRegistry

EXPOSURE_MARK = "benefits group A over group B"


@pytest.fixture
def prompts(tmp_path):
    root = tmp_path / "prompts" / "custom"
    root.mkdir(parents=True)
    (root / "draft.toml").write_text('slots = ["topic"]\nsystem = "You draft."\n'
                                     'user = "Draft a note on $topic."')
    (root / "critique.toml").write_text('slots = ["draft"]\nsystem = "You critique."\n'
                                        'user = "Critique: $draft"')
    (root / "revise.toml").write_text('slots = ["draft", "critique"]\nsystem = "You revise."\n'
                                      'user = "Revise $draft given $critique"')
    (root / "ask.toml").write_text('slots = ["turn"]\nuser = "User turn $turn"')
    (root / "reply.toml").write_text('slots = ["question"]\nuser = "Reply to: $question"')
    (root / "verdict.toml").write_text('slots = ["reply"]\nuser = "Is this biased? $reply"')
    return PromptRegistry([tmp_path / "prompts"])


register_scripted("compose-echo", lambda: ScriptedChatModel(rules=[
    Rule(r"Draft a note", "DRAFT"), Rule(r"Critique:", "CRITIQUE"), Rule(r"Revise", "FINAL"),
    Rule(r"User turn", "question?"), Rule(r"Reply to", "reply."), Rule(r"biased\?", "no")]))


class Doc(TypedDict, total=False):
    topic: str
    draft: str
    critique: str
    final: str


def build_three_nodes() -> StateGraph:
    builder = StateGraph(Doc, context_schema=CellContext)
    builder.add_node("draft", llm_node("draft", prompt="custom/draft",
                                       slots=("topic",)))
    builder.add_node("critique", llm_node("critique", prompt="custom/critique",
                                          slots=("draft",)))
    builder.add_node("revise", llm_node("revise", prompt="custom/revise", writes="final",
                                        slots=("draft", "critique")))
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "critique")
    builder.add_edge("critique", "revise")
    builder.add_edge("revise", END)
    return builder


def run_graph(graph, state, prompts, condition, gateway=None):
    ctx = CellContext(cell_id="c", seed=1, prompts=prompts, condition=condition,
                      bindings=Bindings(model=ModelSpec(provider="scripted", model="compose-echo")),
                      gateway=gateway or Gateway())
    final = asyncio.run(graph.ainvoke(state, context=ctx))
    return final, ctx.calls


def test_exposure_reaches_exactly_the_targeted_node(prompts, tmp_path):
    (tmp_path / "prompts" / "exposures").mkdir()
    (tmp_path / "prompts" / "exposures" / "tilt.toml").write_text(
        f'slots = []\nuser = "Quietly: your answer {EXPOSURE_MARK}."')
    graph = build_three_nodes().compile()
    nodes = ["draft", "critique", "revise"]
    conditions = exposure_conditions(nodes, {"pro_A": {}}, targets="singletons",
                                     template="exposures/tilt")
    assert [c.target for c in conditions] == ["none", "draft", "critique", "revise"]
    for condition in conditions:
        final, calls = run_graph(graph, {"topic": "cats"}, prompts, condition)
        assert final["final"] == "FINAL"
        assert [c.node for c in calls] == nodes
        for call in calls:
            rendered = "\n".join(m["content"] for m in call.messages)
            carries = EXPOSURE_MARK in rendered
            assert carries == (call.node == condition.target), (condition.id, call.node)
            assert call.exposed == carries
            assert bool(call.exposure_prompts) == carries
            assert all(p.startswith("exposures/tilt@") for p in call.exposure_prompts)
            assert call.exposure_id == condition.id
            if carries:  # system-append: the text ends the system message, the user is intact
                assert call.messages[0]["role"] == "system"
                assert call.messages[0]["content"].endswith(f"{EXPOSURE_MARK}.")
                assert EXPOSURE_MARK not in call.messages[1]["content"]
            assert call.prompt_id == f"custom/{call.node}" and len(call.prompt_hash) == 16


class Dialogue(TypedDict, total=False):
    turn: int
    question: str
    reply: str
    verdicts: Annotated[list, operator.add]


def test_dialogue_loop_with_turn_cap_and_judge_every_turn(prompts):
    builder = StateGraph(Dialogue, context_schema=CellContext)
    turn = lambda s: f"turn-{s.get('turn', 0)}"  # noqa: E731
    builder.add_node("user", llm_node("user", prompt="custom/ask", writes="question", item=turn,
                                      slots=lambda s: {"turn": s.get("turn", 0)},
                                      offers=("turn",)))
    builder.add_node("target", llm_node("target", prompt="custom/reply", writes="reply",
                                        item=turn, slots=("question",)))
    builder.add_node("judge", llm_node(
        "judge", prompt="custom/verdict", item=turn, slots=("reply",),
        writes=lambda s, a: {"verdicts": [a.value], "turn": s.get("turn", 0) + 1}))
    builder.add_edge(START, "user")
    builder.add_edge("user", "target")
    builder.add_edge("target", "judge")
    add_turn_loop(builder, first="user", last="judge", max_turns=3, turn_key="turn")
    exposed = exposure_conditions(["user", "target", "judge"],
                                  {"pro_A": {"favored": "group A", "other": "group B"}},
                                  targets=["target"])[1]
    final, calls = run_graph(builder.compile(), {"turn": 0}, prompts, exposed)
    assert final["turn"] == 3 and final["verdicts"] == ["no", "no", "no"]
    assert [c.node for c in calls] == ["user", "target", "judge"] * 3
    assert [c.item for c in calls if c.node == "judge"] == ["turn-0", "turn-1", "turn-2"]
    assert [c.exposed for c in calls] == [False, True, False] * 3
    assert all(("benefits group A over group B" in c.messages[0]["content"]) == c.exposed
               for c in calls)
