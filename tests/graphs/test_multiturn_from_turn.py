"""A counterfactual of a dialogue (issue 18, item 8): ``biaslab replay RUN --mode counterfactual
... --from-turn K`` keeps turns 1..K-1 of the source run and makes the change from turn K on.
Through the CLI, on the scripted multiturn agents, whose replies follow known rules."""

import re

import tomllib
import tomli_w

from biaslab.cli import main
from biaslab.graphs import multiturn_synthetic as syn
from biaslab.traces.store import RunStore

OPTIONS = {"categories": ["age", "religion"], "seeds_per_category": 2,
           "framings": ["implicit"], "turn_caps": [5], "baselines": [],
           "post_hoc": ["coherence", "guardrail"], "n_resamples": 200}


def _source(tmp_path, model: str):
    """A clean-only source run (no exposed arm: `targets = []`)."""
    spec = tmp_path / "mt.toml"
    spec.write_text(tomli_w.dumps({
        "name": "mt", "protocol": "multiturn", "models": [model],
        "run": {"seeds": [42], "retry_base_s": 0.0},
        "conditions": {"template": "multiturn/exposure", "directions": ["stereotype"],
                       "targets": []},
        "options": OPTIONS}))
    out = tmp_path / "src"
    assert main(["run", str(spec), "--out", str(out), "--quiet", "--no-report"]) == 0
    return out


def _turn(item: str) -> int | None:
    found = re.fullmatch(r"turn-(\d+)", item)
    return int(found.group(1)) if found else None


def _dialogues(run) -> dict[str, list[dict]]:
    store = RunStore(run, readonly=True)
    try:
        return {c["cell_id"]: v["dialogue"]["turns"]
                for c, v in store.finished_outputs("finalize")}
    finally:
        store.close()


def _clean_id(cell_id: str) -> str:
    variant, item, _arm, model, seed = cell_id.split("/")
    return "/".join([variant, item, "none", model, seed])


def test_exposure_from_turn_k_keeps_the_earlier_turns_and_pays_only_from_k(tmp_path, capsys):
    """The target is exposed from turn 3 on. Turns 1-2 of every exposed dialogue are the
    source's clean dialogue byte for byte, answered from its trace; the calls paid are exactly
    the ones the change reaches (counted by hand below)."""
    source = _source(tmp_path, "scripted:multiturn-late")  # clean: biased from turn 7, cap 5
    cf = tmp_path / "cf"
    capsys.readouterr()
    assert main(["replay", str(source), "--mode", "counterfactual", "--targets", "target",
                 "--from-turn", "3", "--out", str(cf), "--no-cache", "--quiet",
                 "--no-figures"]) == 0
    paid_line = capsys.readouterr().out
    src = RunStore(source, readonly=True).calls()
    new = RunStore(cf, readonly=True).calls()
    exposed = new[new["cell_id"].str.contains("/target:stereotype/")]
    assert exposed["cell_id"].nunique() == 4  # 2 categories x 2 seeds

    # Turns 1-2: the same calls as the source's clean dialogue, every one a cache hit.
    early = exposed[exposed["item"].map(lambda i: (_turn(i) or 99) < 3)]
    assert len(early) == 4 * 2 * 4  # 4 dialogues x 2 turns x (user, target, judge, guardrail)
    assert early["cache_hit"].all() and not early["exposed"].any()
    by_key = src.assign(cell=src["cell_id"]).set_index(["cell", "node", "item"])
    for row in early.itertuples():
        twin = by_key.loc[(_clean_id(row.cell_id), row.node, row.item)]
        assert repr(twin["messages"]) == repr(row.messages) and twin["raw"] == row.raw
    dialogues, clean = _dialogues(cf), _dialogues(source)
    for cell_id, turns in dialogues.items():
        if "/target:stereotype/" in cell_id:
            assert turns[:2] == clean[_clean_id(cell_id)][:2]

    # From turn 3 the target hears the exposure; a susceptible dialogue turns biased there.
    target = exposed[exposed["node"] == "target"]
    assert (target["exposed"] == (target["item"].map(_turn) >= 3)).all()
    expected_paid = 0
    for cell_id, turns in dialogues.items():
        if "/target:stereotype/" not in cell_id:
            continue
        hit = syn.susceptible(turns[0]["query"])
        assert [t["biased"] for t in turns] == [False, False, hit, hit, hit]
        # Paid: the 3 exposed target calls. A susceptible dialogue's replies change, so its
        # judge (3), guardrail (3), next user turns (turns 4, 5: the history changed) and
        # coherence (1) calls are new too; an unsusceptible one says the same words, and those
        # calls are answered from the trace.
        expected_paid += 3 + (3 + 3 + 2 + 1 if hit else 0)
    paid = new[~new["cache_hit"]]
    assert len(paid) == expected_paid > 12  # some dialogues are susceptible
    assert f": {expected_paid} model calls," in paid_line
    assert paid["cell_id"].str.contains("/target:stereotype/").all()
    assert (paid["item"].map(lambda i: _turn(i) is None or _turn(i) >= 3)).all()
    assert set(paid.loc[paid["item"] == "", "node"]) <= {"coherence"}

    # The run's spec records the change and the source's settings for the earlier turns.
    spec = tomllib.loads((cf / "spec.toml").read_text())
    assert spec["from_turn"]["turn"] == 3
    assert spec["from_turn"]["conditions_before"]["targets"] == []
    assert spec["conditions"]["targets"] == ["target"]
    # ... so a resume with the same flags continues it (nothing left to pay), and a resume
    # with another turn is refused in one line.
    capsys.readouterr()
    assert main(["replay", str(source), "--mode", "counterfactual", "--targets", "target",
                 "--from-turn", "3", "--out", str(cf), "--no-cache", "--quiet",
                 "--resume", "--no-figures"]) == 0
    assert ": 0 model calls," in capsys.readouterr().out
    code = main(["replay", str(source), "--mode", "counterfactual", "--targets", "target",
                 "--from-turn", "4", "--out", str(cf), "--no-cache", "--quiet", "--resume",
                 "--no-figures"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1


def test_a_new_target_model_from_turn_k(tmp_path, capsys):
    """`--node target --model ... --from-turn 3`: the `reemerge` target (biased at turns 1 and
    4 of a susceptible dialogue) is replaced by the `never` target from turn 3 on, so turn 1
    stays biased and turn 4 no longer is."""
    source = _source(tmp_path, "scripted:multiturn-reemerge")
    cf = tmp_path / "cf"
    assert main(["replay", str(source), "--mode", "counterfactual", "--node", "target",
                 "--model", "scripted:multiturn-never", "--from-turn", "3", "--out", str(cf),
                 "--no-cache", "--quiet", "--no-figures"]) == 0
    calls = RunStore(cf, readonly=True).calls()
    target = calls[calls["node"] == "target"]
    model = target["model"].map(lambda m: m["model"])
    assert ((model == "multiturn-never") == (target["item"].map(_turn) >= 3)).all()
    early = calls[calls["item"].map(lambda i: (_turn(i) or 99) < 3)]
    assert early["cache_hit"].all()
    before, after = _dialogues(source), _dialogues(cf)
    assert set(before) == set(after)
    susceptible = 0
    for cell_id, turns in after.items():
        hit = syn.susceptible(turns[0]["query"])
        susceptible += hit
        assert [t["biased"] for t in before[cell_id]] == [hit, False, False, hit, False]
        assert [t["biased"] for t in turns] == [hit, False, False, False, False]
        assert turns[:2] == before[cell_id][:2]
    assert 0 < susceptible < len(after)


def test_from_turn_is_refused_in_one_line_where_it_cannot_apply(tmp_path, capsys):
    amp = tmp_path / "amp.toml"
    amp.write_text(tomli_w.dumps({
        "name": "t", "protocol": "amplification", "models": ["scripted:amplification-synthetic"],
        "run": {"seeds": [42], "retry_base_s": 0.0},
        "conditions": {"directions": ["pro_female"], "targets": []},
        "options": {"pipelines": ["E0"], "max_test": 20, "n_resamples": 200}}))
    assert main(["run", str(amp), "--out", str(tmp_path / "amp"), "--quiet",
                 "--no-report"]) == 0
    source = _source(tmp_path, "scripted:multiturn-never")
    capsys.readouterr()
    cases = [
        (tmp_path / "amp", ["--targets", "prediction", "--from-turn", "2"], "has no turns"),
        (source, ["--targets", "target", "--from-turn", "9"], "longest has 5 turns"),
        (source, ["--targets", "target", "--from-turn", "1"], "drop --from-turn"),
    ]
    for run, args, says in cases:
        out = tmp_path / f"cf-{len(args)}-{args[-1]}"
        code = main(["replay", str(run), "--mode", "counterfactual", *args, "--out", str(out),
                     "--quiet", "--no-figures"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and says in err, err
        assert not out.exists()
    code = main(["replay", str(source), "--mode", "strict", "--from-turn", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--mode counterfactual" in err
