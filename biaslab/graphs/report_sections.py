"""What a protocol adds to the HTML report, declared as data rather than written as HTML.

A protocol lists `ReportSection`s from `Protocol.report_sections`; the experiments layer turns
them into ``report.html`` (tables with CIs, embedded figures, a "how to read this" line and
links into ``biaslab view``). Files no section claims still appear, under a generic caption, so
a protocol that declares nothing loses nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["ReportSection", "VIEWER_FILTERS"]

VIEWER_FILTERS = ("protocol", "variant", "item", "condition", "target", "direction", "model",
                  "seed", "status", "exposure", "mitigation", "cell")
"""The filters `biaslab view` understands in ``#/cells?key=value`` links (``exposure``: clean,
exposed or an exposure arm id; ``mitigation``: a mitigation arm, or none)."""


@dataclass(frozen=True)
class ReportSection:
    """One titled part of ``report.html``.

    Attributes:
        title: the heading.
        tables: globs relative to the run directory (``tables/table1.csv``); a CSV is shown as
            a table (``*_ci_low``/``*_ci_high`` columns folded into their value), a Markdown file
            without a CSV twin as text.
        figures: globs of PNG (or SVG) files, embedded.
        how_to_read: one or two sentences on what a row means and which way is "more biased".
        link_columns: table column → viewer filter (one of `VIEWER_FILTERS`) for the per-row
            "cells" link, for columns whose name is not already a filter (e.g.
            ``{"pipeline": "variant"}``); columns named like a filter link by themselves, unless
            mapped to None (a column that only shares a filter's name).
        max_rows: rows shown before the table is cut (the CSV next to the report has them all).
    """

    title: str
    tables: tuple[str, ...] = ()
    figures: tuple[str, ...] = ()
    how_to_read: str = ""
    link_columns: Mapping[str, str | None] = field(default_factory=dict)
    max_rows: int = 200
