"""Exposed arm against clean arm, paired on the same items: the effect of an exposure.

Every protocol asks the same question of its exposure grid: how far does exposing these nodes
in this direction move a per-item quantity (a bias label, a decisive answer, a probability)
compared with the clean arm on the *same* items? Pairing removes between-item variance, so the
difference gets a paired bootstrap CI. One function serves every protocol and the generic report.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from biaslab.evaluators.stats import paired_bootstrap

__all__ = ["paired_condition_effects", "CLEAN_CONDITION"]

CLEAN_CONDITION = "none"


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
