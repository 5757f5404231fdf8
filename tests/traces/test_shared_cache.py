"""The shared response cache (``BIASLAB_CACHE``) can't spoil a run: damaged, read-only, the
wrong kind of path, or shared by two runs at once.

Every run goes through ``biaslab run`` against `support_http.FakeOpenAI` on 127.0.0.1. The spec
is amplification's E0 on 10 math records in batches of 5, one direction: 2 cells of 2 calls,
so a run pays 4 requests unless its answers are cached.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import tomli_w

from biaslab.cli import main
from biaslab.traces.store import RunStore
from support_http import FakeOpenAI, loopback_only, synthetic_answer

KEY_ENV = "BIASLAB_TEST_KEY"
CALLS_PER_RUN = 4


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    loopback_only(monkeypatch)
    monkeypatch.setenv(KEY_ENV, "sk-cache-test")


@pytest.fixture
def server():
    with FakeOpenAI() as fake:
        fake.responder = synthetic_answer
        yield fake


def spec_file(tmp_path: Path, base_url: str, *, directions=("pro_female",),
              concurrency: int = 4, name: str = "spec.toml") -> Path:
    spec = {"name": "cache", "protocol": "amplification", "models": ["fake"],
            "model_aliases": {"fake": {"provider": "openai-compatible", "model": "m",
                                       "base_url": base_url, "api_key_env": KEY_ENV}},
            "run": {"seeds": [42], "concurrency": concurrency, "max_attempts": 2,
                    "retry_base_s": 0.002},
            "conditions": {"directions": list(directions), "targets": "all"},
            "options": {"datasets": ["math"], "pipelines": ["E0"], "max_test": 10,
                        "batch_size": 5, "n_resamples": 100}}
    path = tmp_path / name
    path.write_text(tomli_w.dumps(spec), encoding="utf-8")
    return path


def run(capsys, spec: Path, out: Path) -> tuple[int, str]:
    code = main(["run", str(spec), "--out", str(out), "--quiet", "--no-report"])
    return code, capsys.readouterr().err


def statuses(out: Path) -> list[str]:
    store = RunStore(out, readonly=True)
    try:
        return list(store.cells()["status"])
    finally:
        store.close()


def warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("biaslab: warning:")]


def entries(path: Path) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT COUNT(*) FROM cache").fetchone()[0]
    finally:
        conn.close()


def damage(path: Path) -> None:
    """Overwrite every page after the first (the schema stays readable): what a torn copy or
    a bad disk leaves behind."""
    conn = sqlite3.connect(path)  # the last writer to close folds the WAL into the file
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(path.read_bytes())
    assert len(data) > 4096 and not path.with_name(path.name + "-wal").exists()
    data[4096:] = b"\xab" * (len(data) - 4096)
    path.write_bytes(bytes(data))


def make_read_only(path: Path, request) -> None:
    """chmod for a user; root ignores modes, so the immutable flag (skipped where unsupported)."""
    path.chmod(0o555 if path.is_dir() else 0o444)
    request.addfinalizer(lambda: path.chmod(0o755 if path.is_dir() else 0o644))
    if os.geteuid() != 0:
        return
    if shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root on a filesystem without the immutable flag")
    request.addfinalizer(lambda: subprocess.run(["chattr", "-i", str(path)]))
    assert not os.access(path, os.W_OK)


# -- damaged ----------------------------------------------------------------------------------
def test_a_damaged_cache_is_moved_aside_and_the_run_goes_on_with_a_fresh_one(
        tmp_path, capsys, server, isolated_cache):
    spec = spec_file(tmp_path, server.base_url)
    assert run(capsys, spec, tmp_path / "first")[0] == 0
    assert entries(isolated_cache) == CALLS_PER_RUN
    damage(isolated_cache)

    code, err = run(capsys, spec, tmp_path / "second")
    assert code == 0, err
    assert statuses(tmp_path / "second") == ["done", "done"]
    aside = list(tmp_path.glob(isolated_cache.name + ".corrupt-*"))
    assert len(aside) == 1 and aside[0].name.startswith("shared-cache.sqlite.corrupt-2")
    [warning] = warnings(err)  # once, naming both paths
    assert str(isolated_cache) in warning and str(aside[0]) in warning
    assert len(server.requests) == 2 * CALLS_PER_RUN  # the damaged answers were paid again...
    assert entries(isolated_cache) == CALLS_PER_RUN  # ...into a fresh cache,

    code, err = run(capsys, spec, tmp_path / "third")  # which the next run is served from
    assert code == 0 and not warnings(err), err
    assert len(server.requests) == 2 * CALLS_PER_RUN and "0 model calls" in err


# -- read-only --------------------------------------------------------------------------------
def second_run_against_a_read_only_cache(capsys, tmp_path, server, cache) -> None:
    """After a first run filled `cache` and it was made read-only: a run asking pro_female's
    questions again and pro_male's anew finishes, with one warning naming the cache, gets
    pro_female's answers from it and pays only for the new questions."""
    both = spec_file(tmp_path, server.base_url, directions=("pro_female", "pro_male"),
                     name="both.toml")
    code, err = run(capsys, both, tmp_path / "second")
    assert code == 0, err
    assert set(statuses(tmp_path / "second")) == {"done"}
    [warning] = warnings(err)
    assert str(cache) in warning and "read-only" in warning
    assert f"model calls, {CALLS_PER_RUN} cache hits" in err, err
    paid = len(server.requests) - CALLS_PER_RUN
    assert paid > 0 and f"{paid} model calls" in err

def test_a_read_only_cache_serves_the_run_and_fails_no_cell(tmp_path, capsys, server,
                                                            isolated_cache, request):
    assert run(capsys, spec_file(tmp_path, server.base_url), tmp_path / "first")[0] == 0
    make_read_only(isolated_cache, request)
    # pro_female's 4 calls are cached; pro_male's 4 are new and can't be stored there
    second_run_against_a_read_only_cache(capsys, tmp_path, server, isolated_cache)
    assert entries(isolated_cache) == CALLS_PER_RUN


# -- the wrong kind of path -------------------------------------------------------------------
def _a_directory(path: Path, request) -> Path:
    path.mkdir()
    return path


def _garbage(path: Path, request) -> Path:
    path.write_text("these are my notes, not a database\n" * 20)
    return path


def _parent_is_a_file(path: Path, request) -> Path:
    path.write_text("a file\n")
    return path / "calls.sqlite"


def _read_only_directory(path: Path, request) -> Path:
    path.mkdir()
    make_read_only(path, request)
    return path


def _in_a_read_only_directory(path: Path, request) -> Path:
    path.mkdir()
    make_read_only(path, request)
    return path / "calls.sqlite"


@pytest.mark.parametrize("make, problem", [
    (_a_directory, "is a directory"),
    (_garbage, "is not a SQLite file"),
    (_parent_is_a_file, "is a file"),
    (_read_only_directory, "is a directory"),
    (_in_a_read_only_directory, "is not writable"),
])
def test_a_path_that_cannot_hold_the_cache_stops_the_run_before_it_writes(
        tmp_path, capsys, monkeypatch, server, request, make, problem):
    cache = make(tmp_path / "cache", request)
    monkeypatch.setenv("BIASLAB_CACHE", str(cache))
    out = tmp_path / "run"
    code, err = run(capsys, spec_file(tmp_path, server.base_url), out)
    assert code == 2
    lines = [line for line in err.splitlines() if "cells →" not in line]
    assert len(lines) == 1 and lines[0].startswith("biaslab: error: "), err
    assert str(cache) in lines[0] and problem in lines[0] and "--no-cache" in lines[0]
    assert not out.exists() and not server.requests
    # and the suggestion works
    code = main(["run", str(spec_file(tmp_path, server.base_url)), "--out", str(out),
                 "--quiet", "--no-report", "--no-cache"])
    assert code == 0, capsys.readouterr().err
    assert statuses(out) == ["done", "done"]


def test_a_counterfactual_replay_checks_the_cache_before_it_writes(tmp_path, capsys,
                                                                   monkeypatch, server):
    source = tmp_path / "source"
    assert run(capsys, spec_file(tmp_path, server.base_url), source)[0] == 0
    paid = len(server.requests)
    monkeypatch.setenv("BIASLAB_CACHE", str(tmp_path))  # a directory
    out = tmp_path / "cf"
    code = main(["replay", str(source), "--mode", "counterfactual", "--directions", "pro_male",
                 "--out", str(out), "--quiet"])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert str(tmp_path) in lines[0] and "--no-cache" in lines[0]
    assert not out.exists() and len(server.requests) == paid


# -- two runs at once -------------------------------------------------------------------------
class _Gate:
    """Holds each answer until the same question was asked `n` times (or `timeout_s` passed):
    two runs asking the same calls in the same order are then both in flight for each."""

    def __init__(self, n: int = 2, timeout_s: float = 30.0):
        self.n, self.timeout_s = n, timeout_s
        self.seen: dict[str, int] = {}
        self.cond = threading.Condition()

    def __call__(self, messages) -> str:
        key = json.dumps(messages, sort_keys=True)
        with self.cond:
            self.seen[key] = self.seen.get(key, 0) + 1
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.seen[key] >= self.n, timeout=self.timeout_s)
        return synthetic_answer(messages)


def test_two_runs_on_one_cache_at_once_each_pay_for_the_calls_in_flight_in_both(
        tmp_path, capsys, server, isolated_cache):
    """The documented behaviour: concurrent runs share every stored answer, not the calls in
    flight. Both runs ask each question while the other's identical call is unanswered, so
    each pays all 4; neither fails over the shared file, and a later run pays nothing."""
    server.responder = _Gate(n=2)
    spec = spec_file(tmp_path, server.base_url, concurrency=1)  # both ask in the same order
    env = {**os.environ, "BIASLAB_CACHE": str(isolated_cache)}
    procs = [subprocess.Popen([sys.executable, "-m", "biaslab", "run", str(spec), "--out",
                               str(tmp_path / f"run{i}"), "--quiet", "--no-report"],
                              env=env, stderr=subprocess.PIPE, text=True) for i in (1, 2)]
    errs = [proc.communicate(timeout=120)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], errs
    assert all(f"{CALLS_PER_RUN} model calls, 0 cache hits" in err for err in errs), errs
    assert len(server.requests) == 2 * CALLS_PER_RUN
    assert entries(isolated_cache) == CALLS_PER_RUN  # one entry per answer, first one kept

    code, err = run(capsys, spec, tmp_path / "later")
    assert code == 0 and "0 model calls" in err, err
    assert len(server.requests) == 2 * CALLS_PER_RUN


# -- errors met mid-run -----------------------------------------------------------------------
def test_a_cache_that_fails_mid_run_costs_a_warning_never_a_call(tmp_path, server, capsys):
    """Mid-run, another process holds the cache's write lock past the busy timeout, then
    someone drops its table: the failed write makes it read-only, the failed lookup takes it
    out of the run; one warning each, and every call is still answered and kept in the run's
    own cache."""
    import asyncio

    from biaslab.agents.gateway import Gateway
    from biaslab.agents.providers import ModelSpec
    from biaslab.traces.cache import CallCache
    from biaslab.traces.shared_cache import open_shared_cache

    path = tmp_path / "shared.sqlite"
    shared = open_shared_cache(path)
    shared.conn.execute("PRAGMA busy_timeout=50")
    own = CallCache(sqlite3.connect(":memory:", isolation_level=None))
    gateway = Gateway(caches=[own, shared])
    spec = ModelSpec(provider="openai-compatible", model="m", base_url=server.base_url,
                     api_key_env=KEY_ENV)
    other = sqlite3.connect(path, isolation_level=None)

    async def ask(text: str) -> str:
        messages = [{"role": "user", "content": text}]
        return (await gateway.complete(spec, messages, {"seed": 1}, 0)).raw

    async def scenario() -> list[str]:
        answers = [await ask("first")]
        assert len(shared) == 1
        other.execute("BEGIN IMMEDIATE")  # holds the write lock
        answers += [await ask("second"), await ask("third")]
        other.execute("ROLLBACK")
        assert len(shared) == 1 and shared.get(own_key("first")) is not None  # still read
        other.execute("DROP TABLE cache")
        own.conn.execute("DELETE FROM cache")
        answers.append(await ask("first"))  # the lookup fails: it is paid again
        return answers

    def own_key(text: str) -> str:
        from biaslab.traces.cache import cache_key
        return cache_key(spec.identity(), [{"role": "user", "content": text}], {"seed": 1}, 0)

    assert asyncio.run(scenario()) == ["I cannot answer that."] * 4
    shared.close()
    other.close()
    found = warnings(capsys.readouterr().err)
    assert len(found) == 2, found
    assert "could not be written" in found[0] and "failed on a lookup" in found[1]
    assert len(server.requests) == 4 and gateway.counters.errors == 0
    assert len(own) == 1  # the answer paid again is in the run's own cache


def test_a_cache_truncated_during_a_run_costs_a_warning_never_the_process(tmp_path, server):
    """Someone truncates the shared cache (its WAL index, which SQLite maps, and the file) while
    a run is waiting for its second answer. A mapped page past the end of its file is a SIGBUS
    that kills the process without a word; here the run notices, takes the cache out with one
    warning, and finishes every cell."""
    cache = tmp_path / "cache" / "calls.sqlite"
    index = Path(f"{cache}-shm")
    seen = []

    def truncating(messages):
        seen.append(1)
        if len(seen) == 2:  # mid-run: the cache is open, its index mapped
            assert index.stat().st_size > 0
            os.truncate(index, 0)
            os.truncate(cache, 0)
        return synthetic_answer(messages)

    server.responder = truncating
    spec = spec_file(tmp_path, server.base_url, concurrency=1)
    proc = subprocess.run([sys.executable, "-m", "biaslab", "run", str(spec), "--out",
                           str(tmp_path / "run"), "--quiet", "--no-report"],
                          env={**os.environ, "BIASLAB_CACHE": str(cache)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])  # -7 was SIGBUS
    found = warnings(proc.stderr)
    assert len(found) == 1 and "was truncated while this run used it" in found[0], found
    assert statuses(tmp_path / "run") == ["done", "done"]
    assert len(server.requests) == CALLS_PER_RUN


def test_a_full_cache_in_a_read_only_directory_serves_the_run(tmp_path, capsys, server,
                                                              request, monkeypatch):
    """A filled cache in a directory the run may not write (a team's shared cache, say):
    its answers are read, with one warning that new ones are not stored there."""
    where = tmp_path / "team"
    where.mkdir()
    cache = where / "calls.sqlite"
    monkeypatch.setenv("BIASLAB_CACHE", str(cache))
    assert run(capsys, spec_file(tmp_path, server.base_url), tmp_path / "first")[0] == 0
    assert not Path(f"{cache}-shm").exists()  # the last writer to close removes WAL's files
    make_read_only(where, request)
    second_run_against_a_read_only_cache(capsys, tmp_path, server, cache)
    # nothing new there: the cache and the verdict key the first run left beside it
    assert sorted(p.name for p in where.iterdir()) == ["calls.sqlite", "calls.sqlite.verdict-key"]
