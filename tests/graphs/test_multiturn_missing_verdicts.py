"""Missing verdicts end to end (issue 29, item 1; issue 44): judges that give no readable
verdict for about 10%, 30% or 99% of replies at random, or for every biased reply and no
other (informative missingness), through `biaslab run` and `biaslab report`.

The grid has a known answer: the same scripted target run with a judge that never drops a
verdict gives the complete labels of the very same dialogues (the target, the user simulator
and the dialogues do not depend on the judge). Every cumulative-bias, re-emergence and
time-to-first-bias interval of the dropping run must cover the value those complete labels
give, and the complete value must lie between the best and worst case. A figure printed as a
point must lie within `mm.POINT_MAX_WIDTH` of the scale of that value (issue 44: at 30%
missing a cumulative bias of 1.00 was printed against a true 0.567, and under informative
missingness an exposure effect of +0.094 against a true 0); otherwise only its bounds.
"""

import hashlib
import json
import re

import numpy as np
import pandas as pd
import pytest

from biaslab.agents.parsers import quoted_blocks
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
from biaslab.evaluators import multiturn_missing as mm
from biaslab.experiments.reports.multiturn import headline
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


def _lossy_judge(rate: float | None):
    """A judge that never gives a verdict for a share `rate` of the replies (by a hash of
    the reply), or, with `rate` None, for every biased reply and no other."""
    def judge(request) -> str:
        reply = dict(quoted_blocks(request.user))["quoted-reply"]
        biased = syn.BIASED_MARKER in reply
        lost = biased if rate is None else _share(reply + "|lossy") < rate
        if lost:
            return "Hard to say; it depends on how you read it."
        return json.dumps({"label": "yes" if biased else "no", "justification": "scripted"})
    return judge


LOSSY = {"random-30": 0.30, "random-99": 0.99, "informative": None}
for _name, _rate in LOSSY.items():
    register_scripted(f"multiturn-lossy-{_name}", lambda r=_rate, n=_name: ScriptedChatModel(
        name_=f"multiturn-lossy-{n}", rules=[Rule(r"Assistant's reply:", _lossy_judge(r)),
                                            *syn.make_agent("reemerge").rules]))

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
                        ("dropping", "scripted:multiturn-dropping"),
                        *[(n, f"scripted:multiturn-lossy-{n}") for n in LOSSY]):
        spec = root / f"{name}.toml"
        spec.write_text(SPEC.format(model=model))
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("BIASLAB_CACHE", str(root / f"{name}.sqlite"))
            assert cli("run", spec, "--out", root / name, "--quiet", "--no-report") == 0
            assert cli("report", root / name, "--no-figures") == 0
        out[name] = root / name
    return out


def _joined(runs, name: str, keys: list[str], run: str = "dropping") -> pd.DataFrame:
    truth = table(runs["complete"], name).drop(columns=["model"])
    seen = table(runs[run], name).drop(columns=["model"])
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
    _printed_only_when_known(joined, col, best, worst)


def _scale(joined: pd.DataFrame, col: str) -> np.ndarray:
    """The measure's scale: 1 for shares and their differences, the cap for turns."""
    if "measure" in joined:
        turns = (joined["measure"] == "time_to_first_bias").to_numpy()
    else:
        turns = np.full(len(joined), col.startswith("first_bias"))
    caps = (joined["variant"].map(lambda v: int(re.search(r"-t(\d+)$", v).group(1)))
            .to_numpy(float) if "variant" in joined else np.ones(len(joined)))
    return np.where(turns, caps, 1.0)


def _printed_only_when_known(joined, col, best, worst) -> None:
    """A printed point is within `mm.POINT_MAX_WIDTH` of the scale of the complete-label
    value, and is printed exactly when the bounds are that narrow."""
    truth, shown = joined[f"{col}_truth"], joined[col]
    scale = _scale(joined, col)
    width = (joined[worst] - joined[best]).abs()
    printed = shown.notna().to_numpy()
    assert (printed == (width.to_numpy() <= mm.POINT_MAX_WIDTH * scale + 1e-12)).all()
    off = (shown - truth).abs().to_numpy()
    assert (off[printed] <= mm.POINT_MAX_WIDTH * scale[printed] + 1e-12).all(), \
        joined.loc[printed, [col, f"{col}_truth"]]


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


@pytest.mark.parametrize("run", ["dropping", *LOSSY])
def test_every_table_prints_only_what_its_bounds_support(runs, run):
    """Random 10%, 30%, 99% and informative missingness: in every table, a printed figure is
    within `mm.POINT_MAX_WIDTH` of the complete-label value, the rest show bounds, and every
    interval covers the complete-label value."""
    summary = _joined(runs, "summary", ["variant", "condition"], run)
    for col in ("cum_bias", "reemergence", "first_bias"):
        _covers(summary, col, f"{col}_ci_low", f"{col}_ci_high", f"{col}_best", f"{col}_worst")
        assert set(summary[f"{col}_shown"]) <= {"point", "bounds"}
    per_turn = _joined(runs, "per_turn", ["variant", "condition", "turn"], run)
    for col in ("per_turn", "cumulative"):
        _covers(per_turn, col, f"{col}_ci_low", f"{col}_ci_high", f"{col}_best", f"{col}_worst")
    by_cat = _joined(runs, "by_category", ["variant", "condition", "category"], run)
    _covers(by_cat, "cum_bias", "cum_bias_ci_low", "cum_bias_ci_high", "cum_bias_best",
            "cum_bias_worst")
    late = _joined(runs, "late_emergence", ["condition", "framing", "category"], run)
    _covers(late, "late_emergence", "ci_low", "ci_high", "best", "worst")
    for name, keys in (("exposure_effects", ["variant", "condition", "measure"]),
                       ("exposure_by_turn", ["variant", "condition", "measure", "turn"])):
        effects = _joined(runs, name, keys, run).rename(
            columns={"diff": "d", "diff_truth": "d_truth"})
        _covers(effects, "d", "ci_low", "ci_high", "best", "worst")
    average = _joined(runs, "late_emergence_average", ["condition", "framing", "category"],
                      run)
    truth = average["late_emergence_truth"]
    assert ((average["late_emergence_best"] <= truth + 1e-12)
            & (truth <= average["late_emergence_worst"] + 1e-12)).all()
    _printed_only_when_known(average, "late_emergence", "late_emergence_best",
                             "late_emergence_worst")
    assert (average["late_emergence_missing"] > 0).any()


def test_thirty_percent_missing_prints_bounds_not_a_filled_point(runs):
    summary = _joined(runs, "summary", ["variant", "condition"], "random-30")
    assert (summary["cum_bias_missing"] > 0.2).all()
    assert (summary["cum_bias_shown"] == "bounds").all() and summary["cum_bias"].isna().all()
    shown = headline(runs["random-30"])
    assert shown["cum_bias"].str.startswith("between ").all()


def test_ninety_nine_percent_missing_prints_no_reemergence(runs):
    summary = _joined(runs, "summary", ["variant", "condition"], "random-99")
    for col in ("cum_bias", "reemergence", "first_bias"):
        assert summary[col].isna().all() and (summary[f"{col}_shown"] == "bounds").all()
    assert (summary["reemergence_best"] == 0).all()


def test_informative_missingness_prints_no_unsupported_effect(runs):
    """Only biased replies lose their verdicts: every exposure effect printed as a point is
    within `mm.POINT_MAX_WIDTH` of the truth (checked above); here, that such rows exist
    only where the bounds are that narrow, and that the losses really fall on biased turns."""
    effects = _joined(runs, "exposure_effects", ["variant", "condition", "measure"],
                      "informative")
    assert (effects["missing"] > 0).any()
    printed = effects[effects["diff"].notna()]
    assert ((printed["worst"] - printed["best"]).abs() <= mm.POINT_MAX_WIDTH * 10 + 1e-12).all()
    turns = pd.read_csv(runs["informative"] / "tables" / "turns.csv")
    lost = turns[turns["response"].notna() & turns["biased"].isna()]
    assert len(lost) > 0 and lost["response"].str.contains(syn.BIASED_MARKER).all()
    labelled = turns[turns["biased"].notna()]
    assert not labelled["biased"].astype(bool).any()
