"""A protocol's headline rows: the numbers its conclusions rest on, named so that an analysis
over many re-scorings (judge sensitivity) can find the same row in each and compare it.

A protocol lists them as `Protocol.headline_tables`. The default is the generic
``exposed_vs_clean.csv`` (every exposed arm against clean, per measure × group, with a CI);
a protocol adds its own main table (roleplay: Table 5, role against no role).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HeadlineTable", "EXPOSED_VS_CLEAN"]


@dataclass(frozen=True)
class HeadlineTable:
    """Which rows of a report table are headlines, and which columns hold their numbers.

    Attributes:
        path: the table, relative to the run directory (``tables/table5.csv``).
        keys: the columns that name one row (the same row in every re-scoring).
        value: the estimate (a difference, a rate...); its sign is the finding's direction.
        ci: the (low, high) columns of its CI, or None.
        p: the p-value column, or None.
    """

    path: str
    keys: tuple[str, ...]
    value: str
    ci: tuple[str, str] | None = None
    p: str | None = None

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2].removesuffix(".csv")


EXPOSED_VS_CLEAN = HeadlineTable(
    "tables/exposed_vs_clean.csv",
    keys=("unit", "variant", "model", "node", "field", "stratum", "attribute", "group",
          "condition"),
    value="diff", ci=("ci_low", "ci_high"))
"""The generic paired effect table every protocol's report writes."""
