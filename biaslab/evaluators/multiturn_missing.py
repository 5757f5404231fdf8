"""One rule for missing verdicts in the ``multiturn`` measures, with best- and worst-case bounds.

A verdict is *missing* when a turn ran (its user query was sent) but has no label: the judge's
answer stayed unparsable after its re-asks, or the target gave no reply to judge. A turn after
the dialogue ended is not missing: it never happened, so it is outside the dialogue's window.

Why a rule at all: dropping every dialogue with a gap (complete-case) keeps few dialogues at
10 turns, and dropping only the undecided ones keeps the early-biased dialogues and loses the
others, which pushes cumulative bias up and time to first bias down. So no dialogue is dropped.

The rule, the same for every per-dialogue measure f (ever biased by turn t, time to first
bias, re-emergence, the label at one turn), over the turns f reads (its *window*: turns 1..t
that the dialogue ran, or the one turn t):

1. **Bounds.** Each dialogue's value is bounded by its extremes over every way of filling its
   missing verdicts: ``low`` and ``high``. For ever-biased and a per-turn label, low = missing
   counted as not biased, high = missing counted as biased; for time to first bias the other
   way round (a biased fill makes bias come sooner); for re-emergence (not monotone in the
   labels: 1 ? 1 re-emerges with ? = 0 only) the least and most favourable fills, found by
   walking the biased → not-biased → biased pattern over both values of each gap.
   The table's ``*_best`` and ``*_worst`` are the means of the favourable and unfavourable
   extremes (less bias / more bias), so the complete-label value lies between them for sure.
2. **Figure.** A dialogue whose value depends on a missing verdict takes the mean value of
   the *donors*: the dialogues of the same table row with every verdict of its window, that
   agree with it on every verdict it has there (a hot-deck fill: unbiased when verdicts go
   missing at random). Without a donor: the mean over every dialogue complete on the window,
   clipped to the dialogue's own [low, high]; without any: the middle of [low, high]. So the
   figure always lies between the bounds. For a per-turn ratio this is the share of the
   labelled replies at that turn.
3. **Interval.** ``ci_low`` is the lower 95% limit of the dialogues' low extremes and
   ``ci_high`` the upper limit of their high extremes (for a ratio: from the best case to the
   worst; for time to first bias the other way round) (Wilson for 0/1 values, a percentile
   bootstrap over dialogues otherwise; a paired difference takes its lowest and highest
   pairings). With no missing verdict the bounds meet and it is the usual interval. With
   gaps it always holds the value the complete labels would give (that value lies between
   the best and worst case, and the interval holds both), and it is at least as wide as
   the usual interval at either extreme: missing verdicts widen it, never shift it.
4. Beside each figure: ``*_missing``, the share of the window's turns without a verdict,
   and ``*_undetermined``, the dialogues whose value a missing verdict could change.
5. **What is printed** (issue 44: a filled figure can be far off and read as known: at 30%
   missing a cumulative bias of 1.00 against a true 0.567; when only biased turns lose their
   verdicts, an effect of +0.094 against a true 0). The point is printed only when the best
   and worst case lie within `POINT_MAX_WIDTH` of the measure's scale of each other
   (0.05 for a share or a difference of shares, 0.05 × cap turns for time to first bias);
   the complete-label value lies between them, so a printed point is then within that
   distance of it, whatever the missingness (at random or only on biased turns). Otherwise
   the figure column is empty, ``*_shown`` reads ``bounds`` and the table shows the best
   and worst case (``*_best``, ``*_worst``) with the interval: what the data support.
   With no missing verdict the bounds meet and the point is always printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from biaslab.evaluators.multiturn_intervals import paired_effect, ratio_ci, reemerges

__all__ = ["Range", "reemerges", "Bounded", "POINT_MAX_WIDTH", "point_known", "shown_mean", "ever_range", "first_bias_range", "reemerged_range",
           "turn_range", "summarize", "paired_bounded"]


POINT_MAX_WIDTH = 0.05
"""Widest gap between the best and worst case, as a share of the measure's scale, at which a
figure is still printed as a point (step 5)."""


def point_known(best: float, worst: float, scale: float = 1.0) -> bool:
    """Whether a figure with these best and worst cases is printed as a point (step 5)."""
    if np.isnan(best) or np.isnan(worst):
        return False
    return abs(worst - best) <= POINT_MAX_WIDTH * scale + 1e-12


@dataclass(frozen=True)
class Range:
    """Per dialogue: the rule's figure, its extremes over every fill of the missing verdicts,
    the window's size and its missing verdicts. NaN (and 0 sizes) for a dialogue whose window
    is empty (it ran no turn)."""

    value: np.ndarray
    low: np.ndarray
    high: np.ndarray
    window: np.ndarray
    missing: np.ndarray
    favourable: str
    """Which extreme means less bias: ``low`` (ratios) or ``high`` (time to first bias)."""
    scale: float = 1.0
    """The width of the measure's scale (1 for a share, the cap for time to first bias)."""

    def best(self) -> np.ndarray:
        return self.low if self.favourable == "low" else self.high

    def worst(self) -> np.ndarray:
        return self.high if self.favourable == "low" else self.low

    def subset(self, idx) -> "Range":
        return Range(self.value[idx], self.low[idx], self.high[idx], self.window[idx],
                     self.missing[idx], self.favourable, self.scale)


@dataclass(frozen=True)
class Bounded:
    """A measure over dialogues: the figure, its bounds-based 95% interval, the dialogues it
    is over, the share of missing verdicts, and the best- and worst-case values."""

    value: float
    ci_low: float
    ci_high: float
    n: int
    missing: float
    best: float
    worst: float
    undetermined: int
    scale: float = 1.0

    @property
    def known(self) -> bool:
        """Whether the figure is printed as a point (module docstring, step 5)."""
        return point_known(self.best, self.worst, self.scale)

    @property
    def shown(self) -> float:
        """The printed figure: the point when `known`, else NaN (the bounds stand instead)."""
        return self.value if self.known else np.nan

    def columns(self, prefix: str) -> dict:
        return {prefix: self.shown, f"{prefix}_shown": "point" if self.known else "bounds",
                f"{prefix}_ci_low": self.ci_low,
                f"{prefix}_ci_high": self.ci_high, f"{prefix}_n": self.n,
                f"{prefix}_missing": self.missing, f"{prefix}_best": self.best,
                f"{prefix}_worst": self.worst, f"{prefix}_undetermined": self.undetermined}


def _windows(m: np.ndarray, ran, start: Callable[[int], int], stop: Callable[[int], int]
             ) -> np.ndarray:
    mask = np.zeros(m.shape, bool)
    for i, r in enumerate(ran):
        a, b = start(int(r)), min(stop(int(r)), int(r), m.shape[1])
        if b > a:
            mask[i, a:b] = True
    return mask


def _fill(m: np.ndarray, windows: np.ndarray, f: Callable[[np.ndarray, np.ndarray], np.ndarray],
          low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The rule's figure (step 2): own value where determined, else the donors' mean.
    `f(rows, mask)` is the measure of each row over the turns its mask row holds."""
    value = np.where(low == high, low, np.nan)
    labelled = ~np.isnan(m)
    for i in np.nonzero((low != high) & ~np.isnan(low))[0]:
        w = windows[i]
        known = w & labelled[i]
        complete = labelled[:, w].all(axis=1)
        complete[i] = False
        donors = complete & (m[:, known] == m[i, known]).all(axis=1)
        pool = donors if donors.any() else complete
        if not pool.any():
            value[i] = (low[i] + high[i]) / 2
            continue
        mean = float(np.mean(f(m[pool], np.broadcast_to(w, (int(pool.sum()), len(w))))))
        value[i] = mean if donors.any() else float(np.clip(mean, low[i], high[i]))
    return value


def _range(m: np.ndarray, windows: np.ndarray, f, favourable: str, extremes=None,
           scale: float = 1.0) -> Range:
    m = np.asarray(m, float)
    empty = ~windows.any(axis=1)
    if extremes is None:  # monotone measures: the two plain fills are the extremes
        a = f(np.where(np.isnan(m), 0.0, m), windows).astype(float)
        b = f(np.where(np.isnan(m), 1.0, m), windows).astype(float)
        low, high = np.minimum(a, b), np.maximum(a, b)
        low[empty], high[empty] = np.nan, np.nan
    else:
        low, high = extremes
    value = _fill(m, windows, f, low, high)
    missing = (windows & np.isnan(m)).sum(axis=1)
    return Range(np.where(empty, np.nan, value), low, high, windows.sum(axis=1), missing,
                 favourable, scale)


def _ever(rows: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return ((rows == 1) & mask).any(axis=1).astype(float)


def ever_range(m, upto: int, ran) -> Range:
    """Ever biased in turns 1..upto (of those the dialogue ran): 1 or 0."""
    m = np.asarray(m, float)
    windows = _windows(m, ran, lambda r: 0, lambda r: upto)
    return _range(m, windows, _ever, "low")


def first_bias_range(m, cap: int, ran) -> Range:
    """First biased turn in 1..cap, ``cap + 1`` when none of the turns run there was."""
    m = np.asarray(m, float)
    windows = _windows(m, ran, lambda r: 0, lambda r: cap)

    def first(rows, mask):
        hit = (rows == 1) & mask
        return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, cap + 1).astype(float)

    return _range(m, windows, first, "high", scale=float(cap))


def _reemerge_extremes(row) -> tuple[float, float]:
    """Least and most re-emergence over every fill of the NaNs: the pattern automaton run
    over both values of each gap (states 0 → 1 biased → 2 then not → 3 biased again)."""
    states = {0}
    for v in row:
        values = (0.0, 1.0) if np.isnan(v) else (v,)
        nxt = set()
        for s in states:
            for x in values:
                nxt.add(3 if s == 3 else 1 if s == 0 and x == 1 else 2 if s == 1 and x == 0
                        else 3 if s == 2 and x == 1 else s)
        states = nxt
    return (0.0 if states - {3} else 1.0), (1.0 if 3 in states else 0.0)


def reemerged_range(m, ran) -> Range:
    """Bias, then a non-biased reply, then bias again, over the turns the dialogue ran."""
    m = np.asarray(m, float)
    windows = _windows(m, ran, lambda r: 0, lambda r: r)
    ext = [(_reemerge_extremes(m[i, windows[i]]) if windows[i].any() else (np.nan, np.nan))
           for i in range(len(m))]
    low = np.array([e[0] for e in ext], float)
    high = np.array([e[1] for e in ext], float)
    return _range(m, windows, lambda rows, mask: np.array(
        [reemerges(r[k]) for r, k in zip(rows, mask)], float), "low", extremes=(low, high))


def turn_range(m, t: int, ran) -> Range:
    """The label at turn t (1-based) of the dialogues that ran it."""
    m = np.asarray(m, float)
    windows = _windows(m, ran, lambda r: t - 1, lambda r: t)
    return _range(m, windows, lambda rows, mask: rows[:, t - 1].astype(float), "low")


def _interval(values: np.ndarray, n_resamples: int, confidence: float) -> tuple[float, float]:
    r = ratio_ci(values, n_resamples=n_resamples, confidence=confidence)
    return r.ci_low, r.ci_high


def _mean(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.mean()) if len(x) else np.nan


def summarize(r: Range, *, n_resamples: int = 2000, confidence: float = 0.95) -> Bounded:
    """The measure over these dialogues (module docstring, steps 2 to 4)."""
    keep = ~np.isnan(r.value)
    if not keep.any():
        return Bounded(np.nan, np.nan, np.nan, 0, np.nan, np.nan, np.nan, 0)
    r = r.subset(keep)
    low_lo, _ = _interval(r.low, n_resamples, confidence)
    _, high_hi = _interval(r.high, n_resamples, confidence)
    value, best, worst = _mean(r.value), _mean(r.best()), _mean(r.worst())
    lo_mean, hi_mean = _mean(r.low), _mean(r.high)
    ci_low = np.nanmin([low_lo, lo_mean]) if not np.isnan(low_lo) else np.nan
    ci_high = np.nanmax([high_hi, hi_mean]) if not np.isnan(high_hi) else np.nan
    window = int(r.window.sum())
    return Bounded(value, float(ci_low), float(ci_high), int(keep.sum()),
                   float(r.missing.sum() / window) if window else np.nan, best, worst,
                   int((r.low != r.high).sum()), r.scale)


def shown_mean(r: Range) -> float:
    """The mean figure of these dialogues as printed (step 5): NaN when their best and worst
    cases lie further apart than `POINT_MAX_WIDTH` of the scale."""
    keep = ~np.isnan(r.value)
    if not keep.any():
        return np.nan
    r = r.subset(keep)
    if not point_known(_mean(r.best()), _mean(r.worst()), r.scale):
        return np.nan
    return _mean(r.value)


def _paired_interval(a: np.ndarray, b: np.ndarray, n_resamples: int, confidence: float
                     ) -> tuple[float, float]:
    """Interval of mean(a − b), paired: Newcombe for 0/1 sides, else a paired bootstrap."""
    r = paired_effect(a, b, n_resamples=n_resamples, confidence=confidence)
    return r.ci_low, r.ci_high


def paired_bounded(first: Range, second: Range, *, n_resamples: int = 2000,
                   confidence: float = 0.95) -> Bounded:
    """mean(first − second) over aligned dialogues with a value on both sides (e.g. exposed −
    clean, or cum@10 − cum@5): the figures' difference, bounded by the lowest pairing (first
    at its low, second at its high) and the highest; the interval runs from the lower limit
    of the lowest to the upper limit of the highest. ``best``/``worst`` follow the measure's
    favourable side (for ratios, best = lowest difference)."""
    keep = ~(np.isnan(first.value) | np.isnan(second.value))
    if not keep.any():
        return Bounded(np.nan, np.nan, np.nan, 0, np.nan, np.nan, np.nan, 0)
    a, b = first.subset(keep), second.subset(keep)
    lowest, highest = a.low - b.high, a.high - b.low
    ci_low, _ = _paired_interval(a.low, b.high, n_resamples, confidence)
    _, ci_high = _paired_interval(a.high, b.low, n_resamples, confidence)
    ci_low = min(ci_low, float(lowest.mean())) if not np.isnan(ci_low) else np.nan
    ci_high = max(ci_high, float(highest.mean())) if not np.isnan(ci_high) else np.nan
    window = int(a.window.sum() + b.window.sum())
    best, worst = (lowest, highest) if first.favourable == "low" else (highest, lowest)
    return Bounded(float((a.value - b.value).mean()), float(ci_low), float(ci_high),
                   int(keep.sum()),
                   float((a.missing.sum() + b.missing.sum()) / window) if window else np.nan,
                   float(best.mean()), float(worst.mean()),
                   int(((a.low != a.high) | (b.low != b.high)).sum()), first.scale)
