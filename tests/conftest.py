"""Shared fixtures: every test gets its own response cache, so no test sees another's calls.

Helpers that tests import live in `support_runs`, not here: each test folder may have a
conftest of its own, and an import of ``conftest`` would get whichever was loaded last."""

from __future__ import annotations

import pytest



@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    path = tmp_path / "shared-cache.sqlite"
    monkeypatch.setenv("BIASLAB_CACHE", str(path))
    return path
