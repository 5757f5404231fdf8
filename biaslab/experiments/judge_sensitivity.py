"""Judge sensitivity of a finished run: its headline metrics under every judge configuration.

``biaslab replay RUN --mode rescore --sensitivity [--judges A B]`` recomputes the protocol's
headline rows (`Protocol.headline_tables`) once per configuration of its judge panel
(`biaslab.evaluators.judge_sensitivity`). The panel is the protocol's judge nodes
(`Protocol.judge_nodes`) as the run recorded them, plus one member per alternate model: a
counterfactual replay with the first judge node bound to that model, which pays only that
node's calls (``evals/judge_sensitivity/alternates/<model>/``; it is reused when run again).

Each configuration is a strict replay of the run whose judge nodes are bound to an answer
sheet (`biaslab.agents.providers.answer_sheet`) holding, for every judge request of the run,
the recorded answer that configuration keeps, or no vote. So the protocol's own graph and
report compute every table (``evals/judge_sensitivity/<configuration>/``), and no model is
called: every other call must come from the recorded traces, or the replay stops and the
configuration is reported as not computable.

Written into the run's ``tables/``, or under ``--out DIR`` (``DIR/tables/``,
``DIR/evals/judge_sensitivity/``), in which case the run is only read:

- ``judge_sensitivity.csv``: per headline row, the recorded value, the band (min–max over the
  configurations), sign and significance flips, and which configurations flip it;
- ``judge_sensitivity_configs.csv``: every configuration's value, CI and p for every row;
- ``judge_sensitivity_runs.csv``: what each configuration and alternate cost and met.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Hashable

import pandas as pd

from biaslab.agents.providers import parse_model
from biaslab.agents.providers.answer_sheet import ANSWER_SHEET, write_answer_sheet
from biaslab.errors import ReplayMiss, UserError
from biaslab.evaluators.judge_sensitivity import (Configuration, Vote, configurations,
                                                  sensitivity_bands)
from biaslab.experiments.plan import make_plan, model_aliases
from biaslab.experiments.replay import (check_not_running, counterfactual, load_run_plan,
                                        load_run_spec, open_run)
from biaslab.experiments.reports import write_html_report
from biaslab.experiments.runner import run_plan
from biaslab.experiments.spec import NodeSettings
from biaslab.graphs.headlines import HeadlineTable
from biaslab.traces.store import STORE_FILE, RunStore

__all__ = ["judge_sensitivity", "check_judge_sensitivity", "SensitivityResult", "EVAL_DIR", "BANDS_FILE",
           "CONFIGS_FILE", "RUNS_FILE"]

EVAL_DIR = "evals/judge_sensitivity"
BANDS_FILE = "tables/judge_sensitivity.csv"
CONFIGS_FILE = "tables/judge_sensitivity_configs.csv"
RUNS_FILE = "tables/judge_sensitivity_runs.csv"

Slot = tuple[str, str, int]
"""One judged text: (cell id, call item, rank of the call's sample among that node's calls on
the item). Roleplay's three judges give one call each per (cell, answer): the same slot."""


@dataclass
class SensitivityResult:
    members: list[str]
    tables: list[Path] = field(default_factory=list)
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    bands: pd.DataFrame = field(default_factory=pd.DataFrame)
    paid_calls: int = 0
    """Model calls of the alternates (the configurations make none)."""


def _verdict(parsed: Any) -> Hashable | None:
    """A parsed answer as a comparable verdict: a labelled verdict's label, else the value."""
    if isinstance(parsed, str):
        try:  # a JSON object recorded as text
            parsed = json.loads(parsed) if parsed[:1] in "{[" else parsed
        except ValueError:
            pass
    if isinstance(parsed, dict):  # a label with its reason: the label; else the whole value
        return parsed["label"] if "label" in parsed else json.dumps(parsed, sort_keys=True)
    if isinstance(parsed, list):
        return tuple(parsed)
    if isinstance(parsed, float) and parsed != parsed:
        return None
    return parsed


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value) or value == ""


def _json(text: Any) -> Any:
    return None if text is None else json.loads(text)


def _judge_calls(store: RunStore, nodes: tuple[str, ...], requests: bool = True
                 ) -> pd.DataFrame:
    """The finished cells' judge calls, one row per (cell, node, item, sample): the first
    attempt's request (with `requests`: its messages and seed) and the last attempt's
    answer, its slot and its vote. Read flat from the store (`RunStore.node_calls`), so a
    run of a million judge calls is read in seconds."""
    fields = {"item": "$.item", "sample": "$.sample", "attempt": "$.attempt", "raw": "$.raw",
              "parsed": "$.parsed"}
    if requests:
        fields.update(messages="$.messages", seed="$.params.seed")
    calls = store.node_calls(nodes, fields)
    if calls.empty:
        return pd.DataFrame(columns=["cell_id", "node", "item", "sample", "messages", "seed",
                                     "slot", "vote"])
    for column in ("item", "sample", "attempt", "raw", "parsed"):
        calls[column] = [_json(v) for v in calls[column]]
    keys = ["cell_id", "node", "item", "sample"]
    calls = calls.sort_values([*keys, "attempt"], kind="stable")
    first = calls.drop_duplicates(keys, keep="first").reset_index(drop=True)
    last = calls.drop_duplicates(keys, keep="last").reset_index(drop=True)
    votes = []
    for error, parse_error, raw, parsed in zip(last["error"], last["parse_error"], last["raw"],
                                               last["parsed"]):
        verdict = _verdict(parsed) if _blank(error) and _blank(parse_error) else None
        votes.append(Vote(raw if verdict is not None else None, verdict))
    frame = first[keys].assign(sample=first["sample"].astype(int), vote=votes)
    if requests:
        frame["messages"] = [_json(m) for m in first["messages"]]
        frame["seed"] = [_json(v) for v in first["seed"]]
    frame["rank"] = frame.groupby(["cell_id", "node", "item"])["sample"].rank(method="first")
    frame["slot"] = list(zip(frame["cell_id"], frame["item"], frame["rank"].astype(int) - 1))
    return frame


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_") or "model"


def _alternate(run_dir: Path, target: Path, node: str, model: str, progress: bool,
               concurrency: int | None) -> tuple[Path, int]:
    """The counterfactual with `node` bound to `model` (resumed, so reused, when present),
    under `target`."""
    out = target / EVAL_DIR / "alternates" / _slug(model)
    done = counterfactual(run_dir, out, node=node, model=model,
                          resume=(out / STORE_FILE).is_file(), progress=progress,
                          concurrency=concurrency)
    if done.run.interrupted or done.cells_failed:
        raise UserError(f"--judges {model}: the alternate judge's replay in {out} did not "
                        f"finish ({done.cells_failed} cells failed); run the same command "
                        "again to continue it")
    return out, done.counters.model_calls


def _sheet_entries(requests: pd.DataFrame, votes: dict[Slot, dict[str, Vote]],
                   config: Configuration) -> tuple[list, int, int]:
    """(sheet entries, withheld answers, conflicting requests) of one configuration."""
    entries, seen, withheld, conflicts = [], {}, 0, 0
    for node, slot, messages, seed in zip(requests["node"], requests["slot"],
                                          requests["messages"], requests["seed"]):
        chosen = config.answer(votes[slot])
        raw = votes[slot][node].raw if chosen is None else chosen.raw
        key = (json.dumps(messages, sort_keys=True), seed)
        if key in seen:  # the same request in two cells: one answer serves both
            conflicts += seen[key] != raw
            continue
        seen[key] = raw
        withheld += raw is None
        entries.append((messages, seed, raw))
    return entries, withheld, conflicts


def _headline_rows(run_dir: Path, tables: tuple[HeadlineTable, ...], config: str
                   ) -> list[dict[str, Any]]:
    rows = []
    for table in tables:
        path = run_dir / table.path
        if not path.is_file():
            continue
        try:
            frame = pd.read_csv(path)
        except pd.errors.EmptyDataError:
            continue
        if table.value not in frame:
            continue
        keys = [k for k in table.keys if k in frame]
        for record in frame.to_dict("records"):
            row = {"table": table.name,
                   "row": "; ".join(f"{k}={'' if pd.isna(record[k]) else record[k]}"
                                    for k in keys),
                   "configuration": config, "value": record[table.value]}
            if table.ci and all(c in frame for c in table.ci):
                row["ci_low"], row["ci_high"] = record[table.ci[0]], record[table.ci[1]]
            if table.p and table.p in frame:
                row["p"] = record[table.p]
            rows.append(row)
    return rows


def _configuration_run(run_dir: Path, out: Path, sheet: Path, judge_nodes: list[str],
                       replay_from: list[RunStore], done: set[str]) -> tuple[int, int]:
    """Replay the run strictly with its judge nodes on the answer sheet, then write the headline
    tables the bands are read from (not the whole report: figures and pages for nine
    configurations were most of the command's time); (sheet answers, failed cells). Raises
    `ReplayMiss` when a configuration needs a call no trace holds."""
    spec = load_run_spec(run_dir)
    nodes = dict(spec.nodes)
    model = f"scripted:{ANSWER_SHEET}@{sheet.resolve()}"
    for node in judge_nodes:
        nodes[node] = nodes.get(node, NodeSettings()).model_copy(update={"model": model})
    plan = make_plan(spec.model_copy(update={"nodes": nodes}), check_keys=False)
    result = asyncio.run(run_plan(plan, out, mode="strict", replay_from=replay_from,
                                  use_shared_cache=False, progress=False,
                                  only=lambda cell: cell.id in done))
    store = RunStore(out, readonly=True)
    try:  # the headline tables only: `biaslab report` on `out` writes the whole report
        _headline_reports(plan, store, out)
    finally:
        store.close()
    return result.counters.model_calls, result.cells_failed


class _CannotRejudge(Exception):
    """The protocol cannot re-derive its outputs under other verdicts (`Protocol.rejudge`)."""


def _rejudged_run(run_dir: Path, out: Path, plan, calls: pd.DataFrame,
                  votes: dict[Slot, dict[str, Vote]], config: Configuration
                  ) -> tuple[int, int]:
    """A configuration of a run that cannot be replayed (an imported one): its finished
    cells and outputs copied without their calls, each cell with judge calls given the
    outputs the protocol re-derives for the configuration's verdicts (`Protocol.rejudge`),
    then the protocol's report. Returns (judge answers given, withheld)."""
    proto = plan.protocol
    slot_of = {key: slot for key, slot in zip(
        zip(calls["cell_id"], calls["node"], calls["item"], calls["sample"]), calls["slot"])}
    counts = {"answered": 0, "withheld": 0}

    def verdict_for(cell_id: str):
        def verdict(node: str, item: str, sample: int):
            slot = slot_of.get((cell_id, node, item, sample))
            if slot is None:
                return None
            chosen = config.answer(votes[slot])
            vote = votes[slot][node] if chosen is None else chosen
            counts["answered" if vote.verdict is not None else "withheld"] += 1
            return vote.verdict
        return verdict

    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / "spec.toml", out / "spec.toml")
    store, source = RunStore(out), RunStore(run_dir, readonly=True)
    try:
        store.copy_outputs_from(run_dir)
        cells = store.cells()
        judged = cells[cells["cell_id"].isin(set(calls["cell_id"]))]
        for cell_id, variant, item in zip(judged["cell_id"], judged["variant"],
                                          judged["item"]):
            outputs = {node: value for _, _, node, value in source.iter_outputs(cell_id)}
            new = proto.rejudge(variant, item, outputs, verdict_for(cell_id), plan.options)
            if new is None:
                raise _CannotRejudge(f"protocol '{proto.name}' cannot re-derive its outputs "
                                     "under other verdicts (Protocol.rejudge), and the run "
                                     "cannot be replayed")
            store.replace_outputs(cell_id, new)
        store.commit()
        _headline_reports(plan, store, out)
    finally:
        store.close()
        source.close()
    return counts["answered"], counts["withheld"]


def _headline_reports(plan, store: RunStore, out: Path) -> None:
    """What a configuration needs of the report: the protocol's tables its headline
    rows are read from (`protocol_headline_tables`) and the generic exposed-vs-clean table (a
    configuration of a paper-size run is then a minute or two, not the whole report's)."""
    from biaslab.experiments.reports.protocols import protocol_headline_tables
    from biaslab.experiments.reports.generic import exposed_vs_clean
    from biaslab.experiments.reports.units import unit_frame, unit_of

    proto, options = plan.protocol, plan.options
    protocol_headline_tables(proto, store, out, options)
    if any(t.path == "tables/exposed_vs_clean.csv" for t in proto.headline_tables):
        (out / "tables").mkdir(parents=True, exist_ok=True)
        exposed_vs_clean(unit_frame(store, proto, options), unit_of(proto)).to_csv(
            out / "tables" / "exposed_vs_clean.csv", index=False, float_format="%.6g")


def check_judge_sensitivity(run_dir: str | Path, judges: list[str] | None = None) -> None:
    """The refusals of `judge_sensitivity` (no judge nodes, no judge calls, an alternate
    named twice), before anything is written: ``replay --mode rescore --sensitivity`` checks
    them before it rewrites the run's tables."""
    _panel(Path(run_dir), judges)


def _panel(run_dir: Path, judges: list[str] | None):
    source = open_run(run_dir)
    try:
        check_not_running(run_dir, source)
        plan = load_run_plan(run_dir, check_keys=False)
        proto = plan.protocol
        if not proto.judge_nodes:
            raise UserError(f"protocol '{proto.name}' declares no judge nodes "
                            "(Protocol.judge_nodes): judge sensitivity has no panel to re-weigh; "
                            "judge a node's recorded answers with a panel instead: "
                            "--judge-node NODE --judges A B --sensitivity")
        imported = source.meta().get("imported_format")
        if imported and judges:
            raise UserError(f"--judges: {run_dir} was imported ({imported}) and has no model "
                            "to replay for an alternate judge; its recorded judges are "
                            "re-weighed without --judges")
        _check_alternates(plan, proto, judges or [])
        calls = _judge_calls(source, tuple(proto.judge_nodes), requests=not imported)
        present = [n for n in proto.judge_nodes if n in set(calls["node"])]
        if not present:
            raise UserError(f"{run_dir} holds no calls of the judge nodes "
                            f"({', '.join(proto.judge_nodes)}) in finished cells")
        cells = source.cells()
        done = set(cells.loc[cells["status"] == "done", "cell_id"])
        kept = sorted({n.name for nodes in plan.llm_nodes.values() for n in nodes}
                      - set(present))
    finally:
        source.close()
    if len(set(judges or [])) != len(judges or []):
        raise UserError("--judges: each alternate model once")
    return plan, proto, calls, present, done, kept, bool(imported)


def _check_alternates(plan, proto, judges: list[str]) -> None:
    """Each ``--judges`` model is one this run can call (a known provider, a registered
    scripted model, its key present) and no judge node's name, before anything is written."""
    aliases = model_aliases(plan.spec)
    for model in judges:
        if model in proto.judge_nodes:
            raise UserError(f"--judges: '{model}' is the name of a judge node; give a model")
        try:
            parse_model(model, aliases).check_ready()
        except UserError as exc:
            raise UserError(f"--judges {model}: {exc}") from None


def judge_sensitivity(run_dir: str | Path, *, judges: list[str] | None = None,
                      progress: bool = False, concurrency: int | None = None,
                      out_dir: str | Path | None = None,
                      rederive: bool | None = None) -> SensitivityResult:
    """Compute and write the judge sensitivity tables of a finished run (see the module).

    Args:
        out_dir: where the tables, the configurations' replays and the alternates go; the run
            itself is then only read. Without it they go into the run's own folder.
        judges: alternate judge models (spec strings or the run's aliases); each pays its
            judge calls once.
        rederive: compute each configuration with `Protocol.rejudge` instead of a replay
            (default: only for an imported run, which has no model to replay; the tests
            compare both ways on a run that has one).
    Returns the panel's members, the tables written, what each configuration met, and the
    model calls the alternates paid.
    """
    run_dir = Path(run_dir)
    plan, proto, calls, present, done, kept, imported = _panel(run_dir, judges)
    target = Path(out_dir) if out_dir is not None else run_dir
    base = target / EVAL_DIR
    runs: list[dict[str, Any]] = []
    votes: dict[Slot, dict[str, Vote]] = {}
    for node, slot, vote in zip(calls["node"], calls["slot"], calls["vote"]):
        votes.setdefault(slot, {})[node] = vote
    members = list(present)
    runs.append({"configuration": "panel", "status": "", "paid_model_calls": 0,
                 "note": f"judge nodes re-weighed: {', '.join(present)}; LLM nodes kept as "
                         f"recorded: {', '.join(kept) or 'none'}"})
    alternate_dirs, paid = [], 0
    for model in judges or []:
        if model in members:
            raise UserError(f"--judges: '{model}' is the name of a judge node; give a model")
        out, cost = _alternate(run_dir, target, present[0], model, progress, concurrency)
        alternate_dirs.append(out)
        paid += cost
        runs.append({"configuration": f"alternate:{model}", "status": "computed",
                     "judge_answers": None, "withheld": None, "paid_model_calls": cost,
                     "note": f"counterfactual with {present[0]} bound to {model} in "
                             f"{out.relative_to(target)}"})
        store = RunStore(out, readonly=True)
        try:
            theirs = _judge_calls(store, (present[0],))
        finally:
            store.close()
        for slot, vote in zip(theirs["slot"], theirs["vote"]):
            if slot in votes:
                votes[slot][model] = vote
        members.append(model)
    for slot_votes in votes.values():  # a member without a call on a slot has no vote there
        for member in members:
            slot_votes.setdefault(member, Vote(None, None))
    long: list[dict[str, Any]] = []
    stores = [RunStore(run_dir, readonly=True)] + [RunStore(d, readonly=True)
                                                   for d in alternate_dirs]
    try:
        for config in configurations(members):
            out = base / _slug(config.name.replace(":", "-"))
            if out.exists():
                shutil.rmtree(out)  # a configuration is free: always computed afresh
            if imported if rederive is None else rederive:  # the protocol re-derives them
                row = {"configuration": config.name, "paid_model_calls": 0}
                try:
                    answered, withheld = _rejudged_run(run_dir, out, plan, calls, votes,
                                                       config)
                except _CannotRejudge as exc:
                    shutil.rmtree(out, ignore_errors=True)
                    runs.append({**row, "status": "not computable", "note": str(exc)})
                    continue
                runs.append({**row, "judge_answers": answered, "withheld": withheld,
                             "status": "computed", "note": "re-derived from the recorded "
                             "outputs (Protocol.rejudge), no replay"})
                long += _headline_rows(out, proto.headline_tables, config.name)
                continue
            entries, withheld, conflicts = _sheet_entries(calls, votes, config)
            sheet = write_answer_sheet(base / "sheets" / f"{out.name}.json", entries)
            row = {"configuration": config.name, "judge_answers": None, "withheld": withheld,
                   "paid_model_calls": 0}
            try:
                answered, failed = _configuration_run(run_dir, out, sheet, present, stores,
                                                      done)
            except ReplayMiss as exc:
                shutil.rmtree(out, ignore_errors=True)
                runs.append({**row, "status": "not computable",
                             "note": f"needs calls that no recorded trace holds ({exc})"})
                continue
            notes = [f"{failed} cells failed"] if failed else []
            if conflicts:
                notes.append(f"{conflicts} identical requests in different cells share one "
                             "answer")
            runs.append({**row, "judge_answers": answered,
                         "status": "partial" if failed else "computed",
                         "note": "; ".join(notes)})
            long += _headline_rows(out, proto.headline_tables, config.name)
    finally:
        for store in stores:
            store.close()
    return _write(run_dir, target, members, long, runs, paid, proto)


def _write(run_dir: Path, target: Path, members: list[str], long: list[dict[str, Any]],
           runs: list[dict[str, Any]], paid: int, proto) -> SensitivityResult:
    tables_dir = target / "tables"
    tables_dir.mkdir(parents=True, exist_ok=True)
    configs = pd.DataFrame(long, columns=["table", "row", "configuration", "value", "ci_low",
                                          "ci_high", "p"])
    bands = sensitivity_bands(configs) if len(configs) else pd.DataFrame(
        columns=["table", "row", "recorded", "band_low", "band_high", "n_configurations",
                 "sign_flips", "significance_flips", "flipped_by"])
    bands.insert(2, "panel", " ".join(members))
    runs_frame = pd.DataFrame(runs, columns=["configuration", "status", "judge_answers",
                                             "withheld", "paid_model_calls", "note"])
    runs_frame = runs_frame.astype({"judge_answers": "Int64", "withheld": "Int64"})
    written = []
    for name, frame in ((BANDS_FILE, bands), (CONFIGS_FILE, configs), (RUNS_FILE, runs_frame)):
        frame.to_csv(target / name, index=False)
        written.append(target / name)
    store = RunStore(run_dir, readonly=True)
    try:
        written.append(write_html_report(store, target, proto.report_sections()))
    finally:
        store.close()
    return SensitivityResult(members, written, runs_frame, bands, paid)
