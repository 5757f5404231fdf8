"""Guards around a run that are not one bad value: an interrupt from a user's plugin, the
writer lock through the report phase, and a merge of an incomplete set of shards."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from biaslab.cli import main
from biaslab.experiments.runner import run_in_progress
from support_runs import amplification_spec

SPEC = amplification_spec(options={"datasets": ["math"], "pipelines": ["E0", "E1"],
                                   "max_test": 10, "n_resamples": 200},
                          conditions={"directions": ["pro_male"], "targets": "singletons"})


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def spec_file(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BIASLAB_CACHE", "off")
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(SPEC))
    return path


def test_a_plugin_raising_keyboard_interrupt_exits_130_without_a_traceback(tmp_path, capsys):
    (tmp_path / "mine.py").write_text("raise KeyboardInterrupt\n")
    (tmp_path / "spec.toml").write_text(
        'name = "x"\nprotocol = "mine"\nplugins = ["mine.py"]\n'
        'models = ["scripted:amplification-synthetic"]\n')
    for argv in (["run", tmp_path / "spec.toml", "--out", tmp_path / "o"],
                 ["graph", tmp_path / "spec.toml"]):
        code, _, err = cli(capsys, *argv)
        assert code == 130 and err == "biaslab: interrupted\n"
    assert not (tmp_path / "o").exists()


def test_the_writer_lock_is_held_while_the_report_is_written(spec_file, tmp_path, capsys,
                                                             monkeypatch):
    import biaslab.experiments.reports as reports

    out = tmp_path / "run"
    seen = []
    real = reports.write_reports

    def watching(plan, store, run_dir):
        seen.append(run_in_progress(run_dir))  # as another process would see the directory
        return real(plan, store, run_dir)

    monkeypatch.setattr(reports, "write_reports", watching)
    code, _, err = cli(capsys, "run", spec_file, "--out", out, "--quiet")
    assert code == 0, err
    assert seen == [True]
    assert not run_in_progress(out)  # and released when the command ends
    # A merge writes its report under the lock of the merged directory too.
    code, _, err = cli(capsys, "merge", out, "--out", tmp_path / "merged")
    assert code == 0, err
    assert seen == [True, True] and not run_in_progress(tmp_path / "merged")


def test_merging_an_incomplete_set_of_shards_needs_allow_partial(spec_file, tmp_path, capsys):
    shards = [tmp_path / f"shard{i}" for i in range(3)]
    for i, shard in enumerate(shards):
        code, _, err = cli(capsys, "run", spec_file, "--out", shard, "--shard", f"{i}/3",
                           "--quiet")
        assert code == 0, err
    merged = tmp_path / "merged"
    code, _, err = cli(capsys, "merge", shards[0], shards[2], "--out", merged)
    assert code == 2 and err.count("\n") == 1, err
    assert "shard 1/3 of this run is not among the runs to merge" in err
    assert "--allow-partial" in err
    assert not merged.exists()  # refused before anything was written
    code, out, err = cli(capsys, "merge", shards[0], shards[2], "--out", merged,
                         "--allow-partial")
    assert code == 0, err
    # 5 cells in grid order 0..4: shard 1/3 holds cells 1 and 4.
    assert "merged 2 runs into" in err and "3 cells done" in err
    assert ("warning: the merged run lacks 2 of its 5 cells (shards 1/3 missing); its tables "
            "cover the rest only") in err
    assert "wrote" in out
    code, _, err = cli(capsys, "merge", *shards, "--out", tmp_path / "whole")
    assert code == 0 and "5 cells done" in err and "warning" not in err, err
