"""The Python API (`biaslab.open_run`, `biaslab.run`): the same run as the CLI makes and
exports, also from inside a running event loop, as a notebook has.

(Named test_python_api.py: tests/viewer/test_api.py already holds the basename test_api.)
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import itertools
import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from support_runs import assert_same_run

import biaslab
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
from biaslab.api._off_loop import call_off_loop
from biaslab.cli import build_parser, main
from biaslab.errors import UserError

HIRING = Path(__file__).resolve().parents[1] / "experiments" / "examples"
ROOT = Path(__file__).resolve().parents[1]
REVIEW = str(ROOT / "experiments" / "examples" / "review.toml")
SCRIPTED = "scripted:review-synthetic"
CASES = ["developer", "driver", "nurse", "teacher"]
"""The review example's four hiring cases; at --scale smoke: one seed, one direction
(pro_older), targets = each of draft, critique, revise alone, plus the clean arm: 16 cells."""


def cli_run(out: Path, *extra: str) -> Path:
    code = main(["run", REVIEW, "--scale", "smoke", "--model", SCRIPTED, "--out", str(out),
                 "--quiet", "--no-cache", *extra])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def cli_review(tmp_path_factory) -> Path:
    """One scripted review run made by the CLI, shared by the read-only tests below."""
    return cli_run(tmp_path_factory.mktemp("cli") / "review")


def test_open_run_equals_the_export_and_the_tables(cli_review, tmp_path):
    assert main(["export", str(cli_review), "--format", "parquet", "--out",
                 str(tmp_path / "x")]) == 0
    run = biaslab.open_run(cli_review)
    assert run.path == cli_review and run.spec.scale_applied == "smoke"
    assert run.spec.models == [SCRIPTED]

    cells = run.cells()
    pd.testing.assert_frame_equal(cells, pd.read_parquet(tmp_path / "x" / "cells.parquet"),
                                  check_dtype=False)
    assert len(cells) == 16 and set(cells["status"]) == {"done"}

    exported = pd.read_parquet(tmp_path / "x" / "calls.parquet")
    keys = ["cell_id", "node", "cache_key", "raw", "input_tokens", "output_tokens"]
    pd.testing.assert_frame_equal(run.calls()[keys], exported[keys], check_dtype=False)
    # One call per agent per cell: 16 cells × draft, critique, revise.
    assert len(run.calls()) == 48
    revise_calls = run.calls(node="revise")
    assert len(revise_calls) == 16 and set(revise_calls["node"]) == {"revise"}

    # The node's rows of tables/outputs.csv, without the other nodes' columns.
    revise = run.outputs("revise")
    written = pd.read_csv(cli_review / "tables" / "outputs.csv")
    written = written[written["node"] == "revise"].dropna(axis=1, how="all")
    pd.testing.assert_frame_equal(revise.reset_index(drop=True),
                                  written.reset_index(drop=True), check_dtype=False)
    # Clean, the scripted reviewer recommends either applicant; exposed at any agent, its
    # lean (pro_older) travels down the chain to the decision.
    clean = revise[revise["condition"] == "none"]
    exposed = revise[revise["condition"] != "none"]
    assert sorted(clean["item"]) == CASES and set(clean["out.decision"]) == {"either"}
    assert len(exposed) == 12 and set(exposed["out.decision"]) == {"older"}

    files = {p.relative_to(cli_review / "tables").with_suffix("").as_posix()
             for p in (cli_review / "tables").rglob("*.csv")}
    assert set(run.tables) == files and "exposed_vs_clean" in files
    effect = run.tables["exposed_vs_clean"]
    pd.testing.assert_frame_equal(effect, pd.read_csv(cli_review / "tables" /
                                                      "exposed_vs_clean.csv"))
    # Hand-worked: P(decision = older) is 0 clean and 1 exposed in all 4 cases, so every
    # exposed arm differs from clean by +1 over 4 pairs.
    older = effect[(effect["field"] == "decision=older") & (effect["group"] == "all")]
    assert sorted(older["condition"]) == ["critique:pro_older", "draft:pro_older",
                                          "revise:pro_older"]
    assert list(older["n_pairs"]) == [4, 4, 4]
    assert list(older["clean_mean"]) == [0, 0, 0] and list(older["diff"]) == [1, 1, 1]


def test_report_writes_what_biaslab_report_writes(cli_review, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(cli_review, copy)
    for table in (copy / "tables").rglob("*.csv"):
        table.unlink()
    run = biaslab.open_run(copy)
    assert len(run.tables) == 0
    written = run.report()
    assert copy / "tables" / "exposed_vs_clean.csv" in written
    assert copy / "report.html" in written
    names = set(biaslab.open_run(cli_review).tables)
    assert set(run.tables) == names and {"exposed_vs_clean", "outputs"} <= names
    for name in names:
        assert (copy / "tables" / f"{name}.csv").read_bytes() == \
            (cli_review / "tables" / f"{name}.csv").read_bytes()


def test_run_inside_a_running_event_loop_is_the_cli_run(cli_review, tmp_path):
    out = tmp_path / "from-python"

    async def notebook_cell():
        # A notebook cell: a loop is running here, so asyncio.run would refuse.
        assert asyncio.get_running_loop().is_running()
        return biaslab.run(REVIEW, scale="smoke", model=SCRIPTED, out=out, quiet=True,
                           no_cache=True)

    run = asyncio.run(notebook_cell())
    assert isinstance(run, biaslab.Run) and run.path == out
    assert run.result.cells_run == 16 and run.result.cells_failed == 0
    assert_same_run(out, cli_review)


def test_run_in_worker_processes_is_the_cli_run(cli_review, tmp_path):
    out = tmp_path / "workers"
    run = _in_a_notebook_loop(lambda: biaslab.run(
        REVIEW, scale="smoke", model=SCRIPTED, out=out, quiet=True, no_cache=True, workers=2))
    assert run.result.cells_run == 16 and not (out / "shards").exists()
    assert_same_run(out, cli_review)


def test_run_from_a_dict_then_resume_from_its_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT / "experiments" / "examples")  # the dict's relative plugin paths
    from biaslab.experiments.spec import read_toml

    spec = read_toml(REVIEW)
    out = tmp_path / "dict"
    first = biaslab.run(spec, scale="smoke", model=SCRIPTED, out=out, quiet=True,
                        no_report=True, no_cache=True, concurrency=2)
    assert first.result.cells_run == 16 and len(first.tables) == 0
    again = biaslab.run(out, resume=True, quiet=True)
    assert again.result.cells_skipped == 16 and again.result.cells_run == 0
    assert "exposed_vs_clean" in again.tables


def test_errors_from_python_name_python_keywords_not_cli_flags(tmp_path):
    """A second biaslab.run into a directory that holds a run: the runner's CLI wording
    (``pass --resume``, ``another --out``) reaches Python as ``resume=True`` and ``out=``."""
    spec = {"name": "again", "protocol": "hiring", "plugins": [str(HIRING / "hiring.py")],
            "prompt_overrides": [str(HIRING / "prompts")], "models": ["scripted:hiring-panel"],
            "conditions": {"targets": []}, "options": {"candidates": 2}}
    out = tmp_path / "run"
    biaslab.run(spec, out=out, quiet=True, no_report=True, no_cache=True)
    with pytest.raises(UserError) as caught:
        biaslab.run(spec, out=out, quiet=True, no_report=True, no_cache=True)
    message = str(caught.value)
    assert "pass resume=True to continue it" in message and "another out= directory" in message
    assert "--" not in message


def test_run_from_an_experiment_spec_applies_the_scale(cli_review, tmp_path):
    from biaslab.experiments.spec import load_spec

    run = biaslab.run(load_spec(REVIEW), scale="smoke", model=SCRIPTED, out=tmp_path / "s",
                      quiet=True, no_cache=True, no_report=True)
    assert run.spec.scale_applied == "smoke"
    assert list(run.cells()["cell_id"]) == list(biaslab.open_run(cli_review).cells()["cell_id"])
    with pytest.raises(UserError, match="already has scale 'smoke' applied"):
        biaslab.run(load_spec(REVIEW, scale="smoke"), scale="paper", out=tmp_path / "t")


def test_headline_is_the_table_biaslab_report_prints(tmp_path):
    from support_runs import amplification_spec

    run = biaslab.run(amplification_spec(), out=tmp_path / "amp", quiet=True)
    headline = run.headline()
    assert headline.attrs["title"].startswith("Table 1: FBS")
    # Amplification's headline is its Table 1, which the report also writes as table1.csv.
    pd.testing.assert_frame_equal(headline.astype(str), run.tables["table1"].astype(str))


def test_run_keywords_mirror_the_cli_options():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    options = {a.dest for a in sub.choices["run"]._actions if a.dest not in ("help", "spec")}
    keywords = set(inspect.signature(biaslab.run).parameters) - {"spec"}
    assert keywords == options


@pytest.mark.parametrize("call, message", [
    (lambda tmp: biaslab.open_run(tmp), "is not a run directory (no run.sqlite)"),
    (lambda tmp: biaslab.open_run(tmp / "missing"), "is not a run directory"),
    (lambda tmp: biaslab.run(tmp / "nothing.toml"), "spec not found"),
    (lambda tmp: biaslab.run(tmp / "gone", resume=True), "no run directory"),
    (lambda tmp: biaslab.run(REVIEW, concurrency=0), "concurrency must be at least 1, got 0"),
    (lambda tmp: biaslab.run(REVIEW, scale="huge"), "no [scale.huge] table"),
    (lambda tmp: biaslab.run(42), "got int"),
])
def test_bad_input_is_one_user_error(tmp_path, call, message):
    with pytest.raises(UserError) as caught:
        call(tmp_path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_directory_needs_resume_and_keeps_its_settings(cli_review):
    with pytest.raises(UserError, match="resume=True"):
        biaslab.run(cli_review)
    with pytest.raises(UserError, match="scale= cannot change a recorded run"):
        biaslab.run(cli_review, resume=True, scale="smoke")


def test_unknown_node_names_the_nodes_there(cli_review):
    run = biaslab.open_run(cli_review)
    with pytest.raises(UserError, match="nodes with outputs: draft, critique, revise"):
        run.outputs("judge")
    with pytest.raises(UserError, match="nodes with calls: critique, draft, revise"):
        run.calls(node="judge")
    with pytest.raises(KeyError, match="no table 'table1'"):
        run.tables["table1"]


def _interrupt_soon(after_s: float) -> None:
    threading.Timer(after_s, os.kill, (os.getpid(), signal.SIGINT)).start()


def _in_a_notebook_loop(fn):
    """Call `fn` inside a running loop as ipykernel runs a cell: the loop is driven with
    run_until_complete, which (unlike asyncio.run) leaves Ctrl-C to Python's own handler."""
    async def cell():
        return fn()

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(cell())
    finally:
        loop.close()


def test_ctrl_c_in_the_waiting_thread_stops_the_worker_first():
    seen = []

    def work():
        try:
            while True:
                time.sleep(0.01)
        except KeyboardInterrupt:
            seen.append(threading.current_thread().name)
            return "stopped"

    _interrupt_soon(0.3)
    assert _in_a_notebook_loop(lambda: call_off_loop(work)) == "stopped"
    assert seen == ["biaslab-off-loop"]


def test_an_interrupted_notebook_run_keeps_its_cells_and_resumes(tmp_path):
    calls = itertools.count()

    def answer(request) -> str:
        # Ctrl-C halfway: of the 48 calls 24 ask something new (the others repeat a prompt
        # of another cell, and the run's cache answers them).
        if next(calls) == 12:
            _interrupt_soon(0.05)
        return '{"choice": "either"}'

    register_scripted("api-slow-review", lambda: ScriptedChatModel(
        name_="api-slow-review", rules=[Rule(".", answer)], latency_s=0.05))
    out = tmp_path / "slow"
    with pytest.raises(KeyboardInterrupt, match="resume=True"):
        _in_a_notebook_loop(lambda: biaslab.run(
            REVIEW, scale="smoke", model="scripted:api-slow-review", out=out, quiet=True,
            no_cache=True, concurrency=1))
    kept = biaslab.open_run(out).cells()
    done = int((kept["status"] == "done").sum())
    assert 0 < done < 16 and set(kept["status"]) <= {"done", "running"}
    again = _in_a_notebook_loop(lambda: biaslab.run(out, resume=True, quiet=True))
    assert again.result.cells_skipped == done and again.result.cells_run == 16 - done
    assert set(again.cells()["status"]) == {"done"}


def test_the_notebook_runs_and_its_asserts_hold():
    """docs/notebook.ipynb, executed in a real Jupyter kernel (which runs every cell inside
    its own event loop), from its own folder as Jupyter would."""
    import nbclient
    import nbformat

    docs = ROOT / "docs"
    notebook = nbformat.read(docs / "notebook.ipynb", as_version=4)
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(docs)}}).execute()
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(o.get("output_type") != "error" for c in code for o in c.outputs)
    assert "Run(" in code[0].outputs[-1]["data"]["text/plain"]


SCRIPT = """
import itertools, os, signal, sys, threading
import biaslab
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted

calls = itertools.count()

def answer(request):
    if next(calls) == 12:  # Ctrl-C halfway, as a user at the terminal would
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
    return '{"choice": "either"}'

register_scripted("api-slow-review", lambda: ScriptedChatModel(
    name_="api-slow-review", rules=[Rule(".", answer)], latency_s=0.05))
try:
    biaslab.run(sys.argv[1], scale="smoke", model="scripted:api-slow-review", out=sys.argv[2],
                quiet=True, no_cache=True, concurrency=1)
except KeyboardInterrupt as exc:
    print(f"stopped: {exc}")
"""


def test_ctrl_c_in_a_script_stops_the_run_and_says_how_to_resume(tmp_path):
    """No loop is running in a script: the run goes on in the caller's thread."""
    import subprocess
    import sys

    out = tmp_path / "script"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, REVIEW, str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "stopped: interrupted: " in proc.stdout
    assert f"continue with biaslab.run('{out}', resume=True)" in proc.stdout
    done = int((biaslab.open_run(out).cells()["status"] == "done").sum())
    assert 0 < done < 16
