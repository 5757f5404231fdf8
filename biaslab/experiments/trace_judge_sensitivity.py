"""Judge sensitivity of a judging pass over a node's recorded answers.

``biaslab replay RUN --mode rescore --judge-node NODE --judges A B [C ...] --sensitivity``
judges NODE's recorded answers with the panel A, B, ... (`biaslab.evaluators.over_traces`,
``evals/<name>/``), then re-weighs that panel: the same configurations as a protocol's judge
sensitivity (`biaslab.evaluators.judge_sensitivity`: the recorded vote, each judge alone, leave
one out for three judges or more, strict majority, unanimity), computed from the votes the
pass recorded, so no model is called again. It is how a run without judge nodes of its own
(one written by ``biaslab import traces``, an audited app) gets judge sensitivity.

One judged answer is a slot; a judge's vote on it is the plurality of its ``--repeats``
answers (a tie among them is no vote). The headline rows, per configuration:

- ``judge_label_share``: per group (the cells' ``group``, which an imported run takes from
  the item key ``--group`` names; ``all`` for every answer) and label, the share of the
  answers with a verdict that carry the label (its band; no significance: a share is not a
  contrast);
- ``judge_label_gap``: per label and group, that group's share minus the reference group's
  (the first group in sorted order), with the two-proportion z test's p.

Written as a protocol's judge sensitivity is, into the run's ``tables/`` (or ``--out DIR``):
``judge_sensitivity.csv`` (the band and flips of each row), ``judge_sensitivity_configs.csv``
and ``judge_sensitivity_runs.csv``, and the run's ``report.html`` shows them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from biaslab.errors import UserError
from biaslab.evaluators.judge_sensitivity import RECORDED, Vote, configurations
from biaslab.evaluators.stats import two_proportion_ztest
from biaslab.evaluators.votes import majority_vote
from biaslab.experiments.judge_sensitivity import SensitivityResult, _write
from biaslab.experiments.replay import load_run_plan
from biaslab.traces.store import STORE_FILE, RunStore

__all__ = ["trace_judge_sensitivity", "SHARE_TABLE", "GAP_TABLE"]

SHARE_TABLE = "judge_label_share"
GAP_TABLE = "judge_label_gap"
ALL = "all"


def _slots(eval_dir: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """(members in order of first vote, one row per judged answer: its source cell, the
    recorded ensemble label and each member's vote)."""
    store = RunStore(eval_dir, readonly=True)
    try:
        outputs = list(store.iter_outputs(node=eval_dir.name))
    finally:
        store.close()
    members: list[str] = []
    slots = []
    for cell_id, _, _, verdict in outputs:
        by_judge: dict[str, list[str | None]] = {}
        for one in verdict.get("verdicts", []):
            by_judge.setdefault(one["judge"], []).append(one["label"])
            if one["judge"] not in members:
                members.append(one["judge"])
        votes = {}
        for judge, labels in by_judge.items():
            label = majority_vote(labels).label
            votes[judge] = Vote(label, label)
        slots.append({"source_cell": cell_id.rsplit("#", 2)[0], "recorded": verdict["label"],
                      "votes": votes})
    return members, slots


def _groups(run_dir: Path, cells: list[str]) -> list[str]:
    store = RunStore(run_dir, readonly=True)
    try:
        frame = store.cells()
    finally:
        store.close()
    if "group" not in frame.columns:
        return [ALL] * len(cells)
    group = dict(zip(frame["cell_id"], frame["group"]))
    return [ALL if pd.isna(group.get(c)) or group.get(c) in (None, "") else str(group[c])
            for c in cells]


def _rows(config: str, verdicts: list[Any], groups: list[str], labels: list[str]
          ) -> list[dict[str, Any]]:
    frame = pd.DataFrame({"group": groups, "label": verdicts})
    frame = frame[frame["label"].notna()]
    named = sorted(g for g in set(groups) if g != ALL)
    rows: list[dict[str, Any]] = []
    counts: dict[tuple[str, str], tuple[int, int]] = {}
    for group in [ALL, *named]:
        part = frame if group == ALL else frame[frame["group"] == group]
        n = len(part)
        for label in labels:
            k = int((part["label"] == label).sum())
            counts[(group, label)] = (k, n)
            # no CI here: a share is never 0-centred, so a CI would read as "significant"
            # in the bands; the gaps below carry the test
            rows.append({"table": SHARE_TABLE, "row": f"group={group}; label={label}",
                         "configuration": config, "value": k / n if n else math.nan,
                         "ci_low": math.nan, "ci_high": math.nan, "p": math.nan})
    for label in labels:
        k_ref, n_ref = counts[(named[0], label)] if named else (0, 0)
        for group in named[1:]:
            k, n = counts[(group, label)]
            value = p = math.nan
            if n and n_ref:
                test = two_proportion_ztest(k, n, k_ref, n_ref)
                value, p = test.diff, test.p_value
            rows.append({"table": GAP_TABLE,
                         "row": f"label={label}; group={group}; reference={named[0]}",
                         "configuration": config, "value": value, "ci_low": math.nan,
                         "ci_high": math.nan, "p": p})
    return rows


def trace_judge_sensitivity(run_dir: str | Path, *, eval_name: str = "judge",
                            labels: list[str], out_dir: str | Path | None = None,
                            paid_calls: int = 0) -> SensitivityResult:
    """Re-weigh the judges of ``RUN/evals/<eval_name>/`` (a finished judging pass over a
    node's recorded answers) under every configuration of its panel (see the module).

    Args:
        labels: the judge prompt's labels (the rows of the share and gap tables).
        out_dir: where ``tables/`` goes (the run is then only read); default the run.
        paid_calls: the judge calls the judging pass paid now (reported, not made here).
    """
    run_dir = Path(run_dir)
    eval_dir = run_dir / "evals" / eval_name
    if not (eval_dir / STORE_FILE).is_file():
        raise UserError(f"{eval_dir} holds no judging pass: judge a node first "
                        "(--judge-node NODE --judges A B)")
    members, slots = _slots(eval_dir)
    if len(members) < 2:
        raise UserError(f"judge sensitivity re-weighs a panel: {eval_dir} was judged by "
                        f"{len(members)} judge(s); give two or more with --judges")
    proto = load_run_plan(run_dir, check_keys=False).protocol
    groups = _groups(run_dir, [s["source_cell"] for s in slots])
    long: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = [{
        "configuration": "panel", "status": "", "paid_model_calls": paid_calls,
        "note": f"judges of evals/{eval_name} re-weighed: {', '.join(members)}; "
                f"{len(slots)} judged answers"}]
    for config in configurations(members):
        if config.kind == RECORDED:
            verdicts = [s["recorded"] for s in slots]
        else:
            verdicts = [config.answer(s["votes"]).verdict for s in slots]
        given = sum(v is not None for v in verdicts)
        runs.append({"configuration": config.name, "status": "computed",
                     "judge_answers": given, "withheld": len(verdicts) - given,
                     "paid_model_calls": 0, "note": ""})
        long += _rows(config.name, verdicts, groups, labels)
    target = Path(out_dir) if out_dir is not None else run_dir
    return _write(run_dir, target, members, long, runs, paid_calls, proto)
