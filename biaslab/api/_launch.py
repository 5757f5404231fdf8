"""``biaslab.run``: ``biaslab run`` from Python, returning the run as a `Run`.

The keywords are the CLI's options with ``-`` as ``_`` (``--no-cache`` is ``no_cache=True``),
and they mean the same; the run goes through the same planner, runner, shard executor and
report writer as the command. It also works inside a running event loop (a notebook cell):
see `biaslab.api._off_loop`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from biaslab.api._off_loop import Cancellable, call_off_loop
from biaslab.api._results import Run, interrupted, opened
from biaslab.errors import UserError

if TYPE_CHECKING:
    from biaslab.experiments.plan import Plan
    from biaslab.experiments.runner import RunResult
    from biaslab.experiments.spec import ExperimentSpec

__all__ = ["run"]


def run(spec: "str | Path | ExperimentSpec | dict[str, Any]", *, out: str | Path | None = None,
        scale: str | None = None, model: str | None = None, all_nodes: bool = False,
        resume: bool = False, concurrency: int | None = None, lanes: int | None = None,
        no_cache: bool = False, no_report: bool = False, no_figures: bool = False,
        quiet: bool = False, workers: int | None = None, shard: str | None = None,
        executor: Literal["local", "ray"] = "local", ray_address: str | None = None) -> Run:
    """Run an experiment, as ``biaslab run`` does, and return it as a `Run`.

    Args:
        spec: a spec file (.toml; its relative paths are taken from its folder), a spec as a
            dict or an `ExperimentSpec` (relative paths from the working directory), or, with
            ``resume=True``, a run directory to continue as it was made.
        out: the run directory (default ``runs/<name>-<scale>``).
        scale: a ``[scale.NAME]`` of the spec (``smoke``, ``paper``; default paper).
        model: replace the spec's model axis with this one model; with `all_nodes`, also the
            nodes the spec binds to models of their own.
        resume: continue a run; its finished cells are kept.
        concurrency: the most model calls in flight.
        lanes: cells per LangGraph invocation.
        no_cache: do not use the cross-run response cache.
        no_report: skip tables and figures (`Run.report` writes them later).
        no_figures: write the tables and ``report.html`` but no figure (the same tables
            sooner; ``--no-figures``).
        quiet: no progress bar.
        workers, shard, executor, ray_address: scale-out, as the CLI's options of those names.

    Returns the run, with what running it did in ``Run.result``. Cells that failed are listed
    on stderr, as the CLI lists them; an interrupted run raises KeyboardInterrupt saying how
    to continue it, its finished cells kept.
    """
    if concurrency is not None and concurrency < 1:
        raise UserError(f"concurrency must be at least 1, got {concurrency}")
    if no_figures and no_report:
        raise UserError("no_figures goes with a report; no_report writes none")
    if lanes is not None and not 1 <= lanes <= 64:
        raise UserError(f"lanes must be between 1 and 64, got {lanes}")
    if workers is not None and workers < 1:
        raise UserError(f"workers must be at least 1, got {workers}")
    if executor not in ("local", "ray"):
        raise UserError(f"executor must be 'local' or 'ray', got {executor!r}")
    if shard and (workers or executor != "local"):
        raise UserError("shard runs one shard in this process; it does not combine with "
                        "workers or executor")
    plan, run_dir = _plan(spec, out=out, scale=scale, model=model, all_nodes=all_nodes,
                          resume=resume)
    if lanes:  # recorded with the spec, so shard workers and resumes use it too
        plan.spec.run.lanes = lanes
    print(f"biaslab: {plan.n_cells()} cells → {run_dir}", file=sys.stderr)
    from biaslab.experiments.workers import resolve_workers

    choice = resolve_workers(plan, workers, shard=shard, executor=executor)
    if choice.why:
        print(choice.announce("workers=1"), file=sys.stderr)
    runner = Cancellable()
    try:
        result = call_off_loop(lambda: _execute(
            runner, plan, run_dir, resume=resume, concurrency=concurrency,
            use_shared_cache=not no_cache, progress=not quiet, workers=choice.workers,
            shard=shard, executor=executor, ray_address=ray_address), cancel=runner.cancel)
    except UserError as exc:  # the runner words its errors for the CLI
        raise UserError(in_python_terms(str(exc))) from None
    print(result.summary(), file=sys.stderr)
    if result.cells_failed:
        _print_failures(run_dir)
    if result.interrupted:
        raise interrupted(run_dir, result, f"biaslab.run({str(run_dir)!r}, resume=True)")
    if not no_report and not shard:
        call_off_loop(lambda: _write_reports(plan, run_dir, figures=not no_figures,
                                             fits_on_disk=not no_cache))
    return opened(run_dir, result)


_CLI_WORDS = [
    (re.compile(r"biaslab run --resume (\S+?)([;,)]?(?:\s|$))"),
     lambda m: f"biaslab.run({m.group(1)!r}, resume=True){m.group(2)}"),
    (re.compile(r"--resume\b"), lambda m: "resume=True"),
    (re.compile(r"(another|a new) --out\b"), lambda m: f"{m.group(1)} out= directory"),
    (re.compile(r"--(out|scale|model|all-nodes|workers|shard|lanes|concurrency)\b"),
     lambda m: m.group(1).replace("-", "_") + "="),
]


def in_python_terms(message: str) -> str:
    """A message worded for the command line (``pass --resume``, ``another --out``,
    ``biaslab run --resume RUN``) in the words of ``biaslab.run``'s keywords, for an error
    raised to Python."""
    for pattern, words in _CLI_WORDS:
        message = pattern.sub(words, message)
    return message


def _plan(spec: Any, *, out, scale, model, all_nodes, resume) -> tuple["Plan", Path]:
    """The plan and run directory, read as ``biaslab run`` reads its arguments."""
    from biaslab.experiments.plan import make_plan
    from biaslab.experiments.spec import (ExperimentSpec, load_spec, refuse_imported_protocol,
                                          spec_from_dict)

    if isinstance(spec, (str, Path)) and Path(spec).is_dir():
        return _recorded(Path(spec), out=out, scale=scale, model=model, all_nodes=all_nodes,
                         resume=resume)
    if isinstance(spec, (str, Path)):
        if resume and Path(spec).suffix != ".toml" and not Path(spec).exists():
            raise UserError(f"no run directory {spec} to resume")
        loaded = load_spec(spec, scale=scale)
    elif isinstance(spec, dict):
        loaded = spec_from_dict(spec, scale=scale, where="spec dict")
    elif isinstance(spec, ExperimentSpec):
        loaded = _rescaled(spec, scale)
    else:
        raise UserError(f"biaslab.run needs a spec file, a spec dict, an ExperimentSpec or a "
                        f"run directory, got {type(spec).__name__}")
    refuse_imported_protocol(loaded, "spec")
    plan = make_plan(loaded, models=[model] if model else None, all_nodes=all_nodes)
    if model and plan.node_models:
        kept = ", ".join(f"{node} → {m.label}" for node, m in sorted(plan.node_models.items()))
        print(f"biaslab: model= replaces the model axis; these nodes keep their own model: "
              f"{kept} (add all_nodes=True to put them on {model} too)", file=sys.stderr)
    run_dir = Path(out) if out else Path("runs") / f"{loaded.name}-{loaded.scale_applied}"
    return plan, run_dir


def _rescaled(spec: "ExperimentSpec", scale: str | None) -> "ExperimentSpec":
    """`spec` with ``[scale.<scale>]`` applied; a spec that already has a scale keeps it."""
    from biaslab.experiments.spec import spec_from_dict

    if not scale or scale == spec.scale_applied:
        return spec
    if spec.scale_applied != "paper":
        raise UserError(f"scale={scale!r}: this spec already has scale "
                        f"'{spec.scale_applied}' applied; pass the spec before scaling")
    data = spec.model_dump(exclude={"scale_applied"})
    return spec_from_dict(data, scale=scale, where=f"spec {spec.name}")


def _recorded(run_dir: Path, *, out, scale, model, all_nodes, resume) -> tuple["Plan", Path]:
    """A run directory: continued from its own spec.toml, so no option has to be repeated."""
    from biaslab.experiments.replay import load_run_plan, open_run as open_store

    if not resume:
        raise UserError(f"{run_dir} is a directory; to continue the run in it: "
                        f"biaslab.run({str(run_dir)!r}, resume=True)")
    for name, value in (("scale", scale), ("model", model), ("all_nodes", all_nodes)):
        if value:
            raise UserError(f"{name}= cannot change a recorded run; biaslab.run("
                            f"{str(run_dir)!r}, resume=True) continues it as it was made")
    if out and Path(out).resolve() != run_dir.resolve():
        raise UserError(f"out={str(out)!r} differs from the run directory {run_dir}; a "
                        "resumed run continues in its own directory")
    open_store(run_dir).close()  # one line if it is not a readable run
    return load_run_plan(run_dir), run_dir


def _execute(runner: Cancellable, plan: "Plan", run_dir: Path, *, resume: bool, concurrency: int | None,
             use_shared_cache: bool, progress: bool, workers: int, shard: str | None,
             executor: str, ray_address: str | None) -> "RunResult":
    """One process, one shard, or shards in workers (processes or Ray), as the CLI runs."""
    from biaslab.experiments import shards
    from biaslab.experiments.runner import run_plan

    if shard:
        i, n = shards.parse_shard(shard)
        result = runner.run(run_plan(plan, run_dir, resume=resume, concurrency=concurrency,
                                     use_shared_cache=use_shared_cache, progress=progress,
                                     only=shards.in_shard(i, n, plan), shard=True))
        shards.mark_shard(run_dir, i, n)
        return result
    if workers > 1 or executor == "ray":
        return shards.run_sharded(plan, run_dir, workers=workers, executor=executor,
                                  resume=resume, concurrency=concurrency,
                                  use_shared_cache=use_shared_cache, ray_address=ray_address,
                                  progress=progress)
    return runner.run(run_plan(plan, run_dir, resume=resume, concurrency=concurrency,
                               use_shared_cache=use_shared_cache, progress=progress))


def _write_reports(plan: "Plan", run_dir: Path, *, figures: bool = True,
                   fits_on_disk: bool = True) -> list[Path]:
    """`fits_on_disk`: False for ``no_cache``, whose report keeps no fitted results on disk
    either (set here, in the thread that writes it: a context does not follow a thread)."""
    from biaslab.datasets import fit_cache
    from biaslab.experiments.reports import write_reports
    from biaslab.traces.store import RunStore

    store = RunStore(run_dir, readonly=True)
    try:
        with fit_cache.fits_on_disk(fits_on_disk):
            return write_reports(plan, store, run_dir, figures=figures)
    finally:
        store.close()


def _print_failures(run_dir: Path) -> None:
    """The first failed cells and their errors, as ``biaslab run`` prints them."""
    from biaslab.traces.store import RunStore

    store = RunStore(run_dir, readonly=True)
    try:
        failed = store.cells().query("status == 'error'")
    finally:
        store.close()
    for _, cell in failed.head(3).iterrows():
        print(f"  failed: {cell['cell_id']}: {cell['error']}", file=sys.stderr)
    print(f"  fix the cause, then: biaslab.run({str(run_dir)!r}, resume=True)", file=sys.stderr)
