"""Reports: tables and figures written from a run store alone."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from biaslab.experiments.reports.generic import write_generic_report
from biaslab.traces.store import RunStore

if TYPE_CHECKING:
    from biaslab.experiments.plan import Plan

__all__ = ["write_reports", "write_generic_report"]


def write_reports(plan: "Plan", store: RunStore, run_dir: str | Path) -> list[Path]:
    """Every report of a run: the generic tables, then the protocol's own."""
    run_dir = Path(run_dir)
    return [*write_generic_report(store, run_dir),
            *plan.protocol.report(store, run_dir, plan.options)]
