"""Helpers for the audited-app tests: run biaslab's CLI on an app spec and read what it wrote."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from biaslab.cli import main
from biaslab.traces.store import RunStore

EXAMPLE = Path(__file__).resolve().parents[2] / "experiments" / "examples" / "app_audit"
HERE = Path(__file__).resolve().parent


def cli(*args) -> int:
    return main([str(a) for a in args])


def copy_app(tmp_path: Path, *names: str, source: Path = HERE) -> Path:
    """Copy an app's files into `tmp_path` (so a test may write a spec beside them)."""
    for name in names:
        shutil.copy(source / name, tmp_path / name)
    return tmp_path


def calls(run: Path) -> pd.DataFrame:
    store = RunStore(run, readonly=True)
    try:
        return store.calls()
    finally:
        store.close()


def outputs(run: Path) -> dict:
    store = RunStore(run, readonly=True)
    try:
        return store.raw_outputs()
    finally:
        store.close()


def effects(run: Path, group: str = "all") -> dict[tuple[str, str], float]:
    """(condition, field) → exposed − clean from tables/exposed_vs_clean.csv."""
    frame = pd.read_csv(run / "tables" / "exposed_vs_clean.csv", dtype={"group": str})
    frame = frame[frame["group"] == group]
    return {(r.condition, r.field): float(r.diff) for r in frame.itertuples()}


def exposed_only_at_targets(run: Path) -> bool:
    """Every call that carried exposure text was made by a node its cell exposes, and every
    call of an exposed node in an exposed cell carried it."""
    frame = calls(run)
    store = RunStore(run, readonly=True)
    try:
        cells = store.cells().set_index("cell_id")
    finally:
        store.close()
    for row in frame.itertuples():
        target = cells.loc[row.cell_id, "target"]
        expected = row.node in str(target).split("+")
        if bool(row.exposed) != expected:
            return False
    return True
