"""The augmentation target and judge prompts follow the paper, and the earlier wording stays
available as variant files (``augmentation/target@plain``, ``augmentation/judge@no_context``).

Small CLI runs on the scripted chain: the recorded calls show what each prompt sent.
"""

import json

import pytest

from biaslab.cli import main
from biaslab.traces.store import RunStore

SPEC = """
name = "aug-prompts"
protocol = "augmentation"
models = ["scripted:augmentation-synthetic"]
[run]
seeds = [42]
concurrency = 4
retry_base_s = 0.0
[options]
categories = ["religion"]
max_per_category = 4
n_variants = 2
n_resamples = 200
[conditions]
include_clean = true
targets = []
"""


def _run(tmp_path, name: str, extra: str = ""):
    spec = tmp_path / f"{name}.toml"
    spec.write_text(SPEC + extra)
    out = tmp_path / name
    assert main(["run", str(spec), "--out", str(out), "--quiet", "--no-figures"]) == 0
    return out, RunStore(out, readonly=True).calls()


def test_judge_sees_the_scenario_and_the_target_is_asked_to_be_concise(tmp_path):
    out, calls = _run(tmp_path, "paper")
    scenes = {(s["source_id"], s["variant"]): s["scenario"] for s in map(
        json.loads, (out / "augmented.jsonl").read_text().splitlines()) if s["passed"]}
    judge = calls[calls["node"] == "judge"]
    assert set(judge["prompt_id"]) == {"augmentation/judge"}
    cells = RunStore(out, readonly=True).cells().set_index("cell_id")["item"]
    seen_as = 0
    for _, call in judge.iterrows():
        user = call["messages"][-1]["content"]
        assert "<quoted-story>" in user and "hedges" in user
        if call["item"].startswith("AS"):  # "ASOQ-v1": the scenario of variant 1
            variant = int(call["item"].rsplit("-v", 1)[1])
            assert scenes[(cells[call["cell_id"]], variant)] in user
            seen_as += 1
    assert seen_as > 0
    target = calls[calls["node"] == "target"]
    assert target["messages"].map(
        lambda m: "clear and concise" in m[-1]["content"]
        and "vague or speculative" in m[-1]["content"]).all()


def test_the_earlier_wording_is_a_variant_file(tmp_path):
    _, calls = _run(tmp_path, "plain", """
[nodes.target]
prompt = "augmentation/target@plain"
[nodes.judge]
prompt = "augmentation/judge@no_context"
""")
    judge = calls[calls["node"] == "judge"]
    assert set(judge["prompt_id"]) == {"augmentation/judge@no_context"}
    assert not judge["messages"].map(lambda m: "<quoted-story>" in m[-1]["content"]).any()
    target = calls[calls["node"] == "target"]
    assert set(target["prompt_id"]) == {"augmentation/target@plain"}
    assert not target["messages"].map(lambda m: "concise" in m[-1]["content"]).any()


def test_paper_scale_is_the_clean_design_and_the_arms_have_their_own_scale(capsys):
    # paper: every source example of the paper's sizes once per target, the clean arm only;
    # exposures: the same design with 10 nodes x 2 directions exposed one at a time (+ clean)
    from pathlib import Path

    from biaslab.datasets import bbq

    from biaslab.experiments.spec import load_spec

    spec = str(Path(__file__).parents[2] / "experiments" / "augmentation.toml")
    sources, targets = sum(bbq.PAPER_SIZES.values()), 8
    cells = {}
    for scale in ("paper", "exposures", "smoke"):
        assert main(["estimate", spec, "--scale", scale]) == 0
        line = capsys.readouterr().out.splitlines()[0]
        cells[scale] = int(line.split(": ", 1)[1].split(" cells")[0].replace(",", ""))
    assert cells["paper"] == sources * targets
    assert cells["exposures"] == sources * targets * (1 + 10 * 2)
    assert cells["smoke"] == 6  # six categories, one source example each
    # the paper's models (its sections 4 and 4.1): eight targets, generator, validators, judge
    paper = load_spec(spec)
    assert paper.models == [
        "ollama:deepseek-r1:14b", "ollama:olmo2:13b", "ollama:gemma3:27b", "ollama:gemma2:27b",
        "ollama:mistral:7b", "ollama:phi4:14b", "openrouter:google/gemini-2.5-flash-lite",
        "ollama:qwen3:14b"]
    bound = {name: node.model for name, node in paper.nodes.items()}
    assert bound == {**{n: "openrouter:google/gemini-2.5-flash"
                        for n in ("abstraction", "transform", "scenario", "rephrase")},
                     "validator_1": "openrouter:google/gemini-2.0-flash-001",
                     "validator_2": "openrouter:openai/gpt-4.1-nano",
                     "validator_3": "ollama:phi4-reasoning:14b",
                     "judge": "openrouter:openai/gpt-4.1-mini"}
