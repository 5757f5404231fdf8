"""No silent failure, at the user's boundary: the README's composed example against an endpoint
that refuses or drops connections, a rescore whose judge cannot be reached, and what
``--model`` does to nodes bound to a model of their own.

Every run goes through ``biaslab`` itself, over real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import shutil
import socket
import tomllib
from pathlib import Path

import pandas as pd
import pytest
import tomli_w

from biaslab.agents.verdicts import answer_in_marker
from biaslab.cli import main
from biaslab.traces.store import RunStore
from support_http import FakeOpenAI, loopback_only

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "experiments" / "examples"


@pytest.fixture(autouse=True)
def _loopback(monkeypatch):
    loopback_only(monkeypatch)


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def refused_url() -> str:
    """A port on 127.0.0.1 that nothing listens on: every connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def review_example(tmp_path: Path, base_url: str) -> Path:
    """The README's composed protocol (experiments/examples), its models on one endpoint."""
    where = tmp_path / "example"
    shutil.copytree(EXAMPLE, where)
    spec = {"name": "review-http", "protocol": "review",
            "plugins": ["review_chain.py", "review_synthetic.py"],
            "prompt_overrides": ["prompts"], "models": ["endpoint"],
            "model_aliases": {"endpoint": {"provider": "openai-compatible",
                                           "model": "m", "base_url": base_url}},
            "run": {"seeds": [42], "concurrency": 4, "max_attempts": 2,
                    "retry_base_s": 0.01},
            "conditions": {"directions": ["pro_older"], "targets": "singletons"}}
    path = where / "http.toml"
    path.write_text(tomli_w.dumps(spec), encoding="utf-8")
    return path


def decision_answer(messages) -> str:
    text = messages[-1]["content"]
    answer = '{"choice": "either"}' if "choice" in text else "Both applicants look equally able."
    return answer_in_marker(text, answer)  # a judge's, between the markers it is asked for


def test_a_composed_protocol_fails_its_cells_when_the_endpoint_refuses(tmp_path, capsys):
    spec = review_example(tmp_path, refused_url())
    out = tmp_path / "run"
    code, _, err = cli(capsys, "run", spec, "--out", out, "--quiet", "--no-report")
    assert code == 1, err
    store = RunStore(out, readonly=True)
    cells = store.cells()
    calls = store.calls()
    store.close()
    assert len(cells) == 16 and set(cells["status"]) == {"error"}
    assert cells["error"].str.contains("draft").all()  # the first node's call failed
    assert "16 failed" in err and f"biaslab run --resume {out}" in err
    assert calls["error"].notna().all() and calls["raw"].isna().all()


def test_failed_cells_of_a_composed_protocol_resume_once_the_endpoint_answers(tmp_path, capsys):
    with FakeOpenAI() as server:
        server.responder = decision_answer
        server.down = True  # every request is reset: a transient failure, retried, then given up
        spec = review_example(tmp_path, server.base_url)
        out = tmp_path / "run"
        code, _, err = cli(capsys, "run", spec, "--out", out, "--quiet", "--no-report")
        assert code == 1 and "16 failed" in err, err
        server.down = False
        code, _, err = cli(capsys, "run", "--resume", out, "--quiet", "--no-figures")
        assert code == 0, err
        store = RunStore(out, readonly=True)
        cells = store.cells()
        decisions = [value["decision"] for *_, value in store.iter_outputs(node="revise")]
        store.close()
    assert set(cells["status"]) == {"done"} and len(cells) == 16
    assert decisions == ["either"] * 16
    # A clean, done run again pays nothing: the answers are in the store.
    code, _, err = cli(capsys, "run", "--resume", out, "--quiet", "--no-report")
    assert code == 0 and "0 model calls" in err, err


def test_a_parse_failure_is_not_a_call_failure(tmp_path, capsys):
    """An endpoint that answers, but never with the decision's JSON: the cells finish, each
    decision None with its parse failure recorded (never a guessed value)."""
    with FakeOpenAI() as server:
        server.responder = lambda messages: "I would rather not say."
        out = tmp_path / "run"
        code, _, err = cli(capsys, "run", review_example(tmp_path, server.base_url),
                           "--out", out, "--quiet", "--no-report")
    assert code == 0, err
    store = RunStore(out, readonly=True)
    decisions = [value["decision"] for *_, value in store.iter_outputs(node="revise")]
    calls = store.calls()
    store.close()
    assert decisions == [None] * 16
    revise = calls[calls["node"] == "revise"]
    assert revise["parse_error"].notna().all() and revise["error"].isna().all()


# -- rescoring with a judge that cannot be reached -------------------------------------------
def small_amplification(tmp_path: Path) -> Path:
    spec = {"name": "t", "protocol": "amplification",
            "models": ["scripted:amplification-synthetic"],
            "run": {"seeds": [42], "concurrency": 4, "retry_base_s": 0.0},
            "conditions": {"directions": ["pro_female"], "targets": "all"},
            "options": {"datasets": ["math"], "pipelines": ["E1"], "max_test": 10,
                        "n_resamples": 200}}
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(spec), encoding="utf-8")
    return path


def test_a_rescore_with_an_unreachable_judge_fails_keeps_what_was_judged_and_resumes(
        tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    code, _, err = cli(capsys, "run", small_amplification(tmp_path), "--out", out, "--quiet",
                       "--no-report")
    assert code == 0, err
    judge = ["replay", out, "--mode", "rescore", "--judge-node", "explanation",
             "--judges", "ollama:llama3.1"]
    with FakeOpenAI() as server:
        server.responder = lambda m: answer_in_marker(  # a judge that follows its prompt
            m[-1]["content"], '{"label": "neutral", "justification": "plain"}')
        monkeypatch.setenv("OLLAMA_BASE_URL", server.base_url)
        server.down = True
        code, stdout, err = cli(capsys, *judge)
        assert code == 1, err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ")
        assert f"ollama:llama3.1 at {server.base_url}" in lines[0]
        assert "run the same command again" in lines[0]
        assert "Series" not in stdout
        eval_store = out / "evals" / "judge"
        store = RunStore(eval_store, readonly=True)
        statuses = store.cells()["status"].tolist()
        store.close()
        assert "error" in statuses and "done" not in statuses
        assert not (eval_store / "scores.csv").exists()  # no row of guessed or empty verdicts
        server.down = False
        code, stdout, err = cli(capsys, *judge)
        assert code == 0, err
    scores = pd.read_csv(eval_store / "scores.csv")
    source = RunStore(out, readonly=True)
    explained = [c for c in source.iter_calls() if c.node == "explanation" and c.raw]
    source.close()
    assert len(scores) == len(explained) and (scores["label"] == "neutral").all()


# -- --model and nodes with a model of their own -----------------------------------------------
def roleplay_spec(tmp_path: Path) -> Path:
    spec = {"name": "rp", "protocol": "roleplay", "models": ["local"],
            "run": {"seeds": [42], "concurrency": 4},
            "nodes": {"why_judge_1": {"model": "local"}, "why_judge_2": {"model": "local"},
                      "why_judge_3": {"model": "local"},
                      "bias_type_classifier": {"model": "local"}},
            "options": {"attributes": ["age"], "per_stratum": 1,
                        "classify_bias_types": True}}
    path = tmp_path / "rp.toml"
    path.write_text(tomli_w.dumps(spec), encoding="utf-8")
    return path


def test_model_replaces_the_axis_and_names_the_nodes_that_keep_their_own(tmp_path, capsys):
    code, stdout, err = cli(capsys, "estimate", roleplay_spec(tmp_path), "--model",
                            "scripted:roleplay-synthetic")
    assert code == 0, err
    out = tmp_path / "run"
    # Without --all-nodes the judges stay on `local`: said before anything runs.
    code, _, err = cli(capsys, "run", roleplay_spec(tmp_path), "--model",
                       "scripted:roleplay-synthetic", "--out", out, "--quiet", "--no-report",
                       "--all-nodes")
    assert code == 0, err
    assert "keep their own model" not in err
    store = RunStore(out, readonly=True)
    providers = {c.model["provider"] for c in store.iter_calls()}
    store.close()
    assert providers == {"scripted"}
    recorded = tomllib.loads((out / "spec.toml").read_text(encoding="utf-8"))
    assert all(not table.get("model") for table in recorded.get("nodes", {}).values())
    assert set(recorded["resolved_models"]) == {"scripted:roleplay-synthetic"}


def test_model_without_all_nodes_says_which_nodes_keep_their_model(tmp_path, capsys,
                                                                   monkeypatch):
    import biaslab.experiments.runner as runner

    async def refuse(*args, **kwargs):  # only the announcement is under test here
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_plan", refuse)
    code, _, err = cli(capsys, "run", roleplay_spec(tmp_path), "--model",
                       "scripted:roleplay-synthetic", "--out", tmp_path / "run", "--quiet",
                       "--no-figures")
    assert code == 130
    line = next(line for line in err.splitlines() if "keep their own model" in line)
    for node in ("why_judge_1", "why_judge_2", "why_judge_3", "bias_type_classifier"):
        assert f"{node} → local" in line
    assert "--all-nodes" in line


def test_all_nodes_needs_model(tmp_path, capsys):
    code, _, err = cli(capsys, "run", roleplay_spec(tmp_path), "--all-nodes", "--out",
                       tmp_path / "run", "--no-figures")
    assert code == 2 and "--all-nodes goes with --model" in err
    assert not (tmp_path / "run").exists()
