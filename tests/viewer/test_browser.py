"""report.html and `biaslab view` in a real browser (Debian's chromium, driven by Playwright).

CI installs them with ``apt-get install -y chromium`` and ``pip install playwright`` (never
``playwright install``: its browser download does not work here)."""

from __future__ import annotations

import os
import shutil

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
def browser():
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


def test_viewer_lists_cells_and_a_filter_narrows_them(page, viewer):
    base, _ = viewer
    page.goto(base + "/")
    page.wait_for_selector("#cells tbody tr")
    assert page.locator("#cells tbody tr").count() == 4
    page.select_option("select[data-f=condition]", "target:stereotype")
    page.wait_for_function("document.querySelectorAll('#cells tbody tr').length === 2")
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
