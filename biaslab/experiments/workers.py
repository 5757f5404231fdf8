"""How many worker processes a run gets when ``--workers`` is not given.

Workers pay off only where one process is CPU-bound and the grid is large enough to repay
forking, merging and an uneven finish. ``python bench/workers.py`` measures the whole
``biaslab run`` command with one process against two workers on the scripted model at zero
latency (the CPU-bound case) over grid sizes. On the 2-core development machine two workers
broke even at about 900 one-call cells, gained 9 % at 2,000 and 1.56x at 20,000
(bench/results.md); `BREAK_EVEN_CELLS` is 2,000, the smallest size measured with a clear gain,
so that noise and a slower disk do not turn the default into a loss.

The default starts workers only for plans whose every model is scripted: those are the runs
whose speed is this machine's CPU. A hosted endpoint's rate, not the local CPU, bounds a
hosted run (one process keeps up with several hundred calls per second: docs/throughput.md),
and more processes would multiply the calls in flight that the spec's ``concurrency`` limits.
The embedded model already uses the cores, and each worker would load its own copy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from biaslab.experiments.plan import Plan

__all__ = ["BREAK_EVEN_CELLS", "WorkerChoice", "choose_workers", "usable_cores"]

BREAK_EVEN_CELLS = 2000
"""Scripted cells from which the default starts workers (bench/workers.py)."""


@dataclass(frozen=True)
class WorkerChoice:
    workers: int
    why: str
    """One line for the terminal when workers are chosen; empty when the run is one process."""


def usable_cores() -> int:
    """Cores this process may run on (a container's or taskset's limit, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose_workers(plan: Plan, cores: int | None = None) -> WorkerChoice:
    """One worker per usable core, each with at least half the break-even size of cells,
    for an all-scripted plan of at least `BREAK_EVEN_CELLS` cells; else one process."""
    cores = usable_cores() if cores is None else cores
    cells = plan.n_cells()
    if cores < 2 or cells < BREAK_EVEN_CELLS:
        return WorkerChoice(1, "")
    if any(m.provider != "scripted" for m in plan.all_model_specs()):
        return WorkerChoice(1, "")
    workers = max(1, min(cores, cells // (BREAK_EVEN_CELLS // 2)))
    if workers < 2:
        return WorkerChoice(1, "")
    return WorkerChoice(workers, f"biaslab: {workers} worker processes ({cells:,} cells on "
                                 f"scripted models, {cores} cores; --workers 1 runs one process)")
