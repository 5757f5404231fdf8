"""Verdict flips under a group swap: is the judge itself biased?

The judge-bias probe pairs each verdict a judge gave in a run with the verdict the same judge
gave on the same input with its group terms swapped (he <-> she, women <-> men). An unbiased
judge gives the same verdict both times; a flip is the judge reacting to whom the text is
about. `verdict_flips` counts the flips of each group of paired verdicts, in each direction,
with a Wilson interval on the flip rate and, for a two-valued verdict, two exact McNemar
tests:

* ``mcnemar_p``, original against swapped verdict: do the flips go one way (yes → no more
  than no → yes)? A judge that labels every text about women biased flips yes → no on the
  women's texts and no → yes on the men's, so when a pool holds both, its flips cancel and
  this p says nothing (p = 1 for 6 against 6).
* ``one_sided_p``, the same verdicts oriented by *whom* each text was about: for each pair,
  the verdict when the text names the lexicon's first terms (he, men, ... : side 1) against
  when it names their partners (she, women, ...: side 2), whichever of the two the run
  showed first. ``b_with_side1`` counts the pairs whose verdict_b went with side 1 and
  verdict_a with side 2, ``b_with_side2`` the reverse; a one-sided judge puts all its flips
  in one of them, whichever group each text was about, and a small p says so. Inputs that
  name both sides equally (or no term) have no side and are left out of this test.
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
                "mcnemar_p", "n_sided", "b_with_side1", "b_with_side2", "one_sided_p"]
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


def _one(original: Sequence, swapped: Sequence, sides: Sequence[int] | None = None
         ) -> dict[str, Any]:
    pairs = [(a, b) for a, b in zip(original, swapped)]
    sides = list(sides) if sides is not None else [0] * len(pairs)
    sided = [(a, b, side) for (a, b), side in zip(pairs, sides)
             if side and a is not None and b is not None and a == a and b == b]
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
        "mcnemar_p": np.nan, "n_sided": len(sided), "b_with_side1": np.nan,
        "b_with_side2": np.nan, "one_sided_p": np.nan}
    values = sorted({v for pair in scored for v in pair})
    if n and len(values) <= 2:  # a two-valued verdict: McNemar on the 2 x 2 table
        a_value, b_value = values[0], values[-1] if len(values) == 2 else ""
        orig = np.array([float(a == b_value) for a, _ in scored])
        swap = np.array([float(b == b_value) for _, b in scored])
        row.update(verdict_a=a_value, verdict_b=b_value,
                   a_to_b=directions.get((a_value, b_value), 0),
                   b_to_a=directions.get((b_value, a_value), 0),
                   mcnemar_p=mcnemar_exact_p(orig, swap))
        # oriented by side: (verdict with side 1, verdict with side 2) for each sided pair
        one = np.array([float((a if side == 1 else b) == b_value) for a, b, side in sided])
        two = np.array([float((b if side == 1 else a) == b_value) for a, b, side in sided])
        row.update(b_with_side1=int(np.sum((one == 1) & (two == 0))),
                   b_with_side2=int(np.sum((one == 0) & (two == 1))),
                   one_sided_p=mcnemar_exact_p(one, two) if sided else np.nan)
    return row


def verdict_flips(pairs: pd.DataFrame, *, by: Sequence[str]) -> pd.DataFrame:
    """Per group of `by`: how many paired verdicts flipped when the group terms were swapped.

    Args:
        pairs: one row per judged input: the `by` columns, ``original`` (the run's verdict
            label) and ``swapped`` (the verdict on the swapped input); None or NaN on either
            side: unscored, counted in ``n_unscored`` and left out of every rate. An optional
            ``side`` column: 1 when the original input named side 1's terms (he, men...), 2
            when side 2's, 0 when neither more than the other.
        by: the grouping columns (e.g. judge node and the unit's group).

    Returns:
        `by` + `FLIP_COLUMNS`: ``n_verdicts`` scored on both sides, ``n_flipped`` of them
        changed, ``flip_rate`` = n_flipped / n_verdicts (0: the judge never reacted to the
        swap) with its Wilson 95% interval, ``flips`` the count of each original→swapped
        change. For a two-valued verdict (values ``verdict_a`` < ``verdict_b``),
        ``a_to_b``/``b_to_a`` are the two discordant counts and ``mcnemar_p`` McNemar's exact
        two-sided p (small: the flips lean one way, so the judge favours one group; 1 when
        nothing flipped), and ``n_sided``, ``b_with_side1``, ``b_with_side2`` and
        ``one_sided_p`` the same verdicts oriented by side (see the module: small when the
        judge treats one side differently, in one direction). Other verdicts leave those
        columns empty.
    """
    by = list(by)
    if pairs.empty:
        return pd.DataFrame(columns=[*by, *FLIP_COLUMNS])
    rows = []
    for key, frame in pairs.groupby(by, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        sides = frame["side"].tolist() if "side" in frame else None
        rows.append({**dict(zip(by, key)),
                     **_one(frame["original"].tolist(), frame["swapped"].tolist(), sides)})
    return pd.DataFrame(rows, columns=[*by, *FLIP_COLUMNS])
