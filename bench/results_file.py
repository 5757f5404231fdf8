"""`bench/results.md` holds one section per bench script; each run replaces its own."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results.md"


def write_section(heading: str, section: str, path: Path = RESULTS) -> None:
    """Replace the section that starts with `heading` (a ``## `` line) by `section`, keeping
    every other section; append it when there is none yet."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    start = text.find(heading)
    if start >= 0:
        end = text.find("\n## ", start + len(heading))
        rest = text[end + 1:] if end >= 0 else ""
        text = text[:start] + section + ("\n" + rest if rest else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")
