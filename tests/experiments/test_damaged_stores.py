"""A run store damaged inside its rows, or emptied, or missing a table: every verb says which
row in one line and exits 2 (nothing half-written), and ``run --resume`` repairs the damaged
cells from the cache instead of paying again, or refuses when it cannot."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest
import tomli_w

from biaslab.cli import main
from support_runs import amplification_spec

# 5 cells: E0 clean and exposed, E1 clean and its two singleton exposures.
SPEC = amplification_spec(options={"datasets": ["math"], "pipelines": ["E0", "E1"],
                                   "max_test": 10, "n_resamples": 200},
                          conditions={"directions": ["pro_male"], "targets": "singletons"})


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """One finished run, made once; each test damages a copy of it."""
    where = tmp_path_factory.mktemp("source")
    (where / "spec.toml").write_text(tomli_w.dumps(SPEC))
    old = os.environ.get("BIASLAB_CACHE")
    os.environ["BIASLAB_CACHE"] = "off"
    try:
        assert main(["run", str(where / "spec.toml"), "--out", str(where / "run"),
                     "--quiet", "--no-figures"]) == 0
    finally:
        if old is None:
            os.environ.pop("BIASLAB_CACHE", None)
        else:
            os.environ["BIASLAB_CACHE"] = old
    return where


@pytest.fixture
def run_copy(source, tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BIASLAB_CACHE", "off")
    shutil.copy(source / "spec.toml", tmp_path / "spec.toml")
    shutil.copytree(source / "run", tmp_path / "run")
    return tmp_path / "run"


def sql(run: Path, *statements: str) -> list:
    conn = sqlite3.connect(run / "run.sqlite", isolation_level=None)
    try:
        rows = []
        for statement in statements:
            rows = conn.execute(statement).fetchall()
        return rows
    finally:
        conn.close()


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# Which row each damage hits, and how the one line names it.
DAMAGE = {
    "cells.coords": ("UPDATE cells SET coords = '{\"item\": ' WHERE ord = 2",
                     r"table cells, cell 'E1/math/none/[^']+': coords is not valid JSON"),
    "outputs.value": ("UPDATE outputs SET value = 'not json' WHERE rowid = 3",
                      r"table outputs, cell '[^']+', output \d+: value is not valid JSON"),
    "calls.record": ("UPDATE calls SET record = '[1, 2]' WHERE id = 2",
                     r"table calls, rowid 2 \(cell '[^']+', call \d+\): record is not a JSON "
                     r"object"),
}

VERBS = {
    "report": ["report", "{run}"],
    "rescore": ["replay", "{run}", "--mode", "rescore"],
    "strict": ["replay", "{run}", "--mode", "strict", "--out", "{new}", "--quiet"],
    "counterfactual": ["replay", "{run}", "--mode", "counterfactual", "--directions",
                       "pro_female", "--out", "{new}", "--quiet"],
    "export": ["export", "{run}", "--out", "{new}"],
    "merge": ["merge", "{run}", "--out", "{new}"],
    "judge": ["replay", "{run}", "--mode", "rescore", "--judge-node", "prediction", "--judges",
              "scripted:damage-judge", "--eval-name", "new"],
}


@pytest.fixture(autouse=True, scope="module")
def _judge():
    from biaslab.agents.providers.scripted import Rule, ScriptedChatModel, register_scripted
    register_scripted("damage-judge", lambda: ScriptedChatModel(rules=[
        Rule(".", '{"label": "neutral", "justification": "plain"}')]))


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("damage", DAMAGE)
def test_every_verb_names_the_damaged_row(run_copy, tmp_path, capsys, damage, verb):
    statement, named = DAMAGE[damage]
    sql(run_copy, statement)
    new = tmp_path / "new"
    argv = [a.format(run=run_copy, new=new) for a in VERBS[verb]]
    code, out, err = cli(capsys, *argv)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("biaslab: error:") and "Traceback" not in err
    assert f"{run_copy / 'run.sqlite'} is damaged: " in err
    assert __import__("re").search(named, err), err
    assert f"biaslab run --resume {run_copy} runs the damaged cells again" in err
    assert not new.exists() and not (run_copy / "evals").exists()  # nothing half-written


def test_resume_runs_the_damaged_cells_again_from_the_cache(run_copy, source, capsys):
    before = {p.name: p.read_bytes() for p in (source / "run" / "tables").glob("*.csv")}
    for statement, _ in DAMAGE.values():
        sql(run_copy, statement)
    damaged_cells = {cid for (cid,) in sql(
        run_copy, "SELECT cell_id FROM cells WHERE NOT json_valid(coords) UNION "
                  "SELECT cell_id FROM outputs WHERE NOT json_valid(value) UNION "
                  "SELECT cell_id FROM calls WHERE json_type(record) <> 'object'")}
    assert len(damaged_cells) >= 2
    code, _, err = cli(capsys, "run", "--resume", run_copy, "--quiet", "--no-figures")
    assert code == 0, err
    warning = next(line for line in err.splitlines() if "damaged row" in line)
    assert f"in {len(damaged_cells)} cell(s)" in warning and "run again" in warning
    # They ran again with every answer from the run's own cache: nothing was paid twice.
    assert f"{len(damaged_cells)} cells run, {5 - len(damaged_cells)} already done" in err
    assert " 0 model calls," in err
    assert sql(run_copy, "SELECT COUNT(*) FROM cells WHERE NOT json_valid(coords)") == [(0,)]
    after = {p.name: p.read_bytes() for p in (run_copy / "tables").glob("*.csv")}
    assert after == before
    code, _, err = cli(capsys, "report", run_copy, "--no-figures")
    assert code == 0, err


def test_damaged_meta_cannot_be_repaired(run_copy, capsys):
    sql(run_copy, "UPDATE meta SET value = '{' WHERE key = 'fingerprint'")
    for argv in (["report", run_copy], ["run", "--resume", run_copy, "--quiet"]):
        code, _, err = cli(capsys, *argv)
        assert code == 2 and err.count("\n") == 1, err
        assert "table meta, key 'fingerprint': value is not valid JSON" in err
        assert "restore run.sqlite from a copy" in err


@pytest.mark.parametrize("emptied, named", [
    (["DELETE FROM cells"], "cells were started; call records; outputs; cached answers"),
    (["DELETE FROM cells", "DELETE FROM calls", "DELETE FROM outputs", "DELETE FROM cache",
      "DELETE FROM meta"], "a spec.toml, but no run recorded in the store"),
])
def test_resume_refuses_an_emptied_store(run_copy, capsys, emptied, named):
    sql(run_copy, *emptied)
    spec = run_copy.parent / "spec.toml"
    for argv in (["run", spec, "--out", run_copy, "--resume", "--quiet"],
                 ["run", "--resume", run_copy, "--quiet"]):
        code, _, err = cli(capsys, *argv)
        assert code == 2, err
        line = err.splitlines()[-1]
        assert line.startswith("biaslab: error:") and "holds no cells" in line, err
        assert named in line and "would start over and pay again" in line
    assert sql(run_copy, "SELECT COUNT(*) FROM cells") == [(0,)]  # nothing was run
    code, out, err = cli(capsys, "report", run_copy)  # no empty tables beside the old ones
    assert code == 2 and err == f"biaslab: error: {run_copy} holds no cells (its store is " \
                                "empty): nothing to report\n" and out == ""


def test_resume_refuses_a_store_whose_calls_table_was_dropped(run_copy, capsys):
    sql(run_copy, "DROP TABLE calls")
    spec = run_copy.parent / "spec.toml"
    for argv in (["run", spec, "--out", run_copy, "--resume", "--quiet"],
                 ["run", "--resume", run_copy, "--quiet"], ["report", run_copy]):
        code, _, err = cli(capsys, *argv)
        assert code == 2, err
        line = err.splitlines()[-1]
        assert line.startswith("biaslab: error:") and "its calls table is missing" in line
        assert "already done" not in err
    tables = {name for (name,) in sql(run_copy, "SELECT name FROM sqlite_master "
                                               "WHERE type='table'")}
    assert "calls" not in tables  # not silently recreated empty
