"""Shared fixtures: every test gets its own response cache, so no test sees another's calls.

Helpers that tests import live in `support_runs`, not here: each test folder may have a
conftest of its own, and an import of ``conftest`` would get whichever was loaded last."""

from __future__ import annotations

import collections
import fcntl
import json
import os
import signal
import tempfile
from pathlib import Path

import pytest

# A real OpenAI-compatible endpoint (llama.cpp's server with SmolLM2 on 127.0.0.1), for any test
# that asks for it by name; see that module.
from support_llama_server import llama_server  # noqa: F401


DURATIONS = Path(__file__).with_name("file_durations.json")
"""Seconds each test file took in a recorded ``make test`` (setup, calls and teardowns):
the order in which the workers take the files. Written by ``make test-durations``; a file
missing from it (new since) counts a second per test. Stale numbers only change the order."""
RECORD_ENV = "BIASLAB_RECORD_DURATIONS"


def _file(nodeid: str) -> str:
    return nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items):
    """The order in which ``make test``'s workers take the files (``pytest -n --dist loadfile
    --no-loadscope-reorder``): files marked ``pytest.mark.early`` first, then the longest
    ones, by their recorded durations (`DURATIONS`). A file runs whole on one worker, so a
    long one started last (the README tour: a minute or more of module fixture, in 6 tests;
    the Ctrl-C timing loop, 40 s in 3) leaves the other workers idle meanwhile; the number of
    tests in a file, the order used before, put exactly those last. A plain ``pytest`` keeps
    the order in which it collected."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    try:
        recorded = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        recorded = {}
    tests_in = collections.Counter(_file(item.nodeid) for item in items)
    items.sort(key=lambda item: (item.get_closest_marker("early") is None,
                                 -recorded.get(_file(item.nodeid), tests_in[_file(item.nodeid)])))


_SPENT: collections.Counter = collections.Counter()


def pytest_runtest_logreport(report):
    """With ``BIASLAB_RECORD_DURATIONS`` set, each test file's seconds add up here (in the
    controller of ``pytest -n``, which receives every worker's reports)."""
    if os.environ.get(RECORD_ENV):
        _SPENT[_file(report.nodeid)] += report.duration


def pytest_sessionfinish(session, exitstatus):
    """Write the recorded durations (`DURATIONS`), in whole seconds, longest first."""
    if not os.environ.get(RECORD_ENV) or os.environ.get("PYTEST_XDIST_WORKER") or not _SPENT:
        return
    ordered = {f: round(s) for f, s in sorted(_SPENT.items(), key=lambda kv: (-kv[1], kv[0]))}
    DURATIONS.write_text(json.dumps(ordered, indent=1) + "\n")


@pytest.fixture(autouse=True, scope="session")
def ctrl_c_is_not_ignored():
    """A suite started in the background (``make test &``, ``nohup``) inherits SIGINT ignored,
    and Python then installs no KeyboardInterrupt handler: the tests that press Ctrl-C on a
    run in this process would wait for it forever. They test biaslab, not the shell's job
    control, so the suite gives SIGINT its usual meaning (subprocesses it starts inherit it)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture(autouse=True, scope="session")
def session_cache(tmp_path_factory):
    """A response cache (and fits, verdict key) for what runs before `isolated_cache`: module
    and session fixtures. Never the user's ``~/.cache/biaslab``, which the suite's workers
    (``pytest -n``, as ``make test`` runs it) would share with each other and with the user's
    own runs; `tmp_path_factory` gives each worker a directory of its own."""
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("session-cache") / "shared-cache.sqlite"
        mp.setenv("BIASLAB_CACHE", str(path))
        yield path


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    path = tmp_path / "shared-cache.sqlite"
    monkeypatch.setenv("BIASLAB_CACHE", str(path))
    return path


@pytest.fixture(autouse=True)
def exclusive(request):
    """``@pytest.mark.exclusive("NAME")``: the test holds a lock of that name on this machine
    while it runs, so that no other test marked with it runs at once, in another worker of the
    suite (``pytest -n``) or in another suite. For what is one per machine whatever the test
    does: Ray's ``/tmp/ray/ray_current_cluster``, say, which a plain ``ray.init()`` joins."""
    marker = request.node.get_closest_marker("exclusive")
    if marker is None:
        yield
        return
    path = Path(tempfile.gettempdir()) / f"biaslab-tests-{marker.args[0]}.lock"
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
