"""Shared helpers for bench/run.py: environment, scripted models, plans, timing."""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

# Every benchmark runs without the cross-run cache unless it measures that cache.
os.environ["BIASLAB_CACHE"] = "off"

from biaslab.agents.providers.scripted import ScriptedChatModel, register_scripted  # noqa: E402
from biaslab.experiments.plan import Plan, make_plan  # noqa: E402
from biaslab.experiments.runner import RunResult, run_plan  # noqa: E402
from biaslab.experiments.spec import spec_from_dict  # noqa: E402
from biaslab.graphs import amplification_synthetic as synthetic  # noqa: E402

import flat_protocol  # noqa: E402,F401  (registers protocol bench-flat and scripted:bench-echo)

REPEATS = 3
LATENCY_S = 0.05
SLOW_AGENT = "bench-amplification-slow"   # the synthetic agent, 50 ms per call
FAST_AGENT = "amplification-synthetic"    # the synthetic agent as shipped, no latency


def make_slow_agent() -> ScriptedChatModel:
    agent = synthetic.make_agent()
    agent.latency_s = LATENCY_S
    agent.name_ = SLOW_AGENT
    return agent


register_scripted(SLOW_AGENT, make_slow_agent)


def amplification_plan(agent: str) -> Plan:
    """The grid every amplification benchmark uses: math, E0+E1, 20 test records, 2 directions
    (3 + 7 = 10 cells, 27 call records, 15 distinct model calls)."""
    spec = spec_from_dict({
        "name": "bench-amplification", "protocol": "amplification",
        "models": [f"scripted:{agent}"],
        "conditions": {"directions": ["pro_female", "pro_male"]},
        "options": {"datasets": ["math"], "pipelines": ["E0", "E1"], "max_test": 20},
    }, where="bench")
    return make_plan(spec)


def flat_plan(n_items: int) -> Plan:
    return make_plan(spec_from_dict(flat_protocol.flat_spec_dict(n_items), where="bench"))


class Scratch:
    """Fresh directories under one temporary root, removed at the end."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="biaslab-bench-"))
        self.n = 0

    def new(self, label: str = "run") -> Path:
        self.n += 1
        return self.root / f"{label}-{self.n}"

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def timed_run(plan: Plan, run_dir: Path, *, concurrency: int,
              shared_cache: bool = False) -> tuple[float, RunResult]:
    """Wall time of one whole run (event loop, store, graphs), and its result."""
    started = time.perf_counter()
    result = asyncio.run(run_plan(plan, run_dir, concurrency=concurrency,
                                  use_shared_cache=shared_cache, progress=False))
    elapsed = time.perf_counter() - started
    if result.cells_failed or result.interrupted:
        raise RuntimeError(f"benchmark run failed: {result.summary()}")
    return elapsed, result


def median(values) -> float:
    return statistics.median(values)


def spread(values) -> str:
    """'median (min–max)' for the detail lines."""
    return f"{median(values):.4g} ({min(values):.4g}–{max(values):.4g})"


def repeat(fn: Callable[[], float], n: int = REPEATS) -> list[float]:
    return [fn() for _ in range(n)]
