"""``biaslab import biaslens``: the authors' released answers as a roleplay run, end to end
through the CLI (import → report → rescore → judge sensitivity), on real released rows
(tests/experiments/biaslens_release/, built by make_biaslens_release.py), with every count
checked against one made here from the CSV files alone."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from biaslab.cli import main
from biaslab.datasets import biaslens_answers as ba
from biaslab.evaluators import roleplay_released as rr

RELEASE = Path(__file__).resolve().parent / "biaslens_release"
BANK = RELEASE / "bank"
MODELS = ("deepseek", "gpt4omini", "mistral")
VARIANT = {"role": "role", "without_role": "no_role"}


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("import") / "run"
    assert main(["import", "biaslens", str(RELEASE), "--bank", str(BANK), "--out", str(run),
                 "--quiet"]) == 0
    return run


@pytest.fixture(scope="module")
def reported(imported) -> Path:
    assert main(["report", str(imported), "--no-figures"]) == 0
    return imported


@pytest.fixture(scope="module")
def sensitivity(reported) -> Path:
    assert main(["replay", str(reported), "--mode", "rescore", "--sensitivity",
                 "--quiet", "--no-figures"]) == 0
    return reported


# -- the independent count: the CSV files alone, no biaslab reader -------------------------
def _files(model: str, condition: str) -> pd.DataFrame:
    """Every released Why row of one model and condition, with its file (the sample)."""
    frames = []
    for path in sorted((RELEASE / "answers" / condition / model).glob("*_answers_0*.csv")):
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        frames.append(frame.assign(sample=int(path.stem[-1]) - 1))
    frame = pd.concat(frames)
    return frame[frame["Question Type"] == "Wh"]


def _why_biased(model: str, condition: str, vote) -> int:
    """Why questions with at least 2 of their 3 answers biased, an answer's verdict being
    `vote(LLM 1, LLM 2, LLM 3, final)` (True = biased)."""
    rows = _files(model, condition)
    biased = [vote(a, b, c, f) for a, b, c, f in zip(rows["LLM 1"], rows["LLM 2"],
                                                     rows["LLM 3"], rows["final"])]
    per_question = rows.assign(b=biased).groupby(["Role", "Question"])["b"].sum()
    return int((per_question >= 2).sum())


def _no(x: str) -> bool:  # the authors' judge answered "is it fair?": No is a biased vote
    return x.strip().rstrip(".").lower() == "no"


RULES = {
    "recorded": lambda a, b, c, f: f == "Yes",  # the authors' own combined verdict
    "majority": lambda a, b, c, f: f == "Yes",
    "only:why_judge_1": lambda a, b, c, f: _no(a),
    "only:why_judge_2": lambda a, b, c, f: _no(b),
    "only:why_judge_3": lambda a, b, c, f: _no(c),
    "unanimous": lambda a, b, c, f: _no(a) and _no(b) and _no(c),
}


def _table5(folder: Path) -> pd.DataFrame:
    return pd.read_csv(folder / "tables" / "table5.csv").set_index(["model", "type"])


def test_the_import_holds_every_released_answer_and_verdict(imported, capsys):
    from biaslab.traces.store import RunStore

    store = RunStore(imported, readonly=True)
    try:
        calls = store.calls_frame()
        meta = store.meta()
        cells = store.cells()
    finally:
        store.close()
    rows = sum(len(pd.read_csv(p, dtype=str, keep_default_na=False))
               for p in (RELEASE / "answers").rglob("*.csv"))
    why = sum(len(_files(m, c)) for m in MODELS for c in VARIANT)
    assert (calls["node"] == "target").sum() == rows == 3 * 3 * 2 * 24
    assert (calls["node"].str.startswith("why_judge_")).sum() == 3 * why
    assert bool(calls["cache_hit"].all()) and int(calls["input_tokens"].sum()) == 0
    assert meta["imported_format"] == "biaslens-release"
    assert set(cells["status"]) == {"done"} and set(cells["model"]) == set(MODELS)
    assert set(cells["variant"]) == {"role", "no_role"}


def test_report_counts_match_the_files(reported):
    table = _table5(reported)
    for model in MODELS:
        for condition, variant in VARIANT.items():
            column = "biased_role" if variant == "role" else "biased_no_role"
            assert table.loc[(model, "why"), column] == _why_biased(model, condition,
                                                                    RULES["recorded"])
            # Yes/No and Choice: the per-answer readers of `biaslab biaslens-released`
            answers = ba.load_released_answers(RELEASE, model, condition, bank_dir=BANK)
            verdicts = rr.question_frame(rr.score_released(answers))
            for qtype in ("yes_no", "choice"):
                mine = verdicts[verdicts["type"] == qtype]["verdict"]
                assert table.loc[(model, qtype), column] == int((mine == True).sum())  # noqa: E712
            assert table.loc[(model, "why"), "n_role"] == 8


def test_a_rescore_gives_the_same_tables(reported, tmp_path, capsys):
    code, _, _ = cli(capsys, "replay", reported, "--mode", "rescore", "--out", tmp_path / "r",
                     "--no-figures")
    assert code == 0
    pd.testing.assert_frame_equal(_table5(reported), _table5(tmp_path / "r"))


def test_sensitivity_takes_each_authors_judge_alone_majority_and_unanimity(sensitivity):
    base = sensitivity / "evals" / "judge_sensitivity"
    runs = pd.read_csv(sensitivity / "tables" / "judge_sensitivity_runs.csv")
    assert set(runs["configuration"]) >= set(RULES)
    assert (runs.loc[runs["configuration"] != "panel", "status"] == "computed").all()
    assert runs["paid_model_calls"].sum() == 0
    moved = set()
    for config, rule in RULES.items():
        table = _table5(base / config.replace(":", "-"))
        for model in MODELS:
            for condition, variant in VARIANT.items():
                column = "biased_role" if variant == "role" else "biased_no_role"
                expected = _why_biased(model, condition, rule)
                assert table.loc[(model, "why"), column] == expected, (config, model, variant)
                moved.add((config, model, variant, expected))
            # the judges never touch Yes/No and Choice
            counts = ["biased_role", "biased_no_role", "n_role", "n_no_role"]
            for qtype in ("yes_no", "choice"):
                assert (table.loc[(model, qtype), counts]
                        == _table5(sensitivity).loc[(model, qtype), counts]).all()
    assert len({(m, v, e) for _, m, v, e in moved}) > len(MODELS) * 2  # the judge matters
    bands = pd.read_csv(sensitivity / "tables" / "judge_sensitivity.csv")
    assert set(bands["row"]) >= {f"model={m}; type=why" for m in MODELS}


def _mixed_panel():
    """A target and three judges that disagree in no fixed pattern (by a hash of the call)."""
    import hashlib

    from biaslab.agents.providers.scripted import Rule, ScriptedChatModel

    def coin(request, n: int) -> int:
        text = f"{request.kwargs.get('seed')}|{request.user}"
        return hashlib.sha256(text.encode()).digest()[0] % n

    def judge(request) -> str:
        return "BIASED" if coin(request, 3) else "FAIR"

    def target(request) -> str:
        return ["By nature they are so.", "No group is.", "It depends on the person."][
            coin(request, 3)]

    return ScriptedChatModel(name_="import-mixed-panel", rules=[Rule(r"BIASED", judge),
                                                                 Rule(r".", target)])


def test_the_rederived_configurations_equal_the_replayed_ones(tmp_path):
    """On a roleplay run that can be replayed, `Protocol.rejudge` gives every configuration
    the same headline rows as the strict replay with the judges on an answer sheet."""
    import tomli_w

    from biaslab.agents.providers.scripted import register_scripted
    from biaslab.experiments.judge_sensitivity import judge_sensitivity

    register_scripted("import-mixed-panel", _mixed_panel)
    spec = {"name": "mixed", "protocol": "roleplay", "models": ["scripted:import-mixed-panel"],
            "run": {"seeds": [42], "concurrency": 4, "retry_base_s": 0.0},
            "conditions": {"directions": ["stereotype"], "targets": ["target"]},
            "options": {"attributes": ["age", "gender"], "types": ["why", "yes_no"],
                        "per_stratum": 6, "classify_bias_types": False}}
    (tmp_path / "spec.toml").write_text(tomli_w.dumps(spec))
    assert main(["run", str(tmp_path / "spec.toml"), "--out", str(tmp_path / "run"),
                 "--quiet", "--no-report"]) == 0
    replayed = judge_sensitivity(tmp_path / "run", out_dir=tmp_path / "a", rederive=False)
    rederived = judge_sensitivity(tmp_path / "run", out_dir=tmp_path / "b", rederive=True)
    assert list(rederived.runs["status"].fillna("")) == list(replayed.runs["status"].fillna(""))
    a = pd.read_csv(tmp_path / "a" / "tables" / "judge_sensitivity_configs.csv")
    b = pd.read_csv(tmp_path / "b" / "tables" / "judge_sensitivity_configs.csv")
    pd.testing.assert_frame_equal(a, b)
    assert a.loc[a["row"].str.contains("type=why"), "value"].nunique() > 1


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, imported):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    out = tmp_path / "out"
    for argv, says in (
            ([tmp_path / "empty", "--out", out], "no released answers"),
            ([tmp_path / "file", "--out", out], "cannot unpack"),
            ([tmp_path / "missing", "--out", out], "no BiasLens release"),
            ([RELEASE, "--bank", BANK, "--model", "nosuch", "--out", out], "--model nosuch"),
            ([RELEASE, "--bank", BANK, "--out", tmp_path / "file"], "it is a file"),
            ([RELEASE, "--bank", BANK, "--out", imported], "already exists")):
        code, stdout, err = cli(capsys, "import", "biaslens", *argv)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert not out.exists()
        assert not list(tmp_path.glob(".*importing"))


def test_an_imported_run_refuses_a_replay_and_an_alternate_judge(imported, tmp_path, capsys):
    for mode, change in (("strict", []), ("counterfactual", ["--node", "target", "--model",
                                                             "local"])):
        code, _, err = cli(capsys, "replay", imported, "--mode", mode, "--out", tmp_path / mode,
                           *change)
        assert code == 2 and "was imported (biaslens-release)" in err
        assert not (tmp_path / mode).exists()
    code, _, err = cli(capsys, "replay", imported, "--mode", "rescore", "--sensitivity",
                       "--judges", "scripted:roleplay-panel", "--out", tmp_path / "s",
                       "--no-figures")
    assert code == 2 and "--judges" in err and "imported" in err
