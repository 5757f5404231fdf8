"""The documentation site builds with every link checked (``mkdocs build --strict``), and every
page under ``docs/`` is in its navigation, so a moved or renamed page fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _nav_pages(nav) -> set[str]:
    pages: set[str] = set()
    for entry in nav:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            if isinstance(value, list):
                pages |= _nav_pages(value)
            else:
                pages.add(value)
    return pages


def test_mkdocs_build_strict(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "protocols" / "roleplay" / "index.html").is_file()


def test_every_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = _nav_pages(config["nav"])
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages == listed, f"not in the nav: {sorted(pages - listed)}; missing: {sorted(listed - pages)}"
