"""The grid runner: cells from a bounded queue, run concurrently, streamed to the store.

Memory stays flat however large the grid: cells are generated lazily, at most a few are queued,
and a finished cell's records go to SQLite and are dropped. Resume works per cell from the
store; Ctrl-C stops cleanly, keeping every finished cell and every paid-for response.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import tomli_w

from biaslab.agents.gateway import Gateway, ReplayMode, RetryPolicy, RunCounters
from biaslab.errors import ReplayMiss, UserError
from biaslab.experiments.plan import Cell, Plan
from biaslab.traces.cache import CallCache
from biaslab.traces.records import SCHEMA_VERSION
from biaslab.traces.store import RunStore

__all__ = ["run_plan", "RunResult", "shared_cache_path", "write_resolved_spec"]


def shared_cache_path() -> Path | None:
    """The cross-run response cache: ``$BIASLAB_CACHE``, or under the user's cache dir.
    ``BIASLAB_CACHE=off`` disables it."""
    env = os.environ.get("BIASLAB_CACHE")
    if env == "off":
        return None
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "biaslab" / "calls.sqlite"


@dataclass
class RunResult:
    run_dir: Path
    cells_total: int
    cells_run: int = 0
    cells_skipped: int = 0
    cells_failed: int = 0
    interrupted: bool = False
    cells_reset: int = 0
    """Cells found unfinished (killed mid-way) and run again on resume."""
    counters: RunCounters = field(default_factory=RunCounters)
    elapsed_s: float = 0.0

    def summary(self) -> str:
        c = self.counters
        state = "interrupted" if self.interrupted else "done"
        return (f"{state}: {self.cells_run} cells run, {self.cells_skipped} already done, "
                f"{self.cells_failed} failed of {self.cells_total}; {c.model_calls} model calls, "
                f"{c.cache_hits} cache hits, {c.retries} retries, {c.errors} call errors, "
                f"{c.parse_failures} parse failures, {c.tokens} tokens in {self.elapsed_s:.1f}s")


def _lock_run_dir(run_dir: Path):
    """One writer per run directory: a second process gets a clear error, not a locked DB."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    handle = open(run_dir / ".lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise UserError(f"another biaslab process is writing to {run_dir}") from None
    return handle


def _drop_none(value):
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def write_resolved_spec(plan: Plan, run_dir: Path) -> None:
    data = plan.spec.model_dump(exclude={"scale"})
    data["models"] = [m.label for m in plan.models]
    data["resolved_models"] = {m.label: m.public() for m in plan.all_model_specs()}
    data["options"] = plan.options.model_dump()
    (run_dir / "spec.toml").write_text(tomli_w.dumps(_drop_none(data)), encoding="utf-8")


class _Progress:
    """A rich progress bar on a terminal; elsewhere a status line every 15 seconds."""

    def __init__(self, total: int, counters: RunCounters, enabled: bool):
        self.counters = counters
        self.total, self.done, self.enabled = total, 0, enabled
        self.last_line = time.monotonic()
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeRemainingColumn)
            self.bar = Progress(TextColumn("[bold]cells"), BarColumn(), MofNCompleteColumn(),
                                TimeRemainingColumn(), TextColumn("{task.description}"),
                                transient=False)
            self.task = self.bar.add_task("", total=total)
            self.bar.start()

    def advance(self, n: int = 1) -> None:
        c = self.counters
        self.done += n
        status = (f"calls {c.model_calls} · cache {c.cache_hits} · errors {c.errors} · "
                  f"parse fail {c.parse_failures} · tokens {c.tokens}")
        if self.bar:
            self.bar.update(self.task, advance=n, description=status)
        elif self.enabled and time.monotonic() - self.last_line >= 15:  # logs, CI, pipes
            self.last_line = time.monotonic()
            print(f"cells {self.done}/{self.total} · {status}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self.bar:
            self.bar.stop()


async def _run_cell(plan: Plan, cell: Cell, graph, gateway: Gateway, store: RunStore) -> bool:
    ctx = plan.context(cell, gateway)
    store.start_cell(cell.id, cell.ord, cell.coords)
    outputs: list[tuple[str, object]] = []
    try:
        state = plan.protocol.initial_state(cell.variant, cell.item, cell.seed, plan.options)
        async for chunk in graph.astream(state, context=ctx, stream_mode="updates"):
            for node, update in chunk.items():
                outputs.append((node, update))
    except (ReplayMiss, asyncio.CancelledError):
        raise
    except Exception as exc:  # one cell's failure is recorded, never fatal to the run
        store.finish_cell(cell.id, ctx.calls, outputs, error=f"{type(exc).__name__}: {exc}")
        return False
    store.finish_cell(cell.id, ctx.calls, outputs)
    return True


async def run_plan(plan: Plan, run_dir: str | Path, *, resume: bool = False,
                   concurrency: int | None = None, mode: ReplayMode = "live",
                   replay_from: Sequence[RunStore] = (), use_shared_cache: bool = True,
                   progress: bool = True, only: Callable[[Cell], bool] | None = None
                   ) -> RunResult:
    """Run every cell of `plan` into `run_dir`.

    Args:
        resume: continue a run in `run_dir`; finished cells are never run again.
        mode: ``live``, or ``strict`` to demand that every call comes from `replay_from`.
        replay_from: stores of earlier runs whose responses are used before any model.
        use_shared_cache: also use the cross-run cache (`shared_cache_path`).
        only: run just the cells it accepts (strict replay skips cells that failed).
    """
    run_dir = Path(run_dir)
    fingerprint = plan.fingerprint()
    lock = _lock_run_dir(run_dir)
    store = RunStore(run_dir)
    counts = store.counts()
    if counts["cells_done"] + counts["cells_error"] and not resume:
        store.close()
        lock.close()
        raise UserError(f"{run_dir} already holds a run; pass --resume to continue it, or "
                        "choose another --out")
    recorded = store.meta().get("fingerprint")
    if resume and recorded and recorded != fingerprint:
        store.close()
        lock.close()
        raise UserError(f"{run_dir} was made with a different spec (models, scale, conditions, "
                        "options or prompts changed); resume it with the same spec, or choose "
                        "another --out")
    if not recorded:
        store.set_meta(spec_name=plan.spec.name, protocol=plan.protocol.name,
                       scale=plan.spec.scale_applied, created=time.time(),
                       fingerprint=fingerprint, schema_version=SCHEMA_VERSION)
    write_resolved_spec(plan, run_dir)
    reset = store.reset_unfinished() if resume else 0
    caches: list[CallCache] = [store.cache]
    shared = shared_cache_path() if use_shared_cache and mode == "live" else None
    shared_cache = CallCache.open_file(shared) if shared else None
    if shared_cache is not None:  # (an empty cache is falsy: it has __len__)
        caches.append(shared_cache)
    gateway = Gateway(caches=caches, replay=[s.cache for s in replay_from], mode=mode,
                      concurrency=concurrency or plan.spec.run.concurrency,
                      retry=RetryPolicy(max_attempts=plan.spec.run.max_attempts,
                                        base_s=plan.spec.run.retry_base_s),
                      on_store=store.put_cache)
    graphs = {v: plan.protocol.build(v).compile() for v in plan.protocol.variants(plan.options)}
    result = RunResult(run_dir, plan.n_cells(), counters=gateway.counters)
    bar = _Progress(result.cells_total, gateway.counters, progress)
    workers_n = gateway.concurrency
    queue: asyncio.Queue = asyncio.Queue(maxsize=2 * workers_n)
    started = time.monotonic()

    async def produce():
        for cell in plan.cells():
            if only is not None and not only(cell):
                result.cells_skipped += 1
                bar.advance()
                continue
            if resume and store.cell_status(cell.id) == "done":
                result.cells_skipped += 1
                bar.advance()
                continue
            await queue.put(cell)
        for _ in range(workers_n):
            await queue.put(None)

    async def work():
        while (cell := await queue.get()) is not None:
            ok = await _run_cell(plan, cell, graphs[cell.variant], gateway, store)
            result.cells_run += 1
            result.cells_failed += not ok
            bar.advance()

    tasks = [asyncio.create_task(produce()), *(asyncio.create_task(work())
                                               for _ in range(workers_n))]
    try:
        await asyncio.gather(*tasks)
    except (asyncio.CancelledError, KeyboardInterrupt):
        result.interrupted = True
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        bar.stop()
        store.close()
        lock.close()
        if shared_cache is not None:
            shared_cache.close()
        result.elapsed_s = time.monotonic() - started
    result.cells_reset = reset
    return result
