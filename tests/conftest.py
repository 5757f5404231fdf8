"""Shared fixtures: every test gets its own response cache, so no test sees another's calls.

Helpers that tests import live in `support_runs`, not here: each test folder may have a
conftest of its own, and an import of ``conftest`` would get whichever was loaded last."""

from __future__ import annotations

import signal

import pytest

# A real OpenAI-compatible endpoint (llama.cpp's server with SmolLM2 on 127.0.0.1), for any test
# that asks for it by name; see that module.
from support_llama_server import llama_server  # noqa: F401


@pytest.fixture(autouse=True, scope="session")
def ctrl_c_is_not_ignored():
    """A suite started in the background (``make test &``, ``nohup``) inherits SIGINT ignored,
    and Python then installs no KeyboardInterrupt handler: the tests that press Ctrl-C on a
    run in this process would wait for it forever. They test biaslab, not the shell's job
    control, so the suite gives SIGINT its usual meaning (subprocesses it starts inherit it)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    path = tmp_path / "shared-cache.sqlite"
    monkeypatch.setenv("BIASLAB_CACHE", str(path))
    return path
