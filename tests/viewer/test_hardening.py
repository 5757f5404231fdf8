"""The viewer over real HTTP against what a hostile page or a damaged store sends it: foreign
Host headers (DNS rebinding), hostile page numbers and filters, rows whose JSON is broken, and
`biaslab view --port` with the run's report; and mitigation arms in the condition filter."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from urllib.parse import urlencode, urlsplit

import pytest

from biaslab.viewer.params import MAX_INT


def request(base: str, path: str, *, host: str | None = "same", method: str = "GET"):
    """(status, headers, body) for one request, with the Host header as given (``same``: the
    served address; None: no Host header at all)."""
    where = urlsplit(base)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        if host is not None:
            conn.putheader("Host", where.netloc if host == "same" else host)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def api(base: str, route: str, **params):
    status, _, body = request(base, f"/api/{route}?{urlencode(params)}")
    return status, json.loads(body)


# -- 1. Host header and security headers ---------------------------------------------------
def test_a_request_naming_another_host_is_refused(viewer):
    base, _ = viewer
    port = urlsplit(base).port
    for path in ("/", "/api/meta", "/api/cells", "/app.js"):
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1}",
                     f"127.0.0.1.evil.example:{port}", None):
            status, _, body = request(base, path, host=host)
            assert status == 421, (path, host)
            assert "cells" not in body.decode() and "run_dir" not in body.decode()
            assert f"127.0.0.1:{port}" in json.loads(body)["error"]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
        status, _, body = request(base, "/api/meta", host=host)
        assert status == 200 and "run_dir" in json.loads(body)


def test_every_response_carries_the_security_headers(viewer):
    base, run = viewer
    port = urlsplit(base).port
    responses = {
        "page": request(base, "/"), "script": request(base, "/app.js"),
        "style": request(base, "/app.css"), "api": request(base, "/api/meta"),
        "bad request": request(base, "/api/cells?offset=-1"),
        "not found": request(base, "/nowhere"), "no such cell": request(base, "/api/cell?id=x"),
        "foreign host": request(base, "/", host=f"evil.example:{port}"),
        "other method": request(base, "/", method="POST"),
        "report": request(base, "/report.html"),
    }
    expected = {"page": 200, "script": 200, "style": 200, "api": 200, "bad request": 400,
                "not found": 404, "no such cell": 404, "foreign host": 421,
                "other method": 501, "report": 200}
    for name, (status, headers, _) in responses.items():
        assert status == expected[name], name
        assert headers.get("X-Content-Type-Options") == "nosniff", name
        assert headers.get("X-Frame-Options") == "DENY", name
        policy = headers.get("Content-Security-Policy", "")
        assert "frame-ancestors 'none'" in policy and "unsafe-eval" not in policy, name
    page_policy = responses["page"][1]["Content-Security-Policy"]
    assert "default-src 'self'" in page_policy and "script-src 'self';" in page_policy
    assert "unsafe-inline" not in page_policy
    # the report keeps its inline CSS but may run no script at all
    report_policy = responses["report"][1]["Content-Security-Policy"]
    assert "default-src 'none'" in report_policy and "script-src" not in report_policy
    assert responses["script"][1]["Content-Type"].startswith("text/javascript")
    # the page itself has nothing inline for the policy to block
    page = responses["page"][2].decode()
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/app.js">']
    assert "<style" not in page and not re.search(r"<[^>]+\son\w+=", page)


# -- 2. page numbers and long filters ------------------------------------------------------
@pytest.mark.parametrize("route,params,needle", [
    ("cells", {"offset": str(2**63)}, "'offset' must be at most"),
    ("cells", {"offset": str(10**400)}, "'offset' must be at most"),
    ("cells", {"offset": "-1"}, "'offset' must be a whole number"),
    ("cells", {"limit": "-5"}, "'limit' must be a whole number"),
    ("cells", {"limit": "abc"}, "'limit' must be a whole number"),
    ("cells", {"offset": "1e3"}, "'offset' must be a whole number"),
    ("calls", {"after": str(2**64)}, "'after' must be at most"),
    ("calls", {"after": "-3"}, "'after' must be a whole number"),
    ("call", {"id": str(2**70)}, "'id' must be at most"),
    ("call", {"id": "１２"}, "'id' must be a whole number"),  # full-width digits
    ("cells", {"q": "x" * 60_000}, "'q' is 60000 characters long"),
    ("cells", {"condition": "y" * 60_000}, "'condition' is 60000 characters long"),
    ("calls", {"node": "z" * 60_000}, "'node' is 60000 characters long"),
])
def test_bad_page_numbers_and_long_filters_are_one_line_400s(viewer, route, params, needle):
    base, _ = viewer
    status, body = api(base, route, **params)
    assert status == 400
    assert needle in body["error"] and "\n" not in body["error"]
    assert len(body["error"]) < 200
    assert api(base, "cells")[0] == 200  # the server is still there


def test_a_request_line_over_64_kb_and_other_methods_get_json_errors(viewer):
    base, _ = viewer
    status, headers, body = request(base, "/api/cells?" + urlencode({"q": "x" * 70_000}))
    assert status == 414 and headers["X-Content-Type-Options"] == "nosniff"
    assert json.loads(body) == {"error": "414 Request-URI Too Long"}
    status, headers, body = request(base, "/api/cells", method="DELETE")
    assert status == 501 and json.loads(body)["error"].startswith("501 Unsupported method")
    assert api(base, "cells")[0] == 200


def test_page_numbers_up_to_the_largest_sqlite_integer_are_served(viewer):
    base, _ = viewer
    status, page = api(base, "cells", offset=str(MAX_INT))
    assert status == 200 and page["rows"] == [] and page["total"] == 4
    status, page = api(base, "calls", after=str(MAX_INT))
    assert status == 200 and page["rows"] == [] and page["more"] is False
    assert api(base, "call", id=str(MAX_INT))[0] == 404
    status, page = api(base, "cells", seed="9" * 30)  # no such seed, and no overflow
    assert status == 200 and page["total"] == 0
    status, page = api(base, "cells", q="x" * 1000)  # the longest filter accepted
    assert status == 200 and page["total"] == 0


# -- 4. damaged JSON inside rows ----------------------------------------------------------
def test_rows_with_damaged_json_are_marked_not_fatal(multiturn_run, tmp_path, serve_run,
                                                     capsys):
    run = tmp_path / "run"
    shutil.copytree(multiturn_run, run)
    conn = sqlite3.connect(run / "run.sqlite")
    clean_cell = conn.execute("SELECT cell_id FROM cells WHERE coords LIKE "
                              "'%\"target\":\"none\"%' ORDER BY ord LIMIT 1").fetchone()[0]
    exposed_cell = conn.execute("SELECT cell_id FROM cells WHERE coords LIKE "
                                "'%\"target\":\"target\"%' ORDER BY ord LIMIT 1").fetchone()[0]
    bad_call = conn.execute("SELECT id FROM calls WHERE cell_id = ? ORDER BY id LIMIT 1",
                            (exposed_cell,)).fetchone()[0]
    bad_output = conn.execute("SELECT seq FROM outputs WHERE cell_id = ? ORDER BY seq LIMIT 1",
                              (exposed_cell,)).fetchone()[0]
    n_calls = conn.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
    conn.execute("UPDATE cells SET coords = '{\"target\": ' WHERE cell_id = ?", (clean_cell,))
    conn.execute("UPDATE calls SET record = '{\"messages\": [' WHERE id = ?", (bad_call,))
    conn.execute("UPDATE outputs SET value = 'not json' WHERE cell_id = ? AND seq = ?",
                 (exposed_cell, bad_output))
    conn.commit()
    conn.close()
    base = serve_run(run)

    status, meta = api(base, "meta")
    assert status == 200
    assert meta["facets"]["condition"] == ["none", "target:stereotype"]  # from the 3 sound cells
    status, cells = api(base, "cells")
    assert status == 200 and cells["total"] == 4
    damaged = [c for c in cells["rows"] if c.get("damaged")]
    assert [c["cell_id"] for c in damaged] == [clean_cell] and damaged[0]["condition"] == "?"
    # filters still work around the damaged row: 2 exposed cells, 1 sound clean cell
    assert api(base, "cells", condition="target:stereotype")[1]["total"] == 2
    assert api(base, "cells", condition="none")[1]["total"] == 1

    calls, after = [], 0
    while True:
        status, page = api(base, "calls", limit=500, after=after)
        assert status == 200
        calls += page["rows"]
        if not page["more"]:
            break
        after = page["next_after"]
    assert len(calls) == n_calls
    assert [c["id"] for c in calls if c.get("damaged")] == [bad_call]

    status, detail = api(base, "call", id=bad_call)
    assert status == 200 and "calls.record" in detail["call"]["damaged"]
    assert detail["call"]["messages"] == [] and detail["call"]["highlights"] == []
    status, cell = api(base, "cell", id=exposed_cell)
    assert status == 200
    assert [o["seq"] for o in cell["outputs"] if o.get("damaged")] == [bad_output]
    assert any(c.get("damaged") for c in cell["calls"])
    status, cell = api(base, "cell", id=clean_cell)
    assert status == 200 and [s["cell_id"] for s in cell["siblings"]] == [clean_cell]
    assert api(base, "compare", cell=exposed_cell)[0] == 200
    assert api(base, "dialogue", cell=exposed_cell)[0] in (200, 404)

    api(base, "meta"), api(base, "cells"), api(base, "call", id=bad_call)  # again
    warnings = capsys.readouterr().err.splitlines()
    for column in ("cells.coords", "calls.record", "outputs.value"):
        assert sum(column in line for line in warnings) == 1, (column, warnings)


# -- 3. report links follow the served port ------------------------------------------------
def test_view_on_another_port_serves_the_report_with_links_to_that_port(multiturn_run,
                                                                        tmp_path):
    run = tmp_path / "run"
    shutil.copytree(multiturn_run, run)
    with open(tmp_path / "view.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "biaslab.cli", "view", str(run),
                                 "--port", "0"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "http://" not in (tmp_path / "view.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "view.log").read_text()
            time.sleep(0.1)
        line = (tmp_path / "view.log").read_text()
        base = re.search(r"(http://127\.0\.0\.1:\d+)/ ", line).group(1)
        assert f"{base}/report.html" in line
        status, headers, body = request(base, "/report.html")
        assert status == 200
        links = re.findall(r'href="([^"]*#/cells[^"]*)"', body.decode())
        on_disk = re.findall(r'href="([^"]*#/cells[^"]*)"', (run / "report.html").read_text())
        assert links and len(links) == len(on_disk)
        assert all(link.startswith("/#/cells?") for link in links)
        assert [link.split("#", 1)[1] for link in links] == \
               [link.split("#", 1)[1] for link in on_disk]
        assert "8765" not in "".join(links)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_run_without_a_report_answers_404_for_it(multiturn_run, tmp_path, serve_run):
    run = tmp_path / "run"
    shutil.copytree(multiturn_run, run)
    (run / "report.html").unlink()
    base = serve_run(run)
    assert request(base, "/report.html")[0] == 404
    assert api(base, "meta")[1]["has_report"] is False


# -- 5. mitigation arms --------------------------------------------------------------------
def test_the_condition_filter_tells_mitigation_arms_apart(mitigated_run, serve_run):
    base = serve_run(mitigated_run)
    mitigated = "target:stereotype+mit:target:fairness_reminder"
    facets = api(base, "meta")[1]["facets"]
    # 2 exposure arms (clean, stereotype) x 2 mitigation arms (none, the reminder)
    assert facets["condition"] == ["none", "none+mit:target:fairness_reminder",
                                   "target:stereotype", mitigated]
    assert facets["mitigation"] == ["none", "target:fairness_reminder"]
    assert api(base, "cells")[1]["total"] == 8
    for condition in facets["condition"]:  # 2 items each, and each arm only its own cells
        rows = api(base, "cells", condition=condition)[1]["rows"]
        assert [r["condition"] for r in rows] == [condition] * 2
    rows = api(base, "cells", mitigation="target:fairness_reminder")[1]["rows"]
    assert sorted({r["condition"] for r in rows}) == ["none+mit:target:fairness_reminder",
                                                      mitigated] and len(rows) == 4
    rows = api(base, "cells", mitigation="none")[1]["rows"]
    assert sorted({r["condition"] for r in rows}) == ["none", "target:stereotype"]
    # the calls filter takes the same ids, and a mitigated call's exposure is still marked
    calls = api(base, "calls", condition=mitigated, node="target")[1]["rows"]
    assert calls and all(c["cell_id"].split("/")[2] == mitigated for c in calls)
    detail = api(base, "call", id=calls[0]["id"])[1]["call"]
    assert detail["highlight_method"] == "template" and any(detail["highlights"])
    # ... and so is the mitigation's own text (mitigations/fairness_reminder), in the system
    # message the target hears, while the judge (not a mitigation target) hears none of it
    (a, b), = detail["mitigation_highlights"][0]
    assert detail["messages"][0]["content"][a:b].startswith("Before you answer, remember")
    assert not any(any(s) for s in detail["mitigation_highlights"][1:])
    judge = api(base, "calls", condition=mitigated, node="judge")[1]["rows"][0]
    judged = api(base, "call", id=judge["id"])[1]["call"]
    assert judged["mitigation_texts"] and not any(judged["mitigation_highlights"])
    plain = api(base, "calls", condition="target:stereotype", node="target")[1]["rows"][0]
    assert api(base, "call", id=plain["id"])[1]["call"]["mitigation_texts"] == []


def test_report_links_to_mitigation_arms_open_exactly_their_cells(mitigated_run, serve_run):
    """mitigation_effects.csv rows link with ``exposure=<arm>&mitigation=<arm>``; each link
    opens the two cells (one per item) of that exposure arm under that mitigation."""
    import html as html_lib
    from urllib.parse import parse_qsl

    from biaslab.prompts.exposure import condition_id

    base = serve_run(mitigated_run)
    status, _, body = request(base, "/report.html")
    links = {html_lib.unescape(h) for h in
             re.findall(r'href="(/#/cells\?[^"]*mitigation=[^"]*)"', body.decode())}
    assert len(links) == 2  # clean and stereotype, each under the reminder
    for link in links:
        filters = dict(parse_qsl(link.split("?", 1)[1]))
        rows = api(base, "cells", **filters)[1]["rows"]
        want = condition_id(filters["exposure"], "", filters["mitigation"])
        assert [r["condition"] for r in rows] == [want] * 2, (link, rows)
