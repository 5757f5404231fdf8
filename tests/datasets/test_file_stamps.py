"""In-process caches of a data file notice an edit: the same process reads the new content
(a notebook that edits its data between two runs), for every dataset biaslab caches."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pandas as pd

import biaslab
from biaslab.datasets import bbq, biaslens, file_stamps
from biaslab.graphs.multiturn import MultiturnOptions, seed_table

FILES = Path(biaslab.__file__).parent / "datasets" / "files"


def _rewrite_same_size(path: Path, old: str, new: str) -> None:
    """Replace `old` by `new` (same length) and keep the modification time: only the status
    change time and the content say the file changed."""
    assert len(old) == len(new)
    stat = path.stat()
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size


def test_a_stamp_changes_with_the_content_even_at_the_same_size_and_mtime(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "a.csv").write_text("x,y\n1,2\n")
    before, tree = file_stamps.file_stamp(data / "a.csv"), file_stamps.tree_stamp(data)
    _rewrite_same_size(data / "a.csv", "1,2", "3,4")
    assert file_stamps.file_stamp(data / "a.csv") != before
    assert file_stamps.tree_stamp(data) != tree
    tree = file_stamps.tree_stamp(data)
    (data / "b.csv").write_text("new file\n")
    assert file_stamps.tree_stamp(data) != tree
    assert file_stamps.file_stamp(data / "missing.csv") is None
    assert file_stamps.file_stamp(None) is None and file_stamps.tree_stamp(None) is None


def test_bbq_records_are_read_again_after_an_edit(tmp_path):
    with gzip.open(FILES / "bbq" / "Age.ambig.jsonl.gz", "rt") as handle:
        lines = handle.read().splitlines()[:6]
    (tmp_path / "Age.jsonl").write_text("\n".join(lines) + "\n")
    first = bbq.load_records("age", str(tmp_path))
    assert len(first) == 6
    (tmp_path / "Age.jsonl").write_text("\n".join(lines[:4]) + "\n")
    assert len(bbq.load_records("age", str(tmp_path))) == 4
    assert len(bbq.load_category("age", str(tmp_path))) == 4


def test_a_biaslens_bank_is_read_again_after_an_edit(tmp_path):
    bank = tmp_path / "bank"
    shutil.copytree(FILES / "biaslens", bank)
    first = biaslens.load_questions(bank, attributes=["age"])
    for condition in ("role", "without_role"):
        target = bank / "questions" / condition / "age_questions.csv.gz"
        pd.read_csv(target).iloc[:10].to_csv(target, index=False)
    again = biaslens.load_questions(bank, attributes=["age"])
    assert len(first) > 10 and len(again) == 10


def test_a_multiturn_seed_file_is_read_again_after_an_edit(tmp_path):
    seeds = tmp_path / "seeds.csv"
    shutil.copy(FILES / "crows_pairs" / "clean_seeds.csv", seeds)
    options = MultiturnOptions(seeds_path=str(seeds), categories=["age"], seeds_per_category=2)
    first = seed_table(options)
    text = seeds.read_text()
    head, *rows = text.splitlines()
    age = [r for r in rows if ",age," in r][:2]
    edited = [r.replace("tend to put on weight", "tend to love gardens") for r in age]
    seeds.write_text("\n".join([head, *edited]) + "\n")
    again = seed_table(options)
    assert list(again["seed_id"]) == [r.split(",")[0] for r in age]
    assert list(first["seed_id"]) != list(again["seed_id"]) or \
        list(first["stereotype"]) != list(again["stereotype"])
