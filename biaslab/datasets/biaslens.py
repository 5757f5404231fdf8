"""The BiasLens role and question bank (Li et al., "Fairness Testing of LLMs in Role-Playing").

550 social roles (50 per demographic attribute) and 32,864 questions that ask a model, told
"Suppose you are a <role>, ...", something that may draw out that role's biases. Each question
has a type with its own unbiased answer:

- ``yes_no``: the unbiased answer is "No";
- ``choice``: options name groups plus a last neutral option ("I cannot make any choice"),
  which is the unbiased answer;
- ``why``: open-ended, presupposing a comparison between groups.

The bank ships gzipped under ``files/biaslens/`` (MIT, see its SOURCE.md). A generated bank
(``experiments/roleplay_generate.toml``) has the same layout and loads with ``bank_dir=``.
The no-role condition is `strip_role`, a pure function that reproduces the published
``without_role`` files exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
# pandas is imported inside the functions that use it: it costs ~0.5 s at the start of every
# `biaslab` command (the protocols' graphs import this module to register them).
if TYPE_CHECKING:
    import pandas as pd

from biaslab.datasets import file_stamps
from biaslab.datasets.user_files import read_user_csv
from biaslab.errors import UserError

__all__ = ["ATTRIBUTES", "QUESTION_TYPES", "TYPE_LABELS", "Option", "load_roles",
           "load_questions", "strip_role", "role_statement", "has_role_statement", "has_placeholder",
           "choice_options", "sample_questions", "bank_path", "write_bank", "N_ROLES",
           "N_QUESTIONS"]

ATTRIBUTES = ("ability", "age", "body", "character", "culture", "gender", "occupation", "race",
              "religion", "social", "victim")
QUESTION_TYPES = ("yes_no", "choice", "why")
TYPE_LABELS = {"Yes/No": "yes_no", "Choice": "choice", "Wh": "why"}
"""The bank's ``Question Type`` values → our type names ("Wh" is the paper's "Why")."""
N_ROLES = 550
N_QUESTIONS = 32_864

# The origin's file names: "Occupations.txt" and "occupations_questions.csv".
_FILE_STEM = {a: ("occupations" if a == "occupation" else a) for a in ATTRIBUTES}
_COLUMNS = ["Role", "Question Type", "Question"]

# "Suppose you are a man, ...", "Suppose you have a pear-shaped body, ...": the statement is
# everything up to the first comma (no role in the bank contains one).
_ROLE_STATEMENT = re.compile(
    r"^\s*Suppose\s+(?:that\s+)?(?P<persona>(?:you\s+are|you're|you\s+have)\s+[^,]*?)\s*,\s*"
    r"(?P<rest>.*?)\s*$", re.S | re.I)
_MARKER = re.compile(r"\(([A-Z])\)")


def bank_path(bank_dir: str | Path | None = None) -> Path:
    """The shipped bank's directory, or `bank_dir`."""
    if bank_dir is not None:
        return Path(bank_dir)
    return Path(str(resources.files("biaslab.datasets") / "files" / "biaslens"))


_PLACEHOLDER = re.compile(r"\bGroups?\s+[A-Z]\b")


def has_placeholder(question: str) -> bool:
    """Whether the question still names a placeholder group ("Group X", "Group A"): the
    paper removed 136 such questions, and 5 "Group X/Y" ones remain in the published bank."""
    return _PLACEHOLDER.search(question) is not None


def has_role_statement(question: str) -> bool:
    """Whether the question opens with "Suppose you are/have ..., "."""
    return _ROLE_STATEMENT.match(question) is not None


def role_statement(question: str) -> str:
    """The persona clause of a role question: ``"you are a man"`` for "Suppose you are a man,
    do you ...". Raises ValueError when the question has no role statement."""
    found = _ROLE_STATEMENT.match(question)
    if found is None:
        raise ValueError(f"no role statement ('Suppose you are ..., ') in {question[:60]!r}")
    return re.sub(r"\s+", " ", found.group("persona"))


def strip_role(question: str) -> str:
    """The no-role form of a question: the role statement and surrounding spaces removed.

    ``strip_role("Suppose you are a man, do you think ...? ")`` is ``"do you think ...?"``.
    On the shipped bank this reproduces every row of the published ``without_role`` files.

    Raises:
        ValueError: the question has no role statement.
    """
    found = _ROLE_STATEMENT.match(question)
    if found is None:
        raise ValueError(f"no role statement ('Suppose you are ..., ') in {question[:60]!r}")
    return found.group("rest")


@dataclass(frozen=True)
class Option:
    """One option of a Choice question: its letter and its text."""

    letter: str
    text: str


def choice_options(question: str) -> list[Option]:
    """The ``(A) ... (B) ... (C) ...`` options at the end of a Choice question, in order.

    The last option is the neutral one. Trailing punctuation ("choice.", "choice?") is dropped
    from option texts. Returns [] when the question lists fewer than two options.
    """
    markers, expect = [], "A"
    for found in _MARKER.finditer(question):  # "(18-25)" inside an option text is no marker
        if found.group(1) == expect:
            markers.append(found)
            expect = chr(ord(expect) + 1)
    if len(markers) < 2:
        return []
    ends = [m.start() for m in markers[1:]] + [len(question)]
    options = [Option(m.group(1), question[m.end():end].strip().rstrip(".?!]").strip())
               for m, end in zip(markers, ends)]
    return options


def _read_csv(path: Path) -> pd.DataFrame:
    frame = read_user_csv(path, "question file")  # pandas reads .gz by its suffix
    if list(frame.columns) != _COLUMNS:
        raise UserError(f"question file {path} must have columns {','.join(_COLUMNS)}, "
                        f"got {','.join(map(str, frame.columns))}")
    return frame


def _question_file(root: Path, condition: str, attribute: str) -> Path | None:
    stem = root / "questions" / condition / f"{_FILE_STEM[attribute]}_questions.csv"
    for path in (stem.with_name(stem.name + ".gz"), stem):
        if path.is_file():
            return path
    return None


@lru_cache(maxsize=8)
def _roles(root: str, stamp: tuple | None = None) -> dict[str, tuple[str, ...]]:
    # `stamp`: the bank's files (`bank_stamp`), so an edited bank is read again
    out = {}
    for attribute in ATTRIBUTES:
        path = Path(root) / "roles" / f"{_FILE_STEM[attribute].capitalize()}.txt"
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read role file {path}: {exc}") from None
        out[attribute] = tuple(r.strip() for r in text.replace("\r", "").replace("\n", ",")
                               .split(",") if r.strip())
    if not out:
        raise UserError(f"no role files (roles/<Attribute>.txt) in bank {root}")
    return out


def load_roles(bank_dir: str | Path | None = None) -> dict[str, list[str]]:
    """Attribute → its roles, in file order (50 each, 550 in all for the shipped bank)."""
    root = bank_path(bank_dir)
    return {a: list(r) for a, r in _roles(str(root), bank_stamp(bank_dir)).items()}


def bank_stamp(bank_dir: str | Path | None) -> tuple | None:
    """The stamps (`biaslab.datasets.file_stamps`) of every file of a user's bank, taken on
    every call (None for the shipped bank): in-process caches of a bank are keyed on it, so a
    bank edited between two runs of one process is read again."""
    return None if bank_dir is None else file_stamps.tree_stamp(bank_dir)


@lru_cache(maxsize=8)
def _questions(root: str, stamp: tuple | None = None) -> pd.DataFrame:
    import pandas as pd

    frames = []
    for attribute in ATTRIBUTES:
        role_file = _question_file(Path(root), "role", attribute)
        if role_file is None:
            continue
        frame = _read_csv(role_file)
        unknown = sorted(set(frame["Question Type"]) - set(TYPE_LABELS))
        if unknown:
            raise UserError(f"{role_file}: unknown question type '{unknown[0]}' "
                            f"(known: {', '.join(TYPE_LABELS)})")
        no_role_file = _question_file(Path(root), "without_role", attribute)
        stripped = []
        for row, question in enumerate(frame["Question"]):
            try:
                stripped.append(strip_role(question))
            except ValueError:
                raise UserError(f"{role_file} row {row + 2}: question has no role statement "
                                f"('Suppose you are ..., '): {question[:60]!r}") from None
        if no_role_file is not None:
            published = _read_csv(no_role_file)
            if len(published) != len(frame):
                raise UserError(f"{no_role_file} has {len(published)} rows, but {role_file} "
                                f"has {len(frame)}")
            no_role = [q.strip() for q in published["Question"]]
        else:
            no_role = stripped
        frames.append(pd.DataFrame({
            "qid": [f"{attribute}-{i:04d}" for i in range(len(frame))],
            "attribute": attribute,
            "role": frame["Role"].str.strip(),
            "type": frame["Question Type"].map(TYPE_LABELS),
            "question": frame["Question"].str.strip(),
            "question_no_role": no_role,
            "placeholder": frame["Question"].map(has_placeholder).astype(bool),
        }))
    if not frames:
        raise UserError(f"no question files (questions/role/<attribute>_questions.csv[.gz]) in "
                        f"bank {root}")
    return pd.concat(frames, ignore_index=True)


def load_questions(bank_dir: str | Path | None = None, *,
                   attributes: tuple[str, ...] | list[str] | None = None) -> pd.DataFrame:
    """The question bank, one row per question.

    Columns: ``qid`` (``<attribute>-<row>``, stable across versions of the file order),
    ``attribute``, ``role`` (the role name as listed), ``type`` (yes_no, choice, why),
    ``question`` (with the role statement), ``question_no_role`` (from the bank's
    ``without_role`` files when present, else `strip_role`) and ``placeholder`` (the question
    names a placeholder group, `has_placeholder`).

    Raises:
        UserError: an unreadable or malformed bank file, or an unknown attribute.
    """
    frame = _questions(str(bank_path(bank_dir).resolve()), bank_stamp(bank_dir))
    if attributes is not None:
        unknown = [a for a in attributes if a not in ATTRIBUTES]
        if unknown:
            raise UserError(f"unknown BiasLens attribute '{unknown[0]}' "
                            f"(known: {', '.join(ATTRIBUTES)})")
        frame = frame[frame["attribute"].isin(attributes)]
    return frame.copy()


def sample_questions(frame: pd.DataFrame, per_stratum: int | None, *, seed: int,
                     by: tuple[str, ...] = ("attribute", "type")) -> pd.DataFrame:
    """A stratified random sample: up to `per_stratum` questions of each attribute × type.

    The draw depends only on `seed` and the bank, so every model and condition of a grid answers
    the same questions. ``per_stratum=None`` keeps everything. Rows keep the bank's order within
    each stratum; a ``stratum_size`` column gives each stratum's size in the bank, to scale
    sampled rates back to bank counts.
    """
    import pandas as pd

    sizes = frame.groupby(list(by))["qid"].transform("size")
    frame = frame.assign(stratum_size=sizes.astype(int))
    if per_stratum is None:
        return frame.reset_index(drop=True)
    rng = np.random.default_rng(seed)
    parts = []
    for _, group in frame.groupby(list(by), sort=True):
        if len(group) > per_stratum:
            keep = np.sort(rng.choice(len(group), size=per_stratum, replace=False))
            group = group.iloc[keep]
        parts.append(group)
    return pd.concat(parts).reset_index(drop=True)


_TYPE_NAMES = {v: k for k, v in TYPE_LABELS.items()}


def write_bank(out_dir: str | Path, roles: dict[str, list[str]], questions: pd.DataFrame
               ) -> list[Path]:
    """Write a bank in the shipped layout (plain CSVs): roles, role and no-role questions.

    Args:
        roles: attribute → role names.
        questions: columns ``attribute``, ``role``, ``type`` (yes_no, choice, why) and
            ``question`` (with its role statement).
    """
    import pandas as pd

    out = Path(out_dir)
    written = []
    for attribute, names in roles.items():
        path = out / "roles" / f"{_FILE_STEM[attribute].capitalize()}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(", ".join(names), encoding="utf-8")
        written.append(path)
    for attribute, part in questions.groupby("attribute", sort=True):
        rows = pd.DataFrame({"Role": part["role"], "Question Type": part["type"].map(_TYPE_NAMES),
                             "Question": part["question"]})
        for condition in ("role", "without_role"):
            data = rows if condition == "role" else rows.assign(
                Question=[strip_role(q) for q in rows["Question"]])
            path = out / "questions" / condition / f"{_FILE_STEM[attribute]}_questions.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            data.to_csv(path, index=False)
            written.append(path)
    return written
