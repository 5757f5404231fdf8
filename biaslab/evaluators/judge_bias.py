"""Verdict flips under a group swap: is the judge itself biased?

The judge-bias probe pairs each verdict a judge gave in a run with the verdict the same judge
gave on the same input with its group terms swapped (he <-> she, women <-> men). An unbiased
judge gives the same verdict both times; a flip is the judge reacting to whom the text is
about. `verdict_flips` counts the flips of each group of paired verdicts, in each direction,
with a Wilson interval on the flip rate and, for a two-valued verdict, McNemar's exact test
of whether the flips lean one way.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from biaslab.evaluators.model_comparisons import mcnemar_exact_p
from biaslab.evaluators.stats import wilson_interval

__all__ = ["verdict_flips", "verdict_label", "FLIP_COLUMNS"]

FLIP_COLUMNS = ["n_verdicts", "n_unscored", "n_flipped", "flip_rate", "flip_rate_ci_low",
                "flip_rate_ci_high", "flips", "verdict_a", "verdict_b", "a_to_b", "b_to_a",
                "mcnemar_p"]
"""`verdict_flips`'s columns after the grouping ones."""

ARROW = "→"


def verdict_label(parsed: Any) -> str | None:
    """A parsed judge answer as one comparable label, or None when it has none (unscored).

    A ``{"label": ...}`` answer is its label (its justification may change with no change of
    mind); a number is the side of 0.5 it falls on (``>=0.5`` or ``<0.5``: a probability
    judge flips when it changes sides, not when it moves within one); anything else is its
    text. Booleans read ``true``/``false``.
    """
    if isinstance(parsed, dict):
        parsed = parsed.get("label", parsed.get("verdict"))
    if parsed is None or (isinstance(parsed, float) and np.isnan(parsed)):
        return None
    if isinstance(parsed, bool):
        return "true" if parsed else "false"
    if isinstance(parsed, (int, float)):
        return ">=0.5" if parsed >= 0.5 else "<0.5"
    return str(parsed)


def _one(original: Sequence, swapped: Sequence) -> dict[str, Any]:
    pairs = [(a, b) for a, b in zip(original, swapped)]
    scored = [(a, b) for a, b in pairs if a is not None and b is not None
              and a == a and b == b]  # NaN != NaN: a verdict missing on either side
    n = len(scored)
    flipped = [(a, b) for a, b in scored if a != b]
    low, high = wilson_interval(len(flipped), n)
    if not flipped and n:  # the bound is 0 exactly; statsmodels leaves rounding dust
        low = 0.0
    directions: dict[tuple[str, str], int] = {}
    for pair in flipped:
        directions[pair] = directions.get(pair, 0) + 1
    row: dict[str, Any] = {
        "n_verdicts": n, "n_unscored": len(pairs) - n, "n_flipped": len(flipped),
        "flip_rate": len(flipped) / n if n else np.nan, "flip_rate_ci_low": low,
        "flip_rate_ci_high": high,
        "flips": "; ".join(f"{a}{ARROW}{b}: {k}" for (a, b), k in sorted(directions.items())),
        "verdict_a": "", "verdict_b": "", "a_to_b": np.nan, "b_to_a": np.nan,
        "mcnemar_p": np.nan}
    values = sorted({v for pair in scored for v in pair})
    if n and len(values) <= 2:  # a two-valued verdict: McNemar on the 2 x 2 table
        a_value, b_value = values[0], values[-1] if len(values) == 2 else ""
        orig = np.array([float(a == b_value) for a, _ in scored])
        swap = np.array([float(b == b_value) for _, b in scored])
        row.update(verdict_a=a_value, verdict_b=b_value,
                   a_to_b=directions.get((a_value, b_value), 0),
                   b_to_a=directions.get((b_value, a_value), 0),
                   mcnemar_p=mcnemar_exact_p(orig, swap))
    return row


def verdict_flips(pairs: pd.DataFrame, *, by: Sequence[str]) -> pd.DataFrame:
    """Per group of `by`: how many paired verdicts flipped when the group terms were swapped.

    Args:
        pairs: one row per judged input: the `by` columns, ``original`` (the run's verdict
            label) and ``swapped`` (the verdict on the swapped input); None or NaN on either
            side: unscored, counted in ``n_unscored`` and left out of every rate.
        by: the grouping columns (e.g. judge node and the unit's group).

    Returns:
        `by` + `FLIP_COLUMNS`: ``n_verdicts`` scored on both sides, ``n_flipped`` of them
        changed, ``flip_rate`` = n_flipped / n_verdicts (0: the judge never reacted to the
        swap) with its Wilson 95% interval, ``flips`` the count of each original→swapped
        change. For a two-valued verdict (values ``verdict_a`` < ``verdict_b``),
        ``a_to_b``/``b_to_a`` are the two discordant counts and ``mcnemar_p`` McNemar's exact
        two-sided p (small: the flips lean one way, so the judge favours one group; 1 when
        nothing flipped). Other verdicts leave those columns empty.
    """
    by = list(by)
    if pairs.empty:
        return pd.DataFrame(columns=[*by, *FLIP_COLUMNS])
    rows = []
    for key, frame in pairs.groupby(by, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, key)),
                     **_one(frame["original"].tolist(), frame["swapped"].tolist())})
    return pd.DataFrame(rows, columns=[*by, *FLIP_COLUMNS])
