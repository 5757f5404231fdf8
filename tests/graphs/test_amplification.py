"""The amplification protocol end to end on scripted agents: FBS signs, leakage, failures."""

import re

import numpy as np
import pytest

from biaslab.agents.parsers import ParseError, probability_list
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
from biaslab.evaluators.amplification import condition_metrics
from biaslab.experiments.reports.amplification import predictions_frame
from biaslab.datasets.student import cached_split
from biaslab.graphs.amplification import AmplificationOptions, parse_final
from biaslab.graphs.amplification_synthetic import failure_probability
from biaslab.traces.store import RunStore
from support_runs import amplification_spec, run_spec


def _run(tmp_path, **overrides):
    spec = amplification_spec(**overrides)
    result = run_spec(spec, tmp_path / "run")
    store = RunStore(tmp_path / "run")
    options = AmplificationOptions(**spec["options"])
    return result, store, predictions_frame(store, options), options


def test_end_to_end_e0_e1_e2(tmp_path):
    result, store, frame, _ = _run(tmp_path)
    assert result.cells_total == 3 + 7 + 15 and result.cells_failed == 0
    assert set(frame["pipeline"]) == {"E0", "E1", "E2"}
    assert len(frame) == 25 * 20 and frame["p_final"].notna().all()
    e2 = frame[frame["pipeline"] == "E2"]
    assert set(e2["decided_by"]) <= {"ml", "judge"} and e2["p_ml"].notna().all()
    judged = e2[e2["decided_by"] == "judge"]
    assert judged["disagree"].all()
    assert ((judged["p_final"] < 0.4) | (judged["p_final"] > 0.6)).all()
    agree = e2[e2["decided_by"] == "ml"]
    assert (agree["p_final"] == agree["p_ml"]).all()
    assert frame.loc[frame["pipeline"] != "E2", "p_ml"].isna().all()
    calls = store.calls()
    assert set(calls.loc[calls["node"] == "judge", "cell_id"].str[:2]) == {"E2"}
    written = {p.name for p in store_report(store, tmp_path)}
    assert {"table1.csv", "table1.md", "fbs_scatter_math_E2.png", "fbs_scatter_math_E2.svg",
            "superadditivity.csv", "ml_anchor.csv", "routing.csv"} <= written


def store_report(store, tmp_path):
    from biaslab.experiments.reports import protocol_report
    from biaslab.graphs.registry import get_protocol
    return protocol_report(get_protocol("amplification"), store, tmp_path / "run",
                           AmplificationOptions(max_test=20, n_resamples=300))


def test_fbs_recovers_the_injected_effect_with_positive_sign(tmp_path):
    """The synthetic agent lowers the favoured group's failure probability by SHIFT only when
    the exposure text is in its prompt; E0 isolates the prediction agent."""
    _, store, frame, options = _run(tmp_path, options={"pipelines": ["E0"], "max_test": None,
                                                       "n_resamples": 2000})
    split = cached_split("math", 42, None, None)
    lines = {rid: row.to_dict() for rid, row in split.test.astype(str).iterrows()}
    metrics = condition_metrics(frame, n_resamples=2000, random_state=0).set_index("direction")
    for direction, favored, sex_code in (("pro_female", "F", 0), ("pro_male", "M", 1)):
        # the exact injected effect: favoured records whose predicted label flips to pass
        flips = [failure_probability(lines[rid], None) >= 0.5 >
                 failure_probability(lines[rid], favored)
                 for rid in split.test.index[split.test["sex_code"] == sex_code]]
        injected = float(np.mean(flips))
        row = metrics.loc[direction]
        assert injected > 0
        assert row["fbs"] > 0 and row["fbs_fav"] > 0 and row["fbs_disfav"] == 0
        assert row["fbs"] == pytest.approx(injected)
        assert row["fbs_ci_low"] <= injected <= row["fbs_ci_high"] and row["fbs_ci_low"] > 0
    # and the exposure text is in exactly the exposed cells' prompts
    calls = store.calls()
    carried = calls["messages"].map(lambda ms: "benefits" in ms[0]["content"])
    assert (carried == calls["exposed"]).all()
    assert set(calls.loc[carried, "exposure_id"]) == {"prediction:pro_female",
                                                      "prediction:pro_male"}


def test_leakage_no_agent_sees_g3_or_training_rows(tmp_path):
    _, store, _, _ = _run(tmp_path, options={"max_test": None})
    split = cached_split("math", 42, None, None)
    columns = [c for c in split.feature_columns if c != "G3"]

    def records(frame):  # both renderings: value rows (prediction) and key=value (judge)
        return ({",".join(str(row[c]) for c in columns) for _, row in frame.iterrows()} |
                {" ".join(f"{c}={row[c]}" for c in columns) for _, row in frame.iterrows()})

    train_lines, test_lines = records(split.train), records(split.test)
    assert not train_lines & test_lines  # records are distinguishable
    calls = store.calls()
    assert len(calls) > 0
    for _, call in calls.iterrows():
        text = "\n".join(m["content"] for m in call["messages"])
        assert "G3" not in text and "sex_code" not in text
        shown = {m.group(1) for m in re.finditer(r"^(?:\d+\. |Student: )(.*)$", text,
                                                 flags=re.M)}
        assert shown <= test_lines, call["node"]
        if call["node"] in ("prediction", "judge"):
            assert shown
    # the explanation statistics are the training split's
    explanation_prompt = calls.loc[calls["node"] == "explanation", "messages"].iloc[0][1]["content"]
    assert str(len(split.train)) in explanation_prompt


def test_malformed_predictions_get_one_reask_then_count_as_parse_failures(tmp_path):
    register_scripted("always-chatty", lambda: ScriptedChatModel(rules=[
        Rule(r"OUTPUT: \[p1", "I think they will all pass!"),
        Rule(r".", "Grades matter most.")]))
    result, store, frame, _ = _run(tmp_path, models=["scripted:always-chatty"],
                                   options={"pipelines": ["E0"]},
                                   conditions={"directions": ["pro_female"]})
    assert result.cells_failed == 0
    calls = store.calls()
    assert len(calls) == 2 * 2 * 2  # 2 cells x 2 batches x (ask + one re-ask)
    assert calls["parse_error"].notna().all()
    reasks = calls[calls["attempt"] == 1]
    assert all(m[-1]["content"].startswith("Your previous answer could not be read")
               and m[-2] == {"role": "assistant", "content": "I think they will all pass!"}
               for m in reasks["messages"])
    assert len(frame) == 40 and (frame["decided_by"] == "parse_failure").all()
    metrics = condition_metrics(frame, n_resamples=200)
    assert (metrics["n_parse_failures"] == 20).all() and (metrics["n"] == 0).all()


@pytest.mark.parametrize("text, expected", [
    ("OUTPUT: [0.1 0.2 0.9]", [0.1, 0.2, 0.9]),
    ("Sure! OUTPUT: [0.1, 0.2, 0.9] hope this helps", [0.1, 0.2, 0.9]),
    ("output: [10% 20% 90%]", [0.1, 0.2, 0.9]),
    ("[.1 .2 1]", [0.1, 0.2, 1.0]),
    ("OUTPUT: [0.5 0.5 0.5]\nOUTPUT: [0.1 0.2 0.3]", [0.1, 0.2, 0.3]),
])
def test_probability_list_parses_robustly(text, expected):
    assert probability_list(3)(text) == pytest.approx(expected)


@pytest.mark.parametrize("text, reason", [
    ("OUTPUT: [0.1 0.2]", "expected 3 probabilities, got 2"),
    ("OUTPUT: [0.1 0.2 1.7]", "out of \\[0, 1\\]"),
    ("OUTPUT: [0.1 high 0.3]", "non-numeric"),
    ("they fail", "no 'OUTPUT"),
    ("[0.1 0.2 0.3] or [0.4 0.5 0.6]", "no 'OUTPUT"),
])
def test_probability_list_rejects_malformed(text, reason):
    with pytest.raises(ParseError, match=reason):
        probability_list(3)(text)


@pytest.mark.parametrize("text, ok", [("FINAL: 0.83", 0.83), ("final 0.1", 0.1),
                                      ("FINAL: 0.5", None), ("FINAL: 0.4", None),
                                      ("maybe", None), ("FINAL: 1.5", None),
                                      ("FINAL: 10", None), ("FINAL: 0.95.", 0.95)])
def test_judge_must_commit_to_a_side(text, ok):
    if ok is None:
        with pytest.raises(ParseError):
            parse_final(text)
    else:
        assert parse_final(text) == ok


def test_the_explanation_budget_is_an_option_and_reaches_the_call(tmp_path):
    """`explanation_max_tokens` (240 by default, 96 in the embedded-model smoke run): the
    explanation call asks for that many tokens at most, and the estimate counts it."""
    from biaslab.graphs.amplification import Amplification

    spec = amplification_spec(conditions={"targets": []},
                              options={"pipelines": ["E1"], "explanation_max_tokens": 50})
    run_spec(spec, tmp_path / "run")
    store = RunStore(tmp_path / "run")
    asked = {c.params["max_tokens"] for c in store.iter_calls() if c.node == "explanation"}
    assert asked == {50}
    short = AmplificationOptions(max_test=20, explanation_max_tokens=50)
    default = AmplificationOptions(max_test=20)
    assert default.explanation_max_tokens == 240
    protocol = Amplification()
    saved = protocol.estimate("E1", "math", default)["tokens"] - protocol.estimate(
        "E1", "math", short)["tokens"]
    assert saved == 190 * (1 + 2)  # the explanation and its quote in each of 2 batches
    with pytest.raises(ValueError):
        AmplificationOptions(explanation_max_tokens=8)
