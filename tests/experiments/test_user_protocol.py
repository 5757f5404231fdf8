"""A protocol of the user's own, run the way a user runs it: through the `biaslab` CLI.

The "Compose your own protocol" page's code block (docs/compose.md) is copied into a fresh directory with the
example's prompts, spec and scripted model, and every verb is run on it.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from biaslab.cli import main
from biaslab.experiments.plan import make_plan
from biaslab.experiments.spec import load_spec, spec_from_dict
from biaslab.graphs import LLMNode, Protocol, graph_llm_nodes, llm_agent, llm_node
from biaslab.graphs.registry import get_protocol

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "experiments" / "examples"
SYNTHETIC = "scripted:review-synthetic"


def readme_block() -> str:
    text = (ROOT / "docs" / "compose.md").read_text(encoding="utf-8")
    section = text.split("# Compose your own protocol", 1)[1]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


@pytest.fixture
def example(tmp_path):
    """The example laid out in a new directory, its protocol taken from docs/compose.md."""
    where = tmp_path / "mine"
    shutil.copytree(EXAMPLE / "prompts", where / "prompts")
    shutil.copy(EXAMPLE / "review_synthetic.py", where)
    shutil.copy(EXAMPLE / "review.toml", where)
    (where / "review_chain.py").write_text(readme_block(), encoding="utf-8")
    return where


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_readme_block_is_the_shipped_example():
    assert readme_block() == (EXAMPLE / "review_chain.py").read_text(encoding="utf-8")


def test_every_verb_on_the_readme_protocol(example, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may depend on the working directory
    spec = example / "review.toml"
    run = tmp_path / "runs" / "review"

    code, out, _ = run_cli(capsys, "protocols", "--spec", spec)
    assert code == 0 and "review" in out and "draft, critique, revise" in out

    code, out, _ = run_cli(capsys, "estimate", spec, "--model", SYNTHETIC)
    assert code == 0 and "about" in out and "estimates" in out

    code, out, _ = run_cli(capsys, "graph", spec)
    assert code == 0 and "draft --> critique" in out

    code, _, err = run_cli(capsys, "run", spec, "--model", SYNTHETIC, "--out", run, "--quiet",
                           "--no-figures")
    assert code == 0, err
    cells = pd.read_sql_query("SELECT status, coords FROM cells", sqlite3.connect(run / "run.sqlite"))
    # clean + 3 singletons x 2 directions, 4 cases, 3 seeds
    assert len(cells) == 7 * 4 * 3 and set(cells["status"]) == {"done"}

    effects = pd.read_csv(run / "tables" / "exposed_vs_clean.csv")
    decision = effects[(effects["node"] == "revise")]
    older = decision[decision["field"] == "decision=older"].set_index("condition")["diff"]
    # The synthetic reviewer's injected effect: any exposed agent moves the decision fully.
    for node in ("draft", "critique", "revise"):
        assert older[f"{node}:pro_older"] == 1.0
        assert older[f"{node}:pro_younger"] == 0.0

    code, out, err = run_cli(capsys, "report", run, "--no-figures")
    assert code == 0, err
    assert "exposed_vs_clean.csv" in out

    code, out, err = run_cli(capsys, "replay", run, "--mode", "strict", "--out",
                             tmp_path / "strict", "--quiet")
    assert code == 0, err
    assert "identical" in out and ", 0 model calls" in out

    # A counterfactual: the critique's prompt changes. Only the critique is paid: the scripted
    # critic says the same thing under the new wording, so the revise calls see unchanged
    # input and come from the trace, like every draft call.
    terse = tmp_path / "critique_terse.toml"
    terse.write_text('slots = ["draft"]\nuser = "Review this draft in one sentence: $draft"\n')
    code, out, err = run_cli(capsys, "replay", run, "--mode", "counterfactual", "--node",
                             "critique", "--prompt", terse, "--out", tmp_path / "cf", "--quiet",
                             "--no-figures")
    assert code == 0, err
    paid = pd.read_sql_query("SELECT node, cache_hit FROM calls",
                             sqlite3.connect(tmp_path / "cf" / "run.sqlite"))
    assert set(paid.loc[paid["cache_hit"] == 0, "node"]) == {"critique"}
    assert (paid.loc[paid["node"] != "critique", "cache_hit"] == 1).all()
    assert (paid["node"] == "critique").sum() == 7 * 4 * 3

    code, out, err = run_cli(capsys, "export", run, "--format", "jsonl")
    assert code == 0, err
    assert (run / "export" / "calls.jsonl").is_file()


def test_report_names_a_missing_or_changed_protocol_file(example, tmp_path, capsys):
    run = tmp_path / "run"
    assert run_cli(capsys, "run", example / "review.toml", "--model", SYNTHETIC, "--out", run,
                   "--quiet", "--no-figures")[0] == 0
    plugin = example / "review_chain.py"
    plugin.write_text(plugin.read_text() + "\n# edited after the run\n")
    code, _, err = run_cli(capsys, "report", run, "--no-figures")
    assert code == 0 and "changed since the run was made" in err
    plugin.unlink()
    code, _, err = run_cli(capsys, "report", run, "--no-figures")
    assert code == 2
    assert "review_chain.py" in err and "not found" in err and len(err.strip().splitlines()) == 1


def test_a_template_that_drops_a_required_slot_fails_at_load_time(example, tmp_path, capsys):
    (example / "prompts" / "review" / "critique.loose.toml").write_text(
        'slots = ["case"]\nuser = "Is this hiring case fair? $case"\n')
    spec = example / "review.toml"
    spec.write_text(spec.read_text() + '\n[nodes.critique]\nprompt = "review/critique@loose"\n')
    code, _, err = run_cli(capsys, "run", spec, "--model", SYNTHETIC, "--out", tmp_path / "r",
                           "--no-figures")
    assert code == 2
    assert "'critique'" in err and "'draft'" in err and "variant 'default'" in err
    assert not (tmp_path / "r" / "run.sqlite").exists()


def test_amplification_requires_the_explanation_in_e1_predictions(tmp_path, capsys):
    """The defect the required slots close: E1 silently turning into E0."""
    spec = {"name": "t", "protocol": "amplification", "models": [SYNTHETIC],
            "options": {"pipelines": ["E1"]},
            "nodes": {"prediction": {"prompt": "amplification/predict"}}}
    with pytest.raises(Exception) as err:
        make_plan(spec_from_dict(spec))
    assert "explanation" in str(err.value) and "prediction" in str(err.value)
    assert "E1" in str(err.value)


def test_a_protocol_from_a_module_reference_and_an_entry_point(tmp_path, monkeypatch):
    pkg = tmp_path / "site"
    pkg.mkdir()
    (pkg / "my_reviews.py").write_text(textwrap.dedent('''
        from typing import TypedDict
        from langgraph.graph import END, START, StateGraph
        from biaslab.agents.context import CellContext
        from biaslab.graphs import Protocol, llm_node

        class S(TypedDict, total=False):
            item: str
            answer: str

        class Echo(Protocol):
            name = "echo-from-module"
            def build(self, variant, options=None):
                b = StateGraph(S, context_schema=CellContext)
                b.add_node("answer", llm_node("answer", prompt="review/draft",
                                              slots=lambda s: {"case": s["item"]},
                                              offers=("case",)))
                b.add_edge(START, "answer")
                b.add_edge("answer", END)
                return b
            def items(self, options):
                return ["a", "b"]

        class EchoTwo(Echo):
            name = "echo-from-entry-point"
    '''))
    dist = pkg / "my_reviews-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-reviews\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[biaslab.protocols]\necho-from-entry-point = my_reviews:EchoTwo\n")
    monkeypatch.syspath_prepend(str(pkg))
    by_reference = get_protocol("my_reviews:Echo")
    assert by_reference.name == "echo-from-module"
    assert [n.name for n in by_reference.llm_nodes("default")] == ["answer"]
    assert get_protocol("echo-from-entry-point").name == "echo-from-entry-point"
    spec = spec_from_dict({"name": "t", "protocol": "my_reviews:Echo", "models": [SYNTHETIC],
                           "prompt_overrides": [str(EXAMPLE / "prompts")],
                           "plugins": [str(EXAMPLE / "review_synthetic.py")]})
    assert make_plan(spec).n_cells() == 2


def test_llm_nodes_are_read_from_the_graph_and_its_subgraphs():
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class S(TypedDict, total=False):
        x: str

    @llm_agent("judge_a", prompt="p/j", offers=("x",), requires=("x",))
    async def judge(state, runtime):
        return {}

    inner = StateGraph(S)
    inner.add_node("judge_a", judge)
    inner.add_edge(START, "judge_a")
    inner.add_edge("judge_a", END)
    outer = StateGraph(S)
    outer.add_node("first", llm_node("first", prompt="p/f", slots=("x",)))
    outer.add_node("panel", inner.compile())
    outer.add_edge(START, "first")
    outer.add_edge("first", "panel")
    outer.add_edge("panel", END)
    nodes = graph_llm_nodes(outer)
    assert [n.name for n in nodes] == ["first", "judge_a"]
    assert nodes[1] == LLMNode("judge_a", "p/j", ("x",), ("x",))
    with pytest.raises(ValueError):
        LLMNode("bad", "p/x", ("a",), required=("b",))


def test_estimates_are_within_2x_of_the_calls_made(tmp_path, capsys):
    """The estimate is an estimate (within 2x), not a tenfold upper bound."""
    from support_runs import amplification_spec, run_spec

    import json

    spec_dict = amplification_spec(options={"datasets": ["math"], "max_test": 40,
                                            "n_resamples": 200},
                                   conditions={"targets": "each_and_all"})
    spec_path = tmp_path / "amp.toml"
    import tomli_w
    spec_path.write_text(tomli_w.dumps(spec_dict))
    code, out, _ = run_cli(capsys, "estimate", spec_path, "--scale", "paper", "--json")
    estimate = json.loads(out)["calls_estimate"]
    run_spec(spec_dict, tmp_path / "run")
    from biaslab.traces.store import RunStore

    store = RunStore(tmp_path / "run", readonly=True)
    made = int((store.calls()["attempt"] == 0).sum())
    store.close()
    assert made / 2 <= estimate <= made * 2, (estimate, made)
