"""Sharded runs: --shard + merge, --workers and the Ray executor equal a whole run."""

from __future__ import annotations

import os

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
        assert main(["run", str(spec_file), "--out", str(out), "--quiet", "--no-figures"]) == 0
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
                     "--quiet", "--no-figures"]) == 0
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
    assert main(["merge", *parts, "--out", str(merged), "--no-figures"]) == 0
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
    assert main(["run", str(spec_file), "--workers", "2", "--out", str(out), "--quiet",
                 "--no-figures"]) == 0
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


@pytest.mark.exclusive("ray")  # a plain ray.init() would join another test's cluster
def test_ray_executor_on_a_local_instance(spec_file, whole, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'biaslab[ray]')")
    out = tmp_path / "ray"
    assert main(["run", str(spec_file), "--workers", "3", "--executor", "ray", "--out",
                 str(out), "--quiet", "--no-figures"]) == 0
    assert_same_run(out, whole)


@pytest.mark.exclusive("ray")
def test_ray_shard_workers_run_at_normal_priority(tmp_path, monkeypatch):
    """Ray starts workers at nice 15; a local instance biaslab starts sets them to 0, since
    they are the user's run (niced, they crawled beside other busy programs)."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'biaslab[ray]')")
    from support_models import NICE_DIR_ENV

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    nice_dir = tmp_path / "nice"
    nice_dir.mkdir()
    monkeypatch.setenv(NICE_DIR_ENV, str(nice_dir))  # BIASLAB_*: passed to Ray's workers
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parents[1]),
                                                      os.environ.get("PYTHONPATH", "")]))
    spec = dict(SPEC, models=["scripted:support_models:niceness_recording_synthetic"])
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(spec))
    assert main(["run", str(path), "--workers", "2", "--executor", "ray", "--out",
                 str(tmp_path / "ray"), "--quiet", "--no-report"]) == 0
    seen = [int(f.read_text()) for f in nice_dir.glob("*.nice")]
    assert len(seen) >= 2 and set(seen) == {0}, seen  # both shards, in their own workers


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


def test_shards_keep_a_clean_arm_with_its_exposed_arms_and_stay_balanced():
    """Shards deal out groups (item, model, seed), never cut one: the exposed arms of a group
    reuse its clean arm's unexposed calls, its variants each other's steps, and all of them
    its data split."""
    from biaslab.experiments.plan import make_plan
    from biaslab.experiments.spec import spec_from_dict

    spec = dict(SPEC, run={"seeds": list(range(1, 14))})
    plan = make_plan(spec_from_dict(spec, where="test"))
    cells = list(plan.cells())
    for n in (2, 3):  # 13 groups: at least 4 per shard
        shard_of = {}
        for i in range(n):
            wanted = in_shard(i, n, plan)
            for cell in cells:
                if wanted(cell):
                    assert cell.id not in shard_of
                    shard_of[cell.id] = i
        assert len(shard_of) == len(cells)  # a partition of the grid
        groups: dict[tuple, set[int]] = {}
        for cell in cells:
            groups.setdefault((cell.item, cell.model.label, cell.seed),
                              set()).add(shard_of[cell.id])
        assert all(len(s) == 1 for s in groups.values())
        per_shard = [sum(1 for s in groups.values() if s == {i}) for i in range(n)]
        assert max(per_shard) - min(per_shard) <= 1, per_shard
    # Too few groups to deal evenly (13 < 4 x 4): dealt by variant, item, model and seed,
    # and a grid of one item, model and seed (test_three_shards_...) cell by cell.
    for i in range(4):
        wanted = in_shard(i, 4, plan)
        assert [c.ord for c in cells if wanted(c)]


def test_workers_are_forked_when_no_other_thread_runs(spec_file, whole, tmp_path):
    """`biaslab run --workers 2` as a user runs it forks its workers (no second interpreter
    start-up); with another thread alive it starts new interpreters instead. Both equal a
    single-process run."""
    import os
    import subprocess
    import sys
    import threading

    out = tmp_path / "forked"
    env = dict(os.environ, BIASLAB_CACHE="off")
    proc = subprocess.run([sys.executable, "-m", "biaslab", "run", str(spec_file), "--workers",
                           "2", "--out", str(out), "--quiet", "--no-figures"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert RunStore(out, readonly=True).meta()["workers_started"] == "fork"
    assert_same_run(out, whole)

    stop = threading.Event()
    busy = threading.Thread(target=stop.wait, daemon=True)
    busy.start()
    try:
        spawned = tmp_path / "spawned"
        assert main(["run", str(spec_file), "--workers", "2", "--out", str(spawned),
                     "--quiet", "--no-figures"]) == 0
    finally:
        stop.set()
    assert RunStore(spawned, readonly=True).meta()["workers_started"] == "spawn"
    assert_same_run(spawned, whole)


def test_default_workers_only_for_large_all_scripted_grids():
    from biaslab.experiments.plan import make_plan
    from biaslab.experiments.spec import spec_from_dict
    from biaslab.experiments.workers import BREAK_EVEN_CELLS, choose_workers

    plan = make_plan(spec_from_dict(SPEC, where="test"))
    n = plan.n_cells()
    assert n < BREAK_EVEN_CELLS and choose_workers(plan, cores=8).workers == 1
    many = make_plan(spec_from_dict(dict(SPEC, run={"seeds": list(range(1, 200))}),
                                    where="test"))
    cells = many.n_cells()
    assert cells >= BREAK_EVEN_CELLS
    assert choose_workers(many, cores=1).workers == 1
    assert choose_workers(many, cores=2).workers == 2
    # one worker per core, each with at least half the break-even size
    assert choose_workers(many, cores=64).workers == cells // (BREAK_EVEN_CELLS // 2)
    hosted = make_plan(spec_from_dict(dict(SPEC, models=["ollama:llama3"],
                                           run={"seeds": list(range(1, 200))}), where="test"),
                       check_keys=False)
    assert hosted.n_cells() >= BREAK_EVEN_CELLS and choose_workers(hosted, cores=8).workers == 1


def test_the_default_starts_workers_above_the_break_even(spec_file, whole, tmp_path, capsys,
                                                         monkeypatch):
    from biaslab.experiments import workers

    monkeypatch.setattr(workers, "BREAK_EVEN_CELLS", 4)
    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    out = tmp_path / "auto"
    capsys.readouterr()
    assert main(["run", str(spec_file), "--out", str(out), "--quiet", "--no-figures"]) == 0
    assert "biaslab: 2 worker processes (" in capsys.readouterr().err
    assert "workers_started" in RunStore(out, readonly=True).meta()
    assert_same_run(out, whole)
    one = tmp_path / "one"
    assert main(["run", str(spec_file), "--out", str(one), "--quiet", "--workers", "1",
                 "--no-figures"]) == 0
    assert "worker processes" not in capsys.readouterr().err
    assert "workers_started" not in RunStore(one, readonly=True).meta()
