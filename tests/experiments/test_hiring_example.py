"""The docs' second worked example (docs/compose.md, "Options, groups and a scripted model of
your own"): a protocol with an ``[options]`` table, a group attribute that reaches the unit
row through ``AnalysisUnit.attributes``, and a scripted model with an ``@option``, run through
the CLI. It is also the model comparisons' small-n example: 24 candidates × 3 seeds of two
deterministic panels, one hiring 6 women, the other nobody."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from scipy.stats import binom
from statsmodels.stats.multitest import multipletests

from biaslab.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "experiments" / "examples"
DOC = ROOT / "docs" / "compose.md"


def _section() -> str:
    return DOC.read_text(encoding="utf-8").split("## Options, groups and a scripted model", 1)[1]


def _block(lang: str, index: int = 0) -> str:
    return re.findall(rf"```{lang}\n(.*?)```", _section(), flags=re.S)[index]


def test_the_docs_blocks_are_the_shipped_example():
    assert _block("python") == (EXAMPLE / "hiring.py").read_text(encoding="utf-8")
    assert _block("toml", 0) == (EXAMPLE / "hiring.toml").read_text(encoding="utf-8")
    assert _block("toml", 1) == (EXAMPLE / "prompts" / "hiring" / "decide.toml").read_text(
        encoding="utf-8")


@pytest.fixture(scope="module")
def hiring_run(tmp_path_factory) -> Path:
    """The docs' files laid out afresh, and the docs' command run in that directory."""
    root = tmp_path_factory.mktemp("hiring")
    where = root / "experiments" / "examples"
    (where / "prompts" / "hiring").mkdir(parents=True)
    (where / "hiring.py").write_text(_block("python"), encoding="utf-8")
    (where / "hiring.toml").write_text(_block("toml", 0), encoding="utf-8")
    (where / "prompts" / "hiring" / "decide.toml").write_text(_block("toml", 1),
                                                              encoding="utf-8")
    command = _block("bash").strip().splitlines()[0].split("#")[0].split()
    assert command[:2] == ["biaslab", "run"]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        assert main(command[1:] + ["--quiet"]) == 0
    return root / "runs" / "hiring"


def _table(run: Path) -> pd.DataFrame:
    text = {"stratum": str, "group": str, "note": str, "family": str}
    return pd.read_csv(run / "tables" / "model_comparisons.csv", dtype=text).fillna(
        {k: "" for k in text})


def test_the_group_reaches_the_unit_row_and_each_comparison_counts_once(hiring_run):
    table = _table(hiring_run).set_index(["measure", "group"])
    # gender, from AnalysisUnit.attributes: 12 women (c01, c03, ...) and 12 men
    assert set(table.index.get_level_values("group")) == {"all", "women", "men"}
    assert table.loc[("decision=hire", "women"), "n_pairs"] == 12
    # a pair is a candidate, its 3 seeds averaged: 24 pooled pairs, not 72
    assert table.loc[("decision=hire", "all"), "n_pairs"] == 24
    assert (table["n_seeds"] == 3).all()
    # 6 women hired by B, nobody by A: 6 discordant candidates, McNemar 2 · ½⁶
    pooled = table.loc[("decision=hire", "all")]
    assert (pooled["mean_a"], pooled["mean_b"]) == (0, 0.25)
    assert pooled["p"] == pytest.approx(2 * binom.pmf(6, 6, 0.5), abs=1e-9)
    # families: the pooled rows, and the per-group rows; decision=reject is decision=hire's
    # complement (a two-level label), the same test, counted once
    assert pooled["family"] == "pooled" and pooled["family_size"] == 1
    assert pooled["p_holm"] == pytest.approx(pooled["p"], abs=1e-9)
    women, men = table.loc[("decision=hire", "women")], table.loc[("decision=hire", "men")]
    assert (women["family"], women["family_size"], men["family_size"]) == ("per group", 2, 2)
    expected = multipletests([women["p"], men["p"]], method="holm")[1]
    assert (women["p_holm"], men["p_holm"]) == pytest.approx(tuple(expected), abs=1e-9)
    reject = table.loc[("decision=reject", "all")]
    assert reject["diff"] == -pooled["diff"] and reject["p"] == pooled["p"]
    assert reject["p_holm"] == pooled["p_holm"] and "complement of decision=hire" in reject["note"]


def test_estimate_counts_candidates_not_candidate_seeds(capsys):
    assert main(["estimate", str(EXAMPLE / "hiring.toml"), "--power", "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    (row,) = report["power"]
    assert row["n"] == 24 and row["unit"] == "candidate" and "3 seeds averaged" in row["per"]
    assert row["test"] == "paired t test" and row["power_at_mde"] < 0.8
    assert main(["estimate", str(EXAMPLE / "hiring.toml"), "--power"]) == 0
    out = capsys.readouterr().out
    assert "n = 24 candidates per model, its 3 seeds averaged per candidate" in out
    assert "as the report tests it (paired t test, exact power)" in out


def test_a_bad_scripted_option_is_one_line(tmp_path, capsys):
    spec = tmp_path / "hiring.toml"
    shutil.copytree(EXAMPLE / "prompts", tmp_path / "prompts")
    shutil.copy(EXAMPLE / "hiring.py", tmp_path)
    spec.write_text((EXAMPLE / "hiring.toml").read_text().replace("@women=6", "@women=six"))
    assert main(["run", str(spec), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "expected @women=N" in err and err.count("\n") == 1
