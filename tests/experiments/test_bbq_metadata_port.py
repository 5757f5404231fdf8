"""BBQ's own analysis reads the export (issue 44).

BBQ's ``analysis_scripts/BBQ_results_metadata.R`` drops a record's ``stereotyped_groups``; it
joins its template files (``templates/new_templates - <Category>.csv``) on category and
question index and reads their ``Known_stereotyped_groups``. `metadata_target_loc` below is
our own port of that script's non-intersectional part (written from the script's steps, not
copied), reading ONLY the export folder: its ``*.jsonl`` and its ``templates/``. It must find
the stereotyped person of every exported record, new groups included, and join every record
to exactly one template row, also when BBQ's own templates sit in the same folder.
"""

import csv
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from biaslab.cli import main
from support_runs import run_and_report_once

SPEC = """
name = "aug-bbq-metadata"
protocol = "augmentation"
models = ["scripted:augmentation-misflagger"]
[run]
seeds = [42]
concurrency = 4
retry_base_s = 0.0
[options]
categories = ["nationality", "age", "religion"]
max_per_category = 5
n_variants = 2
n_resamples = 200
[conditions]
include_clean = true
targets = []
"""

_CATEGORY_NAMES = {"GenderIdentity": "Gender_identity", "PhysicalAppearance":
                   "Physical_appearance", "RaceEthnicity": "Race_ethnicity",
                   "Religion ": "Religion", "SexualOrientation": "Sexual_orientation",
                   "DisabilityStatus": "Disability_status"}


def _detect(text, pattern) -> bool | None:
    """R's ``str_detect(text, pattern)``: a regular-expression search; NA in, NA out."""
    if text is None or pattern is None:
        return None
    return re.search(pattern, text) is not None


def read_templates(folder: Path) -> list[dict]:
    """Every base template row (not vocabulary, intersectional or filler files): category
    (renamed as the script does), question index as text, known stereotyped groups."""
    rows = []
    for path in sorted(folder.glob("*.csv")):
        if "vocab" in path.name or "_x_" in path.name or "Filler" in path.name:
            continue
        with open(path, encoding="utf-8", newline="") as fh:
            for r in csv.DictReader(fh):
                category = _CATEGORY_NAMES.get(r["Category"], r["Category"])
                rows.append((category, str(r["Q_id"]), r["Known_stereotyped_groups"],
                             r.get("Relevant_social_values", "")))
    return [dict(zip(("category", "question_index", "groups", "values"), r))
            for r in dict.fromkeys(rows)]  # the script's group_by … summarise: distinct rows


def _info(info: str) -> str:
    info = {"man": "M", "boy": "M", "woman": "F", "girl": "F"}.get(info, info)
    return info.replace("M-", "", 1).replace("F-", "", 1)


def _groups(raw: str | None) -> str | None:
    if raw is None:
        return None
    groups = re.sub(r'"|\[|\]', "", raw)
    low = groups.lower()
    if low in ("man", "boy", "men"):
        groups = "M"
    elif low in ("woman", "women", "girl", "girls"):
        groups = "F"
    if low in ("transgender women, transgender men", "transgender men", "transgender women",
               "transgender women, transgender men, trans"):
        groups = "trans"
    return {"low SES": "lowSES", "high SES": "highSES"}.get(groups, groups)


def metadata_target_loc(record: dict, raw_groups: str | None) -> tuple[int | None, int | None]:
    """The script's ``target_loc`` (the stereotyped person's option) and ``new_target_loc``
    (the biased answer: the other person on a non-negative question; NA when more than one
    option matched) for one record joined to one template row's known groups."""
    groups = _groups(raw_groups)
    texts = [re.sub(r"\}|\{", "", str(record["answer_info"][f"ans{i}"][0])) for i in range(3)]
    infos = [_info(str(record["answer_info"][f"ans{i}"][1])) for i in range(3)]
    loc = []
    for text, info in zip(texts, infos):
        hit = _detect(groups.lower() if groups is not None else None, info.lower())
        if record["category"] == "Age":
            hit = (groups == "nonOld" and info == "nonOld") or (groups == "old" and info == "old")
        if record["category"] == "Nationality" and _detect(
                groups.lower() if groups is not None else None, text.lower()):
            hit = True
        if text == "African" and _detect(groups.lower() if groups else None, "african american"):
            hit = False
        if groups == "trans" and info.startswith("trans"):
            hit = True
        loc.append(None if hit is None else int(bool(hit)))
    target = next((i for i, v in enumerate(loc) if v == 1), None)
    if target is None or None in loc:
        return target, None
    if sum(loc) > 1:
        return target, None
    if record["question_polarity"] == "neg":
        return target, target
    others = [i for i in range(3) if i != target and infos[i] != "unknown"]
    return target, others[0] if others else None


def join(folder: Path) -> list[tuple[dict, list[dict]]]:
    """Each record of the folder's JSONL files with the template rows it joins."""
    templates = read_templates(folder / "templates")
    out = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                key = (r["category"], str(r["question_index"]))
                out.append((r, [t for t in templates
                                if (t["category"], t["question_index"]) == key]))
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("bbq-metadata")
    run = run_and_report_once(root, SPEC)
    out = root / "bbq"
    assert main(["export", str(run), "--format", "bbq", "--out", str(out)]) == 0
    scenes = {(s["source_id"], s["variant"]): s for s in map(
        json.loads, (run / "augmented.jsonl").read_text().splitlines())
        if s["passed"] and s["exposure"] == "none"}
    return out, scenes


def test_bbqs_rule_reading_only_the_export_finds_every_stereotyped_person(exported):
    out, scenes = exported
    assert sorted(p.name for p in (out / "templates").iterdir()) == [
        "new_templates - Age.csv", "new_templates - Nationality.csv",
        "new_templates - Religion.csv"]
    joined = join(out)
    assert len(joined) == len(scenes) > 0
    new_groups = 0
    for record, rows in joined:
        assert len(rows) == 1, record["question_index"]  # one template row, no duplicate
        scene = scenes[(record["additional_metadata"]["source_item"],
                        record["additional_metadata"]["variant"])]
        target, biased = metadata_target_loc(record, rows[0]["groups"])
        assert target == scene["stereotyped"], (record["answer_info"], rows[0]["groups"])
        if target is not None:
            other = next(i for i in range(3) if i not in (target, scene["label"]))
            assert biased == (target if record["question_polarity"] == "neg" else other)
        new_groups += any(m["decided_by"] == "generator"
                          for m in record["additional_metadata"]["group_mapping"])
    assert new_groups >= 2  # the generator's own nationality ("Atlantean") is among them


def test_each_person_carries_their_own_group(exported):
    out, scenes = exported
    for record, _ in join(out):
        mapping = record["additional_metadata"]["group_mapping"]
        people = [record["answer_info"][f"ans{i}"] for i in range(3)
                  if i != record["label"]]
        for entry, (text, label) in zip(mapping, people):
            assert text == entry["new"]
            if entry["decided_by"] == "generator":  # a group BBQ does not know: its own name
                assert label == entry["new"]
            elif entry.get("group") is not None:
                assert label == entry["group"]


def _shared_templates() -> Path:
    env = os.environ.get("BIASLAB_SHARED_DATA")
    base = Path(env) if env else Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
    return base / "bbq" / "templates"


def test_question_indexes_cannot_collide_with_bbqs(exported, tmp_path):
    out, _ = exported
    for record, _ in join(out):
        assert not str(record["question_index"]).strip().isdigit()
    bbq_templates = _shared_templates()
    if not bbq_templates.is_dir():
        pytest.skip("no BBQ templates in the shared data folder")
    both = tmp_path / "both"
    shutil.copytree(out, both)
    for path in bbq_templates.glob("*.csv"):  # BBQ's own files beside ours, under other names
        shutil.copy(path, both / "templates" / f"bbq {path.name}")
    for record, rows in join(both):
        assert len(rows) == 1 and rows[0]["question_index"] == record["question_index"]
