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

__all__ = ["BREAK_EVEN_CELLS", "WorkerChoice", "choose_workers", "resolve_workers",
           "usable_cores"]

BREAK_EVEN_CELLS = 2000
"""Scripted cells from which the default starts workers (bench/workers.py)."""


@dataclass(frozen=True)
class WorkerChoice:
    workers: int
    why: str = ""
    """Why the default chose workers (empty when it did not, or they were asked for)."""

    def announce(self, one_process: str) -> str:
        """The line a run prints when the default chose workers ("" otherwise); `one_process`
        names how to keep one process in the caller's terms (``--workers 1``, ``workers=1``)."""
        if not self.why:
            return ""
        return (f"biaslab: {self.workers} worker processes ({self.why}; {one_process} runs "
                "one process)")


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
        return WorkerChoice(1)
    if any(m.provider != "scripted" for m in plan.all_model_specs()):
        return WorkerChoice(1)
    workers = min(cores, cells // (BREAK_EVEN_CELLS // 2))
    if workers < 2:
        return WorkerChoice(1)
    return WorkerChoice(workers, f"{cells:,} cells on scripted models, {cores} cores")


def resolve_workers(plan: Plan, workers: int | None, *, shard: str | None,
                    executor: str) -> WorkerChoice:
    """The workers a run gets: `workers` as asked; the default's choice when none was asked
    for and the run is neither one shard nor on Ray (which are sized by the user)."""
    if workers is not None or shard or executor != "local":
        return WorkerChoice(workers or 1)
    return choose_workers(plan)
