"""Judges, k × r ensembles with ties reported, rule oracles, and judging recorded traces."""

import asyncio
import json


from biaslab.agents.ask import CallFailed
from biaslab.agents.context import Bindings, CellContext
from biaslab.agents.gateway import Gateway
from biaslab.agents.providers import ModelSpec
from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
from biaslab.evaluators.judges import judge_ensemble, regex_oracle
from biaslab.evaluators.over_traces import judge_traces
from biaslab.prompts.registry import PromptRegistry
from biaslab.traces.store import RunStore
from support_runs import amplification_spec, run_spec

LABELS = ["favors_female", "favors_male", "neutral"]


def verdict(label):
    return json.dumps({"label": label, "justification": "because"})


def fixed_judge(name, answers):
    """Answers in turn from `answers` (one per call), so repeats can disagree."""
    def factory():
        state = {"i": 0}

        def respond(request):
            answer = answers[state["i"] % len(answers)]
            state["i"] += 1
            return answer
        return ScriptedChatModel(name_=name, rules=[Rule(r".", respond)])
    register_scripted(name, factory)
    return ModelSpec(provider="scripted", model=name)


def ctx_for(model):
    return CellContext(cell_id="c", seed=7, prompts=PromptRegistry(),
                       bindings=Bindings(model=model), gateway=Gateway())


def run_ensemble(judges, repeats):
    ctx = ctx_for(judges[0])
    result = asyncio.run(judge_ensemble(ctx, "tilt", {"text": "some text"},
                                        prompt="evaluators/group_tilt", labels=LABELS,
                                        judges=judges, repeats=repeats))
    return result, ctx.calls


def test_three_judges_two_repeats_majority():
    judges = [fixed_judge("j-a", [verdict("neutral"), verdict("neutral")]),
              fixed_judge("j-b", [verdict("favors_male"), verdict("neutral")]),
              fixed_judge("j-c", [verdict("favors_male"), verdict("neutral")])]
    result, calls = run_ensemble(judges, repeats=2)
    assert result.label == "neutral" and not result.tie
    assert result.counts == {"neutral": 4, "favors_male": 2}
    assert len(result.verdicts) == 6 and len(calls) == 6
    # each repeat is its own call: distinct sample index and seed, so nothing is cached away
    assert sorted((c.model["model"], c.sample) for c in calls) == sorted(
        (j, r) for j in ("j-a", "j-b", "j-c") for r in (0, 1))
    assert len({c.seed for c in calls}) == 2 and len({c.cache_key for c in calls}) == 6


def test_a_model_listed_twice_is_two_members_not_one_cached_answer():
    judge = fixed_judge("twice", [verdict("neutral"), verdict("favors_male")])
    result, calls = run_ensemble([judge, judge], repeats=1)
    assert len(calls) == 2 and len({c.cache_key for c in calls}) == 2
    assert not any(c.cache_hit for c in calls)
    assert result.counts == {"neutral": 1, "favors_male": 1} and result.tie


def test_a_failed_judge_call_fails_the_cell_instead_of_an_unscored_vote():
    register_scripted("down-judge", lambda: ScriptedChatModel(rules=[]))  # no rule: HTTP 400
    ctx = ctx_for(ModelSpec(provider="scripted", model="down-judge"))
    try:
        asyncio.run(judge_ensemble(ctx, "tilt", {"text": "t"}, prompt="evaluators/group_tilt",
                                   labels=LABELS))
    except CallFailed as exc:
        assert "judge 'tilt' (scripted:down-judge)" in str(exc)
    else:
        raise AssertionError("a failed judge call must fail the cell")


def test_tie_is_reported_not_broken():
    judges = [fixed_judge("t-a", [verdict("favors_female")]),
              fixed_judge("t-b", [verdict("favors_male")])]
    result, _ = run_ensemble(judges, repeats=1)
    assert result.tie and result.label is None
    assert result.counts == {"favors_female": 1, "favors_male": 1}


def test_unparseable_verdicts_are_unscored_not_guessed():
    judges = [fixed_judge("u-a", ["no idea", "still no idea"]),
              fixed_judge("u-b", [verdict("neutral")]),
              fixed_judge("u-c", [verdict("maybe")])]
    result, calls = run_ensemble(judges, repeats=1)
    assert result.label == "neutral" and result.unscored == 2
    assert sum(c.parse_error is not None for c in calls) == 4  # two judges x (ask + re-ask)
    assert any("not in" in (c.parse_error or "") for c in calls)


def test_regex_oracle():
    oracle = regex_oracle([(r"\bcan(?:no|')t be determined\b", "abstain"), (r"\b(a|b)\)", "decisive")])
    assert oracle("It can't be determined from the context") == "abstain"
    assert oracle("The answer is b) the grandfather") == "decisive"
    assert oracle("I refuse") is None


def test_judging_recorded_traces_calls_only_the_judges(tmp_path):
    spec = amplification_spec(options={"pipelines": ["E1"]},
                              conditions={"directions": ["pro_male"], "targets": ["explanation"]})
    run_spec(spec, tmp_path / "run")
    before = (tmp_path / "run" / "run.sqlite").read_bytes()
    calls = {"n": 0}

    def tilt_judge():
        def respond(request):
            calls["n"] += 1
            return verdict("favors_male" if "benefit" in request.user else "neutral")
        return ScriptedChatModel(name_="tilt", rules=[Rule(r"favouritism", respond)])
    register_scripted("tilt-judge", tilt_judge)
    result = judge_traces(tmp_path / "run", node="explanation", prompt="evaluators/group_tilt",
                          judges=["scripted:tilt-judge"], repeats=3)
    # two explanation calls in the trace (clean and exposed), three repeats each; the synthetic
    # agent wrote the same explanation both times, so the second is answered by the cache
    assert len(result.scores) == 2 and result.judge_calls == calls["n"] == 3
    assert set(result.scores["label"]) == {"neutral"}
    assert set(result.scores["target"]) == {"none", "explanation"}
    assert (result.eval_dir / "scores.csv").is_file()
    store = RunStore(result.eval_dir)
    assert {c.node for c in store.iter_calls()} == {"judge"} and store.counts()["calls"] == 6
    assert store.counts()["cache_hits"] == 3
    assert (tmp_path / "run" / "run.sqlite").read_bytes() == before  # the source is untouched
    # a second pass is free: every evaluation cell is already done
    again = judge_traces(tmp_path / "run", node="explanation", prompt="evaluators/group_tilt",
                         judges=["scripted:tilt-judge"], repeats=3)
    assert again.judge_calls == 0 and len(again.scores) == 2


def test_judge_prompt_declares_its_labels():
    assert PromptRegistry().get("evaluators/group_tilt").labels == tuple(LABELS)
