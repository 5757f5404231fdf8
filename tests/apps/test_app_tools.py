"""App (c): a ``create_react_agent`` whose tools write to a SQLite file. Every tool execution is
recorded with its node, arguments and result; a strict replay and a counterfactual that asks
the same tools answer them from the record and write nothing; a tool call with new arguments
fails the cell (``tools = "replay"``, the default) or runs live (``tools = "live"``). The
rows in the app's own database are the witness."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from support_apps import HERE, cli, copy_app, effects, outputs
from biaslab.traces.store import RunStore

SPEC = HERE / "sqlite_react_audit.toml"
APP_FILES = ("sqlite_react_app.py", "sqlite_react_synthetic.py", "sqlite_react_audit.toml",
             "react_items.jsonl")
CELLS = 4 * 2  # four applicants, clean and agent:pro_older
TOOLS_PER_CELL = 2  # lookup_record, then check_references


def rows(db: Path) -> int:
    """Rows the app's tools have written to their database."""
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT COUNT(*) FROM tool_log").fetchone()[0]


def app_outputs(run: Path) -> dict[str, dict]:
    """cell id → the app node's output (outcome, final state, tools)."""
    store = RunStore(run, readonly=True)
    try:
        return {cell: value for cell, _, _, value in store.iter_outputs(node="app")}
    finally:
        store.close()


def cell_errors(run: Path) -> dict[str, str]:
    store = RunStore(run, readonly=True)
    try:
        frame = store.cells()
    finally:
        store.close()
    return dict(zip(frame["cell_id"], frame["error"].fillna("")))


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """One run of the app (tools = "replay", the default), its database in the module's dir."""
    root = tmp_path_factory.mktemp("sqlite-react")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SQLITE_APP_DB", str(root / "app.db"))
        mp.setenv("BIASLAB_CACHE", str(root / "cache.sqlite"))
        assert cli("run", SPEC, "--out", root / "run", "--quiet", "--no-figures") == 0
        yield root


def test_a_run_runs_every_tool_and_records_it_with_node_arguments_and_result(audited):
    # each cell ran both tools, and so did the discovery pass (the first item, clean)
    assert rows(audited / "app.db") == TOOLS_PER_CELL * (CELLS + 1)
    found = app_outputs(audited / "run")
    assert len(found) == CELLS
    for cell, value in found.items():
        unit = value["outcome"]["unit"]
        assert [(t["node"], t["tool"], t["args"], t["occurrence"]) for t in value["tools"]] == \
            [("tools", "lookup_record", {"applicant": unit}, 0),
             ("tools", "check_references", {"applicant": unit}, 0)]
        # what the tool returned is what the app's messages hold
        messages = value["final_state"]["messages"]
        assert [m["content"] for m in messages if m["type"] == "tool"] == \
            [t["content"] for t in value["tools"]]
    assert cli("report", audited / "run", "--no-figures") == 0
    found = effects(audited / "run")
    assert found[("agent:pro_older", "outcome=older")] == 1.0
    assert found[("agent:pro_older", "outcome=either")] == -1.0
    table = pd.read_csv(audited / "run" / "tables" / "tool_calls.csv")
    assert len(table) == CELLS * TOOLS_PER_CELL and set(table["node"]) == {"tools"}
    assert table["result"].str.contains("lookups_so_far|References for", regex=True).all()


def test_export_writes_the_tool_executions(audited, capsys):
    assert cli("export", audited / "run", "--format", "tools", "--out", audited / "export") == 0
    lines = (audited / "export" / "tool_calls.jsonl").read_text().splitlines()
    assert len(lines) == CELLS * TOOLS_PER_CELL
    assert {json.loads(line)["tool"] for line in lines} == {"lookup_record", "check_references"}


def test_strict_replay_runs_no_tool_and_reproduces_the_outputs_exactly(audited, capsys):
    before = rows(audited / "app.db")
    assert cli("replay", audited / "run", "--mode", "strict", "--out", audited / "strict") == 0
    assert "0 model calls" in capsys.readouterr().out
    assert rows(audited / "app.db") == before
    # the tools' answers (lookup counts that a live run would have changed) are the recorded ones
    assert outputs(audited / "strict") == outputs(audited / "run")


def test_a_counterfactual_asking_the_same_tools_runs_none(audited):
    before = rows(audited / "app.db")
    out = audited / "mitigated"
    assert cli("replay", audited / "run", "--mode", "counterfactual", "--node", "agent",
               "--mitigation", "fairness_reminder", "--out", out, "--quiet", "--no-figures") == 0
    assert rows(audited / "app.db") == before
    assert not any(cell_errors(out).values())
    source = {(v["outcome"]["unit"], t["tool"], t["content"])
              for v in app_outputs(audited / "run").values() for t in v["tools"]}
    new = app_outputs(out)
    assert len(new) == 2 * CELLS  # every arm with and without the reminder
    assert all((v["outcome"]["unit"], t["tool"], t["content"]) in source
               for v in new.values() for t in v["tools"])


def test_new_tool_arguments_fail_the_cell_naming_node_and_tool_by_default(audited, capsys):
    before = rows(audited / "app.db")
    out = audited / "thorough"
    assert cli("replay", audited / "run", "--mode", "counterfactual", "--node", "agent",
               "--model", "scripted:sqlite-react-thorough", "--out", out, "--quiet") == 1
    assert rows(audited / "app.db") == before
    errors = cell_errors(out)
    assert len(errors) == CELLS
    for error in errors.values():  # (the app caught the refusal: the cell fails all the same)
        assert error.startswith("ToolRefused: node 'tools' called tool 'lookup_record'")
        assert '"detail":"history"' in error and 'tools = "live"' in error


def test_with_tools_live_new_arguments_run_live_and_recorded_ones_do_not(tmp_path,
                                                                        monkeypatch):
    copy_app(tmp_path, *APP_FILES)
    spec = tmp_path / "sqlite_react_audit.toml"
    spec.write_text(spec.read_text().replace("models = ", 'tools = "live"\nmodels = ', 1))
    db = tmp_path / "app.db"
    monkeypatch.setenv("SQLITE_APP_DB", str(db))
    assert cli("run", spec, "--out", tmp_path / "run", "--quiet", "--no-figures") == 0
    before = rows(db)
    out = tmp_path / "thorough"
    assert cli("replay", tmp_path / "run", "--mode", "counterfactual", "--node", "agent",
               "--model", "scripted:sqlite-react-thorough", "--out", out, "--quiet",
               "--no-figures") == 0
    assert rows(db) == before + CELLS  # only the history lookup, once per cell
    for value in app_outputs(out).values():
        assert [(t["tool"], t["args"].get("detail")) for t in value["tools"]] == \
            [("lookup_record", None), ("lookup_record", "history"),
             ("check_references", None)]
    # and the counterfactual run, replayed strictly, runs none of them
    assert cli("replay", out, "--mode", "strict", "--out", tmp_path / "strict") == 0
    assert rows(db) == before + CELLS
    assert outputs(tmp_path / "strict") == outputs(out)


def test_a_second_run_on_the_same_cache_runs_no_tool(tmp_path, monkeypatch):
    db = tmp_path / "app.db"
    monkeypatch.setenv("SQLITE_APP_DB", str(db))
    assert cli("run", SPEC, "--out", tmp_path / "first", "--quiet", "--no-figures") == 0
    before = rows(db)
    assert cli("run", SPEC, "--out", tmp_path / "second", "--quiet", "--no-figures") == 0
    assert rows(db) == before
    assert outputs(tmp_path / "second") == outputs(tmp_path / "first")


def test_a_bad_tools_setting_is_one_line(tmp_path, capsys):
    copy_app(tmp_path, *APP_FILES)
    spec = tmp_path / "sqlite_react_audit.toml"
    spec.write_text(spec.read_text().replace("models = ", 'tools = "sometimes"\nmodels = ', 1))
    assert cli("run", spec, "--out", tmp_path / "run", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tools = 'sometimes'" in err[0] and '"live"' in err[0]


def test_worker_processes_run_each_cell_s_tools_once(tmp_path, monkeypatch):
    # (a shard reads its main run's store as a source: that is no replay, so nothing is refused)
    db = tmp_path / "app.db"
    monkeypatch.setenv("SQLITE_APP_DB", str(db))
    assert cli("run", SPEC, "--out", tmp_path / "run", "--workers", "2", "--quiet",
               "--no-figures") == 0
    assert rows(db) == TOOLS_PER_CELL * (CELLS + 1)
    assert cli("replay", tmp_path / "run", "--mode", "strict", "--out", tmp_path / "s") == 0
    assert rows(db) == TOOLS_PER_CELL * (CELLS + 1)
    assert outputs(tmp_path / "s") == outputs(tmp_path / "run")


def test_strict_replay_of_a_trace_without_tool_results_stops_naming_the_tool(audited, capsys):
    # a run recorded before tools were: its cache holds the model's answers, no tool result
    import shutil

    old = audited / "old"
    shutil.copytree(audited / "run", old)
    with sqlite3.connect(old / "run.sqlite") as conn:
        dropped = conn.execute("DELETE FROM cache WHERE json_valid(raw) AND "
                               "json_type(raw, '$.message') IS NOT NULL").rowcount
    assert dropped >= CELLS * TOOLS_PER_CELL
    before = rows(audited / "app.db")
    capsys.readouterr()
    assert cli("replay", old, "--mode", "strict", "--out", audited / "old-strict") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert rows(audited / "app.db") == before
    assert len(err) == 1 and "strict replay: the source trace has no tool call" in err[0]
    assert "node 'tools' called tool 'lookup_record'" in err[0]


def test_a_sync_node_running_a_tool_itself_is_recorded_and_replayed(tmp_path, monkeypatch,
                                                                    capsys):
    db = tmp_path / "app.db"
    monkeypatch.setenv("SQLITE_APP_DB", str(db))
    run = tmp_path / "run"
    assert cli("run", HERE / "sqlite_sync_audit.toml", "--out", run, "--quiet", "--no-figures") == 0
    assert rows(db) == CELLS + 1  # one lookup per cell, and the discovery pass's
    for value in app_outputs(run).values():
        unit = value["outcome"]["unit"]
        assert [(t["node"], t["tool"], t["args"]) for t in value["tools"]] == \
            [("screen", "lookup_record", {"applicant": unit})]
        assert value["final_state"]["record"] == value["tools"][0]["content"]
    assert cli("report", run, "--no-figures") == 0
    assert effects(run)[("screen:pro_older", "decision=older")] == 1.0
    capsys.readouterr()
    assert cli("replay", run, "--mode", "strict", "--out", tmp_path / "strict") == 0
    assert "0 model calls" in capsys.readouterr().out
    assert rows(db) == CELLS + 1
    assert outputs(tmp_path / "strict") == outputs(run)


def test_replay_tools_live_lets_new_arguments_run_for_one_counterfactual(audited, capsys):
    before = rows(audited / "app.db")
    out = audited / "thorough-live"
    assert cli("replay", audited / "run", "--mode", "counterfactual", "--node", "agent",
               "--model", "scripted:sqlite-react-thorough", "--tools", "live", "--out", out,
               "--quiet", "--no-figures") == 0
    assert rows(audited / "app.db") == before + CELLS
    assert not any(cell_errors(out).values())
    # a strict replay has no tool to let run
    assert cli("replay", audited / "run", "--mode", "strict", "--tools", "live",
               "--out", audited / "strict-live") == 2
    assert "--tools" in capsys.readouterr().err


def test_replay_tools_is_for_apps_only(tmp_path, capsys):
    from support_runs import amplification_spec, run_spec

    run_spec(amplification_spec(options={"datasets": ["math"], "max_test": 2,
                                         "n_resamples": 100}), tmp_path / "run")
    capsys.readouterr()
    assert cli("replay", tmp_path / "run", "--mode", "counterfactual", "--node", "prediction",
               "--model", "scripted:sqlite-decide", "--tools", "live",
               "--out", tmp_path / "cf", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tools applies to an audited app" in err[0]
    assert not (tmp_path / "cf").exists()
