"""The viewer's JSON API: SQL filters and pages, exposure highlighting, dialogues, compare."""

from __future__ import annotations

import json
import sqlite3
from urllib.error import HTTPError
from urllib.parse import urlencode
from urllib.request import urlopen

import pytest

from biaslab.cli import main
from biaslab.viewer.server import diff_span, highlight_spans


def get(base: str, route: str, **params):
    with urlopen(f"{base}/api/{route}?{urlencode(params)}", timeout=10) as r:
        return json.loads(r.read())


def test_cells_filter_and_paginate_in_sql(viewer):
    base, run = viewer
    conn = sqlite3.connect(run / "run.sqlite")
    n_cells = conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
    n_exposed = conn.execute("SELECT COUNT(*) FROM cells WHERE coords LIKE "
                             "'%\"target\":\"target\"%'").fetchone()[0]
    everything = get(base, "cells", limit=500)
    assert everything["total"] == n_cells == len(everything["rows"]) == 4
    exposed = get(base, "cells", condition="target:stereotype")
    assert exposed["total"] == n_exposed == 2
    assert {r["condition"] for r in exposed["rows"]} == {"target:stereotype"}
    assert get(base, "cells", exposure="clean")["total"] == n_cells - n_exposed
    page = get(base, "cells", limit=1, offset=1)
    assert len(page["rows"]) == 1 and page["rows"][0]["cell_id"] == everything["rows"][1]["cell_id"]
    per_cell = dict(conn.execute("SELECT cell_id, COUNT(*) FROM calls GROUP BY cell_id"))
    assert all(r["n_calls"] == per_cell[r["cell_id"]] for r in everything["rows"])
    assert get(base, "cells", seed="7")["total"] == 0


def test_calls_keyset_pages_cover_every_call_once(viewer):
    base, run = viewer
    conn = sqlite3.connect(run / "run.sqlite")
    want = [r[0] for r in conn.execute("SELECT id FROM calls WHERE node='judge' ORDER BY id")]
    got, after = [], 0
    while True:
        page = get(base, "calls", node="judge", limit=7, after=after)
        got += [r["id"] for r in page["rows"]]
        assert all(r["node"] == "judge" for r in page["rows"])
        if not page["more"]:
            break
        after = page["next_after"]
    assert got == want and len(want) > 7


def test_call_detail_highlights_the_rendered_exposure_text(viewer):
    base, run = viewer
    conn = sqlite3.connect(run / "run.sqlite")
    call_id, record = conn.execute(
        "SELECT id, record FROM calls WHERE node='target' AND "
        "json_extract(record, '$.exposed') = 1 LIMIT 1").fetchone()
    detail = get(base, "call", id=call_id)["call"]
    assert detail["highlight_method"] == "template"
    text = detail["exposure_texts"][0]
    marked = [m["content"][a:b] for m, spans in zip(detail["messages"], detail["highlights"])
              for a, b in spans]
    assert marked == [text]
    # the template rendering agrees with what a diff against the clean twin finds
    clean_id = conn.execute(
        "SELECT k.id FROM calls k JOIN cells c ON c.cell_id = k.cell_id WHERE k.node='target' "
        "AND json_extract(c.coords,'$.target')='none' AND json_extract(c.coords,'$.item')=? "
        "AND json_extract(k.record,'$.item')=?",
        (json.loads(conn.execute("SELECT coords FROM cells WHERE cell_id=?",
                                 (detail["cell_id"],)).fetchone()[0])["item"],
         detail["item"])).fetchone()[0]
    clean = get(base, "call", id=clean_id)["call"]
    assert clean["highlights"] == [[] for _ in clean["messages"]]
    system = detail["messages"][0]["content"]
    (a, b), = diff_span(system, clean["messages"][0]["content"])
    assert text in system[a:b]


def test_judge_verdicts_dialogue_and_compare(viewer):
    base, run = viewer
    cells = get(base, "cells", condition="target:stereotype")["rows"]
    cell = cells[0]["cell_id"]
    target = get(base, "calls", cell=cell, node="target")["rows"][0]
    judges = get(base, "call", id=target["id"])["judges"]
    assert all(j["item"] == target["item"] for j in judges)
    assert {j["node"] for j in judges} == {"judge", "guardrail"}
    verdict = next(j for j in judges if j["node"] == "judge")
    assert {"label", "justification"} <= set(verdict["parsed"])
    dialogue = get(base, "dialogue", cell=cell)["dialogue"]
    assert [t["turn"] for t in dialogue["turns"]] == list(range(1, dialogue["n_turns"] + 1))
    pair = get(base, "compare", cell=cell)
    assert pair["left"]["cell"]["condition"] == "none"
    assert pair["right"]["cell"]["cell_id"] == cell
    assert pair["left"]["cell"]["item"] == pair["right"]["cell"]["item"]
    with pytest.raises(HTTPError) as err:
        get(base, "dialogue", cell="no/such/cell")
    assert err.value.code == 404


def test_highlight_helpers():
    assert highlight_spans("a XY b XY", ["XY"]) == [[2, 4], [7, 9]]
    assert highlight_spans("abc", ["zz", ""]) == []
    assert diff_span("sys\n\nNUDGE", "sys") == [[3, 10]]
    assert diff_span("same", "same") == []


def test_view_rejects_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert main(["view", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_compare_finds_the_clean_cell_once(multiturn_run, tmp_path):
    """Where exposure texts are unknown, exposed calls are diffed against the clean cell; the
    compare page finds that cell among the siblings it already has, not once per call, and
    marks the same spans."""
    import shutil

    from biaslab.viewer.server import ViewerApp

    run = tmp_path / "run"
    shutil.copytree(multiturn_run, run)
    app = ViewerApp(run)
    app.exposure_texts = lambda variant, condition: None  # force the diff method
    lookups = []
    siblings = app.q.siblings
    app.q.siblings = lambda cell_id: lookups.append(cell_id) or siblings(cell_id)
    exposed = next(r for r in app.q.cells({"condition": "target:stereotype"})["rows"])
    pair = app.compare(exposed["cell_id"], None)
    right = pair["right"]
    marked = [c for c in right["calls"] if c["highlight_method"]]
    assert marked and {c["highlight_method"] for c in marked} == {"diff against the clean cell"}
    assert any(any(spans) for c in marked for spans in c["highlights"])
    assert len(lookups) == 1  # the page's own siblings: both sides are at that grid point
    one_by_one = [app.call_detail(c["id"])["call"] for c in marked]
    assert [c["highlights"] for c in one_by_one] == [c["highlights"] for c in marked]
