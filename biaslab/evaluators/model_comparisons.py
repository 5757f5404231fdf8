"""Model against model on the same units, with p-values corrected for the whole family.

A run with several models answers the same units (same item, seed, node visit, condition) once
per model, so two models are compared *paired*: per unit, model B's value minus model A's.
Pairing removes the between-unit variance, exactly as exposed-vs-clean does on the exposure
axis (`biaslab.evaluators.exposure_effects`).

Per pair of models and per measure × condition × group:

* ``diff`` = mean_b − mean_a over the units both models scored, with a paired percentile
  bootstrap CI (fixed seed, so a re-run writes the same table);
* ``p``: McNemar's exact test when the measure is 0/1 in both models (only the discordant units
  count: B = 1 where A = 0, and the reverse; the p is the two-sided binomial(½) tail), else the
  two-sided percentile bootstrap p from the same resamples as the CI: twice the smaller share of
  resampled mean differences on either side of 0, counted with the +1 of a Monte-Carlo p so
  it is never 0; p < 1 − confidence exactly when the interval excludes 0 (up to the
  quantile's interpolation). A bootstrap, not a t test, because the interval is one too;
* ``p_holm`` and ``p_bh``: Holm–Bonferroni (family-wise error) and Benjamini–Hochberg (false
  discovery rate) adjustments over every row that has a p, whose count is ``family_size``.

Fewer than `MIN_PAIRS_FOR_CI` pairs: no interval and no p, and the row is not in the family.
"""

from __future__ import annotations

from itertools import combinations
from typing import Sequence

import numpy as np
import pandas as pd

from biaslab.evaluators.exposure_effects import MIN_PAIRS_FOR_CI, too_few_pairs

__all__ = ["mcnemar_exact_p", "bootstrap_mean_difference", "holm", "benjamini_hochberg",
           "compare_models", "MODEL_COMPARISON_COLUMNS", "MCNEMAR", "BOOTSTRAP",
           "N_RESAMPLES", "RANDOM_STATE"]

MCNEMAR = "mcnemar_exact"
BOOTSTRAP = "paired_bootstrap"
N_RESAMPLES = 9_999
"""Resamples per row: the smallest bootstrap p is 2 / 10 000, small enough to survive a Holm
adjustment over a family of a few hundred rows."""
RANDOM_STATE = 0

MODEL_COMPARISON_COLUMNS = ["unit", "variant", "node", "measure", "stratum", "condition",
                            "attribute", "group", "model_a", "model_b", "n_pairs", "mean_a",
                            "mean_b", "diff", "ci_low", "ci_high", "test", "p", "p_holm",
                            "p_bh", "family_size", "note"]

_CHUNK = 1 << 20  # index-matrix elements drawn at once: flat memory for large n


def mcnemar_exact_p(a: Sequence[float], b: Sequence[float]) -> float:
    """McNemar's exact two-sided p for paired 0/1 outcomes (statsmodels' ``mcnemar`` with
    ``exact=True`` on the 2 × 2 table of the pairs): only the discordant units count, n01 where
    ``a=0, b=1`` and n10 where ``a=1, b=0``; 1 when no unit is discordant."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n01 = int(np.sum((a == 0) & (b == 1)))
    n10 = int(np.sum((a == 1) & (b == 0)))
    if n01 + n10 == 0:
        return 1.0
    table = [[int(np.sum((a == 0) & (b == 0))), n01], [n10, int(np.sum((a == 1) & (b == 1)))]]
    from statsmodels.stats.contingency_tables import mcnemar  # here: ~0.7 s to import

    return float(mcnemar(table, exact=True).pvalue)


def bootstrap_mean_difference(d: Sequence[float], *, confidence: float = 0.95,
                              n_resamples: int = N_RESAMPLES,
                              random_state: int = RANDOM_STATE) -> tuple[float, float, float]:
    """The paired percentile bootstrap of the mean of per-unit differences `d`.

    Returns:
        ``(ci_low, ci_high, p)``: the [(1−c)/2, (1+c)/2] quantiles of the resampled means, and
        the two-sided p ``min(1, 2 · (min(#{d̄* ≤ 0}, #{d̄* ≥ 0}) + 1) / (B + 1))``. Every unit
        moved by the same amount: the interval is that amount; p is 1 if it is 0, else the
        smallest p the resamples can give.
    """
    d = np.asarray(d, dtype=float)
    if np.ptp(d) == 0:
        value = float(d[0])
        return value, value, 1.0 if value == 0 else 2.0 / (n_resamples + 1)
    rng = np.random.default_rng(random_state)
    n, means = d.size, np.empty(n_resamples)
    step = max(1, _CHUNK // n)
    for start in range(0, n_resamples, step):
        stop = min(start + step, n_resamples)
        means[start:stop] = d[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    tail = min(int(np.sum(means <= 0)), int(np.sum(means >= 0)))
    return float(low), float(high), float(min(1.0, 2.0 * (tail + 1) / (n_resamples + 1)))


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm–Bonferroni adjusted p-values (statsmodels' ``multipletests(method="holm")``):
    rejecting adjusted p < α keeps the family-wise error rate at α under any dependence."""
    p = np.asarray(p, dtype=float)
    from statsmodels.stats.multitest import multipletests

    return multipletests(p, method="holm")[1] if p.size else p


def benjamini_hochberg(p: Sequence[float]) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values (statsmodels' ``multipletests(method="fdr_bh")``):
    rejecting adjusted p < α keeps the expected share of false discoveries at α."""
    p = np.asarray(p, dtype=float)
    from statsmodels.stats.multitest import multipletests

    return multipletests(p, method="fdr_bh")[1] if p.size else p


def _binary(values: np.ndarray) -> bool:
    return bool(np.isin(values, (0.0, 1.0)).all())


def _compare(a: np.ndarray, b: np.ndarray, *, confidence: float, min_pairs: int) -> dict:
    n = int(a.size)
    out = {"n_pairs": n, "mean_a": float(a.mean()), "mean_b": float(b.mean()),
           "diff": float((b - a).mean()), "ci_low": np.nan, "ci_high": np.nan, "test": "",
           "p": np.nan, "note": ""}
    if n < max(min_pairs, 2):
        out["note"] = too_few_pairs(n)
        return out
    low, high, p = bootstrap_mean_difference(b - a, confidence=confidence)
    out.update(ci_low=low, ci_high=high, test=BOOTSTRAP, p=p)
    if _binary(a) and _binary(b):
        out.update(test=MCNEMAR, p=mcnemar_exact_p(a, b))
    return out


def compare_models(frame: pd.DataFrame, *, value: str, model: str, pair_on: Sequence[str],
                   by: Sequence[str], models: Sequence[str] | None = None,
                   confidence: float = 0.95, min_pairs: int = MIN_PAIRS_FOR_CI
                   ) -> pd.DataFrame:
    """Every pair of models on the same units, per (by...), adjusted over the whole family.

    Args:
        frame: one row per (by..., unit, model); `value` numeric, NaN = unscored (the pair is
            dropped, never imputed).
        model: the column naming the model.
        pair_on: the columns naming the same unit under both models.
        by: what each comparison is split by (variant, node, measure, condition, group...).
        models: the models' order: A is the earlier of each pair (default: sorted).

    Returns:
        One row per (by..., model_a, model_b) with at least one pair: `by`, ``model_a``,
        ``model_b``, ``n_pairs``, ``mean_a``, ``mean_b``, ``diff`` (B − A), ``ci_low``,
        ``ci_high``, ``test``, ``p``, ``p_holm``, ``p_bh``, ``family_size`` (NaN off the
        family) and ``note``.
    """
    by, keys = list(by), list(by) + list(pair_on)
    data = frame.dropna(subset=[value])
    order = list(models) if models is not None else sorted(set(data[model]))
    present = [m for m in order if m in set(data[model])]
    arms = {m: data[data[model] == m][keys + [value]] for m in present}
    for m, arm in arms.items():
        if arm.duplicated(keys).any():
            raise ValueError(f"pair_on={list(pair_on)} does not identify one {m!r} row per unit")
    rows = []
    for model_a, model_b in combinations(present, 2):
        merged = arms[model_a].merge(arms[model_b], on=keys, suffixes=("_a", "_b"))
        groups = merged.groupby(by, sort=True) if by else [((), merged)]
        for key, pairs in groups:
            key = key if isinstance(key, tuple) else (key,)
            result = _compare(pairs[f"{value}_a"].to_numpy(float),
                              pairs[f"{value}_b"].to_numpy(float),
                              confidence=confidence, min_pairs=min_pairs)
            rows.append({**dict(zip(by, key)), "model_a": model_a, "model_b": model_b,
                         **result})
    columns = [*by, "model_a", "model_b", "n_pairs", "mean_a", "mean_b", "diff", "ci_low",
               "ci_high", "test", "p", "p_holm", "p_bh", "family_size", "note"]
    out = pd.DataFrame(rows, columns=columns)
    tested = out["p"].notna()
    out["family_size"] = out["family_size"].astype(float)
    if tested.any():
        out.loc[tested, "p_holm"] = holm(out.loc[tested, "p"])
        out.loc[tested, "p_bh"] = benjamini_hochberg(out.loc[tested, "p"])
        out.loc[tested, "family_size"] = int(tested.sum())
    return out
