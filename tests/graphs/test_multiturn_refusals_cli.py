"""Refusals as hosted models write them, through `biaslab run` and `biaslab report` (issue 44):
a scripted target answers every turn with a reply from the labelled table (typographic
apostrophes and invisible characters included); `tables/turns.csv` must flag each one as the
table labels it, and the summary's refusal share must be the mean of those flags. The same
run checks the coherence interval on its own scale: the scripted rater gives every dialogue
a 4, so the interval is the degenerate [4, 4] and says so."""

import hashlib

import numpy as np
import pandas as pd
import pytest

from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
from biaslab.evaluators.multiturn_intervals import RATING_CI_DEGENERATE
from biaslab.graphs import multiturn_synthetic as syn
from support_refusals import LOOK_ALIKES, REFUSALS
from support_runs import cli, table

TABLE = {**{r: True for r in REFUSALS}, **{r: False for r in LOOK_ALIKES}}
REPLIES = list(TABLE)


def _reply(request) -> str:
    users = [m["content"] for m in request.messages if m["role"] == "user"]
    key = hashlib.sha256(("|".join(users)).encode()).digest()
    return REPLIES[int.from_bytes(key[:4], "big") % len(REPLIES)]


def _agent() -> ScriptedChatModel:
    base = syn.make_agent("never")
    return ScriptedChatModel(name_="multiturn-hosted-replies", rules=[
        *[r for r in base.rules if r.pattern != syn.TARGET_MARKER],
        Rule(syn.TARGET_MARKER, _reply)])


register_scripted("multiturn-hosted-replies", _agent)

SPEC = """
name = "refusals"
protocol = "multiturn"
models = ["scripted:multiturn-hosted-replies"]
[run]
seeds = [42]
concurrency = 8
retry_base_s = 0.0
[options]
categories = ["age", "gender", "race", "religion", "disability", "appearance"]
seeds_per_category = 3
framings = ["assessment"]
turn_caps = [10]
baselines = []
post_hoc = ["coherence"]
n_resamples = 200
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("refusals")
    (root / "spec.toml").write_text(SPEC)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASLAB_CACHE", str(root / "cache.sqlite"))
        assert cli("run", root / "spec.toml", "--out", root / "run", "--quiet", "--no-report") == 0
        assert cli("report", root / "run", "--no-figures") == 0
    return root / "run"


def test_every_reply_is_flagged_as_the_table_labels_it(run):
    turns = pd.read_csv(run / "tables" / "turns.csv", keep_default_na=False)
    turns = turns[turns["response"] != ""]
    assert len(turns) >= 100
    seen = set(turns["response"])
    assert len(seen & set(REFUSALS)) >= 20 and len(seen & set(LOOK_ALIKES)) >= 12
    wrong = [(r, f) for r, f in zip(turns["response"], turns["refusal"])
             if str(f) != str(TABLE[r])]
    assert wrong == []


def test_summary_refusal_share_is_the_mean_of_the_flags(run):
    turns = pd.read_csv(run / "tables" / "turns.csv", keep_default_na=False)
    turns = turns[turns["response"] != ""]
    per_dialogue = turns.groupby("cell_id")["response"].agg(
        lambda rs: np.mean([TABLE[r] for r in rs]))
    summary = table(run, "summary")
    assert len(summary) == 1
    assert summary["refusal"].iloc[0] == pytest.approx(per_dialogue.mean())


def test_coherence_interval_stays_on_its_scale(run):
    summary = table(run, "summary").iloc[0]
    assert summary["coherence"] == 4.0
    assert summary["coherence_ci_low"] == summary["coherence_ci_high"] == 4.0
    assert summary["coherence_ci_method"] == RATING_CI_DEGENERATE
