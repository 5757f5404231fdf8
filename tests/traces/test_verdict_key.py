"""The run's verdict key: kept in the store, inherited by replays, shared through the cache.

Through the CLI, on a tiny roleplay grid (its three Why judges ask for markers): the same job
into a new directory with the same shared cache renders the same judge prompts and makes no
model call, and with ``--no-cache`` it still renders the same prompts; a user with another
key file renders other markers, and a strict replay of that run finds every recorded call (it
inherits the run's key); the key never reaches the spec, a table or the report.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from biaslab.agents.verdicts import requested_marker
from biaslab.cli import main
from biaslab.traces.store import RunStore
from biaslab.traces.verdict_key import cache_verdict_key

SPEC = """name = "keys"
protocol = "roleplay"
models = ["scripted:roleplay-synthetic"]
[run]
seeds = [42]
concurrency = 4
retry_base_s = 0.0
[options]
attributes = ["gender"]
per_stratum = 2
chunk_size = 2
types = ["why"]
[conditions]
targets = []
"""


def _run(tmp: Path, out: str, *extra: str) -> Path:
    spec = tmp / "spec.toml"
    spec.write_text(SPEC)
    assert main(["run", str(spec), "--out", str(tmp / out), "--quiet", *extra]) == 0
    return tmp / out


def _judge_calls(run: Path):
    store = RunStore(run, readonly=True)
    try:
        calls, meta = store.calls(), store.meta()
    finally:
        store.close()
    marked = calls["messages"].map(lambda ms: requested_marker(ms[-1]["content"]) is not None)
    return calls[marked].sort_values(["cell_id", "node", "item"]), meta["verdict_key"]


def test_the_key_file_is_made_once_private_and_beside_the_cache(tmp_path, monkeypatch,
                                                                capsys):
    from biaslab.traces.verdict_key import verdict_key_path
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "calls.sqlite"))
    path = verdict_key_path()
    assert path == tmp_path / "calls.sqlite.verdict-key"
    key = cache_verdict_key(path)
    assert key is not None and len(key) == 16
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert cache_verdict_key(path) == key
    path.write_text("damaged")  # replaced by a new key, which later runs share
    fresh = cache_verdict_key(path)
    assert fresh is not None and fresh != key and cache_verdict_key(path) == fresh
    err = capsys.readouterr().err  # ... never silently
    assert err.count("\n") == 1 and f"verdict key file {path} held no key (damaged)" in err
    monkeypatch.setenv("BIASLAB_CACHE", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert verdict_key_path() == tmp_path / "xdg" / "biaslab" / "verdict-key"
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cache_verdict_key(blocker / "verdict-key") is None  # cannot be made: no key file
    assert f"verdict key file {blocker}/verdict-key cannot be" in capsys.readouterr().err


def test_an_unreadable_key_file_is_one_warning_naming_it(tmp_path, capsys, monkeypatch):
    """Through the CLI: a key file that cannot be read (here a directory in its place; the
    tests may run as root, which reads any file) is kept as it is, and each run says once
    which file and what it costs, instead of silently taking a fresh key."""
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "calls.sqlite"))
    (tmp_path / "calls.sqlite.verdict-key").mkdir()
    _run(tmp_path, "first")
    err = capsys.readouterr().err
    warnings = [ln for ln in err.splitlines() if "verdict key file" in ln]
    assert warnings == [f"biaslab: warning: the verdict key file {tmp_path}/calls.sqlite."
                        f"verdict-key cannot be read (Is a directory); this run takes a key of "
                        "its own, and judge prompts of runs made with another key differ, so "
                        "the shared response cache will not answer their judge calls again "
                        "(make the file readable, or remove it to start a new key)"], err
    assert (tmp_path / "calls.sqlite.verdict-key").is_dir()  # not replaced


def test_runs_sharing_a_cache_share_judge_prompts_and_answers(tmp_path, capsys):
    first = _run(tmp_path, "first")
    again = _run(tmp_path, "again")
    calls_a, key_a = _judge_calls(first)
    calls_b, key_b = _judge_calls(again)
    assert len(calls_a) > 0 and key_a == key_b
    assert calls_a["messages"].tolist() == calls_b["messages"].tolist()
    assert calls_b["cache_hit"].all() and calls_b["parse_error"].isna().all()
    # the key is in no file a person reads or shares
    for run in (first, again):
        for path in [run / "spec.toml", run / "report.html", *(run / "tables").rglob("*")]:
            if path.is_file():
                assert key_a not in path.read_text(errors="replace"), path


def test_another_key_renders_other_markers_and_its_run_replays_exactly(tmp_path, capsys,
                                                                        monkeypatch):
    shared = _run(tmp_path, "shared")
    uncached = _run(tmp_path, "uncached", "--no-cache")  # the same user: the same key
    calls_s, key_s = _judge_calls(shared)
    calls_u, key_u = _judge_calls(uncached)
    assert key_u == key_s and calls_u["messages"].tolist() == calls_s["messages"].tolist()
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "elsewhere" / "calls.sqlite"))
    alone = _run(tmp_path, "alone")
    calls_a, key_a = _judge_calls(alone)
    assert key_a != key_s
    assert calls_a["messages"].tolist() != calls_s["messages"].tolist()
    assert calls_a["parse_error"].isna().all()
    # resumed, it keeps its key: nothing to run, no call made
    capsys.readouterr()
    assert main(["run", str(tmp_path / "spec.toml"), "--out", str(alone), "--resume",
                 "--no-cache"]) == 0
    assert "0 model calls" in capsys.readouterr().err
    assert _judge_calls(alone)[1] == key_a
    # a strict replay, by the first user again, inherits the run's key: every judge call is
    # found in the trace
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path / "shared-cache.sqlite"))
    code = main(["replay", str(alone), "--mode", "strict", "--out", str(tmp_path / "strict")])
    out = capsys.readouterr().out
    assert code == 0 and "outputs identical, 0 model calls" in out
    assert _judge_calls(tmp_path / "strict")[1] == key_a


@pytest.mark.parametrize("value", ["", "zz" * 16, 7])
def test_a_damaged_key_in_the_store_is_replaced(tmp_path, value):
    from biaslab.traces.verdict_key import run_verdict_key
    store = RunStore(tmp_path / "run")
    try:
        store.set_meta(verdict_key=value)
        key = run_verdict_key(store)
        assert len(key) == 16 and store.meta()["verdict_key"] == key.hex()
        assert run_verdict_key(store) == key
    finally:
        store.close()
