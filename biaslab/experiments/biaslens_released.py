"""``biaslab biaslens-released``: the BiasLens authors' released answers scored three ways.

For each released model (and condition) under a copy of the origin repository's ``answers/``
and ``results/`` folders, write ``counts.csv`` (per model × variant × attribute × type:
questions, biaslab's biased count, the authors' script's reading recomputed, their published
count, and how many differing questions the named families explain) and ``families.csv`` (each
family: answers read differently, questions whose verdict they change, whether the script is
demonstrably wrong there), and print the per-model totals. See docs/protocols/roleplay.md §3.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from biaslab.datasets import biaslens_answers as ba
from biaslab.errors import UserError
from biaslab.evaluators import roleplay_released as rr

__all__ = ["score_release"]


def score_release(root: str | Path, models: list[str] | None, conditions: list[str],
                  out: str | Path | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Counts and families of every requested model and condition (all released ones when
    `models` is None); written under `out` when given.

    Raises:
        UserError: no answers under `root`, or an unreadable file.
    """
    counts, families = [], []
    for condition in conditions:
        if condition not in ba.CONDITIONS:
            raise UserError(f"unknown condition '{condition}' (known: "
                            f"{', '.join(ba.CONDITIONS)})")
        for model in models or ba.released_models(root, condition):
            scored = rr.score_released(ba.load_released_answers(root, model, condition))
            try:
                authors = ba.load_authors_counts(root, model, condition)
            except UserError:
                authors = None  # answers without the authors' statistics: no published column
            counts.append(rr.released_counts(scored, authors))
            families.append(rr.family_counts(scored))
    if not counts:
        raise UserError(f"no released answers under {Path(root) / 'answers'}")
    counts_frame, family_frame = pd.concat(counts), pd.concat(families)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        counts_frame.to_csv(Path(out) / "counts.csv", index=False)
        family_frame.to_csv(Path(out) / "families.csv", index=False)
    return counts_frame, family_frame


def totals(counts: pd.DataFrame) -> pd.DataFrame:
    """Per model × variant × type: the counts summed over attributes."""
    columns = [c for c in ("n", "biaslab", "script", "published", "explained", "unexplained")
               if c in counts.columns]
    return counts.groupby(["model", "variant", "type"], sort=True)[columns].sum().reset_index()
