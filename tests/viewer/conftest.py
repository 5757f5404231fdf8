"""A small multiturn run (dialogues, an exposed arm, a judge) shared by the viewer tests."""

from __future__ import annotations

import shutil
import threading

import pytest

from biaslab.cli import main


def multiturn_spec_toml() -> str:
    return """
name = "view-test"
protocol = "multiturn"
models = ["scripted:multiturn-followup"]
[run]
seeds = [42]
concurrency = 4
retry_base_s = 0.0
[conditions]
include_clean = true
targets = ["target"]
directions = ["stereotype"]
template = "multiturn/exposure"
[options]
seeds_per_category = 1
categories = ["age", "gender"]
turn_caps = [4]
framings = ["assessment"]
baselines = []
n_resamples = 200
"""


@pytest.fixture(scope="session")
def multiturn_run(tmp_path_factory):
    """Run (and report) the spec once; tests read it, never write it."""
    root = tmp_path_factory.mktemp("mtrun")
    spec = root / "spec.toml"
    spec.write_text(multiturn_spec_toml())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASLAB_CACHE", str(root / "cache.sqlite"))
        assert main(["run", str(spec), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


@pytest.fixture
def viewer(multiturn_run, tmp_path):
    """A viewer on a copy of the run, on a free port, served from a thread."""
    from biaslab.viewer import make_server

    run = tmp_path / "run"
    shutil.copytree(multiturn_run, run)
    server = make_server(run, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", run
    server.shutdown()
    server.server_close()


MITIGATIONS_TOML = """
[mitigations.fairness_reminder]
targets = "target"
"""


@pytest.fixture(scope="session")
def mitigated_run(tmp_path_factory):
    """The same run with a mitigation arm crossed with both exposure arms: 8 cells."""
    root = tmp_path_factory.mktemp("mitrun")
    spec = root / "spec.toml"
    spec.write_text(multiturn_spec_toml() + MITIGATIONS_TOML)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASLAB_CACHE", str(root / "cache.sqlite"))
        assert main(["run", str(spec), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


@pytest.fixture
def serve_run():
    """Serve any run directory on a free port; yields a function run_dir → base URL."""
    from biaslab.viewer import make_server

    servers = []

    def start(run_dir):
        server = make_server(run_dir, port=0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def review_run(tmp_path_factory):
    """A composed protocol's run (experiments/examples/review.toml, its scripted reviewer),
    reported; tests read it, never write it."""
    from pathlib import Path

    root = tmp_path_factory.mktemp("review")
    spec = Path(__file__).resolve().parents[2] / "experiments" / "examples" / "review.toml"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASLAB_CACHE", str(root / "cache.sqlite"))
        mp.chdir(root)
        assert main(["run", str(spec), "--model", "scripted:review-synthetic", "--out",
                     "runs/review", "--quiet"]) == 0
    return root / "runs" / "review"
