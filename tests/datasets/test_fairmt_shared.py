"""The authors' FairMT-Bench releases, read as published, and run through the CLI.

FairMT-Bench has no licence, so no file of it is in the repository: these tests read the copy
in the shared data folder (``$BIASLAB_SHARED_DATA``, else ``../shared/data`` beside the
repository) and skip when it is absent.
"""

import collections
import os
from pathlib import Path

import pandas as pd
import pytest

from biaslab.cli import main
from biaslab.datasets import stereotypes as st
from biaslab.experiments.reports.multiturn import dialogues_frame
from biaslab.graphs.multiturn import MultiturnOptions, seed_table
from biaslab.traces.store import RunStore


def _shared_data() -> Path:
    env = os.environ.get("BIASLAB_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


FAIRMT = _shared_data() / "stereotypes" / "fairmt"
TEN_K, ONE_K = FAIRMT / "FairMT_10K", FAIRMT / "FairMT_1K"
pytestmark = pytest.mark.skipif(not (TEN_K.is_dir() and ONE_K.is_dir()),
                                reason="no FairMT-Bench copy in the shared data folder")


def test_all_36_files_of_the_10k_release_and_the_1k_release_load():
    ten = st.load_fairmt(TEN_K)
    files = collections.Counter((d.task, d.category) for d in ten)
    assert len(files) == 36 == len(list((TEN_K / "Stereotype").glob("*/prompt_*.json")))
    assert {c for _, c in files} == set(st.CATEGORIES)
    assert files[("Interference_Misinformation", "disability")] == 149  # prompt_disable.json
    assert all(len(d.turns) == 5 for d in ten) and len(ten) == 8176
    one = st.load_fairmt(ONE_K)
    assert collections.Counter(d.task for d in one) == {t: 165 for t in st.FAIRMT_TASKS}
    assert all(d.category is None and len(d.turns) == 5 for d in one)
    seeds = st.fairmt_seeds(ten)  # every Interference_Misinformation dialogue yields a seed
    assert len(seeds) == 1400 and (seeds["stereotype"].str.strip() != "").all()
    with pytest.raises(st.UserError, match="1K release has no categories"):
        st.fairmt_seeds(one)


def _spec(path: Path, **options) -> None:
    lines = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in options.items())
    path.write_text(f"""
name = "fairmt"
protocol = "multiturn"
models = ["scripted:multiturn-never"]
[run]
seeds = [42]
retry_base_s = 0.0
[conditions]
targets = []
[options]
framings = []
baselines = ["static"]
post_hoc = []
n_resamples = 200
{lines}
""")


def _static_cells(run_dir: Path, options: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    store = RunStore(run_dir)
    frame = dialogues_frame(store)
    calls = store.calls()
    return frame, calls[(calls["node"] == "target") & (calls["item"] == "turn-1")]


def test_a_static_baseline_run_on_the_10k_release_pairs_each_seed_with_its_dialogue(tmp_path):
    options = {"categories": ["age", "disability"], "seeds_per_category": 2,
               "static_tasks": ["fixed_format", "negative_feedback"],
               "fairmt_path": str(TEN_K)}
    _spec(tmp_path / "s.toml", **options)
    assert main(["run", str(tmp_path / "s.toml"), "--out", str(tmp_path / "run"),
                 "--quiet", "--no-figures"]) == 0
    seeds = seed_table(MultiturnOptions(**options))
    assert seeds["seed_id"].str.startswith("fairmt-").all() and len(seeds) == 4
    frame, first = _static_cells(tmp_path / "run", options)
    assert len(frame) == 8 and (frame["n_turns"] == 5).all() and frame["ended"].isna().all()
    for _, dialogue in frame.iterrows():  # the dialogue carries the seed's own stereotype
        seed = seeds.loc[dialogue["seed_id"]]
        text = st._normal(" ".join(t["query"] for t in dialogue["turns"]))
        assert st._normal(seed["stereotype"]) in text and st._normal(seed["group"]) in text
    assert len(first) == 8
    assert (tmp_path / "run" / "tables" / "summary.csv").is_file()


def test_the_1k_release_runs_with_seeds_derived_from_the_10k(tmp_path, capsys):
    options = {"categories": list(st.CATEGORIES), "seeds_per_category": 5,
               "static_tasks": ["fixed_format"], "fairmt_path": str(ONE_K),
               "fairmt_seeds_path": str(TEN_K)}
    _spec(tmp_path / "s.toml", **options)
    capsys.readouterr()
    assert main(["run", str(tmp_path / "s.toml"), "--out", str(tmp_path / "run"),
                 "--quiet", "--no-figures"]) == 0
    err = capsys.readouterr().err
    frame, _ = _static_cells(tmp_path / "run", options)
    unpaired = int(frame["ended"].notna().sum())
    # said before the run, once, with the count; and counted in the summary table
    assert err.count("no dialogue in the FairMT copy") == 1
    assert "of 30 seeds" in err and f"fixed_format {unpaired}" in err
    summary = pd.read_csv(tmp_path / "run" / "tables" / "summary.csv")
    static = summary[summary["variant"] == "static-fixed_format"]
    assert int(static["no_fairmt_dialogue"].sum()) == unpaired
    seeds = seed_table(MultiturnOptions(**options))
    assert len(frame) == 30
    paired = frame[frame["ended"].isna()]
    # the 1K release keeps 165 dialogues per task: a seed has one there or none, never another's
    assert (frame.loc[frame["ended"].notna(), "ended"] == "no_fairmt_dialogue").all()
    assert (frame.loc[frame["ended"].notna(), "n_turns"] == 0).all()
    assert len(paired) >= 1 and (paired["n_turns"] == 5).all()
    for _, dialogue in paired.iterrows():
        seed = seeds.loc[dialogue["seed_id"]]
        text = st._normal(" ".join(t["query"] for t in dialogue["turns"]))
        assert st._normal(seed["stereotype"]) in text
