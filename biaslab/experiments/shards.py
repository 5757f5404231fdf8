"""Runs split into shards: several processes on one machine, or Ray tasks on a cluster.

A shard is a deterministic slice of the grid (every n-th item, model and seed, with all its
variants and conditions: see `in_shard`) run into a store of its own; `merge_runs` copies
finished cells, their calls and outputs, and the response cache of any number of shard stores
into one run store. Cells are independent and their answers come from content-addressed calls,
so the merged store equals a single-process run cell for cell (only which call was a cache
hit, and timings, differ).

`run_sharded` is what ``biaslab run --workers N`` and ``--executor ray`` use: shard stores live
under ``RUN_DIR/shards/``, each worker also reads the run's own store (cells done there are
skipped, its cache answers first), and the shards are merged into the run's store at the end.
Ray tasks get their inputs and return their stores as bytes (`biaslab.experiments.ray_shards`),
so a cluster needs no shared filesystem.
A resumed run resumes each shard and merges again, so nothing is paid for twice.
"""

from __future__ import annotations

import multiprocessing
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from biaslab.errors import UserError
from biaslab.experiments.interrupts import CtrlC, is_ctrl_c_watcher, run_coroutine
from biaslab.experiments.plan import Cell, Plan
from biaslab.experiments.runner import (RunResult, _lock_run_dir, open_store, prepare_store,
                                        run_plan, write_resolved_spec)
from biaslab.traces.store import STORE_FILE, RunStore
from biaslab.traces.verdict_key import run_verdict_key, verdict_key_path

__all__ = ["parse_shard", "in_shard", "merge_runs", "missing_shards", "run_sharded", "run_shard", "mark_shard",
           "MergeResult", "SHARDS_DIR"]

SHARDS_DIR = "shards"


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` → (i, n) with 0 <= i < n; a one-line error otherwise."""
    head, sep, tail = str(text).partition("/")
    try:
        i, n = int(head), int(tail)
    except ValueError:
        i = n = -1
    if not sep or n < 1 or not 0 <= i < n:
        raise UserError(f"--shard must be I/N with 0 <= I < N (e.g. 0/4), got '{text}'")
    return i, n


def in_shard(i: int, n: int, plan: Plan | None = None) -> Callable[[Cell], bool]:
    """The cells of shard i of n: every n-th (item, model, seed) of the grid order, with all
    its variants and conditions.

    Those cells share work: exposed arms reuse their clean arm's unexposed calls, variants
    reuse each other's steps, and all of them the protocol's per-item, per-seed state (a data
    split, a fitted predictor). Cut across shards, each shard would pay for it again. Dealt
    round-robin, the shards still get a similar mix of items and seeds.

    A grid with fewer than 4 such groups per shard would be dealt unevenly, so it is dealt by
    (variant, item, model, seed) instead, and with fewer than 4 of those per shard cell by
    cell, as it is without a `plan`.
    """
    if plan is None:
        return lambda cell: cell.ord % n == i
    starts: list[tuple[int, int, int]] = []  # (first ord, group size, groups before) per variant
    first = groups = 0
    per_variant = plan.n_cells_per_condition()
    for variant in plan.protocol.variants(plan.options):
        size = max(1, len(plan.conditions[variant]))
        starts.append((first, size, groups))
        first += size * per_variant
        groups += per_variant
    if per_variant >= 4 * n:
        starts = [(begin, size, 0) for begin, size, _ in starts]  # (item, model, seed) index
    elif groups < 4 * n:
        return lambda cell: cell.ord % n == i

    def wanted(cell: Cell) -> bool:
        begin, size, before = next(s for s in reversed(starts) if cell.ord >= s[0])
        return (before + (cell.ord - begin) // size) % n == i

    return wanted


# -- merging ----------------------------------------------------------------------------------
@dataclass
class MergeResult:
    out: Path
    sources: int
    cells_copied: int
    cells_done: int
    cells_error: int


def _fingerprint_of(run_dir: Path) -> str | None:
    if not (run_dir / STORE_FILE).is_file():
        raise UserError(f"{run_dir} is not a run directory (no {STORE_FILE})")
    store = open_store(run_dir, readonly=True)
    try:
        return store.meta().get("fingerprint")
    finally:
        store.close()


def missing_shards(sources: Sequence[str | Path]) -> list[str]:
    """The shards ``i/n`` of the split that `sources` come from which none of them holds
    (each shard store is marked ``i/n``; runs without a mark count as whole). A merge of an
    incomplete set writes tables over part of the grid, so ``biaslab merge`` refuses it
    unless asked (``--allow-partial``)."""
    marks = set()
    for src in sources:
        if not (Path(src) / STORE_FILE).is_file():
            raise UserError(f"{src} is not a run directory (no {STORE_FILE})")
        store = open_store(src, readonly=True, check_rows=False)
        try:
            mark = store.meta().get("shard")
        finally:
            store.close()
        if mark is None:
            return []  # a whole run (or an earlier merge) among them: nothing to count
        marks.add(parse_shard(mark))
    splits = {n for _, n in marks}
    return [f"{i}/{n}" for n in sorted(splits) for i in range(n) if (i, n) not in marks]


def merge_runs(sources: Sequence[str | Path], out: str | Path, *, _locked: bool = False
               ) -> MergeResult:
    """Combine the stores of `sources` (shards of one experiment) into the run at `out`.

    Every source must hold the same experiment (same fingerprint), and so must `out` if it
    already holds a run; ``spec.toml`` is copied from the first source when `out` has none.

    Raises:
        UserError: a source is not a run, or the runs are of different experiments.
    """
    out = Path(out)
    sources = [Path(s) for s in sources]
    if not sources:
        raise UserError("merge needs at least one run directory")
    prints = {s: _fingerprint_of(s) for s in sources}
    first = prints[sources[0]]
    for src, fp in prints.items():
        if fp != first or fp is None:
            raise UserError(f"cannot merge {src} with {sources[0]}: they are runs of different "
                            f"experiments (fingerprint {fp} vs {first})")
        if src.resolve() == out.resolve():
            raise UserError(f"cannot merge {src} into itself; choose another --out")
    lock = None if _locked else _lock_run_dir(out)
    try:
        store = open_store(out)
        try:
            meta = store.meta()
            if meta.get("fingerprint") not in (None, first):
                raise UserError(f"{out} holds a run of another experiment (fingerprint "
                                f"{meta['fingerprint']} vs {first}); choose another --out")
            if not meta.get("fingerprint"):
                src_store = open_store(sources[0], readonly=True, check_rows=False)
                try:
                    src_meta = src_store.meta()
                finally:
                    src_store.close()
                src_meta.pop("shard", None)
                store.set_meta(**src_meta)
            if not (out / "spec.toml").exists() and (sources[0] / "spec.toml").exists():
                shutil.copyfile(sources[0] / "spec.toml", out / "spec.toml")
            copied = sum(store.merge_from(src) for src in sources)
            counts = store.counts()
        finally:
            store.close()
    finally:
        if lock is not None:
            lock.close()
    return MergeResult(out, len(sources), copied, counts["cells_done"], counts["cells_error"])


# -- one shard ----------------------------------------------------------------------------------
def run_shard(shard_dir: str | Path, shard: str, *, main_dir: str | Path | None = None,
              concurrency: int | None = None, use_shared_cache: bool = True,
              progress: bool = False) -> RunResult:
    """Run shard ``i/n`` of the experiment whose resolved spec is ``shard_dir/spec.toml``.

    With `main_dir`, cells already done in that run are skipped and its cache answers first.
    This is what a worker process or a Ray task executes.
    """
    from biaslab.experiments.plan import make_plan
    from biaslab.experiments.replay import load_run_spec

    i, n = parse_shard(shard)
    shard_dir = Path(shard_dir)
    plan = make_plan(load_run_spec(shard_dir))
    wanted = in_shard(i, n, plan)
    sources: list[RunStore] = []
    done_before: set[str] = set()
    if main_dir is not None and (Path(main_dir) / STORE_FILE).is_file():
        main = open_store(main_dir, readonly=True)
        if main.meta().get("fingerprint") not in (None, plan.fingerprint()):
            main.close()
            raise UserError(f"{main_dir} holds another experiment than shard {shard}")
        done_before = {cid for (cid,) in main.conn.execute(
            "SELECT cell_id FROM cells WHERE status='done'")}
        sources.append(main)
    try:
        # A shard's spec.toml comes before its store: a shard without a store starts afresh.
        resume = (shard_dir / STORE_FILE).is_file()
        result = run_coroutine(run_plan(plan, shard_dir, resume=resume,
                                        concurrency=concurrency, replay_from=sources,
                                        use_shared_cache=use_shared_cache, progress=progress,
                                        only=wanted, shard=True, done_elsewhere=done_before))
    finally:
        for s in sources:
            s.close()
    mark_shard(shard_dir, i, n)
    return result


def mark_shard(run_dir: str | Path, i: int, n: int) -> None:
    """Record in a store that it holds shard i of n (merge drops the mark)."""
    store = RunStore(run_dir)
    try:
        store.set_meta(shard=f"{i}/{n}")
    finally:
        store.close()


def _worker_args(shard_dir: Path, shard: str, main_dir: Path, concurrency: int | None,
                 use_shared_cache: bool) -> list[str]:
    args = [str(shard_dir), shard, "--main", str(main_dir)]
    if concurrency:
        args += ["--concurrency", str(concurrency)]
    if not use_shared_cache:
        args.append("--no-cache")
    return args


def _forked_worker(argv: list[str]) -> None:
    sys.exit(_main(argv))


def _can_fork() -> bool:
    """Forking is safe on Linux while this process runs no other thread (a fork copies only
    the calling thread, so a lock held elsewhere would stay locked in the child forever). On
    macOS system libraries may crash a forked child, which is why Python spawns there."""
    others = [t for t in threading.enumerate()
              if t is not threading.current_thread() and not is_ctrl_c_watcher(t)]
    return sys.platform.startswith("linux") and not others


class LocalWorker:
    """A worker process on this machine, forked or started afresh (`started`)."""

    def __init__(self, proc, started: str):
        self.proc, self.started = proc, started

    def poll(self) -> int | None:
        """The exit code, or None while it runs."""
        if self.started == "fork":
            return None if self.proc.is_alive() else self.proc.exitcode
        return self.proc.poll()

    def wait(self) -> int:
        if self.started == "fork":
            self.proc.join()
            return self.proc.exitcode
        return self.proc.wait()


def start_local_workers(jobs: Sequence[tuple[Path, str]], main_dir: Path,
                        concurrency: int | None, use_shared_cache: bool) -> list[LocalWorker]:
    """Start one worker per shard on this machine.

    Workers are forked where that is safe, so they start with this process's imports, data
    splits and compiled prompts already in memory: a new interpreter pays about 2 s of CPU
    importing LangGraph, pandas and the protocols before its first cell, which on a grid of
    a few thousand cells costs more than the second core gives back. Elsewhere (no fork, or
    another thread running) each worker is a new ``python -m biaslab.experiments.shards``.
    Both kinds are in this process's group, so Ctrl-C reaches them as it reaches us.
    """
    argvs = [_worker_args(d, s, main_dir, concurrency, use_shared_cache) for d, s in jobs]
    if _can_fork():
        context = multiprocessing.get_context("fork")
        sys.stdout.flush()
        sys.stderr.flush()
        workers = [LocalWorker(context.Process(target=_forked_worker, args=(argv,)), "fork")
                   for argv in argvs]
        for worker in workers:
            worker.proc.start()
        return workers
    return [LocalWorker(subprocess.Popen([sys.executable, "-m", "biaslab.experiments.shards",
                                          *argv]), "spawn") for argv in argvs]


def _watch(workers: Sequence[LocalWorker], watch) -> list[int]:
    """Wait for every worker, redrawing the progress bar from their stores meanwhile."""
    try:
        while any(w.poll() is None for w in workers):
            watch.update()
            time.sleep(0.1)
    finally:
        watch.close()
    return [w.wait() for w in workers]


def run_sharded(plan: Plan, run_dir: str | Path, *, workers: int, executor: str = "local",
                resume: bool = False, concurrency: int | None = None,
                use_shared_cache: bool = True, ray_address: str | None = None,
                keep_shards: bool = False, progress: bool = False) -> RunResult:
    """Run `plan` in `workers` shards (processes here, or Ray tasks) into one run store.

    The shard stores (``RUN_DIR/shards/I-of-N``) are merged into ``RUN_DIR``'s store at the
    end, also after an interruption, and removed once every cell is done. `concurrency` is per
    worker.
    """
    run_dir = Path(run_dir)
    if workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    lock = _lock_run_dir(run_dir)
    started = time.monotonic()
    try:
        store = open_store(run_dir, check_rows=not resume)  # a resume repairs damaged cells
        try:
            prepare_store(store, plan, run_dir, resume=resume)
            # fixed before any shard starts: each shard takes it from this store
            run_verdict_key(store, (), verdict_key_path())
            done_before = store.counts()["cells_done"] if resume else 0
        finally:
            store.close()
        shards_root = run_dir / SHARDS_DIR
        existing = sorted(p for p in shards_root.glob("*-of-*") if p.is_dir()) \
            if shards_root.is_dir() else []
        if existing and any(not p.name.endswith(f"-of-{workers}") for p in existing):
            # Shards of another split: fold what they finished into the run first.
            merge_runs([p for p in existing if (p / STORE_FILE).is_file()], run_dir, _locked=True)
            for p in existing:
                shutil.rmtree(p, ignore_errors=True)
        jobs = []
        for i in range(workers):
            shard_dir = shards_root / f"{i}-of-{workers}"
            shard_dir.mkdir(parents=True, exist_ok=True)
            write_resolved_spec(plan, shard_dir)
            jobs.append((shard_dir, f"{i}/{workers}"))
        interrupted = False
        nodes: list[str] = []
        waits: list[LocalWorker] = []
        try:
            if executor == "ray":
                from biaslab.experiments.ray_shards import run_with_ray

                nodes = run_with_ray(jobs, run_dir, concurrency, use_shared_cache, ray_address)
            elif executor == "local":
                from biaslab.experiments.worker_progress import WorkerProgress

                waits = start_local_workers(jobs, run_dir, concurrency, use_shared_cache)
                codes = _watch(waits, WorkerProgress(plan.n_cells(), done_before,
                                                     [d for d, _ in jobs], progress))
                if 2 in codes:  # the worker printed its one-line reason
                    shard = jobs[codes.index(2)][1]
                    raise UserError(f"the worker for shard {shard} stopped on an error "
                                    "(above); fix it, then resume the run")
                interrupted = any(c not in (0, 1) for c in codes)
            else:
                raise UserError(f"unknown executor '{executor}' (local or ray)")
        except KeyboardInterrupt:
            interrupted = True
            for worker in waits:  # Ctrl-C reached the workers too: merge what they kept
                worker.wait()
        merged = merge_runs([d for d, _ in jobs if (d / STORE_FILE).is_file()], run_dir,
                            _locked=True)
        how = {"shard_nodes": nodes} if nodes else {}  # where each Ray shard ran
        if executor == "local" and waits:
            how["workers_started"] = waits[0].started  # fork or spawn
        if how:  # for the record (and the tests)
            store = RunStore(run_dir)
            try:
                store.set_meta(**how)
            finally:
                store.close()
    finally:
        lock.close()
    result = RunResult(run_dir, plan.n_cells())
    result.cells_run = merged.cells_copied
    result.cells_failed = merged.cells_error
    result.interrupted = interrupted or merged.cells_done + merged.cells_error < plan.n_cells()
    result.elapsed_s = time.monotonic() - started
    store = open_store(run_dir, readonly=True, check_rows=False)
    try:
        c = store.counts()
        result.counters.calls = c["calls"]
        result.counters.cache_hits = c["cache_hits"]
        result.counters.parse_failures = c["parse_failures"]
        result.counters.errors = c["call_errors"]
        result.counters.model_calls = c["calls"] - c["cache_hits"] - c["call_errors"]
        result.counters.tokens = c["tokens_paid"]  # the workers' tokens, as one process counts
    finally:
        store.close()
    if not result.interrupted and not keep_shards:
        shutil.rmtree(run_dir / SHARDS_DIR, ignore_errors=True)
    return result


def _main(argv: list[str] | None = None) -> int:
    """A worker process: ``python -m biaslab.experiments.shards SHARD_DIR I/N --main RUN_DIR``."""
    import argparse

    parser = argparse.ArgumentParser(prog="biaslab-shard-worker")
    parser.add_argument("shard_dir")
    parser.add_argument("shard")
    parser.add_argument("--main")
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--no-cache", action="store_true")
    args = parser.parse_args(argv)
    # Ctrl-C reaches every worker with its coordinator: the first stops this shard cleanly
    # (the coordinator says so, once), a second quits at once; see interrupts.CtrlC.
    with CtrlC(Path(args.shard_dir), None, announce=False,
               hint=f"biaslab run --resume {args.main or args.shard_dir}") as ctrl_c:
        try:
            result = run_shard(args.shard_dir, args.shard, main_dir=args.main,
                               concurrency=args.concurrency,
                               use_shared_cache=not args.no_cache)
        except UserError as exc:
            print(f"biaslab: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return ctrl_c.leave()
        if result.interrupted:
            return ctrl_c.leave()
    return 1 if result.cells_failed else 0


if __name__ == "__main__":
    sys.exit(_main())
