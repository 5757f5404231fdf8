"""Uncertainty and agreement statistics for bias evaluations.

Two families live here:

* Resampling: `bootstrap` / `paired_bootstrap` give a percentile confidence interval and a
  standard error ("± std" in tables) for any statistic computed over items.
* Tests and agreement: `two_proportion_ztest` compares two rates; `cohens_kappa`,
  `fleiss_kappa` and `gwet_ac1` measure chance-corrected agreement between raters
  (e.g. LLM judges).

Every function that draws random numbers takes an explicit `random_state`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

# scipy.stats and statsmodels are imported by the two functions that use them: a protocol that
# only bootstraps should not make every `biaslab` command pay ~0.4 s of imports for them.

__all__ = [
    "RandomState",
    "BootstrapResult",
    "bootstrap",
    "paired_bootstrap",
    "ZTestResult",
    "two_proportion_ztest",
    "cohens_kappa",
    "fleiss_kappa",
    "fleiss_kappa_from_counts",
    "gwet_ac1",
    "gwet_ac1_from_counts",
    "wilson_interval",
    "paired_difference_interval",
]

RandomState = int | np.random.Generator | None
"""Seed (int), a ready Generator, or None for fresh OS entropy (not reproducible)."""

# Cap on index-matrix elements drawn at once: ~8 MB of int64 per chunk keeps memory flat
# for large n while still amortising the per-draw overhead over many resamples.
_MAX_INDEX_ELEMENTS = 1 << 20

_ALTERNATIVES = ("two-sided", "larger", "smaller")


# --------------------------------------------------------------------------- bootstrap


@dataclass(frozen=True)
class BootstrapResult:
    """Summary of a percentile bootstrap.

    Attributes:
        estimate: the statistic on the original (un-resampled) data; report this as the point value.
        mean: mean of the statistic over resamples (differs from `estimate` by the bootstrap bias).
        std: standard deviation (ddof=1) over resamples, i.e. the bootstrap standard error;
            the "± std" reported in tables.
        ci_low: lower percentile bound, the (1 - confidence) / 2 quantile of the resamples.
        ci_high: upper percentile bound, the (1 + confidence) / 2 quantile of the resamples.
        n_resamples: number of resamples requested.
        confidence: nominal coverage of [ci_low, ci_high], e.g. 0.95.
        n_dropped: resamples whose statistic was NaN or infinite and so were left out of
            mean/std/CI (e.g. a resample that happened to miss a whole group).
    """

    estimate: float
    mean: float
    std: float
    ci_low: float
    ci_high: float
    n_resamples: int
    confidence: float
    n_dropped: int = 0

    def excludes(self, value: float = 0.0) -> bool:
        """True when `value` lies outside [ci_low, ci_high].

        With the default 0.0 this reads as "the effect is distinguishable from zero at this
        confidence level".
        """
        return not (self.ci_low <= value <= self.ci_high)


def _rng(random_state: RandomState) -> np.random.Generator:
    # bool is an int subclass; a stray True/False is almost certainly a bug, not a seed.
    if random_state is None or isinstance(random_state, np.random.Generator):
        return np.random.default_rng(random_state)
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ValueError(f"random_state must be a non-negative int, got {random_state!r}")
        return np.random.default_rng(int(random_state))
    raise ValueError(
        f"random_state must be an int, a numpy Generator or None, got {random_state!r}"
    )


def _item_arrays(arrays: Sequence[ArrayLike]) -> list[np.ndarray]:
    """Converts inputs to arrays whose first axis is the item axis; checks equal lengths."""
    if not arrays:
        raise ValueError("arrays must hold at least one item-aligned array, got none")
    out = [np.asarray(a) for a in arrays]
    for i, a in enumerate(out):
        if a.ndim == 0:
            raise ValueError(f"arrays[{i}] must be at least 1-D (one entry per item), got a scalar {a!r}")
    lengths = [len(a) for a in out]
    if len(set(lengths)) != 1:
        raise ValueError(f"arrays must all have the same length (one entry per item), got lengths {lengths}")
    if lengths[0] == 0:
        raise ValueError("arrays must hold at least one item, got length 0")
    return out


def bootstrap(
    statistic: Callable[..., float],
    *arrays: ArrayLike,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    random_state: RandomState = 0,
) -> BootstrapResult:
    """Nonparametric percentile bootstrap over items.

    Each resample draws n item indices with replacement and evaluates
    ``statistic(*(a[idx] for a in arrays))``. All arrays are item-aligned (same length along
    axis 0) and share the same indices, so passing several arrays is a paired bootstrap.
    The CI is the [(1-c)/2, (1+c)/2] quantiles of the resampled statistics; resamples
    giving NaN/inf are dropped and counted in `n_dropped`.

    Args:
        statistic: maps the resampled arrays to a float.
        *arrays: item-aligned data; axis 0 indexes items.
        n_resamples: number of bootstrap resamples (>= 2).
        confidence: CI coverage in (0, 1).
        random_state: seed or Generator; the same seed gives the same result.

    Returns:
        A `BootstrapResult`; read `estimate` ± `std`, with [`ci_low`, `ci_high`].

    Raises:
        ValueError: arrays of different lengths, bad `n_resamples`/`confidence`/`random_state`,
            or fewer than two resamples with a finite statistic.
    """
    data = _item_arrays(arrays)
    try:
        n_resamples = operator.index(n_resamples)
    except TypeError:
        raise ValueError(f"n_resamples must be an int >= 2, got {n_resamples!r}") from None
    if n_resamples < 2:
        raise ValueError(f"n_resamples must be an int >= 2, got {n_resamples!r}")
    if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be a float in (0, 1), got {confidence!r}")
    rng = _rng(random_state)

    n = len(data[0])
    estimate = float(statistic(*data))
    values = np.empty(n_resamples, dtype=float)
    # The statistic is an arbitrary Python callable, so only the indexing can be vectorised:
    # gather a whole chunk of resamples per array at once, then call the statistic per row.
    chunk = max(1, _MAX_INDEX_ELEMENTS // n)
    for start in range(0, n_resamples, chunk):
        stop = min(start + chunk, n_resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        gathered = [a[idx] for a in data]
        for row in range(stop - start):
            values[start + row] = statistic(*(g[row] for g in gathered))

    finite = values[np.isfinite(values)]
    if finite.size < 2:
        raise ValueError(
            f"statistic gave a finite value on only {finite.size} of {n_resamples} resamples; "
            "cannot form a bootstrap distribution"
        )
    alpha = 1.0 - confidence
    ci_low, ci_high = np.quantile(finite, [alpha / 2, 1 - alpha / 2])
    return BootstrapResult(
        estimate=estimate,
        mean=float(finite.mean()),
        std=float(finite.std(ddof=1)),
        ci_low=float(ci_low),
        ci_high=float(ci_high),
        n_resamples=n_resamples,
        confidence=float(confidence),
        n_dropped=int(n_resamples - finite.size),
    )


def paired_bootstrap(
    statistic: Callable[..., float],
    *arrays: ArrayLike,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    random_state: RandomState = 0,
) -> BootstrapResult:
    """Percentile bootstrap for paired measurements of the same items.

    Use it when the arrays describe the same instances, e.g. ``(clean_pred, exposed_pred,
    group)``: item i of every array is drawn together, so within-item correlation is kept
    and the interval on a difference such as ``mean(exposed != clean)`` is not inflated by
    between-item variance. Identical to `bootstrap`, which already resamples aligned arrays
    with shared indices; this name documents the intent.

    Raises:
        ValueError: arrays of different lengths (the pairing would be undefined), plus the
            cases listed in `bootstrap`.
    """
    return bootstrap(
        statistic, *arrays, n_resamples=n_resamples, confidence=confidence, random_state=random_state
    )


# ------------------------------------------------------------------------ z test


@dataclass(frozen=True)
class ZTestResult:
    """Result of a two-proportion z test.

    Attributes:
        z: (p_a - p_b) / pooled standard error; positive when group a has the higher rate.
        p_value: probability under H0 (p_a == p_b) of a z at least this extreme in the
            direction of `alternative`.
        diff: p_a - p_b, the raw difference in rates.
    """

    z: float
    p_value: float
    diff: float


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int, got {value!r}") from None


def two_proportion_ztest(
    successes_a: int,
    n_a: int,
    successes_b: int,
    n_b: int,
    *,
    alternative: str = "two-sided",
) -> ZTestResult:
    """Pooled-variance z test for the difference of two proportions.

    With p_a = s_a / n_a, p_b = s_b / n_b and pooled p = (s_a + s_b) / (n_a + n_b):
    z = (p_a - p_b) / sqrt(p (1 - p) (1/n_a + 1/n_b)). Matches
    ``statsmodels.stats.proportion.proportions_ztest`` with its default settings.

    Args:
        successes_a, n_a: successes and trials in group a (0 <= successes_a <= n_a, n_a >= 1).
        successes_b, n_b: same for group b.
        alternative: "two-sided" (p_a != p_b), "larger" (p_a > p_b) or "smaller" (p_a < p_b).

    Returns:
        `ZTestResult`. When both groups are all-success or all-failure the pooled variance is
        0 and the test is undefined: z and p_value are NaN (as in statsmodels), diff is 0.
    """
    s_a, t_a = _count(successes_a, "successes_a"), _count(n_a, "n_a")
    s_b, t_b = _count(successes_b, "successes_b"), _count(n_b, "n_b")
    if t_a < 1:
        raise ValueError(f"n_a must be >= 1, got {n_a!r}")
    if t_b < 1:
        raise ValueError(f"n_b must be >= 1, got {n_b!r}")
    if not 0 <= s_a <= t_a:
        raise ValueError(f"successes_a must be in [0, n_a={t_a}], got {successes_a!r}")
    if not 0 <= s_b <= t_b:
        raise ValueError(f"successes_b must be in [0, n_b={t_b}], got {successes_b!r}")
    if alternative not in _ALTERNATIVES:
        raise ValueError(f"alternative must be one of {_ALTERNATIVES}, got {alternative!r}")

    p_a, p_b = s_a / t_a, s_b / t_b
    diff = p_a - p_b
    pooled = (s_a + s_b) / (t_a + t_b)
    se = math.sqrt(pooled * (1.0 - pooled) * (1.0 / t_a + 1.0 / t_b))
    if se == 0.0:
        return ZTestResult(z=math.nan, p_value=math.nan, diff=diff)
    z = diff / se
    from scipy.stats import norm

    if alternative == "two-sided":
        p_value = 2.0 * norm.sf(abs(z))
    elif alternative == "larger":
        p_value = norm.sf(z)
    else:
        p_value = norm.cdf(z)
    return ZTestResult(z=float(z), p_value=float(p_value), diff=float(diff))


# --------------------------------------------------------------------- agreement


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, (float, np.floating)) and math.isnan(value))


# dtype kinds whose values numpy can sort and compare exactly as the labels they stand for.
_FAST_KINDS = "biufUS"


def _as_labels(values: ArrayLike) -> np.ndarray:
    # Plain lists go through dtype=object: np.asarray([1, "1"]) would silently turn 1 into "1".
    # Typed ndarrays keep their dtype so the vectorised path below applies (bootstraps call
    # these statistics thousands of times).
    return values if isinstance(values, np.ndarray) else np.asarray(values, dtype=object)


def _encode(
    arr: np.ndarray, name: str, categories: Sequence[Hashable] | None = None
) -> tuple[np.ndarray, int]:
    """Maps hashable labels to integer codes 0..Q-1; returns (codes, Q)."""
    # Agreement on "no answer" is not agreement: missing labels must be dropped or filled by
    # the caller, who knows whether they mean abstention or failure.
    if arr.dtype.kind == "f" and np.isnan(arr).any():
        raise ValueError(f"{name} must not contain missing labels (None/NaN), got NaN")
    if categories is None and arr.dtype.kind in _FAST_KINDS:
        uniq, inverse = np.unique(arr, return_inverse=True)
        return inverse.reshape(arr.shape), int(uniq.size)

    index: dict[Hashable, int] = {}
    if categories is not None:
        for c in categories:
            index.setdefault(c, len(index))
    flat = arr.ravel()
    codes = np.empty(flat.shape, dtype=np.intp)
    for i, v in enumerate(flat):
        if _is_missing(v):
            raise ValueError(
                f"{name} must not contain missing labels (None/NaN), got {v!r} at flat position {i}"
            )
        try:
            code = index.get(v)
        except TypeError:
            raise ValueError(f"{name} labels must be hashable, got {v!r}") from None
        if code is None:
            if categories is not None:
                raise ValueError(f"{name} holds label {v!r} that is not in categories {list(categories)!r}")
            code = index[v] = len(index)
        codes[i] = code
    return codes.reshape(arr.shape), len(index)


def cohens_kappa(rater_a: ArrayLike, rater_b: ArrayLike) -> float:
    """Cohen's kappa between two raters over the same items.

    kappa = (p_o - p_e) / (1 - p_e), where p_o is the share of items on which the raters agree
    and p_e = sum_k p_a(k) p_b(k) is the agreement expected from each rater's own label
    frequencies. 1 is perfect agreement, 0 chance level, negative worse than chance. Matches
    ``sklearn.metrics.cohen_kappa_score``.

    Returns:
        kappa, or NaN when p_e == 1 (both raters use one and the same label throughout).
    """
    a, b = _as_labels(rater_a), _as_labels(rater_b)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(
            f"rater_a and rater_b must be 1-D (one label per item), got shapes {a.shape} and {b.shape}"
        )
    if len(a) != len(b):
        raise ValueError(f"rater_a and rater_b must have the same length, got {len(a)} and {len(b)}")
    if len(a) == 0:
        raise ValueError("rater_a must hold at least one item, got length 0")
    if a.dtype.kind != b.dtype.kind:
        # Stacking e.g. ints with strings would coerce 1 to "1"; compare as Python objects.
        a, b = a.astype(object), b.astype(object)
    codes, q = _encode(np.stack([a, b], axis=1), "rater_a/rater_b")
    confusion = np.bincount(codes[:, 0] * q + codes[:, 1], minlength=q * q).reshape(q, q) / len(a)
    p_o = np.trace(confusion)
    p_e = float(confusion.sum(axis=1) @ confusion.sum(axis=0))
    return math.nan if p_e == 1.0 else float((p_o - p_e) / (1.0 - p_e))


def _ratings_table(ratings: ArrayLike, categories: Sequence[Hashable] | None = None) -> np.ndarray:
    """items x raters labels -> items x categories counts."""
    arr = _as_labels(ratings)
    if arr.ndim != 2:
        raise ValueError(f"ratings must be 2-D (items x raters), got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] < 2:
        raise ValueError(f"ratings needs at least 1 item and 2 raters, got shape {arr.shape}")
    codes, q = _encode(arr, "ratings", categories)
    # bincount over (item, category) cells is much faster than np.add.at.
    n_items = arr.shape[0]
    cells = (np.arange(n_items)[:, None] * q + codes).ravel()
    return np.bincount(cells, minlength=n_items * q).reshape(n_items, q).astype(float)


def _counts_table(table: ArrayLike) -> np.ndarray:
    """Validates a user-supplied items x categories count table; returns it as floats."""
    counts = np.asarray(table)
    if counts.ndim != 2 or counts.shape[0] == 0 or counts.shape[1] == 0:
        raise ValueError(f"table must be a non-empty 2-D items x categories array, got shape {counts.shape}")
    if not np.issubdtype(counts.dtype, np.number) or np.any(counts < 0) or np.any(counts != np.round(counts)):
        raise ValueError("table must hold non-negative integer counts")
    counts = counts.astype(float)
    per_item = counts.sum(axis=1)
    if np.any(per_item < 2):
        raise ValueError(
            f"table needs >= 2 ratings per item, got {int(per_item.min())} at row {int(per_item.argmin())}"
        )
    return counts


# The two kernels below take an already valid float count table; the public wrappers validate.
# Tables built from `ratings` skip that validation because they are valid by construction,
# which matters when a bootstrap calls these thousands of times.


def _fleiss_kernel(counts: np.ndarray) -> float:
    n = counts[0].sum()
    p_bar = float(np.mean(((counts**2).sum(axis=1) - n) / (n * (n - 1))))
    p_j = counts.sum(axis=0) / counts.sum()
    p_e = float(np.sum(p_j**2))
    return math.nan if p_e == 1.0 else (p_bar - p_e) / (1.0 - p_e)


def _ac1_kernel(counts: np.ndarray) -> float:
    q = counts.shape[1]
    if q == 1:
        return math.nan
    r_i = counts.sum(axis=1)
    p_a = float(np.mean((counts * (counts - 1)).sum(axis=1) / (r_i * (r_i - 1))))
    pi_k = (counts / r_i[:, None]).mean(axis=0)
    p_e = float(np.sum(pi_k * (1.0 - pi_k)) / (q - 1))
    # p_e <= 1/Q (its maximum, at uniform pi_k), so the denominator is always positive.
    return (p_a - p_e) / (1.0 - p_e)


def fleiss_kappa_from_counts(table: ArrayLike) -> float:
    """Fleiss' kappa from an items x categories table of rating counts.

    With N items, n raters per item, n_ij raters putting item i in category j:
    P_i = (sum_j n_ij^2 - n) / (n (n - 1)), P_bar = mean_i P_i, p_j = sum_i n_ij / (N n),
    P_e = sum_j p_j^2, kappa = (P_bar - P_e) / (1 - P_e). Read like Cohen's kappa. Matches
    ``statsmodels.stats.inter_rater.fleiss_kappa`` (method="fleiss").

    Returns:
        kappa, or NaN when P_e == 1 (every rating falls in one category).

    Raises:
        ValueError: rows with different totals (Fleiss' kappa assumes a fixed number of raters).
    """
    counts = _counts_table(table)
    per_item = counts.sum(axis=1)
    if np.any(per_item != per_item[0]):
        sums = sorted(set(per_item.astype(int).tolist()))
        raise ValueError(f"table rows must all sum to the same number of raters, got row sums {sums}")
    return _fleiss_kernel(counts)


def fleiss_kappa(ratings: ArrayLike) -> float:
    """Fleiss' kappa for an items x raters array of category labels (any hashable labels).

    Builds the items x categories count table and applies the `fleiss_kappa_from_counts`
    formula. Raters need not be the same people across items, but each item has the same number.
    """
    return _fleiss_kernel(_ratings_table(ratings))


def gwet_ac1_from_counts(table: ArrayLike) -> float:
    """Gwet's AC1 from an items x categories table of rating counts (Gwet 2008).

    With r_ik raters putting item i in category k, r_i = sum_k r_ik and Q categories (columns):
    p_a = mean_i sum_k r_ik (r_ik - 1) / (r_i (r_i - 1)), pi_k = mean_i r_ik / r_i,
    p_e = sum_k pi_k (1 - pi_k) / (Q - 1), AC1 = (p_a - p_e) / (1 - p_e).
    Unlike kappa it stays close to raw agreement when one category dominates (the
    "high agreement, low kappa" paradox). Columns for unused categories change Q and so
    the value: keep them when the category set is fixed by design. Rows may have different
    totals (>= 2 each).

    Returns:
        AC1, or NaN when Q == 1 (chance agreement is undefined with a single category).
    """
    return _ac1_kernel(_counts_table(table))


def gwet_ac1(ratings: ArrayLike, *, categories: Sequence[Hashable] | None = None) -> float:
    """Gwet's AC1 for an items x raters array of nominal labels (any number of raters >= 2).

    See `gwet_ac1_from_counts` for the formula. Q is the number of distinct labels observed
    unless `categories` lists the full category set; pass it when some categories may go
    unused, since Q enters the chance term p_e.

    Returns:
        AC1 in [-1, 1]; 1 is perfect agreement. NaN when only one category is in play.
    """
    return _ac1_kernel(_ratings_table(ratings, categories))


# --------------------------------------------------------------------------- score intervals


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion successes / n (NaNs when n == 0), by statsmodels'
    ``proportion_confint(method="wilson")``.

    Unlike the Wald or the bootstrap interval it keeps a width at 0/n and n/n, so "0 of 60"
    reads [0, 0.060], not [0, 0].
    """
    if n == 0:
        return math.nan, math.nan
    from statsmodels.stats.proportion import proportion_confint

    low, high = proportion_confint(successes, n, alpha=1 - confidence, method="wilson")
    return max(0.0, float(low)), min(1.0, float(high))


def paired_difference_interval(a: ArrayLike, b: ArrayLike, confidence: float = 0.95
                               ) -> tuple[float, float, float]:
    """Difference of two paired proportions, mean(b) - mean(a), with Newcombe's score interval
    for paired data (Newcombe 1998, method 10: built from the two Wilson intervals and the
    phi correlation of the pairs, as in Altman et al., *Statistics with Confidence*, 2000).
    It does not collapse when every pair agrees.

    Args:
        a, b: item-aligned 0/1 outcomes of the same items under two conditions.

    Returns:
        (difference, ci_low, ci_high); NaNs when there is no item.
    """
    x, y = np.asarray(a, float), np.asarray(b, float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("a and b must be 1-D arrays of the same length (paired items)")
    if not np.isin(x, (0.0, 1.0)).all() or not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("a and b must hold 0/1 outcomes only")
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan
    both = float(((x == 1) & (y == 1)).sum())
    only_b = float(((x == 0) & (y == 1)).sum())
    only_a = float(((x == 1) & (y == 0)).sum())
    neither = n - both - only_a - only_b
    pb, pa = (both + only_b) / n, (both + only_a) / n
    lb, ub = wilson_interval(int(both + only_b), n, confidence)
    la, ua = wilson_interval(int(both + only_a), n, confidence)
    denom = (both + only_b) * (only_a + neither) * (both + only_a) * (only_b + neither)
    # Newcombe's phi: a positive association is shrunk by n/2 (a continuity correction).
    cross = both * neither - only_a * only_b
    cross = max(cross - n / 2, 0.0) if cross > 0 else cross
    phi = cross / math.sqrt(denom) if denom > 0 else 0.0
    diff = pb - pa
    low = diff - math.sqrt(max(0.0, (pb - lb) ** 2 - 2 * phi * (pb - lb) * (ua - pa)
                               + (ua - pa) ** 2))
    high = diff + math.sqrt(max(0.0, (ub - pb) ** 2 - 2 * phi * (ub - pb) * (pa - la)
                                + (pa - la) ** 2))
    return diff, max(-1.0, low), min(1.0, high)
