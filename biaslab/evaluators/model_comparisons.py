"""Model against model on the same units, with p-values corrected for each family of tests.

A run with several models answers the same units (same item, node visit, condition) once per
model, so two models are compared *paired*: per unit, model B's value minus model A's.
Pairing removes the between-unit variance, exactly as exposed-vs-clean does on the exposure
axis (`biaslab.evaluators.exposure_effects`).

**The unit.** A pair is one unit, not one unit × seed: a spec's seeds re-ask the same unit,
and a deterministic model gives the same answer under every seed, so counting each seed as a
new pair would multiply the evidence without new units (6 "discordant pairs" that are 2 units
× 3 seeds). The ``replicates`` columns (the seed) are averaged per unit and model first, over
the seeds both models scored, as the protocols' own tables average a question's seeds; the
row says how many were averaged (``n_replicates``).

Per pair of models and per measure × condition × group:

* ``diff`` = mean_b − mean_a over the units both models scored, with a paired percentile
  bootstrap CI (fixed seed, so a re-run writes the same table);
* ``p``: McNemar's exact test when the measure is 0/1 in both models after the seeds are
  averaged (only the discordant units count: B = 1 where A = 0, and the reverse; the p is the
  two-sided binomial(½) tail), else the two-sided percentile bootstrap p from the same
  resamples as the CI: twice the smaller share of resampled mean differences on either side
  of 0, counted with the +1 of a Monte-Carlo p so it is never 0; p < 1 − confidence exactly
  when the interval excludes 0 (up to the quantile's interpolation). A bootstrap, not a t
  test, because the interval is one too;
* ``p_holm`` and ``p_bh``: Holm–Bonferroni (family-wise error) and Benjamini–Hochberg (false
  discovery rate) adjustments within the row's ``family``, whose count of distinct tests is
  ``family_size``.

**The family** is named by the caller (`family`): the report makes the pooled rows one family
and the per-group rows another, so no unit is tested twice within a family (a pooled row is
the sum of its group rows). **Each distinct comparison counts once**: of the label readings
of one field (``decision=hire``, ``decision=reject``), a reading whose values are the exact
complement of an earlier one's on the same units (a two-level label) is the same test with
the sign reversed; it keeps its p, takes its twin's adjusted p and is not counted again.

Fewer than `MIN_PAIRS_FOR_CI` pairs: no interval and no p, and the row is not in the family.
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from biaslab.evaluators.exposure_effects import MIN_PAIRS_FOR_CI, too_few_pairs

__all__ = ["mcnemar_exact_p", "bootstrap_mean_difference", "holm", "benjamini_hochberg",
           "compare_models", "MODEL_COMPARISON_COLUMNS", "MCNEMAR", "BOOTSTRAP",
           "N_RESAMPLES", "RANDOM_STATE", "ONE_FAMILY"]

MCNEMAR = "mcnemar_exact"
BOOTSTRAP = "paired_bootstrap"
N_RESAMPLES = 9_999
"""Resamples per row: the smallest bootstrap p is 2 / 10 000, small enough to survive a Holm
adjustment over a family of a few hundred rows."""
RANDOM_STATE = 0
ONE_FAMILY = "all rows"
"""The family's name when the caller names none: every tested row."""

MODEL_COMPARISON_COLUMNS = ["unit", "variant", "node", "measure", "stratum", "condition",
                            "attribute", "group", "model_a", "model_b", "n_pairs", "n_seeds",
                            "mean_a", "mean_b", "diff", "ci_low", "ci_high", "test", "p", "p_holm",
                            "p_bh", "family", "family_size", "note"]

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
    """Holm–Bonferroni adjusted p-values: rejecting adjusted p < α keeps the family-wise error
    rate at α under any dependence. With the m p-values sorted, p₍₁₎ ≤ … ≤ p₍ₘ₎,

        p̃₍ᵢ₎ = min(1, max_{j ≤ i} (m − j + 1) · p₍ⱼ₎),

    each put back in its original place: what statsmodels' ``multipletests(method="holm")``
    returns (tests/experiments/test_model_comparisons_cli.py holds it to that). Computed
    here because statsmodels ends its Holm branch with a full ``gc.collect()``, which in a
    report's process (pandas, LangGraph and the run's objects) took ~0.2 s a call."""
    p = np.asarray(p, dtype=float)
    if not p.size:
        return p
    order = np.argsort(p, kind="stable")
    m = p.size
    stepped = np.maximum.accumulate(p[order] * np.arange(m, 0, -1))
    out = np.empty_like(p)
    out[order] = np.minimum(stepped, 1.0)
    return out


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


def _complement_of(rows: list[dict], arrays: list[tuple], by: list[str],
                   labels: str | None) -> dict[int, int]:
    """Row index → the earlier row it repeats: same other `by` values and model pair, a label
    reading of the same field (``field=label``), and values that are 1 − the earlier row's on
    the same units in both models."""
    if labels is None:
        return {}
    out: dict[int, int] = {}
    seen: dict[tuple, list[int]] = {}
    for j, row in enumerate(rows):
        name = str(row[labels])
        if "=" not in name:
            continue
        key = (name.partition("=")[0], row["model_a"], row["model_b"],
               *(row[c] for c in by if c != labels))
        units_j, a_j, b_j = arrays[j]
        for i in seen.get(key, []):
            units_i, a_i, b_i = arrays[i]
            if (units_i.equals(units_j) and np.array_equal(a_j, 1 - a_i)
                    and np.array_equal(b_j, 1 - b_i)):
                out[j] = i
                break
        else:
            seen.setdefault(key, []).append(j)
    return out


def compare_models(frame: pd.DataFrame, *, value: str, model: str, pair_on: Sequence[str],
                   by: Sequence[str], models: Sequence[str] | None = None,
                   replicates: Sequence[str] = (), family: Callable[[Mapping], str] | None = None,
                   labels: str | None = None, confidence: float = 0.95,
                   min_pairs: int = MIN_PAIRS_FOR_CI) -> pd.DataFrame:
    """Every pair of models on the same units, per (by...), adjusted within each family.

    Args:
        frame: one row per (by..., unit, model); `value` numeric, NaN = unscored (the pair is
            dropped, never imputed).
        model: the column naming the model.
        pair_on: the columns naming the same unit under both models.
        by: what each comparison is split by (variant, node, measure, condition, group...).
        models: the models' order: A is the earlier of each pair (default: sorted).
        replicates: columns of `pair_on` that re-ask one unit (the seed): both models' values
            are averaged over them per unit, over the replicates both scored, so a pair is a
            unit.
        family: a row's family (given the row's `by` values); Holm and BH adjust within each.
            Default: one family, `ONE_FAMILY`.
        labels: the `by` column whose values are ``field=label`` readings: a reading that is
            the complement of an earlier one of the same field is the same test (counted once).

    Returns:
        One row per (by..., model_a, model_b) with at least one pair: `by`, ``model_a``,
        ``model_b``, ``n_pairs`` (units), ``n_seeds`` (the most replicates averaged for one
        unit), ``mean_a``, ``mean_b``, ``diff`` (B − A), ``ci_low``, ``ci_high``, ``test``,
        ``p``, ``p_holm``, ``p_bh``, ``family``, ``family_size`` (NaN off the family) and
        ``note``.
    """
    by, keys = list(by), list(by) + list(pair_on)
    units = [k for k in pair_on if k not in set(replicates)]
    data = frame.dropna(subset=[value])
    order = list(models) if models is not None else sorted(set(data[model]))
    present = [m for m in order if m in set(data[model])]
    arms = {m: data[data[model] == m][keys + [value]] for m in present}
    for m, arm in arms.items():
        if arm.duplicated(keys).any():
            raise ValueError(f"pair_on={list(pair_on)} does not identify one {m!r} row per unit")
    rows, arrays = [], []
    for model_a, model_b in combinations(present, 2):
        merged = arms[model_a].merge(arms[model_b], on=keys, suffixes=("_a", "_b"))
        merged = (merged.groupby(by + units, sort=True, dropna=False)
                  .agg(a=(f"{value}_a", "mean"), b=(f"{value}_b", "mean"),
                       n_seeds=(f"{value}_a", "size")).reset_index())
        groups = merged.groupby(by, sort=True, dropna=False) if by else [((), merged)]
        for key, pairs in groups:
            key = key if isinstance(key, tuple) else (key,)
            a, b = pairs["a"].to_numpy(float), pairs["b"].to_numpy(float)
            result = _compare(a, b, confidence=confidence, min_pairs=min_pairs)
            row = {**dict(zip(by, key)), "model_a": model_a, "model_b": model_b, **result,
                   "n_seeds": int(pairs["n_seeds"].max())}
            row["family"] = family(row) if family else ONE_FAMILY
            rows.append(row)
            arrays.append((pairs[units].reset_index(drop=True), a, b))
    columns = [*by, "model_a", "model_b", "n_pairs", "n_seeds", "mean_a", "mean_b", "diff",
               "ci_low", "ci_high", "test", "p", "p_holm", "p_bh", "family", "family_size",
               "note"]
    twins = _complement_of(rows, arrays, by, labels)
    out = pd.DataFrame(rows, columns=columns)
    out["family_size"] = out["family_size"].astype(float)
    out["p_holm"] = out["p_holm"].astype(float)
    out["p_bh"] = out["p_bh"].astype(float)
    repeat = out.index.isin(list(twins))
    for name in out["family"].unique():
        tested = out["p"].notna() & (out["family"] == name) & ~repeat
        if tested.any():
            out.loc[tested, "p_holm"] = holm(out.loc[tested, "p"])
            out.loc[tested, "p_bh"] = benjamini_hochberg(out.loc[tested, "p"])
            out.loc[tested, "family_size"] = int(tested.sum())
    for j, i in twins.items():
        if not math.isnan(out.at[i, "p"]):
            for column in ("p_holm", "p_bh", "family_size"):
                out.at[j, column] = out.at[i, column]
            out.at[j, "note"] = (f"the complement of {rows[i][labels]}: the same test, "
                                 "counted once")
    return out
