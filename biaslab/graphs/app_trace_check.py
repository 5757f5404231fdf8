"""``tables/trace_check.csv``: is the audited app still the app that was traced?

When an app audit's items are a trace file (docs/traces.md), each clean cell ran the app on a
traced input, its model calls answered from the trace where they were the recorded ones. Its
final state should then be the recorded final output; an item where it is not says that the
app (its code, its prompts, its routing) changed since it was traced, or that a call was not
the recorded one, and the audit's clean arm is then no longer what the app did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["write_trace_check", "trace_check"]

_COLUMNS = ["unit", "model", "seed", "trace_id", "matches", "differing_keys", "answered_from_trace",
            "paid_calls"]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _differing(recorded: Any, final: Any) -> list[str]:
    if isinstance(recorded, dict) and isinstance(final, dict):
        return sorted(k for k in set(recorded) | set(final)
                      if _canonical(recorded.get(k)) != _canonical(final.get(k)))
    return [] if _canonical(recorded) == _canonical(final) else ["(output)"]


def trace_check(store, options) -> pd.DataFrame | None:
    """One row per clean cell of an audit whose items are a trace file (None otherwise)."""
    from biaslab.graphs.app_audit import read_items
    from biaslab.traces.imported import looks_like_traces, read_trace_file, select_traces

    path = Path(getattr(options, "items_file", "") or "")
    try:
        if not path.is_file() or not looks_like_traces(path.read_text(encoding="utf-8")):
            return None
    except (OSError, UnicodeDecodeError):
        return None
    ids, _ = read_items(options)
    kept = select_traces(read_trace_file(path), **getattr(options, "traces_filter", {}))
    traces = dict(zip(ids, kept.traces))
    calls = store.calls_frame()
    by_cell = calls.groupby("cell_id")["cache_hit"].agg(["sum", "count"])
    rows = []
    for coords, value in store.finished_outputs("app"):
        if coords.get("target") not in (None, "none") or coords.get("mitigation"):
            continue
        trace = traces.get(coords["item"])
        if trace is None:
            continue
        diff = _differing(trace.output, value.get("final_state"))
        hits, n = by_cell.loc[coords["cell_id"]] if coords["cell_id"] in by_cell.index \
            else (0, 0)
        rows.append({"unit": coords["item"], "model": coords["model"], "seed": coords["seed"],
                     "trace_id": trace.trace_id, "matches": not diff,
                     "differing_keys": " ".join(diff), "answered_from_trace": int(hits),
                     "paid_calls": int(n - hits)})
    return pd.DataFrame(rows, columns=_COLUMNS)


def write_trace_check(store, run_dir: Path, options) -> list[Path]:
    """The app audit's report part: `trace_check` as ``tables/trace_check.csv``."""
    frame = trace_check(store, options)
    if frame is None:
        return []
    path = Path(run_dir) / "tables" / "trace_check.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return [path]
