"""``tables/mitigation_effects.csv``: what each mitigation arm changes, exposure by exposure.

A mitigation arm (``[mitigations]`` in a spec) is compared with the unmitigated arm of the
*same* exposure (the clean arm and each exposed arm) on the same units of the protocol
(`Protocol.unit`), per measure and group, with the paired t interval of the generic tables.
On the clean arm the difference is the mitigation's cost (or gain) without any bias injected;
on an exposed arm it is how much of the exposure's effect it undoes.

A protocol may also have a *structural* mitigation: one graph variant that adds a safeguard
to another (amplification's E2, where an ML predictor and a judge arbitrate E1's predictions).
Its rows compare the two variants on the same units, exposure by exposure, in the same table,
with ``variant`` naming both (``E2 vs E1``). A protocol declares its own as
``structural_mitigations``; the built-in ones are in `STRUCTURAL_MITIGATIONS`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from biaslab.evaluators.exposure_effects import MIN_PAIRS_FOR_CI, UNIT_PAIRING, paired_arms
from biaslab.experiments.reports.generic import pooled_and_by_group, sort_groups
from biaslab.experiments.reports.units import PAIR_KEYS, pairing_of, unit_frame, unit_of
from biaslab.graphs.registry import Protocol
from biaslab.graphs.units import AnalysisUnit
from biaslab.prompts.exposure import NO_MITIGATION, split_condition_id
from biaslab.traces.store import RunStore

__all__ = ["StructuralMitigation", "STRUCTURAL_MITIGATIONS", "mitigation_effects", "unmitigated",
           "write_mitigation_effects", "MITIGATION_EFFECTS_COLUMNS", "MITIGATION_EFFECTS_FILE"]

MITIGATION_EFFECTS_FILE = "mitigation_effects.csv"
MITIGATION_EFFECTS_COLUMNS = ["unit", "variant", "model", "node", "field", "stratum",
                              "attribute", "group", "exposure", "mitigation", "pairing",
                              "n_pairs", "n_seeds", "unmitigated_mean", "mitigated_mean", "diff", "ci_low",
                              "ci_high", "note"]


@dataclass(frozen=True)
class StructuralMitigation:
    """Graph variant `mitigated` is variant `reference` plus a safeguard called `name`."""

    mitigated: str
    reference: str
    name: str


STRUCTURAL_MITIGATIONS: dict[str, tuple[StructuralMitigation, ...]] = {
    "amplification": (StructuralMitigation("E2", "E1", "ml_arbitration"),),
}
"""Built-in protocols' structural mitigations, by protocol name."""

_BY = ["variant", "model", "node", "field", "stratum", "group", "exposure"]


def _paired(frame: pd.DataFrame, unit: AnalysisUnit, confidence: float, min_pairs: int,
            pairing: str) -> pd.DataFrame:
    if frame.empty or NO_MITIGATION not in set(frame["mitigation"]) \
            or set(frame["mitigation"]) == {NO_MITIGATION}:
        return pd.DataFrame(columns=[*_BY, "mitigation"])
    return paired_arms(pooled_and_by_group(frame, unit), value="value", pair_on=PAIR_KEYS,
                       arm="mitigation", reference=NO_MITIGATION, by=_BY,
                       names=("unmitigated", "mitigated"), confidence=confidence,
                       min_pairs=min_pairs,
                       replicates=pairing_of(unit, pairing)[0])


def _structural(units: pd.DataFrame, proto: Protocol | None) -> list[pd.DataFrame]:
    """Each structural mitigation's two variants as one frame: the reference variant's rows
    are the unmitigated arm, the mitigated variant's rows the mitigation arm."""
    declared = getattr(proto, "structural_mitigations", None)
    if declared is None and proto is not None:
        declared = STRUCTURAL_MITIGATIONS.get(proto.name, ())
    frames = []
    plain = units[units["mitigation"] == NO_MITIGATION]
    for s in declared or ():
        ref = plain[plain["variant"] == s.reference]
        mit = plain[plain["variant"] == s.mitigated]
        if ref.empty or mit.empty:
            continue
        both = pd.concat([ref.assign(mitigation=NO_MITIGATION),
                          mit.assign(mitigation=f"structural:{s.name}")], ignore_index=True)
        frames.append(both.assign(variant=f"{s.mitigated} vs {s.reference}"))
    return frames


def mitigation_effects(units: pd.DataFrame, unit: AnalysisUnit, proto: Protocol | None = None,
                       *, confidence: float = 0.95, min_pairs: int = MIN_PAIRS_FOR_CI,
                       pairing: str = UNIT_PAIRING) -> pd.DataFrame:
    """Each mitigation arm against the unmitigated arm of the same exposure, per measure.

    Args:
        units: `unit_frame` of the run (its ``condition`` holds exposure and mitigation).
        unit: the protocol's `AnalysisUnit`.
        proto: the protocol, for its structural mitigations (if any).

    Returns:
        One row per variant × model × node × measure × stratum × group × exposure ×
        mitigation arm: ``n_pairs`` units seen with and without the mitigation (same item,
        node visit and unit, seeds averaged: ``n_seeds``; ``pairing`` names the rule), the
        two means, ``diff`` = mitigated − unmitigated, and its
        paired t interval (none, and a ``note``, below `MIN_PAIRS_FOR_CI` pairs).
    """
    if units.empty:
        return pd.DataFrame(columns=MITIGATION_EFFECTS_COLUMNS)
    split = [split_condition_id(c) for c in units["condition"]]
    units = units.assign(exposure=[e for e, _ in split], mitigation=[m for _, m in split])
    label = pairing_of(unit, pairing)[1]
    parts = [_paired(units, unit, confidence, min_pairs, pairing)]
    parts += [_paired(f, unit, confidence, min_pairs, pairing)
              for f in _structural(units, proto)]
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame(columns=MITIGATION_EFFECTS_COLUMNS)
    effects = pd.concat(parts, ignore_index=True)
    effects.insert(0, "unit", unit.name)
    effects["attribute"] = unit.group or ""
    effects["pairing"] = label
    return sort_groups(effects, ["variant", "model", "node", "field", "stratum", "exposure",
                                 "mitigation"])[MITIGATION_EFFECTS_COLUMNS]


def write_mitigation_effects(store: RunStore, run_dir: str | Path,
                             proto: Protocol | None = None, options: Any = None, *,
                             units: pd.DataFrame | None = None) -> list[Path]:
    """Write ``tables/mitigation_effects.csv`` when the run has a mitigation arm or a
    structural mitigation to show; a run with neither gets no file (its tables stay as they
    were). `units`: the run's :func:`unit_frame`, where the caller has built it already."""
    if units is None:
        units = unit_frame(store, proto, options)
    frame = mitigation_effects(units, unit_of(proto), proto)
    if frame.empty:
        return []
    path = Path(run_dir) / "tables" / MITIGATION_EFFECTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False, float_format="%.6g")
    return [path]


@contextmanager
def unmitigated(store: RunStore):
    """The store seen without its mitigated cells, for the protocols' own tables.

    Those tables key a condition by target and direction only, so a mitigated cell would pile
    onto the unmitigated cell of its exposure; mitigations are reported in
    ``mitigation_effects.csv`` instead. A temporary view named ``cells`` shadows the table on
    this connection only (SQLite resolves temp objects first); the file is never written, and
    a run without mitigation arms is left untouched."""
    mitigated = store.conn.execute(
        "SELECT 1 FROM main.cells WHERE json_extract(coords, '$.mitigation') IS NOT NULL "
        "LIMIT 1").fetchone()
    if not mitigated:
        yield store
        return
    store.conn.execute("CREATE TEMP VIEW cells AS SELECT * FROM main.cells "
                       "WHERE json_extract(coords, '$.mitigation') IS NULL")
    try:
        yield store
    finally:
        store.conn.execute("DROP VIEW temp.cells")
