"""docs/compose.md's debate (a loop, repeated visits, slots as a function, a unit measured at
two nodes), written from the page's own blocks into a fresh directory and run through the
CLI; its effect is the one worked out by hand on the page, under the unit pairing rule."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from biaslab.cli import main
from biaslab.evaluators.exposure_effects import SEED_PAIRING
from biaslab.experiments.reports.generic import exposed_vs_clean
from biaslab.experiments.reports.units import unit_frame
from biaslab.graphs.registry import get_protocol
from biaslab.traces.store import RunStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "experiments" / "examples"
DOC = ROOT / "docs" / "compose.md"


def _section() -> str:
    return DOC.read_text(encoding="utf-8").split("## Loops, several nodes of one unit", 1)[1]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _section(), flags=re.S)


def test_the_docs_blocks_are_the_shipped_example():
    py = _blocks("python")[0]
    spec, moderator, judge = _blocks("toml")
    assert py == (EXAMPLE / "debate.py").read_text(encoding="utf-8")
    assert spec == (EXAMPLE / "debate.toml").read_text(encoding="utf-8")
    prompts = EXAMPLE / "prompts" / "debate"
    assert moderator == (prompts / "moderator.toml").read_text(encoding="utf-8")
    assert judge == (prompts / "judge.toml").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def debate_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("debate")
    where = root / "experiments" / "examples"
    (where / "prompts").mkdir(parents=True)
    shutil.copytree(EXAMPLE / "prompts" / "debate", where / "prompts" / "debate")
    py = _blocks("python")[0]
    spec, moderator, judge = _blocks("toml")
    (where / "debate.py").write_text(py, encoding="utf-8")
    (where / "debate.toml").write_text(spec, encoding="utf-8")
    (where / "prompts" / "debate" / "moderator.toml").write_text(moderator, encoding="utf-8")
    (where / "prompts" / "debate" / "judge.toml").write_text(judge, encoding="utf-8")
    command = _blocks("bash")[0].split()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("BIASLAB_CACHE", str(root / "cache.sqlite"))
        assert main(command[1:] + ["--quiet"]) == 0
    return root / "runs" / "debate"


def _rows(run: Path) -> pd.DataFrame:
    frame = pd.read_csv(run / "tables" / "exposed_vs_clean.csv", keep_default_na=False,
                        na_values=[""])
    return frame.set_index(["node", "field", "condition", "group"])


def test_the_hand_worked_effect_under_the_unit_pairing_rule(debate_run):
    rows = _rows(debate_run)
    approve = rows.loc[("judge", "decision=approve", "advocate_against:pro_men", "all")]
    assert (approve["pairing"], approve["n_pairs"], approve["n_seeds"]) == (
        "unit, seeds averaged", 12, 2)
    assert (approve["clean_mean"], approve["exposed_mean"], approve["diff"]) == (0.5, 0.25,
                                                                                 -0.25)
    half = stats.t.ppf(0.975, 11) * math.sqrt(2.25 / 11) / math.sqrt(12)
    assert approve["ci_low"] == pytest.approx(-0.25 - half, abs=1e-5)
    assert approve["ci_high"] == pytest.approx(-0.25 + half, abs=1e-5)
    assert round(approve["ci_low"], 3) == -0.537 and round(approve["ci_high"], 3) == 0.037
    women = rows.loc[("judge", "decision=approve", "advocate_against:pro_men", "woman")]
    assert (women["n_pairs"], women["diff"], women["note"]) == (6, -0.5, "too few pairs (n=6)")
    men = rows.loc[("judge", "decision=approve", "advocate_against:pro_men", "man")]
    assert men["diff"] == 0
    # pro_women mirrors it on the men; the moderator's lean moves as the decision does
    mirror = rows.loc[("judge", "decision=approve", "advocate_against:pro_women", "man")]
    assert mirror["diff"] == -0.5
    lean = rows.loc[("moderator", "lean=for", "advocate_against:pro_men", "all")]
    assert (lean["diff"], lean["ci_low"]) == (approve["diff"], approve["ci_low"])


def test_the_per_seed_view_claims_an_effect_the_units_do_not_support(debate_run):
    """The page's contrast: the same answers counted per seed are 24 pairs and an interval
    that excludes 0."""
    store = RunStore(debate_run, readonly=True)
    try:
        proto = get_protocol("two_round_debate")
        units = unit_frame(store, proto, None)
    finally:
        store.close()
    per_seed = exposed_vs_clean(units, proto.unit, pairing=SEED_PAIRING).set_index(
        ["node", "field", "condition", "group"])
    row = per_seed.loc[("judge", "decision=approve", "advocate_against:pro_men", "all")]
    assert row["n_pairs"] == 24 and row["pairing"] == "unit x seed"
    assert round(row["ci_low"], 3) == -0.437 and round(row["ci_high"], 3) == -0.063


def test_the_loop_visits_each_advocate_twice_as_two_calls(debate_run):
    store = RunStore(debate_run, readonly=True)
    try:
        calls = [r for r in store.iter_calls() if r.node == "advocate_for"]
    finally:
        store.close()
    per_cell: dict[str, set] = {}
    for r in calls:
        per_cell.setdefault(r.cell_id, set()).add(r.item)
    assert per_cell and all(items == {"round-0", "round-1"} for items in per_cell.values())
