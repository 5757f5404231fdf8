"""Exposed arm against clean arm, paired on the same items: the effect of an exposure.

Every protocol asks the same question of its exposure grid: how far does exposing these nodes
in this direction move a per-item quantity (a bias label, a decisive answer, a probability)
compared with the clean arm on the *same* items? Pairing removes between-item variance.
`paired_condition_effects` gives the difference a paired bootstrap CI (the protocols' own
tables); `paired_arms` gives it a paired t interval and no interval at all on fewer than
`MIN_PAIRS_FOR_CI` pairs (the generic tables: exposed vs clean, counterfactual vs source).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
# pandas is imported inside the functions that use it: it costs ~0.5 s at the start of every
# `biaslab` command (the protocols' graphs import this module to register them).
if TYPE_CHECKING:
    import pandas as pd

from biaslab.evaluators.stats import paired_bootstrap

__all__ = ["paired_condition_effects", "paired_mean_difference", "paired_arms",
           "too_few_pairs", "pairing_label", "CLEAN_CONDITION", "MIN_PAIRS_FOR_CI",
           "UNIT_PAIRING", "SEED_PAIRING", "PAIRINGS"]

CLEAN_CONDITION = "none"

MIN_PAIRS_FOR_CI = 10
"""No interval is given on fewer pairs than this: with two or three pairs a "CI" is as wide
or as narrow as chance makes it (often zero-width), and reads as an effect it is not."""


UNIT_PAIRING = "unit"
"""The default pairing rule of every paired table: a pair is one unit (same item, node visit
and unit id) in both arms, its seeds averaged first, so ``n_pairs`` counts units. Seeds of one
unit re-ask the same question; counting them as independent pairs would shrink the interval by
up to √(number of seeds) with no new evidence (a deterministic model's three seeds are one
observation three times)."""
SEED_PAIRING = "per-seed"
"""The named alternative: each (unit, seed) is its own pair, as if seeds were independent
units. Available through the Python API (``pairing=SEED_PAIRING``), never the default."""
PAIRINGS = (UNIT_PAIRING, SEED_PAIRING)


def pairing_label(pairing: str) -> str:
    """The words a table's ``pairing`` column carries: what one pair is."""
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    return "unit, seeds averaged" if pairing == UNIT_PAIRING else "unit x seed"


def too_few_pairs(n: int) -> str:
    """The note a table writes instead of an interval on fewer than `MIN_PAIRS_FOR_CI` pairs."""
    return f"too few pairs (n={n})"


def paired_mean_difference(other: Sequence[float], reference: Sequence[float], *,
                           confidence: float = 0.95, min_pairs: int = MIN_PAIRS_FOR_CI
                           ) -> dict:
    """Mean of ``other - reference`` over aligned pairs, with a paired t interval.

    With per-pair differences d_i (i = 1..n), mean d̄ and standard deviation s (ddof=1), the
    interval is ``d̄ ± t_{(1+c)/2, n-1} · s / √n``. 0 means no change; an interval that
    excludes 0 is a change at that confidence. Below `min_pairs` pairs no interval is given
    (``ci_low``/``ci_high`` NaN) and ``note`` says why.

    Returns:
        ``n_pairs``, ``reference_mean``, ``other_mean``, ``diff``, ``ci_low``, ``ci_high``,
        ``note`` ("" when the interval is given).
    """
    a = np.asarray(other, dtype=float)
    b = np.asarray(reference, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in length: {a.shape} vs {b.shape}")
    n = int(a.size)
    out = {"n_pairs": n, "reference_mean": np.nan, "other_mean": np.nan, "diff": np.nan,
           "ci_low": np.nan, "ci_high": np.nan, "note": ""}
    if n == 0:
        out["note"] = too_few_pairs(0)
        return out
    d = a - b
    diff = float(d.mean())
    out.update(reference_mean=float(b.mean()), other_mean=float(a.mean()), diff=diff)
    if n < max(min_pairs, 2):
        out["note"] = too_few_pairs(n)
        return out
    from scipy import stats as scipy_stats  # here, not at import: ~0.4 s for every command

    half = float(scipy_stats.t.ppf((1 + confidence) / 2, n - 1) * d.std(ddof=1) / np.sqrt(n))
    out.update(ci_low=diff - half, ci_high=diff + half)
    return out


def paired_arms(frame: pd.DataFrame, *, value: str, pair_on: Sequence[str], arm: str,
                reference: str, by: Sequence[str] = (), names: tuple[str, str] = ("reference",
                                                                                  "other"),
                replicates: Sequence[str] = (), confidence: float = 0.95,
                min_pairs: int = MIN_PAIRS_FOR_CI) -> pd.DataFrame:
    """Every arm against the `reference` arm on the same units: `paired_mean_difference` per
    (by..., arm).

    Args:
        frame: one row per (by..., unit, arm); `value` numeric, NaN = unscored (the pair is
            dropped, never imputed).
        pair_on: the columns naming the same unit in both arms.
        arm: the column naming the arm (an exposure condition, or which run).
        reference: the arm the others are compared with (clean, or the source run).
        names: how the two means are named in the result (``{name}_mean``).
        replicates: columns of `pair_on` that re-ask one unit (the seed). Where given, both
            arms' values are averaged over the replicates both arms scored, per unit, before
            the difference is taken: a pair is then a unit, and ``n_seeds`` says how many
            replicates the unit with the most of them averaged. Empty: every row of
            `pair_on` is a pair (``n_seeds`` = 1).

    Returns:
        One row per (by..., arm ≠ reference) with at least one pair: ``n_pairs``,
        ``n_seeds``, ``{names[0]}_mean``, ``{names[1]}_mean``, ``diff`` (other − reference),
        ``ci_low``, ``ci_high`` and ``note``.
    """
    import pandas as pd

    by, keys = list(by), list(by) + list(pair_on)
    units = [k for k in pair_on if k not in set(replicates)]
    ref_col, other_col = f"{names[0]}_mean", f"{names[1]}_mean"
    columns = [*by, arm, "n_pairs", "n_seeds", ref_col, other_col, "diff", "ci_low",
               "ci_high", "note"]
    data = frame.dropna(subset=[value])
    base = data[data[arm] == reference][keys + [value]].rename(columns={value: "_reference"})
    if base.duplicated(keys).any():
        raise ValueError(f"pair_on={list(pair_on)} does not identify one {reference!r} row "
                         "per unit")
    rows = []
    for other, part in data[data[arm] != reference].groupby(arm, sort=True):
        merged = part[keys + [value]].merge(base, on=keys, how="inner")
        if merged.duplicated(keys).any():
            raise ValueError(f"pair_on={list(pair_on)} does not identify one {other!r} row "
                             "per unit")
        if replicates:  # one pair per unit: its seeds (scored in both arms) averaged first
            merged = (merged.groupby(by + units, sort=True, dropna=False)
                      .agg(**{value: (value, "mean"), "_reference": ("_reference", "mean"),
                              "_n_seeds": (value, "size")}).reset_index())
        else:
            merged = merged.assign(_n_seeds=1)
        groups = merged.groupby(by, sort=True) if by else [((), merged)]
        for key, pairs in groups:
            key = key if isinstance(key, tuple) else (key,)
            result = paired_mean_difference(pairs[value], pairs["_reference"],
                                            confidence=confidence, min_pairs=min_pairs)
            result[ref_col] = result.pop("reference_mean")
            result[other_col] = result.pop("other_mean")
            result["n_seeds"] = int(pairs["_n_seeds"].max())
            rows.append({**dict(zip(by, key)), arm: other, **result})
    return pd.DataFrame(rows, columns=columns)


def paired_condition_effects(frame: pd.DataFrame, *, value: str, pair_on: Sequence[str],
                             condition: str = "condition", by: Sequence[str] = (),
                             clean: str = CLEAN_CONDITION, n_resamples: int = 2_000,
                             confidence: float = 0.95, random_state: int = 0) -> pd.DataFrame:
    """Mean of `value` in each exposed condition minus the clean arm's, over paired items.

    Args:
        frame: one row per (item, condition); `value` numeric or boolean, NaN = unscored
            (a pair with a NaN on either side is dropped, never imputed).
        value: the column compared (a rate when it is 0/1).
        pair_on: columns that identify the same item in both arms (e.g. question id, model,
            seed, repeat).
        condition: the column naming the arm; `clean` marks the reference arm.
        by: further columns to split the comparison by (e.g. model, category).

    Returns:
        One row per (by..., condition ≠ clean): ``n_pairs``, ``clean_mean``, ``exposed_mean``,
        ``diff`` (exposed − clean; 0 means no effect) and its ``ci_low``/``ci_high``.
    """
    import pandas as pd

    keys = list(by) + list(pair_on)
    rows = []
    data = frame.copy()
    data[value] = pd.to_numeric(data[value].astype("float64"), errors="coerce")
    base = data[data[condition] == clean][keys + [value]].rename(columns={value: "_clean"})
    if base.duplicated(keys).any():
        raise ValueError(f"pair_on={list(pair_on)} does not identify one clean row per item")
    for cond, arm in data[data[condition] != clean].groupby(condition, sort=False):
        merged = arm[keys + [value]].merge(base, on=keys, how="inner").dropna(
            subset=[value, "_clean"])
        groups = merged.groupby(list(by), sort=True) if by else [((), merged)]
        for group_key, part in groups:
            group_key = group_key if isinstance(group_key, tuple) else (group_key,)
            row = dict(zip(by, group_key))
            row.update({condition: cond, "n_pairs": len(part)})
            if len(part) == 0:
                rows.append({**row, "clean_mean": np.nan, "exposed_mean": np.nan,
                             "diff": np.nan, "ci_low": np.nan, "ci_high": np.nan})
                continue
            exposed, clean_values = part[value].to_numpy(), part["_clean"].to_numpy()
            diff = float(exposed.mean() - clean_values.mean())
            if len(part) >= 2 and np.ptp(exposed - clean_values) > 0:
                boot = paired_bootstrap(lambda a, b: float(np.mean(a) - np.mean(b)), exposed,
                                        clean_values, n_resamples=n_resamples,
                                        confidence=confidence, random_state=random_state)
                low, high = boot.ci_low, boot.ci_high
            else:  # every pair moved by the same amount: the bootstrap has no spread
                low = high = diff
            rows.append({**row, "clean_mean": float(clean_values.mean()),
                         "exposed_mean": float(exposed.mean()), "diff": diff,
                         "ci_low": low, "ci_high": high})
    columns = [*by, condition, "n_pairs", "clean_mean", "exposed_mean", "diff", "ci_low",
               "ci_high"]
    return pd.DataFrame(rows, columns=columns)
