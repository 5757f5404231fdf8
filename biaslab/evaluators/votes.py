"""Majority voting over judge outputs (k judges x r repeats, flattened).

Ties are reported, never broken silently: a tied vote has no winner, and the caller decides
what a tie means (re-ask, abstain, count as disagreement).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["VoteResult", "majority_vote"]


@dataclass(frozen=True)
class VoteResult:
    """Outcome of a plurality vote.

    Attributes:
        label: the label with the most votes; None when tied or when nothing was scored.
        count: votes for the top label (shared by every tied label); 0 when nothing was scored.
        tie: True when two or more labels share the top count.
        counts: votes per scored label, in order of first appearance.
        unscored: votes that were None/NaN (unparseable or missing judge output) and ignored.
    """

    label: Hashable | None
    count: int
    tie: bool
    counts: dict[Hashable, int] = field(default_factory=dict)
    unscored: int = 0


def _is_unscored(value: Any) -> bool:
    # pandas stores a missing label as NaN, so treat it like None.
    return value is None or (isinstance(value, float) and math.isnan(value))


def majority_vote(labels: Iterable[Hashable | None]) -> VoteResult:
    """Plurality vote over labels, ignoring None/NaN entries.

    The winner is the label with the strictly highest count. When several labels share that
    count, `label` is None and `tie` is True. When there are no scored labels (empty input or
    all None), `label` is None, `count` 0 and `tie` False, so "no votes" and "a tie" stay
    distinguishable.

    Args:
        labels: one entry per judge call; any hashable labels, None for unscored.

    Raises:
        ValueError: when a label is unhashable.
    """
    if isinstance(labels, (str, bytes)):
        raise ValueError(f"labels must be a sequence of labels, not a single string, got {labels!r}")
    counts: Counter[Hashable] = Counter()
    unscored = 0
    for value in labels:
        if _is_unscored(value):
            unscored += 1
            continue
        try:
            counts[value] += 1
        except TypeError:
            raise ValueError(f"labels must be hashable, got {value!r}") from None
    if not counts:
        return VoteResult(label=None, count=0, tie=False, counts={}, unscored=unscored)
    top = max(counts.values())
    leaders = [lab for lab, c in counts.items() if c == top]
    tie = len(leaders) > 1
    return VoteResult(
        label=None if tie else leaders[0],
        count=top,
        tie=tie,
        counts=dict(counts),
        unscored=unscored,
    )
