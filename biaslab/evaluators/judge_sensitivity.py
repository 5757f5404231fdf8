"""Judge sensitivity: which judge answers each judge configuration keeps, and how far a
headline moves between configurations.

A *panel* is the set of judges whose verdicts a run recorded on the same judged texts: a
protocol's judge nodes (roleplay's three Why judges) plus any alternate judge models replayed
over the same texts. One judged text is a *slot*; each member has at most one vote on it (its
parsed verdict, None when unparsed). A *configuration* says, per slot, what every judge node
answers in a re-scoring:

- ``recorded``: each node its own recorded answer (the run as it was);
- ``only:<m>``: every node answers as member m, so m alone decides;
- ``drop:<m>`` (panels of 3 or more): the strict majority of the other members, or no vote;
- ``majority``: the strict majority of the whole panel, or no vote;
- ``unanimous``: a verdict only where every member gave the same one, else no vote.

A strict majority is a verdict held by more than half of *all* members, unparsed votes
included, so a tie, or too many unparsed votes, gives no verdict (as roleplay's oracles
decide). For numeric verdicts (a probability), ``majority`` is the median member's answer
when more than half of the members answered.

Then `sensitivity_bands` compares every headline row over the configurations: the band
(min–max), and whether its sign or its significance differs between configurations.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Hashable, Mapping, Sequence

import pandas as pd

__all__ = ["Vote", "Configuration", "configurations", "strict_majority_answer",
           "sensitivity_bands", "ALPHA", "RECORDED"]

ALPHA = 0.05
RECORDED = "recorded"


@dataclass(frozen=True)
class Vote:
    """One member's answer on one slot: the raw text to replay and the verdict it carries."""

    raw: str | None
    verdict: Hashable | None


@dataclass(frozen=True)
class Configuration:
    """A named rule: slot votes (member → Vote) → the answer every judge node gives, or None
    to let each node answer its own recorded answer (``recorded``)."""

    name: str
    kind: str
    member: str | None = None

    def answer(self, votes: Mapping[str, Vote]) -> Vote | None:
        """The one answer every judge node gives on this slot (a Vote with raw None: no
        vote); None for ``recorded``."""
        if self.kind == RECORDED:
            return None
        if self.kind == "only":
            return votes.get(self.member, Vote(None, None))
        pool = [votes.get(m, Vote(None, None)) for m in sorted(votes)
                if self.kind != "drop" or m != self.member]
        if self.kind == "majority" or self.kind == "drop":
            return strict_majority_answer(pool)
        if self.kind == "unanimous":
            verdicts = {v.verdict for v in pool}
            if pool and None not in verdicts and len(verdicts) == 1:
                return pool[0]
            return Vote(None, None)
        raise ValueError(f"unknown configuration kind {self.kind}")


def configurations(members: Sequence[str]) -> list[Configuration]:
    """Every configuration of a panel, in a fixed order (``drop`` only for 3 members or more,
    since dropping one of two leaves a single judge: ``only`` already covers it)."""
    out = [Configuration(RECORDED, RECORDED)]
    out += [Configuration(f"only:{m}", "only", m) for m in members]
    if len(members) >= 3:
        out += [Configuration(f"drop:{m}", "drop", m) for m in members]
    out += [Configuration("majority", "majority"), Configuration("unanimous", "unanimous")]
    return out


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def strict_majority_answer(pool: Sequence[Vote]) -> Vote:
    """The answer of a verdict held by more than half of the pool (unparsed votes count in
    the pool), or no vote. Numeric verdicts: the median member's answer (the lower median for
    an even count) when more than half of the pool answered."""
    scored = [v for v in pool if v.verdict is not None]
    if not pool or len(scored) * 2 <= len(pool):
        return Vote(None, None)
    if all(_numeric(v.verdict) for v in scored):
        median = statistics.median_low([v.verdict for v in scored])
        return next(v for v in scored if v.verdict == median)
    counts: dict[Hashable, int] = {}
    for v in scored:
        counts[v.verdict] = counts.get(v.verdict, 0) + 1
    verdict, n = max(counts.items(), key=lambda kv: kv[1])
    if n * 2 <= len(pool):
        return Vote(None, None)
    return next(v for v in scored if v.verdict == verdict)


def _sign(x: float) -> int:
    return 0 if x == 0 else (1 if x > 0 else -1)


def _significant(row: Mapping[str, Any]) -> bool | None:
    p = row.get("p")
    if p is not None and not _nan(p):
        return bool(p < ALPHA)
    low, high = row.get("ci_low"), row.get("ci_high")
    if low is None or high is None or _nan(low) or _nan(high):
        return None
    return bool(low > 0 or high < 0)


def _nan(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def sensitivity_bands(long: pd.DataFrame) -> pd.DataFrame:
    """One row per headline row: its value under ``recorded``, the band over every
    configuration that gave a value, and the flips.

    Args:
        long: one row per configuration × headline row, with columns ``table``, ``row``
            (the row's keys as text), ``configuration``, ``value`` and, where the table has
            them, ``ci_low``, ``ci_high``, ``p``.

    Returns columns: table, row, recorded, recorded_significant, band_low, band_high,
    n_configurations (with a value), sign_flips (a positive value in one configuration and
    a negative one in another), significance_flips (significant at 5% — p < 0.05, else a 95%
    CI excluding 0 — in one configuration and not in another), and flipped_by (the
    configurations whose sign or significance differs from ``recorded``'s).
    """
    rows = []
    for (table, row), part in long.groupby(["table", "row"], sort=False):
        part = part[part["value"].notna()]
        records = part.to_dict("records")
        recorded = next((r for r in records if r["configuration"] == RECORDED), None)
        signs = {_sign(r["value"]) for r in records}
        sig = {r["configuration"]: _significant(r) for r in records}
        known = {s for s in sig.values() if s is not None}
        flipped = []
        if recorded is not None:
            for r in records:
                if r["configuration"] == RECORDED:
                    continue
                sign_differs = _sign(r["value"]) * _sign(recorded["value"]) < 0
                sig_differs = (sig[r["configuration"]] is not None
                               and sig[RECORDED] is not None
                               and sig[r["configuration"]] != sig[RECORDED])
                if sign_differs or sig_differs:
                    flipped.append(r["configuration"])
        rows.append({
            "table": table, "row": row,
            "recorded": recorded["value"] if recorded else float("nan"),
            "recorded_significant": sig.get(RECORDED),
            "band_low": part["value"].min() if len(part) else float("nan"),
            "band_high": part["value"].max() if len(part) else float("nan"),
            "n_configurations": len(part),
            "sign_flips": 1 in signs and -1 in signs,
            "significance_flips": len(known) == 2,
            "flipped_by": " ".join(flipped)})
    return pd.DataFrame(rows, columns=["table", "row", "recorded", "recorded_significant",
                                       "band_low", "band_high", "n_configurations",
                                       "sign_flips", "significance_flips", "flipped_by"])
