"""Write the viewer screenshots in docs/ from a scripted multiturn run with a mitigation arm.

    python tests/viewer/make_screenshots.py [OUT_DIR]     (default: docs/)

Needs what the browser tests need (Debian's chromium and Playwright); no model, no network.
Not a test: pytest does not collect it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import MITIGATIONS_TOML, multiturn_spec_toml  # noqa: E402

from biaslab.cli import main  # noqa: E402
from biaslab.viewer import make_server  # noqa: E402

SHOTS = {
    "viewer-compare.png": "#/compare?cell={exposed}",
    "viewer-dialogue.png": "#/dialogue?cell={exposed}",
    "viewer-cell.png": "#/cell?id={exposed}",
    "viewer-mitigation.png": "#/call?id={mitigated_call}",
}


def build_run(root: Path) -> Path:
    spec = root / "spec.toml"
    spec.write_text(multiturn_spec_toml() + MITIGATIONS_TOML)
    os.environ["BIASLAB_CACHE"] = str(root / "cache.sqlite")
    assert main(["run", str(spec), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


def main_(out: Path) -> None:
    from urllib.parse import quote

    from playwright.sync_api import sync_playwright

    from biaslab.viewer.server import ViewerApp

    root = Path(tempfile.mkdtemp(prefix="biaslab-shots-"))
    try:
        run = build_run(root)
        app = ViewerApp(run)
        exposed = app.q.cells({"condition": "target:stereotype"})["rows"][0]["cell_id"]
        mitigated = app.q.calls({"condition": "target:stereotype+mit:target:fairness_reminder",
                                 "node": "target"})["rows"][0]["id"]
        server = make_server(run, port=0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            for name, route in SHOTS.items():
                page.goto(base + route.format(exposed=quote(exposed, safe=""),
                                              mitigated_call=mitigated))
                page.wait_for_selector("#app h2")
                page.wait_for_timeout(200)
                page.screenshot(path=str(out / name), full_page=name == "viewer-cell.png")
                print(f"wrote {out / name}")
            browser.close()
        server.shutdown()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main_(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[1] / "docs")
