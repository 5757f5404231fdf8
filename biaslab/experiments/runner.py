"""The grid runner: cells from a bounded queue, run concurrently, streamed to the store.

Cells of one variant go through LangGraph in batches (`biaslab.graphs.lanes`; up to 64 cells of
one or two calls, up to 4 bigger ones where the plan has enough of them to fill every graph run
in flight), each cell in its own lane, so the per-invocation cost is paid once per batch.

Memory stays flat however large the grid: cells are generated lazily, at most a few are queued,
and a finished cell's records go to SQLite and are dropped. Resume works per cell from the
store; Ctrl-C stops cleanly, keeping every finished cell and every paid-for response.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

import tomli_w

from biaslab.agents.gateway import CallScope, Gateway, ReplayMode, RetryPolicy, RunCounters
from biaslab.agents.providers import strip_credentials
from biaslab.agents.redaction import redact, secrets_of
from biaslab.datasets import fit_cache
from biaslab.errors import ReplayMiss, UserError
from biaslab.experiments.plan import Cell, Plan
from biaslab.graphs.lanes import Lane, Lanes, pack, packing_obstacle, run_packed
from biaslab.graphs.registry import protocol_origin, step_budget
from biaslab.traces.cache import CallCache, shared_cache_path
from biaslab.traces.shared_cache import open_shared_cache
from biaslab.traces.verdict_key import run_verdict_key, verdict_key_path
from biaslab.traces.records import SCHEMA_VERSION
from biaslab.traces.store import STORE_FILE, RunStore

__all__ = ["run_plan", "RunResult", "shared_cache_path", "write_resolved_spec", "open_store",
           "run_in_progress", "keep_run_dir_locked", "default_lanes", "packing", "Packing", "prepare_store",
           "check_resumable"]


_COMMIT_EVERY_S = 0.2
"""Finished cells share one store transaction for up to this long (whole cells only)."""


@dataclass
class RunResult:
    run_dir: Path
    cells_total: int
    cells_run: int = 0
    cells_skipped: int = 0
    cells_other_shards: int = 0
    """Cells of the grid that another shard runs (``--shard I/N``)."""
    cells_failed: int = 0
    interrupted: bool = False
    cells_reset: int = 0
    """Cells found unfinished (killed mid-way) and run again on resume."""
    counters: RunCounters = field(default_factory=RunCounters)
    elapsed_s: float = 0.0

    def summary(self) -> str:
        """Two lines that fit 80 columns for everyday counts: the cells, then the calls."""
        c = self.counters
        state = "interrupted" if self.interrupted else "done"
        others = (f"{self.cells_other_shards} belong to other shards, "
                  if self.cells_other_shards else "")
        return (f"{state}: {self.cells_run} cells run, {self.cells_skipped} already done, "
                f"{others}{self.cells_failed} failed of {self.cells_total} in "
                f"{self.elapsed_s:.1f}s, {_Progress._short(c.tokens)} tokens\n  "
                f"{c.model_calls} model calls, {c.cache_hits} cache hits, {c.retries} retries, "
                f"{c.errors} errors, {c.parse_failures} unparsed")


_KEPT_LOCKS: dict[Path, Any] = {}
"""Run directories whose writer lock outlives the run that took it (`keep_run_dir_locked`):
the resolved path, and the lock once taken (None before)."""


class _KeptLock:
    """What `_lock_run_dir` hands out for a kept lock: closing it leaves the lock held."""

    def close(self) -> None:
        pass


@contextmanager
def keep_run_dir_locked(run_dir: str | Path):
    """Keep the writer lock that a run takes on `run_dir` until this block ends, not just
    until the run ends: ``biaslab run`` and ``merge`` write their reports under it, so no
    other writer slips in between the last cell and the tables. The lock is taken lazily by
    the run, so a command that stops on bad input first still creates nothing."""
    key = Path(run_dir).resolve()
    _KEPT_LOCKS.setdefault(key, None)
    try:
        yield
    finally:
        handle = _KEPT_LOCKS.pop(key, None)
        if handle is not None:
            handle.close()


def _lock_run_dir(run_dir: Path):
    """One writer per run directory: a second process gets a clear error, not a locked DB."""
    import fcntl

    key = Path(run_dir).resolve()
    if _KEPT_LOCKS.get(key) is not None:  # held for this command already
        return _KeptLock()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(run_dir / ".lock", "w")
    except OSError as exc:  # a file in the path, /proc, a read-only disk...
        where = f" ({exc.filename})" if exc.filename and Path(exc.filename) != run_dir else ""
        raise UserError(f"cannot use {run_dir} as a run directory: "
                        f"{exc.strerror or exc}{where}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise UserError(f"another biaslab process is writing to {run_dir}") from None
    if key in _KEPT_LOCKS:
        _KEPT_LOCKS[key] = handle
        return _KeptLock()
    return handle


def run_in_progress(run_dir: str | Path) -> bool:
    """Whether a biaslab process holds `run_dir`'s writer lock right now."""
    import fcntl

    try:
        handle = open(Path(run_dir) / ".lock", "r")
    except OSError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        handle.close()
    return False


def open_store(run_dir: str | Path, *, readonly: bool = False, check_rows: bool = True
               ) -> RunStore:
    """A run store that was checked to be a readable biaslab store (one line if not).

    With `check_rows`, a row whose JSON is damaged is named in one line (`DamagedStore`) here,
    before any verb reads past it; a resume passes False and repairs such cells instead
    (`prepare_store`)."""
    store = None
    try:
        store = RunStore(run_dir, readonly=readonly)
        store.meta()
        store.counts()
        if check_rows:
            store.check_rows()
        return store
    except UserError:  # a damaged row or table, named
        if store is not None:
            store.conn.close()
        raise
    except sqlite3.DatabaseError as exc:
        if store is not None:
            try:
                store.conn.close()
            except sqlite3.Error:
                pass
        raise UserError(f"{Path(run_dir) / STORE_FILE} is not a readable biaslab run store "
                        f"({exc})") from None


def _drop_none(value):
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def write_resolved_spec(plan: Plan, run_dir: Path) -> None:
    """The spec a run was made with, enough to continue or replay it with nothing else.

    ``resolved_models`` holds every model as used, endpoint included (from ``VLLM_BASE_URL``
    and friends), so a replay does not depend on the shell; ``options`` stays as written so
    that the recorded spec has the same fingerprint, and ``resolved_options`` shows every
    default. Credentials in a base URL are never written.
    """
    data = plan.spec.model_dump(exclude={"scale"})
    data["models"] = [m.label for m in plan.models]
    data["model_aliases"] = {
        name: {**table, **({"base_url": strip_credentials(table["base_url"])}
                           if isinstance(table.get("base_url"), str) else {})}
        for name, table in data.get("model_aliases", {}).items()}
    data["resolved_models"] = {m.label: m.public() for m in plan.all_model_specs()}
    data["resolved_options"] = plan.options.model_dump()
    (run_dir / "spec.toml").write_text(tomli_w.dumps(_drop_none(data)), encoding="utf-8")


class _Progress:
    """Cells and model calls as they happen: two rich lines on a terminal, else a status line.

    Line 1 is the cell bar with its count, elapsed time and ETA; line 2 the call counters
    (calls, calls per second, cache hits, retries, errors, parse failures, tokens). The call line
    is read from `RunCounters` at every refresh (rich's refresh thread, twice a second), so a
    long cell still shows movement on each model call without the gateway knowing about the
    bar. Both lines fit in 80 columns (after a retry the reason, `retry 3 (timeout after
    300 s)`, may wrap the second). Off a terminal (logs, CI, pipes) a background thread
    prints the same status every 15 seconds, also while a long cell runs.

    Args:
        total: cells in the grid.
        counters: the gateway's live counters.
        enabled: False for ``--quiet``.
        console: where to draw (tests pass one); default stderr.
    """

    _LOG_EVERY_S = 15.0

    def __init__(self, total: int, counters: RunCounters, enabled: bool, console=None,
                 expected_calls: float | None = None):
        import threading

        self.counters = counters
        self.total, self.done, self.enabled = total, 0, enabled
        # Packed cells finish in bursts, so the ETA follows the calls where an estimate of
        # them exists (`biaslab estimate`'s, less what cells skipped on resume would have made).
        self.expected_calls = expected_calls
        self.started = time.monotonic()
        self._skipped_before_calls = 0  # resume: cells skipped at once must not speed up the ETA
        self.bar = None
        self._stop = threading.Event()
        self._thread = None
        if not enabled:
            return
        if console is None:
            from rich.console import Console
            console = Console(stderr=True)
        if console.is_terminal:
            self.bar = self._make_bar(console)
            self.task = self.bar.add_task("cells", total=total)
            self.bar.start()
        else:
            self._thread = threading.Thread(target=self._log_loop, daemon=True,
                                            name="biaslab-progress")
            self._thread.start()

    def _make_bar(self, console):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn,
                                   TextColumn)
        from rich.text import Text

        progress = self

        class _Times(ProgressColumn):  # computed at each refresh, so it runs during long cells
            def render(self, task):
                return Text(progress.times())

        class _Bar(Progress):
            def get_renderables(self):
                yield self.make_tasks_table(self.tasks)
                yield progress.calls_line()

        return _Bar(TextColumn("[bold]cells"), BarColumn(bar_width=24), MofNCompleteColumn(),
                    _Times(), console=console, refresh_per_second=2, transient=False)

    # -- text -----------------------------------------------------------------------------
    @staticmethod
    def _clock(seconds: float | None) -> str:
        if seconds is None:
            return "-:--:--"
        s = int(round(seconds))
        return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"

    @staticmethod
    def _short(n: int) -> str:
        for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if n >= div:
                return f"{n / div:.1f}{suffix}"
        return str(n)

    def eta_s(self) -> float | None:
        """Seconds left, from completed work at the rate it is being completed.

        While calls are expected: the calls not yet answered (expected − paid − cache hits −
        failed) at the rate paid calls have *completed* so far. A call that has only started
        is no progress, and a cache hit, answered at once, sets no pace (a partly cached run
        would otherwise promise the rest at the cache's speed); with no paid call completed
        yet there is no call pace. Else, at the pace of the cells run so far (not those
        skipped on resume); None when nothing sets a pace yet."""
        if self.done >= self.total:
            return 0.0
        elapsed = time.monotonic() - self.started
        c = self.counters
        answered = c.model_calls + c.cache_hits + c.errors
        if self.expected_calls and c.model_calls > 0 and answered < self.expected_calls:
            return elapsed / c.model_calls * (self.expected_calls - answered)
        ran = self.done - self._skipped_before_calls
        if ran <= 0:
            return None
        return elapsed / ran * (self.total - self.done)

    def times(self) -> str:
        """``0:01:23 elapsed · eta 0:04:10``."""
        return (f"{self._clock(time.monotonic() - self.started)} elapsed · "
                f"eta {self._clock(self.eta_s())}")

    def status(self) -> str:
        """The call counters in one line of at most about 75 characters."""
        c = self.counters
        elapsed = max(time.monotonic() - self.started, 1e-9)
        why = f" ({c.last_retry})" if c.retries and c.last_retry else ""
        return (f"calls {c.model_calls:,} {c.model_calls / elapsed:.1f}/s · cached "
                f"{c.cache_hits:,} · retry {c.retries}{why} · err {c.errors} · unparsed "
                f"{c.parse_failures} · tok {self._short(c.tokens)}")

    def calls_line(self):
        from rich.text import Text

        return Text(self.status(), style="dim", overflow="fold")

    # -- updates --------------------------------------------------------------------------
    def advance(self, n: int = 1, skipped_calls: float = 0.0) -> None:
        """`n` cells finished; `skipped_calls`: the calls expected of cells skipped (resume,
        another shard), which this run will not make."""
        if self.expected_calls is not None:
            self.expected_calls -= skipped_calls
        if self.counters.calls == 0 and self.counters.model_calls == 0:
            self._skipped_before_calls += n
        self.done += n
        if self.bar:
            self.bar.update(self.task, advance=n)

    def refresh(self) -> None:
        """Redraw now (the bar also refreshes itself twice a second)."""
        if self.bar:
            self.bar.refresh()

    def _log_loop(self) -> None:
        while not self._stop.wait(self._LOG_EVERY_S):
            print(f"cells {self.done}/{self.total} · {self.times()} · {self.status()}",
                  file=sys.stderr, flush=True)

    def stop(self) -> None:
        self._stop.set()
        if self.bar:
            self.refresh()
            self.bar.stop()


class _ExpectedCalls:
    """Each cell's expected calls (`Protocol.estimate`, memoised per variant and item), for
    an ETA that follows the calls: cells packed into one graph run finish together."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self._memo: dict[tuple[str, str], float] = {}

    def of(self, cell: Cell) -> float:
        key = (cell.variant, cell.item)
        if key not in self._memo:
            try:
                self._memo[key] = float(self.plan.protocol.estimate(
                    cell.variant, cell.item, self.plan.options)["calls"])
            except Exception:  # a protocol's estimate is advice: never fail a run over it
                self._memo[key] = 0.0
        return self._memo[key]

    def total(self) -> float | None:
        total = sum(self.of(cell) for cell in self.plan.cells())
        return total or None


def _redacted(plan: Plan, error: str) -> str:
    """A cell's error text as it may be stored and printed: no credential of the run's models."""
    return redact(error, secrets_of(plan.all_model_specs()))


async def _run_cell(plan: Plan, cell: Cell, graph, gateway: Gateway, store: RunStore) -> bool:
    ctx = plan.context(cell, gateway)
    store.start_cell(cell.id, cell.ord, cell.coords)
    outputs: list[tuple[str, object]] = []
    with gateway.scope() as calls_in_flight:
        try:
            state = plan.protocol.initial_state(cell.variant, cell.item, cell.seed, plan.options)
            async for chunk in graph.astream(state, context=ctx, stream_mode="updates"):
                for node, update in chunk.items():
                    outputs.append((node, update))
        except (ReplayMiss, asyncio.CancelledError):
            raise
        except Exception as exc:  # one cell's failure is recorded, never fatal to the run
            # Its sibling calls (other batches, other judges) may still be in flight: let them
            # land, so every paid answer is cached and recorded with the failed cell.
            await calls_in_flight.settle()
            store.finish_cell(cell.id, ctx.calls, outputs,
                              error=_redacted(plan, f"{type(exc).__name__}: {exc}"))
            return False
    store.finish_cell(cell.id, ctx.calls, outputs)
    return True


def prepare_store(store: RunStore, plan: Plan, run_dir: Path, *, resume: bool) -> int:
    """Check that `run_dir` may take this run, record what the run is (meta and the resolved
    spec) and, on resume, mark cells a killed run left running as pending again.

    Returns the number of cells reset. Raises `UserError` for a directory that holds another
    run (without `resume`) or another experiment."""
    counts = store.counts()
    if counts["cells_done"] + counts["cells_error"] and not resume:
        raise UserError(f"{run_dir} already holds a run; pass --resume to continue it, or "
                        "choose another --out")
    if resume:
        _check_not_emptied(store, run_dir)
    fingerprint = plan.fingerprint()
    recorded = store.meta().get("fingerprint")
    if recorded and recorded != fingerprint:
        raise UserError(f"{run_dir} was made with a different spec (models, scale, conditions, "
                        "options or prompts changed); resume it with the same spec, or choose "
                        "another --out")
    if not recorded:
        store.set_meta(spec_name=plan.spec.name, protocol=plan.protocol.name,
                       protocol_origin=protocol_origin(plan.protocol),
                       scale=plan.spec.scale_applied, created=time.time(),
                       fingerprint=fingerprint, schema_version=SCHEMA_VERSION)
    if resume:
        repaired = store.reset_damaged()
        if repaired:
            cells = sorted({d.cell_id for d in repaired})
            print(f"biaslab: warning: {store.path} had {len(repaired)} damaged row(s) in "
                  f"{len(cells)} cell(s) ({repaired[0].describe()}); those cells run again, "
                  "their answers from the cache", file=sys.stderr)
    write_resolved_spec(plan, run_dir)
    return store.reset_unfinished() if resume else 0


def check_resumable(run_dir: Path) -> None:
    """`_check_not_emptied`, read-only, before a resume opens the store for writing: a refused
    resume must not create, or initialise, the missing or emptied run.sqlite it refuses."""
    path = run_dir / STORE_FILE
    if not path.is_file() or path.stat().st_size == 0:
        if (run_dir / "spec.toml").is_file():
            state = "empty" if path.is_file() else "missing"
            raise UserError(f"{path} is {state}, though {run_dir} held a run (it has a "
                            "spec.toml): the store was emptied or lost, and a resume would "
                            "start over and pay again; restore run.sqlite, or run the spec "
                            "into a new --out")
        return
    store = open_store(run_dir, readonly=True, check_rows=False)
    try:
        _check_not_emptied(store, run_dir)
    finally:
        store.close()


def _check_not_emptied(store: RunStore, run_dir: Path) -> None:
    """Refuse to resume a store whose cells are gone while the run left other traces (its
    spec.toml, call records, outputs, cached answers, or the mark of its first cell): a resume
    would silently start over and pay for every answer again."""
    if store.conn.execute("SELECT 1 FROM cells LIMIT 1").fetchone():
        return
    q = store.conn.execute
    meta = store.meta()
    traces = [what for what, found in (
        ("cells were started", meta.get("cells_started")),
        ("call records", q("SELECT 1 FROM calls LIMIT 1").fetchone()),
        ("outputs", q("SELECT 1 FROM outputs LIMIT 1").fetchone()),
        ("cached answers", q("SELECT 1 FROM cache LIMIT 1").fetchone()),
        ("a spec.toml, but no run recorded in the store",
         (run_dir / "spec.toml").is_file() and not meta.get("fingerprint"))) if found]
    if traces:
        raise UserError(f"{store.path} holds no cells, though {run_dir} held a run "
                        f"({'; '.join(traces)}): the store was emptied or replaced, and a "
                        "resume would start over and pay again; restore run.sqlite, or run "
                        "the spec into a new --out")


class _Batches:
    """Graphs compiled once per run: each variant's own, and its packed form per lane count."""

    def __init__(self, plan: Plan):
        self.builders = {v: plan.protocol.build(v, plan.options)
                         for v in plan.protocol.variants(plan.options)}
        self.single = {v: plan.compile(v, b) for v, b in self.builders.items()}
        self.packable = {v: packing_obstacle(b) is None for v, b in self.builders.items()}
        self._packed: dict[tuple[str, int], Any] = {}

    def packed(self, variant: str, k: int):
        key = (variant, k)
        if key not in self._packed:
            builder = self.builders[variant]
            self._packed[key] = pack(builder, k).compile().with_config(
                recursion_limit=step_budget(builder))
        return self._packed[key]


async def _run_batch(plan: Plan, cells: list[Cell], graphs: _Batches, gateway: Gateway,
                     store: RunStore) -> list[bool]:
    """Cells of one variant in one packed graph run; each finishes (or fails) on its own."""
    variant = cells[0].variant

    async def one_at_a_time() -> list[bool]:
        return [await _run_cell(plan, cell, graphs.single[variant], gateway, store)
                for cell in cells]

    if len(cells) == 1 or not graphs.packable[variant]:
        return await one_at_a_time()
    contexts = [plan.context(cell, gateway) for cell in cells]
    scopes = [CallScope() for _ in cells]
    lanes = Lanes([Lane(ctx, partial(gateway.scope, scope), scope.settle, (ReplayMiss,))
                   for ctx, scope in zip(contexts, scopes)])
    store.start_cells([(cell.id, cell.ord, cell.coords) for cell in cells])
    states = [plan.protocol.initial_state(cell.variant, cell.item, cell.seed, plan.options)
              for cell in cells]
    try:
        outputs, errors = await run_packed(graphs.packed(variant, len(cells)), states, lanes)
    except (ReplayMiss, asyncio.CancelledError):
        raise
    except Exception:  # not one lane's failure: each cell runs alone (its answers are cached)
        for scope in scopes:
            await scope.settle()
        return await one_at_a_time()
    errors = [None if error is None else _redacted(plan, error) for error in errors]
    store.finish_cells([(cell.id, ctx.calls, out, error)
                        for cell, ctx, out, error in zip(cells, contexts, outputs, errors)])
    return [error is None for error in errors]


@dataclass(frozen=True)
class Packing:
    """How one variant's cells are grouped: `lanes` cells per graph run, at most `runs` graph
    runs in flight."""

    lanes: int
    runs: int


def default_lanes(concurrency: int, calls_per_cell: float = 1.0) -> int:
    """Cells per graph run when the spec does not say.

    Packing pays LangGraph's per-run set-up once per batch: most of what a cell of one or two
    calls costs, and a fifth of what an E2 cell costs. Graphs without routers run their lanes
    in one task per node and one channel per key (`biaslab.graphs.lanes`), so their cost per
    run hardly grows with the lanes: cells of one or two calls pack by up to 4x the
    concurrency, at most 64. Lanes wait for each other at every step, so cells of several
    steps pack by at most 4 (with more batches in flight, `packing`). At concurrency 1 cells
    run one at a time, in order, as someone stepping through a run expects. Measured in
    bench/results.md."""
    if concurrency <= 1:
        return 1
    return min(64, 4 * concurrency) if calls_per_cell <= 2 else min(4, concurrency)


def packing(concurrency: int, calls_per_cell: float, lanes: int | None = None,
            cells: int | None = None) -> Packing:
    """`lanes` (default `default_lanes`) and the graph runs in flight that keep the gateway's
    slots full. Cells of one or two calls: 4x the concurrency in cells, and at least two
    graph runs (one run's last, slowest calls leave slots to the other's), as more only queue
    at the gateway (and cost CPU). Cells of several steps: 4x the concurrency in graph runs,
    since a cell spends steps on cache hits and plain code, and lanes wait at each step for the
    slowest of them (with spread-out latencies, fewer runs cost E2 a fifth of its throughput).

    Other batches fill the slots a waiting lane leaves only when there are enough of them: a
    plan of `cells` cells of several steps packs by default only so far as it still fills
    every graph run in flight (``cells // runs`` lanes, at least 1). The augmentation smoke job
    (6 cells, 5-7 steps each) ran its cells in two lockstep batches, every lane idle while one
    retried a parse failure; one cell per run lets the other cells go on."""
    k = lanes or default_lanes(concurrency, calls_per_cell)
    if concurrency <= 1:
        return Packing(k, 1)
    if calls_per_cell > 2:
        runs = 4 * concurrency
        if lanes is None and cells is not None:
            k = max(1, min(k, cells // runs))
        return Packing(k, runs)
    return Packing(k, max(2, -(-4 * concurrency // k)))


async def run_plan(plan: Plan, run_dir: str | Path, *, resume: bool = False,
                   concurrency: int | None = None, mode: ReplayMode = "live",
                   replay_from: Sequence[RunStore] = (), use_shared_cache: bool = True,
                   progress: bool = True, only: Callable[[Cell], bool] | None = None,
                   lanes: int | None = None, shard: bool = False,
                   done_elsewhere: Collection[str] = ()) -> RunResult:
    """Run every cell of `plan` into `run_dir`.

    Args:
        resume: continue a run in `run_dir`; finished cells are never run again.
        mode: ``live``, or ``strict`` to demand that every call comes from `replay_from`.
        replay_from: stores of earlier runs whose responses are used before any model.
        use_shared_cache: also use the cross-run cache (`shared_cache_path`).
        only: run just the cells it accepts (strict replay skips cells that failed).
        shard: `only` selects this shard's cells: the others are counted as belonging to other
            shards, not as done.
        done_elsewhere: ids of cells already done in another store (a resumed run's main store,
            for its shards): skipped and counted as already done.
        lanes: cells per graph run (default: the spec's ``run.lanes``, else `default_lanes`).
    """
    run_dir = Path(run_dir)
    # The shared cache first: a path that cannot hold it stops the run before anything is
    # written; a damaged one is moved aside (biaslab.traces.shared_cache).
    shared = shared_cache_path() if use_shared_cache and mode == "live" else None
    shared_cache = open_shared_cache(shared) if shared else None
    try:
        lock = _lock_run_dir(run_dir)
    except UserError:
        if shared_cache is not None:
            shared_cache.close()
        raise
    try:
        if resume:  # refused before the store is opened for writing: nothing is created
            check_resumable(Path(run_dir))
        store = open_store(run_dir, check_rows=not resume)  # a resume repairs damaged cells
    except UserError:
        lock.close()
        if shared_cache is not None:
            shared_cache.close()
        raise
    try:
        reset = prepare_store(store, plan, run_dir, resume=resume)
    except UserError:
        store.close()
        lock.close()
        if shared_cache is not None:
            shared_cache.close()
        raise
    caches: list[CallCache] = [store.cache]
    if shared_cache is not None:
        caches.append(shared_cache)
    # The judges' verdict markers: this run's key, else its source's (a shard, a replay), else
    # the user's (biaslab.traces.verdict_key).
    verdict_key = run_verdict_key(store, replay_from, verdict_key_path())
    gateway = Gateway(caches=caches, replay=[s.cache for s in replay_from], mode=mode,
                      verdict_key=verdict_key,
                      concurrency=concurrency or plan.spec.run.concurrency,
                      retry=RetryPolicy(max_attempts=plan.spec.run.max_attempts,
                                        base_s=plan.spec.run.retry_base_s),
                      on_store=store.put_cache, batch_writes=True)
    setup = getattr(plan.protocol, "setup_counters", None)
    if setup is not None:  # calls made while the plan was made (an app's discovery pass)
        for name in vars(setup):
            setattr(gateway.counters, name, getattr(gateway.counters, name) + getattr(setup, name))
    graphs = _Batches(plan)
    store.batch_s = _COMMIT_EVERY_S
    result = RunResult(run_dir, plan.n_cells(), counters=gateway.counters)
    expected = _ExpectedCalls(plan) if progress else None
    bar = _Progress(result.cells_total, gateway.counters, progress,
                    expected_calls=expected.total() if expected else None)
    chosen = lanes or plan.spec.run.lanes
    first_item = next(iter(plan.protocol.items(plan.options)), None)
    packs = {v: packing(gateway.concurrency, plan.protocol.estimate(
                 v, first_item, plan.options)["calls"] if first_item is not None else 1.0, chosen,
                 cells=result.cells_total)
             for v in plan.protocol.variants(plan.options)}
    # Each variant keeps to its own number of graph runs in flight (a plan mixes variants).
    in_flight = {v: asyncio.Semaphore(p.runs) for v, p in packs.items()}
    workers_n = max(p.runs for p in packs.values())
    queue: asyncio.Queue = asyncio.Queue(maxsize=2 * workers_n)
    started = time.monotonic()

    async def produce():
        batch: list[Cell] = []
        for cell in plan.cells():
            if only is not None and not only(cell):
                if shard:
                    result.cells_other_shards += 1
                else:
                    result.cells_skipped += 1
                bar.advance(skipped_calls=expected.of(cell) if expected else 0.0)
                continue
            if cell.id in done_elsewhere or (resume and store.cell_status(cell.id) == "done"):
                result.cells_skipped += 1
                bar.advance(skipped_calls=expected.of(cell) if expected else 0.0)
                continue
            if batch and (len(batch) == packs[batch[0].variant].lanes
                          or batch[0].variant != cell.variant):
                await queue.put(batch)
                batch = []
            batch.append(cell)
        if batch:
            await queue.put(batch)
        for _ in range(workers_n):
            await queue.put(None)

    async def work():
        while (batch := await queue.get()) is not None:
            async with in_flight[batch[0].variant]:
                oks = await _run_batch(plan, batch, graphs, gateway, store)
            for ok in oks:
                result.cells_run += 1
                result.cells_failed += not ok
                bar.advance()

    async def flush():  # finished cells wait at most _COMMIT_EVERY_S for their commit
        while True:
            await asyncio.sleep(_COMMIT_EVERY_S)
            store.maybe_commit(_COMMIT_EVERY_S)
            gateway.flush()  # the shared cache's new answers, as often

    # Everything built so far (plan, graphs, modules) lives as long as the run: keep it out of
    # the cyclic collector's scans, which otherwise cost ~15 % of the CPU per call.
    gc.freeze()
    # --no-cache keeps fitted results off disk too (the cells' tasks inherit this context); a
    # strict replay, which never uses the response cache, still loads fits (not responses).
    fits = None if use_shared_cache or mode != "live" else fit_cache.no_fits_on_disk()
    flusher = asyncio.create_task(flush())
    tasks = [asyncio.create_task(produce()), *(asyncio.create_task(work())
                                               for _ in range(workers_n))]
    try:
        await asyncio.gather(*tasks)
    except (asyncio.CancelledError, KeyboardInterrupt):
        result.interrupted = True
    finally:
        for task in (*tasks, flusher):
            task.cancel()
        await asyncio.gather(*tasks, flusher, return_exceptions=True)
        fit_cache.restore(fits)
        gc.unfreeze()
        bar.stop()
        store.close()
        lock.close()
        if shared_cache is not None:
            shared_cache.close()
        result.elapsed_s = time.monotonic() - started
    result.cells_reset = reset
    return result
