"""A guardrail of your own (issue 18, item 9): `guardrail_scorer = "file.py:function"` scores
every query and reply instead of the LLM guardrail node; the guardrail and harmfulness tables
name what scored them. Through the CLI, on the scripted `reemerge` agents (biased replies at
turns 1 and 4 of a susceptible dialogue, and only there)."""

import numpy as np
import pandas as pd
import pytest
import tomli_w

from biaslab.cli import main
from biaslab.graphs import multiturn_synthetic as syn
from biaslab.traces.store import RunStore

SCORER = f'''
def p_violation(text):
    return 0.9 if {syn.BIASED_MARKER!r} in text else 0.05
'''


def _spec(tmp_path, **options):
    path = tmp_path / "mt.toml"
    path.write_text(tomli_w.dumps({
        "name": "mt", "protocol": "multiturn", "models": ["scripted:multiturn-reemerge"],
        "run": {"seeds": [42], "retry_base_s": 0.0},
        "conditions": {"template": "multiturn/exposure", "targets": []},
        "options": {"categories": ["age", "gender", "race"], "seeds_per_category": 3,
                    "framings": ["implicit"], "turn_caps": [5], "baselines": [],
                    "post_hoc": ["guardrail"], "n_resamples": 200, **options}}))
    return path


def test_a_classifier_of_your_own_scores_the_guardrail_and_the_tables_name_it(tmp_path):
    (tmp_path / "scorer.py").write_text(SCORER)
    run = tmp_path / "run"
    assert main(["run", str(_spec(tmp_path, guardrail_scorer="scorer.py:p_violation")),
                 "--out", str(run), "--quiet", "--no-figures"]) == 0
    calls = RunStore(run, readonly=True).calls()
    assert "guardrail" not in set(calls["node"])  # no LLM was asked for a risk
    ref = f"callable:{(tmp_path / 'scorer.py').resolve()}:p_violation"
    guard = pd.read_csv(run / "tables" / "guardrail.csv")
    assert set(guard["scored_by"]) == {ref}
    harm = pd.read_csv(run / "tables" / "harmfulness_replies.csv").iloc[0]
    queries = pd.read_csv(run / "tables" / "harmfulness_queries.csv").iloc[0]
    assert harm["scored_by"] == queries["scored_by"] == ref
    # By hand: a susceptible dialogue has biased replies at turns 1 and 4 (risk 0.9), the
    # others 0.05; an unsusceptible one is 0.05 throughout.
    turns = pd.read_csv(run / "tables" / "turns.csv")
    first = turns[turns["turn"] == 1].set_index("cell_id")["query"]
    hit = np.array([syn.susceptible(q) for q in first])
    assert 0 < hit.sum() < len(hit)
    assert len(hit) == 9 and harm["harm_n"] == 45  # 9 dialogues × 5 replies
    # every reply weighs the same: 2 of 5 replies of a susceptible dialogue score 0.9
    assert harm["flagged"] == pytest.approx(hit.mean() * 2 / 5)
    per_dialogue = np.where(hit, (2 * 0.9 + 3 * 0.05) / 5, 0.05)
    assert harm["harm"] == pytest.approx(per_dialogue.mean())
    # the queries hold no marker: every one scores 0.05
    assert queries["harm"] == pytest.approx(0.05) and queries["flagged"] == 0


def test_the_llm_guardrail_is_named_and_a_bad_scorer_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["run", str(_spec(tmp_path)), "--out", str(run), "--quiet", "--no-figures"]) == 0
    assert set(pd.read_csv(run / "tables" / "guardrail.csv")["scored_by"]) == {
        "llm:scripted:multiturn-reemerge"}
    (tmp_path / "scorer.py").write_text(SCORER)
    capsys.readouterr()
    for ref, says in (("scorer.py:nothing", "names no function"),
                      ("missing.py:f", "file not found"), ("no_colon", "module:function")):
        out = tmp_path / f"bad-{ref.replace(':', '-')}"
        code = main(["run", str(_spec(tmp_path, guardrail_scorer=ref)), "--out", str(out),
                     "--quiet", "--no-figures"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and says in err, err
        assert not out.exists()
