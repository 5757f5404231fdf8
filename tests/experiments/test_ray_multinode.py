"""Ray across nodes without shared storage: a cluster of two nodes simulated on this machine
(`ray.cluster_utils.Cluster`), each with its own CPU. The shard tasks get their inputs and
return their stores as bytes, so they run on both nodes, and the merged run equals a
single-process run cell for cell and table for table."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import tomli_w

from biaslab.cli import main
from biaslab.traces.store import RunStore
from support_runs import amplification_spec, assert_same_run

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'biaslab[ray]')")
from ray.cluster_utils import Cluster  # noqa: E402

# The cluster writes /tmp/ray/ray_current_cluster, which a plain ray.init() elsewhere joins.
pytestmark = pytest.mark.exclusive("ray")

SPEC = amplification_spec(options={"datasets": ["math"], "pipelines": ["E0", "E1"],
                                   "max_test": 20, "n_resamples": 200})


@pytest.fixture
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_shards_on_two_nodes_without_shared_storage(two_nodes, tmp_path, monkeypatch):
    from biaslab.experiments import ray_shards

    # the task is handed bytes and strings only: no path of the driver's run directory
    params = inspect.signature(ray_shards._shard_task).parameters
    assert list(params) == ["spec_toml", "shard", "main_store", "shard_store", "concurrency",
                            "use_shared_cache"]
    monkeypatch.setenv("BIASLAB_CACHE", "off")
    spec = tmp_path / "grid.toml"
    spec.write_text(tomli_w.dumps(SPEC))
    whole = tmp_path / "whole"
    assert main(["run", str(spec), "--out", str(whole), "--quiet", "--no-figures"]) == 0
    out = tmp_path / "ray"
    # 4 shards of one CPU each on a cluster of two one-CPU nodes: both nodes take shards
    assert main(["run", str(spec), "--workers", "4", "--executor", "ray", "--out", str(out),
                 "--quiet", "--no-figures"]) == 0
    store = RunStore(out, readonly=True)
    nodes = store.meta()["shard_nodes"]
    store.close()
    assert len(nodes) == 4 and len(set(nodes)) == 2, nodes
    assert set(nodes) == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert_same_run(out, whole)
    assert not (out / "shards").exists()
