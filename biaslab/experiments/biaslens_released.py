"""``biaslab biaslens-released``: the BiasLens authors' released answers scored several ways.

For each released model (and condition) under one or more copies of the origin repository's
``answers/`` and ``results/`` folders (a folder, or the ``.tar.xz`` the shared data packs four
models in: `biaslab.datasets.biaslens_release.release_root` unpacks it once into a cache),
write ``counts.csv`` (per model × variant × attribute × type: questions, biaslab's biased
count, its non-answers, the paper's literal Choice count, the authors' script recomputed
literally, their published count, and how many differing questions the named families
explain), ``families.csv`` (each family: answers read differently, questions whose verdict
they change, whether the readings show the script misreads it), ``release_notes.csv`` (role
names resolved, rows matching no question, files identical to another model's) and the
paper's Tables 3, 5 and 6 of the authors' answers under biaslab's rules, and print the
per-model totals and the notes. See docs/protocols/roleplay.md §3a.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from biaslab.datasets import biaslens_answers as ba
from biaslab.datasets.biaslens import ATTRIBUTES, load_questions
from biaslab.datasets.biaslens_release import duplicate_files, release_root
from biaslab.datasets.biaslens_readings import person_verdicts
from biaslab.datasets.frame_rows import frame_rows
from biaslab.errors import UserError
from biaslab.evaluators import roleplay_released as rr
from biaslab.evaluators.biaslens_script import script_questions

__all__ = ["score_release", "literal_script", "totals", "write_tables", "release_notes"]


def literal_script(root: Path, model: str, condition: str, bank_dir: str | Path | None = None) -> pd.DataFrame:
    """The authors' script's verdict per question row it reads (`script_questions`), with the
    ``qid`` of the bank question it is (None for a row that is none)."""
    bank = load_questions(bank_dir)
    frames = []
    folder = Path(root) / "answers" / condition / model
    for attribute in ATTRIBUTES:
        rows = script_questions(folder, ba.file_stem(attribute))
        if rows.empty:
            continue
        questions = bank[bank["attribute"] == attribute]
        text = "question_no_role" if condition == "without_role" else "question"
        qid_of = dict(zip(ba.occurrence_keys(
            (role, qtype, question.strip())
            for role, qtype, question in frame_rows(questions, "role", "type", text)),
            questions["qid"].tolist()))
        resolved = ba.resolve_roles(rows["role"], set(questions["role"]))
        rows = rows.assign(attribute=attribute, qid=[
            qid_of.get((r, *rest)) for r, rest in zip(resolved, frame_rows(
                rows, "type", "question", "occurrence"))])
        frames.append(rows)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["attribute", "type", "qid", "script_biased"])


def score_release(roots: str | Path | list, models: list[str] | None, conditions: list[str],
                  out: str | Path | None, bank_dir: str | Path | None = None
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Counts and families of every requested model and condition (all released ones when
    `models` is None) under each of `roots` (folders or release tarballs), matched to the
    shipped bank or `bank_dir`; written under `out` when given.

    Raises:
        UserError: no answers under any root, or an unreadable file.
    """
    roots = [release_root(r) for r in (roots if isinstance(roots, list) else [roots])]
    counts, families, questions, notes = [], [], [], []
    readings = person_verdicts()
    for condition in conditions:
        if condition not in ba.CONDITIONS:
            raise UserError(f"unknown condition '{condition}' (known: "
                            f"{', '.join(ba.CONDITIONS)})")
        for root in roots:
            for model in ba.released_models(root, condition):
                if models and model not in models:
                    continue
                note = ba.LoadNotes()
                answers = ba.load_released_answers(root, model, condition,
                                                   bank_dir=bank_dir, notes=note)
                scored = rr.score_released(answers)
                script = literal_script(root, model, condition, bank_dir)
                try:
                    authors = ba.load_authors_counts(root, model, condition)
                except UserError:
                    authors = None  # answers without the authors' statistics
                counts.append(rr.released_counts(scored, authors, script, readings))
                families.append(rr.family_counts(scored, script))
                questions.append(rr.question_frame(scored))
                notes.extend(_note_rows(model, condition, note))
    if not counts:
        raise UserError(f"no released answers under {', '.join(str(r) for r in roots)}")
    notes.extend({"kind": "identical file", "model": d.model, "condition": d.condition,
                  "detail": f"{d.name} is byte-identical to {d.copy_of}'s", "rows": None}
                 for d in duplicate_files(roots, tuple(conditions))
                 if not models or d.model in models)
    counts_frame, family_frame = pd.concat(counts), pd.concat(families)
    note_frame = pd.DataFrame(notes, columns=["kind", "model", "condition", "detail", "rows"])
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        counts_frame.to_csv(Path(out) / "counts.csv", index=False)
        family_frame.to_csv(Path(out) / "families.csv", index=False)
        note_frame.to_csv(Path(out) / "release_notes.csv", index=False)
        write_tables(pd.concat(questions, ignore_index=True), Path(out))
    counts_frame.attrs["notes"] = note_frame
    return counts_frame, family_frame


def _note_rows(model: str, condition: str, note: ba.LoadNotes) -> list[dict]:
    rows = [{"kind": "role name resolved", "model": model, "condition": condition,
             "detail": f"{name}: '{published}' read as the bank's '{bank}'", "rows": n}
            for (name, published, bank), n in sorted(note.role_variants.items())]
    rows += [{"kind": "row matching no question", "model": model, "condition": condition,
              "detail": f"{name}: {role}: {question[:60]}", "rows": 1}
             for name, role, question in note.unmatched]
    return rows


def release_notes(counts: pd.DataFrame) -> pd.DataFrame:
    """The notes `score_release` gathered (empty when none)."""
    return counts.attrs.get("notes", pd.DataFrame())


def write_tables(frame: pd.DataFrame, out: Path) -> list[Path]:
    """Tables 3, 5 and 6 of the released answers, as a biaslab run writes them (Table 3 and 6
    from the role answers; Table 5 when both conditions were read)."""
    from biaslab.evaluators import roleplay as rp

    role = frame[frame["variant"] == "role"]
    written = []
    tables = {"table3.csv": rp.table3(role) if len(role) else pd.DataFrame(),
              "table6.csv": rp.consistency_table(role) if len(role) else pd.DataFrame()}
    if set(frame["variant"]) >= {"role", "no_role"}:
        tables["table5.csv"] = rp.role_vs_no_role(frame)
    for name, table in tables.items():
        if table.empty:
            continue
        path = out / name
        table.to_csv(path, index=name == "table3.csv")
        written.append(path)
    return written


def totals(counts: pd.DataFrame) -> pd.DataFrame:
    """Per model × variant × type: the counts summed over attributes."""
    columns = [c for c in ("n", "biaslab", "nonanswer", "paper_literal", "script", "published",
                           "explained", "unexplained") if c in counts.columns]
    return counts.groupby(["model", "variant", "type"], sort=True)[columns].sum().reset_index()
