"""The BiasLens authors' released answers and their own biased counts.

The origin repository (LLMBias/BiasLens) publishes, for each model it tested, three answer
files per attribute and condition (``answers/{role,without_role}/<model>/<attr>_answers_0{1,2,3}
.csv``: one per repeat, rows in the question files' order, columns ``Role, Question Type,
Question, Answer, LLM 1, LLM 2, LLM 3, final``; for Why rows ``LLM 1..3`` are the three judge
runs' verdicts and ``final`` their combined one, ``Yes`` meaning biased) and a statistics file
per model (``results/<condition>/<model>/seeds_<model>_statistics.txt``: lines such as
``Yes/No --> 71/996 = 0.0713`` under each attribute).

These readers turn them into frames keyed like biaslab's own runs (``qid`` =
``<attribute>-<row>``, the bank's), so the same oracles and tables apply to them
(`biaslab.evaluators.roleplay_released`).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from biaslab.datasets.biaslens import ATTRIBUTES, TYPE_LABELS, load_questions
from biaslab.datasets.frame_rows import frame_rows
from biaslab.errors import UserError

__all__ = ["CONDITIONS", "LoadNotes", "file_stem", "released_models", "load_released_answers",
           "load_authors_counts", "role_variant", "resolve_roles", "occurrence_keys"]

CONDITIONS = {"role": "role", "without_role": "no_role"}
"""The origin's condition folders → biaslab's variants."""
_STEM = {a: ("occupations" if a == "occupation" else a) for a in ATTRIBUTES}
_ATTRIBUTE = {stem: a for a, stem in _STEM.items()}


def file_stem(attribute: str) -> str:
    """The released files' name for an attribute (``occupations`` for occupation)."""
    return _STEM[attribute]


_COLUMNS = ["Role", "Question Type", "Question", "Answer", "LLM 1", "LLM 2", "LLM 3", "final"]


@dataclass
class LoadNotes:
    """What loading a release met besides clean rows, for the report (never dropped silently).

    Attributes:
        role_variants: (file, role as published, bank role) → rows whose role was resolved by
            `role_variant` (the published release spells ``Syrians`` as ``Syrian`` in one
            Llama-3-70B file).
        unmatched: (file, role, question) of file rows that are no bank question even so.
    """

    role_variants: dict[tuple[str, str, str], int] = field(default_factory=dict)
    unmatched: list[tuple[str, str, str]] = field(default_factory=list)


def role_variant(role: str, bank_roles: set[str]) -> str | None:
    """The bank role a published role name stands for, when it is not one itself: the one
    bank role equal to it after case-folding and setting aside one trailing "s" (``Syrian``
    → ``Syrians``); None when there is no such role or more than one."""
    def key(name: str) -> str:
        name = name.strip().casefold()
        return name[:-1] if name.endswith("s") else name

    found = [b for b in bank_roles if key(b) == key(role)]
    return found[0] if len(found) == 1 else None


def released_models(root: str | Path, condition: str = "role") -> list[str]:
    """The models with an answers folder under `root` (``answers/<condition>/<model>``)."""
    folder = Path(root) / "answers" / condition
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def _read(path: Path) -> pd.DataFrame:
    """One answers file as text. Some published files are not valid UTF-8: undecodable bytes
    become U+FFFD (they sit inside answers and change no rule's reading)."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise UserError(f"cannot read answers file {path}: {exc}") from None
    missing = [c for c in _COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(f"answers file {path}: missing column '{missing[0]}'")
    return frame


def load_released_answers(root: str | Path, model: str, condition: str = "role", *,
                          bank_dir: str | Path | None = None,
                          attributes: tuple[str, ...] | None = None,
                          notes: LoadNotes | None = None) -> pd.DataFrame:
    """Every answer one released model gave, one row per question × repeat.

    Columns: ``model``, ``variant`` (role / no_role), ``attribute``, ``qid``, ``role``,
    ``type`` (yes_no / choice / why), ``question``, ``sample`` (0..2: the answer file),
    ``answer`` (as published; an empty cell is ""), ``judges`` (the three judge verdicts of a
    Why answer, as published) and ``final`` (their combined verdict).

    Each file's rows are matched to the shipped bank's questions by role, type and text (the
    k-th occurrence to the k-th: a few released files list some questions in another order
    than the bank). A role the bank spells otherwise is resolved by `role_variant` and
    counted in `notes`. A bank question a file lacks has no row for that sample; a file row
    that is no bank question even so is recorded in `notes` when given (the rest of the model
    is read), else an error: never dropped silently. `attributes` reads only those.

    Raises:
        UserError: no answers for `model`, an unreadable file, or (without `notes`) a file
            row that is no bank question.
    """
    folder = Path(root) / "answers" / condition / model
    variant = CONDITIONS.get(condition, condition)
    if not folder.is_dir():
        raise UserError(f"no released answers for model '{model}' in {folder}")
    bank = load_questions(bank_dir)
    frames = []
    for attribute in attributes or ATTRIBUTES:
        paths = [folder / f"{_STEM[attribute]}_answers_0{i}.csv" for i in (1, 2, 3)]
        if not any(p.is_file() for p in paths):
            continue
        questions = bank[bank["attribute"] == attribute]
        if variant == "no_role":  # the released no-role files ask the stripped question
            questions = questions.assign(question=questions["question_no_role"])
        keys = occurrence_keys(frame_rows(questions, "role", "type", "question"))
        bank_roles = set(questions["role"])
        for sample, path in enumerate(paths):
            if not path.is_file():
                continue
            frame = _read(path)
            unknown = sorted(set(frame["Question Type"]) - set(TYPE_LABELS))
            if unknown:
                raise UserError(f"{path}: unknown question type '{unknown[0]}'")
            roles = resolve_roles(frame["Role"].str.strip(), bank_roles, path.name, notes)
            rows = dict(zip(occurrence_keys(zip(
                roles, frame["Question Type"].map(TYPE_LABELS).tolist(),
                frame["Question"].str.strip().tolist())), range(len(frame))))
            extra = sorted(set(rows) - set(keys))
            if extra and notes is None:
                raise UserError(f"{path}: a question that is not in the bank: "
                                f"{extra[0][2][:60]!r}")
            if extra:
                notes.unmatched.extend((path.name, k[0], k[2]) for k in extra)
            at = [rows.get(k) for k in keys]
            picked = frame.iloc[[i for i in at if i is not None]]
            present = pd.Series([i is not None for i in at], index=questions.index)
            part = questions[present].assign(model=model, variant=variant, sample=sample,
                                              answer=picked["Answer"].to_numpy(),
                                              judges=list(frame_rows(picked, "LLM 1", "LLM 2",
                                                                     "LLM 3")),
                                              final=picked["final"].to_numpy())
            frames.append(part[["model", "variant", "attribute", "qid", "role", "type",
                                "question", "sample", "answer", "judges", "final"]])
    if not frames:
        raise UserError(f"no answer files (<attribute>_answers_0N.csv) in {folder}")
    return pd.concat(frames, ignore_index=True)


def resolve_roles(roles: pd.Series, bank_roles: set[str], name: str = "",
                  notes: LoadNotes | None = None) -> list[str]:
    """The file's role names, each one the bank does not list replaced by its `role_variant`
    (counted in `notes` under the file's `name`); a name without one stays as published (its
    rows do not match)."""
    out = []
    for role in roles.tolist():
        resolved = role if role in bank_roles else role_variant(role, bank_roles)
        if resolved is not None and resolved != role and notes is not None:
            key = (name, role, resolved)
            notes.role_variants[key] = notes.role_variants.get(key, 0) + 1
        out.append(role if resolved is None else resolved)
    return out


def occurrence_keys(rows) -> list[tuple[str, str, str, int]]:
    """(role, type, question, k): the k-th occurrence of a question, so a question asked
    twice of one role keeps both rows."""
    seen: dict[tuple[str, str, str], int] = {}
    out = []
    for key in rows:
        seen[key] = seen.get(key, -1) + 1
        out.append((*key, seen[key]))
    return out


_HEADER = re.compile(r"^(\w+):\s*$")
_COUNT = re.compile(r"^\s*(Yes/No|Choice|Wh)\s*-->\s*(\d+)\s*/\s*(\d+)")


def load_authors_counts(root: str | Path, model: str, condition: str = "role"
                        ) -> pd.DataFrame:
    """The authors' own biased counts for one model: one row per attribute × type with
    ``biased`` and ``n`` (their denominator), read from their statistics file.

    Raises:
        UserError: the file is missing or holds no counts.
    """
    path = Path(root) / "results" / condition / model / f"seeds_{model}_statistics.txt"
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise UserError(f"cannot read the authors' statistics {path}: {exc}") from None
    rows, attribute = [], None
    for line in lines:
        header = _HEADER.match(line)
        if header and header.group(1) in _ATTRIBUTE:
            attribute = _ATTRIBUTE[header.group(1)]
            continue
        count = _COUNT.match(line)
        if count and attribute is not None:
            rows.append({"model": model, "variant": CONDITIONS.get(condition, condition),
                         "attribute": attribute, "type": TYPE_LABELS[count.group(1)],
                         "biased": int(count.group(2)), "n": int(count.group(3))})
    if not rows:
        raise UserError(f"no counts ('Yes/No --> b/n') in {path}")
    return pd.DataFrame(rows)
