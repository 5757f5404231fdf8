"""The runner's promises: no call paid twice, exact replay, counterfactuals, resume, faults."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from biaslab.agents.providers.scripted import Fault, register_scripted
from biaslab.errors import ReplayMiss
from biaslab.experiments import replay
from biaslab.graphs.amplification_synthetic import make_agent
from biaslab.traces.store import RunStore
from support_runs import amplification_spec, run_spec

E1 = {"options": {"datasets": ["math"], "pipelines": ["E1"], "max_test": 20, "n_resamples": 500}}


def test_rerunning_an_identical_experiment_makes_zero_model_calls(tmp_path):
    first = run_spec(amplification_spec(), tmp_path / "a")
    assert first.counters.model_calls > 0 and first.cells_failed == 0
    second = run_spec(amplification_spec(), tmp_path / "b")
    assert second.counters.model_calls == 0
    assert second.counters.cache_hits == second.counters.calls > 0
    a, b = RunStore(tmp_path / "a"), RunStore(tmp_path / "b")
    assert a.raw_outputs() == b.raw_outputs()
    assert b.counts()["cache_hits"] == b.counts()["calls"]
    # answered from the shared cache, the run still holds every response it used: it replays
    # from its own directory alone, and so does the replay
    os.environ["BIASLAB_CACHE"] = "off"
    result, diff = replay.strict_replay(tmp_path / "b", tmp_path / "b-replay", progress=False)
    assert diff.identical and result.counters.model_calls == 0
    _, diff = replay.strict_replay(tmp_path / "b-replay", tmp_path / "b-replay2", progress=False)
    assert diff.identical
    # the run's own store is a cache too: a resume of a finished run runs nothing
    again = run_spec(amplification_spec(), tmp_path / "a", resume=True)
    assert again.cells_run == 0 and again.cells_skipped == first.cells_total


def test_strict_replay_reproduces_every_output_byte_for_byte(tmp_path):
    run_spec(amplification_spec(), tmp_path / "src")
    result, diff = replay.strict_replay(tmp_path / "src", tmp_path / "replayed", progress=False)
    assert result.counters.model_calls == 0 and result.cells_failed == 0
    assert diff.identical and diff.compared > 0
    assert diff.compared == len(RunStore(tmp_path / "replayed").raw_outputs())


def test_strict_replay_miss_names_the_call(tmp_path):
    run_spec(amplification_spec(**E1), tmp_path / "src")
    conn = sqlite3.connect(tmp_path / "src" / "run.sqlite")
    key = conn.execute("SELECT cache_key FROM calls WHERE node='explanation' LIMIT 1").fetchone()[0]
    conn.execute("DELETE FROM cache WHERE key=?", (key,))
    conn.commit()
    conn.close()
    with pytest.raises(ReplayMiss, match="strict replay: the source trace has no call for node "
                                         "'explanation'.*prompt amplification/explanation"):
        replay.strict_replay(tmp_path / "src", tmp_path / "replayed", progress=False)


def test_counterfactual_prompt_change_calls_models_only_downstream(tmp_path):
    spec = amplification_spec(options={"pipelines": ["E2"]})
    run_spec(spec, tmp_path / "src")
    override = tmp_path / "terse.toml"
    override.write_text('slots = ["explanation", "records", "n"]\n'
                        'user = "Notes: $explanation\\nStudents:\\n$records\\n'
                        'Failure probability for each of the $n, as OUTPUT: [p1 p2 ...]"')
    os.environ["BIASLAB_CACHE"] = "off"  # only the source trace may answer
    result = replay.counterfactual(tmp_path / "src", tmp_path / "cf", node="prediction",
                                   prompt=str(override), progress=False)
    assert result.cells_failed == 0
    calls = RunStore(tmp_path / "cf").calls()
    live = calls[~calls["cache_hit"]]
    assert set(live["node"]) == {"prediction"}  # the synthetic agent answers the same, so
    assert len(live) == live["cache_key"].nunique()  # the judge's inputs did not change
    assert calls.loc[calls["node"] != "prediction", "cache_hit"].all()
    assert (calls.loc[calls["node"] == "prediction", "prompt_id"] == "file:terse").all()
    assert result.counters.model_calls == len(live)


def test_transient_faults_are_retried_and_malformed_output_is_recorded(tmp_path):
    def flaky():
        agent = make_agent()
        agent.faults = [Fault("429", times=1, retry_after=0.0, match="OUTPUT: \\[p1"),
                        Fault("timeout", times=1, match="OUTPUT: \\[p1"),
                        Fault("500", times=1, match="OUTPUT: \\[p1"),
                        Fault("malformed", times=3, match="OUTPUT: \\[p1", text="no idea")]
        return agent

    register_scripted("flaky-synthetic", flaky)
    spec = amplification_spec(models=["scripted:flaky-synthetic"],  # one call per cell, in order
                              options={"pipelines": ["E0"], "batch_size": 20},
                              run={"concurrency": 1},
                              conditions={"directions": ["pro_female"]})
    result = run_spec(spec, tmp_path / "run")
    assert result.cells_failed == 0 and result.counters.retries == 3
    calls = RunStore(tmp_path / "run").calls()
    first = calls.iloc[0]
    assert first["attempts"] == 4 and first["raw"] == "no idea"
    failed = calls[calls["parse_error"].notna()]
    assert len(failed) == 3 and set(failed["raw"]) == {"no idea"}
    # the clean cell's batch failed twice (ask + one re-ask): a recorded parse failure; the
    # exposed cell's first answer was malformed and its re-ask parsed
    assert list(failed["attempt"]) == [0, 1, 0]
    assert calls.iloc[-1]["attempt"] == 1 and pd.isna(calls.iloc[-1]["parse_error"])
    from biaslab.experiments.reports.amplification import predictions_frame
    from biaslab.graphs.amplification import AmplificationOptions
    frame = predictions_frame(RunStore(tmp_path / "run"), AmplificationOptions(max_test=20))
    lost = frame[frame["decided_by"] == "parse_failure"]
    assert len(lost) == 20 and lost["p_final"].isna().all()  # excluded, never imputed
    assert len(frame) == 40  # no record lost: 20 records x 2 cells


def test_permanent_error_fails_the_cell_and_resume_retries_it(tmp_path):
    once = Fault("400", times=1, match="OUTPUT: \\[p1")  # shared: it fails once in the world

    def broken():
        agent = make_agent()
        agent.faults = [once]
        return agent

    register_scripted("broken-synthetic", broken)
    spec = amplification_spec(models=["scripted:broken-synthetic"], options={"pipelines": ["E0"]},
                              run={"concurrency": 1}, conditions={"directions": ["pro_female"]})
    result = run_spec(spec, tmp_path / "run")
    assert result.counters.retries == 0 and result.counters.errors == 1
    assert result.cells_failed == 1  # a transport failure is not a parse failure: no holes
    store = RunStore(tmp_path / "run")
    cells = store.cells().set_index("cell_id")
    failed = cells[cells["status"] == "error"]
    assert len(failed) == 1 and "HTTP 400" in failed["error"].iloc[0]
    calls = store.calls()
    assert calls["error"].notna().sum() == 1 and "HTTP 400" in calls["error"].dropna().iloc[0]
    # a strict replay replays the finished cell and skips the failed one
    _, diff = replay.strict_replay(tmp_path / "run", tmp_path / "strict", progress=False)
    assert diff.identical and diff.compared > 0
    # the fault was transient in the world: resume retries only the failed cell
    again = run_spec(spec, tmp_path / "run", resume=True)
    assert again.cells_run == 1 and again.cells_skipped == 1 and again.cells_failed == 0
    assert set(RunStore(tmp_path / "run").cells()["status"]) == {"done"}


def test_resume_refuses_a_changed_spec(tmp_path):
    run_spec(amplification_spec(options={"pipelines": ["E0"]}), tmp_path / "run")
    from biaslab.errors import UserError
    changed = amplification_spec(options={"pipelines": ["E0"], "batch_size": 5})
    with pytest.raises(UserError, match="made with a different spec"):
        run_spec(changed, tmp_path / "run", resume=True)
    same = run_spec(amplification_spec(options={"pipelines": ["E0"]}, run={"concurrency": 2}),
                    tmp_path / "run", resume=True)  # concurrency is not part of the experiment
    assert same.cells_run == 0


def test_counterfactual_exposure_grid_change(tmp_path):
    spec = amplification_spec(options={"pipelines": ["E1"]},
                              conditions={"directions": ["pro_female"], "targets": "singletons"})
    run_spec(spec, tmp_path / "src")
    os.environ["BIASLAB_CACHE"] = "off"
    result = replay.counterfactual(tmp_path / "src", tmp_path / "cf", node="",
                                   directions=["pro_female", "pro_male"], progress=False)
    assert result.cells_total == 1 + 2 * 2 and result.cells_failed == 0
    calls = RunStore(tmp_path / "cf").calls()
    paid = calls[~calls["cache_hit"]]
    assert set(paid["exposure_id"]) == {"explanation:pro_male", "prediction:pro_male"}
    assert result.counters.model_calls == paid["cache_key"].nunique()


SPEC_TOML = """
name = "killme"
protocol = "amplification"
models = ["scripted:support_models:slow_synthetic"]
[run]
seeds = [42, 43]
concurrency = 2
[conditions]
directions = ["pro_female", "pro_male"]
[options]
datasets = ["math"]
pipelines = ["E1"]
max_test = 20
n_resamples = 200
"""


def _cli(args, env, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "biaslab", *args, "--quiet", "--no-report"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def _done(run_dir: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True)
        n = conn.execute("SELECT COUNT(*) FROM cells WHERE status='done'").fetchone()[0]
        conn.close()
        return n
    except sqlite3.Error:
        return 0


def _subprocess_env() -> dict:
    """No shared cache (resume must rely on the run's own store), and tests/ importable so the
    slow scripted agent can be named as scripted:support_models:slow_synthetic."""
    return {**os.environ, "BIASLAB_CACHE": "off",
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                           os.environ.get("PYTHONPATH", "")])}


def _wait_until_done(run_dir: Path, proc, cells: int) -> None:
    deadline = time.monotonic() + 120
    while _done(run_dir) < cells and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC_TOML)
    env = _subprocess_env()
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert _cli(["run", str(spec), "--out", str(whole)], env).wait(timeout=300) == 0

    proc = _cli(["run", str(spec), "--out", str(killed)], env)
    _wait_until_done(killed, proc, 3)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = _done(killed)
    assert 3 <= partial < 14

    resumed = _cli(["run", str(spec), "--out", str(killed), "--resume"], env)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()
    assert f"{partial} already done" in err.decode()

    a, b = RunStore(whole, readonly=True), RunStore(killed, readonly=True)
    assert a.raw_outputs() == b.raw_outputs()
    identity = lambda c: (c.cell_id, c.node, c.item, c.sample, c.attempt)  # noqa: E731
    calls_a = Counter(identity(c) for c in a.iter_calls())
    calls_b = Counter(identity(c) for c in b.iter_calls())
    assert calls_a == calls_b and max(calls_b.values()) == 1  # no duplicated records
    assert set(b.cells()["status"]) == {"done"}


def test_ctrl_c_stops_cleanly_and_resume_finishes(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC_TOML)
    env = _subprocess_env()
    run_dir = tmp_path / "run"
    proc = _cli(["run", str(spec), "--out", str(run_dir)], env)
    _wait_until_done(run_dir, proc, 2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert "--resume" in err.decode() and "Traceback" not in err.decode()
    store = RunStore(run_dir, readonly=True)
    cells = store.cells()
    done = set(cells.loc[cells["status"] == "done", "cell_id"])
    assert done and set(c.cell_id for c in store.iter_calls()) == done  # only whole cells
    store.close()
    resumed = _cli(["run", str(spec), "--out", str(run_dir), "--resume"], env)
    assert resumed.wait(timeout=300) == 0
    assert _done(run_dir) == 14


def test_one_writer_per_run_directory(tmp_path):
    from biaslab.errors import UserError
    from biaslab.experiments.runner import _lock_run_dir
    held = _lock_run_dir(tmp_path / "run")
    try:
        with pytest.raises(UserError, match="another biaslab process is writing"):
            run_spec(amplification_spec(options={"pipelines": ["E0"]}), tmp_path / "run")
    finally:
        held.close()
    assert run_spec(amplification_spec(options={"pipelines": ["E0"]}),
                    tmp_path / "run").cells_failed == 0


def _record(cell_id: str, i: int):
    from biaslab.traces.records import CallRecord
    return CallRecord(cell_id=cell_id, node="n", item=str(i), seed=1, exposure_id="none",
                      prompt_id="p", prompt_hash="h", cache_key=f"k{cell_id}{i}",
                      messages=[{"role": "user", "content": "q"}], model={}, params={},
                      raw=f"answer {i}", input_tokens=3, output_tokens=2)


def test_batched_commits_keep_only_whole_cells(tmp_path):
    """Cells finished within `batch_s` share one transaction: a reader (or a crash) sees all
    of a cell's records with its status, or none of them."""
    store = RunStore(tmp_path)
    store.batch_s = 3600.0
    store.maybe_commit(0)  # the batch window starts now
    for c in range(3):
        store.start_cell(f"c{c}", c, {"seed": c})
        store.finish_cell(f"c{c}", [_record(f"c{c}", i) for i in range(4)], [("n", c)])
    reader = sqlite3.connect(f"file:{tmp_path / 'run.sqlite'}?mode=ro", uri=True)
    assert reader.execute("SELECT COUNT(*) FROM calls").fetchone()[0] == 0  # not yet committed
    store.conn.close()  # killed before the batch commit: rolled back whole
    assert reader.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 0
    store = RunStore(tmp_path)
    store.batch_s = 3600.0
    store.start_cell("c0", 0, {"seed": 0})
    store.finish_cell("c0", [_record("c0", i) for i in range(4)], [("n", 0)])
    store.maybe_commit(0)
    done = reader.execute("SELECT status FROM cells").fetchall()
    calls = reader.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
    assert done == [("done",)] and calls == 4
    frame = store.calls_frame()
    assert list(frame["raw"]) == [f"answer {i}" for i in range(4)]
    assert list(frame["item"]) == ["0", "1", "2", "3"] and frame["input_tokens"].sum() == 12
    store.close()
    reader.close()
