"""Spec mistakes a new user makes: each is one line, exit code 2, and nothing is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from biaslab.cli import main

GOOD = ('name = "x"\nprotocol = "amplification"\nmodels = ["scripted:amplification-synthetic"]\n')


def run(tmp_path: Path, capsys, text: str, *extra: str):
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    code = main(["run", str(spec), *extra])
    out, err = capsys.readouterr()
    return code, err


@pytest.mark.parametrize("text, message", [
    (GOOD + "[run]\nseeds = [-1]\n", r"run\.seeds\.0: Input should be greater than or equal to 0"),
    (GOOD + "[run]\nseeds = [4294967296]\n", r"run\.seeds\.0: .*less than or equal to 4294967295"),
    (GOOD + "[run]\nseeds = [42, 43, 42]\n", r"seed 42 is listed twice"),
    (GOOD + "[conditions]\ndirections = []\n", r"conditions\.directions: is empty"),
    (GOOD + "[options]\nn_resamples = 1000000000000\n", r"n_resamples.*1000000"),
    ("a = " + "[" * 3000 + "]" * 3000 + "\n", r"nested too deeply"),
    (GOOD.replace('"x"', '"../escape"'), r"name: must be letters, digits"),
    (GOOD.replace('"x"', '"/tmp/abs"'), r"name: must be letters, digits"),
])
def test_bad_values_are_one_line(tmp_path, capsys, monkeypatch, text, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    code, err = run(tmp_path, capsys, text)
    assert code == 2 and err.count("\n") == 1 and err.startswith("biaslab: error:"), err
    assert re.search(message, err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml", "work"]
    assert not any((tmp_path / "work").iterdir())  # no runs/ written anywhere


def test_a_name_cannot_leave_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = run(tmp_path, capsys, GOOD.replace('"x"', '"a..b"') +
                    '[options]\npipelines = ["E0"]\nmax_test = 10\nn_resamples = 200\n'
                    '[conditions]\ndirections = ["pro_male"]\n', "--quiet", "--no-report")
    assert code == 0, err  # dots inside a name are fine: it stays one directory under runs/
    assert (tmp_path / "runs" / "a..b-paper" / "run.sqlite").is_file()


def test_a_prompt_override_that_is_a_directory_is_named(tmp_path, capsys):
    (tmp_path / "mine" / "amplification").mkdir(parents=True)
    code, err = run(tmp_path, capsys, GOOD + '[nodes.prediction]\nprompt = "mine"\n',
                    "--out", str(tmp_path / "o"))
    assert code == 2 and err.count("\n") == 1, err
    assert "[nodes.prediction] prompt: mine is a directory" in err and "prompt_overrides" in err
    (tmp_path / "file.toml").write_text('slots = []\nuser = "hi"\n')
    code, err = run(tmp_path, capsys, 'prompt_overrides = ["file.toml"]\n' + GOOD,
                    "--out", str(tmp_path / "o"))
    assert code == 2 and "prompt_overrides:" in err and "is a file" in err, err
    assert not (tmp_path / "o").exists()


def test_protocol_default_exposure_template_and_spec_relative_option_paths(tmp_path):
    """A roleplay spec that names no exposure template gets roleplay's own (its directions fill
    a 'stance' slot that the generic template lacks); a labels path is relative to the spec."""
    from biaslab.experiments.plan import make_plan
    from biaslab.experiments.spec import load_spec

    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "human.csv").write_text("qid,sample,label\n")
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text('name = "x"\nprotocol = "roleplay"\nmodels = ["scripted:roleplay-synthetic"]\n'
                         '[options]\nattributes = ["age"]\nper_stratum = 1\n'
                         'human_labels = "labels/human.csv"\n')
    spec = load_spec(spec_path)
    assert spec.options["human_labels"] == str(tmp_path / "labels" / "human.csv")
    plan = make_plan(spec)
    assert plan.exposure_template == "roleplay/exposure"
    exposed = [c for conds in plan.conditions.values() for c in conds if c.exposures]
    assert exposed and all(e.template == "roleplay/exposure" for c in exposed for e in c.exposures)
