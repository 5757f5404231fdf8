"""Seed stereotypes for the ``multiturn`` protocol, and a reader for FairMT-Bench scripts.

Two seed sets are shipped (CC BY-SA 4.0, derived from CrowS-Pairs; see
files/crows_pairs/SOURCE.md):

- ``clean_seeds.csv`` (the default, ``source="crows_pairs"``): 40 short stereotype statements per
  category, each a clean group noun phrase plus an attribute ("elderly people" + "cannot send
  an email"), hand-rewritten from one cited CrowS-Pairs sentence. They have the shape of the
  seeds DyMT-ESB takes from FairMT-Bench (group + biased attribute), which the narrative
  sentences do not.
- ``seeds.csv`` (``source="crows_pairs_sentences"``): one row per stereotypical CrowS-Pairs
  sentence of the six categories, its group being the words that differ from its minimally
  edited twin (an automatic span, sometimes garbled), and the sentence itself as the stereotype.

`sample_seeds` draws a fixed number per category with a seed, so every run of a spec sees the
same seeds.

FairMT-Bench has no licence, so it is never shipped: `load_fairmt` reads a copy the user
provides, as the authors published it: a JSON list of dialogues, each an object mapping the
turn to the user's query, keyed ``"0-turn Conv"``, ``"1-turn Conv"``, ... in the 10K release
and ``"0"``, ``"1"``, ... in the 1K release.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
# pandas is imported inside the functions that use it: it costs ~0.5 s at the start of every
# `biaslab` command (the protocols' graphs import this module to register them).
if TYPE_CHECKING:
    import pandas as pd

from biaslab.datasets.user_files import read_user_csv
from biaslab.errors import UserError

__all__ = ["CATEGORIES", "CROWS_TO_CATEGORY", "SEED_COLUMNS", "CLEAN_SEED_COLUMNS",
           "SEED_SOURCES", "FAIRMT_TASKS", "FairMTDialogue",
           "build_seed_set", "load_seeds", "sample_seeds", "load_fairmt", "fairmt_seeds",
           "fairmt_dialogue_of"]

CATEGORIES = ("age", "appearance", "disability", "gender", "race", "religion")
CROWS_TO_CATEGORY = {"age": "age", "physical-appearance": "appearance",
                     "disability": "disability", "gender": "gender", "race-color": "race",
                     "religion": "religion"}
"""CrowS-Pairs bias types kept, and the protocol category each maps to. Nationality,
socioeconomic status and sexual orientation are left out: they are not among the six
categories, and folding them into race or gender would change what those categories mean."""
SEED_COLUMNS = ("seed_id", "category", "bias_type", "group", "stereotype")
CLEAN_SEED_COLUMNS = ("seed_id", "category", "group", "attribute", "stereotype", "source_id")
"""Columns of ``clean_seeds.csv``: `stereotype` is `group` + " " + `attribute`; `source_id` is
the ``seeds.csv`` row (CrowS-Pairs sentence) it was rewritten from."""
SEED_SOURCES = {"crows_pairs": "clean_seeds.csv", "crows_pairs_sentences": "seeds.csv"}
"""The shipped seed sets by `load_seeds` source name, files under ``files/crows_pairs``."""
FAIRMT_TASKS = ("Anaphora_Ellipsis", "Jailbreak_Tips", "Interference_Misinformation",
                "Negative_Feedback", "Fixed_Format", "Scattered_Questions")
_FAIRMT_CATEGORY = {"age": "age", "appearance": "appearance", "disable": "disability",
                    "disability": "disability", "gender": "gender", "race": "race",
                    "religion": "religion"}
_WORD = re.compile(r"\S+")
_TURN_KEY = re.compile(r"(\d+)(?:-turn Conv)?")
_FAIRMT_SEED = re.compile(r"Please summary why (?P<group>.+?) are more likely to be "
                          r"(?P<stereotype>.+?) based on my inputs", re.S)


def _group_span(more: str, less: str) -> str:
    """The words of `more` that its minimal pair `less` replaces: the group it is about."""
    a, b = _WORD.findall(more), _WORD.findall(less)
    changed = [a[i1:i2] for tag, i1, i2, _, _ in
               difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
               if tag in ("replace", "delete")]
    words = [w for span in changed for w in span]
    return re.sub(r"^[^\w]+|[^\w]+$", "", " ".join(words))


def build_seed_set(crows_csv: str | Path) -> pd.DataFrame:
    """The seed set from the CrowS-Pairs CSV (``crows_pairs_anonymized.csv``).

    Keeps rows marked ``stereo`` (the more-stereotypical sentence is about the disadvantaged
    group) of the six mapped bias types, with a non-empty group span; ``seed_id`` is
    ``crows-<row index>`` so every seed traces back to its source row.
    """
    import pandas as pd

    raw = pd.read_csv(crows_csv)
    raw = raw.rename(columns={raw.columns[0]: "row"})
    raw = raw[(raw["stereo_antistereo"] == "stereo") & raw["bias_type"].isin(CROWS_TO_CATEGORY)]
    rows = []
    for rec in raw.itertuples(index=False):
        group = _group_span(rec.sent_more, rec.sent_less)
        if not group:
            continue
        rows.append({"seed_id": f"crows-{rec.row}", "category": CROWS_TO_CATEGORY[rec.bias_type],
                     "bias_type": rec.bias_type, "group": group,
                     "stereotype": " ".join(rec.sent_more.split())})
    return pd.DataFrame(rows, columns=list(SEED_COLUMNS))


def load_seeds(path: str | Path | None = None, *, source: str = "crows_pairs") -> pd.DataFrame:
    """A shipped seed set (`source`, a key of `SEED_SOURCES`; default the clean
    (group, attribute) seeds), or a CSV of your own with the columns seed_id, category, group,
    stereotype (`path`, which wins over `source`). Returns the `SEED_COLUMNS`.

    Raises:
        UserError: the file is missing, unreadable, lacks a column, or has an unknown category
            or an empty stereotype; or `source` is unknown.
    """
    if path is None:
        if source not in SEED_SOURCES:
            raise UserError(f"unknown seed source '{source}' (shipped: "
                            f"{', '.join(SEED_SOURCES)})")
        shipped = resources.files("biaslab.datasets") / "files" / "crows_pairs" \
            / SEED_SOURCES[source]
        with resources.as_file(shipped) as p:
            return _check_seeds(read_user_csv(p, "seed file"), str(p))
    return _check_seeds(read_user_csv(path, "seed file"), str(path))


def _check_seeds(frame: pd.DataFrame, where: str) -> pd.DataFrame:
    missing = [c for c in ("seed_id", "category", "group", "stereotype") if c not in frame]
    if missing:
        raise UserError(f"seed file {where}: missing column '{missing[0]}' (needs "
                        "seed_id, category, group, stereotype)")
    unknown = sorted(set(frame["category"]) - set(CATEGORIES))
    if unknown:
        raise UserError(f"seed file {where}: unknown category '{unknown[0]}' "
                        f"(known: {', '.join(CATEGORIES)})")
    empty = frame["stereotype"].str.strip() == ""
    if empty.any():
        raise UserError(f"seed file {where}: seed '{frame.loc[empty, 'seed_id'].iloc[0]}' has "
                        "an empty stereotype")
    if frame["seed_id"].duplicated().any():
        dup = frame.loc[frame["seed_id"].duplicated(), "seed_id"].iloc[0]
        raise UserError(f"seed file {where}: seed_id '{dup}' appears twice")
    if "bias_type" not in frame:
        frame = frame.assign(bias_type=frame["category"])
    return frame[list(SEED_COLUMNS)].reset_index(drop=True)


def sample_seeds(seeds: pd.DataFrame, *, per_category: int, categories=CATEGORIES,
                 random_state: int = 0) -> pd.DataFrame:
    """`per_category` seeds of each category, drawn without replacement with `random_state`.

    The draw of one category does not depend on which other categories are asked for, so a
    smoke run's seeds are a subset of the paper run's.

    Raises:
        UserError: a category is unknown or has fewer seeds than asked.
    """
    import pandas as pd

    parts = []
    for i, category in enumerate(CATEGORIES):
        if category not in categories:
            continue
        pool = seeds[seeds["category"] == category].sort_values("seed_id")
        if len(pool) < per_category:
            raise UserError(f"category '{category}' has {len(pool)} seeds, fewer than the "
                            f"{per_category} asked for (seeds_per_category)")
        rng = np.random.default_rng([random_state, i])
        parts.append(pool.iloc[np.sort(rng.choice(len(pool), per_category, replace=False))])
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise UserError(f"unknown category '{unknown[0]}' (known: {', '.join(CATEGORIES)})")
    return pd.concat(parts, ignore_index=True) if parts else seeds.iloc[:0]


@dataclass(frozen=True)
class FairMTDialogue:
    """One pre-written FairMT-Bench dialogue: the user's queries in turn order."""

    task: str
    category: str | None
    index: int
    turns: tuple[str, ...]


def _fairmt_file(path: Path, task: str, category: str | None) -> list[FairMTDialogue]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read FairMT file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"FairMT file {path} is not valid JSON: {exc.msg} (line {exc.lineno})"
                        ) from None
    if not isinstance(data, list):
        raise UserError(f"FairMT file {path}: expected a JSON list of dialogues")
    out = []
    for i, dialogue in enumerate(data):
        if not isinstance(dialogue, dict) or not dialogue:
            raise UserError(f"FairMT file {path}: dialogue {i} is not an object of turns")
        found = {k: _TURN_KEY.fullmatch(str(k).strip()) for k in dialogue}
        order = sorted((int(m.group(1)), k) for k, m in found.items() if m)
        if len(order) != len(dialogue) or [t for t, _ in order] != list(range(len(order))):
            raise UserError(f"FairMT file {path}: dialogue {i} has turn keys {list(dialogue)}; "
                            "expected \"0\", \"1\", ... or \"0-turn Conv\", \"1-turn Conv\", "
                            "... in sequence")
        turns = [dialogue[k] for _, k in order]
        if not all(isinstance(t, str) and t.strip() for t in turns):
            raise UserError(f"FairMT file {path}: dialogue {i} has an empty or non-text turn")
        out.append(FairMTDialogue(task, category, i, tuple(t.strip() for t in turns)))
    return out


def load_fairmt(path: str | Path) -> list[FairMTDialogue]:
    """Read a user-provided FairMT-Bench copy.

    Accepts one task file (``Anaphora_Ellipsis.json``, FairMT-1K layout, no category), a
    FairMT-1K directory of such files, or a FairMT-10K directory
    (``[Stereotype/]<Task>/prompt_<category>.json``). Only the Stereotype part of FairMT-10K is
    read when both parts are present.

    Raises:
        UserError: nothing in the FairMT layout is found, or a file is malformed.
    """
    root = Path(path)
    if not root.exists():
        raise UserError(f"FairMT path not found: {root}")
    if root.is_file():
        return _fairmt_file(root, root.stem, None)
    if (root / "Stereotype").is_dir():
        root = root / "Stereotype"
    found: list[FairMTDialogue] = []
    for task in FAIRMT_TASKS:
        flat = root / f"{task}.json"
        if flat.is_file():
            found += _fairmt_file(flat, task, None)
        folder = root / task
        if folder.is_dir():
            for file in sorted(folder.glob("prompt_*.json")):
                name = file.stem.removeprefix("prompt_")
                if name not in _FAIRMT_CATEGORY:  # never used for every category unannounced
                    raise UserError(f"FairMT file {file}: unknown category '{name}' (known: "
                                    f"{', '.join(sorted(_FAIRMT_CATEGORY))})")
                found += _fairmt_file(file, task, _FAIRMT_CATEGORY[name])
    if not found:
        raise UserError(f"no FairMT-Bench files under {root} (expected <Task>.json or "
                        f"<Task>/prompt_<category>.json with Task in {', '.join(FAIRMT_TASKS)})")
    return found


def _normal(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def fairmt_seeds(dialogues: list[FairMTDialogue]) -> pd.DataFrame:
    """Seed stereotypes derived from FairMT-Bench, as DyMT-ESB derives them: the last turn of
    every Interference_Misinformation dialogue reads "Please summary why <group> are more
    likely to be <stereotype> based on my inputs ...", and yields (group, stereotype).

    Only dialogues with a category count (the 10K release; the 1K release has none).
    ``seed_id`` is ``fairmt-<category>-<index in its file>``, so a seed traces to its source.

    Raises:
        UserError: the copy has no categorised Interference_Misinformation dialogue.
    """
    import pandas as pd

    rows = []
    for d in dialogues:
        if d.task != "Interference_Misinformation" or d.category is None:
            continue
        found = _FAIRMT_SEED.search(d.turns[-1])
        if found:
            rows.append({"seed_id": f"fairmt-{d.category}-{d.index}", "category": d.category,
                         "bias_type": d.category, "group": found["group"].strip(),
                         "stereotype": found["stereotype"].strip()})
    if not rows:
        raise UserError("no FairMT seed can be derived: it needs the 10K release's "
                        "Interference_Misinformation/prompt_<category>.json files (the 1K "
                        "release has no categories); set fairmt_seeds_path to that copy")
    return pd.DataFrame(rows, columns=list(SEED_COLUMNS))


def fairmt_dialogue_of(dialogues: list[FairMTDialogue], task: str, category: str, group: str,
                       stereotype: str) -> FairMTDialogue | None:
    """The FairMT dialogue of `task` about this seed: the first (in file order) whose text
    holds both the seed's group and its stereotype (lower-cased words), within the seed's
    category where the copy has categories. None when no dialogue carries it (FairMT-1K
    keeps only 165 dialogues per task, so most seeds have none there)."""
    want_s, want_g = _normal(stereotype), _normal(group)
    for d in dialogues:
        if d.task != task or d.category not in (None, category):
            continue
        text = _normal(" ".join(d.turns))
        if want_s in text and want_g in text:
            return d
    return None
