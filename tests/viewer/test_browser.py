"""report.html and `biaslab view` in a real browser (Debian's chromium, driven by Playwright).

CI installs them with ``apt-get install -y chromium`` and ``pip install playwright`` (never
``playwright install``: its browser download does not work here)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


# CI installs both (make test), so there a missing browser fails instead of skipping.
REQUIRED = os.environ.get("CI") == "true"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if REQUIRED:
    import playwright.sync_api  # noqa: F401
    assert CHROMIUM, "CI needs chromium: `make test` installs it with apt-get"
playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="no chromium on PATH: apt-get install -y chromium")


@pytest.fixture(scope="module")
def browser(multiturn_run, mitigated_run, review_run):
    """Chromium; the runs are built first, as a run cannot start inside Playwright's loop."""
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1300, "height": 900})
    page = ctx.new_page()
    page.console_errors = []
    page.on("console", lambda m: m.type == "error" and page.console_errors.append(m.text))
    page.on("pageerror", lambda e: page.console_errors.append(str(e)))
    yield page
    ctx.close()


def test_report_opens_offline_with_tables_and_figures(page, multiturn_run):
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto((multiturn_run / "report.html").as_uri())
    assert page.console_errors == []
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    headings = page.locator("h4").all_inner_texts()
    for table in ("tables/summary.csv", "tables/per_turn.csv", "tables/calls_by_node.csv"):
        assert table in headings
    figures = page.locator("figure img")
    assert figures.count() >= 3
    # every embedded figure decoded to real pixels
    widths = figures.evaluate_all("imgs => imgs.map(i => i.naturalWidth)")
    assert min(widths) > 200
    summary = page.locator("section", has=page.locator("h4", has_text="tables/summary.csv"))
    assert "How to read this" in summary.inner_text()
    assert "[" in summary.locator("tbody td").nth(4).inner_text()  # cum_bias [low, high]
    link = summary.locator("a.vl").first.get_attribute("href")
    assert link.startswith("http://127.0.0.1:8765/#/cells?")


def test_a_composed_reports_first_screen_is_its_finding(browser, review_run, tmp_path):
    """At 1280x800 the report of a composed protocol opens on its findings: the headline
    heading, a forest plot and the first effect row (with n and pairing) are all on the first
    screen; the run's facts come after. No number breaks across lines, and the page names no
    absolute path."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    try:
        page.goto((review_run / "report.html").as_uri())
        shot = tmp_path / "first-screen.png"
        page.screenshot(path=str(shot))
        assert shot.stat().st_size > 10_000
        top = page.locator("main > section").first
        assert top.get_attribute("id") == "s-findings"
        heading = page.locator("#s-findings h2").bounding_box()
        plot = page.locator("#s-findings figure img").first
        assert plot.evaluate("i => i.naturalWidth") > 200
        assert heading["y"] < 800 and plot.bounding_box()["y"] < 800
        first_row = page.locator("#s-findings tbody tr").first
        assert first_row.bounding_box()["y"] + first_row.bounding_box()["height"] < 800 or \
            plot.bounding_box()["y"] + plot.bounding_box()["height"] <= 800
        text = page.locator("#s-findings").inner_text()
        assert "unit, seeds averaged" in text and "too few pairs (n=4)" in text
        run_facts = page.locator("#s-run").bounding_box()
        assert run_facts["y"] > heading["y"]
        # every number and interval sits on one line (a CI's minus sign stays with it)
        lines = page.locator("td.num").evaluate_all(
            "tds => tds.map(td => { const r = document.createRange(); r.selectNodeContents(td);"
            " return new Set(Array.from(r.getClientRects()).map(b => Math.round(b.top))).size"
            " })")
        assert lines and max(lines) == 1
        shot.rename(Path(os.environ.get("BIASLAB_SCREENSHOT", shot)))
        html = (review_run / "report.html").read_text()
        assert str(review_run.resolve()) not in html and "runs/review" in html
        assert str(tmp_path.anchor + "tmp") not in html.split("<main>")[0]
    finally:
        ctx.close()


def test_viewer_lists_cells_and_a_filter_narrows_them(page, viewer):
    base, _ = viewer
    page.goto(base + "/")
    page.wait_for_selector("#cells tbody tr")
    assert page.locator("#cells tbody tr").count() == 4
    page.select_option("select[data-f=condition]", "target:stereotype")
    page.wait_for_function("() => document.querySelectorAll('#cells tbody tr').length === 2")
    conditions = page.locator("#cells tbody tr td:nth-child(4)").all_inner_texts()
    assert conditions == ["target:stereotype"] * 2
    assert "of 2 cells" in page.locator("#count").inner_text()
    assert page.console_errors == []


def test_report_link_opens_the_viewer_filtered(page, viewer):
    base, _ = viewer
    page.goto(base + "/#/cells?condition=target%3Astereotype&model=scripted%3Amultiturn-followup")
    page.wait_for_selector("#cells tbody tr")
    assert page.locator("#cells tbody tr").count() == 2


def test_call_detail_highlights_the_exposure_text(page, viewer):
    base, _ = viewer
    page.goto(base + "/#/calls?node=target&condition=target%3Astereotype")
    page.wait_for_selector("table tbody tr")
    page.locator("table tbody tr a").first.click()
    mark = page.wait_for_selector("#messages mark.exposure")
    assert "generalisations" in mark.inner_text()
    assert page.locator("#response pre").inner_text().startswith("Turn 1 reply")
    verdicts = page.locator("#verdicts tbody tr")
    assert verdicts.count() >= 1 and page.locator("#verdicts").inner_text().count("judge") >= 1
    assert page.console_errors == []


def test_dialogue_shows_turns_with_labels(page, viewer):
    base, _ = viewer
    page.goto(base + "/#/cells?exposure=exposed")
    page.wait_for_selector("#cells tbody tr")
    page.locator("a.dlg").first.click()
    page.wait_for_selector("#turns .turn")
    turns = page.locator("#turns .turn")
    assert turns.count() == 4
    assert page.locator("#strip span").count() == 4
    labels = page.locator("#turns .label").all_inner_texts()
    assert set(labels) <= {"biased", "not biased", "unscored"} and len(labels) == 4
    assert page.console_errors == []


def test_compare_puts_clean_and_exposed_side_by_side(page, viewer):
    base, _ = viewer
    page.goto(base + "/#/cells?exposure=exposed")
    page.wait_for_selector("#cells tbody tr")
    page.locator("#cells tbody tr").first.get_by_text("compare").click()
    page.wait_for_selector("#compare")
    text = page.locator("#compare").inner_text()
    assert "Clean: none" in text and "Exposed: target:stereotype" in text
    assert page.locator("#compare mark.exposure").count() >= 1


def test_the_viewer_runs_under_its_policy_which_blocks_inline_script(page, viewer):
    base, _ = viewer
    response = page.goto(base + "/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.wait_for_selector("#cells tbody tr")
    assert page.console_errors == []  # the page needs nothing the policy forbids
    # what a model output that slipped past escaping would try: an inline script
    page.evaluate("""() => { const s = document.createElement('script');
        s.textContent = 'window.__ran = true'; document.body.appendChild(s);
        const d = document.createElement('div');
        d.innerHTML = '<img src=x onerror="window.__ran = true">';
        document.body.appendChild(d); }""")
    page.wait_for_timeout(300)
    assert page.evaluate("() => window.__ran === undefined")
    assert any("Content Security Policy" in e for e in page.console_errors)


def test_report_served_by_the_viewer_links_to_the_served_port(page, viewer):
    base, _ = viewer
    assert not base.endswith(":8765")
    page.goto(base + "/")
    page.wait_for_selector("#cells tbody tr")
    page.locator("#report-link").click()
    page.wait_for_selector("a.vl")
    assert page.url == base + "/report.html"
    link = page.locator("a.vl").first
    assert link.get_attribute("href").startswith("/#/cells?")
    link.click()
    page.wait_for_selector("#cells tbody tr")
    assert page.url.startswith(base + "/#/cells?")
    assert page.locator("#cells tbody tr").count() >= 1
    assert page.console_errors == []


def test_condition_filter_tells_mitigation_arms_apart(page, mitigated_run, serve_run):
    base = serve_run(mitigated_run)
    mitigated = "target:stereotype+mit:target:fairness_reminder"
    page.goto(base + "/")
    page.wait_for_selector("#cells tbody tr")
    assert page.locator("#cells tbody tr").count() == 8
    options = page.locator("select[data-f=condition] option").all_inner_texts()
    assert options == ["(all)", "none", "none+mit:target:fairness_reminder",
                       "target:stereotype", mitigated]
    page.select_option("select[data-f=condition]", "target:stereotype")
    page.wait_for_function("() => document.querySelectorAll('#cells tbody tr').length === 2")
    assert page.locator("#cells tbody tr td:nth-child(4)").all_inner_texts() == \
        ["target:stereotype"] * 2
    page.select_option("select[data-f=condition]", mitigated)
    page.wait_for_function(
        f"() => [...document.querySelectorAll('#cells tbody tr td:nth-child(4)')]"
        f".every(td => td.textContent === {mitigated!r})")
    assert page.locator("#cells tbody tr").count() == 2
    page.click("#clear")
    page.wait_for_function("() => document.querySelectorAll('#cells tbody tr').length === 8")
    page.select_option("select[data-f=mitigation]", "target:fairness_reminder")
    page.wait_for_function("() => document.querySelectorAll('#cells tbody tr').length === 4")
    conditions = page.locator("#cells tbody tr td:nth-child(4)").all_inner_texts()
    assert all("+mit:target:fairness_reminder" in c for c in conditions)
    # a mitigated target call marks the reminder apart from the exposure
    page.goto(base + "/#/calls?" + f"node=target&condition={mitigated.replace(':', '%3A')}"
              .replace("+", "%2B"))
    page.wait_for_selector("table tbody tr")
    page.locator("table tbody tr a").first.click()
    reminder = page.wait_for_selector("#messages mark.mitigation")
    assert reminder.inner_text().startswith("Before you answer, remember")
    assert "generalisations" in page.locator("#messages mark.exposure").first.inner_text()
    assert page.locator("#mitigation").inner_text().startswith("target:fairness_reminder")
    assert page.console_errors == []


def test_dialogue_has_a_legend_and_the_seed_stereotype(page, viewer):
    base, _ = viewer
    page.goto(base + "/#/cells?exposure=exposed")
    page.wait_for_selector("#cells tbody tr")
    page.locator("a.dlg").first.click()
    page.wait_for_selector("#turns .turn")
    legend = page.locator("#legend").inner_text()
    for label in ("biased", "not biased", "unscored"):
        assert label in legend
    # the legend's swatches use the strip's own classes
    for cls in ("lab-biased", "lab-not", "lab-none"):
        assert page.locator(f"#legend span.{cls}").count() == 1
    import json
    from urllib.request import urlopen

    cell = page.url.split("cell=", 1)[1]  # as the page encoded it
    with urlopen(f"{base}/api/cell?id={cell}", timeout=10) as r:
        inputs = json.loads(r.read())["inputs"]
    assert page.locator("#seed q").inner_text() == inputs["stereotype"] != ""
    assert page.console_errors == []


def test_cell_page_shows_the_item_first_and_folds_the_outputs(page, viewer):
    base, _ = viewer
    page.goto(base + "/#/cells?exposure=exposed")
    page.wait_for_selector("#cells tbody tr")
    page.locator("#cells tbody tr a").first.click()
    page.wait_for_selector("#outputs details")
    assert "stereotype" in page.locator("#inputs").inner_text()
    inputs_top = page.locator("#inputs").bounding_box()["y"]
    assert inputs_top < page.locator("#calls").bounding_box()["y"]
    folded = page.locator("#outputs details")
    assert folded.count() >= 10
    assert page.locator("#outputs details[open]").count() == 0
    assert page.evaluate("() => document.body.scrollHeight") < 3000
    folded.last.locator("summary").click()
    assert "turns" in folded.last.locator("pre").inner_text()
    assert page.console_errors == []


def test_compare_lines_the_two_sides_up_and_marks_changed_answers(page, viewer):
    base, _ = viewer
    page.goto(base + "/#/cells?exposure=exposed")
    page.wait_for_selector("#cells tbody tr")
    page.locator("#cells tbody tr").first.get_by_text("compare").click()
    page.wait_for_selector("#compare .pair")
    pairs = page.locator("#compare .pair")
    assert pairs.count() >= 10
    for n in range(pairs.count()):
        left, right = pairs.nth(n).locator(":scope > .box").all()
        assert left.bounding_box()["y"] == right.bounding_box()["y"]  # side by side, in line
        assert left.locator("h4 a").inner_text() == right.locator("h4 a").inner_text()
    changed = page.locator("#compare .pair pre.raw mark.changed")
    assert changed.count() >= 2
    assert "generalisation" in " ".join(changed.all_inner_texts())
    # the unit measures of both sides, as exposed_vs_clean.csv reads them
    fields = page.locator("#measures tr td:nth-child(2)").all_inner_texts()
    assert sorted(fields) == ["finalize: coherence_rating", "finalize: ever_biased"]
    assert page.console_errors == []


# A judge-sensitivity row as `replay --mode rescore --sensitivity` writes it on this run: its
# key alone is 191 characters (a replay that computes one takes a minute, so the row is
# written here in the file's own columns).
SENSITIVITY = (
    "table,row,panel,recorded,recorded_significant,band_low,band_high,n_configurations,"
    "sign_flips,significance_flips,flipped_by\n"
    "exposed_vs_clean,unit=dialogue; variant=dynamic-assessment-t4; "
    "model=scripted:multiturn-followup; node=finalize; field=coherence_rating; stratum=; "
    "attribute=category; group=all; condition=target:stereotype,judge scripted:multiturn-never,"
    "0.5,True,-0.25,0.5,5,True,True,only:scripted:multiturn-never\n")


def _layout(page) -> list[dict]:
    return page.evaluate("""() => [...document.querySelectorAll('section')].map(s => ({
        title: (s.querySelector('h3') || {}).innerText, width: s.clientWidth,
        scroll: s.scrollWidth,
        tables: [...s.querySelectorAll('div.scroll')].map(d => ({
            name: (d.parentElement.querySelector('h4') || {innerText: ''}).innerText,
            width: d.clientWidth,
            scroll: d.scrollWidth, columns: d.querySelectorAll('thead th').length,
            widest: Math.max(0, ...[...d.querySelectorAll('td')].map(
                c => c.getBoundingClientRect().width))}))}))""")


def test_every_report_section_fits_a_normal_window(page, multiturn_run, mitigated_run,
                                                   tmp_path):
    """At 1300 × 900 no section is wider than its card, no cell is wider than about 22em
    (a long key wraps instead of pushing the other columns out), and a table of a dozen
    columns or fewer, the judge-sensitivity one with its 191-character key included, needs
    no horizontal scrolling: its band and flip columns are on screen."""
    run = tmp_path / "run"
    shutil.copytree(multiturn_run, run)
    (run / "tables" / "judge_sensitivity.csv").write_text(SENSITIVITY)
    from biaslab.cli import main
    assert main(["report", str(run)]) == 0
    checked = set()
    for report in (run / "report.html", mitigated_run / "report.html"):
        page.goto(report.as_uri())
        assert page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")
        for section in _layout(page):
            assert section["scroll"] <= section["width"], section
            for table in section["tables"]:
                assert table["widest"] <= 400, (section["title"], table)
                if table["columns"] <= 12:
                    assert table["scroll"] <= table["width"] + 1, (section["title"], table)
                checked.add(table["name"])
    assert "tables/judge_sensitivity.csv" in checked and "tables/mitigation_effects.csv" in checked
    # mitigation_effects has a caption of its own, not the fallback for an unknown table
    page.goto((mitigated_run / "report.html").as_uri())
    mitigations = page.locator("section", has=page.locator("h4", has_text="mitigation_effects"))
    assert "Mitigation arms against their unmitigated twins" in mitigations.inner_text()
    assert "without a caption" not in mitigations.inner_text()
    page.goto((run / "report.html").as_uri())
    card = page.locator("section", has=page.locator("h3", has_text="Judge sensitivity"))
    right = card.bounding_box()["x"] + card.bounding_box()["width"]
    edges = card.locator("table").first.evaluate("""t => Object.fromEntries(
        [...t.querySelectorAll('thead th')].map(h => [h.innerText.replace(/\\s/g, ''),
                                                      h.getBoundingClientRect().right]))""")
    # the band is a range over judge configurations, not a CI: its own two columns
    for column in ("recorded", "band_low", "band_high", "sign_flips", "flipped_by"):
        assert edges[column] <= right, (column, edges, right)
    assert "[" not in card.locator("tbody tr").first.inner_text()
