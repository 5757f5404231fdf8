"""Ctrl-C in a replay and in shard workers, as in ``biaslab run``: the first stops cleanly and
keeps what is finished, a second quits at once. Real SIGINTs to real processes, on scripted
models slowed down (``tests/support_models.py``)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from biaslab.cli import main

SPEC_TOML = """
name = "stopme"
protocol = "amplification"
models = ["scripted:amplification-synthetic"]
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
CELLS = 14  # E1: clean + 3 targets x 2 directions, 2 seeds


def _env(**extra: str) -> dict:
    return {**os.environ, **extra, "BIASLAB_CACHE": "off",
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                           os.environ.get("PYTHONPATH", "")])}


def _done(run_dir: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT COUNT(*) FROM cells WHERE status='done'").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def _wait_for(run_dir: Path, proc, cells: int) -> None:
    deadline = time.monotonic() + 120
    while _done(run_dir) < cells and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "it finished before it could be interrupted"


@pytest.fixture
def source(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BIASLAB_CACHE", "off")
    (tmp_path / "spec.toml").write_text(SPEC_TOML)
    assert main(["run", str(tmp_path / "spec.toml"), "--out", str(tmp_path / "src"),
                 "--quiet", "--no-report"]) == 0
    return tmp_path / "src"


def _counterfactual(source: Path, out: Path, model: str, *extra: str, env=None, **kwargs):
    argv = [sys.executable, "-m", "biaslab", "replay", str(source), "--mode", "counterfactual",
            "--node", "prediction", "--model", f"scripted:support_models:{model}",
            "--out", str(out), "--quiet", *extra]
    return subprocess.Popen(argv, env=env or _env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kwargs)


def _hold_calls(hold_dir: Path, proc) -> None:
    """From now on, new calls of `slow_to_stop_synthetic` wait until cancelled; return once
    one is waiting, so the Ctrl-C that follows certainly finds a call in flight."""
    (hold_dir / "hold").touch()
    deadline = time.monotonic() + 60
    while not any(hold_dir.glob("held-*")) and time.monotonic() < deadline:
        assert proc.poll() is None, "it finished before it could be interrupted"
        time.sleep(0.05)
    assert any(hold_dir.glob("held-*")), "no call started within a minute"


def test_first_ctrl_c_stops_a_replay_cleanly_and_resume_finishes_it(source, tmp_path):
    out = tmp_path / "cf"
    proc = _counterfactual(source, out, "slow_synthetic")
    _wait_for(out, proc, 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "Ctrl-C: stopping; finished cells and returned answers are kept" in err
    assert f"--out {out} --resume" in err
    kept = _done(out)
    assert 2 <= kept < CELLS  # the replay's directory is kept, with its finished cells
    resumed = _counterfactual(source, out, "slow_synthetic", "--resume")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()
    assert f"{kept} already done" in err.decode()
    assert _done(out) == CELLS


def test_a_second_ctrl_c_quits_a_replay_at_once(source, tmp_path):
    from support_models import STOP_S

    from support_models import HOLD_DIR_ENV

    out, hold = tmp_path / "cf", tmp_path / "hold"
    hold.mkdir()
    proc = _counterfactual(source, out, "slow_to_stop_synthetic",
                           env=_env(**{HOLD_DIR_ENV: str(hold)}))
    _wait_for(out, proc, 1)
    _hold_calls(hold, proc)
    proc.send_signal(signal.SIGINT)  # its calls in flight now hold the process for STOP_S
    time.sleep(0.5)
    assert proc.poll() is None
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=STOP_S * 3)
    took = time.monotonic() - started
    err = err.decode()
    assert proc.returncode == 130, err
    assert took < STOP_S / 4, err
    assert "Ctrl-C again: quitting now." in err and "Traceback" not in err
    assert f"continue with: biaslab replay {source} --mode counterfactual --out {out} " \
           "--resume" in err


def test_a_second_ctrl_c_quits_shard_workers_at_once(tmp_path):
    from support_models import HOLD_DIR_ENV, STOP_S

    hold = tmp_path / "hold"
    hold.mkdir()
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC_TOML.replace("scripted:amplification-synthetic",
                                      "scripted:support_models:slow_to_stop_synthetic"))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "biaslab", "run", str(spec), "--out",
                             str(out), "--workers", "2", "--quiet", "--no-report"],
                            env=_env(**{HOLD_DIR_ENV: str(hold)}), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # a group, as a terminal's Ctrl-C reaches
    shards = [out / "shards" / f"{i}-of-2" for i in range(2)]
    deadline = time.monotonic() + 120
    while sum(_done(s) for s in shards) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None
    _hold_calls(hold, proc)
    os.killpg(proc.pid, signal.SIGINT)  # the workers' calls in flight now block for STOP_S
    time.sleep(0.5)
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=STOP_S * 3)
    while time.monotonic() - started < STOP_S:  # every process of the group is gone
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    took = time.monotonic() - started
    assert took < STOP_S / 4
    assert proc.returncode == 130


def test_first_ctrl_c_merges_what_the_workers_kept_and_resume_finishes(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC_TOML.replace("scripted:amplification-synthetic",
                                      "scripted:support_models:slow_synthetic"))
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "biaslab", "run", str(spec), "--out", str(out), "--workers",
            "2", "--quiet", "--no-report"]
    proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    shards = [out / "shards" / f"{i}-of-2" for i in range(2)]
    deadline = time.monotonic() + 120
    while sum(_done(s) for s in shards) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert "Traceback" not in err.decode()
    kept = [_done(s) for s in shards]
    # The coordinator waited for its workers to stop, then merged every cell they finished.
    assert _done(out) == sum(kept) < CELLS
    resumed = subprocess.Popen(argv + ["--resume"], env=_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()
    assert _done(out) == CELLS
