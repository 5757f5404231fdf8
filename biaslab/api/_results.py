"""A run directory as a Python object: what ``biaslab export`` and ``biaslab report`` give,
as DataFrames in a notebook.

Every method opens the run's store read-only and closes it before returning, so a `Run` can
sit in a notebook for days without holding a file open, and always shows the store as it is
now (a run being resumed next door, a report written since).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from biaslab.api._off_loop import call_off_loop
from biaslab.errors import UserError

if TYPE_CHECKING:
    from biaslab.experiments.runner import RunResult
    from biaslab.experiments.spec import ExperimentSpec
    from biaslab.traces.store import RunStore

__all__ = ["Run", "Tables", "open_run", "opened", "interrupted"]

TABLES_DIR = "tables"


class Tables(Mapping):
    """``tables/*.csv`` of a run by name (the path under ``tables/`` without ``.csv``, e.g.
    ``"table5"`` or ``"outputs"``), each read when first asked for and again once its file
    changes (after `Run.report`). Listing the names reads no table."""

    def __init__(self, run_dir: Path):
        self._dir = Path(run_dir) / TABLES_DIR
        self._read: dict[str, tuple[tuple[int, int], pd.DataFrame]] = {}

    def _files(self) -> dict[str, Path]:
        if not self._dir.is_dir():
            return {}
        return {p.relative_to(self._dir).with_suffix("").as_posix(): p
                for p in sorted(self._dir.rglob("*.csv"))}

    def __getitem__(self, name: str) -> pd.DataFrame:
        path = self._files().get(name)
        if path is None:
            known = ", ".join(self._files()) or "none yet: call .report() to write them"
            raise KeyError(f"no table '{name}' in {self._dir} (tables: {known})")
        stat = path.stat()
        version = (stat.st_mtime_ns, stat.st_size)
        cached = self._read.get(name)
        if cached is None or cached[0] != version:
            try:
                frame = pd.read_csv(path)
            except pd.errors.EmptyDataError:  # a table with no rows and no columns
                frame = pd.DataFrame()
            self._read[name] = cached = (version, frame)
        return cached[1]

    def __iter__(self) -> Iterator[str]:
        return iter(self._files())

    def __len__(self) -> int:
        return len(self._files())

    def __repr__(self) -> str:
        return f"Tables({', '.join(self) or 'none'})"


def interrupted(run_dir: Path, result: "RunResult", again: str) -> KeyboardInterrupt:
    """The KeyboardInterrupt a stopped run raises: how much is kept and how to go on."""
    return KeyboardInterrupt(f"interrupted: {result.cells_run} of {result.cells_total} cells "
                             f"of {run_dir} kept; continue with {again}")


@dataclass(frozen=True)
class Run:
    """One run directory: its cells, calls, node outputs and tables.

    Get one with `open_run` (any run on disk) or `biaslab.run` (a run made from Python).
    """

    path: Path
    """The run directory."""
    spec: "ExperimentSpec"
    """The resolved spec the run was made with (its ``spec.toml``), models and scale applied."""
    result: "RunResult | None" = None
    """What running it did (cells run, model calls, cache hits...), when this object comes
    from `biaslab.run` or `counterfactual`; None for a run opened from disk."""

    @contextmanager
    def _store(self) -> Iterator["RunStore"]:
        from biaslab.experiments.replay import open_run as open_store

        store = open_store(self.path)
        try:
            yield store
        finally:
            store.close()

    def cells(self) -> pd.DataFrame:
        """One row per cell of the grid, in grid order: ``cell_id``, ``status`` (done, error,
        running), ``error``, timings, and the cell's coordinates (variant, item, target,
        direction, model, seed...) as columns; as in ``biaslab export``'s ``cells`` file."""
        with self._store() as store:
            return store.cells()

    def calls(self, node: str | None = None) -> pd.DataFrame:
        """Every model call (one `CallRecord` per row: messages, raw answer, parsed value,
        tokens, cache hit...), or only those of LLM node `node`. Messages, params and parsed
        values stay Python objects (the export writes them as JSON text)."""
        with self._store() as store:
            calls = store.calls()
        if node is None:
            return calls
        if node not in set(calls["node"]):
            nodes = ", ".join(sorted(set(calls["node"]))) or "none"
            raise UserError(f"no calls of node '{node}' in {self.path} (nodes with calls: "
                            f"{nodes})")
        return calls[calls["node"] == node].reset_index(drop=True)

    def outputs(self, node: str) -> pd.DataFrame:
        """Node `node`'s state updates in finished cells, one row per update, with the cell's
        coordinates (variant, item, condition, model, seed), ``visit`` (the k-th update of the
        node in its cell) and the update's fields as ``out.<field>`` columns: the node's rows
        of ``tables/outputs.csv``, without the other nodes' columns."""
        from biaslab.experiments.reports.generic import outputs_table

        with self._store() as store:
            table = outputs_table(store)
        if table.empty or node not in set(table["node"]):
            nodes = ", ".join(dict.fromkeys(table["node"])) if not table.empty else "none"
            raise UserError(f"no outputs of node '{node}' in {self.path} (nodes with outputs: "
                            f"{nodes})")
        rows = table[table["node"] == node].reset_index(drop=True)
        own = [c for c in rows.columns if not c.startswith("out.") or rows[c].notna().any()]
        return rows[own]

    @property
    def tables(self) -> Tables:
        """The run's tables (``tables/*.csv``) by name, read lazily; see `Tables`."""
        return Tables(self.path)

    def report(self, *, figures: bool = True) -> list[Path]:
        """Write the run's tables, figures and ``report.html`` from its trace, as
        ``biaslab report`` does (no model is called); returns the paths written.
        `figures` False: no figure (``--no-figures``), the same tables sooner."""
        from biaslab.experiments.replay import rescore

        return call_off_loop(lambda: rescore(self.path, figures=figures))

    def headline(self) -> pd.DataFrame | None:
        """The protocol's headline table, the one ``biaslab report`` prints (None if the
        protocol has none)."""
        from biaslab.experiments.replay import load_run_plan
        from biaslab.experiments.reports import protocol_headline

        return protocol_headline(load_run_plan(self.path, check_keys=False).protocol, self.path)

    def counterfactual(self, out: str | Path, *, node: str | None = None,
                       prompt: str | None = None, model: str | None = None,
                       directions: list[str] | None = None,
                       targets: str | list[str] | None = None, position: str | None = None,
                       template: str | None = None, mitigation: str | None = None,
                       overrides: list[str] | None = None, from_turn: int | None = None,
                       resume: bool = False, concurrency: int | None = None,
                       no_cache: bool = False, quiet: bool = False) -> "Run":
        """This run again with one change, into `out`, as ``biaslab replay RUN --mode
        counterfactual`` with the same options: calls whose inputs did not change are answered
        from this run's trace, the rest go to a model. Returns the new run, whose tables
        include the comparison with this one (``compare_*``)."""
        from biaslab.experiments.replay import counterfactual

        if concurrency is not None and concurrency < 1:
            raise UserError(f"concurrency must be at least 1, got {concurrency}")
        done = call_off_loop(lambda: counterfactual(
            self.path, out, node=node or "", prompt=prompt, model=model, directions=directions,
            targets=targets, position=position, template=template, overrides=overrides,
            from_turn=from_turn, mitigation=mitigation, resume=resume, concurrency=concurrency,
            use_shared_cache=not no_cache, progress=not quiet))
        print(done.summary(), file=sys.stderr)
        if done.run.interrupted:
            raise interrupted(Path(out), done.run, "the same call with resume=True")
        return opened(out, done.run)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, protocol={self.spec.protocol!r}, " \
               f"scale={self.spec.scale_applied!r})"


def open_run(path: str | Path) -> Run:
    """The run in directory `path` (finished, interrupted or still running), read-only.

    A directory that holds no readable run is a `UserError` naming it."""
    return opened(path)


def opened(path: str | Path, result: "RunResult | None" = None) -> Run:
    """`open_run`, keeping what running it did (`Run.result`)."""
    from biaslab.experiments.replay import load_run_spec, open_run as open_store

    path = Path(path)
    open_store(path).close()  # one line if it is not a readable run
    return Run(path=path, spec=load_run_spec(path), result=result)

