"""Sharded runs: --shard + merge, --workers and the Ray executor equal a whole run."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from biaslab.cli import main
from biaslab.experiments.runner import _Progress
from biaslab.experiments.shards import in_shard, parse_shard
from biaslab.errors import UserError
from biaslab.traces.store import RunStore
from support_runs import amplification_spec, assert_same_run

# E0 + E1 + E2 on math: cells with one, two and many calls, in-run cache hits, exposures.
SPEC = amplification_spec(options={"datasets": ["math"], "pipelines": ["E0", "E1", "E2"],
                                   "max_test": 20, "n_resamples": 200})


@pytest.fixture(autouse=True)
def _no_shared_cache(monkeypatch):
    # Each run pays for its own calls, so a shard cannot borrow another's answers.
    monkeypatch.setenv("BIASLAB_CACHE", "off")


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "grid.toml"
    path.write_text(tomli_w.dumps(SPEC))
    return path


@pytest.fixture(scope="module")
def whole(spec_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "run"
    import os
    old = os.environ.get("BIASLAB_CACHE")
    os.environ["BIASLAB_CACHE"] = "off"
    try:
        assert main(["run", str(spec_file), "--out", str(out), "--quiet"]) == 0
    finally:
        if old is None:
            os.environ.pop("BIASLAB_CACHE", None)
        else:
            os.environ["BIASLAB_CACHE"] = old
    return out


def test_shard_argument_and_slices():
    assert parse_shard("2/3") == (2, 3)
    for bad in ("3/3", "-1/2", "a/b", "1", "0/0"):
        with pytest.raises(UserError, match="--shard must be I/N"):
            parse_shard(bad)
    ords = range(10)

    class C:
        def __init__(self, o):
            self.ord = o
    slices = [[o for o in ords if in_shard(i, 3)(C(o))] for i in range(3)]
    assert sorted(sum(slices, [])) == list(ords) and all(slices)


def test_three_shards_merged_equal_the_whole_run(spec_file, whole, tmp_path, capsys):
    parts = []
    for i in range(3):
        out = tmp_path / f"shard-{i}"
        capsys.readouterr()
        assert main(["run", str(spec_file), "--shard", f"{i}/3", "--out", str(out),
                     "--quiet"]) == 0
        store = RunStore(out, readonly=True)
        n = len(store.cells())
        total = len(RunStore(whole, readonly=True).cells())
        # the other shards' cells are named as such, never as "already done"
        assert (f"{n} cells run, 0 already done, {total - n} belong to other shards, 0 failed "
                f"of {total}") in capsys.readouterr().err
        assert store.meta()["shard"] == f"{i}/3" and 0 < n < len(RunStore(whole).cells())
        store.close()
        parts.append(str(out))
    assert not (Path(parts[0]) / "tables").exists()  # a shard alone is not reported
    merged = tmp_path / "merged"
    assert main(["merge", *parts, "--out", str(merged)]) == 0
    assert_same_run(merged, whole)
    # merging again (e.g. after a shard resumed) changes nothing
    assert main(["merge", *parts, "--out", str(merged), "--no-report"]) == 0
    assert_same_run(merged, whole)


def test_merge_refuses_runs_of_different_experiments(spec_file, whole, tmp_path, capsys):
    other = tmp_path / "other.toml"
    other.write_text(tomli_w.dumps(amplification_spec(
        options={"datasets": ["math"], "pipelines": ["E0"], "max_test": 20})))
    assert main(["run", str(other), "--out", str(tmp_path / "o"), "--quiet",
                 "--no-report"]) == 0
    capsys.readouterr()
    assert main(["merge", str(whole), str(tmp_path / "o"), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("biaslab: error: cannot merge") and "different experiments" in err
    assert len(err.splitlines()) == 1
    assert main(["merge", str(tmp_path / "nothing"), "--out", str(tmp_path / "m")]) == 2


def test_workers_end_in_one_store_equal_to_a_single_process_run(spec_file, whole, tmp_path,
                                                                capsys):
    out = tmp_path / "workers"
    capsys.readouterr()
    assert main(["run", str(spec_file), "--workers", "2", "--out", str(out), "--quiet"]) == 0
    assert_same_run(out, whole)
    # the workers' calls and tokens add up (each shard pays for its own copies of shared
    # calls, so they may exceed a single process's)
    merged = RunStore(out, readonly=True)
    c = merged.counts()
    merged.close()
    err = capsys.readouterr().err
    assert c["tokens_paid"] > 0 and f", {_Progress._short(c['tokens_paid'])} tokens\n" in err, err
    assert f"  {c['calls'] - c['cache_hits']} model calls, {c['cache_hits']} cache hits" in err
    assert not (out / "shards").exists()
    # resume and replay work on the merged run as on any other
    assert main(["run", "--resume", str(out), "--workers", "2", "--quiet", "--no-report"]) == 0
    assert_same_run(out, whole)
    assert main(["replay", str(out), "--mode", "strict", "--out", str(tmp_path / "r")]) == 0


def test_ray_executor_on_a_local_instance(spec_file, whole, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'biaslab[ray]')")
    out = tmp_path / "ray"
    assert main(["run", str(spec_file), "--workers", "3", "--executor", "ray", "--out",
                 str(out), "--quiet"]) == 0
    assert_same_run(out, whole)


def test_merge_never_replaces_a_done_cell_with_a_failed_one(tmp_path):
    from biaslab.traces.cache import CachedResponse
    from biaslab.traces.records import CallRecord

    def record(cid, raw):
        return CallRecord(cell_id=cid, node="n", seed=1, exposure_id="none", prompt_id="p",
                          prompt_hash="h", cache_key="k" + raw, messages=[], model={},
                          params={}, raw=raw)

    for name, status in (("good", None), ("bad", "boom")):
        store = RunStore(tmp_path / name)
        store.set_meta(fingerprint="f1")
        store.start_cell("c", 0, {"seed": 1})
        store.put_cache("k" + name, CachedResponse(name, 1, 1), {})
        store.finish_cell("c", [record("c", name)], [("n", name)], error=status)
        store.close()
    out = RunStore(tmp_path / "out")
    assert out.merge_from(tmp_path / "good") == 1 and out.merge_from(tmp_path / "bad") == 0
    assert list(out.cells()["status"]) == ["done"]
    assert [c.raw for c in out.iter_calls()] == ["good"] and len(out.cache) == 2
    out.close()
    fresh = RunStore(tmp_path / "out2")
    assert fresh.merge_from(tmp_path / "bad") == 1 and fresh.merge_from(tmp_path / "good") == 1
    assert list(fresh.cells()["status"]) == ["done"] and len(list(fresh.iter_calls())) == 1
    fresh.close()
