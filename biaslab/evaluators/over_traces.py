"""Evaluator graphs over recorded traces: judge what a finished run's nodes said.

The target models are never called: each recorded call of the chosen node becomes one
evaluation cell, whose only model calls are the judges'. Results go to their own store under
``<run>/evals/<name>/`` so the source run stays untouched and the evaluation can be resumed,
replayed and cached like any run.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypedDict

import pandas as pd
from langgraph.graph import END, START, StateGraph

from biaslab.agents.context import Bindings, CellContext
from biaslab.agents.ask import CallFailed
from biaslab.agents.gateway import Gateway
from biaslab.agents.providers import parse_model
from biaslab.errors import UserError
from biaslab.evaluators.judges import judge_node
from biaslab.prompts.registry import PromptRegistry
from biaslab.traces.cache import shared_cache_path
from biaslab.traces.records import CallRecord
from biaslab.traces.shared_cache import open_shared_cache
from biaslab.traces.store import STORE_FILE, RunStore
from biaslab.traces.verdict_key import run_verdict_key, verdict_key_path

__all__ = ["judge_traces", "TraceJudgement", "default_slots"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _open_readonly(run_dir: Path) -> RunStore:
    try:
        store = RunStore(run_dir, readonly=True)
    except sqlite3.DatabaseError as exc:
        raise UserError(f"{run_dir / STORE_FILE} is not a readable biaslab run store "
                        f"({exc})") from None
    try:
        store.check_rows()  # a damaged row is named here, not met halfway through judging
    except BaseException:
        store.conn.close()
        raise
    return store


class _EvalState(TypedDict, total=False):
    slots: dict[str, str]
    verdict: dict[str, Any]


def default_slots(call: CallRecord) -> dict[str, str]:
    """What a judge sees of a traced call: the last user message and the model's answer."""
    user = next((m["content"] for m in reversed(call.messages) if m["role"] == "user"), "")
    return {"prompt": user, "text": call.raw or ""}


@dataclass(frozen=True)
class TraceJudgement:
    """What a judging pass over traces did.

    Attributes:
        scores: one row per judged call (only calls whose judges all answered).
        judge_calls: model calls made by the judges in this pass.
        failed: judged calls whose judge call failed for good (cell status ``error``).
        not_started: calls left unjudged because an earlier judge call failed for good (an
            unreachable judge fails every call; asking on would only wait out the retries).
        first_error: why the first failed cell failed (names the judge and its endpoint).
    """

    eval_dir: Path
    scores: pd.DataFrame
    judge_calls: int
    failed: int = 0
    not_started: int = 0
    first_error: str | None = None


def judge_traces(run_dir: str | Path, *, node: str, prompt: str, judges: Sequence[str],
                 labels: Sequence[str] | None = None, repeats: int = 1, name: str = "judge",
                 slots: Callable[[CallRecord], dict[str, str]] = default_slots,
                 concurrency: int = 4) -> TraceJudgement:
    """Judge every successful recorded call of `node` in a finished run.

    Args:
        node: the traced node whose answers are judged.
        prompt: the judge's prompt; its ``labels`` are the answer set unless `labels` is given.
        judges: k judge models; each answers `repeats` times.
        slots: what the judge sees of a traced call (default: its prompt and answer).

    Returns one row per judged call: its cell, item and exposure, the majority label, tie
    flag, vote counts and unscored verdicts.
    """
    run_dir = Path(run_dir)
    if not (run_dir / STORE_FILE).is_file():
        raise UserError(f"{run_dir} is not a run directory (no {STORE_FILE})")
    if repeats < 1 or not judges:
        raise UserError("judging traces needs at least one judge model and repeats >= 1")
    if not _NAME.fullmatch(name):
        raise UserError(f"eval name '{name}' must be letters, digits, '.', '_' or '-' (it names "
                        f"a directory under {run_dir / 'evals'})")
    models = [parse_model(j) for j in judges]
    for model in models:
        model.check_ready()
    registry = PromptRegistry()
    template = registry.get(prompt)
    labels = list(labels or template.labels)
    if not labels:
        raise UserError(f"prompt {template.ref} declares no labels; pass the labels to judge with")
    template.check_slots(slots(CallRecord(cell_id="", node=node)), f"{name} (over traces)")
    source = _open_readonly(run_dir)
    try:
        recorded = [row[0] for row in source.conn.execute(
            "SELECT DISTINCT node FROM calls ORDER BY node")]
    except sqlite3.DatabaseError as exc:
        source.close()
        raise UserError(f"{run_dir / STORE_FILE} is not a readable biaslab run store "
                        f"({exc})") from None
    if node not in recorded:
        source.close()
        raise UserError(f"run {run_dir} recorded no calls of node '{node}' (recorded nodes: "
                        f"{', '.join(recorded) or 'none'})")
    # What decides the verdicts; an eval directory holds one setting only, so judging again
    # under the same name with other judges, repeats, labels, prompt or node never returns
    # (or overwrites with) verdicts made under the old one.
    settings = {"node": node, "prompt": template.ref, "prompt_hash": template.content_hash,
                "judges": [m.public() for m in models], "repeats": repeats, "labels": labels}
    eval_dir = run_dir / "evals" / name
    try:
        store = RunStore(eval_dir)
        before = store.meta().get("eval_settings")
    except sqlite3.DatabaseError as exc:
        source.close()
        raise UserError(f"{eval_dir / STORE_FILE} is not a readable evaluation store "
                        f"({exc})") from None
    except OSError as exc:
        source.close()
        raise UserError(f"cannot write the evaluation to {eval_dir}: {exc}") from None
    if before is not None and before != json.loads(json.dumps(settings)):
        changed = sorted(k for k in settings if before.get(k) != json.loads(json.dumps(
            settings[k])))
        store.close()
        source.close()
        raise UserError(f"{eval_dir} holds an evaluation made with other settings (changed: "
                        f"{', '.join(changed)}); choose another --eval-name, or delete that "
                        "directory to judge again")
    if before is None:
        store.set_meta(eval_settings=settings, source_run=str(run_dir.resolve()),
                       source_fingerprint=source.meta().get("fingerprint"))
    shared = shared_cache_path()
    caches = [store.cache] + ([open_shared_cache(shared)] if shared else [])
    gateway = Gateway(caches=caches, concurrency=concurrency, on_store=store.put_cache,
                      verdict_key=run_verdict_key(store, [source], verdict_key_path()))

    builder = StateGraph(_EvalState, context_schema=CellContext)
    builder.add_node(name, judge_node(name, prompt=prompt, labels=labels, judges=models,
                                      repeats=repeats, slots=lambda s: s["slots"],
                                      writes="verdict"))
    builder.add_edge(START, name)
    builder.add_edge(name, END)
    graph = builder.compile()

    targets = [c for c in source.iter_calls() if c.node == node and c.raw is not None
               and c.parse_error is None]

    errors: list[str] = []
    skipped = [0]

    async def run_all():
        semaphore = asyncio.Semaphore(concurrency)

        async def one(i: int, call: CallRecord):
            cell_id = f"{call.cell_id}#{call.item}#{call.sample}"
            if store.cell_status(cell_id) == "done":
                return
            async with semaphore:
                if errors:  # the judge already failed for good: do not wait out its retries
                    skipped[0] += 1
                    return
                ctx = CellContext(cell_id=cell_id, seed=call.seed, prompts=registry,
                                  bindings=Bindings(model=models[0]), gateway=gateway)
                store.start_cell(cell_id, i, {"source_cell": call.cell_id, "item": call.item,
                                              "exposure_id": call.exposure_id})
                try:
                    final = await graph.ainvoke({"slots": slots(call)}, context=ctx)
                except CallFailed as exc:  # kept as an error cell: the next pass retries it
                    errors.append(str(exc))
                    store.finish_cell(cell_id, ctx.calls, [], error=str(exc))
                    return
                store.finish_cell(cell_id, ctx.calls, [(name, final["verdict"])])

        await asyncio.gather(*(one(i, c) for i, c in enumerate(targets)))

    try:
        asyncio.run(run_all())
        rows = []
        for cell_id, _, _, verdict in store.iter_outputs(node=name):
            source_cell, item, sample = cell_id.rsplit("#", 2)
            rows.append({"cell_id": source_cell, "item": item, "sample": int(sample),
                         "label": verdict["label"], "tie": verdict["tie"],
                         "unscored": verdict["unscored"], **{f"votes_{k}": v for k, v in
                                                             verdict["counts"].items()}})
        scores = pd.DataFrame(rows)
        if len(scores):
            cells = source.cells()
            # an imported trace run's cells carry the item's group (`biaslab import traces`)
            cells = cells[[c for c in ("cell_id", "target", "direction", "model", "seed",
                                       "group") if c in cells.columns]]
            scores = scores.merge(cells, on="cell_id", how="left")
            scores.to_csv(eval_dir / "scores.csv", index=False)
            if "group" in scores.columns:
                by_group = scores.groupby(["group", "label"], dropna=False).size()
                by_group.rename("answers").reset_index().to_csv(
                    eval_dir / "scores_by_group.csv", index=False)
        return TraceJudgement(eval_dir, scores, gateway.counters.model_calls, len(errors),
                              skipped[0], errors[0] if errors else None)
    finally:
        source.close()
        store.close()
        for cache in caches[1:]:
            cache.close()
