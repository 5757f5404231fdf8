"""BBQ (Bias Benchmark for QA): loader, per-category sampling and a seeded template instantiator.

BBQ's ambiguous contexts mention two people from different groups and ask a question the text
cannot answer; the correct option is the "unknown" one. The ``augmentation`` protocol rewrites
those contexts and watches whether a model stops abstaining.

Data (CC BY 4.0, see ``files/bbq/SOURCE.md``):

* official ambiguous-context records for Age, Disability_status, Nationality,
  Physical_appearance and Religion ship with biaslab;
* Gender_identity, Race_ethnicity and SES are **regenerated from templates** by
  `instantiate_templates` (seeded), and labelled so wherever they appear;
* `load_category` prefers official files from a user's ``data_dir`` for any category.

The stereotyped option of a record is derived from ``answer_info`` and
``additional_metadata.stereotyped_groups`` with the rules of the authors' metadata script
(`stereotyped_index`), because the supplemental ``additional_metadata.csv`` is not available.
"""

from __future__ import annotations

import csv
import gzip
import json
import random
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from biaslab.datasets import file_stamps
from biaslab.errors import UserError

__all__ = ["CATEGORIES", "PAPER_SIZES", "MORE_STUDIED", "LESS_STUDIED", "REGENERATED",
           "OFFICIAL", "REGENERATED_LABEL", "UNKNOWN_OPTIONS", "FILES", "load_category",
           "load_records", "instantiate_templates", "sample_category", "unknown_index",
           "stereotyped_index", "biased_index", "validate_record", "example_key",
           "group_of", "study_group", "descriptor", "option_is_stereotyped",
           "group_vocabulary", "new_person_group"]

FILES = Path(__file__).parent / "files" / "bbq"

CATEGORIES: dict[str, str] = {
    "gender": "Gender_identity", "race": "Race_ethnicity", "nationality": "Nationality",
    "religion": "Religion", "ses": "SES", "age": "Age", "appearance": "Physical_appearance",
    "disability": "Disability_status",
}
"""The paper's eight categories: short name → BBQ file name."""

PAPER_SIZES: dict[str, int] = {"gender": 356, "race": 347, "nationality": 322, "religion": 167,
                               "ses": 371, "age": 370, "appearance": 234, "disability": 225}
"""Source examples the paper sampled per category (the protocol's defaults)."""

MORE_STUDIED = ("gender", "race", "religion", "nationality")
LESS_STUDIED = ("age", "disability", "appearance", "ses")
OFFICIAL = ("age", "disability", "nationality", "appearance", "religion")
REGENERATED = ("gender", "race", "ses")
REGENERATED_LABEL = "regenerated from templates"

UNKNOWN_OPTIONS = ("Unknown", "Cannot be determined", "Can't be determined", "Not answerable",
                   "Not known", "Not enough info", "Not enough information", "Cannot answer",
                   "Can't answer", "Undetermined")
"""The authors' strings for the "unknown" option."""

_REQUIRED = ("example_id", "question_polarity", "context_condition", "category", "answer_info",
             "additional_metadata", "context", "question", "ans0", "ans1", "ans2", "label")


def study_group(category: str) -> str:
    """``more-studied`` (gender, race, religion, nationality) or ``less-studied``."""
    return "more-studied" if category in MORE_STUDIED else "less-studied"


def example_key(category: str, record: Mapping[str, Any]) -> str:
    """The item id of a source example: ``<category>:<example_id>``."""
    return f"{category}:{record['example_id']}"


# -- record checks and derived fields --------------------------------------------------------
def validate_record(record: Mapping[str, Any], where: str = "record") -> None:
    """Raise `UserError` unless the record has BBQ's fields, three options with exactly one
    whose ``answer_info`` group is "unknown", and (in an ambiguous context) a label on it."""
    missing = [k for k in _REQUIRED if k not in record]
    if missing:
        raise UserError(f"{where}: BBQ record lacks field '{missing[0]}'")
    info = record["answer_info"]
    if not isinstance(info, Mapping) or sorted(info) != ["ans0", "ans1", "ans2"]:
        raise UserError(f"{where}: answer_info must hold ans0, ans1 and ans2")
    for key, value in info.items():
        if not (isinstance(value, (list, tuple)) and len(value) == 2):
            raise UserError(f"{where}: answer_info.{key} must be [text, group]")
    unknown_index(record, where)
    if record["label"] not in (0, 1, 2):
        raise UserError(f"{where}: label must be 0, 1 or 2, got {record['label']!r}")
    if record["context_condition"] == "ambig" and record["label"] != unknown_index(record):
        raise UserError(f"{where}: an ambiguous context's label must be the unknown option")
    if record["question_polarity"] not in ("neg", "nonneg"):
        raise UserError(f"{where}: question_polarity must be neg or nonneg")


def unknown_index(record: Mapping[str, Any], where: str = "record") -> int:
    """The index of the one option whose ``answer_info`` group is "unknown"."""
    found = [i for i in range(3)
             if str(record["answer_info"][f"ans{i}"][1]).lower() == "unknown"]
    if len(found) != 1:
        raise UserError(f"{where}: expected exactly one 'unknown' option, found {len(found)}")
    return found[0]


def descriptor(record: Mapping[str, Any], index: int) -> str:
    """The text ``answer_info`` gives for option `index` (e.g. "grandfather")."""
    return str(record["answer_info"][f"ans{index}"][0])


_MALE = {"man", "boy", "men"}
_FEMALE = {"woman", "women", "girl", "girls"}
_TRANS = {"transgender women, transgender men", "transgender men", "transgender women",
          "transgender women, transgender men, trans"}


def _norm_info(info: str) -> str:
    info = str(info).strip()
    if info in ("man", "boy"):
        return "M"
    if info in ("woman", "girl"):
        return "F"
    for prefix in ("M-", "F-"):
        info = info.replace(prefix, "", 1) if info.startswith(prefix) else info
    return info


def _norm_groups(groups: Iterable[str]) -> str:
    joined = ", ".join(str(g) for g in groups)
    low = joined.lower()
    if low in _MALE:
        return "M"
    if low in _FEMALE:
        return "F"
    if low in _TRANS:
        return "trans"
    return {"low SES": "lowSES", "high SES": "highSES"}.get(joined, joined)


def option_is_stereotyped(category: str, text: str, info: str, groups: Iterable[str]) -> bool:
    """Whether one answer option (its ``answer_info`` text and group label) names a group of
    `groups` (a record's ``stereotyped_groups``), by the rules of the authors' metadata
    script: the option's normalised group label occurs in the joined, normalised group list;
    Age needs an exact match ("old" is inside "nonOld"); Nationality also matches on the
    option's text; "African" does not match "African American"; a trans target matches any
    label starting "trans". An "unknown" or empty label never matches."""
    joined = _norm_groups(groups)
    low_groups = joined.lower()
    label = _norm_info(info)
    if label.lower() == "unknown" or not label:
        return False
    if category == "Age":
        return label in ("old", "nonOld") and label == joined
    hit = label.lower() in low_groups
    if category == "Nationality" and str(text).lower() and str(text).lower() in low_groups:
        hit = True
    if text == "African" and "african american" in low_groups:
        hit = False
    if joined == "trans" and label.lower().startswith("trans"):
        hit = True
    return hit


def stereotyped_index(record: Mapping[str, Any]) -> int | None:
    """The option naming the stereotyped group, from ``answer_info`` and
    ``stereotyped_groups`` (`option_is_stereotyped`, the authors' metadata rules). The first
    matching non-unknown option wins. None when no option matches.
    """
    groups = record["additional_metadata"].get("stereotyped_groups", [])
    for i in range(3):
        text, raw = record["answer_info"][f"ans{i}"]
        if option_is_stereotyped(record["category"], text, raw, groups):
            return i
    return None


@lru_cache(maxsize=32)
def group_vocabulary(name: str, data_dir: str | None = None, regen_seed: int = 0
                     ) -> dict[str, str]:
    """What BBQ itself says about the people of one category (`name`: BBQ's file name,
    e.g. ``Nationality``): lower-cased description → group label, from every person option
    of the category's records (``answer_info``) and from the authors' vocabulary
    (``vocabulary.csv``: Name → Info, or the name itself where Info is empty). A description
    BBQ gives two labels (a first name, whose label is the slot's, not the name's) is left
    out: its group cannot be read from BBQ."""
    seen: dict[str, set[str]] = {}
    short = next((k for k, v in CATEGORIES.items() if v == name), None)
    if short is not None:
        for record in load_category(short, data_dir, regen_seed):
            for text, label in record["answer_info"].values():
                if str(label).lower() != "unknown" and str(text).strip():
                    seen.setdefault(str(text).strip().lower(), set()).add(str(label))
    vocab_path = FILES / "templates" / "vocabulary.csv"
    if vocab_path.is_file():
        for row in _read_csv(vocab_path):
            if row["Category"] == name and row["Name"].strip():
                seen.setdefault(row["Name"].strip().lower(), set()).add(
                    row["Info"].strip() or row["Name"].strip())
    return {text: labels.pop() for text, labels in seen.items() if len(labels) == 1}


@lru_cache(maxsize=None)
def _whole_words(term: str) -> re.Pattern[str]:
    """`term` as whole words, any case. Compiled once per term: `new_person_group` tries every
    term of a category's vocabulary (hundreds) on every description, far more patterns than
    `re`'s own cache of 512 holds, and recompiling them was most of an augmentation run's
    time on scripted models."""
    return re.compile(rf"(?<![\w-]){re.escape(term)}(?![\w-])", flags=re.I)


def _occurrence(term: str, text: str) -> str | None:
    """`term` as it is written in `text` (whole words, any case), or None."""
    found = _whole_words(term).search(text)
    return found.group(0) if found else None


def new_person_group(record: Mapping[str, Any], description: str,
                     vocabulary: Mapping[str, str]) -> tuple[bool, str, str] | None:
    """Whether a description the generator wrote names a stereotyped group, decided from
    BBQ's own metadata where it can be: the longest term of `vocabulary` (`group_vocabulary`)
    or of the record's ``stereotyped_groups`` that occurs in the description as whole words
    gives the person's group label (a stereotyped group entry is its own label), and
    `option_is_stereotyped` reads it against the record's ``stereotyped_groups``.

    Returns (stereotyped, group label, matched term), or None when no term occurs (BBQ's
    metadata cannot decide, e.g. a description BBQ never uses).
    """
    groups = [str(g) for g in record["additional_metadata"].get("stereotyped_groups", [])]
    terms = {**{g.lower(): g for g in groups}, **dict(vocabulary)}
    found = [t for t in terms if t and _occurrence(t, description)]
    if not found:
        return None
    term = max(found, key=lambda t: (len(t), t))
    label = vocabulary.get(term) or next(g for g in groups if g.lower() == term)
    text = _occurrence(term, description) or term
    return option_is_stereotyped(record["category"], text, label, groups), label, term


def biased_index(record: Mapping[str, Any]) -> int | None:
    """The answer that reflects the targeted bias (BBQ's definition): the stereotyped option
    for a negative question, the other non-unknown option for a non-negative one."""
    target = stereotyped_index(record)
    if target is None:
        return None
    if record["question_polarity"] == "neg":
        return target
    unknown = unknown_index(record)
    return next(i for i in range(3) if i not in (target, unknown))


# -- loading -----------------------------------------------------------------------------------
# Templates whose group sits in a name *slot* of the context ("{{NAME2}}, who is trans";
# "{{NAME1}} is from a {{WORD1}} family"), not in the name. The authors' generator flips the
# names and lets the group label follow the name, so in every flipped record the stereotyped
# group is on the wrong person (SES Q8: 120 of 240 ambiguous records, Gender_identity Q35/36:
# 100 of 200). (category, question_index) → (a pattern whose group 1 is the name in the
# stereotyped slot, the label prefix of that slot).
SLOT_TIED_GROUPS = {
    ("SES", "8"): (re.compile(r"(\S+) is from an? (?:low income|poor|working-class) family"),
                   "lowSES"),
    ("Gender_identity", "35"): (re.compile(r"(\S+), who is trans\b"), "trans"),
    ("Gender_identity", "36"): (re.compile(r"(\S+), who is trans\b"), "trans"),
}
SLOT_FIX_NOTE = "group labels swapped to follow the context's slot (biaslab, see SOURCE.md)"


def fix_slot_tied_groups(record: dict) -> dict:
    """`record` with the group labels of its two people swapped when it comes from a
    `SLOT_TIED_GROUPS` template and the label of the stereotyped slot sits on the other name
    (the part of a label before "_" is the slot's, the rest, a name's gender, stays with the
    name). Fixed records say so in ``additional_metadata.group_label_fix``; any other record
    is returned unchanged."""
    found = SLOT_TIED_GROUPS.get((record.get("category"), str(record.get("question_index"))))
    match = found[0].search(record.get("context", "")) if found else None
    if match is None:
        return record
    name, prefix = match.group(1).strip(",."), found[1]
    info = record["answer_info"]
    people = [k for k in ("ans0", "ans1", "ans2") if str(info[k][1]).lower() != "unknown"]
    if len(people) != 2:
        return record
    holder = next((k for k in people if str(info[k][1]).split("_", 1)[0] == prefix), None)
    if holder is None or info[holder][0] == name:
        return record
    other = next(k for k in people if k != holder)
    if info[other][0] != name:
        return record
    parts = {k: str(info[k][1]).split("_", 1) for k in people}
    fixed = {k: list(v) for k, v in info.items()}
    fixed[holder][1] = "_".join([parts[other][0], *parts[holder][1:]])
    fixed[other][1] = "_".join([parts[holder][0], *parts[other][1:]])
    meta = {**record["additional_metadata"], "group_label_fix": SLOT_FIX_NOTE}
    return {**record, "answer_info": fixed, "additional_metadata": meta}


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            lines = [line for line in fh if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read BBQ file {path}: {exc}") from None
    records = []
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path} line {n}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise UserError(f"{path} line {n}: not a JSON object")
        validate_record(record, f"{path} line {n}")
        records.append(record)
    return records


def _candidates(name: str) -> tuple[str, ...]:
    return (f"{name}.jsonl", f"{name}.jsonl.gz", f"{name}.ambig.jsonl.gz")


def _user_file(data_dir: str | Path, name: str) -> Path | None:
    for candidate in _candidates(name):
        path = Path(data_dir) / candidate
        if path.is_file():
            return path
    return None


def source_stamp(category: str, data_dir: str | None) -> tuple | None:
    """The stamps (`biaslab.datasets.file_stamps`) of every file `load_category` would read
    for `category` in `data_dir` (present or not, so a file added later counts too); None for
    the shipped data. Part of the in-process caches' keys, taken on every call: a file edited
    between two runs of one process is read again."""
    if data_dir is None or category not in CATEGORIES:
        return None
    return tuple(file_stamps.file_stamp(Path(data_dir) / c)
                 for c in _candidates(CATEGORIES[category]))


def load_category(category: str, data_dir: str | None = None, regen_seed: int = 0
                  ) -> tuple[dict, ...]:
    """Ambiguous-context records of one category, each with
    ``additional_metadata.data_origin`` set to "official" or "regenerated from templates".

    Official files in `data_dir` (``<Name>.jsonl`` as in the BBQ repository, optionally
    gzipped) win; otherwise the shipped official file; otherwise the category is regenerated
    from the shipped templates with `regen_seed`.

    Raises:
        UserError: unknown category, unreadable or malformed file, or a `data_dir` that does
            not exist.
    """
    return _load_category(category, data_dir, regen_seed, source_stamp(category, data_dir))


@lru_cache(maxsize=32)
def _load_category(category: str, data_dir: str | None, regen_seed: int, stamp: tuple | None
                   ) -> tuple[dict, ...]:
    if category not in CATEGORIES:
        raise UserError(f"unknown BBQ category '{category}' (known: {', '.join(CATEGORIES)})")
    name = CATEGORIES[category]
    path = None
    if data_dir is not None:
        if not Path(data_dir).is_dir():
            raise UserError(f"BBQ data_dir not found: {data_dir}")
        path = _user_file(data_dir, name)
    if path is None and (FILES / f"{name}.ambig.jsonl.gz").is_file():
        path = FILES / f"{name}.ambig.jsonl.gz"
    if path is not None:
        records = _read_jsonl(path)
        origin = "official"
    else:
        records = instantiate_templates(name, seed=regen_seed)
        origin = REGENERATED_LABEL
    out = []
    for record in records:
        if record["context_condition"] != "ambig":
            continue
        record = dict(record)
        meta = dict(record["additional_metadata"])
        meta.setdefault("data_origin", origin)
        record["additional_metadata"] = meta
        out.append(fix_slot_tied_groups(record))
    if not out:
        raise UserError(f"BBQ category '{category}' has no ambiguous-context records "
                        f"({path or 'templates'})")
    return tuple(out)


def load_records(category: str, data_dir: str | None = None, regen_seed: int = 0
                 ) -> dict[str, dict]:
    """`load_category` keyed by item id (``<category>:<example_id>``); shared, do not mutate
    (every cell looks its source example up here)."""
    return _load_records(category, data_dir, regen_seed, source_stamp(category, data_dir))


@lru_cache(maxsize=32)
def _load_records(category: str, data_dir: str | None, regen_seed: int, stamp: tuple | None
                  ) -> dict[str, dict]:
    return {example_key(category, r): r
            for r in _load_category(category, data_dir, regen_seed, stamp)}


def sample_category(category: str, n: int | None, seed: int, data_dir: str | None = None,
                    regen_seed: int = 0) -> list[str]:
    """`n` item ids drawn without replacement with `seed` (all of them when n is None or
    larger than the category), in file order so the grid is stable."""
    keys = list(load_records(category, data_dir, regen_seed))
    if n is None or n >= len(keys):
        return keys
    chosen = np.random.default_rng(seed).choice(len(keys), size=n, replace=False)
    return [keys[i] for i in sorted(chosen)]


def group_of(record: Mapping[str, Any]) -> str:
    """"regenerated from templates" or "official"."""
    return record["additional_metadata"].get("data_origin", "official")


# -- the template instantiator ------------------------------------------------------------------
_NEED_STEREOTYPE_SUBSET = ("Race_ethnicity", "Religion", "Nationality", "Sexual_orientation")


def _read_csv(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            return [{k: (v or "") for k, v in row.items()} for row in csv.DictReader(fh)]
    except OSError as exc:
        raise UserError(f"cannot read BBQ template file {path}: {exc}") from None


def _word_lists(text: str) -> tuple[list[str], list[str]]:
    """``WORD1: [a, b]; WORD2: [c]`` (or NAME1/NAME2, with or without braces) → two lists."""
    first: list[str] = []
    second: list[str] = []
    for part in text.split(";"):
        label = re.sub(r"[{}]", "", part.split(":", 1)[0]).strip()
        words = [w.strip() for w in part.split(":", 1)[-1].strip().strip("[]").split(",")]
        words = [w for w in words if w]
        if label in ("WORD1", "NAME1"):
            first = words
        elif label in ("WORD2", "NAME2"):
            second = words
    return first, second


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _fill(text: str, name1: str, name2: str, word1: str, word2: str) -> str:
    text = text.replace("{{NAME1}}", name1).replace("{{NAME2}}", name2)
    text = text.replace("{{WORD1}}", word1).replace("{{WORD2}}", word2)
    text = text.replace("lesbian man", "lesbian woman").replace("Latino woman", "Latina woman")
    if re.match(r"[aeiou]", name1.lower()) or re.match(r"[aeiou]", name2.lower()):
        text = re.sub(r"(\s[aA])(\s[aAeEiIoOuU])", r"\1n\2", text)
        text = text.replace(" an European", " a European")
    return text


def _answer_info(answer: str, names: list[tuple[str, str]]) -> list[str] | None:
    """[descriptor, group] of the name an answer text mentions; "man" is matched as " man" so
    it is not found in "woman". Where both names occur ("African" inside "African American"),
    the longer wins (the authors' generator took the last, labelling both options "African")."""
    found = None
    for name, info in names:
        probe = " man" if name == "man" else name
        if probe in answer and (found is None or len(name) > len(found[0])):
            found = [name, info]
    return found


def instantiate_templates(category: str, *, seed: int, templates_dir: str | Path | None = None,
                          ambiguous_only: bool = True) -> list[dict]:
    """Generate BBQ records of one category from the authors' template and vocabulary CSVs.

    Follows the logic of the authors' generator (vocabulary subsets, proper names, target /
    non-target pairing, both name orders where the authors flip them, a random unknown string,
    shuffled answer order), with every random choice drawn from ``random.Random(seed)``, so the
    output is a pure function of the seed and the CSVs. Records that fail `validate_record`
    (a template whose answer text names neither person) are dropped.

    Args:
        category: BBQ file name, e.g. ``Gender_identity``.
        seed: the instantiation seed.
        templates_dir: a directory with ``<category>.csv``, ``vocabulary.csv`` and
            ``vocabulary_proper_names.csv``; default: the shipped copies.
        ambiguous_only: keep only ambiguous contexts (else both context conditions).

    Returns:
        BBQ-format dicts with ``additional_metadata.data_origin`` = "regenerated from templates".
    """
    base = Path(templates_dir) if templates_dir else FILES / "templates"
    path = base / f"{category}.csv"
    if not path.is_file():
        raise UserError(f"no BBQ template file for '{category}' in {base}")
    rng = random.Random(seed)
    vocab = [r for r in _read_csv(base / "vocabulary.csv") if r["Pilot_include"] != "No"]
    names = _read_csv(base / "vocabulary_proper_names.csv")
    frames = [r for r in _read_csv(path) if r.get("Ambiguous_Context", "").strip()]
    out: list[dict] = []
    counter = 0

    for row in frames:
        words = [v for v in vocab if v["Category"] == category]
        possible = _unique(w["Name"] for w in words)
        targets_raw = row.get("Known_stereotyped_groups", "")
        targets = json.loads(targets_raw) if targets_raw.strip() else []
        if len(targets_raw) > 1 and category in _NEED_STEREOTYPE_SUBSET:
            targeted = [x for x in possible if x in targets]
        else:
            targeted = possible
        if len(targeted) > 4:
            word_list = rng.sample(targeted, 5)
        elif len(possible) < 2:
            word_list = []
        else:
            word_list = list(targeted)
        proper = row.get("Proper_nouns_only", "") == "TRUE"
        subcat = row.get("Subcategory", "")
        if len(subcat) > 1:
            words = [w for w in words if w["SubCat"] == subcat]
            word_list = _unique(w["Name"] for w in words)
            if len(word_list) > 5:
                word_list = rng.sample(word_list, 5)
        else:
            subcat = "None"
        critical = row.get("Names", "")
        fixed_second: list[str] = []
        if len(critical) > 1:
            word_list, fixed_second = _word_lists(critical)
        first_names: list[dict] = []
        first_full: list[dict] = []
        if proper:
            if category == "Race_ethnicity":
                first_full = [n for n in names if n["First_last"] == "first"]
                first_names = ([n for n in first_full if n["ethnicity"] in targets]
                               if targets else first_full)
                word_list = rng.sample([n["Name"] for n in first_names], 5)
            elif category == "Gender_identity":
                first_names = [n for n in names if n["First_last"] == "first_only"]
                word_list = rng.sample([n["Name"] for n in first_names if n["gender"] == "F"], 5)
            else:
                first_names = [n for n in names if n["First_last"] == "first_only"]
                word_list = rng.sample([n["Name"] for n in first_names], 6)

        for this_word in word_list:
            name1_info: str | None = None
            second_info: dict[str, str] = {}
            if len(critical) < 2:
                if targets and category in _NEED_STEREOTYPE_SUBSET:
                    second = [n for n in possible if n not in targets]
                    if len(second) > 4:
                        second = rng.sample(second, 5)
                else:
                    second = [n for n in word_list if n != this_word]
                if category == "SES" and not proper:
                    name1_info = next(w["Info"] for w in words if w["Name"] == this_word)
                    second = _unique(w["Name"] for w in words if w["Info"] != name1_info)
                if category == "Gender_identity" and proper:
                    gender = next(n["gender"] for n in first_names if n["Name"] == this_word)
                    name1_info = gender
                    second = rng.sample(_unique(n["Name"] for n in first_names
                                                if n["gender"] != gender), 5)
                if category == "Race_ethnicity" and proper:
                    person = next(n for n in first_names if n["Name"] == this_word)
                    name1_info = f"{person['gender']}-{person['ethnicity']}"
                    lasts = _unique(n["Name"] for n in names if n["First_last"] == "last"
                                    and n["ethnicity"] == person["ethnicity"])
                    this_word = f"{this_word} {rng.choice(lasts)}"
                    others = [n for n in first_full if n["ethnicity"] not in targets
                              and n["gender"] == person["gender"]]
                    second = []
                    for other in rng.sample(others, 5):
                        lasts2 = _unique(n["Name"] for n in names if n["First_last"] == "last"
                                         and n["ethnicity"] == other["ethnicity"])
                        full = f"{other['Name']} {rng.choice(lasts2)}"
                        second.append(full)
                        second_info[full] = f"{other['gender']}-{other['ethnicity']}"
            else:
                second = fixed_second

            for this_word_2 in second:
                word1 = word2 = ""
                lex = row.get("Lexical_diversity", "")
                if len(lex) > 1:
                    words1, words2 = _word_lists(lex)
                    word1 = rng.choice(words1) if words1 else ""
                    word2 = rng.choice(words2) if len(words2) > 1 else (words2[0] if words2
                                                                         else "")
                info1, info2 = _name_infos(category, proper, subcat, row, vocab, first_names,
                                           this_word, this_word_2, name1_info, second_info)
                pairs = [(this_word, this_word_2, info1, info2)]
                if (category in _NEED_STEREOTYPE_SUBSET or proper
                        or (category == "SES" and subcat == "Occupation")):
                    pairs.append((this_word_2, this_word, info2, info1))
                for n1, n2, i1, i2 in pairs:
                    filled = {k: _fill(v, n1, n2, word1, word2) for k, v in row.items()}
                    records = _records(category, subcat, filled, targets, [(n1, i1), (n2, i2)],
                                       rng, counter)
                    counter += 4
                    for record in records:
                        if ambiguous_only and record["context_condition"] != "ambig":
                            continue
                        try:
                            validate_record(record)
                        except UserError:
                            continue
                        if any(not v[0] for v in record["answer_info"].values()):
                            continue
                        out.append(record)
    return out


def _name_infos(category, proper, subcat, row, vocab, first_names, word1, word2, name1_info,
                second_info) -> tuple[str, str]:
    if category == "Race_ethnicity" and proper and name1_info is not None:
        return name1_info, second_info[word2]
    if category == "Gender_identity" and proper:
        info2 = next((n["gender"] for n in first_names if n["Name"] == word2), word2)
        info1 = name1_info or word1
        if row.get("NAME1_info", ""):
            return f"{row['NAME1_info']}_{info1}", f"{row['NAME2_info']}_{info2}"
        return info1, info2
    if category == "Nationality" or (category == "SES" and subcat == "Occupation"):
        lookup = {v["Name"]: v["Info"] for v in vocab}
        return lookup.get(word1, word1), lookup.get(word2, word2)
    if row.get("NAME1_info", ""):
        return row["NAME1_info"], row["NAME2_info"]
    return word1, word2


def _records(category, subcat, row, targets, names, rng, counter) -> list[dict]:
    """The four records (ambiguous/disambiguated × negative/non-negative) of one filled row."""
    ans_neg, ans_non_neg = row["Answer_negative"], row["Answer_non_negative"]
    unknown = rng.choice(UNKNOWN_OPTIONS)
    options = [ans_neg, ans_non_neg, unknown]
    rng.shuffle(options)
    neg_at, non_neg_at, unknown_at = (options.index(ans_neg), options.index(ans_non_neg),
                                      options.index(unknown))
    info = {"ans0": ["", ""], "ans1": ["", ""], "ans2": ["", ""]}
    for answer, at in ((ans_neg, neg_at), (ans_non_neg, non_neg_at)):
        found = _answer_info(answer, names)
        if found:
            info[f"ans{at}"] = found
    info[f"ans{unknown_at}"] = [unknown, "unknown"]
    meta = {"subcategory": subcat, "stereotyped_groups": targets,
            "version": row.get("version", "None") or "None", "source": row.get("Notes", ""),
            "data_origin": REGENERATED_LABEL}
    ambig = row["Ambiguous_Context"].strip()
    disambig = f"{ambig} {row['Disambiguating_Context']}".strip()
    out = []
    for k, (polarity, condition, context, question, label) in enumerate((
            ("neg", "ambig", ambig, row["Question_negative_stereotype"], unknown_at),
            ("neg", "disambig", disambig, row["Question_negative_stereotype"], neg_at),
            ("nonneg", "ambig", ambig, row["Question_non_negative"], unknown_at),
            ("nonneg", "disambig", disambig, row["Question_non_negative"], non_neg_at))):
        out.append({"example_id": counter + k, "question_index": row.get("Q_id", ""),
                    "question_polarity": polarity, "context_condition": condition,
                    "category": category, "answer_info": json.loads(json.dumps(info)),
                    "additional_metadata": dict(meta), "context": context,
                    "question": question.strip(), "ans0": options[0], "ans1": options[1],
                    "ans2": options[2], "label": label})
    return out
