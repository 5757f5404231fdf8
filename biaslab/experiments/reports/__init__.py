"""Reports: tables and figures written from a run store alone."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from biaslab.experiments.reports.generic import write_generic_report
from biaslab.experiments.reports.html import write_html_report
from biaslab.experiments.reports.protocols import (protocol_compare, protocol_exports,
                                                   protocol_headline, protocol_prepare,
                                                   protocol_report)
from biaslab.traces.store import RunStore

if TYPE_CHECKING:
    from biaslab.experiments.plan import Plan

__all__ = ["write_reports", "write_generic_report", "write_html_report", "protocol_report",
           "protocol_headline", "protocol_compare", "protocol_exports"]


def write_reports(plan: "Plan", store: RunStore, run_dir: str | Path, *,
                  figures: bool = True) -> list[Path]:
    """Every report of a run: the generic tables, then the protocol's own, then
    ``report.html`` over all of them (sections as the protocol declares them).

    `figures` False (``--no-figures``) draws no figure: the tables are the same, sooner.
    Figures are also off inside :func:`~biaslab.experiments.reports.figure_files.figures_off`.

    A built-in protocol may start work before the generic tables (`protocol_prepare`) so that
    its slow part runs behind them: multiturn embeds its diversity texts in a worker process
    while the other tables are written."""
    from biaslab.experiments.reports.figure_files import figures_off

    with figures_off(not figures):
        return _write_reports(plan, store, Path(run_dir))


def _write_reports(plan: "Plan", store: RunStore, run_dir: Path) -> list[Path]:
    from biaslab.experiments.reports.mitigations import unmitigated

    with unmitigated(store):  # a protocol's own tables know no mitigation arms
        # started first, so that its slow part (multiturn: embedding) runs behind the generic
        prepared = protocol_prepare(plan.protocol, store, run_dir, plan.options)
    try:
        written = write_generic_report(store, run_dir, plan.protocol, plan.options)
        with unmitigated(store):
            written = [*written, *protocol_report(plan.protocol, store, run_dir, plan.options,
                                                  prepared)]
    finally:
        if prepared is not None:
            prepared.close()  # stops an embedding the report never collected
    return [*written, write_html_report(store, run_dir, plan.protocol.report_sections())]
