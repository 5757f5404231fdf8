"""What the pages are built from (issue 23's viewer items): compare rows that pair the two
sides' calls and mark where answers differ, and a cell's item (its inputs) shown first."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from urllib.parse import urlencode
from urllib.request import urlopen

from biaslab.viewer.spans import aligned_rows


def get(base: str, route: str, **params):
    with urlopen(f"{base}/api/{route}?{urlencode(params)}", timeout=10) as r:
        return json.loads(r.read())


def call(node, item, raw, sample=0, attempt=0):
    return {"node": node, "item": item, "sample": sample, "attempt": attempt, "raw": raw}


def test_aligned_rows_pair_by_key_and_mark_the_changed_span():
    left = [call("ask", "q1", "abc"), call("judge", "q1", "x")]
    right = [call("ask", "q1", "abXc"), call("check", "q1", "y"), call("judge", "q1", "x")]
    rows = aligned_rows(left, right)
    # by hand: "abc" vs "abXc" share the prefix "ab" and the suffix "c", so the right side's
    # change is "X" (span [2, 3]) and the left side's is empty; "check" was made only on the
    # right, after its "ask" call, so its row comes second; "judge" answered alike.
    assert [(r["node"], r["left"], r["right"]) for r in rows] == \
        [("ask", 0, 0), ("check", None, 1), ("judge", 1, 2)]
    assert rows[0]["left_changed"] == [] and rows[0]["right_changed"] == [[2, 3]]
    assert rows[0]["same"] is False and rows[2]["same"] is True
    assert rows[1]["left_changed"] == rows[1]["right_changed"] == []
    # a key made twice pairs in order; a side without an answer marks nothing
    twice = aligned_rows([call("t", "", "a"), call("t", "", "b")],
                         [call("t", "", "a"), call("t", "", None)])
    assert [(r["left"], r["right"], r["same"]) for r in twice] == [(0, 0, True), (1, 1, False)]
    assert twice[1]["left_changed"] == twice[1]["right_changed"] == []


def test_compare_rows_cover_both_sides_and_mark_what_differs(viewer):
    base, _ = viewer
    cell = get(base, "cells", condition="target:stereotype")["rows"][0]["cell_id"]
    pair = get(base, "compare", cell=cell)
    left, right = pair["left"]["calls"], pair["right"]["calls"]
    rows = pair["rows"]
    assert sorted(r["left"] for r in rows if r["left"] is not None) == list(range(len(left)))
    assert sorted(r["right"] for r in rows if r["right"] is not None) == list(range(len(right)))
    for r in rows:
        if r["left"] is not None and r["right"] is not None:
            a, b = left[r["left"]], right[r["right"]]
            assert (a["node"], a["item"], a["sample"]) == (b["node"], b["item"], b["sample"])
            assert r["same"] == (a["raw"] == b["raw"])
    differing = [r for r in rows if r["right_changed"]]
    assert differing  # the exposed first turn answers differently
    for r in differing:
        a, b = left[r["left"]]["raw"], right[r["right"]]["raw"]
        (i, j), = r["right_changed"]
        (k, m), = r["left_changed"]
        # outside the marked spans the two answers are the same text
        assert b[:i] == a[:k] and b[j:] == a[m:] and b[i:j] != a[k:m]


def test_a_cell_shows_its_item_inputs(viewer):
    base, run = viewer
    cell = get(base, "cells", condition="target:stereotype")["rows"][0]
    detail = get(base, "cell", id=cell["cell_id"])
    inputs = detail["inputs"]
    assert inputs["seed_id"] == cell["item"]
    # the stereotype the page shows is the one the user simulator was given
    conn = sqlite3.connect(run / "run.sqlite")
    record = json.loads(conn.execute(
        "SELECT record FROM calls WHERE cell_id = ? AND node = 'user_simulator' ORDER BY seq "
        "LIMIT 1", (cell["cell_id"],)).fetchone()[0])
    said = "\n".join(m["content"] for m in record["messages"])
    assert inputs["stereotype"] and inputs["stereotype"] in said
    assert get(base, "dialogue", cell=cell["cell_id"])["inputs"] == inputs


def test_compare_shows_the_unit_measures_the_table_reads(viewer):
    """The compare page's measures are the per-unit values exposed_vs_clean.csv is built from
    (multiturn: ever_biased and coherence_rating of the dialogue), for both sides."""
    from biaslab.experiments.replay import load_run_plan
    from biaslab.experiments.reports.units import unit_frame
    from biaslab.traces.store import RunStore

    base, run = viewer
    cell = get(base, "cells", condition="target:stereotype")["rows"][0]
    pair = get(base, "compare", cell=cell["cell_id"])
    measures = pair["measures"]
    assert {m["field"] for m in measures} == {"ever_biased", "coherence_rating"}
    plan = load_run_plan(run, check_keys=False)
    store = RunStore(run, readonly=True)
    frame = unit_frame(store, plan.protocol, plan.options)
    store.close()
    for m in measures:
        for side, condition in (("left", "none"), ("right", "target:stereotype")):
            want = frame[(frame["condition"] == condition) & (frame["unit"] == m["unit"])
                         & (frame["field"] == m["field"]) & (frame["item"] == cell["item"])
                         & (frame["variant"] == cell["variant"])]["value"]
            assert len(want) == 1
            got = m[side]
            assert (got is None and want.isna().all()) or got == want.iloc[0], (m, side)
        assert m["changed"] == (m["left"] != m["right"])


def test_compare_measures_keep_a_single_label(tmp_path, serve_run):
    """A label is a measure even where each cell has one value of it (the review chain's
    decision: either on the clean arm, older when the reviser is exposed pro-older)."""
    from biaslab.cli import main

    root = Path(__file__).resolve().parents[2]
    spec = root / "experiments" / "examples" / "review.toml"
    run = tmp_path / "review"
    assert main(["run", str(spec), "--model", "scripted:review-synthetic", "--out", str(run),
                 "--quiet", "--no-report"]) == 0
    base = serve_run(run)
    cell = get(base, "cells", condition="revise:pro_older", seed="42")["rows"][0]
    measures = get(base, "compare", cell=cell["cell_id"])["measures"]
    assert [(m["node"], m["field"], m["left"], m["right"], m["changed"]) for m in measures] == [
        ("revise", "decision", "either", "older", True)]
