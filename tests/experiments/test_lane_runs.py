"""Cells packed into shared graph runs (``--lanes``) give the same run as one cell per run.

Every built-in protocol and the README's example go through the CLI twice, with ``--lanes 1``
and with several lanes at a higher concurrency, and must agree cell for cell, output for
output, call for call and table for table. Failing cells and graphs that cannot be packed are
checked the same way.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TypedDict

import pytest
import tomli_w
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Send

from biaslab.agents.ask import ask
from biaslab.agents.context import CellContext
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
from biaslab.cli import main
from biaslab.errors import ModelCallError
from biaslab.graphs import Protocol, llm_agent, text_answer
from biaslab.graphs.registry import protocol
from biaslab.traces.store import RunStore
from support_runs import amplification_spec, assert_same_run

ROOT = Path(__file__).resolve().parents[2]

SPECS = {
    "amplification": amplification_spec(
        options={"datasets": ["math"], "pipelines": ["E0", "E1", "E2"], "max_test": 20,
                 "n_resamples": 200}),
    "roleplay": {"name": "rp", "protocol": "roleplay", "models": ["scripted:roleplay-synthetic"],
                 "conditions": {"template": "roleplay/exposure", "directions": ["stereotype"],
                                "targets": ["target", "why_judge_1"]},
                 "options": {"attributes": ["age", "gender"], "per_stratum": 2,
                             "chunk_size": 4}},
    "multiturn": {"name": "mt", "protocol": "multiturn",
                  "models": ["scripted:multiturn-followup"],
                  "conditions": {"targets": ["target"], "directions": ["stereotype"],
                                 "template": "multiturn/exposure"},
                  "options": {"seeds_per_category": 2, "categories": ["age", "gender"],
                              "turn_caps": [5], "framings": ["assessment"], "baselines": [],
                              "n_resamples": 300}},
    "augmentation": {"name": "aug", "protocol": "augmentation",
                     "models": ["scripted:augmentation-synthetic"],
                     "conditions": {"template": "augmentation/exposure",
                                    "directions": ["stereotype"], "targets": ["target"]},
                     "options": {"categories": ["religion", "ses"], "max_per_category": 3,
                                 "n_variants": 2, "n_resamples": 300}},
}


@pytest.fixture(autouse=True)
def _own_calls(monkeypatch):
    monkeypatch.setenv("BIASLAB_CACHE", "off")  # each run pays for its own calls


def _run(spec: Path, out: Path, *args: str) -> Path:
    assert main(["run", str(spec), "--out", str(out), "--quiet", *args, "--no-figures"]) == 0
    return out


@pytest.mark.parametrize("name", [*SPECS, "review example", "app audit example"])
def test_lanes_change_nothing_but_speed(name, tmp_path):
    extra: tuple[str, ...] = ()
    if name in SPECS:
        spec = tmp_path / f"{name}.toml"
        spec.write_text(tomli_w.dumps(SPECS[name]))
    elif name == "review example":
        spec = ROOT / "experiments" / "examples" / "review.toml"
        extra = ("--model", "scripted:review-synthetic")
    else:  # an app runs a graph of its own inside its node: each lane keeps a task of its own
        spec = ROOT / "experiments" / "examples" / "app_audit" / "hiring_audit.toml"
    alone = _run(spec, tmp_path / "alone", "--lanes", "1", "--concurrency", "4", *extra)
    packed = _run(spec, tmp_path / "packed", "--lanes", "8", "--concurrency", "16", *extra)
    assert_same_run(packed, alone)


# -- a protocol of one node whose cell for item-3 fails while a sibling call is in flight ------
class EchoState(TypedDict, total=False):
    item: str
    answer: str


@llm_agent("answer", prompt="lanes/echo", offers=("item",))
async def answer(state: EchoState, runtime: Runtime[CellContext]) -> dict:
    ctx = runtime.context

    async def one(sample: int):
        got = await ask(ctx, "answer", {"item": state["item"]}, prompt="lanes/echo",
                        parser=text_answer, sample=sample)
        if got.error:
            raise RuntimeError(f"no answer for {state['item']}: {got.error}")
        return got.value

    first, second = await asyncio.gather(one(0), one(1))
    return {"answer": f"{first}/{second}"}


def route(state: EchoState):
    return [Send("answer", state)] if state["item"] == "item-5" else "answer"


class _Echo(Protocol):
    directions = {"pro_a": {"favored": "group A", "other": "group B"}}

    def variants(self, options):
        return ["default"]

    def items(self, options):
        return [f"item-{i}" for i in range(10)]

    def initial_state(self, variant, item, seed, options):
        return {"item": item}

    def estimate(self, variant, item, options):
        return {"calls": 2, "tokens": 40}


@protocol
class Echo(_Echo):
    name = "lanes-echo"

    def build(self, variant, options=None):
        builder = StateGraph(EchoState, context_schema=CellContext)
        builder.add_node("answer", answer)
        builder.add_edge(START, "answer")
        builder.add_edge("answer", END)
        return builder


@protocol
class EchoSend(_Echo):
    """The same, entered through a router that answers one item with a Send."""

    name = "lanes-echo-send"

    def build(self, variant, options=None):
        builder = StateGraph(EchoState, context_schema=CellContext)
        builder.add_node("start", lambda state: {})
        builder.add_node("answer", answer)
        builder.add_edge(START, "start")
        builder.add_conditional_edges("start", route, ["answer"])
        builder.add_edge("answer", END)
        return builder


def _reject_second_sample(request):
    if request.kwargs["seed"] != 42:  # sample 1 of item-3: a hard 400
        raise ModelCallError("rejected", status=400)
    return "fine"


register_scripted("lanes-echo", lambda: ScriptedChatModel(
    name_="lanes-echo", latency_s=0.01, rules=[Rule(r"item-3", _reject_second_sample)],
    default="ok"))


def _echo_spec(tmp_path: Path, protocol_name: str) -> Path:
    prompts = tmp_path / "prompts" / "lanes"
    prompts.mkdir(parents=True)
    (prompts / "echo.toml").write_text('slots = ["item"]\nsystem = "Answer in one word."\n'
                                       'user = "Is $item fine?"\n')
    spec = tmp_path / "echo.toml"
    spec.write_text(tomli_w.dumps({
        "name": "echo", "protocol": protocol_name, "models": ["scripted:lanes-echo"],
        "prompt_overrides": [str(tmp_path / "prompts")], "run": {"retry_base_s": 0.0},
        "conditions": {"directions": ["pro_a"]}}))
    return spec


def _run_failing(spec: Path, out: Path, *args: str) -> None:
    assert main(["run", str(spec), "--out", str(out), "--quiet", "--no-report", *args]) == 1


@pytest.mark.parametrize("protocol_name", ["lanes-echo", "lanes-echo-send"])
def test_a_failing_cell_fails_alone_and_unpackable_steps_fall_back(protocol_name, tmp_path,
                                                                    capsys):
    spec = _echo_spec(tmp_path, protocol_name)
    _run_failing(spec, tmp_path / "alone", "--lanes", "1")
    _run_failing(spec, tmp_path / "packed", "--lanes", "8", "--concurrency", "16")
    assert_same_run(tmp_path / "packed", tmp_path / "alone", all_done=False, reported=False)
    store = RunStore(tmp_path / "packed", readonly=True)
    cells = store.cells()
    failed = cells[cells["status"] == "error"]
    assert sorted(failed["item"]) == ["item-3", "item-3"]  # clean and exposed arm
    assert failed["error"].str.startswith("RuntimeError: no answer for item-3").all()
    calls = store.calls()
    # the sibling of the failing call (sample 0) was recorded with its cell
    assert set(calls[calls["cell_id"].isin(failed["cell_id"])]["sample"]) == {0, 1}
    store.close()


def test_a_few_cells_of_several_steps_run_one_per_graph_run():
    """Lanes wait for each other at every step, which costs nothing only while other batches
    fill the slots: a plan too small to fill every graph run in flight packs no more than it
    can fill (the augmentation smoke job's 6 cells ran in two lockstep batches of 4 and 2).
    Cells of one or two calls keep packing, and a user's `lanes` is kept."""
    from biaslab.experiments.runner import Packing, packing

    assert packing(8, 20.0, cells=6) == Packing(1, 32)
    assert packing(8, 20.0, cells=64) == Packing(2, 32)
    assert packing(8, 20.0, cells=10_000) == Packing(4, 32)
    assert packing(8, 20.0) == Packing(4, 32)
    assert packing(8, 20.0, lanes=4, cells=6) == Packing(4, 32)
    assert packing(8, 1.0, cells=6) == Packing(32, 2)


def test_a_small_augmentation_plan_runs_each_cell_on_its_own(tmp_path):
    """Through the CLI at the spec's default lanes: a batch's cells start together, so 12
    cells with 12 start times ran one per graph run; with `--lanes 4` they share 3."""
    spec = tmp_path / "aug.toml"
    spec.write_bytes(tomli_w.dumps({**SPECS["augmentation"], "run": {"concurrency": 4}}).encode())
    starts = {}
    for label, args in (("default", ()), ("packed", ("--lanes", "4"))):
        run = _run(spec, tmp_path / label, *args)
        store = RunStore(run, readonly=True)
        try:
            cells = store.cells()
        finally:
            store.close()
        assert len(cells) == 12 and (cells["status"] == "done").all()
        starts[label] = cells["started"].nunique()
    assert starts == {"default": 12, "packed": 3}
