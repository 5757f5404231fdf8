"""Bad input to an app audit: each is one line and exit 2, before any model call."""

from __future__ import annotations

import json

import pytest

from support_apps import EXAMPLE, calls, cli, copy_app

FILES = ("hiring_app.py", "hiring_synthetic.py", "cases.jsonl", "hiring_audit.toml")


@pytest.fixture
def app_dir(tmp_path):
    return copy_app(tmp_path, *FILES, source=EXAMPLE)


def _fails(app_dir, capsys, needle: str, edit=None, spec_edit=None) -> None:
    spec = app_dir / "hiring_audit.toml"
    if spec_edit:
        spec.write_text(spec_edit(spec.read_text()))
    if edit:
        edit(app_dir)
    capsys.readouterr()
    assert cli("run", spec, "--out", app_dir / "run", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert needle in err[0], err[0]
    assert "Traceback" not in err[0]
    assert not (app_dir / "run" / "run.sqlite").exists()


def test_an_app_that_does_not_import(app_dir, capsys):
    _fails(app_dir, capsys, "failed to import: ZeroDivisionError",
           edit=lambda d: (d / "hiring_app.py").write_text((d / "hiring_app.py").read_text()
                                                           + "\n1 / 0\n"))


def test_an_app_that_is_not_a_graph(app_dir, capsys):
    _fails(app_dir, capsys, "is not a LangGraph graph (got ChatOpenAI)",
           spec_edit=lambda s: s.replace("hiring_app.py:graph", "hiring_app.py:llm"))


def test_an_app_attribute_that_does_not_exist(app_dir, capsys):
    _fails(app_dir, capsys, "has no attribute 'graf'",
           spec_edit=lambda s: s.replace("hiring_app.py:graph", "hiring_app.py:graf"))


def test_an_item_that_is_not_an_object(app_dir, capsys):
    def edit(d):
        with open(d / "cases.jsonl", "a") as f:
            f.write('["not", "an", "object"]\n')
    _fails(app_dir, capsys, "line 7: an item must be a JSON object", edit=edit)


def test_an_item_that_lacks_a_key(app_dir, capsys):
    def edit(d):
        with open(d / "cases.jsonl", "a") as f:
            f.write(json.dumps({"id": "c7", "applicant_gender": "F"}) + "\n")
    _fails(app_dir, capsys, "line 7: the item lacks key 'case'", edit=edit)


def test_an_item_key_that_is_no_input_of_the_graph(app_dir, capsys):
    def edit(d):
        rows = [json.loads(x) for x in (d / "cases.jsonl").read_text().splitlines()]
        (d / "cases.jsonl").write_text("".join(json.dumps({**r, "cv": "x"}) + "\n"
                                               for r in rows))
    _fails(app_dir, capsys, "key 'cv' of item 'c1' is no input of the app's graph", edit=edit)


def test_an_outcome_the_final_state_does_not_hold_names_the_item(app_dir, capsys):
    _fails(app_dir, capsys, "item 'c1': the final state has no 'verdict'",
           spec_edit=lambda s: s.replace('field = "decision"', 'field = "verdict"'))


def test_an_unknown_node_is_refused_before_any_call(app_dir, capsys, monkeypatch):
    # the model axis points at a dead port: any call would fail differently
    _fails(app_dir, capsys, "the app has no node 'judge' (its nodes: reviewer_a, reviewer_b, "
           "chair)", spec_edit=lambda s: s.replace('"chair"]', '"judge"]').replace(
               'models = ["scripted:hiring-synthetic"]', 'models = ["dead"]') +
           '\n[model_aliases.dead]\nprovider = "openai-compatible"\nmodel = "m"\n'
           'base_url = "http://127.0.0.1:9/v1"\n')


def test_an_unknown_node_binding_is_refused(app_dir, capsys):
    _fails(app_dir, capsys, "[nodes.judge]: the app has no node 'judge'",
           spec_edit=lambda s: s + '\n[nodes.judge]\nmodel = "scripted:hiring-synthetic"\n')


def test_a_spec_without_an_outcome(app_dir, capsys):
    _fails(app_dir, capsys, "needs an [outcome] table",
           spec_edit=lambda s: s.replace('[outcome]\nfield = "decision"', '[outcomes]\nx = 1'))


def test_an_outcome_missing_from_a_later_item_fails_that_cell_naming_it(app_dir, capsys):
    """Only the first item runs before the grid: a later item whose final state lacks the
    outcome is a failed cell naming the item, never an imputed value."""
    app = app_dir / "hiring_app.py"
    app.write_text(app.read_text().replace(
        '    return {"decision": answer.content.strip().lower()}',
        '    if "nurse" in state["case"]:\n        return {}\n'
        '    return {"decision": answer.content.strip().lower()}'))
    spec = app_dir / "hiring_audit.toml"
    cli("run", spec, "--out", app_dir / "run", "--quiet", "--no-report")
    from biaslab.traces.store import RunStore

    store = RunStore(app_dir / "run", readonly=True)
    try:
        cells = store.cells()
    finally:
        store.close()
    failed = cells[cells["status"] == "error"]
    assert set(failed["item"]) == {"c2"}
    assert failed["error"].str.contains("item 'c2': the final state has no 'decision'").all()
    assert len(calls(app_dir / "run")) > 0


def test_a_self_check_mitigation_is_refused_for_an_app(app_dir, capsys):
    _fails(app_dir, capsys, "[mitigations.self_check]: an after-answer self-check",
           spec_edit=lambda s: s + '\n[mitigations.self_check]\ntargets = ["chair"]\n')


def test_a_prompt_binding_is_refused_for_an_app(app_dir, capsys):
    _fails(app_dir, capsys, "[nodes.chair] prompt: an audited app's prompts are its own",
           spec_edit=lambda s: s + '\n[nodes.chair]\nprompt = "common/reask"\n')


def test_an_app_with_a_checkpointer_and_a_sibling_module_runs(app_dir, capsys):
    """Apps are often compiled with a checkpointer (which needs a thread id) and import
    modules beside them."""
    (app_dir / "committee_prompts.py").write_text('CHAIR = "You chair a hiring committee."\n')
    app = app_dir / "hiring_app.py"
    app.write_text(app.read_text()
                   .replace("graph = builder.compile()",
                            "from langgraph.checkpoint.memory import MemorySaver\n"
                            "graph = builder.compile(checkpointer=MemorySaver())")
                   .replace('SystemMessage("You chair a hiring committee.")',
                            "SystemMessage(__import__('committee_prompts').CHAIR)"))
    assert cli("run", app_dir / "hiring_audit.toml", "--out", app_dir / "run", "--quiet",
               "--no-report") == 0
    frame = calls(app_dir / "run")
    assert frame["error"].isna().all() and len(frame) == 54
