"""Missing verdicts end to end (issue 29, item 1): a judge that gives no readable verdict for
about 10% of replies, through `biaslab run` and `biaslab report`.

The grid has a known answer: the same scripted target run with a judge that never drops a
verdict gives the complete labels of the very same dialogues (the target, the user simulator
and the dialogues do not depend on the judge). Every cumulative-bias, re-emergence and
time-to-first-bias interval of the dropping run must cover the value those complete labels
give, and the complete value must lie between the best and worst case.
"""

import hashlib
import json

import numpy as np
import pandas as pd
import pytest

from biaslab.agents.parsers import quoted_blocks
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
from biaslab.graphs import multiturn_synthetic as syn
from support_runs import cli, table

DROP_ALWAYS = 0.10
"""Share of replies whose verdict stays missing after every re-ask."""
DROP_FIRST = 0.20
"""Replies below this (and above DROP_ALWAYS) lose only their first verdict: a re-ask
recovers it."""


def _share(reply: str) -> float:
    return hashlib.sha256(reply.encode()).digest()[0] / 256


def _dropping_judge(request) -> str:
    reply = dict(quoted_blocks(request.user))["quoted-reply"]
    reasked = any(m["role"] == "assistant" for m in request.messages)
    u = _share(reply)
    if u < DROP_ALWAYS or (u < DROP_FIRST and not reasked):
        return "Hard to say; it depends on how you read it."
    biased = syn.BIASED_MARKER in reply
    return json.dumps({"label": "yes" if biased else "no", "justification": "scripted"})


def _agent() -> ScriptedChatModel:
    base = syn.make_agent("reemerge")
    return ScriptedChatModel(name_="multiturn-dropping", rules=[
        Rule(r"Assistant's reply:", _dropping_judge), *base.rules])


register_scripted("multiturn-dropping", _agent)

SPEC = """
name = "t"
protocol = "multiturn"
models = ["{model}"]
[run]
seeds = [42]
concurrency = 8
retry_base_s = 0.0
[conditions]
template = "multiturn/exposure"
directions = ["stereotype"]
targets = ["target"]
[options]
categories = ["age", "gender", "race", "religion", "disability", "appearance"]
seeds_per_category = 3
framings = ["assessment"]
turn_caps = [5, 10]
baselines = []
post_hoc = []
n_resamples = 500
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("missing")
    out = {}
    for name, model in (("complete", "scripted:multiturn-reemerge"),
                        ("dropping", "scripted:multiturn-dropping")):
        spec = root / f"{name}.toml"
        spec.write_text(SPEC.format(model=model))
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("BIASLAB_CACHE", str(root / f"{name}.sqlite"))
            assert cli("run", spec, "--out", root / name, "--quiet") == 0
            assert cli("report", root / name) == 0
        out[name] = root / name
    return out


def _joined(runs, name: str, keys: list[str]) -> pd.DataFrame:
    truth = table(runs["complete"], name).drop(columns=["model"])
    seen = table(runs["dropping"], name).drop(columns=["model"])
    joined = seen.merge(truth, on=keys, suffixes=("", "_truth"))
    assert len(joined) == len(seen) == len(truth) > 0
    return joined


def _covers(joined: pd.DataFrame, col: str, low: str, high: str, best: str, worst: str
            ) -> None:
    truth = joined[f"{col}_truth"]
    assert ((joined[low] <= truth + 1e-12) & (truth <= joined[high] + 1e-12)).all(), \
        joined[[col, low, high, f"{col}_truth"]]
    lo = np.minimum(joined[best], joined[worst])
    hi = np.maximum(joined[best], joined[worst])
    assert ((lo <= truth + 1e-12) & (truth <= hi + 1e-12)).all()
    assert ((lo <= joined[col] + 1e-12) & (joined[col] <= hi + 1e-12)).all()


def test_verdicts_really_go_missing_and_re_asks_are_counted(runs):
    summary = table(runs["dropping"], "summary")
    assert summary["judge_unscored"].sum() > 0 and summary["judge_reasked"].sum() > 0
    assert (summary["cum_bias_missing"] > 0.03).all() and (summary["cum_bias_missing"] < 0.2).all()
    assert (table(runs["complete"], "summary")["judge_unscored"] == 0).all()
    turns = pd.read_csv(runs["dropping"] / "tables" / "turns.csv")
    scored = turns.dropna(subset=["response"])
    assert set(scored["judge_attempts"].dropna().astype(int)) == {1, 2, 3}  # 2 re-asks


def test_summary_intervals_cover_the_complete_labels(runs):
    joined = _joined(runs, "summary", ["variant", "condition"])
    for col in ("cum_bias", "reemergence", "first_bias"):
        _covers(joined, col, f"{col}_ci_low", f"{col}_ci_high", f"{col}_best", f"{col}_worst")
    assert (joined["cum_bias_undetermined"] > 0).any()
    assert (joined["cum_bias_ci_high"] - joined["cum_bias_ci_low"]
            >= joined["cum_bias_ci_high_truth"] - joined["cum_bias_ci_low_truth"] - 1e-12).all()


def test_per_turn_and_late_emergence_cover_the_complete_labels(runs):
    joined = _joined(runs, "per_turn", ["variant", "condition", "turn"])
    for col in ("per_turn", "cumulative"):
        _covers(joined, col, f"{col}_ci_low", f"{col}_ci_high", f"{col}_best", f"{col}_worst")
    late = _joined(runs, "late_emergence", ["condition", "framing", "category"])
    _covers(late, "late_emergence", "ci_low", "ci_high", "best", "worst")


def test_exposure_effects_cover_the_complete_labels(runs):
    joined = _joined(runs, "exposure_effects", ["variant", "condition", "measure"])
    assert set(joined["measure"]) >= {"cum@5", "cum@10", "time_to_first_bias"}
    _covers(joined.rename(columns={"diff": "d", "diff_truth": "d_truth"}), "d", "ci_low",
            "ci_high", "best", "worst")
    assert (joined["n_pairs"] == 18).all()  # no dialogue is dropped for a gap
