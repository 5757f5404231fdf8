"""``biaslab biaslens-released``: the BiasLens authors' released answers scored three ways.

For each released model (and condition) under a copy of the origin repository's ``answers/``
and ``results/`` folders, write ``counts.csv`` (per model × variant × attribute × type:
questions, biaslab's biased count, the authors' script's reading recomputed, their published
count, and how many differing questions the named families explain) and ``families.csv`` (each
family: answers read differently, questions whose verdict they change, whether the script is
demonstrably wrong there) and the paper's Tables 3, 5 (with both conditions) and 6 of the
authors' answers under biaslab's rules (``table3.csv``, ``table5.csv``, ``table6.csv``, as a
biaslab run writes them), and print the per-model totals. See docs/protocols/roleplay.md §3a.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from biaslab.datasets import biaslens_answers as ba
from biaslab.errors import UserError
from biaslab.evaluators import roleplay_released as rr

__all__ = ["score_release"]


def score_release(root: str | Path, models: list[str] | None, conditions: list[str],
                  out: str | Path | None, bank_dir: str | Path | None = None
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Counts and families of every requested model and condition (all released ones when
    `models` is None), matched to the shipped bank or `bank_dir`; written under `out` when
    given.

    Raises:
        UserError: no answers under `root`, or an unreadable file.
    """
    counts, families, questions = [], [], []
    for condition in conditions:
        if condition not in ba.CONDITIONS:
            raise UserError(f"unknown condition '{condition}' (known: "
                            f"{', '.join(ba.CONDITIONS)})")
        for model in models or ba.released_models(root, condition):
            scored = rr.score_released(ba.load_released_answers(root, model, condition,
                                                                bank_dir=bank_dir))
            try:
                authors = ba.load_authors_counts(root, model, condition)
            except UserError:
                authors = None  # answers without the authors' statistics: no published column
            counts.append(rr.released_counts(scored, authors))
            families.append(rr.family_counts(scored))
            questions.append(rr.question_frame(scored))
    if not counts:
        raise UserError(f"no released answers under {Path(root) / 'answers'}")
    counts_frame, family_frame = pd.concat(counts), pd.concat(families)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        counts_frame.to_csv(Path(out) / "counts.csv", index=False)
        family_frame.to_csv(Path(out) / "families.csv", index=False)
        write_tables(pd.concat(questions, ignore_index=True), Path(out))
    return counts_frame, family_frame


def write_tables(frame: pd.DataFrame, out: Path) -> list[Path]:
    """Tables 3, 5 and 6 of the released answers, as a biaslab run writes them (Table 3 and 6
    from the role answers; Table 5 when both conditions were read)."""
    from biaslab.evaluators import roleplay as rp

    role = frame[frame["variant"] == "role"]
    written = []
    tables = {"table3.csv": rp.table3(role) if len(role) else pd.DataFrame(),
              "table6.csv": rp.consistency_table(role) if len(role) else pd.DataFrame()}
    if set(frame["variant"]) >= {"role", "no_role"}:
        tables["table5.csv"] = rp.role_vs_no_role(frame)
    for name, table in tables.items():
        if table.empty:
            continue
        path = out / name
        table.to_csv(path, index=name == "table3.csv")
        written.append(path)
    return written


def totals(counts: pd.DataFrame) -> pd.DataFrame:
    """Per model × variant × type: the counts summed over attributes."""
    columns = [c for c in ("n", "biaslab", "script", "published", "explained", "unexplained")
               if c in counts.columns]
    return counts.groupby(["model", "variant", "type"], sort=True)[columns].sum().reset_index()
