"""``biaslab import biaslens ROOT [ROOT ...] --out RUN``: the BiasLens authors' released answers
as a ``roleplay`` run.

Every released model (``answers/{role,without_role}/<model>/``, under a folder or a release
tarball: `biaslab.datasets.biaslens_release.release_root`) becomes one model of a run of the
``roleplay`` protocol (`biaslab.graphs.roleplay`), its two conditions the ``role`` and
``no_role`` variants, its cells the protocol's own chunks of the question bank. Each cell holds
what a roleplay run records, as the graph's nodes would have written it:

- the ``target`` call records: the authors' answers (file ``_0{k+1}`` is sample k), parsed by
  the protocol's own answer parsers (`biaslab.graphs.roleplay.answer_format`);
- for Why questions, three ``why_judge_1..3`` call records per parsed answer: the authors'
  three judge runs (columns ``LLM 1..3``; their judge asked "is this answer fair?", so ``Yes``
  is a ``fair`` vote and ``No`` a ``biased`` one; anything else is an unparsed vote);
- the ``answer``, ``why_judges`` and ``oracles`` outputs: the oracles' rows are computed by the
  protocol's own `score`, so ``report``, ``view``, ``replay --mode rescore`` and judge
  sensitivity (``--sensitivity``: each of the authors' judges alone, leave one out, majority,
  unanimity) read it as a run of theirs.

Every call record is marked answered from the release (``cache_hit``, no tokens). Its messages
are the question as the release holds it (and, for a judge, the question and the judged
answer): the authors' system and format texts are not in the release (see the shared data's
PROMPT_NOTES.md), so a strict or counterfactual replay, which would ask a model again, is
refused with one line. An answer the release lacks has no call record: it is an unscored
vote, counted in the import's summary.

The run is written in a hidden directory beside `out` and moved into place when whole.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from biaslab.agents.ask import call_seed
from biaslab.agents.parsers import ParseError
from biaslab.datasets import biaslens_answers as ba
from biaslab.datasets.biaslens_release import duplicate_files, release_root
from biaslab.errors import UserError
from biaslab.experiments.out_paths import built_beside, check_out
from biaslab.experiments.plan import make_plan
from biaslab.experiments.runner import write_resolved_spec
from biaslab.experiments.spec import spec_from_dict
from biaslab.graphs.registry import protocol_origin
from biaslab.graphs.roleplay import (JUDGES, RELEASED_MODEL, answer_format, chunks_for,
                                     judge_item, score)
from biaslab.traces.cache import cache_key
from biaslab.traces.records import SCHEMA_VERSION, CallRecord
from biaslab.traces.store import RunStore

__all__ = ["import_biaslens", "import_summary", "BiaslensImport", "IMPORTED_FORMAT",
           "JUDGE_MODEL", "judge_vote"]

IMPORTED_FORMAT = "biaslens-release"
"""The store's ``imported_format`` of a run written here."""
JUDGE_MODEL = "authors_why_judge"
"""The alias the run's Why-judge nodes are bound to: the authors' judge (GPT-4o-mini, three
runs), whose verdicts the release holds."""
ANSWER_PROMPT = "biaslens-release/answer"
JUDGE_PROMPT = "biaslens-release/why_judge"
_SOURCE = "the BiasLens release (the authors' own prompt text is not released)"
_BATCH = 100
"""Cells written per transaction."""


@dataclass
class BiaslensImport:
    """What an import read and wrote."""

    out: Path
    models: list[str]
    variants: list[str]
    cells: int = 0
    answers: int = 0
    judge_calls: int = 0
    missing_answers: int = 0
    unparsed_votes: int = 0
    notes: list[str] = field(default_factory=list)


def judge_vote(raw: str) -> str:
    """One published judge verdict as a roleplay judge label: the authors' judge answered "is
    this answer fair?", so ``Yes`` (any case, a trailing full stop allowed) is ``fair`` and
    ``No`` is ``biased``.

    Raises:
        ParseError: anything else (an empty cell).
    """
    word = str(raw).strip().rstrip(".").strip().lower()
    if word == "yes":
        return "fair"
    if word == "no":
        return "biased"
    raise ParseError(f"the authors' judge answered neither Yes nor No ({str(raw)[:40]!r})")


def _releases(roots: Iterable[str | Path], models: list[str] | None,
              conditions: list[str]) -> list[tuple[Path, str, str]]:
    """(root, model, condition) of every released answer folder asked for."""
    found, roots = [], [release_root(r) for r in roots]
    for condition in conditions:
        if condition not in ba.CONDITIONS:
            raise UserError(f"unknown condition '{condition}' (known: "
                            f"{', '.join(ba.CONDITIONS)})")
        for root in roots:
            found += [(root, m, condition) for m in ba.released_models(root, condition)]
    if not found:
        where = ", ".join(str(r) for r in roots)
        raise UserError(f"no released answers (answers/<condition>/<model>/) under {where}: "
                        "give the folder holding a BiasLens release's answers/ and results/, "
                        "or its .tar.xz")
    named = {m for _, m, _ in found}
    missing = [m for m in models or [] if m not in named]
    if missing:
        raise UserError(f"--model {missing[0]}: no such released model (released: "
                        f"{', '.join(sorted(named))})")
    return [f for f in found if not models or f[1] in models]


def import_biaslens(roots: list[str | Path], out: str | Path, *,
                    models: list[str] | None = None,
                    conditions: list[str] | None = None, bank_dir: str | Path | None = None,
                    chunk_size: int = 50, progress: bool = False) -> BiaslensImport:
    """Write the released answers under `roots` as a roleplay run in `out` (see the module).

    Args:
        models: released model folders (default: all of them).
        conditions: ``role`` and/or ``without_role`` (default: both).
        bank_dir: the question bank the answers belong to (default: the shipped one).
        chunk_size: questions per cell.

    Raises:
        UserError: `out` exists or cannot be a directory; a root that is no release; a model
            that is not released; an unreadable answers file.
    """
    out = Path(out)
    check_out(out)
    if out.exists():
        raise UserError(f"{out} already exists; choose another --out")
    conditions = list(conditions or ba.CONDITIONS)
    found = _releases(roots, models, conditions)
    names = list(dict.fromkeys(m for _, m, _ in found))
    variants = [ba.CONDITIONS[c] for c in ba.CONDITIONS if c in {c for *_, c in found}]
    bank = str(Path(bank_dir).resolve()) if bank_dir is not None else None
    aliases = {m: {"provider": "scripted", "model": f"{RELEASED_MODEL}@{m}"} for m in names}
    aliases[JUDGE_MODEL] = {"provider": "scripted", "model": f"{RELEASED_MODEL}@why_judge"}
    spec = spec_from_dict({
        "name": "import-biaslens", "protocol": "roleplay", "models": names,
        "model_aliases": aliases, "run": {"seeds": [0]}, "conditions": {"targets": []},
        "nodes": {j: {"model": JUDGE_MODEL} for j in JUDGES},
        "options": {"bank_dir": bank, "conditions": variants, "classify_bias_types": False,
                    "chunk_size": chunk_size, "repeats": 3}}, where="biaslab import biaslens")
    plan = make_plan(spec)
    result = BiaslensImport(out, names, variants)
    with built_beside(out) as tmp:
        _write(plan, found, tmp, bank, result, progress)
    return result


def _answers(root: Path, model: str, condition: str, bank: str | None,
             result: BiaslensImport) -> dict[tuple[str, int], tuple[str, tuple]]:
    """(qid, sample) → (answer, judge verdicts) of one released model and condition."""
    notes = ba.LoadNotes()
    frame = ba.load_released_answers(root, model, condition, bank_dir=bank, notes=notes)
    for (name, published, resolved), n in sorted(notes.role_variants.items()):
        result.notes.append(f"{model} {condition}: {name}: role '{published}' read as the "
                            f"bank's '{resolved}' ({n} rows)")
    for name, role, question in notes.unmatched:
        result.notes.append(f"{model} {condition}: {name}: a row matching no bank question "
                            f"({role}: {question[:60]!r}) was left out")
    return {(q, int(s)): (a, j) for q, s, a, j in zip(frame["qid"], frame["sample"],
                                                      frame["answer"], frame["judges"])}


def _write(plan, found: list[tuple[Path, str, str]], run_dir: Path, bank: str | None,
           result: BiaslensImport, progress: bool) -> None:
    store = RunStore(run_dir)
    try:
        roots = list(dict.fromkeys(r for r, _, _ in found))
        for d in duplicate_files(roots, tuple(dict.fromkeys(c for *_, c in found))):
            if d.model in result.models:
                result.notes.append(f"{d.model} {d.condition}: {d.name} is byte-identical to "
                                    f"{d.copy_of}'s (as published)")
        store.set_meta(spec_name=plan.spec.name, protocol=plan.protocol.name,
                       protocol_origin=protocol_origin(plan.protocol),
                       scale=plan.spec.scale_applied, created=time.time(),
                       fingerprint=plan.fingerprint(), schema_version=SCHEMA_VERSION,
                       imported_from=" ".join(str(r) for r in roots),
                       imported_format=IMPORTED_FORMAT)
        write_resolved_spec(plan, run_dir)
        cells = list(plan.cells())
        store.start_cells([(c.id, c.ord, c.coords) for c in cells])
        chunks = chunks_for(plan.options)
        by_release = {(m, ba.CONDITIONS[c]): (r, c) for r, m, c in found}
        for (model, variant), (root, condition) in by_release.items():
            started = time.monotonic()
            answers = _answers(root, model, condition, bank, result)
            mine = [c for c in cells if c.model.label == model and c.variant == variant]
            for k in range(0, len(mine), _BATCH):
                store.finish_cells(_cell(plan, cell, chunks[cell.item], answers, result)
                                   for cell in mine[k:k + _BATCH])
            if progress:
                print(f"imported {model} {condition}: {len(mine)} cells, {len(answers)} "
                      f"answers ({time.monotonic() - started:.0f} s)", flush=True)
        # cells of a model × variant the release lacks (a model released in one condition)
        done = {(m, ba.CONDITIONS[c]) for _, m, c in found}
        empty = [c for c in cells if (c.model.label, c.variant) not in done]
        if empty:
            store.finish_cells((c.id, [], [], "the release holds no answers for this model "
                                "in this condition") for c in empty)
        store.set_meta(imported_notes=result.notes, imported_missing_answers=
                       result.missing_answers, imported_unparsed_votes=result.unparsed_votes)
    finally:
        store.close()


def _record(cell, node: str, item: str, sample: int, messages: list[dict[str, str]],
            model: dict[str, str], prompt: str, raw: str, parsed: Any,
            parse_error: str | None) -> CallRecord:
    seed = call_seed(cell.seed, node, sample)
    params = {"seed": seed}
    return CallRecord(cell_id=cell.id, node=node, item=item, sample=sample, seed=seed,
                      exposure_id=cell.condition.id, prompt_id=prompt, prompt_source=_SOURCE,
                      cache_key=cache_key(model, messages, params, sample), messages=messages,
                      model=model, params=params, raw=raw, parsed=parsed,
                      parse_error=parse_error, cache_hit=True)


def _cell(plan, cell, questions, answers, result: BiaslensImport):
    """(cell id, call records, node outputs, error) of one cell, as the graph writes them."""
    target = {"provider": "scripted", "model": f"{RELEASED_MODEL}@{cell.model.label}"}
    judge = {"provider": "scripted", "model": f"{RELEASED_MODEL}@why_judge"}
    records, responses, votes = [], [], {}
    repeats = plan.options.repeats
    for question in questions:
        parser = answer_format(question, plan.options)[0]
        asked = question["question"] if cell.variant == "role" else question["question_no_role"]
        raws, labels, errors = [], [], []
        for k in range(repeats):
            found = answers.get((question["qid"], k))
            if found is None:
                result.missing_answers += 1
                raws.append(None)
                labels.append(None)
                errors.append("no answer in the release")
                continue
            raw, verdicts = found
            try:
                value, error = parser(raw), None
            except ParseError as exc:
                value, error = None, str(exc)
            records.append(_record(cell, "target", question["qid"], k,
                                   [{"role": "user", "content": asked}], target,
                                   ANSWER_PROMPT, raw, value, error))
            result.answers += 1
            raws.append(raw)
            labels.append(value)
            errors.append(error)
            if question["type"] != "why":
                continue
            row = votes.setdefault(question["qid"], [[None] * len(JUDGES)
                                                     for _ in range(repeats)])
            if error is not None:  # an unparsable answer is not judged (as in the graph)
                continue
            shown = [{"role": "user", "content": f"Question: {asked}\nAnswer: {raw}"}]
            for j, node in enumerate(JUDGES):
                published = verdicts[j] if j < len(verdicts) else ""
                try:
                    vote, why = judge_vote(published), None
                except ParseError as exc:
                    vote, why = None, str(exc)
                    result.unparsed_votes += 1
                records.append(_record(cell, node, judge_item(question["qid"], k),
                                       k * len(JUDGES) + j, shown, judge, JUDGE_PROMPT,
                                       published, vote, why))
                result.judge_calls += 1
                row[k][j] = vote
        if question["type"] == "why":
            votes.setdefault(question["qid"], [[None] * len(JUDGES) for _ in range(repeats)])
        responses.append({"qid": question["qid"], "raw": raws, "labels": labels,
                          "parse_errors": errors})
    state = {"questions": [dict(q) for q in questions], "responses": responses,
             "judge_votes": votes}
    outputs = [("answer", {"responses": responses})]
    if votes:
        outputs.append(("why_judges", {"judge_votes": votes}))
    outputs.append(("oracles", score(state)))
    result.cells += 1
    return cell.id, records, outputs, None


def import_summary(result: BiaslensImport) -> list[str]:
    """The lines ``biaslab import biaslens`` prints."""
    lines = [f"imported {len(result.models)} released models ({', '.join(result.models)}), "
             f"variants {', '.join(result.variants)}: {result.cells} cells, {result.answers:,} "
             f"answers, {result.judge_calls:,} Why-judge verdicts into {result.out}"]
    if result.missing_answers:
        lines.append(f"note: {result.missing_answers:,} answers the release lacks (unscored "
                     "votes)")
    if result.unparsed_votes:
        lines.append(f"note: {result.unparsed_votes:,} judge verdicts neither Yes nor No "
                     "(unparsed votes)")
    lines += [f"note: {n}" for n in result.notes]
    return lines

