"""Replaying a finished run: rescore, strict re-execution, or a counterfactual with one change.

- rescore: the protocol's evaluators run over the stored traces; no model is called.
- strict: every cell runs again and every model call must come from the source trace; the
  node outputs are then compared byte for byte with the source's.
- counterfactual: every cell runs again with one node's prompt, model or exposure changed;
  calls whose inputs did not change come from the trace, the rest go to a model.
"""

from __future__ import annotations

import asyncio
import tomllib
from dataclasses import dataclass
from pathlib import Path

from biaslab.errors import UserError
from biaslab.experiments.plan import Plan, make_plan
from biaslab.experiments.runner import RunResult, run_plan
from biaslab.experiments.spec import ExperimentSpec, NodeSettings
from biaslab.traces.store import STORE_FILE, RunStore

__all__ = ["load_run_plan", "rescore", "strict_replay", "counterfactual", "compare_outputs",
           "OutputDiff"]


def _open_source(run_dir: str | Path) -> RunStore:
    run_dir = Path(run_dir)
    if not (run_dir / STORE_FILE).is_file():
        raise UserError(f"{run_dir} is not a run directory (no {STORE_FILE})")
    return RunStore(run_dir, readonly=True)


def load_run_spec(run_dir: str | Path) -> ExperimentSpec:
    """The resolved spec a run was made with (from its spec.toml)."""
    path = Path(run_dir) / "spec.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    resolved = data.pop("resolved_models", {})
    data["model_aliases"] = {**data.get("model_aliases", {}), **resolved}
    data.pop("scale_applied", None)
    return ExperimentSpec(**data)


def load_run_plan(run_dir: str | Path, *, check_keys: bool = True) -> Plan:
    return make_plan(load_run_spec(run_dir), check_keys=check_keys)


def rescore(run_dir: str | Path) -> list[Path]:
    """Recompute the protocol's metrics, tables and figures from the trace alone."""
    store = _open_source(run_dir)
    try:
        plan = load_run_plan(run_dir, check_keys=False)
        return plan.protocol.report(store, Path(run_dir), plan.options)
    finally:
        store.close()


@dataclass(frozen=True)
class OutputDiff:
    missing: list[tuple[str, int]]
    different: list[tuple[str, int]]
    compared: int

    @property
    def identical(self) -> bool:
        return not self.missing and not self.different


def compare_outputs(source: RunStore, replayed: RunStore) -> OutputDiff:
    """Byte-for-byte comparison of every node output of the source's finished cells."""
    done = source.cells()
    keep = set(done.loc[done["status"] == "done", "cell_id"]) if len(done) else set()
    a = {k: v for k, v in source.raw_outputs().items() if k[0] in keep}
    b = replayed.raw_outputs()
    missing = sorted(set(a) - set(b))
    different = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    return OutputDiff(missing, different, len(a))


def strict_replay(run_dir: str | Path, out_dir: str | Path, *, progress: bool = True
                  ) -> tuple[RunResult, OutputDiff]:
    source = _open_source(run_dir)
    try:
        plan = load_run_plan(run_dir, check_keys=False)
        cells = source.cells()
        done = set(cells.loc[cells["status"] == "done", "cell_id"]) if len(cells) else set()
        # Cells that failed in the source have no complete trace to replay; they are skipped.
        result = asyncio.run(run_plan(plan, out_dir, mode="strict", replay_from=[source],
                                      use_shared_cache=False, progress=progress,
                                      only=lambda cell: cell.id in done))
        replayed = RunStore(out_dir, readonly=True)
        diff = compare_outputs(source, replayed)
        replayed.close()
        return result, diff
    finally:
        source.close()


def counterfactual(run_dir: str | Path, out_dir: str | Path, *, node: str,
                   prompt: str | None = None, model: str | None = None,
                   directions: list[str] | None = None, targets: str | list[str] | None = None,
                   progress: bool = True) -> RunResult:
    """Re-run with one node changed; unchanged calls are served from the source trace.

    Args:
        node: the node whose prompt or model changes.
        prompt: its new prompt (id, id@variant or file).
        model: its new model.
        directions, targets: a changed exposure grid instead (node is then informational).
    """
    if not (prompt or model or directions or targets):
        raise UserError("counterfactual replay needs a change: --prompt, --model, --directions "
                        "or --targets")
    source = _open_source(run_dir)
    try:
        spec = load_run_spec(run_dir)
        nodes = dict(spec.nodes)
        if prompt or model:
            if not node:
                raise UserError("--prompt/--model need --node: the node whose binding changes")
            current = nodes.get(node, NodeSettings())
            nodes[node] = current.model_copy(update={k: v for k, v in
                                                     (("prompt", prompt), ("model", model)) if v})
        conditions = spec.conditions.model_copy(update={k: v for k, v in
                                                        (("directions", directions),
                                                         ("targets", targets)) if v})
        spec = spec.model_copy(update={"nodes": nodes, "conditions": conditions})
        plan = make_plan(spec)
        return asyncio.run(run_plan(plan, out_dir, replay_from=[source], progress=progress))
    finally:
        source.close()
