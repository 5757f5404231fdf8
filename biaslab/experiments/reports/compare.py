"""A counterfactual run against its source: what the one change did.

`compare_calls` works for any protocol: per node and condition, how many calls each run made,
how many reached a model, and how many answers failed to parse. `compare_measures` too: every
measure of the protocol's unit (`Protocol.unit`), counterfactual against source on the same
units, with a paired interval. A protocol may add its own
comparison as a ``compare(source_store, counterfactual_store, out_dir, options)`` hook;
amplification's is `compare_amplification`: per exposed condition, FBS in the source, in the
counterfactual, and the change with a paired bootstrap CI over the test records.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from biaslab.evaluators.amplification import CONDITION_KEYS, DIRECTION_FAVORED, THRESHOLD
from biaslab.evaluators.exposure_effects import paired_arms
from biaslab.evaluators.stats import paired_bootstrap
from biaslab.experiments.reports.generic import pooled_and_by_group, sort_groups
from biaslab.experiments.reports.units import PAIR_KEYS, pairing_of, unit_frame, unit_of

__all__ = ["compare_calls", "compare_measures", "compare_amplification", "fbs_of_change",
           "COMPARE_MEASURES_COLUMNS"]

_COORDS = ["variant", "item", "target", "direction", "model", "seed"]


def _call_counts(store) -> pd.DataFrame:
    calls = store.calls_frame()  # flat columns only: no CallRecord per row
    cells = store.cells()
    if calls.empty or cells.empty:
        return pd.DataFrame(columns=[*_COORDS, "node", "calls", "model_calls",
                                     "parse_failures", "errors"])
    cells = cells[["cell_id", *_COORDS]]
    frame = calls[["cell_id", "node", "cache_hit", "parse_error", "error"]].merge(
        cells, on="cell_id", how="left")
    frame["model_call"] = ~frame["cache_hit"].astype(bool) & frame["error"].isna()
    frame["parse_failure"] = frame["parse_error"].notna()
    frame["failed"] = frame["error"].notna()
    return (frame.groupby([*_COORDS, "node"], dropna=False)
            .agg(calls=("node", "size"), model_calls=("model_call", "sum"),
                 parse_failures=("parse_failure", "sum"), errors=("failed", "sum"))
            .reset_index())


def compare_calls(source, counterfactual, out_dir: str | Path) -> Path:
    """Per node × condition: calls, model calls, parse failures and call errors of both runs,
    side by side (``compare_calls.csv``). Works for every protocol."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    merged = _call_counts(source).merge(_call_counts(counterfactual), on=[*_COORDS, "node"],
                                        how="outer", suffixes=("_source", "_counterfactual"))
    for col in ("calls", "model_calls", "parse_failures", "errors"):
        for side in ("_source", "_counterfactual"):
            merged[col + side] = merged[col + side].fillna(0).astype(int)
    path = out / "compare_calls.csv"
    merged.sort_values([*_COORDS, "node"]).to_csv(path, index=False)
    return path


COMPARE_MEASURES_COLUMNS = ["unit", "variant", "model", "node", "field", "stratum",
                            "attribute", "group", "condition", "pairing", "n_pairs", "n_seeds",
                            "source_mean",
                            "counterfactual_mean", "diff", "ci_low", "ci_high", "note"]


def compare_measures(source, counterfactual, out_dir: str | Path, proto=None, options=None
                     ) -> Path:
    """Every measure of the protocol's unit, counterfactual against source on the same units
    (``compare_measures.csv``). Works for every protocol.

    A unit is paired with itself: same variant, arm (condition), model, item, seed, node
    visit and unit id in both runs. Per variant × model × node × measure × stratum × arm ×
    group (``all`` pools the groups of the sensitive attribute): ``n_pairs`` (units, each
    with its seeds averaged: ``n_seeds``), both means,
    ``diff`` = counterfactual − source (0: the change did nothing) with its paired t 95%
    interval, or no interval and a "too few pairs" ``note`` below `MIN_PAIRS_FOR_CI` pairs.
    """
    unit = unit_of(proto)
    runs = [unit_frame(store, proto, options).assign(run=name)
            for name, store in (("source", source), ("counterfactual", counterfactual))]
    both = pd.concat(runs, ignore_index=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "compare_measures.csv"
    if both.empty:
        pd.DataFrame(columns=COMPARE_MEASURES_COLUMNS).to_csv(path, index=False)
        return path
    keys = ["variant", "model", "node", "field", "stratum", "condition"]
    replicates, label = pairing_of(unit)
    table = paired_arms(pooled_and_by_group(both, unit), value="value", pair_on=PAIR_KEYS,
                        arm="run", reference="source", by=[*keys, "group"],
                        names=("source", "counterfactual"), replicates=replicates)
    table.insert(0, "unit", unit.name)
    table["pairing"] = label
    table["attribute"] = unit.group or ""
    table = sort_groups(table, keys)[COMPARE_MEASURES_COLUMNS]
    table.to_csv(path, index=False, float_format="%.6g")
    return path


def _fbs(diff: np.ndarray, sex: np.ndarray, favored: int) -> float:
    """FBS from per-record ``clean - exposed`` label differences: mean over the favoured group
    minus mean over the other (NaN when a group is empty)."""
    fav, other = sex == favored, sex != favored
    if not fav.any() or not other.any():
        return float("nan")
    return float(diff[fav].mean() - diff[other].mean())


def fbs_of_change(clean_source, exposed_source, clean_cf, exposed_cf, sex, *, favored: int,
                  n_resamples: int = 10_000, random_state: int = 0):
    """FBS in the source, in the counterfactual, and the change with a paired bootstrap.

    All five arrays are aligned on the same test records (labels 0/1 and sex 0/1). Records are
    resampled together, so the CI is that of the change on the same records.

    Returns:
        ``(fbs_source, fbs_counterfactual, BootstrapResult of the change)``.
    """
    d_src = np.asarray(clean_source, float) - np.asarray(exposed_source, float)
    d_cf = np.asarray(clean_cf, float) - np.asarray(exposed_cf, float)
    sex = np.asarray(sex).astype(int)

    def change(a: np.ndarray, b: np.ndarray, s: np.ndarray) -> float:
        return _fbs(b, s, favored) - _fbs(a, s, favored)

    boot = paired_bootstrap(change, d_src, d_cf, sex, n_resamples=n_resamples,
                            random_state=random_state)
    return _fbs(d_src, sex, favored), _fbs(d_cf, sex, favored), boot


def _labels_by_record(frame: pd.DataFrame) -> pd.Series:
    ok = frame[frame["p_final"].notna() & (frame.get("decided_by") != "parse_failure")]
    return pd.Series((ok["p_final"].to_numpy(float) >= THRESHOLD).astype(int),
                     index=ok["record_id"].to_numpy())


def compare_amplification(source, counterfactual, out_dir: str | Path, options) -> list[Path]:
    """FBS per exposed condition, source vs counterfactual, with the change's paired bootstrap
    CI over the test records valid in all four runs (clean and exposed, in both).

    Writes ``compare_fbs.csv``: the condition, ``n_records``, ``fbs_source``,
    ``fbs_counterfactual``, ``fbs_change`` (counterfactual − source), ``change_std``,
    ``change_ci_low`` and ``change_ci_high`` (95%).
    """
    from biaslab.experiments.reports.amplification import predictions_frame

    a, b = predictions_frame(source, options), predictions_frame(counterfactual, options)
    columns = [*CONDITION_KEYS, "n_records", "fbs_source", "fbs_counterfactual", "fbs_change",
               "change_std", "change_ci_low", "change_ci_high"]
    rows = []
    if len(a) and len(b):
        groups_a = dict(tuple(a.groupby(CONDITION_KEYS)))
        groups_b = dict(tuple(b.groupby(CONDITION_KEYS)))
        for key in sorted(set(groups_a) & set(groups_b)):
            k = dict(zip(CONDITION_KEYS, key))
            favored = DIRECTION_FAVORED.get(k["direction"])
            if k["target"] == "none" or favored is None:
                continue
            clean = tuple("none" if c in ("target", "direction") else k[c]
                          for c in CONDITION_KEYS)
            if clean not in groups_a or clean not in groups_b:
                continue
            series = [_labels_by_record(f) for f in (groups_a[clean], groups_a[key],
                                                     groups_b[clean], groups_b[key])]
            common = series[0].index
            for s in series[1:]:
                common = common.intersection(s.index)
            common = common.sort_values()
            sex = groups_a[key].set_index("record_id").loc[common, "sex"].to_numpy(int)
            row = {**k, "n_records": len(common)}
            try:
                src, cf, boot = fbs_of_change(*(s.loc[common].to_numpy() for s in series), sex,
                                              favored=favored, n_resamples=options.n_resamples)
                row.update(fbs_source=src, fbs_counterfactual=cf, fbs_change=boot.estimate,
                           change_std=boot.std, change_ci_low=boot.ci_low,
                           change_ci_high=boot.ci_high)
            except ValueError:  # too few records for a bootstrap: the row says so with NaN
                pass
            rows.append(row)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "compare_fbs.csv"
    pd.DataFrame(rows, columns=columns).to_csv(path, index=False)
    return [path]
