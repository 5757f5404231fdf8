"""``biaslab import traces FILE --out RUN``: an app's recorded traffic as a biaslab run.

Each trace of the file (`biaslab.traces.imported`) becomes one clean cell of protocol
``imported-traces`` (`biaslab.graphs.imported_traces`): its model calls are call records
under their nodes, answered from the trace (``cache_hit``: nothing was paid here), and its
``app`` output holds the outcome (unit, group, measure) and the final output, as an app audit's
does. So the evaluator graphs judge what the app really said (``replay --mode rescore
--judge-node NODE``) and ``report`` writes the generic tables, without the app.

The run is written in a temporary directory beside `out` and moved into place when whole: a
damaged or foreign file leaves nothing behind.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from biaslab.errors import UserError
from biaslab.experiments.out_paths import built_beside
from biaslab.experiments.plan import make_plan
from biaslab.experiments.runner import write_resolved_spec
from biaslab.experiments.spec import spec_from_dict
from biaslab.graphs.imported_traces import IMPORTED_NODE, IMPORTED_PROTOCOL, RECORDED_MODEL
from biaslab.graphs.registry import protocol_origin
from biaslab.traces.cache import cache_key
from biaslab.traces.imported import (GAP_NAMES, ImportedTraces, Trace, read_trace_file,
                                     select_traces)
from biaslab.traces.records import SCHEMA_VERSION, CallRecord
from biaslab.traces.store import RunStore

__all__ = ["import_traces", "ImportResult", "RECORDED_MODEL", "gap_lines", "refuse_rerun"]

@dataclass(frozen=True)
class ImportResult:
    out: Path
    format: str
    traces: int
    calls: int
    nodes: list[str]
    gaps: dict[str, int]


def _path_value(value: Any, path: str) -> Any:
    """A dotted path into a JSON value (list indexes allowed); None when absent."""
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit() and \
                -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _unit_ids(traces: list[Trace], unit: str | None) -> list[str]:
    """Each trace's unit id: the item's `unit` key (``id`` when every item has one), else the
    trace id. Ids must be unique and fit in a cell id (no ``/``)."""
    key = unit or ("id" if traces and all(t.item and "id" in t.item for t in traces) else None)
    if unit and not all(t.item and unit in t.item for t in traces):
        bad = next(t for t in traces if not (t.item and unit in t.item))
        raise UserError(f"--unit {unit}: trace {bad.trace_id}'s input has no key '{unit}'")
    ids = [str(t.item[key]) if key else t.trace_id for t in traces]
    seen: Counter = Counter(ids)
    twice = [i for i, n in seen.items() if n > 1]
    if twice:
        raise UserError(f"unit id '{twice[0]}' names {seen[twice[0]]} traces; name a unique "
                        "item key with --unit, or leave it out to use the trace ids")
    slashed = next((i for i in ids if "/" in i or not i), None)
    if slashed is not None:
        raise UserError(f"unit id {slashed!r} is empty or holds '/', which cell ids cannot "
                        "hold; name another item key with --unit")
    return ids


def import_traces(path: str | Path, out: str | Path, *, group: str | None = None,
                  unit: str | None = None, outcome: str | None = None,
                  since: str | None = None, until: str | None = None,
                  tag: str | None = None) -> ImportResult:
    """Write the traces of `path` as a run in `out` (which must not exist yet).

    Raises:
        UserError: an unreadable, damaged or foreign file; `out` already exists; an item key
            named by `group` or `unit` that some trace lacks; a filter (`since`, `until`,
            `tag`) that keeps no trace.
    """
    out = Path(out)
    if out.exists():
        raise UserError(f"{out} already exists; choose another --out")
    found = select_traces(read_trace_file(path), since=since, until=until, tag=tag)
    ids = _unit_ids(found.traces, unit)
    if group and not any(t.item and group in t.item for t in found.traces):
        raise UserError(f"--group {group}: no trace's input has the key '{group}' "
                        f"(keys: {', '.join(sorted({k for t in found.traces for k in (t.item or {})})) or 'none'})")
    nodes = list(dict.fromkeys(c.node for t in found.traces for c in t.calls))
    spec = spec_from_dict({
        "name": f"import-{Path(path).stem}", "protocol": IMPORTED_PROTOCOL,
        "models": [RECORDED_MODEL], "conditions": {"targets": []},
        "options": {"source": str(path), "format": found.format, "items": ids,
                    "nodes": nodes, "group": group, "outcome": outcome,
                    "selected": {k: v for k, v in (("since", since), ("until", until),
                                                   ("tag", tag)) if v is not None},
                    "gaps": dict(sorted(found.gaps.items()))}}, where=str(path))
    plan = make_plan(spec)
    with built_beside(out) as tmp:
        _write(plan, found, ids, tmp, group, outcome)
    return ImportResult(out, found.format, len(found.traces),
                        sum(len(t.calls) for t in found.traces), nodes, dict(found.gaps))


def _write(plan, found: ImportedTraces, ids: list[str], run_dir: Path, group: str | None,
           outcome: str | None) -> None:
    by_item = dict(zip(ids, found.traces))
    measure = plan.protocol.measure(plan.options)
    store = RunStore(run_dir)
    try:
        store.set_meta(spec_name=plan.spec.name, protocol=plan.protocol.name,
                       protocol_origin=protocol_origin(plan.protocol), scale=plan.spec.scale_applied,
                       created=time.time(), fingerprint=plan.fingerprint(),
                       schema_version=SCHEMA_VERSION, imported_from=str(plan.options.source),
                       imported_format=found.format, imported_gaps=dict(found.gaps))
        write_resolved_spec(plan, run_dir)
        cells = list(plan.cells())
        store.start_cells([(c.id, c.ord, {**c.coords, **({"group": (by_item[c.item].item or {})
                                                           .get(group)} if group else {})})
                           for c in cells])
        finished = []
        for cell in cells:
            trace = by_item[cell.item]
            records = [_record(cell, i, call) for i, call in enumerate(trace.calls)]
            final = trace.output
            value = _path_value(final, outcome) if outcome else (
                final if not isinstance(final, (dict, list)) else None)
            row: dict[str, Any] = {"unit": cell.item, measure: value}
            if group:
                row[group] = (trace.item or {}).get(group)
            finished.append((cell.id, records,
                             [(IMPORTED_NODE, {"outcome": row, "final_state": final,
                                               "input": trace.item, "trace_id": trace.trace_id})],
                             None))
        store.finish_cells(finished)
    finally:
        store.close()


def _record(cell, index: int, call) -> CallRecord:
    model = {"provider": "traced", "model": call.model}
    return CallRecord(
        cell_id=cell.id, node=call.node, item=f"call-{index}", seed=cell.seed,
        exposure_id=cell.condition.id, prompt_id="traced", prompt_source="trace",
        cache_key=cache_key(model, call.messages, call.params, 0), messages=call.messages,
        model=model, params=call.params, raw=call.answer,
        error=None if call.answer is not None else "the trace holds no answer for this call",
        input_tokens=call.input_tokens or 0, output_tokens=call.output_tokens or 0,
        cache_hit=True)


def refuse_rerun(run_dir: str | Path, mode: str) -> None:
    """A strict or counterfactual replay re-runs the app, which an imported run does not have:
    one line instead of every cell failing."""
    spec = Path(run_dir) / "spec.toml"
    if not spec.is_file():
        return  # (the replay itself says what is wrong with the directory)
    from biaslab.experiments.spec import read_toml

    try:
        protocol = read_toml(spec, "run spec").get("protocol")
    except UserError:
        return  # (a damaged spec.toml: the replay says so in its own words)
    if protocol == IMPORTED_PROTOCOL:
        raise UserError(f"{run_dir} was imported from a trace file and has no app to run again "
                        f"(--mode {mode}); report it, or judge a node with --mode rescore "
                        "--judge-node NODE; to replay the app, audit it (docs/audit.md)")
    if not (Path(run_dir) / "run.sqlite").is_file():
        return
    try:
        store = RunStore(run_dir, readonly=True)
        try:
            imported = store.meta().get("imported_format")
        finally:
            store.close()
    except (UserError, sqlite3.DatabaseError):
        return  # (a damaged store: the replay says so in its own words)
    if imported:
        raise UserError(f"{run_dir} was imported ({imported}): its answers are recorded, with "
                        f"no model to ask again (--mode {mode}); report it, rescore it "
                        "(--mode rescore, --sensitivity), or judge a node with --mode rescore "
                        "--judge-node NODE")


def gap_lines(gaps: dict[str, int]) -> list[str]:
    """One line per gap: its count, name and meaning."""
    return [f"{n} x {name}: {GAP_NAMES.get(name, name)}" for name, n in sorted(gaps.items())]
